/*
 * cmd_chat.c - `k3ctl chat`: interactive multi-turn chat. Each turn resends
 * the whole conversation (k3d reuses the previous turn's state when the
 * new prompt extends it); Ctrl-C cancels the reply being streamed and
 * returns to the prompt; a cancelled turn is dropped from the history.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "gen.h"
#include "k3ctl.h"

/* Reads one line from stdin (without the newline; *len bytes, which may
 * include NULs); NULL at EOF. */
static char *read_line(size_t *len)
{
	char *line = NULL;
	size_t cap = 0;
	ssize_t n;

	do {
		k3ctl_gen_interrupted = 0;
		n = getline(&line, &cap, stdin);
	} while (n < 0 && errno == EINTR && !feof(stdin) && (clearerr(stdin), 1));
	if (n < 0) {
		free(line);
		return NULL;
	}
	if (n > 0 && line[n - 1] == '\n')
		line[--n] = '\0';
	*len = (size_t)n;
	return line;
}

/* A turn that streamed no answer left a bare prompt, which read as a hang
 * or a lost reply: say so on stderr (stdout keeps only the model's
 * words), with why it ended; K3 thinks first, so "length" usually means
 * --max-new ran out while it was thinking. */
static void empty_answer(const struct k3ctl_gen_result *res)
{
	fprintf(stderr, "(empty answer: finish=%s", k3ctl_gen_finish_name(res->done.finish));
	if (res->done.reasoning_tokens)
		fprintf(stderr, ", %u reasoning tokens", res->done.reasoning_tokens);
	if (res->done.finish == K3_FINISH_LENGTH)
		fputs("; --max-new ended the turn before the answer", stderr);
	fputs(")\n", stderr);
}

int k3ctl_cmd_chat(int argc, char **argv)
{
	struct k3ctl_gen_opts o;
	struct k3ctl_client c;
	json_t *history = json_array();
	bool tty = isatty(0);
	int i = k3ctl_gen_parse_opts("chat", argc, argv, &o), r;

	if (i < 0)
		return -i;
	if (argc - i > 0)
		return k3ctl_usage("chat", "takes no positional arguments; type messages at the prompt");
	o.chat = true;
	if ((r = k3ctl_connect(&c)) != 0)
		return r;
	k3ctl_gen_install_sigint();
	if (tty)
		fprintf(stderr, "k3ctl chat with %.*s: Ctrl-C cancels a reply, Ctrl-D or /exit quits.\n",
			(int)c.hello.model.len, c.hello.model.p ? c.hello.model.p : "k3d");
	for (;;) {
		struct k3ctl_gen_result res;
		char *line, *msgs;
		size_t len;

		if (tty)
			fputs("> ", stderr);
		line = read_line(&len);
		if (!line || strcmp(line, "/exit") == 0) {
			free(line);
			break;
		}
		if (!len) {
			free(line);
			continue;
		}
		if (!k3_proto_utf8_valid(line, len)) {
			/* It would not encode: skip it rather than send the rest. */
			fputs("k3ctl chat: that line is not valid UTF-8; ignored\n", stderr);
			free(line);
			continue;
		}
		/* s% and json_stringn: lengths, because text (the user's or the
		 * model's) may hold U+0000, and the history must resend all of it */
		json_array_append_new(history, json_pack("{s:s,s:s%}", "role", "user", "content", line, len));
		free(line);
		msgs = json_dumps(history, JSON_COMPACT);
		k3ctl_gen_interrupted = 0;
		k3ctl_client_reopen_if_closed(&c);   /* k3d closes idle connections (--idle-timeout) */
		r = k3ctl_gen_run(&c, &o, NULL, msgs, &res);
		free(msgs);
		if (r != 0) {
			json_array_remove(history, json_array_size(history) - 1);
			k3ctl_gen_release(&res);
			if (r == K3CTL_EXIT_UNAVAILABLE)
				break;
			continue;
		}
		k3ctl_gen_print(&o, &res);
		if (!o.json && !res.text_len && !json_array_size(res.tool_calls) &&
		    res.done.finish != K3_FINISH_CANCELLED)
			empty_answer(&res);
		if (res.done.finish == K3_FINISH_CANCELLED) {
			/* A cancelled turn is not part of the conversation. Ctrl-C
			 * here is the user's own; any other cancel is named, as
			 * `k3ctl run` names it. */
			if (k3ctl_gen_interrupted || res.done.cancel_reason == K3_CANCEL_CLIENT)
				fputs("[cancelled]\n", stderr);
			else
				k3ctl_fail(K3CTL_EXIT_ERROR, "chat: k3d cancelled the reply: %s",
					   k3ctl_gen_cancel_cause(res.done.cancel_reason));
			json_array_remove(history, json_array_size(history) - 1);
		} else {
			json_t *m = json_pack("{s:s,s:s%}", "role", "assistant", "content",
					      res.text ? res.text : "", res.text_len);

			if (res.reasoning_len)
				json_object_set_new(m, "reasoning_content",
						    json_stringn(res.reasoning, res.reasoning_len));
			if (json_array_size(res.tool_calls))
				json_object_set(m, "tool_calls", res.tool_calls);
			json_array_append_new(history, m);
		}
		k3ctl_gen_release(&res);
		r = 0;
	}
	k3ctl_client_close(&c);
	json_decref(history);
	free(o.prompt_ids);
	return r == K3CTL_EXIT_UNAVAILABLE ? r : 0;
}

/*
 * cmd_render_chat.c - `k3ctl render-chat FILE.json [--segments] [--ids
 * [--model DIR | --vocab FILE]]`: renders a chat offline with the K3 XTML
 * renderer. FILE ("-" = stdin) holds either a list of messages or an object
 * with "messages" and options, given at the top level and/or under
 * "options" (the shape of golden/text/chat.jsonl lines): thinking,
 * thinking_effort, reasoning_effort, tools, tool_choice, response_format,
 * response_schema, add_generation_prompt. A null response_schema counts as
 * absent. Prints the rendered text; --segments prints the segments as a
 * JSON list of [text, allow_special]; --ids prints the segment-wise ids.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "json_fields.h"
#include "k3ctl.h"
#include "text/text_chat.h"
#include "text_cli.h"

int k3ctl_cmd_render_chat(int argc, char **argv)
{
	struct text_cli_vocab v = { 0 };
	const char *path = NULL;
	bool want_ids = false, want_segs = false;
	struct k3_chat_opts o;
	struct k3_chat chat = { 0 };
	struct k3_err err = { 0, "" };
	json_t *root, *msgs;
	json_error_t je;
	char *buf = NULL;
	size_t len = 0;
	int rc = K3CTL_EXIT_OK;

	for (int i = 0; text_cli_next("render-chat", argc, argv, &i, &v);) {
		if (!strcmp(argv[i], "--ids"))
			want_ids = true;
		else if (!strcmp(argv[i], "--segments"))
			want_segs = true;
		else if ((rc = text_cli_operand("render-chat", argv[i], &path, "takes one FILE")))
			return rc;
	}
	if (v.bad)
		return K3CTL_EXIT_USAGE;
	if (!path)
		return k3ctl_usage("render-chat", "FILE.json [--segments] [--ids [--model DIR | --vocab FILE]]");
	if (text_cli_read(path, &buf, &len))
		return K3CTL_EXIT_ERROR;
	root = json_loadb(buf, len, JSON_ALLOW_NUL, &je);
	free(buf);
	if (!root)
		return k3ctl_fail(K3CTL_EXIT_ERROR, "render-chat: %s: %s at line %d", path, je.text, je.line);
	k3_chat_opts_init(&o);
	msgs = root;
	if (json_is_object(root)) {
		json_t *opt = json_object_get(root, "options");
		msgs = json_object_get(root, "messages");
		if (json_is_null(json_object_get(root, "response_schema")))
			json_object_del(root, "response_schema");
		if (json_is_null(json_object_get(opt, "response_schema")))
			json_object_del(opt, "response_schema");
		if (k3_chat_opts_from_json(root, &o, &err) ||
		    (opt && k3_chat_opts_from_json(opt, &o, &err))) {
			json_decref(root);
			return k3ctl_fail(K3CTL_EXIT_ERROR, "render-chat: %s", err.msg);
		}
	}
	if (k3_chat_render(msgs, &o, &chat, &err)) {
		json_decref(root);
		return k3ctl_fail(K3CTL_EXIT_ERROR, "render-chat: %s", err.msg);
	}
	if (want_ids) {
		struct k3_tok *tok = NULL;
		struct k3_tok_ids ids = { 0 };
		if ((rc = text_cli_load("render-chat", &v, &tok))) {
			/* message printed */
		} else if (k3_chat_encode(tok, &chat, &ids, &err)) {
			rc = k3ctl_fail(K3CTL_EXIT_ERROR, "render-chat: %s", err.msg);
		} else {
			text_cli_print_ids(&ids);
		}
		k3_tok_ids_release(&ids);
		k3_tok_free(tok);
	} else if (want_segs) {
		json_t *arr = json_array();
		for (size_t i = 0; arr && i < chat.n_segs; i++)
			json_array_append_new(arr, json_pack("[s%b]", chat.text + chat.segs[i].off, chat.segs[i].len,
							     chat.segs[i].special));
		if (k3ctl_json_puts(arr, JSON_COMPACT | JSON_ENSURE_ASCII, NULL))
			rc = k3ctl_fail(K3CTL_EXIT_ERROR, "out of memory");
	} else {
		fwrite(chat.text, 1, chat.text_len, stdout);
		putchar('\n');
	}
	k3_chat_release(&chat);
	json_decref(root);
	return rc;
}

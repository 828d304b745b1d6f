/*
 * text_cli.h - what the offline text commands (tokenize, detokenize,
 * render-chat) share: finding the tokenizer (--model DIR, --vocab FILE
 * [--config FILE], else $K3_MODEL_DIR), reading a whole input, printing
 * ids.
 */
#ifndef K3CTL_TEXT_CLI_H
#define K3CTL_TEXT_CLI_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "k3_limits.h"
#include "k3ctl.h"
#include "text/text_tok.h"

struct text_cli_vocab {
	const char *model_dir, *vocab, *config;
	bool bad;      /* one of them came without its value (usage printed) */
};

/* Steps *i (start: 0) to the command's next argument, taking the
 * vocabulary options (--model/--vocab/--config VALUE) on the way into v.
 * True with argv[*i] that argument; false at the end of argv, or with
 * v->bad set after a vocabulary option without its value. */
static inline bool text_cli_next(const char *cmd, int argc, char **argv, int *i,
				 struct text_cli_vocab *v)
{
	while (++*i < argc) {
		const char **slot;

		if (!strcmp(argv[*i], "--model"))
			slot = &v->model_dir;
		else if (!strcmp(argv[*i], "--vocab"))
			slot = &v->vocab;
		else if (!strcmp(argv[*i], "--config"))
			slot = &v->config;
		else
			return true;
		if (*i + 1 >= argc) {
			k3ctl_usage(cmd, "%s needs a value", argv[*i]);
			v->bad = true;
			return false;
		}
		*slot = argv[++*i];
	}
	return false;
}

/* Takes arg, not an option, as the command's one operand into *slot.
 * Returns 0, or K3CTL_EXIT_USAGE after saying why: arg is an unknown
 * option, or *slot was taken (the message `more`). */
static inline int text_cli_operand(const char *cmd, const char *arg, const char **slot,
				   const char *more)
{
	if (arg[0] == '-' && arg[1])
		return k3ctl_usage(cmd, "unknown option '%s'", arg);
	if (*slot)
		return k3ctl_usage(cmd, "%s", more);
	*slot = arg;
	return 0;
}

/* Loads the tokenizer into *tok. Returns 0, K3CTL_EXIT_USAGE (no
 * vocabulary given) or K3CTL_EXIT_ERROR (load failed); prints why. */
static inline int text_cli_load(const char *cmd, const struct text_cli_vocab *v, struct k3_tok **tok)
{
	struct k3_err err = { 0, "" };
	const char *dir = v->model_dir ? v->model_dir : getenv("K3_MODEL_DIR");
	int rc;

	*tok = NULL;
	if (v->vocab)
		rc = k3_tok_load_files(v->vocab, v->config, tok, &err);
	else if (dir)
		rc = k3_tok_load_dir(dir, tok, &err);
	else
		return k3ctl_usage(cmd, "needs --model DIR, --vocab FILE or $K3_MODEL_DIR");
	if (rc)
		return k3ctl_fail(K3CTL_EXIT_ERROR, "%s: %s", cmd, err.msg);
	return 0;
}

/* Reads a file ("-" = stdin; pipes too) of up to K3_LIM_TEXT_MAX bytes into
 * a malloc'ed NUL-terminated buffer. Returns 0 or a negative errno
 * (message printed). */
static inline int text_cli_read(const char *path, char **out, size_t *len)
{
	struct k3_err err = { 0, "" };
	int rc = k3_file_read(path, K3_LIM_TEXT_MAX, K3_FILE_STREAMS, out, len, &err);

	if (rc)
		k3ctl_fail(K3CTL_EXIT_ERROR, "%s", err.msg);
	return rc;
}

/* Prints ids on one line: space-separated, or a JSON array with --json. */
static inline void text_cli_print_ids(const struct k3_tok_ids *ids)
{
	if (k3ctl_g.json)
		putchar('[');
	for (size_t i = 0; i < ids->n; i++)
		printf(i ? (k3ctl_g.json ? ",%u" : " %u") : "%u", ids->v[i]);
	puts(k3ctl_g.json ? "]" : "");
}

#endif

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
};

/* Consumes --model/--vocab/--config at argv[*i]; returns 1 if taken, 0 if
 * not a vocabulary option, -1 on a missing value (usage printed). */
static inline int text_cli_vocab_opt(const char *cmd, int argc, char **argv, int *i, struct text_cli_vocab *v)
{
	const char **slot = NULL;

	if (!strcmp(argv[*i], "--model"))
		slot = &v->model_dir;
	else if (!strcmp(argv[*i], "--vocab"))
		slot = &v->vocab;
	else if (!strcmp(argv[*i], "--config"))
		slot = &v->config;
	else
		return 0;
	if (*i + 1 >= argc) {
		k3ctl_usage(cmd, "%s needs a value", argv[*i]);
		return -1;
	}
	*slot = argv[++*i];
	return 1;
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

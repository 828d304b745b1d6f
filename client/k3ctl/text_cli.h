/*
 * text_cli.h - what the offline text commands (tokenize, detokenize,
 * render-chat) share: finding the tokenizer (--model DIR, --vocab FILE
 * [--config FILE], else $K3_MODEL_DIR) and reading a whole input.
 */
#ifndef K3CTL_TEXT_CLI_H
#define K3CTL_TEXT_CLI_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* Reads a file ("-" = stdin) up to K3_LIM_TEXT_MAX bytes into a malloc'ed
 * NUL-terminated buffer. Returns 0 or a negative errno (message printed). */
static inline int text_cli_read(const char *path, char **out, size_t *len)
{
	FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
	size_t cap = 1 << 16, n = 0;
	char *buf;

	if (!f) {
		int e = errno;
		k3ctl_fail(K3CTL_EXIT_ERROR, "cannot open '%s': %s", path, strerror(e));
		return -e;
	}
	buf = malloc(cap);
	while (buf) {
		size_t r = fread(buf + n, 1, cap - n - 1, f);
		n += r;
		if (r == 0)
			break;
		if (n + 1 == cap) {
			if (cap > K3_LIM_TEXT_MAX) {
				free(buf);
				if (f != stdin)
					fclose(f);
				k3ctl_fail(K3CTL_EXIT_ERROR, "'%s' is larger than %u bytes", path, K3_LIM_TEXT_MAX);
				return -E2BIG;
			}
			char *nb = realloc(buf, cap * 2);
			if (!nb) {
				free(buf);
				buf = NULL;
				break;
			}
			buf = nb;
			cap *= 2;
		}
	}
	if (f != stdin)
		fclose(f);
	if (!buf) {
		k3ctl_fail(K3CTL_EXIT_ERROR, "out of memory reading '%s'", path);
		return -ENOMEM;
	}
	buf[n] = 0;
	*out = buf;
	*len = n;
	return 0;
}

#endif

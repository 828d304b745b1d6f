/*
 * cmd_detokenize.c - `k3ctl detokenize [--model DIR | --vocab FILE] IDS`:
 * decodes token ids (separated by spaces or commas, in one or several
 * arguments, or "-" for stdin; a JSON array works too) to text, offline.
 * Special ids print as their names. Bytes that are not valid UTF-8 print
 * as U+FFFD, as Python's decode(errors="replace"). --json prints
 * {"text": ...}.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "base/parse.h"
#include "json_fields.h"
#include "k3ctl.h"
#include "text/text_detok.h"
#include "text_cli.h"

static int parse_ids(const char *s, struct k3_tok_ids *ids)
{
	while (*s) {
		char num[16];
		size_t n = 0;
		uint64_t v;

		while (*s == ' ' || *s == ',' || *s == '\n' || *s == '\t' || *s == '\r' || *s == '[' || *s == ']')
			s++;
		if (!*s)
			break;
		while (s[n] >= '0' && s[n] <= '9' && n < sizeof(num) - 1)
			n++;
		if (n == 0 || n == sizeof(num) - 1)
			return k3ctl_usage("detokenize", "'%.20s' is not a token id", s);
		memcpy(num, s, n);
		num[n] = 0;
		if (k3_parse_u64(num, 0, UINT32_MAX, &v, NULL))
			return k3ctl_usage("detokenize", "'%s' is not a token id", num);
		if (ids->n >= K3_LIM_IDS_MAX)
			return k3ctl_usage("detokenize", "more than %u ids", K3_LIM_IDS_MAX);
		if (k3_tok_ids_push(ids, (uint32_t)v))
			return k3ctl_fail(K3CTL_EXIT_ERROR, "out of memory");
		s += n;
	}
	return 0;
}

int k3ctl_cmd_detokenize(int argc, char **argv)
{
	struct text_cli_vocab v = { 0 };
	struct k3_tok_ids ids = { 0 };
	struct k3_tok *tok;
	struct k3_err err = { 0, "" };
	struct k3_sbuf out = { 0 };
	char *raw = NULL;
	size_t rawn = 0;
	int rc = 0, nargs = 0;

	for (int i = 0; !rc && text_cli_next("detokenize", argc, argv, &i, &v);) {
		if (!strcmp(argv[i], "-")) {
			char *in = NULL;
			size_t n;
			if (text_cli_read("-", &in, &n))
				rc = K3CTL_EXIT_ERROR;
			else
				rc = parse_ids(in, &ids);
			free(in);
			nargs++;
		} else if (argv[i][0] == '-' && argv[i][1] && !(argv[i][1] >= '0' && argv[i][1] <= '9'))
			rc = k3ctl_usage("detokenize", "unknown option '%s'", argv[i]);
		else {
			rc = parse_ids(argv[i], &ids);
			nargs++;
		}
	}
	if (v.bad)
		rc = K3CTL_EXIT_USAGE;
	if (!rc && !nargs)
		rc = k3ctl_usage("detokenize", "[--model DIR | --vocab FILE] IDS...|-");
	if (rc) {
		k3_tok_ids_release(&ids);
		return rc;
	}
	if ((rc = text_cli_load("detokenize", &v, &tok))) {
		k3_tok_ids_release(&ids);
		return rc;
	}
	if (k3_tok_decode(tok, ids.v, ids.n, &raw, &rawn, &err)) {
		rc = k3ctl_fail(K3CTL_EXIT_ERROR, "detokenize: %s", err.msg);
	} else {
		k3_utf8_take((const uint8_t *)raw, rawn, true, &out);
		k3_sbuf_add(&out, "", 0);
		if (k3ctl_g.json) {
			k3ctl_json_puts(json_pack("{s:s%}", "text", out.p, out.n), JSON_COMPACT, NULL);
		} else {
			fwrite(out.p, 1, out.n, stdout);
			putchar('\n');
		}
	}
	free(raw);
	k3_sbuf_release(&out);
	k3_tok_ids_release(&ids);
	k3_tok_free(tok);
	return rc;
}

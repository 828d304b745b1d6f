/*
 * cmd_tokenize.c - `k3ctl tokenize [--special] [--pieces] [--model DIR |
 * --vocab FILE [--config FILE]] TEXT`: encodes TEXT (or stdin with "-")
 * offline with the K3 tokenizer and prints the ids (space-separated, or a
 * JSON array with --json). --special turns special-token matching on (as
 * TikTokenTokenizer.encode does by default); without it special spellings
 * are plain text, as for user text in a chat. --pieces prints the regex
 * pre-tokenizer pieces instead (JSON strings, one per line).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "json_fields.h"
#include "k3ctl.h"
#include "text_cli.h"

static int print_piece(void *ud, size_t off, size_t len)
{
	const char *text = ud;

	return k3ctl_json_puts(json_stringn(text + off, len), JSON_ENCODE_ANY, NULL);
}

int k3ctl_cmd_tokenize(int argc, char **argv)
{
	struct text_cli_vocab v = { 0 };
	const char *arg = NULL;
	bool special = false, pieces = false;
	struct k3_tok *tok;
	struct k3_tok_ids ids = { 0 };
	struct k3_err err = { 0, "" };
	char *text = NULL;
	size_t len = 0;
	int rc;

	for (int i = 0; text_cli_next("tokenize", argc, argv, &i, &v);) {
		if (!strcmp(argv[i], "--special"))
			special = true;
		else if (!strcmp(argv[i], "--pieces"))
			pieces = true;
		else if (!strcmp(argv[i], "--") && i + 2 == argc)
			arg = argv[++i];
		else if ((rc = text_cli_operand("tokenize", argv[i], &arg,
						"takes one TEXT (quote it, or use - for stdin)")))
			return rc;
	}
	if (v.bad)
		return K3CTL_EXIT_USAGE;
	if (!arg)
		return k3ctl_usage("tokenize", "[--special] [--pieces] [--model DIR | --vocab FILE] TEXT|-");
	if ((rc = text_cli_load("tokenize", &v, &tok)))
		return rc;
	if (!strcmp(arg, "-")) {
		if (text_cli_read("-", &text, &len)) {
			k3_tok_free(tok);
			return K3CTL_EXIT_ERROR;
		}
	} else {
		text = strdup(arg);
		len = strlen(arg);
	}
	if (pieces)
		rc = k3_tok_split_pieces(tok, text, len, print_piece, text, &err);
	else
		rc = k3_tok_encode(tok, text, len, special, &ids, &err);
	if (rc) {
		k3ctl_fail(K3CTL_EXIT_ERROR, "tokenize: %s", err.msg);
	} else if (!pieces) {
		text_cli_print_ids(&ids);
	}
	k3_tok_ids_release(&ids);
	free(text);
	k3_tok_free(tok);
	return rc ? K3CTL_EXIT_ERROR : K3CTL_EXIT_OK;
}

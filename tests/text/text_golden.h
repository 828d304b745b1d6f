/*
 * text_golden.h - helpers shared by the text tests: read a JSON-lines golden
 * file, build the small synthetic vocabulary (all 256 bytes + merges + the
 * K3 special names at their offsets), and find the real rank file.
 */
#ifndef K3_TEST_TEXT_GOLDEN_H
#define K3_TEST_TEXT_GOLDEN_H

#include <jansson.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "t.h"
#include "text/text_tok.h"

/* Calls fn for every line of a .jsonl file under shared/. Returns the
 * number of lines, or -1 when the file cannot be read. */
static inline int tg_each_line(const char *rel, void (*fn)(json_t *line, void *ud), void *ud)
{
	FILE *f = fopen(t_shared_path(rel), "r");
	char *buf = NULL;
	size_t cap = 0;
	ssize_t n;
	int count = 0;

	if (!f)
		return -1;
	while ((n = getline(&buf, &cap, f)) > 0) {
		json_error_t je;
		json_t *j = json_loadb(buf, (size_t)n, JSON_ALLOW_NUL, &je);
		if (!j) {
			printf("FAIL bad golden line in %s: %s\n", rel, je.text);
			t_failures++;
			continue;
		}
		fn(j, ud);
		json_decref(j);
		count++;
	}
	free(buf);
	fclose(f);
	return count;
}

static inline void tg_b64(const unsigned char *s, size_t n, char *out)
{
	EVP_EncodeBlock((unsigned char *)out, s, (int)n);
}

/* The K3 names at their offsets (docs/text-and-draft.md §1.6). */
static const struct { unsigned off; const char *name; } tg_k3_names[] = {
	{ 0, "[BOS]" }, { 1, "[EOS]" }, { 2, "<|end_of_msg|>" }, { 3, "<|open|>" },
	{ 4, "<|close|>" }, { 5, "<|sep|>" }, { 6, "[start_header_id]" }, { 7, "[end_header_id]" },
	{ 9, "[EOT]" }, { 18, "<|media_begin|>" }, { 19, "<|media_content|>" }, { 20, "<|media_end|>" },
	{ 21, "<|media_pad|>" }, { 65, "<osagent_mode>" }, { 254, "[UNK]" }, { 255, "[PAD]" },
};

/* Builds a synthetic vocabulary: rank b = byte b for all 256 bytes, then
 * `merges` (NULL-terminated) at ranks 256, 257, ... Returns the tokenizer
 * or NULL (and a FAIL). */
static inline struct k3_tok *tg_synth(const char *const *merges, size_t n_merges_extra,
				      const char *const *extra, size_t *n_ranks_out)
{
	size_t cap = 1 << 16, len = 0, rank = 0;
	char *ranks = malloc(cap), b64[4096], cfg[8192];
	struct k3_tok *tok = NULL;
	struct k3_err err = { 0 };
	size_t cl;

	for (int b = 0; b < 256; b++) {
		unsigned char c = (unsigned char)b;
		tg_b64(&c, 1, b64);
		len += (size_t)snprintf(ranks + len, cap - len, "%s %zu\n", b64, rank++);
	}
	for (size_t i = 0; merges && merges[i]; i++) {
		tg_b64((const unsigned char *)merges[i], strlen(merges[i]), b64);
		len += (size_t)snprintf(ranks + len, cap - len, "%s %zu\n", b64, rank++);
	}
	for (size_t i = 0; i < n_merges_extra; i++) {
		if (cap - len < 8192) {
			cap *= 2;
			ranks = realloc(ranks, cap);
		}
		tg_b64((const unsigned char *)extra[i], strlen(extra[i]), b64);
		len += (size_t)snprintf(ranks + len, cap - len, "%s %zu\n", b64, rank++);
	}
	cl = (size_t)snprintf(cfg, sizeof(cfg), "{\"added_tokens_decoder\": {");
	for (size_t i = 0; i < sizeof(tg_k3_names) / sizeof(tg_k3_names[0]); i++)
		cl += (size_t)snprintf(cfg + cl, sizeof(cfg) - cl, "%s\"%zu\": {\"content\": \"%s\", \"special\": true}",
				       i ? ", " : "", rank + tg_k3_names[i].off, tg_k3_names[i].name);
	cl += (size_t)snprintf(cfg + cl, sizeof(cfg) - cl, "}}");
	if (k3_tok_load_buffers(ranks, len, cfg, cl, &tok, &err)) {
		printf("FAIL synthetic vocabulary: %s\n", err.msg);
		t_failures++;
	}
	free(ranks);
	if (n_ranks_out)
		*n_ranks_out = rank;
	return tok;
}

/* The real tokenizer, or NULL with *why set. */
static inline struct k3_tok *tg_real(const char **why)
{
	static char msg[4400];
	const char *dir = t_shared_path("models/kimi-k3-tokenizer");
	char path[4200];
	struct k3_tok *tok = NULL;
	struct k3_err err = { 0 };

	snprintf(path, sizeof(path), "%s/tiktoken.model", dir);
	if (access(path, R_OK) != 0) {
		snprintf(msg, sizeof(msg), "real rank file %s is absent (id cases need it)", path);
		*why = msg;
		return NULL;
	}
	if (k3_tok_load_dir(dir, &tok, &err)) {
		snprintf(msg, sizeof(msg), "real rank file does not load: %.600s", err.msg);
		*why = msg;
		t_failures++;
		printf("FAIL %s\n", msg);
		return NULL;
	}
	return tok;
}

/*
 * main() of a text test: runs each test of the NULL-terminated list with
 * *slot = tok, then frees tok. A NULL tok ends the test at once: with why
 * (tg_real's reason) a SKIP, or the failure tg_real already counted;
 * without, tg_synth's failure.
 */
static inline int tg_main(struct k3_tok **slot, struct k3_tok *tok, const char *why, void (*const tests[])(void))
{
	if (!tok)
		return why && !t_failures ? t_skip(why) : t_done();
	*slot = tok;
	for (size_t i = 0; tests[i]; i++)
		tests[i]();
	k3_tok_free(tok);
	*slot = NULL;
	return t_done();
}

#endif

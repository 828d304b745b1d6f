/*
 * text_tok_internal.h - what the tokenizer's files share (text_tok.h is
 * the public contract; nothing outside daemon/text/text_tok.c,
 * text_pretok.c and text_bpe.c includes this).
 *
 * Where each behaviour lives:
 *   text_tok.c     loading (the rank file, its hash tables, the special
 *                  names and their trie), id arrays, encoding a string
 *                  (chunks, runs, special tokens) and decoding
 *   text_pretok.c  the pre-tokenizer (docs/text-and-draft.md §1.3): UTF-8
 *                  checks, the regex with its Unicode classes (text_ucd.h),
 *                  the ASCII fast path, splitting text into pieces
 *   text_bpe.c     byte-pair merging of one piece by rank (§1.4)
 *
 * Layout: every id's bytes live in one arena (off[id]..off[id+1]); ranks are
 * found by an open-addressing hash of their bytes, with a direct 64 Ki table
 * for the two-byte strings the first BPE round asks about. Special names sit
 * in the same arena after the ranks and in a byte trie for longest match.
 */
#ifndef K3_TEXT_TOK_INTERNAL_H
#define K3_TEXT_TOK_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <pcre2.h>

#include "text/text_tok.h"

#define NO_RANK UINT32_MAX

struct tok_re {
	pcre2_code *code;
	bool jit;                  /* JIT-compiled: call pcre2_jit_match */
};

struct trie_node {
	uint32_t child;     /* first child index, 0 = none (root is 0) */
	uint32_t next;      /* next sibling, 0 = none */
	uint32_t id;        /* special id ending here, NO_RANK = none */
	uint8_t byte;
};

struct k3_tok {
	uint32_t n_ranks;
	uint32_t n_vocab;
	uint8_t *arena;
	uint32_t *off;             /* n_vocab + 1 */
	uint32_t *ht;              /* id + 1, 0 = empty */
	uint32_t ht_mask;
	uint32_t *pair;            /* 65536: rank of a two-byte string */
	uint32_t byte_rank[256];
	void *block;               /* trie, off, ht, pair and arena: one carved block */
	struct trie_node *trie;
	uint32_t n_trie;
	uint8_t special_first[256];
	struct tok_re re;          /* the pre-tokenizer regex */
	struct tok_re re_new;      /* for text with code points of k3_ucd_new[];
				    * no code when re is exact for all text */
	uint8_t new_block[0x1100 / 8]; /* bit b: k3_ucd_new[] has a code point in
					* U+bb00..U+bbFF (b = c >> 8) */
};

/* ---- the rank lookup (hot: BPE asks it for every candidate pair) ------ */

static inline uint64_t tok_hash_bytes(const uint8_t *p, size_t n)
{
	uint64_t h = 0x9e3779b97f4a7c15ull ^ (n * 0xff51afd7ed558ccdull);

	while (n >= 8) {
		uint64_t w;
		memcpy(&w, p, 8);
		h = (h ^ w) * 0xbf58476d1ce4e5b9ull;
		h ^= h >> 31;
		p += 8;
		n -= 8;
	}
	if (n) {
		uint64_t w = 0;
		memcpy(&w, p, n);
		h = (h ^ w) * 0x94d049bb133111ebull;
	}
	h ^= h >> 29;
	h *= 0xbf58476d1ce4e5b9ull;
	return h ^ (h >> 32);
}

static inline uint32_t tok_rank_of(const struct k3_tok *tok, const uint8_t *p, size_t n)
{
	uint32_t i;

	if (n == 1)
		return tok->byte_rank[p[0]];
	if (n == 2)
		return tok->pair[(uint32_t)p[0] << 8 | p[1]];
	i = (uint32_t)tok_hash_bytes(p, n) & tok->ht_mask;
	for (;;) {
		uint32_t e = tok->ht[i];
		if (!e)
			return NO_RANK;
		e--;
		if (tok->off[e + 1] - tok->off[e] == n && memcmp(tok->arena + tok->off[e], p, n) == 0)
			return e;
		i = (i + 1) & tok->ht_mask;
	}
}

/* ---- UTF-8 and Python's whitespace (text_pretok.c uses them too) ------ */

/* Decodes the code point at p (valid UTF-8 assumed); returns its length. */
static inline size_t tok_utf8_next(const uint8_t *p, uint32_t *cp)
{
	if (p[0] < 0x80) {
		*cp = p[0];
		return 1;
	}
	if (p[0] < 0xe0) {
		*cp = ((uint32_t)(p[0] & 0x1f) << 6) | (p[1] & 0x3f);
		return 2;
	}
	if (p[0] < 0xf0) {
		*cp = ((uint32_t)(p[0] & 0x0f) << 12) | ((uint32_t)(p[1] & 0x3f) << 6) | (p[2] & 0x3f);
		return 3;
	}
	*cp = ((uint32_t)(p[0] & 0x07) << 18) | ((uint32_t)(p[1] & 0x3f) << 12) |
	      ((uint32_t)(p[2] & 0x3f) << 6) | (p[3] & 0x3f);
	return 4;
}

/* Python str.isspace(): bidirectional class WS/B/S or category Zs. Differs
 * from the regex \s (White_Space) by U+001C..U+001F (§1.5). */
static inline bool tok_py_isspace(uint32_t c)
{
	if (c < 0x80)
		return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20);
	return c == 0x85 || c == 0xa0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200a) ||
	       c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

/* k3_tok_utf8_valid_prefix, and, when blocks is not NULL, whether some
 * code point falls in a 256-code-point block whose bit is set (*hit): the
 * tokenizer's cheap first look for k3_ucd_new[] code points, in the pass
 * that decodes every character anyway (text_pretok.c). */
size_t tok_utf8_valid_prefix_blocks(const char *s, size_t len, const uint8_t *blocks, bool *hit);

/* ---- id arrays (text_tok.c) --------------------------------------------- */

/* Makes room for extra more ids in ids. Returns 0 or -ENOMEM. */
int tok_ids_reserve(struct k3_tok_ids *ids, size_t extra);

/* ---- the pre-tokenizer (text_pretok.c) ---------------------------------- */

/* Compiles tok->re (and tok->re_new where the PCRE2 tables need it) and
 * fills tok->new_block. Returns 0 or -EINVAL with err filled. */
int tok_compile_regex(struct k3_tok *tok, struct k3_err *err);

/* One caller's match state (PCRE2 match data, a JIT stack grown on
 * demand, the regex picked for the segment); zero-initialize, release
 * with tok_matcher_release. Not shared between threads. */
struct tok_matcher {
	pcre2_match_data *md;
	pcre2_match_context *mc;
	pcre2_jit_stack *js;
	const struct tok_re *re;   /* tok->re or tok->re_new, by tok_matcher_pick */
	bool maybe_new;            /* the text may hold k3_ucd_new[] code points */
};

/* Picks the regex for the text m will split next: pieces never cross a
 * slice or a special token, so one choice per such segment is exact. */
void tok_matcher_pick(struct tok_matcher *m, const struct k3_tok *tok, const char *s, size_t len);
void tok_matcher_release(struct tok_matcher *m);
/* Next piece of s[0..len) at or after off, as [*a, *b): the ASCII fast
 * path where it decides, else PCRE2. *na caches the first non-ASCII byte
 * at or after off (SIZE_MAX before the first call). Returns 1, 0 when no
 * piece is left, or a negative errno. */
int tok_find_piece(struct tok_matcher *m, const char *s, size_t len, size_t off, size_t *na,
		   size_t *a, size_t *b);

#endif

/*
 * text_tok.c - Kimi K3 tokenizer (see text_tok.h and k3-text-and-draft.md §1).
 *
 * Layout: every id's bytes live in one arena (off[id]..off[id+1]); ranks are
 * found by an open-addressing hash of their bytes, with a direct 64 Ki table
 * for the two-byte strings the first BPE round asks about. Special names sit
 * in the same arena after the ranks and in a byte trie for longest match.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "text/text_tok.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>
#include <openssl/evp.h>
#include <pcre2.h>

#include "base/file.h"
#include "base/parse.h"
#include "k3_limits.h"
#include "text/text_ucd.h"

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
	struct trie_node *trie;
	uint32_t n_trie;
	uint8_t special_first[256];
	struct tok_re re;          /* the pre-tokenizer regex */
	struct tok_re re_new;      /* for text with code points of k3_ucd_new[];
				    * no code when re is exact for all text */
	uint8_t new_block[0x1100 / 8]; /* bit b: k3_ucd_new[] has a code point in
					* U+bb00..U+bbFF (b = c >> 8) */
};

/* ---- id arrays ---------------------------------------------------------- */

void k3_tok_ids_init(struct k3_tok_ids *ids)
{
	ids->v = NULL;
	ids->n = ids->cap = 0;
}

void k3_tok_ids_release(struct k3_tok_ids *ids)
{
	if (!ids)
		return;
	free(ids->v);
	k3_tok_ids_init(ids);
}

static int ids_reserve(struct k3_tok_ids *ids, size_t extra)
{
	size_t need, cap;
	uint32_t *v;

	if (extra > SIZE_MAX / 4 - ids->n)
		return -ENOMEM;
	need = ids->n + extra;
	if (need <= ids->cap)
		return 0;
	cap = ids->cap ? ids->cap : 64;
	while (cap < need)
		cap = cap > SIZE_MAX / 8 ? need : cap * 2;
	v = realloc(ids->v, cap * sizeof(*v));
	if (!v)
		return -ENOMEM;
	ids->v = v;
	ids->cap = cap;
	return 0;
}

int k3_tok_ids_push(struct k3_tok_ids *ids, uint32_t id)
{
	if (ids->n == ids->cap && ids_reserve(ids, 1))
		return -ENOMEM;
	ids->v[ids->n++] = id;
	return 0;
}

/* ---- UTF-8 -------------------------------------------------------------- */

/* k3_tok_utf8_valid_prefix, and, when blocks is not NULL, whether some
 * code point falls in a 256-code-point block whose bit is set (*hit): the
 * tokenizer's cheap first look for k3_ucd_new[] code points, in the pass
 * that decodes every character anyway. */
static size_t utf8_valid_prefix_blocks(const char *s, size_t len, const uint8_t *blocks, bool *hit)
{
	const uint8_t *p = (const uint8_t *)s;
	size_t i = 0;

	while (i < len) {
		uint8_t c = p[i];
		size_t n;
		uint32_t cp, min;

		if (c < 0x80) {
			i++;
			continue;
		}
		if (c >= 0xc2 && c <= 0xdf) {
			n = 2; cp = c & 0x1f; min = 0x80;
		} else if (c >= 0xe0 && c <= 0xef) {
			n = 3; cp = c & 0x0f; min = 0x800;
		} else if (c >= 0xf0 && c <= 0xf4) {
			n = 4; cp = c & 0x07; min = 0x10000;
		} else {
			return i;
		}
		if (len - i < n)
			return i;
		for (size_t k = 1; k < n; k++) {
			if ((p[i + k] & 0xc0) != 0x80)
				return i;
			cp = (cp << 6) | (p[i + k] & 0x3f);
		}
		if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
			return i;
		if (blocks && (blocks[cp >> 11] >> (cp >> 8 & 7) & 1))
			*hit = true;
		i += n;
	}
	return len;
}

size_t k3_tok_utf8_valid_prefix(const char *s, size_t len)
{
	return utf8_valid_prefix_blocks(s, len, NULL, NULL);
}

/* Decodes the code point at p (valid UTF-8 assumed); returns its length. */
static inline size_t utf8_next(const uint8_t *p, uint32_t *cp)
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
static bool py_isspace(uint32_t c)
{
	if (c < 0x80)
		return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20);
	return c == 0x85 || c == 0xa0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200a) ||
	       c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

bool k3_tok_py_isblank(const char *s, size_t len)
{
	const uint8_t *u = (const uint8_t *)s;

	for (size_t i = 0; i < len;) {
		uint32_t cp;
		i += utf8_next(u + i, &cp);
		if (!py_isspace(cp))
			return false;
	}
	return true;
}

/* ---- hashing ------------------------------------------------------------ */

static uint64_t hash_bytes(const uint8_t *p, size_t n)
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

static uint32_t rank_of(const struct k3_tok *tok, const uint8_t *p, size_t n)
{
	uint32_t i;

	if (n == 1)
		return tok->byte_rank[p[0]];
	if (n == 2)
		return tok->pair[(uint32_t)p[0] << 8 | p[1]];
	i = (uint32_t)hash_bytes(p, n) & tok->ht_mask;
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

/* ---- BPE (§1.4) ---------------------------------------------------------- */

/* tiktoken's merge loop for short pieces: parts[i] is a boundary; rk[i] the
 * rank of the string from parts[i] to parts[i+2]. Always merges the lowest
 * rank, leftmost on ties. O(n^2), fastest for the usual short pieces. */
static int bpe_small(const struct k3_tok *tok, const uint8_t *s, size_t n, struct k3_tok_ids *out)
{
	uint32_t parts[130], rk[130];
	size_t np = n + 1;

	for (size_t i = 0; i < np; i++) {
		parts[i] = (uint32_t)i;
		rk[i] = i + 2 < np ? rank_of(tok, s + i, 2) : NO_RANK;
	}
	for (;;) {
		uint32_t best = NO_RANK;
		size_t bi = 0;

		for (size_t i = 0; i + 1 < np; i++) {
			if (rk[i] < best) {
				best = rk[i];
				bi = i;
			}
		}
		if (best == NO_RANK)
			break;
		/* remove boundary bi+1 */
		memmove(parts + bi + 1, parts + bi + 2, (np - bi - 2) * sizeof(parts[0]));
		memmove(rk + bi + 1, rk + bi + 2, (np - bi - 2) * sizeof(rk[0]));
		np--;
		rk[bi] = bi + 2 < np ? rank_of(tok, s + parts[bi], parts[bi + 2] - parts[bi]) : NO_RANK;
		if (bi > 0)
			rk[bi - 1] = rank_of(tok, s + parts[bi - 1], parts[bi + 1] - parts[bi - 1]);
	}
	if (ids_reserve(out, np - 1))
		return -ENOMEM;
	for (size_t i = 0; i + 1 < np; i++)
		out->v[out->n++] = rank_of(tok, s + parts[i], parts[i + 1] - parts[i]);
	return 0;
}

/* Same result for long pieces in O(n log n): a min-heap of (rank, left
 * start) over a linked list of parts. An entry is stale when its left part
 * is gone or its pair rank changed; pair strings only grow, so a rank value
 * never returns to a position. */
struct heap_ent { uint32_t rank, pos; };

static bool heap_less(struct heap_ent a, struct heap_ent b)
{
	return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos);
}

static void heap_push(struct heap_ent *h, size_t *n, struct heap_ent e)
{
	size_t i = (*n)++;

	while (i > 0) {
		size_t p = (i - 1) / 2;
		if (!heap_less(e, h[p]))
			break;
		h[i] = h[p];
		i = p;
	}
	h[i] = e;
}

static struct heap_ent heap_pop(struct heap_ent *h, size_t *n)
{
	struct heap_ent top = h[0], last = h[--(*n)];
	size_t i = 0;

	for (;;) {
		size_t c = 2 * i + 1;
		if (c >= *n)
			break;
		if (c + 1 < *n && heap_less(h[c + 1], h[c]))
			c++;
		if (!heap_less(h[c], last))
			break;
		h[i] = h[c];
		i = c;
	}
	if (*n)
		h[i] = last;
	return top;
}

static int bpe_large(const struct k3_tok *tok, const uint8_t *s, size_t n, struct k3_tok_ids *out)
{
	/* per byte position: end of the part starting here (0 = not a part
	 * start), previous part start, current pair rank */
	uint32_t *end = malloc(n * sizeof(uint32_t));
	uint32_t *prev = malloc(n * sizeof(uint32_t));
	uint32_t *prk = malloc(n * sizeof(uint32_t));
	struct heap_ent *h = malloc(2 * n * sizeof(*h));
	size_t hn = 0;
	int rc = -ENOMEM;

	if (!end || !prev || !prk || !h)
		goto out;
	for (size_t i = 0; i < n; i++) {
		end[i] = (uint32_t)i + 1;
		prev[i] = i ? (uint32_t)i - 1 : NO_RANK;
		prk[i] = i + 1 < n ? rank_of(tok, s + i, 2) : NO_RANK;
		if (prk[i] != NO_RANK)
			heap_push(h, &hn, (struct heap_ent){ prk[i], (uint32_t)i });
	}
	while (hn) {
		struct heap_ent e = heap_pop(h, &hn);
		uint32_t a = e.pos, b, c;

		if (!end[a] || prk[a] != e.rank)
			continue;
		b = end[a];            /* right part start */
		c = end[b];            /* right part end */
		end[a] = c;
		end[b] = 0;
		if (c < n)
			prev[c] = a;
		/* new pair with the right neighbour */
		prk[a] = c < n ? rank_of(tok, s + a, end[c] - a) : NO_RANK;
		if (prk[a] != NO_RANK)
			heap_push(h, &hn, (struct heap_ent){ prk[a], a });
		if (prev[a] != NO_RANK) {
			uint32_t p = prev[a];
			prk[p] = rank_of(tok, s + p, c - p);
			if (prk[p] != NO_RANK)
				heap_push(h, &hn, (struct heap_ent){ prk[p], p });
		}
		if (hn + 2 > 2 * n) {
			/* compact: drop stale entries (cannot grow unbounded) */
			size_t k = 0;
			for (size_t i = 0; i < hn; i++)
				if (end[h[i].pos] && prk[h[i].pos] == h[i].rank)
					h[k++] = h[i];
			hn = 0;
			for (size_t i = 0; i < k; i++)
				heap_push(h, &hn, h[i]);
		}
	}
	rc = 0;
	for (size_t i = 0; i < n; i = end[i]) {
		if ((rc = k3_tok_ids_push(out, rank_of(tok, s + i, end[i] - i))))
			break;
	}
out:
	free(end);
	free(prev);
	free(prk);
	free(h);
	return rc;
}

int k3_tok_bpe(const struct k3_tok *tok, const uint8_t *piece, size_t len, struct k3_tok_ids *out)
{
	uint32_t r;

	if (len == 0)
		return 0;
	r = rank_of(tok, piece, len);
	if (r != NO_RANK)
		return k3_tok_ids_push(out, r);
	if (len <= 128)
		return bpe_small(tok, piece, len, out);
	return bpe_large(tok, piece, len, out);
}

/* ---- the pre-tokenizer regex (§1.3) ------------------------------------- */

/* Rust regex semantics, spelled for PCRE2:
 *  - the Unicode classes follow UCD 16.0.0, the tables of tiktoken's regex
 *    engine (text_ucd.h, from gen_text_ucd.py), not the Unicode version of
 *    the PCRE2 build (14.0.0 in 10.42), to which every letter and digit
 *    assigned since is unassigned (docs/text.md, "Unicode version");
 *  - \s is Unicode White_Space, written out (PCRE2's \s differs on U+0085;
 *    White_Space has not changed since Unicode 6.0);
 *  - \p{Han} in Rust is Script=Han; PCRE2's bare \p{Han} is
 *    Script_Extensions (it would take U+3001), hence \p{sc:Han};
 *  - the class intersections [X&&[^\p{Han}]] have no PCRE2 10.42 syntax: a
 *    negative lookahead before the class is the same set, char by char
 *    (the explicit-range classes have Han removed already). */
#define WS "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
#define CONTR "(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
#define K3_TOK_PATTERN(HAN, UPPER, LOWER, N, NOT_LN)              \
	HAN "+"                                                   \
	"|" NOT_LN("\\r\\n") "?" UPPER "*" LOWER "+" CONTR         \
	"|" NOT_LN("\\r\\n") "?" UPPER "+" LOWER "*" CONTR         \
	"|" N "{1,3}"                                             \
	"|\\x{20}?" NOT_LN(WS) "+[\\r\\n]*"                         \
	"|[" WS "]*[\\r\\n]+"                                     \
	"|[" WS "]+(?![^" WS "])"                                 \
	"|[" WS "]+"
/* The three spellings of text_ucd.h (text_tok.h, k3_tok_pattern). With
 * PCRE2 tables of K3_UCD_PCRE2_BASE (Debian 12) the tokenizer matches with
 * _PCRE2, the pattern as it was before the table and as fast, and switches
 * to _PCRE2_NEW (about 25% slower on non-ASCII text: alternations tried per
 * character) only for the segments that hold a code point of
 * k3_ucd_new[], which its UTF-8 check already looks for. */
static const char k3_tok_pattern_pcre2[] =
	K3_TOK_PATTERN(K3_UCD_HAN_PCRE2, K3_UCD_UPPER_PCRE2, K3_UCD_LOWER_PCRE2, K3_UCD_N_PCRE2,
		       K3_UCD_NOT_LN_PCRE2);
static const char k3_tok_pattern_pcre2_new[] =
	K3_TOK_PATTERN(K3_UCD_HAN_PCRE2_NEW, K3_UCD_UPPER_PCRE2_NEW, K3_UCD_LOWER_PCRE2_NEW,
		       K3_UCD_N_PCRE2_NEW, K3_UCD_NOT_LN_PCRE2_NEW);
static const char k3_tok_pattern_explicit[] =
	K3_TOK_PATTERN(K3_UCD_HAN, K3_UCD_UPPER, K3_UCD_LOWER, K3_UCD_N, K3_UCD_NOT_LN);

const char *k3_tok_pattern(enum k3_tok_regex which)
{
	switch (which) {
	case K3_TOK_REGEX_PCRE2: return k3_tok_pattern_pcre2;
	case K3_TOK_REGEX_PCRE2_NEW: return k3_tok_pattern_pcre2_new;
	default: return k3_tok_pattern_explicit;
	}
}

enum k3_tok_regex k3_tok_regex_for_pcre2(bool *needs_new)
{
	char v[32];

	*needs_new = false;
	if (pcre2_config(PCRE2_CONFIG_UNICODE_VERSION, v) < 0)
		return K3_TOK_REGEX_EXPLICIT;
	if (strcmp(v, K3_UCD_VERSION) == 0)
		return K3_TOK_REGEX_PCRE2;
	if (strcmp(v, K3_UCD_PCRE2_BASE) == 0) {
		*needs_new = true;
		return K3_TOK_REGEX_PCRE2;
	}
	return K3_TOK_REGEX_EXPLICIT;
}

static int compile_one(struct tok_re *re, const char *pattern, struct k3_err *err)
{
	int ec;
	PCRE2_SIZE eo;

	re->code = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED,
				 PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &ec, &eo, NULL);
	if (!re->code) {
		PCRE2_UCHAR msg[256];
		pcre2_get_error_message(ec, msg, sizeof(msg));
		return k3_err_set(err, -EINVAL, "pre-tokenizer regex: %s at offset %zu", (char *)msg, (size_t)eo);
	}
	/* JIT is an optimisation: without it (unsupported CPU) the
	 * interpreter gives the same matches. */
	re->jit = pcre2_jit_compile(re->code, PCRE2_JIT_COMPLETE) == 0;
	return 0;
}

static int compile_regex(struct k3_tok *tok, struct k3_err *err)
{
	bool needs_new;
	int rc = compile_one(&tok->re, k3_tok_pattern(k3_tok_regex_for_pcre2(&needs_new)), err);

	if (rc == 0 && needs_new)
		rc = compile_one(&tok->re_new, k3_tok_pattern(K3_TOK_REGEX_PCRE2_NEW), err);
	for (size_t i = 0; i < sizeof(k3_ucd_new) / sizeof(k3_ucd_new[0]); i++)
		for (uint32_t b = k3_ucd_new[i][0] >> 8; b <= k3_ucd_new[i][1] >> 8; b++)
			tok->new_block[b / 8] |= (uint8_t)(1u << b % 8);
	return rc;
}

/* True when s[0..len) (valid UTF-8) holds a code point of k3_ucd_new[]:
 * then only tok->re_new classes it as the release does. Runs only on text
 * where utf8_valid_prefix_blocks saw a code point in one of their blocks. */
static bool has_new_code_point(const struct k3_tok *tok, const char *s, size_t len)
{
	const uint8_t *u = (const uint8_t *)s;
	const size_t n_new = sizeof(k3_ucd_new) / sizeof(k3_ucd_new[0]);

	for (size_t i = 0; i < len;) {
		uint32_t c;
		size_t lo = 0, hi = n_new;

		i += utf8_next(u + i, &c);
		if (!(tok->new_block[c >> 11] >> (c >> 8 & 7) & 1))
			continue;
		while (lo < hi) {   /* first range ending at or after c */
			size_t mid = (lo + hi) / 2;
			if (k3_ucd_new[mid][1] < c)
				lo = mid + 1;
			else
				hi = mid;
		}
		if (lo < n_new && k3_ucd_new[lo][0] <= c)
			return true;
	}
	return false;
}

struct matcher {
	pcre2_match_data *md;
	pcre2_match_context *mc;
	pcre2_jit_stack *js;
	const struct tok_re *re;   /* tok->re or tok->re_new, by matcher_pick */
	bool maybe_new;            /* the text may hold k3_ucd_new[] code points */
};

/* Picks the regex for the text m will split next: pieces never cross a
 * slice or a special token, so one choice per such segment is exact. */
static void matcher_pick(struct matcher *m, const struct k3_tok *tok, const char *s, size_t len)
{
	bool new_re = m->maybe_new && tok->re_new.code && has_new_code_point(tok, s, len);

	m->re = new_re ? &tok->re_new : &tok->re;
}

static void matcher_release(struct matcher *m)
{
	pcre2_match_data_free(m->md);
	pcre2_match_context_free(m->mc);
	pcre2_jit_stack_free(m->js);
}

/* Finds the next piece at or after off. Returns 1 with [*a, *b), 0 when
 * none, or a negative errno. */
static int next_piece(struct matcher *m, const char *s, size_t len, size_t off, size_t *a,
		      size_t *b)
{
	int rc;

	if (!m->md) {
		m->md = pcre2_match_data_create(2, NULL);
		if (!m->md)
			return -ENOMEM;
	}
	/* the JIT fast path skips pcre2_match's option checks */
	if (m->re->jit)
		rc = pcre2_jit_match(m->re->code, (PCRE2_SPTR)s, len, off, 0, m->md, m->mc);
	else
		rc = pcre2_match(m->re->code, (PCRE2_SPTR)s, len, off, PCRE2_NO_UTF_CHECK, m->md, m->mc);
	if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !m->js) {
		/* Long word runs recurse per character in the lookahead
		 * groups; slices are at most 25,000 characters. */
		m->mc = pcre2_match_context_create(NULL);
		m->js = pcre2_jit_stack_create(64 << 10, 64 << 20, NULL);
		if (!m->mc || !m->js)
			return -ENOMEM;
		pcre2_jit_stack_assign(m->mc, NULL, m->js);
		rc = pcre2_match(m->re->code, (PCRE2_SPTR)s, len, off, PCRE2_NO_UTF_CHECK, m->md, m->mc);
	}
	if (rc == PCRE2_ERROR_NOMATCH)
		return 0;
	if (rc < 0)
		return rc == PCRE2_ERROR_NOMEMORY ? -ENOMEM : -EOVERFLOW;
	PCRE2_SIZE *ov = pcre2_get_ovector_pointer(m->md);
	*a = ov[0];
	*b = ov[1];
	return 1;
}

/* ---- ASCII fast path ------------------------------------------------------ */

/* A hand-written scanner for the same regex, used while every character
 * the match depends on is ASCII (where the classes are trivial: letters
 * A-Z/a-z, digits 0-9, \s = \t\n\v\f\r and space). It tries the eight
 * alternatives in order with the regex's greedy/backtracking outcome; the
 * moment a decision would need to classify a non-ASCII character it gives
 * up (returns 0) and PCRE2 matches that piece instead. Proven equal to the
 * PCRE2 path on random text by test_tok (k3_tok_split_pieces_ref). */
enum { A_END, A_NA, A_UP, A_LO, A_DIG, A_NL, A_WS, A_OTH };

static uint8_t ascii_class(uint8_t c)
{
	if (c >= 'A' && c <= 'Z') return A_UP;
	if (c >= 'a' && c <= 'z') return A_LO;
	if (c >= '0' && c <= '9') return A_DIG;
	if (c == '\r' || c == '\n') return A_NL;
	if (c == ' ' || c == '\t' || c == '\v' || c == '\f') return A_WS;
	return A_OTH;
}

struct ascan {
	const uint8_t *s;
	size_t n;       /* end of the slice */
	size_t e;       /* first non-ASCII byte at or after the match start */
	bool bail;
};

static int acl(struct ascan *a, size_t q)
{
	if (q >= a->n)
		return A_END;
	if (q >= a->e) {
		a->bail = true;   /* the regex would look at a non-ASCII char */
		return A_NA;
	}
	return ascii_class(a->s[q]);
}

/* (?i:'s|'t|'re|'ve|'m|'ll|'d)? at q: extra length. 'ſ (U+017F) folds to
 * 's, so a non-ASCII char after the apostrophe needs PCRE2. */
static size_t contraction(struct ascan *a, size_t q)
{
	uint8_t c1, c2;

	if (q >= a->n || q >= a->e || a->s[q] != '\'')
		return 0;
	if (acl(a, q + 1) == A_END || a->bail)
		return 0;
	c1 = a->s[q + 1] | 0x20;
	if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd')
		return 2;
	if (q + 2 >= a->n || q + 2 >= a->e)
		return 0;   /* no non-ASCII char folds to e or l */
	c2 = a->s[q + 2] | 0x20;
	if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l'))
		return 3;
	return 0;
}

/* U* W+ contraction? from t (alternative 2 after its prefix); 0 = no match */
static size_t word_a(struct ascan *a, size_t t)
{
	size_t q = t, k;
	int c;

	while ((c = acl(a, q)) == A_UP)
		q++;
	if (c != A_LO)
		return 0;
	while ((c = acl(a, q)) == A_LO)
		q++;
	if (a->bail)
		return 0;
	k = contraction(a, q);
	return a->bail ? 0 : q + k - t;
}

/* U+ W* contraction? from t (alternative 3) */
static size_t word_b(struct ascan *a, size_t t)
{
	size_t q = t, k;
	int c;

	if (acl(a, q) != A_UP)
		return 0;
	while ((c = acl(a, q)) == A_UP)
		q++;
	while ((c = acl(a, q)) == A_LO)
		q++;
	if (a->bail)
		return 0;
	k = contraction(a, q);
	return a->bail ? 0 : q + k - t;
}

static size_t ascii_piece(const uint8_t *s, size_t n, size_t p, size_t e)
{
	struct ascan a = { s, n, e, false };
	int c = acl(&a, p);
	bool prefix = c == A_WS || c == A_OTH;   /* [^\r\n\p{L}\p{N}] */
	size_t k, q;

	/* 2: word with lower-case tail, with then without the prefix */
	if (prefix && (k = word_a(&a, p + 1)))
		return 1 + k;
	if (a.bail)
		return 0;
	if ((k = word_a(&a, p)))
		return k;
	if (a.bail)
		return 0;
	/* 3: upper-case word */
	if (prefix && (k = word_b(&a, p + 1)))
		return 1 + k;
	if (a.bail)
		return 0;
	if ((k = word_b(&a, p)))
		return k;
	if (a.bail)
		return 0;
	/* 4: \p{N}{1,3} */
	if (c == A_DIG) {
		for (q = p; q < p + 3 && acl(&a, q) == A_DIG; q++)
			;
		return a.bail ? 0 : q - p;
	}
	/* 5:  ?[^\s\p{L}\p{N}]+[\r\n]* */
	q = p;
	if (s[p] == ' ' && acl(&a, p + 1) == A_OTH)
		q = p + 1;
	if (a.bail)
		return 0;
	if (acl(&a, q) == A_OTH) {
		while (acl(&a, q) == A_OTH)
			q++;
		if (a.bail)
			return 0;
		while (q < n && q < e && (s[q] == '\r' || s[q] == '\n'))
			q++;
		return q - p;
	}
	if (c != A_WS && c != A_NL)
		return 0;   /* unreachable for ASCII; PCRE2 decides */
	/* 6, 7, 8: a whitespace run */
	size_t last_nl = SIZE_MAX;
	for (q = p; (c = acl(&a, q)) == A_WS || c == A_NL; q++)
		if (c == A_NL)
			last_nl = q;
	if (a.bail)
		return 0;
	if (last_nl != SIZE_MAX)
		return last_nl + 1 - p;                 /* \s*[\r\n]+ */
	if (c == A_END)
		return q - p;                           /* \s+(?!\S) at the end */
	if (q - p >= 2)
		return q - p - 1;                       /* give back one */
	return 1;                                       /* \s+ */
}

/* Next piece at or after off; ASCII fast path, else PCRE2. *na caches the
 * first non-ASCII byte at or after off. */
static int find_piece(struct matcher *m, const char *s, size_t len, size_t off, size_t *na, size_t *a,
		      size_t *b)
{
	const uint8_t *u = (const uint8_t *)s;

	if (*na < off || *na == SIZE_MAX) {
		size_t q = off;
		while (q < len && u[q] < 0x80)
			q++;
		*na = q;
	}
	if (u[off] < 0x80) {
		size_t k = ascii_piece(u, len, off, *na);
		if (k) {
			*a = off;
			*b = off + k;
			return 1;
		}
	}
	return next_piece(m, s, len, off, a, b);
}

static int split_pieces(const struct k3_tok *tok, const char *text, size_t len, bool fast,
			k3_tok_piece_fn fn, void *ud, struct k3_err *err)
{
	struct matcher m = { 0 };
	size_t off = 0, na = SIZE_MAX;
	size_t bad = utf8_valid_prefix_blocks(text, len, tok->re_new.code ? tok->new_block : NULL,
					      &m.maybe_new);
	int rc = 0;

	if (bad != len)
		return k3_err_set(err, -EILSEQ, "invalid UTF-8 at byte %zu", bad);
	matcher_pick(&m, tok, text, len);
	while (off < len) {
		size_t a, b;
		rc = fast ? find_piece(&m, text, len, off, &na, &a, &b)
			  : next_piece(&m, text, len, off, &a, &b);
		if (rc <= 0)
			break;
		if ((rc = fn(ud, a, b - a)))
			break;
		off = b;
	}
	matcher_release(&m);
	if (rc < 0)
		return k3_err_set(err, rc, "pre-tokenizer failed (%d)", rc);
	return rc;
}

int k3_tok_split_pieces(const struct k3_tok *tok, const char *text, size_t len,
			k3_tok_piece_fn fn, void *ud, struct k3_err *err)
{
	return split_pieces(tok, text, len, true, fn, ud, err);
}

int k3_tok_split_pieces_ref(const struct k3_tok *tok, const char *text, size_t len,
			    k3_tok_piece_fn fn, void *ud, struct k3_err *err)
{
	return split_pieces(tok, text, len, false, fn, ud, err);
}

/* ---- encoding ------------------------------------------------------------ */

static int encode_ordinary(const struct k3_tok *tok, struct matcher *m, const char *s, size_t len,
			   struct k3_tok_ids *out)
{
	size_t off = 0, na = SIZE_MAX;

	matcher_pick(m, tok, s, len);
	while (off < len) {
		size_t a, b;
		int rc = find_piece(m, s, len, off, &na, &a, &b);
		if (rc < 0)
			return rc;
		if (rc == 0)
			break;
		if ((rc = k3_tok_bpe(tok, (const uint8_t *)s + a, b - a, out)))
			return rc;
		off = b;
	}
	return 0;
}

/* Longest special name starting at p; returns its byte length or 0. */
static size_t special_at(const struct k3_tok *tok, const uint8_t *p, size_t n, uint32_t *id)
{
	uint32_t node = 0;
	size_t best = 0;

	*id = NO_RANK;   /* written on every path: callers read it only when best > 0 */
	for (size_t i = 0; i < n; i++) {
		uint32_t c = tok->trie[node].child;
		while (c && tok->trie[c].byte != p[i])
			c = tok->trie[c].next;
		if (!c)
			break;
		node = c;
		if (tok->trie[node].id != NO_RANK) {
			best = i + 1;
			*id = tok->trie[node].id;
		}
	}
	return best;
}

static int encode_slice(const struct k3_tok *tok, struct matcher *m, const char *s, size_t len,
			bool allow_special, struct k3_tok_ids *out)
{
	const uint8_t *u = (const uint8_t *)s;
	size_t start = 0;
	int rc;

	if (allow_special) {
		for (size_t i = 0; i < len; i++) {
			uint32_t id;
			size_t k;
			if (!tok->special_first[u[i]])
				continue;
			k = special_at(tok, u + i, len - i, &id);
			if (!k)
				continue;
			if ((rc = encode_ordinary(tok, m, s + start, i - start, out)))
				return rc;
			if ((rc = k3_tok_ids_push(out, id)))
				return rc;
			start = i + k;
			i = start - 1;
		}
	}
	return encode_ordinary(tok, m, s + start, len - start, out);
}

int k3_tok_encode(const struct k3_tok *tok, const char *text, size_t len, bool allow_special,
		  struct k3_tok_ids *out, struct k3_err *err)
{
	const uint8_t *u = (const uint8_t *)text;
	struct matcher m = { 0 };
	size_t n0 = out->n, bad, i = 0;
	int rc = 0;

	if (len > K3_LIM_TEXT_MAX)
		return k3_err_set(err, -E2BIG, "text of %zu bytes exceeds the %u-byte limit", len, K3_LIM_TEXT_MAX);
	bad = utf8_valid_prefix_blocks(text, len, tok->re_new.code ? tok->new_block : NULL,
				       &m.maybe_new);
	if (bad != len)
		return k3_err_set(err, -EILSEQ, "invalid UTF-8 at byte %zu", bad);

	/* §1.5: 400,000-code-point chunks, then same-class runs of more than
	 * 25,000 characters are cut; slices are encoded independently. The
	 * chunk boundary resets the run state, as in the Python generator.
	 * Text of at most 25,000 bytes has at most 25,000 characters: no cut. */
	if (len <= K3_TOK_RUN_CHARS) {
		rc = encode_slice(tok, &m, text, len, allow_special, out);
		i = len;
	}
	while (i < len && rc == 0) {
		size_t chunk_chars = 0, slice_start = i, run = 0;
		bool run_space = false;

		while (i < len && chunk_chars < K3_TOK_CHUNK_CHARS) {
			uint32_t cp;
			size_t k = utf8_next(u + i, &cp);
			bool sp = py_isspace(cp);

			if (chunk_chars == 0)
				run_space = sp;
			if (sp != run_space) {
				run = 1;
				run_space = sp;
			} else if (++run > K3_TOK_RUN_CHARS) {
				rc = encode_slice(tok, &m, text + slice_start, i - slice_start, allow_special, out);
				if (rc)
					break;
				slice_start = i;
				run = 1;
			}
			i += k;
			chunk_chars++;
		}
		if (rc == 0)
			rc = encode_slice(tok, &m, text + slice_start, i - slice_start, allow_special, out);
	}
	matcher_release(&m);
	if (rc) {
		out->n = n0;
		if (rc == -ENOMEM)
			return k3_err_set(err, rc, "out of memory while encoding %zu bytes", len);
		return k3_err_set(err, rc, "pre-tokenizer failed on %zu bytes (%d)", len, rc);
	}
	return 0;
}

/* ---- decoding ------------------------------------------------------------ */

uint32_t k3_tok_n_ranks(const struct k3_tok *tok) { return tok->n_ranks; }
uint32_t k3_tok_n_vocab(const struct k3_tok *tok) { return tok->n_vocab; }

uint32_t k3_tok_special(const struct k3_tok *tok, unsigned which)
{
	return tok->n_ranks + (which & 0xff);
}

bool k3_tok_is_special(const struct k3_tok *tok, uint32_t id)
{
	return id >= tok->n_ranks && id < tok->n_vocab;
}

bool k3_tok_special_prefix(const struct k3_tok *tok, const char *s, size_t n)
{
	uint32_t node = 0;

	for (size_t i = 0; i < n; i++) {
		uint32_t c = tok->trie[node].child;
		while (c && tok->trie[c].byte != (uint8_t)s[i])
			c = tok->trie[c].next;
		if (!c)
			return false;
		node = c;
	}
	return n > 0 && tok->trie[node].child != 0;
}

int64_t k3_tok_special_by_name(const struct k3_tok *tok, const char *name)
{
	uint32_t id;
	size_t n = strlen(name);

	if (n && special_at(tok, (const uint8_t *)name, n, &id) == n)
		return id;
	return -ENOENT;
}

int k3_tok_id_bytes(const struct k3_tok *tok, uint32_t id, const uint8_t **bytes, size_t *len)
{
	if (id >= tok->n_vocab)
		return -ERANGE;
	*bytes = tok->arena + tok->off[id];
	*len = tok->off[id + 1] - tok->off[id];
	return 0;
}

int k3_tok_decode(const struct k3_tok *tok, const uint32_t *ids, size_t n,
		  char **out, size_t *out_len, struct k3_err *err)
{
	size_t total = 0, w = 0;
	char *buf;

	if (n > SIZE_MAX / K3_TOK_TOKEN_BYTES_MAX - 1)
		return k3_err_set(err, -E2BIG, "%zu ids are too many to decode at once", n);
	for (size_t i = 0; i < n; i++) {
		if (ids[i] >= tok->n_vocab)
			return k3_err_set(err, -ERANGE, "id %u at position %zu is outside the vocabulary (%u ids)",
					  ids[i], i, tok->n_vocab);
		total += tok->off[ids[i] + 1] - tok->off[ids[i]];
	}
	buf = malloc(total + 1);
	if (!buf)
		return k3_err_set(err, -ENOMEM, "out of memory decoding %zu ids", n);
	for (size_t i = 0; i < n; i++) {
		uint32_t k = tok->off[ids[i] + 1] - tok->off[ids[i]];
		memcpy(buf + w, tok->arena + tok->off[ids[i]], k);
		w += k;
	}
	buf[w] = 0;
	*out = buf;
	*out_len = w;
	return 0;
}

/* ---- loading --------------------------------------------------------------- */

void k3_tok_free(struct k3_tok *tok)
{
	if (!tok)
		return;
	free(tok->arena);
	free(tok->off);
	free(tok->ht);
	free(tok->pair);
	free(tok->trie);
	pcre2_code_free(tok->re.code);
	pcre2_code_free(tok->re_new.code);
	free(tok);
}

static int b64_val(uint8_t c)
{
	if (c >= 'A' && c <= 'Z') return c - 'A';
	if (c >= 'a' && c <= 'z') return c - 'a' + 26;
	if (c >= '0' && c <= '9') return c - '0' + 52;
	if (c == '+') return 62;
	if (c == '/') return 63;
	return -1;
}

/* Standard base64 with padding; returns decoded length or -1. */
static long b64_decode(const uint8_t *s, size_t n, uint8_t *out, size_t cap)
{
	size_t w = 0;

	if (n == 0 || n % 4)
		return -1;
	for (size_t i = 0; i < n; i += 4) {
		int v[4], pad = 0;
		for (int k = 0; k < 4; k++) {
			if (s[i + k] == '=' && i + 4 == n && k >= 2) {
				v[k] = 0;
				pad++;
			} else if (pad || (v[k] = b64_val(s[i + k])) < 0) {
				return -1;
			}
		}
		uint32_t x = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
		if (w + 3 - (size_t)pad > cap)
			return -1;
		out[w++] = (uint8_t)(x >> 16);
		if (pad < 2) out[w++] = (uint8_t)(x >> 8);
		if (pad < 1) out[w++] = (uint8_t)x;
	}
	return (long)w;
}

static int trie_add(struct k3_tok *tok, const uint8_t *name, size_t n, uint32_t id)
{
	uint32_t node = 0;

	for (size_t i = 0; i < n; i++) {
		uint32_t c = tok->trie[node].child, last = 0;
		while (c && tok->trie[c].byte != name[i]) {
			last = c;
			c = tok->trie[c].next;
		}
		if (!c) {
			c = tok->n_trie++;
			tok->trie[c] = (struct trie_node){ 0, 0, NO_RANK, name[i] };
			if (last)
				tok->trie[last].next = c;
			else
				tok->trie[node].child = c;
		}
		node = c;
	}
	if (tok->trie[node].id != NO_RANK)
		return -EEXIST;
	tok->trie[node].id = id;
	return 0;
}

/* Reads added_tokens_decoder into names[0..255] (NULL = reserved). The
 * strings stay owned by root. */
static int load_config(json_t *root, uint32_t n_ranks, const char *names[K3_TOK_N_SPECIAL],
		       struct k3_err *err)
{
	json_t *dec = json_object_get(root, "added_tokens_decoder"), *v;
	const char *key;

	if (!json_is_object(root))
		return k3_err_set(err, -EINVAL, "tokenizer config: top level is not a JSON object");
	if (!dec)
		return 0;
	if (!json_is_object(dec))
		return k3_err_set(err, -EINVAL, "tokenizer config: 'added_tokens_decoder' is not an object");
	json_object_foreach(dec, key, v) {
		uint64_t id;
		json_t *c = json_object_get(v, "content");
		if (k3_parse_u64(key, 0, UINT32_MAX, &id, NULL))
			return k3_err_set(err, -EINVAL, "tokenizer config: added token key '%.40s' is not an id", key);
		if (!json_is_string(c) || json_string_length(c) == 0 ||
		    json_string_length(c) > K3_TOK_SPECIAL_NAME_MAX ||
		    strlen(json_string_value(c)) != json_string_length(c))
			return k3_err_set(err, -EINVAL, "tokenizer config: added token %s has no usable 'content'", key);
		/* Entries outside the special block are ignored, as in
		 * tokenization_kimi.py, which only reads the 256 slots. */
		if (id >= n_ranks && id < (uint64_t)n_ranks + K3_TOK_N_SPECIAL)
			names[id - n_ranks] = json_string_value(c);
	}
	return 0;
}

int k3_tok_load_buffers(const char *ranks, size_t ranks_len, const char *config, size_t config_len,
			struct k3_tok **out, struct k3_err *err)
{
	const uint8_t *p = (const uint8_t *)ranks, *end = p + ranks_len;
	struct k3_tok *tok = NULL;
	uint32_t n = 0, *line_rank = NULL;
	uint8_t *seen = NULL;
	size_t arena_len = 0, line_no = 0;
	const char *names[K3_TOK_N_SPECIAL] = { 0 };
	char reserved[K3_TOK_N_SPECIAL][32];
	json_t *cfg = NULL;
	int rc;

	if (ranks_len > K3_TOK_FILE_MAX)
		return k3_err_set(err, -E2BIG, "rank file of %zu bytes exceeds the %u-byte limit", ranks_len, K3_TOK_FILE_MAX);
	tok = calloc(1, sizeof(*tok));
	if (!tok)
		return k3_err_set(err, -ENOMEM, "out of memory");

	/* Pass 1: count entries, bound sizes. */
	for (const uint8_t *q = p; q < end;) {
		const uint8_t *nl = memchr(q, '\n', (size_t)(end - q));
		const uint8_t *le = nl ? nl : end;
		if (le > q && !(le - q == 1 && *q == '\r')) {
			if (++n > K3_TOK_RANKS_MAX) {
				rc = k3_err_set(err, -E2BIG, "rank file has more than %u entries", K3_TOK_RANKS_MAX);
				goto fail;
			}
			arena_len += (size_t)(le - q);
		}
		q = nl ? nl + 1 : end;
	}
	if (n < 256) {
		rc = k3_err_set(err, -EINVAL, "rank file has %u entries; at least the 256 single bytes are needed", n);
		goto fail;
	}
	tok->n_ranks = n;
	tok->n_vocab = n + K3_TOK_N_SPECIAL;
	arena_len += (size_t)K3_TOK_N_SPECIAL * (K3_TOK_SPECIAL_NAME_MAX + 1);
	tok->arena = malloc(arena_len);
	tok->off = calloc((size_t)tok->n_vocab + 1, sizeof(uint32_t));
	line_rank = malloc((size_t)n * sizeof(uint32_t));
	seen = calloc(n, 1);
	tok->ht_mask = 1;
	while (tok->ht_mask < 2 * n)
		tok->ht_mask <<= 1;
	tok->ht = calloc(tok->ht_mask, sizeof(uint32_t));
	tok->ht_mask--;
	tok->pair = malloc(65536 * sizeof(uint32_t));
	if (!tok->arena || !tok->off || !line_rank || !seen || !tok->ht || !tok->pair) {
		rc = k3_err_set(err, -ENOMEM, "out of memory loading %u ranks", n);
		goto fail;
	}

	/* Pass 2: decode every line into a temporary slot; the arena is laid
	 * out by rank afterwards (rank = id). Temporary layout: line order. */
	{
		uint8_t *tmp = malloc(arena_len);
		uint32_t *toff = malloc(((size_t)n + 1) * sizeof(uint32_t));
		size_t w = 0;
		uint32_t li = 0;

		if (!tmp || !toff) {
			free(tmp);
			free(toff);
			rc = k3_err_set(err, -ENOMEM, "out of memory loading %u ranks", n);
			goto fail;
		}
		for (const uint8_t *q = p; q < end;) {
			const uint8_t *nl = memchr(q, '\n', (size_t)(end - q));
			const uint8_t *le = nl ? nl : end, *sp;
			char num[16];
			uint64_t r;
			long k;

			line_no++;
			if (le > q && le[-1] == '\r')
				le--;
			if (le == q) {
				q = nl ? nl + 1 : end;
				continue;
			}
			sp = memchr(q, ' ', (size_t)(le - q));
			if (!sp || (size_t)(le - sp - 1) >= sizeof(num) || le - sp - 1 == 0) {
				rc = k3_err_set(err, -EINVAL, "rank file line %zu: want '<base64> <rank>'", line_no);
				goto fail2;
			}
			memcpy(num, sp + 1, (size_t)(le - sp - 1));
			num[le - sp - 1] = 0;
			if (k3_parse_u64(num, 0, n - 1, &r, NULL)) {
				rc = k3_err_set(err, -EINVAL, "rank file line %zu: rank '%s' is not in 0..%u (ranks must be contiguous)",
						line_no, num, n - 1);
				goto fail2;
			}
			if (seen[r]) {
				rc = k3_err_set(err, -EINVAL, "rank file line %zu: rank %llu appears twice", line_no,
						(unsigned long long)r);
				goto fail2;
			}
			seen[r] = 1;
			k = b64_decode(q, (size_t)(sp - q), tmp + w, K3_TOK_TOKEN_BYTES_MAX);
			if (k <= 0) {
				rc = k3_err_set(err, -EINVAL, "rank file line %zu: bad base64 token (or longer than %u bytes)",
						line_no, K3_TOK_TOKEN_BYTES_MAX);
				goto fail2;
			}
			toff[li] = (uint32_t)w;
			line_rank[li] = (uint32_t)r;
			w += (size_t)k;
			li++;
			toff[li] = (uint32_t)w;
			q = nl ? nl + 1 : end;
		}
		/* every rank 0..n-1 was seen exactly once (n lines, no
		 * duplicates, all < n), so the ranks are contiguous */
		{
			uint32_t *len_by_rank = calloc(n, sizeof(uint32_t)), *src = malloc((size_t)n * sizeof(uint32_t));
			if (!len_by_rank || !src) {
				free(len_by_rank);
				free(src);
				rc = k3_err_set(err, -ENOMEM, "out of memory loading %u ranks", n);
				goto fail2;
			}
			for (uint32_t i = 0; i < n; i++) {
				len_by_rank[line_rank[i]] = toff[i + 1] - toff[i];
				src[line_rank[i]] = toff[i];
			}
			w = 0;
			for (uint32_t r = 0; r < n; r++) {
				tok->off[r] = (uint32_t)w;
				memcpy(tok->arena + w, tmp + src[r], len_by_rank[r]);
				w += len_by_rank[r];
			}
			tok->off[n] = (uint32_t)w;
			free(len_by_rank);
			free(src);
		}
		free(tmp);
		free(toff);
		goto pass2_done;
fail2:
		free(tmp);
		free(toff);
		goto fail;
	}
pass2_done:
	/* Hash every rank; a duplicate byte string is an error (ranks must be
	 * a bijection for BPE to be well defined). */
	for (uint32_t r = 0; r < n; r++) {
		const uint8_t *b = tok->arena + tok->off[r];
		uint32_t len = tok->off[r + 1] - tok->off[r];
		uint32_t i = (uint32_t)hash_bytes(b, len) & tok->ht_mask;
		while (tok->ht[i]) {
			uint32_t e = tok->ht[i] - 1;
			if (tok->off[e + 1] - tok->off[e] == len && memcmp(tok->arena + tok->off[e], b, len) == 0) {
				rc = k3_err_set(err, -EINVAL, "rank file: ranks %u and %u have the same bytes", e, r);
				goto fail;
			}
			i = (i + 1) & tok->ht_mask;
		}
		tok->ht[i] = r + 1;
	}
	for (int b = 0; b < 256; b++) {
		uint8_t c = (uint8_t)b;
		tok->byte_rank[b] = NO_RANK;
		uint32_t i = (uint32_t)hash_bytes(&c, 1) & tok->ht_mask;
		while (tok->ht[i]) {
			uint32_t e = tok->ht[i] - 1;
			if (tok->off[e + 1] - tok->off[e] == 1 && tok->arena[tok->off[e]] == c) {
				tok->byte_rank[b] = e;
				break;
			}
			i = (i + 1) & tok->ht_mask;
		}
		if (tok->byte_rank[b] == NO_RANK) {
			rc = k3_err_set(err, -EINVAL, "rank file: byte 0x%02x has no rank (all 256 bytes are required)", b);
			goto fail;
		}
	}
	for (uint32_t i = 0; i < 65536; i++)
		tok->pair[i] = NO_RANK;
	for (uint32_t r = 0; r < n; r++)
		if (tok->off[r + 1] - tok->off[r] == 2)
			tok->pair[(uint32_t)tok->arena[tok->off[r]] << 8 | tok->arena[tok->off[r] + 1]] = r;

	/* The release file is identified by its size in ranks; then its bytes
	 * must be the published ones (§1.1). */
	if (n == K3_TOK_REAL_RANKS) {
		unsigned char md[32];
		unsigned int mdlen = 0;
		char hex[65];
		if (!EVP_Digest(ranks, ranks_len, md, &mdlen, EVP_sha256(), NULL) || mdlen != 32) {
			rc = k3_err_set(err, -EIO, "SHA-256 of the rank file failed");
			goto fail;
		}
		for (int i = 0; i < 32; i++)
			snprintf(hex + 2 * i, 3, "%02x", md[i]);
		if (strcmp(hex, K3_TOK_REAL_SHA256) != 0) {
			rc = k3_err_set(err, -EBADMSG, "rank file has the release's %u ranks but SHA-256 %s, not %s",
					n, hex, K3_TOK_REAL_SHA256);
			goto fail;
		}
	}

	/* Special names (§1.6). */
	if (config) {
		json_error_t je;
		if (config_len > K3_TOK_FILE_MAX) {
			rc = k3_err_set(err, -E2BIG, "tokenizer config is too large");
			goto fail;
		}
		cfg = json_loadb(config, config_len, JSON_REJECT_DUPLICATES, &je);
		if (!cfg) {
			rc = k3_err_set(err, -EINVAL, "tokenizer config: %s at line %d", je.text, je.line);
			goto fail;
		}
		if ((rc = load_config(cfg, n, names, err)))
			goto fail;
	}
	tok->trie = malloc(((size_t)K3_TOK_N_SPECIAL * K3_TOK_SPECIAL_NAME_MAX + 1) * sizeof(*tok->trie));
	if (!tok->trie) {
		rc = k3_err_set(err, -ENOMEM, "out of memory");
		goto fail;
	}
	tok->trie[0] = (struct trie_node){ 0, 0, NO_RANK, 0 };
	tok->n_trie = 1;
	{
		size_t w = tok->off[n];
		for (uint32_t i = 0; i < K3_TOK_N_SPECIAL; i++) {
			const char *nm = names[i];
			size_t k;
			if (!nm) {
				snprintf(reserved[i], sizeof(reserved[i]), "<|reserved_token_%u|>", n + i);
				nm = reserved[i];
			}
			k = strlen(nm);
			memcpy(tok->arena + w, nm, k);
			tok->off[n + i] = (uint32_t)w;
			w += k;
			tok->off[n + i + 1] = (uint32_t)w;
			if (trie_add(tok, (const uint8_t *)nm, k, n + i)) {
				rc = k3_err_set(err, -EINVAL, "tokenizer config: special name '%s' is used twice", nm);
				goto fail;
			}
			tok->special_first[(uint8_t)nm[0]] = 1;
		}
	}
	if ((rc = compile_regex(tok, err)))
		goto fail;
	json_decref(cfg);
	free(line_rank);
	free(seen);
	*out = tok;
	return 0;
fail:
	json_decref(cfg);
	free(line_rank);
	free(seen);
	k3_tok_free(tok);
	return rc;
}

int k3_tok_load_files(const char *rank_path, const char *config_path, struct k3_tok **out,
		      struct k3_err *err)
{
	char *r = NULL, *c = NULL;
	size_t rn = 0, cn = 0;
	int rc;

	if ((rc = k3_file_read(rank_path, K3_TOK_FILE_MAX, 0, &r, &rn, err)))
		return rc;
	if (config_path && (rc = k3_file_read(config_path, K3_TOK_FILE_MAX, 0, &c, &cn, err))) {
		free(r);
		return rc;
	}
	rc = k3_tok_load_buffers(r, rn, c, cn, out, err);
	if (rc)
		k3_err_prefix(err, "%s", rank_path);
	free(r);
	free(c);
	return rc;
}

int k3_tok_load_dir(const char *dir, struct k3_tok **out, struct k3_err *err)
{
	char rp[4096], cp[4096];

	if ((size_t)snprintf(rp, sizeof(rp), "%s/tiktoken.model", dir) >= sizeof(rp) ||
	    (size_t)snprintf(cp, sizeof(cp), "%s/tokenizer_config.json", dir) >= sizeof(cp))
		return k3_err_set(err, -ENAMETOOLONG, "model directory path is too long");
	if (access(cp, F_OK) != 0)
		return k3_tok_load_files(rp, NULL, out, err);
	return k3_tok_load_files(rp, cp, out, err);
}

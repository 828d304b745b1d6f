/*
 * text_pretok.c - the K3 pre-tokenizer (docs/text-and-draft.md §1.3;
 * text_tok_internal.h says which tokenizer file does what): the UTF-8
 * check, the regex that cuts text into pieces with the Unicode classes of
 * the release (text_ucd.h), compiled once per tokenizer with PCRE2 (UTF,
 * UCP, JIT), and a hand-written ASCII scanner that matches the same
 * pieces without PCRE2 wherever the text is ASCII.
 */
#include "text/text_tok_internal.h"

#include <errno.h>
#include <stdlib.h>

#include "text/text_ucd.h"

/* ---- UTF-8 -------------------------------------------------------------- */

size_t tok_utf8_valid_prefix_blocks(const char *s, size_t len, const uint8_t *blocks, bool *hit)
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
	return tok_utf8_valid_prefix_blocks(s, len, NULL, NULL);
}

bool k3_tok_py_isblank(const char *s, size_t len)
{
	const uint8_t *u = (const uint8_t *)s;

	for (size_t i = 0; i < len;) {
		uint32_t cp;
		i += tok_utf8_next(u + i, &cp);
		if (!tok_py_isspace(cp))
			return false;
	}
	return true;
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

int tok_compile_regex(struct k3_tok *tok, struct k3_err *err)
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
 * where tok_utf8_valid_prefix_blocks saw a code point in one of their blocks. */
static bool has_new_code_point(const struct k3_tok *tok, const char *s, size_t len)
{
	const uint8_t *u = (const uint8_t *)s;
	const size_t n_new = sizeof(k3_ucd_new) / sizeof(k3_ucd_new[0]);

	for (size_t i = 0; i < len;) {
		uint32_t c;
		size_t lo = 0, hi = n_new;

		i += tok_utf8_next(u + i, &c);
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

void tok_matcher_pick(struct tok_matcher *m, const struct k3_tok *tok, const char *s, size_t len)
{
	bool new_re = m->maybe_new && tok->re_new.code && has_new_code_point(tok, s, len);

	m->re = new_re ? &tok->re_new : &tok->re;
}

void tok_matcher_release(struct tok_matcher *m)
{
	pcre2_match_data_free(m->md);
	pcre2_match_context_free(m->mc);
	pcre2_jit_stack_free(m->js);
}

/* Finds the next piece at or after off. Returns 1 with [*a, *b), 0 when
 * none, or a negative errno. */
static int next_piece(struct tok_matcher *m, const char *s, size_t len, size_t off, size_t *a,
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

/* A word from t, then contraction?: U* W+ with lower_tail (alternative
 * 2 after its prefix), else U+ W* (alternative 3); 0 = no match. */
static size_t word(struct ascan *a, size_t t, bool lower_tail)
{
	size_t q = t, k;
	int c;

	while ((c = acl(a, q)) == A_UP)
		q++;
	if (lower_tail ? c != A_LO : q == t)
		return 0;
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

	/* 2: word with lower-case tail, then 3: upper-case word; each with
	 * then without the prefix */
	for (int lower_tail = 1; lower_tail >= 0; lower_tail--) {
		if (prefix && (k = word(&a, p + 1, lower_tail)))
			return 1 + k;
		if (a.bail)
			return 0;
		if ((k = word(&a, p, lower_tail)))
			return k;
		if (a.bail)
			return 0;
	}
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

int tok_find_piece(struct tok_matcher *m, const char *s, size_t len, size_t off, size_t *na,
		   size_t *a, size_t *b)
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
	struct tok_matcher m = { 0 };
	size_t off = 0, na = SIZE_MAX;
	size_t bad = tok_utf8_valid_prefix_blocks(text, len, tok->re_new.code ? tok->new_block : NULL,
					      &m.maybe_new);
	int rc = 0;

	if (bad != len)
		return k3_err_set(err, -EILSEQ, "invalid UTF-8 at byte %zu", bad);
	tok_matcher_pick(&m, tok, text, len);
	while (off < len) {
		size_t a, b;
		rc = fast ? tok_find_piece(&m, text, len, off, &na, &a, &b)
			  : next_piece(&m, text, len, off, &a, &b);
		if (rc <= 0)
			break;
		if ((rc = fn(ud, a, b - a)))
			break;
		off = b;
	}
	tok_matcher_release(&m);
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

/*
 * test_tok_ucd.c - the pre-tokenizer's Unicode version is the release's
 * (UCD 16.0.0, tiktoken's regex tables), not the system PCRE2's (14.0.0 in
 * Debian 12's 10.42), which sees every letter and digit assigned since as
 * unassigned (issue 16, item 4).
 *
 *  - every code point assigned in Unicode 15.0, 15.1 and 16.0, in eleven
 *    contexts, splits as the release splits it (ucd_golden.h, made with
 *    tiktoken by gen_ucd_golden.py): through the tokenizer (fast path and
 *    PCRE2 path) and through the explicit-range pattern it falls back to;
 *  - each class of text_ucd.h in PCRE2's tables plus k3_ucd_new[] equals
 *    its explicit ranges on every Unicode scalar value, and in PCRE2's
 *    tables alone differs only on k3_ucd_new[] (which the tokenizer looks
 *    for), under the PCRE2 this test runs with, whenever the tokenizer
 *    uses them;
 *  - the tokenizer and the explicit pattern give the same pieces on
 *    random mixed text, with and without such code points.
 *
 * Needs no vocabulary: pieces depend on the regex only.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "text_golden.h"
#include "text/text_ucd.h"
#include "ucd_golden.h"

static struct k3_tok *g_tok;

static size_t utf8_put(char *out, uint32_t c)
{
	if (c < 0x80) {
		out[0] = (char)c;
		return 1;
	}
	if (c < 0x800) {
		out[0] = (char)(0xC0 | c >> 6);
		out[1] = (char)(0x80 | (c & 0x3F));
		return 2;
	}
	if (c < 0x10000) {
		out[0] = (char)(0xE0 | c >> 12);
		out[1] = (char)(0x80 | (c >> 6 & 0x3F));
		out[2] = (char)(0x80 | (c & 0x3F));
		return 3;
	}
	out[0] = (char)(0xF0 | c >> 18);
	out[1] = (char)(0x80 | (c >> 12 & 0x3F));
	out[2] = (char)(0x80 | (c >> 6 & 0x3F));
	out[3] = (char)(0x80 | (c & 0x3F));
	return 4;
}

static pcre2_code *compile(const char *pattern)
{
	int ec;
	PCRE2_SIZE eo;
	pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
				       &ec, &eo, NULL);

	if (!T_OK(re != NULL)) {
		PCRE2_UCHAR msg[256];
		pcre2_get_error_message(ec, msg, sizeof(msg));
		printf("     cannot compile: %s at %zu\n", (char *)msg, (size_t)eo);
		return NULL;
	}
	pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
	return re;
}

/* Piece ends of s as a bit mask over characters (bit i: a piece ends
 * after character i; the last end is left out, as in ucd_golden.h). */
struct mask_ctx { const char *s; uint32_t mask; };

static unsigned chars_before(const char *s, size_t off)
{
	unsigned n = 0;

	for (size_t i = 0; i < off; i++)
		n += ((unsigned char)s[i] & 0xC0) != 0x80;
	return n;
}

static int mask_cb(void *ud, size_t off, size_t len)
{
	struct mask_ctx *m = ud;
	unsigned end = chars_before(m->s, off + len);

	if (m->s[off + len])
		m->mask |= 1u << (end - 1);
	return 0;
}

/* The same over a locally compiled pattern (the explicit one). */
static uint32_t mask_re(pcre2_code *re, pcre2_match_data *md, const char *s, size_t n)
{
	struct mask_ctx m = { s, 0 };
	size_t off = 0;

	while (off < n && pcre2_match(re, (PCRE2_SPTR)s, n, off, 0, md, NULL) > 0) {
		PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
		mask_cb(&m, ov[0], ov[1] - ov[0]);
		off = ov[1];
	}
	return m.mask;
}

static size_t context_text(char *buf, unsigned k, uint32_t c)
{
	const struct ucd_context *x = &ucd_contexts[k];
	size_t n = strlen(x->before);

	memcpy(buf, x->before, n);
	for (unsigned i = 0; i < x->copies; i++)
		n += utf8_put(buf + n, c);
	memcpy(buf + n, x->after, strlen(x->after) + 1);
	return n + strlen(x->after);
}

/* Every code point of Unicode 15.0-16.0 in every context: release pieces. */
static void test_golden(void)
{
	pcre2_code *exact = compile(k3_tok_pattern(K3_TOK_REGEX_EXPLICIT));
	pcre2_match_data *md = pcre2_match_data_create(2, NULL);
	unsigned n_cp = 0, bad_cp = 0, bad_exact = 0;

	if (!exact)
		return;
	for (size_t r = 0; r < sizeof(ucd_golden) / sizeof(ucd_golden[0]); r++) {
		for (uint32_t c = ucd_golden[r].first; c <= ucd_golden[r].last; c++) {
			bool ok = true, ok_exact = true;

			for (unsigned k = 0; k < UCD_N_CONTEXTS; k++) {
				char s[64];
				size_t n = context_text(s, k, c);
				struct mask_ctx fast = { s, 0 }, ref = { s, 0 };
				uint32_t want = ucd_golden[r].mask[k];

				T_EQ_INT(k3_tok_split_pieces(g_tok, s, n, mask_cb, &fast, NULL), 0);
				T_EQ_INT(k3_tok_split_pieces_ref(g_tok, s, n, mask_cb, &ref, NULL), 0);
				ok &= fast.mask == want && ref.mask == want;
				ok_exact &= mask_re(exact, md, s, n) == want;
				if (fast.mask != want && bad_cp < 5)
					printf("     U+%04X in context %u: pieces mask %u, the release's %u\n",
					       (unsigned)c, k, (unsigned)fast.mask, (unsigned)want);
			}
			n_cp++;
			bad_cp += !ok;
			bad_exact += !ok_exact;
		}
	}
	printf("# %u code points of Unicode 15.0-16.0 checked, %u split unlike the release "
	       "(%u through the explicit pattern)\n", n_cp, bad_cp, bad_exact);
	T_EQ_INT(n_cp, UCD_N_CODE_POINTS);
	T_EQ_INT(bad_cp, 0);
	T_EQ_INT(bad_exact, 0);
	pcre2_match_data_free(md);
	pcre2_code_free(exact);
}

/* The example: a space, then U+1D2C2 KAKTOVIK NUMERAL TWO (Nd,
 * Unicode 15.0) is two pieces, the space and the digit. */
static void test_kaktovik(void)
{
	struct mask_ctx m = { " \xf0\x9d\x8b\x82", 0 };

	T_EQ_INT(k3_tok_split_pieces(g_tok, m.s, 5, mask_cb, &m, NULL), 0);
	T_EQ_INT(m.mask, 1);
}

/* Decodes the valid UTF-8 character at s. */
static uint32_t utf8_get(const char *s, size_t *len)
{
	const uint8_t *u = (const uint8_t *)s;

	if (u[0] < 0x80) {
		*len = 1;
		return u[0];
	}
	if (u[0] < 0xE0) {
		*len = 2;
		return (uint32_t)(u[0] & 0x1F) << 6 | (u[1] & 0x3F);
	}
	if (u[0] < 0xF0) {
		*len = 3;
		return (uint32_t)(u[0] & 0x0F) << 12 | (uint32_t)(u[1] & 0x3F) << 6 | (u[2] & 0x3F);
	}
	*len = 4;
	return (uint32_t)(u[0] & 0x07) << 18 | (uint32_t)(u[1] & 0x3F) << 12 | (uint32_t)(u[2] & 0x3F) << 6 |
	       (u[3] & 0x3F);
}

static bool in_new(uint32_t c)
{
	for (size_t i = 0; i < sizeof(k3_ucd_new) / sizeof(k3_ucd_new[0]); i++)
		if (c >= k3_ucd_new[i][0] && c <= k3_ucd_new[i][1])
			return true;
	return false;
}

/* Sets bit c of bits for every scalar value in the class expr, matched
 * over all (every scalar value in order) in windows of 4 KiB: a group
 * repeated over a 40,000-character run would need a huge JIT stack.
 * Returns the number of members, or -1 on a matching error. */
static long class_members(const char *expr, const char *all, size_t n, pcre2_match_context *mc,
			  uint8_t *bits)
{
	char pattern[64 * 1024];
	pcre2_code *re;
	pcre2_match_data *md = pcre2_match_data_create(2, NULL);
	long members = 0;

	snprintf(pattern, sizeof(pattern), "(?:%s)+", expr);
	re = compile(pattern);
	memset(bits, 0, 0x110000 / 8);
	for (size_t w = 0; re && md && w < n && members >= 0;) {
		size_t end = w + 4096 < n ? w + 4096 : n, off = w;

		while (end < n && ((unsigned char)all[end] & 0xC0) == 0x80)
			end++;
		for (;;) {
			int r = pcre2_match(re, (PCRE2_SPTR)all, end, off, 0, md, mc);
			size_t a, b, k;

			if (r == PCRE2_ERROR_NOMATCH)
				break;
			if (r < 0) {
				members = -1;
				break;
			}
			a = pcre2_get_ovector_pointer(md)[0];
			b = pcre2_get_ovector_pointer(md)[1];
			for (size_t i = a; i < b; i += k) {
				uint32_t c = utf8_get(all + i, &k);
				bits[c / 8] |= (uint8_t)(1u << c % 8);
				members++;
			}
			off = b;
		}
		w = end;
	}
	pcre2_match_data_free(md);
	pcre2_code_free(re);
	return re ? members : -1;
}

/* Every class in its three spellings over every scalar value, under the
 * PCRE2 this test runs with: _PCRE2_NEW equals the explicit ranges
 * everywhere, and _PCRE2 differs from them only on k3_ucd_new[] (so it is
 * exact for text without those). Only where the tokenizer uses them. */
static void test_classes(void)
{
	static const struct { const char *name, *exact, *pcre2, *pcre2_new; } cls[] = {
		{ "HAN", K3_UCD_HAN, K3_UCD_HAN_PCRE2, K3_UCD_HAN_PCRE2_NEW },
		{ "UPPER", K3_UCD_UPPER, K3_UCD_UPPER_PCRE2, K3_UCD_UPPER_PCRE2_NEW },
		{ "LOWER", K3_UCD_LOWER, K3_UCD_LOWER_PCRE2, K3_UCD_LOWER_PCRE2_NEW },
		{ "N", K3_UCD_N, K3_UCD_N_PCRE2, K3_UCD_N_PCRE2_NEW },
		{ "NOT_LN", K3_UCD_NOT_LN("\\r\\n"), K3_UCD_NOT_LN_PCRE2("\\r\\n"), K3_UCD_NOT_LN_PCRE2_NEW("\\r\\n") },
	};
	char version[32];
	bool needs_new;
	char *all = malloc(4 * 0x110000);
	uint8_t *be = malloc(0x110000 / 8), *bp = malloc(0x110000 / 8), *bn = malloc(0x110000 / 8);
	size_t n = 0;
	pcre2_match_context *mc = pcre2_match_context_create(NULL);
	pcre2_jit_stack *js = pcre2_jit_stack_create(64 << 10, 64 << 20, NULL);

	pcre2_config(PCRE2_CONFIG_UNICODE_VERSION, version);
	if (k3_tok_regex_for_pcre2(&needs_new) == K3_TOK_REGEX_EXPLICIT) {
		/* Only the explicit pattern is used; test_golden checks it. */
		printf("# PCRE2 has Unicode %s tables: only the explicit ranges are used\n", version);
		goto out;
	}
	if (!T_OK(all && be && bp && bn && mc && js))
		goto out;
	pcre2_jit_stack_assign(mc, NULL, js);
	for (uint32_t c = 0; c < 0x110000; c++)
		if (c < 0xD800 || c > 0xDFFF)
			n += utf8_put(all + n, c);
	for (size_t i = 0; i < sizeof(cls) / sizeof(cls[0]); i++) {
		long me = class_members(cls[i].exact, all, n, mc, be);
		long mp = class_members(cls[i].pcre2, all, n, mc, bp);
		long mn = class_members(cls[i].pcre2_new, all, n, mc, bn);
		unsigned differ_new = 0, differ_plain = 0, plain_outside = 0;

		T_OK(me >= 0 && mp >= 0 && mn >= 0);
		for (uint32_t c = 0; c < 0x110000; c++) {
			bool e = be[c / 8] >> c % 8 & 1;

			differ_new += e != (bn[c / 8] >> c % 8 & 1);
			if (e != (bp[c / 8] >> c % 8 & 1)) {
				differ_plain++;
				if (!in_new(c) && plain_outside++ < 3)
					printf("     %s: U+%04X differs with PCRE2's tables and is not in "
					       "k3_ucd_new\n", cls[i].name, (unsigned)c);
			}
		}
		printf("# %s: %ld code points; with PCRE2's Unicode %s tables: %u differ, all in "
		       "k3_ucd_new; with the additions: %u differ\n", cls[i].name, me, version,
		       differ_plain, differ_new);
		T_EQ_INT(differ_new, 0);
		T_EQ_INT(plain_outside, 0);
	}
out:
	pcre2_match_context_free(mc);
	pcre2_jit_stack_free(js);
	free(all);
	free(be);
	free(bp);
	free(bn);
}

/* The tokenizer against the explicit pattern on random text, with and
 * without code points of k3_ucd_new[] (which switch its regex), old and
 * new letters, marks, digits, Han of old and new extensions, spaces and
 * punctuation. */
static void test_tokenizer_vs_explicit(void)
{
	static const uint32_t pool[] = {
		'a', 'Z', ' ', ' ', '\n', '\'', 's', '1', '-', 0xA0, 0x3000, 0x85, 0x301, 0x4E00, 0x3042, 0xAC00,
		0x17F, 0x1C5, 0x2B0, 0x660, 0x2160, 0xFF01, 0x1F600, 0x20000, 0x436, 0x416,
		0x2EBF0, 0x31350, 0x2B739, 0x1D2C2, 0x105C0, 0x16D40, 0x1C89, 0x1C8A, 0xA7CB, 0x0897, 0x10D4A,
		0x11F50, 0x1E5F1, 0x1CCF0, 0x16D70, 0x1B4E, 0x11B00,
	};
	const size_t n_old = 26;   /* pool[0..n_old) are all assigned by Unicode 14.0 */
	pcre2_code *ee = compile(k3_tok_pattern(K3_TOK_REGEX_EXPLICIT));
	pcre2_match_data *md = pcre2_match_data_create(2, NULL);
	uint64_t x = 0x9E3779B97F4A7C15ull;
	int diffs = 0;

	for (int round = 0; ee && round < 20000; round++) {
		char s[256];
		size_t n = 0, want, from = round % 2 ? sizeof(pool) / sizeof(pool[0]) : n_old;
		struct mask_ctx m = { s, 0 };

		x ^= x << 13; x ^= x >> 7; x ^= x << 17;
		want = 1 + x % 24;
		for (size_t i = 0; i < want; i++) {
			x ^= x << 13; x ^= x >> 7; x ^= x << 17;
			n += utf8_put(s + n, pool[x % from]);
		}
		s[n] = '\0';
		T_EQ_INT(k3_tok_split_pieces(g_tok, s, n, mask_cb, &m, NULL), 0);
		if (m.mask != mask_re(ee, md, s, n) && diffs++ < 3)
			printf("     the tokenizer and the explicit pattern differ on '%s'\n", s);
	}
	T_EQ_INT(diffs, 0);
	pcre2_match_data_free(md);
	pcre2_code_free(ee);
}

int main(void)
{
	static const char *const none[] = { NULL };
	static void (*const tests[])(void) = { test_kaktovik, test_golden, test_classes,
					       test_tokenizer_vs_explicit, NULL };

	return tg_main(&g_tok, tg_synth(none, 0, NULL, NULL), NULL, tests);
}

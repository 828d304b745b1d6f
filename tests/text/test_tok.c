/*
 * test_tok.c - tokenizer checks that need no real vocabulary: the regex
 * pieces of every golden line that has them, BPE on a synthetic vocabulary
 * against a naive reference, special matching on/off, the 25,000-run and
 * Python isspace() chunking rules, decoding, loader validation.
 */
#include <errno.h>

#include "text_golden.h"

static struct k3_tok *g_tok;

struct pieces_ctx { const char *text; json_t *want; size_t i; int bad; };

static int piece_cb(void *ud, size_t off, size_t len)
{
	struct pieces_ctx *c = ud;
	json_t *w = json_array_get(c->want, c->i++);
	if (!w || json_string_length(w) != len || memcmp(json_string_value(w), c->text + off, len) != 0)
		c->bad = 1;
	return 0;
}

static int n_piece_lines;

static void check_pieces(json_t *line, void *ud)
{
	json_t *want = json_object_get(line, "pieces"), *text = json_object_get(line, "text");
	struct pieces_ctx c;
	(void)ud;
	if (!want || !text)
		return;
	c = (struct pieces_ctx){ json_string_value(text), want, 0, 0 };
	T_EQ_INT(k3_tok_split_pieces(g_tok, c.text, json_string_length(text), piece_cb, &c, NULL), 0);
	if (!T_OK(!c.bad && c.i == json_array_size(want)))
		printf("     pieces differ for %s\n", json_string_value(json_object_get(line, "id")));
	n_piece_lines++;
}

/* Vocabulary-free id check on every golden line with ids: the special
 * ids (offsets from the first special id) come out in the same order, for
 * either allow_special, and ordinary text never yields one. The synthetic
 * vocabulary names the K3 specials at their release offsets. */
static int n_special_lines;

static void check_special_ids(json_t *line, void *ud)
{
	json_t *text = json_object_get(line, "text"), *want = json_object_get(line, "ids");
	struct k3_tok_ids ids = { 0 };
	uint32_t base = k3_tok_n_ranks(g_tok);
	size_t k = 0;
	bool same = true;
	(void)ud;
	/* reserved names spell the absolute id, which only the real base has */
	if (!text || !want || strstr(json_string_value(text), "<|reserved_token_"))
		return;
	T_EQ_INT(k3_tok_encode(g_tok, json_string_value(text), json_string_length(text),
			       json_is_true(json_object_get(line, "allow_special")), &ids, NULL), 0);
	for (size_t i = 0; i < json_array_size(want) && same; i++) {
		json_int_t v = json_integer_value(json_array_get(want, i));
		if (v < 163584)
			continue;
		while (k < ids.n && ids.v[k] < base)
			k++;
		same = k < ids.n && ids.v[k] - base == (uint32_t)(v - 163584);
		k++;
	}
	while (same && k < ids.n && ids.v[k] < base)
		k++;
	if (!T_OK(same && k >= ids.n))
		printf("     special ids differ for %s\n", json_string_value(json_object_get(line, "id")));
	n_special_lines++;
	k3_tok_ids_release(&ids);
}

/* decode(encode(x)) == x for every golden text, specials on and off. */
static void check_roundtrip(json_t *line, void *ud)
{
	json_t *text = json_object_get(line, "text");
	(void)ud;
	if (!text)
		return;
	for (int sp = 0; sp < 2; sp++) {
		struct k3_tok_ids ids = { 0 };
		char *out = NULL;
		size_t n = 0;
		T_EQ_INT(k3_tok_encode(g_tok, json_string_value(text), json_string_length(text), sp, &ids, NULL), 0);
		T_EQ_INT(k3_tok_decode(g_tok, ids.v, ids.n, &out, &n, NULL), 0);
		T_OK(out && n == json_string_length(text) && memcmp(out, json_string_value(text), n) == 0);
		free(out);
		k3_tok_ids_release(&ids);
	}
}

/* Naive tiktoken merge loop (list of parts, rescan every round). */
static size_t ref_bpe(const struct k3_tok *tok, const char *s, size_t n, uint32_t *out)
{
	size_t *b = malloc((n + 1) * sizeof(size_t)), nb = n + 1, k = 0;
	for (size_t i = 0; i <= n; i++)
		b[i] = i;
	for (;;) {
		int64_t best = -1;
		size_t bi = 0;
		for (size_t i = 0; i + 2 < nb; i++) {
			struct k3_tok_ids one = { 0 };
			const uint8_t *x;
			size_t xl;
			/* rank of the concatenation, via encode of a 1-part piece */
			k3_tok_bpe(tok, (const uint8_t *)s + b[i], b[i + 2] - b[i], &one);
			if (one.n == 1 && k3_tok_id_bytes(tok, one.v[0], &x, &xl) == 0 && xl == b[i + 2] - b[i] &&
			    (best < 0 || one.v[0] < (uint32_t)best)) {
				best = one.v[0];
				bi = i;
			}
			k3_tok_ids_release(&one);
		}
		if (best < 0)
			break;
		memmove(b + bi + 1, b + bi + 2, (nb - bi - 2) * sizeof(size_t));
		nb--;
	}
	for (size_t i = 0; i + 1 < nb; i++) {
		struct k3_tok_ids one = { 0 };
		k3_tok_bpe(tok, (const uint8_t *)s + b[i], b[i + 1] - b[i], &one);
		out[k++] = one.n == 1 ? one.v[0] : UINT32_MAX;
		k3_tok_ids_release(&one);
	}
	free(b);
	return k;
}

static uint64_t rng_s = 12345;
static uint32_t rnd(uint32_t n)
{
	rng_s = rng_s * 6364136223846793005ull + 1442695040888963407ull;
	return (uint32_t)(rng_s >> 33) % n;
}

static void test_bpe_random(void)
{
	/* random merges over {a,b,c}: incomplete chains are fine, BPE only
	 * asks for ranks of concatenations */
	char *extra[300], buf[8];
	size_t ne = 0;
	for (int i = 0; i < 300; i++) {
		int l = 2 + (int)rnd(5);
		for (int k = 0; k < l; k++)
			buf[k] = (char)('a' + rnd(3));
		buf[l] = 0;
		int dup = 0;
		for (size_t j = 0; j < ne; j++)
			dup |= strcmp(extra[j], buf) == 0;
		if (!dup)
			extra[ne++] = strdup(buf);
	}
	struct k3_tok *tok = tg_synth(NULL, ne, (const char *const *)extra, NULL);
	T_OK(tok != NULL);
	for (int round = 0; tok && round < 60; round++) {
		size_t n = 1 + rnd(round < 30 ? 40 : 400);   /* both merge paths */
		char s[401];
		uint32_t want[401];
		struct k3_tok_ids got = { 0 };
		for (size_t k = 0; k < n; k++)
			s[k] = (char)('a' + rnd(3));
		size_t wn = ref_bpe(tok, s, n, want);
		T_EQ_INT(k3_tok_bpe(tok, (const uint8_t *)s, n, &got), 0);
		T_OK(got.n == wn && memcmp(got.v, want, wn * sizeof(uint32_t)) == 0);
		k3_tok_ids_release(&got);
	}
	for (size_t j = 0; j < ne; j++)
		free(extra[j]);
	k3_tok_free(tok);
}

static void expect_ids(struct k3_tok *tok, const char *s, size_t len, bool sp, const uint32_t *want, size_t n)
{
	struct k3_tok_ids ids = { 0 };
	T_EQ_INT(k3_tok_encode(tok, s, len, sp, &ids, NULL), 0);
	if (!T_OK(ids.n == n && memcmp(ids.v, want, n * sizeof(uint32_t)) == 0)) {
		printf("     got");
		for (size_t i = 0; i < ids.n && i < 20; i++)
			printf(" %u", ids.v[i]);
		printf(" (n=%zu)\n", ids.n);
	}
	k3_tok_ids_release(&ids);
}

static void test_synthetic(void)
{
	static const char *const merges[] = { "ll", "he", "hell", "hello", "ab", "\x1c\x1c", "\x1c" "ab", NULL };
	size_t nr;
	struct k3_tok *tok = tg_synth(merges, 0, NULL, &nr);
	uint32_t O = (uint32_t)nr;   /* first special id */

	if (!T_OK(tok != NULL))
		return;
	T_EQ_INT(k3_tok_n_ranks(tok), 263);
	T_EQ_INT(k3_tok_n_vocab(tok), 263 + 256);
	T_EQ_INT(k3_tok_special(tok, K3_TOK_SP_OPEN), O + 3);
	T_EQ_INT(k3_tok_special_by_name(tok, "<|end_of_msg|>"), O + 2);
	T_EQ_INT(k3_tok_special_by_name(tok, "<|reserved_token_271|>"), 271);
	T_EQ_INT(k3_tok_special_by_name(tok, "<|open"), -ENOENT);

	/* whole piece has a rank; merges by lowest rank, leftmost */
	expect_ids(tok, "hello", 5, false, (uint32_t[]){ 259 }, 1);
	expect_ids(tok, "helll", 5, false, (uint32_t[]){ 258, 'l' }, 2);
	expect_ids(tok, "hellhe", 6, false, (uint32_t[]){ 258, 257 }, 2);
	/* specials: on → ids, longest match; off → plain bytes */
	expect_ids(tok, "a<|open|>b", 10, true, (uint32_t[]){ 'a', O + 3, 'b' }, 3);
	expect_ids(tok, "<|open|>", 8, false, (uint32_t[]){ '<', '|', 'o', 'p', 'e', 'n', '|', '>' }, 8);
	expect_ids(tok, "[BOS]x<|reserved_token_300|>", 28, true, (uint32_t[]){ O, 'x', 300 }, 3);
	/* a space before a special is its own piece (§1.7) */
	expect_ids(tok, "he <|sep|>", 10, true, (uint32_t[]){ 257, ' ', O + 5 }, 3);
	/* NUL and controls are ordinary bytes */
	expect_ids(tok, "a\0b", 3, false, (uint32_t[]){ 'a', 0, 'b' }, 3);

	/* 25,000-run cut: "b" + "ab"*12500 is one non-space run of 25,001
	 * characters, cut before the last "b" (§1.5). Unchunked it would be
	 * b,ab*12500 (12,501 ids); chunked it is b,ab*12499,a,b. */
	{
		size_t n = 1 + 2 * 12500;
		char *s = malloc(n);
		uint32_t *want = malloc(12502 * sizeof(uint32_t));
		struct k3_tok_ids ids = { 0 };
		s[0] = 'b';
		for (size_t i = 0; i < 12500; i++)
			memcpy(s + 1 + 2 * i, "ab", 2);
		want[0] = 'b';
		for (size_t i = 0; i < 12499; i++)
			want[1 + i] = 260;
		want[12500] = 'a';
		want[12501] = 'b';
		T_EQ_INT(k3_tok_encode(tok, s, n, false, &ids, NULL), 0);
		T_OK(ids.n == 12502 && memcmp(ids.v, want, 12502 * 4) == 0);
		/* exactly 25,000 is not cut */
		ids.n = 0;
		T_EQ_INT(k3_tok_encode(tok, s, n - 1, false, &ids, NULL), 0);
		T_OK(ids.n == 12501 && ids.v[12499] == 260 && ids.v[12500] == 'a');
		k3_tok_ids_release(&ids);
		free(s);
		free(want);
	}
	/* Python isspace() counts U+001C as space (regex \s does not): in
	 * "ab" + U+001C*24999 + "ab" no run exceeds 25,000, so the pieces are
	 * ab | 1c*24999 | ab. Treating 1c as non-space would cut at 25,001 and
	 * give the piece "\x1cab" (one rank) at the end. */
	{
		size_t n = 2 + 24999 + 2;
		char *s = malloc(n);
		struct k3_tok_ids ids = { 0 };
		memcpy(s, "ab", 2);
		memset(s + 2, 0x1c, 24999);
		memcpy(s + 2 + 24999, "ab", 2);
		T_EQ_INT(k3_tok_encode(tok, s, n, false, &ids, NULL), 0);
		T_EQ_INT(ids.n, 1 + 12499 + 1 + 1);
		T_OK(ids.n == 12502 && ids.v[12499] == 261 && ids.v[12500] == 0x1c && ids.v[12501] == 260);
		k3_tok_ids_release(&ids);
		free(s);
	}
	/* 400,000-code-point chunks: "ab"*200001 = 400,002 chars; the run
	 * cut comes first (every 25,000 chars), and the chunk boundary
	 * restarts the run count. Check the total against slices encoded by
	 * hand: 16 slices of 25,000 chars then "ab". */
	{
		size_t n = 2 * 200001;
		char *s = malloc(n);
		struct k3_tok_ids ids = { 0 }, parts = { 0 };
		for (size_t i = 0; i < n; i += 2)
			memcpy(s + i, "ab", 2);
		T_EQ_INT(k3_tok_encode(tok, s, n, false, &ids, NULL), 0);
		for (size_t off = 0; off < n; off += 25000)
			k3_tok_encode(tok, s + off, n - off < 25000 ? n - off : 25000, false, &parts, NULL);
		T_OK(ids.n == parts.n && memcmp(ids.v, parts.v, ids.n * 4) == 0);
		k3_tok_ids_release(&ids);
		k3_tok_ids_release(&parts);
		free(s);
	}
	/* long non-ASCII word runs go through PCRE2 and need its JIT stack to
	 * grow: Cyrillic upper-case run then one lower-case letter, 30,001
	 * chars, no merges → one id per byte */
	{
		size_t n = 2 * 30001;
		char *s = malloc(n);
		struct k3_tok_ids ids = { 0 };
		for (size_t i = 0; i + 2 < n; i += 2)
			memcpy(s + i, "\xd0\x91", 2);
		memcpy(s + n - 2, "\xd0\xb1", 2);
		T_EQ_INT(k3_tok_encode(tok, s, n, false, &ids, NULL), 0);
		T_EQ_INT(ids.n, n);
		k3_tok_ids_release(&ids);
		free(s);
	}
	/* decode: specials decode to their names */
	{
		uint32_t ids[] = { 257, O + 2, 300, 'x' };
		char *out;
		size_t n;
		T_EQ_INT(k3_tok_decode(tok, ids, 4, &out, &n, NULL), 0);
		T_EQ_STR(out, "he<|end_of_msg|><|reserved_token_300|>x");
		free(out);
		uint32_t bad = O + 256;
		T_EQ_INT(k3_tok_decode(tok, &bad, 1, &out, &n, NULL), -ERANGE);
	}
	/* invalid UTF-8 is refused, with the offset */
	{
		struct k3_tok_ids ids = { 0 };
		struct k3_err err = { 0 };
		T_EQ_INT(k3_tok_encode(tok, "ok\xc3(", 4, false, &ids, &err), -EILSEQ);
		T_OK(strstr(err.msg, "byte 2") != NULL);
		T_EQ_INT(k3_tok_encode(tok, "\xed\xa0\x80", 3, false, &ids, NULL), -EILSEQ); /* surrogate */
		T_EQ_INT(k3_tok_encode(tok, "\xc0\xaf", 2, false, &ids, NULL), -EILSEQ);     /* overlong */
		T_EQ_INT(ids.n, 0);
	}
	k3_tok_free(tok);
}

struct plist { size_t n; size_t v[256][2]; };

static int plist_cb(void *ud, size_t off, size_t len)
{
	struct plist *p = ud;
	if (p->n < 256) {
		p->v[p->n][0] = off;
		p->v[p->n][1] = len;
	}
	p->n++;
	return 0;
}

/* The ASCII fast path gives PCRE2's pieces: random mostly-ASCII strings
 * (every ASCII byte, heavy on letters/space/quotes/digits) with the
 * non-ASCII characters that could change an ASCII decision sprinkled in:
 * 'ſ folds to 's, NBSP/U+0085/U+2028/U+3000 are \s, é/ß/𝐀/ǅ are letters
 * (ǅ is Lt), U+0301 is a mark, ٣ and Ⅻ are numbers, 東 is Han, ¡ and 😀
 * are punctuation/symbols. */
static void test_fast_path(void)
{
	static const char *const na[] = { "\xc5\xbf", "\xc2\xa0", "\xc2\x85", "\xe2\x80\xa8", "\xe3\x80\x80",
		"\xc3\xa9", "\xc3\x9f", "\xf0\x9d\x90\x80", "\xc7\x85", "\xcc\x81", "\xd9\xa3", "\xe2\x85\xab",
		"\xe6\x9d\xb1", "\xc2\xa1", "\xf0\x9f\x98\x80" };
	static const char common[] = "aAzZ  'sStTlLdDmMrReEvV0123456789\n\r\t(.,!";
	int diffs = 0;

	for (int round = 0; round < 4000; round++) {
		char s[256];
		size_t n = 0, want = 1 + rnd(40);
		struct plist a, b;
		while (n < want && n < 200) {
			uint32_t r = rnd(100);
			if (r < 10) {
				const char *x = na[rnd(sizeof(na) / sizeof(na[0]))];
				memcpy(s + n, x, strlen(x));
				n += strlen(x);
			} else if (r < 25) {
				s[n++] = (char)rnd(128);
			} else {
				s[n++] = common[rnd(sizeof(common) - 1)];
			}
		}
		a.n = b.n = 0;
		T_EQ_INT(k3_tok_split_pieces(g_tok, s, n, plist_cb, &a, NULL), 0);
		T_EQ_INT(k3_tok_split_pieces_ref(g_tok, s, n, plist_cb, &b, NULL), 0);
		if (a.n != b.n || memcmp(a.v, b.v, (a.n < 256 ? a.n : 256) * sizeof(a.v[0])) != 0) {
			if (diffs++ < 3) {
				printf("     fast path differs on:");
				for (size_t i = 0; i < n; i++)
					printf(" %02x", (unsigned char)s[i]);
				printf("\n");
			}
		}
	}
	T_EQ_INT(diffs, 0);
}

static void test_loader_errors(void)
{
	struct k3_tok *tok = NULL;
	struct k3_err err = { 0 };
	char buf[8192];
	size_t n = 0;

	for (int b = 0; b < 256; b++) {
		unsigned char c = (unsigned char)b;
		char b64[8];
		tg_b64(&c, 1, b64);
		n += (size_t)snprintf(buf + n, sizeof(buf) - n, "%s %d\n", b64, b);
	}
	T_EQ_INT(k3_tok_load_buffers(buf, n, NULL, 0, &tok, &err), 0);
	T_EQ_INT(k3_tok_special_by_name(tok, "<|reserved_token_256|>"), 256);
	k3_tok_free(tok);
	/* duplicate rank */
	size_t m = n + (size_t)snprintf(buf + n, sizeof(buf) - n, "YWI= 5\n");
	T_EQ_INT(k3_tok_load_buffers(buf, m, NULL, 0, &tok, &err), -EINVAL);
	T_OK(strstr(err.msg, "line 257") != NULL);
	/* gap: rank 257 without 256 */
	m = n + (size_t)snprintf(buf + n, sizeof(buf) - n, "YWI= 257\n");
	T_EQ_INT(k3_tok_load_buffers(buf, m, NULL, 0, &tok, &err), -EINVAL);
	/* duplicate bytes */
	m = n + (size_t)snprintf(buf + n, sizeof(buf) - n, "YQ== 256\n");
	T_EQ_INT(k3_tok_load_buffers(buf, m, NULL, 0, &tok, &err), -EINVAL);
	T_OK(strstr(err.msg, "same bytes") != NULL);
	/* bad base64 */
	m = n + (size_t)snprintf(buf + n, sizeof(buf) - n, "Y!== 256\n");
	T_EQ_INT(k3_tok_load_buffers(buf, m, NULL, 0, &tok, &err), -EINVAL);
	/* missing byte */
	T_EQ_INT(k3_tok_load_buffers(buf + 9, n - 9, NULL, 0, &tok, &err), -EINVAL);
	/* config: duplicate names, non-numeric key */
	T_EQ_INT(k3_tok_load_buffers(buf, n, "{\"added_tokens_decoder\":{\"256\":{\"content\":\"x\"},\"257\":{\"content\":\"x\"}}}",
				     70, &tok, &err), -EINVAL);
	const char *c2 = "{\"added_tokens_decoder\":{\"abc\":{\"content\":\"x\"}}}";
	T_EQ_INT(k3_tok_load_buffers(buf, n, c2, strlen(c2), &tok, &err), -EINVAL);
	/* a file claiming the release's rank count must match its SHA-256 */
	{
		size_t cap = (size_t)K3_TOK_REAL_RANKS * 16, len = 0;
		char *big = malloc(cap);
		for (uint32_t r = 0; r < K3_TOK_REAL_RANKS; r++) {
			unsigned char bytes[4] = { (unsigned char)r, (unsigned char)(r >> 8), (unsigned char)(r >> 16), 0xff };
			char b64[16];
			tg_b64(bytes, r < 256 ? 1 : 4, b64);
			len += (size_t)snprintf(big + len, cap - len, "%s %u\n", b64, r);
		}
		T_EQ_INT(k3_tok_load_buffers(big, len, NULL, 0, &tok, &err), -EBADMSG);
		T_OK(strstr(err.msg, "SHA-256") != NULL);
		free(big);
	}
}

/* Every golden piece list, round trip and special-id case. */
static void test_golden(void)
{
	T_EQ_INT(tg_each_line("golden/text/tokenizer.jsonl", check_pieces, NULL), 152);
	T_EQ_INT(n_piece_lines, 76);
	tg_each_line("golden/text/tokenizer.jsonl", check_roundtrip, NULL);
	tg_each_line("golden/text/tokenizer.jsonl", check_special_ids, NULL);
	T_EQ_INT(n_special_lines, 135);
}

int main(void)
{
	static const char *const none[] = { NULL };
	static void (*const tests[])(void) = { test_golden, test_bpe_random, test_fast_path, test_synthetic,
					       test_loader_errors, NULL };

	return tg_main(&g_tok, tg_synth(none, 0, NULL, NULL), NULL, tests);
}

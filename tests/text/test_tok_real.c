/*
 * test_tok_real.c - every id-bearing line of golden/text/tokenizer.jsonl
 * against the real release rank file (SKIP when it is absent): text → ids
 * with special matching on/off, the special table, the long-input digests
 * (SHA-256 of the compact JSON id list), and decode(ids) == text.
 */
#include "text_golden.h"

static struct k3_tok *g_tok;
static int n_id_lines, n_long;

static void sha_hex(const char *s, size_t n, char out[65])
{
	unsigned char md[32];
	unsigned int ml;
	EVP_Digest(s, n, md, &ml, EVP_sha256(), NULL);
	for (int i = 0; i < 32; i++)
		snprintf(out + 2 * i, 3, "%02x", md[i]);
}

static void check_line(json_t *line, void *ud)
{
	json_t *jt = json_object_get(line, "text"), *jids = json_object_get(line, "ids");
	json_t *spec = json_object_get(line, "text_spec");
	const char *id = json_string_value(json_object_get(line, "id"));
	bool sp = json_is_true(json_object_get(line, "allow_special"));
	struct k3_tok_ids ids = { 0 };
	char *text = NULL, *dec = NULL;
	size_t len = 0, dn = 0;
	(void)ud;

	if (spec) {
		const char *rep = json_string_value(json_object_get(spec, "repeat"));
		const char *suf = json_string_value(json_object_get(spec, "suffix"));
		size_t times = (size_t)json_integer_value(json_object_get(spec, "times"));
		size_t rl = strlen(rep), sl = strlen(suf);
		text = malloc(rl * times + sl + 1);
		for (size_t i = 0; i < times; i++)
			memcpy(text + i * rl, rep, rl);
		memcpy(text + rl * times, suf, sl);
		len = rl * times + sl;
		sp = true;
	} else if (jt && jids) {
		len = json_string_length(jt);
		text = malloc(len + 1);
		memcpy(text, json_string_value(jt), len);
	} else {
		return;
	}
	T_EQ_INT(k3_tok_encode(g_tok, text, len, sp, &ids, NULL), 0);
	if (spec) {
		size_t cap = ids.n * 8 + 3, w = 0;
		char *js = malloc(cap), hex[65];
		js[w++] = '[';
		for (size_t i = 0; i < ids.n; i++)
			w += (size_t)snprintf(js + w, cap - w, i ? ",%u" : "%u", ids.v[i]);
		js[w++] = ']';
		sha_hex(js, w, hex);
		T_EQ_INT(ids.n, json_integer_value(json_object_get(line, "n_ids")));
		if (!T_OK(strcmp(hex, json_string_value(json_object_get(line, "ids_sha256"))) == 0))
			printf("     digest differs for %s\n", id);
		free(js);
		n_long++;
	} else {
		bool same = ids.n == json_array_size(jids);
		for (size_t i = 0; same && i < ids.n; i++)
			same = ids.v[i] == (uint32_t)json_integer_value(json_array_get(jids, i));
		if (!T_OK(same))
			printf("     ids differ for %s (got %zu ids, want %zu)\n", id, ids.n, json_array_size(jids));
		n_id_lines++;
	}
	T_EQ_INT(k3_tok_decode(g_tok, ids.v, ids.n, &dec, &dn, NULL), 0);
	T_OK(dn == len && memcmp(dec, text, len) == 0);
	free(dec);
	free(text);
	k3_tok_ids_release(&ids);
}

/* Issue 16, item 4: a space, then U+1D2C2 KAKTOVIK NUMERAL TWO (Nd since
 * Unicode 15.0). The release (tiktoken, Unicode 16 tables) splits the space
 * from the digit; a tokenizer with Unicode 14 tables sees an unassigned
 * character and keeps the space with it: [18460, 233, 224]. */
static void check_post_unicode14(void)
{
	static const uint32_t want[] = { 220, 11889, 233, 224 };
	struct k3_tok_ids ids = { 0 };

	T_EQ_INT(k3_tok_encode(g_tok, " \xf0\x9d\x8b\x82", 5, false, &ids, NULL), 0);
	T_EQ_INT(ids.n, 4);
	for (size_t i = 0; i < ids.n && i < 4; i++)
		T_EQ_INT(ids.v[i], want[i]);
	k3_tok_ids_release(&ids);
}

/* The release's vocabulary, then every golden id case. */
static void test_golden(void)
{
	T_EQ_INT(k3_tok_n_vocab(g_tok), 163840);
	T_EQ_INT(k3_tok_special(g_tok, K3_TOK_SP_END_OF_MSG), 163586);
	tg_each_line("golden/text/tokenizer.jsonl", check_line, NULL);
	T_EQ_INT(n_id_lines, 137);
	T_EQ_INT(n_long, 4);
}

int main(void)
{
	static void (*const tests[])(void) = { test_golden, check_post_unicode14, NULL };
	const char *why = NULL;
	struct k3_tok *tok = tg_real(&why);

	return tg_main(&g_tok, tok, why, tests);
}

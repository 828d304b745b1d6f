/*
 * fuzz_tokenizer.c - any bytes into the text layer. The first byte picks a
 * mode; the rest is the input:
 *   0: text → encode (specials on and off), pieces, stream-decode.
 *      Properties: invalid UTF-8 is refused with -EILSEQ and nothing else;
 *      valid UTF-8 round-trips: decode(encode(x)) == x in both modes, the
 *      streaming detokenizer yields x with every delta whole UTF-8, and the
 *      regex pieces tile x exactly.
 *   1: JSON → chat render + segment-wise encode (no crash; every control id
 *      comes from an allow_special segment).
 *   2: bytes as little-endian 16-bit ids → output parser and detokenizer
 *      (no crash; deltas are whole UTF-8).
 * A small synthetic vocabulary (256 bytes, merges that cut UTF-8
 * characters, the K3 special names) stands in for the real one.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <openssl/evp.h>

#include "text/text_chat.h"
#include "text/text_detok.h"
#include "text/text_parse.h"
#include "text/text_tok.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "property failed: %s (line %d)\n", #c, __LINE__); abort(); } } while (0)

static struct k3_tok *tok;

static void setup(void)
{
	static const char *const merges[] = { "he", "ll", "hell", "hello", " w", "or", "ld", "\xf0\x9f", "\x91\x8b\xf0",
		"\xe6\x9d", "\xb1\xe4", "  ", "   ", "\n\n", "<|", "|>", "ab", "aa", "aaaa", NULL };
	static const char *const names[] = { "[BOS]", "[EOS]", "<|end_of_msg|>", "<|open|>", "<|close|>", "<|sep|>" };
	char *ranks = malloc(1 << 14), cfg[1024];
	size_t n = 0, r = 0, cl;
	unsigned char b64[64];

	for (int b = 0; b < 256; b++) {
		unsigned char c = (unsigned char)b;
		EVP_EncodeBlock(b64, &c, 1);
		n += (size_t)sprintf(ranks + n, "%s %zu\n", b64, r++);
	}
	for (int i = 0; merges[i]; i++) {
		EVP_EncodeBlock(b64, (const unsigned char *)merges[i], (int)strlen(merges[i]));
		n += (size_t)sprintf(ranks + n, "%s %zu\n", b64, r++);
	}
	cl = (size_t)sprintf(cfg, "{\"added_tokens_decoder\":{");
	for (size_t i = 0; i < 6; i++)
		cl += (size_t)sprintf(cfg + cl, "%s\"%zu\":{\"content\":\"%s\"}", i ? "," : "", r + i, names[i]);
	cl += (size_t)sprintf(cfg + cl, "}}");
	if (k3_tok_load_buffers(ranks, n, cfg, cl, &tok, NULL))
		abort();
	free(ranks);
}

struct tile { const char *s; size_t next; };

static int tile_cb(void *ud, size_t off, size_t len)
{
	struct tile *t = ud;
	CHECK(off == t->next && len > 0);
	t->next = off + len;
	return 0;
}

static void mode_text(const char *s, size_t n)
{
	bool valid = k3_tok_utf8_valid_prefix(s, n) == n;

	for (int sp = 0; sp < 2; sp++) {
		struct k3_tok_ids ids = { 0 };
		int rc = k3_tok_encode(tok, s, n, sp, &ids, NULL);
		char *dec = NULL;
		size_t dn = 0;

		if (!valid) {
			CHECK(rc == -EILSEQ && ids.n == 0);
			continue;
		}
		CHECK(rc == 0);
		CHECK(k3_tok_decode(tok, ids.v, ids.n, &dec, &dn, NULL) == 0);
		CHECK(dn == n && memcmp(dec, s, n) == 0);
		free(dec);
		if (sp == 0) {
			struct k3_detok *d;
			struct k3_sbuf all = { 0 };
			const char *t;
			size_t tl;
			CHECK(k3_detok_new(tok, NULL, NULL, 0, 0, &d, NULL) == 0);
			for (size_t i = 0; i < ids.n; i++) {
				CHECK(k3_detok_feed(d, ids.v[i], &t, &tl) == 0);
				CHECK(k3_tok_utf8_valid_prefix(t, tl) == tl);
				k3_sbuf_add(&all, t, tl);
			}
			CHECK(k3_detok_flush(d, &t, &tl) == 0);
			k3_sbuf_add(&all, t, tl);
			CHECK(all.n == n && (n == 0 || memcmp(all.p, s, n) == 0));
			k3_sbuf_release(&all);
			k3_detok_free(d);
		}
		k3_tok_ids_release(&ids);
	}
	if (valid) {
		struct tile t = { s, 0 };
		CHECK(k3_tok_split_pieces(tok, s, n, tile_cb, &t, NULL) == 0);
		CHECK(t.next == n);
	}
}

static void mode_chat(const char *s, size_t n)
{
	json_t *j = json_loadb(s, n, JSON_ALLOW_NUL | JSON_DECODE_ANY, NULL);
	struct k3_chat_opts o;
	struct k3_chat c = { 0 };

	if (!j)
		return;
	k3_chat_opts_init(&o);
	if (json_is_object(j)) {
		if (k3_chat_opts_from_json(j, &o, NULL) == 0 && k3_chat_render(json_object_get(j, "messages"), &o, &c, NULL) == 0) {
			struct k3_tok_ids ids = { 0 };
			size_t specials = 0, controls = 0;
			CHECK(k3_chat_encode(tok, &c, &ids, NULL) == 0);
			for (size_t i = 0; i < c.n_segs; i++)
				specials += c.segs[i].special;
			for (size_t i = 0; i < ids.n; i++)
				controls += k3_tok_is_special(tok, ids.v[i]);
			CHECK(controls == specials);
			k3_tok_ids_release(&ids);
			k3_chat_release(&c);
		}
	} else if (k3_chat_render(j, &o, &c, NULL) == 0) {
		k3_chat_release(&c);
	}
	json_decref(j);
}

static int on_ev(void *ud, const struct k3_parse_event *ev)
{
	(void)ud;
	if (ev->type == K3_PARSE_REASONING || ev->type == K3_PARSE_CONTENT)
		CHECK(k3_tok_utf8_valid_prefix(ev->text, ev->len) == ev->len);
	return 0;
}

static void mode_ids(const uint8_t *s, size_t n)
{
	struct k3_parse_opts o;
	struct k3_parse *p;
	struct k3_detok *d;
	const char *stops[] = { "ab", "<|x" };
	size_t lens[] = { 2, 3 };
	uint32_t nv = k3_tok_n_vocab(tok);

	k3_parse_opts_init(&o);
	o.thinking = n & 1;
	CHECK(k3_parse_new(tok, &o, on_ev, NULL, &p, NULL) == 0);
	CHECK(k3_detok_new(tok, stops, lens, 2, 0, &d, NULL) == 0);
	for (size_t i = 0; i + 1 < n; i += 2) {
		uint32_t id = (uint32_t)(s[i] | s[i + 1] << 8) % (nv + 2);   /* a few out of range */
		const char *t;
		size_t tl;
		int rc = k3_parse_feed_id(p, id);
		CHECK(rc == 0 || (rc == -ERANGE && id >= nv));
		rc = k3_detok_feed(d, id, &t, &tl);
		CHECK(rc >= 0 || (rc == -ERANGE && id >= nv));
		CHECK(k3_tok_utf8_valid_prefix(t, tl) == tl);
	}
	CHECK(k3_parse_finish(p) == 0);
	k3_parse_free(p);
	k3_detok_free(d);
	/* the same bytes as text through the text interface */
	CHECK(k3_parse_new(tok, &o, on_ev, NULL, &p, NULL) == 0);
	for (size_t i = 0; i < n; i += 7)
		(void)k3_parse_feed_text(p, (const char *)s + i, n - i < 7 ? n - i : 7);
	(void)k3_parse_finish(p);
	k3_parse_free(p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (!tok)
		setup();
	if (size == 0 || size > (1 << 16))
		return 0;
	switch (data[0] % 3) {
	case 0: mode_text((const char *)data + 1, size - 1); break;
	case 1: mode_chat((const char *)data + 1, size - 1); break;
	default: mode_ids(data + 1, size - 1); break;
	}
	return 0;
}

/*
 * test_stream.c - streaming detokenizer and output parser on a synthetic
 * vocabulary: UTF-8 split across tokens never shows as U+FFFD, stop-string
 * hold-back, Python-compatible replacement of invalid bytes, and the
 * reasoning/content/tool-call split of K3 output including malformed input.
 */
#include <errno.h>

#include "parse_collect.h"
#include "text_golden.h"
#include "text/text_detok.h"
#include "text/text_parse.h"

static struct k3_tok *tok;

static void encode(const char *s, bool sp, struct k3_tok_ids *ids)
{
	ids->n = 0;
	T_EQ_INT(k3_tok_encode(tok, s, strlen(s), sp, ids, NULL), 0);
}

static void test_utf8_split(void)
{
	/* emoji with modifier, CJK, ZWJ sequence; the vocabulary has merges
	 * that cut characters in the middle (see main) */
	const char *s = "hello \xf0\x9f\x91\x8b\xf0\x9f\x8f\xbd world \xe6\x9d\xb1\xe4\xba\xac "
			"\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x92\xbb!";
	struct k3_tok_ids ids = { 0 };
	struct k3_detok *d;
	struct k3_sbuf all = { 0 };
	const char *t;
	size_t n;
	int cut_tokens = 0;

	encode(s, false, &ids);
	T_EQ_INT(k3_detok_new(tok, NULL, NULL, 0, 0, &d, NULL), 0);
	for (size_t i = 0; i < ids.n; i++) {
		const uint8_t *b;
		size_t bl;
		k3_tok_id_bytes(tok, ids.v[i], &b, &bl);
		cut_tokens += k3_tok_utf8_valid_prefix((const char *)b, bl) != bl;
		T_EQ_INT(k3_detok_feed(d, ids.v[i], &t, &n), 0);
		/* every delta is whole UTF-8 and has no replacement char */
		T_OK(k3_tok_utf8_valid_prefix(t, n) == n);
		T_OK(!memmem(t, n, "\xef\xbf\xbd", 3));
		k3_sbuf_add(&all, t, n);
	}
	T_EQ_INT(k3_detok_flush(d, &t, &n), 0);
	k3_sbuf_add(&all, t, n);
	T_EQ_STR(all.p, s);
	T_OK(cut_tokens >= 3);   /* the test really splits characters */
	k3_detok_free(d);
	k3_sbuf_release(&all);
	k3_tok_ids_release(&ids);
}

/* feeds single-byte ids; returns everything emitted and the last rc */
static int run_bytes(struct k3_detok *d, const char *bytes, size_t nb, struct k3_sbuf *out, bool flush)
{
	const char *t;
	size_t n;
	int rc = 0;
	for (size_t i = 0; i < nb; i++) {
		rc = k3_detok_feed(d, (uint8_t)bytes[i], &t, &n);   /* rank b = byte b */
		k3_sbuf_add(out, t, n);
	}
	if (flush) {
		rc = k3_detok_flush(d, &t, &n);
		k3_sbuf_add(out, t, n);
	}
	return rc;
}

static void test_detok(void)
{
	const char *stops[] = { "STOP", "<|x" };
	size_t lens[] = { 4, 3 };
	struct k3_detok *d;
	struct k3_sbuf o = { 0 };
	const char *t;
	size_t n;

	/* stop string across tokens: text before it, then stopped */
	T_EQ_INT(k3_detok_new(tok, stops, lens, 2, 0, &d, NULL), 0);
	T_EQ_INT(run_bytes(d, "abc ST", 6, &o, false), 0);
	T_EQ_STR(o.p, "abc ");                /* "ST" held back */
	T_EQ_INT(run_bytes(d, "OP more", 7, &o, false), 1);
	T_EQ_STR(o.p, "abc ");
	T_EQ_INT(k3_detok_feed(d, 'z', &t, &n), 1);
	T_EQ_INT(n, 0);
	k3_detok_free(d);
	/* a held prefix that does not complete is released */
	o.n = 0;
	T_EQ_INT(k3_detok_new(tok, stops, lens, 2, 0, &d, NULL), 0);
	T_EQ_INT(run_bytes(d, "a<|", 3, &o, false), 0);
	T_EQ_STR(o.p, "a");
	T_EQ_INT(run_bytes(d, "y S", 3, &o, true), 0);
	T_EQ_STR(o.p, "a<|y S");
	k3_detok_free(d);
	/* invalid bytes: one U+FFFD per maximal invalid subpart (Python) */
	o.n = 0;
	T_EQ_INT(k3_detok_new(tok, NULL, NULL, 0, 0, &d, NULL), 0);
	T_EQ_INT(run_bytes(d, "\xff" "a\xf0\x9f" "b\xe6\x9d", 7, &o, true), 0);
	T_EQ_STR(o.p, "\xef\xbf\xbd" "a\xef\xbf\xbd" "b\xef\xbf\xbd");
	k3_detok_free(d);
	/* specials: names, or nothing with SKIP_SPECIAL */
	o.n = 0;
	T_EQ_INT(k3_detok_new(tok, NULL, NULL, 0, 0, &d, NULL), 0);
	T_EQ_INT(k3_detok_feed(d, k3_tok_special(tok, K3_TOK_SP_END_OF_MSG), &t, &n), 0);
	T_OK(n == 14 && memcmp(t, "<|end_of_msg|>", 14) == 0);
	T_EQ_INT(k3_detok_feed(d, k3_tok_n_vocab(tok), &t, &n), -ERANGE);
	k3_detok_free(d);
	T_EQ_INT(k3_detok_new(tok, NULL, NULL, 0, K3_DETOK_SKIP_SPECIAL, &d, NULL), 0);
	T_EQ_INT(k3_detok_feed(d, k3_tok_special(tok, K3_TOK_SP_END_OF_MSG), &t, &n), 0);
	T_EQ_INT(n, 0);
	k3_detok_free(d);
	/* text already decoded (parser content deltas) gets the same stop
	 * matching, across calls */
	o.n = 0;
	T_EQ_INT(k3_detok_new(tok, stops, lens, 2, 0, &d, NULL), 0);
	T_EQ_INT(k3_detok_feed_text(d, "x S", 3, &t, &n), 0);
	k3_sbuf_add(&o, t, n);
	T_EQ_STR(o.p, "x ");
	T_EQ_INT(k3_detok_feed_text(d, "TOP y", 5, &t, &n), 1);
	k3_sbuf_add(&o, t, n);
	T_EQ_STR(o.p, "x ");
	k3_detok_free(d);
	/* bad stop strings */
	size_t zero = 0;
	T_EQ_INT(k3_detok_new(tok, stops, &zero, 1, 0, &d, NULL), -EINVAL);
	k3_sbuf_release(&o);
}

/* parses the output by ids (encode with specials on) */
static void parse_ids(const char *out, bool thinking, struct tg_collect *c)
{
	struct k3_parse_opts o;
	struct k3_parse *p;
	struct k3_tok_ids ids = { 0 };

	memset(c, 0, sizeof(*c));
	k3_parse_opts_init(&o);
	o.thinking = thinking;
	T_EQ_INT(k3_parse_new(tok, &o, tg_collect_event, c, &p, NULL), 0);
	encode(out, true, &ids);
	for (size_t i = 0; i < ids.n; i++)
		T_EQ_INT(k3_parse_feed_id(p, ids.v[i]), 0);
	T_EQ_INT(k3_parse_finish(p), 0);
	k3_parse_free(p);
	k3_tok_ids_release(&ids);
	k3_sbuf_add(&c->reasoning, "", 0);
	k3_sbuf_add(&c->content, "", 0);
	for (int i = 0; i < 4; i++)
		k3_sbuf_add(&c->args[i], "", 0);
}

static void test_parse(void)
{
	struct tg_collect c;

	parse_ids("I think \xf0\x9f\x91\x8b<|close|>think<|sep|><|open|>response<|sep|>Hello \xe6\x9d\xb1!"
		  "<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>ignored", true, &c);
	T_EQ_STR(c.reasoning.p, "I think \xf0\x9f\x91\x8b");
	T_EQ_STR(c.content.p, "Hello \xe6\x9d\xb1!");
	T_EQ_INT(c.n_calls, 0);
	T_EQ_INT(c.n_end, 1);
	tg_collect_release(&c);

	parse_ids("plan<|close|>think<|sep|><|open|>response<|sep|>Running.<|close|>response<|sep|>"
		  "<|open|>tools<|sep|><|open|>call tool=\"bash\" index=\"1\"<|sep|>"
		  "<|open|>argument key=\"command\" type=\"string\"<|sep|>ls \"-la\"\n<|close|>argument<|sep|>"
		  "<|open|>argument key=\"n\" type=\"number\"<|sep|>3<|close|>argument<|sep|>"
		  "<|open|>argument key=\"o\" type=\"object\"<|sep|>{\"k\":[1,2.50]}<|close|>argument<|sep|>"
		  "<|open|>argument key=\"k&amp;&quot;\" type=\"number\"<|sep|>x1<|close|>argument<|sep|>"
		  "<|close|>call<|sep|>"
		  "<|open|>call tool=\"we&amp;ird&quot;\" index=\"2\"<|sep|><|close|>call<|sep|>"
		  "<|open|>call index=\"3\"<|sep|><|open|>argument key=\"x\" type=\"string\"<|sep|>dropped<|close|>argument<|sep|><|close|>call<|sep|>"
		  "<|open|>call tool=\"j\" index=\"4\"<|sep|><|open|>json type=\"object\"<|sep|>{\"a\":1}<|close|>json<|sep|><|close|>call<|sep|>"
		  "<|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>", true, &c);
	T_EQ_STR(c.reasoning.p, "plan");
	T_EQ_STR(c.content.p, "Running.");
	T_EQ_INT(c.n_calls, 3);
	T_EQ_INT(c.n_tool_end, 3);
	T_OK(!c.bad_order);
	T_EQ_STR(c.names[0].p, "bash");
	T_EQ_STR(c.args[0].p, "{\"command\": \"ls \\\"-la\\\"\\n\", \"n\": 3, \"o\": {\"k\": [1, 2.5]}, \"k&\\\"\": \"x1\"}");
	T_EQ_STR(c.names[1].p, "we&ird\"");
	T_EQ_STR(c.args[1].p, "{}");
	T_EQ_STR(c.names[2].p, "j");
	T_EQ_STR(c.args[2].p, "{\"a\": 1}");
	T_OK(strncmp(c.ids[0], "call_", 5) == 0 && strlen(c.ids[0]) == 29 && strcmp(c.ids[0], c.ids[1]) != 0);
	tg_collect_release(&c);

	/* thinking off: output starts in the response channel */
	parse_ids("Just this.<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>", false, &c);
	T_EQ_STR(c.reasoning.p, "");
	T_EQ_STR(c.content.p, "Just this.");
	tg_collect_release(&c);

	/* malformed: unknown tags, stray specials, unterminated header, no
	 * end marker; no marker spelling reaches the text */
	parse_ids("r<|close|>think<|sep|><|open|>response<|sep|>a<|open|>weird x=\"1\"<|sep|>b<|close|>weird<|sep|>c"
		  "[BOS]<|reserved_token_300|>d<|close|>nothere<|sep|>e<|open|>respo", true, &c);
	T_EQ_STR(c.reasoning.p, "r");
	T_EQ_STR(c.content.p, "abcderespo");
	T_EQ_INT(c.n_end, 1);
	tg_collect_release(&c);

	/* text interface: a marker split between two feeds is still a marker */
	{
		struct k3_parse *p;
		memset(&c, 0, sizeof(c));
		T_EQ_INT(k3_parse_new(tok, NULL, tg_collect_event, &c, &p, NULL), 0);
		T_EQ_INT(k3_parse_feed_text(p, "reason \xe6\x9d", 9), 0);
		T_EQ_INT(k3_parse_feed_text(p, "\xb1<|clo", 6), 0);
		T_EQ_INT(k3_parse_feed_text(p, "se|>think<|sep|><|open|>response<|sep|>ans<", 43), 0);
		T_EQ_INT(k3_parse_finish(p), 0);
		k3_parse_free(p);
		k3_sbuf_add(&c.reasoning, "", 0);
		k3_sbuf_add(&c.content, "", 0);
		T_EQ_STR(c.reasoning.p, "reason \xe6\x9d\xb1");
		T_EQ_STR(c.content.p, "ans<");
		tg_collect_release(&c);
	}
}

int main(void)
{
	/* merges that cut characters: 👋 = f0 9f 91 8b, 🏽 = f0 9f 8f bd,
	 * 東 = e6 9d b1, 京 = e4 ba ac */
	static const char *const merges[] = { "\xf0\x9f", "\x91\x8b\xf0", "\x9f\x8f", "\xbd ",
					      "\xe6\x9d", "\xb1\xe4", "\xba\xac", "lo", "hel", NULL };
	static void (*const tests[])(void) = { test_utf8_split, test_detok, test_parse, NULL };

	return tg_main(&tok, tg_synth(merges, 0, NULL, NULL), NULL, tests);
}

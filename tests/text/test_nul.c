/*
 * test_nul.c - text is bytes, NUL included (issue 16 item 3): model output
 * holding U+0000, lone continuation bytes and a 4-byte character split
 * across tokens keeps every byte through the output parser (reasoning,
 * content, tool-call names and arguments), the Python-exact JSON writer
 * (strings and keys written with their lengths) and the chat renderer
 * (a history resent with \u0000 in content and in tool-call arguments).
 */
#include <errno.h>

#include "parse_collect.h"
#include "text_golden.h"
#include "text/text_chat.h"
#include "text/text_json.h"
#include "text/text_parse.h"

static struct k3_tok *tok;

/* Appends the ids of s (specials on) or of raw bytes (rank b = byte b). */
static void add_text(struct k3_tok_ids *ids, const char *s)
{
	T_EQ_INT(k3_tok_encode(tok, s, strlen(s), true, ids, NULL), 0);
}

static void add_bytes(struct k3_tok_ids *ids, const char *b, size_t n)
{
	for (size_t i = 0; i < n; i++)
		T_EQ_INT(k3_tok_ids_push(ids, (unsigned char)b[i]), 0);
}

#define T_BYTES(buf, lit) do { \
	T_EQ_U64((buf).n, sizeof(lit) - 1); \
	if ((buf).n == sizeof(lit) - 1) \
		T_EQ_MEM((buf).p, lit, sizeof(lit) - 1); \
} while (0)

static void test_parser(void)
{
	struct k3_tok_ids ids = { 0 };
	struct k3_parse *p;
	struct tg_collect s;
	uint32_t fourbyte_head;

	memset(&s, 0, sizeof(s));
	/* 😀 = f0 9f 98 80: the first merge (rank 256) is its first two
	 * bytes, then two byte tokens follow */
	{
		const uint8_t *b;
		size_t n;

		fourbyte_head = 256;
		T_EQ_INT(k3_tok_id_bytes(tok, fourbyte_head, &b, &n), 0);
		T_OK(n == 2 && memcmp(b, "\xf0\x9f", 2) == 0);
	}

	add_text(&ids, "think ");
	add_bytes(&ids, "\0", 1);                   /* U+0000 */
	add_bytes(&ids, "\x80", 1);                 /* a lone continuation byte */
	T_EQ_INT(k3_tok_ids_push(&ids, fourbyte_head), 0);
	add_bytes(&ids, "\x98\x80", 2);             /* ... the rest of the 4-byte character */
	add_text(&ids, "<|close|>think<|sep|><|open|>response<|sep|>a");
	add_bytes(&ids, "\0", 1);
	add_text(&ids, "b<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool=\"f");
	add_bytes(&ids, "\0", 1);
	add_text(&ids, "g\" index=\"1\"<|sep|><|open|>argument key=\"s\" type=\"string\"<|sep|>x");
	add_bytes(&ids, "\0\xff", 2);               /* NUL and an invalid byte inside a string argument */
	add_text(&ids, "y<|close|>argument<|sep|><|close|>call<|sep|>"
		 "<|open|>call tool=\"j\" index=\"2\"<|sep|><|open|>json type=\"object\"<|sep|>{\"k\": \"");
	add_bytes(&ids, "\0", 1);                   /* a raw NUL: not JSON, passed on as written */
	add_text(&ids, "\"}<|close|>json<|sep|><|close|>call<|sep|><|close|>tools<|sep|>"
		 "<|close|>message<|sep|><|end_of_msg|>");

	T_EQ_INT(k3_parse_new(tok, NULL, tg_collect_event, &s, &p, NULL), 0);
	for (size_t i = 0; i < ids.n; i++)
		T_EQ_INT(k3_parse_feed_id(p, ids.v[i]), 0);
	T_EQ_INT(k3_parse_finish(p), 0);
	k3_parse_free(p);

	/* U+FFFD (ef bf bd) stands for the lone byte, as Python's
	 * errors="replace" gives; the split character arrives whole */
	T_BYTES(s.reasoning, "think \0\xef\xbf\xbd\xf0\x9f\x98\x80");
	T_BYTES(s.content, "a\0b");
	T_EQ_INT(s.n_calls, 2);
	T_BYTES(s.names[0], "f\0g");
	T_BYTES(s.args[0], "{\"s\": \"x\\u0000\xef\xbf\xbdy\"}");
	T_BYTES(s.names[1], "j");
	T_BYTES(s.args[1], "{\"k\": \"\0\"}");
	tg_collect_release(&s);
	k3_tok_ids_release(&ids);
}

static void test_json(void)
{
	struct k3_sbuf b = { 0 };
	json_t *o = json_object();

	/* keys set with their lengths may hold NULs; a prefix sorts first,
	 * as Python's sorted() orders "a" < "a\0a" < "a\0b" < "ab" */
	json_object_setn_new(o, "a\0b", 3, json_stringn("v\0w", 3));
	json_object_setn_new(o, "ab", 2, json_integer(2));
	json_object_setn_new(o, "a", 1, json_integer(0));
	json_object_setn_new(o, "a\0a", 3, json_integer(1));
	T_EQ_INT(k3_pyjson_dump(o, K3_PYJSON_SORT_KEYS, &b), 0);
	T_BYTES(b, "{\"a\": 0, \"a\\u0000a\": 1, \"a\\u0000b\": \"v\\u0000w\", \"ab\": 2}");
	b.n = 0;
	T_EQ_INT(k3_pyjson_str(json_object_getn(o, "a\0b", 3), &b), 0);
	T_BYTES(b, "v\0w");
	k3_sbuf_release(&b);
	json_decref(o);
}

/* A history k3ctl chat resends: the assistant's text and a tool call's
 * arguments hold \u0000. Both render with every byte; the arguments parse
 * (Python's json.loads takes \u0000) and render typed, not as a raw string. */
static void test_render(void)
{
	static const char msgs[] =
		"[{\"role\":\"user\",\"content\":\"hi\"},"
		"{\"role\":\"assistant\",\"content\":\"a\\u0000b\",\"tool_calls\":[{\"id\":\"c1\",\"type\":"
		"\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"s\\\": \\\"x\\\\u0000y\\\"}\"}}]},"
		"{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"ok\"}]";
	json_error_t je;
	json_t *m = json_loads(msgs, JSON_ALLOW_NUL, &je);
	struct k3_chat_opts o;
	struct k3_chat chat = { 0 };
	struct k3_err err = { 0, "" };

	T_OK(m != NULL);
	if (!m) {
		printf("     %s\n", je.text);
		return;
	}
	k3_chat_opts_init(&o);
	T_EQ_INT(k3_chat_render(m, &o, &chat, &err), 0);
	T_OK(memmem(chat.text, chat.text_len, "a\0b", 3) != NULL);
	/* the string argument, typed: its value rendered raw, NUL and all */
	T_OK(memmem(chat.text, chat.text_len, "type=\"string\"", 13) != NULL);
	T_OK(memmem(chat.text, chat.text_len, "x\0y", 3) != NULL);
	T_OK(memmem(chat.text, chat.text_len, "\\u0000", 6) == NULL);
	k3_chat_release(&chat);
	json_decref(m);
}

int main(void)
{
	static const char *const merges[] = { "\xf0\x9f", "th", "in", "nk", NULL };

	static void (*const tests[])(void) = { test_parser, test_json, test_render, NULL };

	return tg_main(&tok, tg_synth(merges, 0, NULL, NULL), NULL, tests);
}

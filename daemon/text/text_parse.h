/*
 * text_parse.h - incremental parser of K3 output (docs/text-and-draft.md §3.9,
 * §5): splits generated ids into reasoning (think channel), content
 * (response channel) and tool calls (tools channel), as vLLM's
 * kimi_k3 reasoning + tool parsers do, but on ids, so text the model writes
 * can never be mistaken for a marker.
 *
 * The model writes (after a prompt ending in <|open|>think<|sep|>):
 *   REASONING<|close|>think<|sep|><|open|>response<|sep|>ANSWER
 *   <|close|>response<|sep|>[<|open|>tools<|sep|><|open|>call tool="N"
 *   index="1"<|sep|><|open|>argument key="K" type="T"<|sep|>V
 *   <|close|>argument<|sep|>...<|close|>call<|sep|><|close|>tools<|sep|>]
 *   <|close|>message<|sep|><|end_of_msg|>
 *
 * Events (delivered through a callback, in order):
 *   REASONING / CONTENT: UTF-8-complete text deltas;
 *   TOOL_START: {index (0-based, in call order), name, id};
 *   TOOL_ARGS: a delta of the call's OpenAI `arguments` string; the deltas
 *     of one call concatenate to json.dumps(args, ensure_ascii=False) with
 *     arguments typed per `type` (string → JSON string streamed as it
 *     arrives; number/boolean/null/object/array → parsed and re-serialized,
 *     or a JSON string of the raw text when it does not parse);
 *   TOOL_END: the call is complete;
 *   END: <|end_of_msg|> or [EOS] arrived (or finish was called).
 * Tag headers are held back until their <|sep|>, so a marker is never
 * split. Malformed output degrades to plain content: text outside any
 * channel, inside unknown tags or in an unterminated header is content; a
 * call without a `tool` name is dropped with its arguments. No special
 * token's spelling is ever emitted as text.
 *
 * Not thread-safe; one parser per stream. The tokenizer must outlive it.
 */
#ifndef K3_TEXT_PARSE_H
#define K3_TEXT_PARSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "text/text_tok.h"

enum k3_parse_ev_type {
	K3_PARSE_REASONING,
	K3_PARSE_CONTENT,
	K3_PARSE_TOOL_START,
	K3_PARSE_TOOL_ARGS,
	K3_PARSE_TOOL_END,
	K3_PARSE_END,
};

/* Pointers are valid only during the callback. */
struct k3_parse_event {
	enum k3_parse_ev_type type;
	const char *text;       /* REASONING, CONTENT, TOOL_ARGS: the delta */
	size_t len;
	unsigned tool_index;    /* TOOL_*: 0-based position among emitted calls */
	const char *name;       /* TOOL_START: function name (unescaped), NUL-terminated */
	size_t name_len;        /* TOOL_START: its length in bytes (the model may write a
				 * NUL into it: use this, not strlen) */
	const char *id;         /* TOOL_START: generated call id "call_" + 24 hex digits */
};

/* Return non-zero to abort: the value is passed back from feed/finish. */
typedef int (*k3_parse_cb)(void *ud, const struct k3_parse_event *ev);

struct k3_parse_opts {
	bool thinking;          /* the prompt ended inside the think channel
				 * (else inside response); default true */
	uint64_t id_seed;       /* seed of the generated call ids */
};

struct k3_parse;

void k3_parse_opts_init(struct k3_parse_opts *o);

/* Returns 0 or -ENOMEM. */
int k3_parse_new(const struct k3_tok *tok, const struct k3_parse_opts *o, k3_parse_cb cb, void *ud,
		 struct k3_parse **out, struct k3_err *err);
void k3_parse_free(struct k3_parse *p);

/* Feeds one generated id. Returns 0, the callback's non-zero value,
 * -ERANGE (id outside the vocabulary) or -ENOMEM. After END, ids are
 * ignored. */
int k3_parse_feed_id(struct k3_parse *p, uint32_t id);

/* Feeds generated text whose markers are spelled out (e.g. a client that
 * only has text): special names in it are matched as ids. A tail that may
 * be the start of a special name is held until the next call or finish. */
int k3_parse_feed_text(struct k3_parse *p, const char *text, size_t len);

/* Ends the stream: flushes held text, closes open calls, emits END once. */
int k3_parse_finish(struct k3_parse *p);

#endif

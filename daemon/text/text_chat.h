/*
 * text_chat.h - the Kimi K3 XTML chat renderer (docs/text-and-draft.md §3,
 * encoding_k3.py of the latest release: four segments per attribute,
 * assistant `name`, think channel kept on every assistant turn).
 *
 * Rendering gives a list of segments (text, allow_special); the prompt ids
 * are the concatenation of each segment encoded on its own with its own
 * flag (never re-tokenize the joined text: that would merge across
 * segments and let user text spell control tokens). Only the four markers
 * <|open|> <|close|> <|sep|> <|end_of_msg|> are allow_special segments, so
 * user-supplied text can never produce a control id.
 *
 * Input is OpenAI-style JSON (jansson values, borrowed, never modified).
 * Differences from the Python renderer, all deliberate:
 *   - role `developer` is rendered as `system` (vLLM does this before
 *     rendering; the bare renderer would drop it);
 *   - image/audio/video content parts are refused with -ENOTSUP (this
 *     product is text-only);
 *   - values jansson cannot hold (NaN, integers beyond int64) fail to parse
 *     earlier, where Python would accept them.
 */
#ifndef K3_TEXT_CHAT_H
#define K3_TEXT_CHAT_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "base/err.h"
#include "text/text_tok.h"

/* One segment: text[off, off+len) of struct k3_chat.text. */
struct k3_chat_seg {
	size_t off, len;
	bool special;     /* encode with special-token matching on */
};

/* A rendered chat, owned by the caller: zero-initialize, pass to
 * k3_chat_render, free with k3_chat_release. text is the concatenation of
 * all segments (what apply_chat_template(tokenize=False) returns),
 * NUL-terminated; it may contain NUL bytes from message text. */
struct k3_chat {
	char *text;
	size_t text_len;
	struct k3_chat_seg *segs;
	size_t n_segs, cap_segs;
};

/* Renderer options (the kwargs of build_chat_segments). JSON values are
 * borrowed and must outlive the render call. */
struct k3_chat_opts {
	bool thinking;                  /* default true */
	const char *thinking_effort;    /* "low" | "high" | "max" | NULL (no effort message) */
	const json_t *tools;            /* NULL or JSON null: none; list or mapping */
	const json_t *tool_choice;      /* "required"/"none" render a message; else nothing */
	const json_t *response_format;  /* {"type": "json_object"|"json_schema", ...} or a string */
	const json_t *response_schema;  /* only if has_response_schema (then may be JSON null) */
	bool has_response_schema;
	bool add_generation_prompt;     /* default true */
};

/* Defaults of build_chat_segments: thinking on, no effort message, no
 * tools, generation prompt on. (The public apply_chat_template, and so the
 * gateway, default thinking_effort to "max".) */
void k3_chat_opts_init(struct k3_chat_opts *o);

/* Reads options from a JSON object with any of the keys: thinking,
 * enable_thinking (bool), thinking_effort (string or null),
 * reasoning_effort ("none" turns thinking off; low/high/max set the
 * effort; anything else → -EINVAL, as vLLM answers 400), tools,
 * tool_choice, response_format, response_schema (presence counts, even
 * null), add_generation_prompt (bool). Unknown keys are ignored. Values stay
 * borrowed from obj. Starts from the current contents of *o. */
int k3_chat_opts_from_json(const json_t *obj, struct k3_chat_opts *o, struct k3_err *err);

/* Renders messages (a JSON array of message objects) into *out (which
 * must be zeroed or released). Returns 0, or -EINVAL (malformed message:
 * missing role, tool message whose tool name cannot be resolved, tool-call
 * arguments that are not an object, unsupported thinking_effort, ...),
 * -ENOTSUP (image/audio content part), -ENOMEM. err names the message
 * index. On error *out is released. */
int k3_chat_render(const json_t *messages, const struct k3_chat_opts *o, struct k3_chat *out,
		   struct k3_err *err);

/* Encodes every segment with its own allow_special flag and appends the
 * ids to *ids. Returns 0 or an error of k3_tok_encode. */
int k3_chat_encode(const struct k3_tok *tok, const struct k3_chat *chat, struct k3_tok_ids *ids,
		   struct k3_err *err);

/* Rendered text size (bytes) from which k3_chat_encode_parallel uses
 * threads. Measured with tests/bench/bench_tokenizer on the (shared,
 * 2-core) build machine: no gain at 281 KiB, 1.4-1.7x from 1.1 MiB; the
 * crossover lies in between (see docs/text.md). */
#define K3_CHAT_PAR_MIN_BYTES (512u << 10)

/* Same ids as k3_chat_encode, in the same order, encoding runs of segments
 * on up to n_threads threads (segments are independent by construction).
 * Falls back to the serial path below K3_CHAT_PAR_MIN_BYTES or when
 * n_threads <= 1. Returns 0, an error of k3_tok_encode, or -EAGAIN
 * (thread creation failed: nothing appended). */
int k3_chat_encode_parallel(const struct k3_tok *tok, const struct k3_chat *chat, unsigned n_threads,
			    struct k3_tok_ids *ids, struct k3_err *err);

/* Frees what k3_chat_render allocated and zeroes *c; NULL is fine. */
void k3_chat_release(struct k3_chat *c);

#endif

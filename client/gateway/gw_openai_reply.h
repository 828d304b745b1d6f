/*
 * gw_openai_reply.h - the reply side of k3-gateway's OpenAI dialect: what
 * k3d sends for a generation (TOKEN, TOOL_CALL, DONE, ERROR) shaped into
 * OpenAI's JSON (the chat.completion / text_completion objects, the
 * streaming chunks, usage, /v1/models objects) and into OpenAI errors (the
 * error map). Pure: no I/O, no clock, no randomness, no globals; the caller
 * (gw_http.c) supplies ids and times and does the HTTP and SSE transport.
 *
 * Every function returning json_t * returns a new reference the caller
 * owns (json_decref), or NULL when memory ran out or there is nothing to
 * send (documented per function). Model output (token text, tool-call
 * names and arguments) is carried with its length, so a U+0000 the model
 * wrote reaches the client as "\u0000"; k3d sends only valid UTF-8
 * (the protocol's STR fields), so nothing here re-assembles characters.
 */
#ifndef K3_GW_OPENAI_REPLY_H
#define K3_GW_OPENAI_REPLY_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "gw_openai.h"
#include "k3_proto.h"

/* /health's sentence for a draining k3d, which the generation errors
 * below repeat so a client and a load balancer read the same words. */
#define GW_OPENAI_DRAINING_WHY "k3d is draining (shutting down or restarting) and takes no new requests"

/* One generation's reply. Fill with gw_openai_reply_init, release with
 * gw_openai_reply_release. */
struct gw_openai_reply {
	enum gw_endpoint ep;
	bool stream;
	bool include_usage;
	char id[48];                 /* "chatcmpl-..." or "cmpl-..." */
	long long created;           /* Unix seconds */
	const char *model;           /* borrowed: must outlive the reply; may change until the first shape */
	/* non-streaming: the text so far, by channel (bytes, NUL included) */
	struct k3_proto_buf content, reasoning;
	json_t *tool_calls;          /* non-streaming: calls by arrival, each with an "__index" key */
	json_t *tool_seen;           /* streaming: indices whose first delta went out */
};

/*
 * Sets up rp for request rq (its endpoint, stream and include_usage), with
 * completion id id (copied, at most 47 bytes), created (Unix seconds) and
 * model (borrowed). Returns 0, or -1 when memory ran out (rp is still safe
 * to release).
 */
int gw_openai_reply_init(struct gw_openai_reply *rp, const struct gw_openai_request *rq, const char *id,
			 long long created, const char *model);

/* Frees what rp holds and zeroes it; accepts a zeroed rp. */
void gw_openai_reply_release(struct gw_openai_reply *rp);

/* The first chunk of a chat stream, delta {"role":"assistant","content":""};
 * NULL for legacy completions, whose streams have none. */
json_t *gw_openai_reply_first_chunk(const struct gw_openai_reply *rp);

/*
 * A TOKEN. Streaming: returns its chunk (chat: delta content or
 * reasoning_content; legacy: text), or NULL when the token has no text.
 * Non-streaming: appends the text to its channel and returns NULL.
 */
json_t *gw_openai_reply_token(struct gw_openai_reply *rp, const struct k3_msg_token *t);

/*
 * A TOOL_CALL (chat only; legacy completions ignore them and get NULL).
 * fallback_id names the call when k3d gave it no id ("call_..." from the
 * caller's random source; used only for a call's first event).
 * Streaming: returns the tool_calls delta chunk, with id, type and name in
 * the first delta of each call only (the SDKs concatenate string fields).
 * Non-streaming: accumulates the call (arguments appended) and returns NULL.
 */
json_t *gw_openai_reply_tool_call(struct gw_openai_reply *rp, const struct k3_msg_tool_call *tc,
				  const char *fallback_id);

/* OpenAI's finish_reason for a DONE ("stop", "length", "tool_calls"; a
 * legacy completion's tool calls are "stop"), or NULL when the DONE ends
 * no reply (cancelled, engine error): gw_openai_done_error says what then. */
const char *gw_openai_finish_reason(enum gw_endpoint ep, const struct k3_msg_done *d);

/* The usage object of a DONE (total = prompt + completion). */
json_t *gw_openai_usage(const struct k3_msg_done *d);

/* The final chunk of a stream: chat delta {} (legacy text "") with
 * finish (from gw_openai_finish_reason). */
json_t *gw_openai_reply_final_chunk(const struct gw_openai_reply *rp, const char *finish);

/* The usage chunk that follows the final one (choices [] and usage), or
 * NULL when the request did not ask for it (stream_options.include_usage). */
json_t *gw_openai_reply_usage_chunk(const struct gw_openai_reply *rp, const struct k3_msg_done *d);

/*
 * The non-streaming completion object for DONE d with finish. Chat:
 * message content (null when there are tool calls and no text),
 * reasoning_content when there was reasoning, tool_calls; legacy: text is
 * the answer followed by any reasoning. Consumes the accumulated calls'
 * "__index" keys: call it once.
 */
json_t *gw_openai_reply_completion(struct gw_openai_reply *rp, const struct k3_msg_done *d, const char *finish);

/* /v1/models/{id} and /v1/models bodies; created in Unix seconds. */
json_t *gw_openai_model(const char *id, long long created);
json_t *gw_openai_model_list(const char *id, long long created);

/* ---- the error map ------------------------------------------------------ */

/* An OpenAI error for a generation, before or after the stream's headers. */
struct gw_openai_reply_error {
	int status;                          /* HTTP status (after the headers: what /metrics counts) */
	const char *type;                    /* static: "server_error", "invalid_request_error", ... */
	const char *code;                    /* static, or NULL for null */
	char param[K3_LIM_NAME_MAX + 1];     /* "" = null; sent only before the headers */
	char message[K3_LIM_MESSAGE_MAX + 512];
};

/* {"error":{"message","type","param","code"}}; param and code NULL or ""
 * give null. NULL when message is not valid UTF-8 or memory ran out. */
json_t *gw_openai_error_json(const char *type, const char *message, const char *param, const char *code);

/* k3d's ERROR for the GENERATE of request rq, by status (BUSY 429,
 * NOT_READY and SHUTTING_DOWN 503, CONTEXT_EXCEEDED / INVALID_ARGUMENT /
 * BAD_REQUEST / UNSUPPORTED 400, TOO_LARGE 413, anything else 500), with
 * k3d's param renamed to the client's field (max_new -> max_tokens or
 * max_completion_tokens, prompt -> messages for chat). */
void gw_openai_k3d_error(const struct gw_openai_request *rq, const struct k3_msg_error *ke,
			 struct gw_openai_reply_error *e);

/* A DONE for which gw_openai_finish_reason is NULL: who cancelled decides
 * (k3d stopping 503 shutting_down, 'k3ctl cancel' 500 cancelled), else 500. */
void gw_openai_done_error(const struct k3_msg_done *d, struct gw_openai_reply_error *e);

/* The gateway stops (SIGTERM) while the request runs: 503 shutting_down,
 * naming the gateway rather than k3d. */
void gw_openai_stopping_error(struct gw_openai_reply_error *e);

/* A generation request that finds k3d in HELLO_OK state (or ERROR
 * SHUTTING_DOWN to HELLO: K3_STATE_DRAINING): 503. Returns 0 without
 * touching e when state is READY, else -1 with e filled. */
int gw_openai_state_error(uint32_t state, struct gw_openai_reply_error *e);

#endif

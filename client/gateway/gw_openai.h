/*
 * gw_openai.h - the request side of k3-gateway's OpenAI dialect: parses the
 * JSON body of POST /v1/chat/completions or /v1/completions, validates it
 * against the field policy (docs/k3-gateway.8, "FIELD POLICY") and maps it
 * onto the fields of a k3 GENERATE frame. Pure: no I/O, no globals. The
 * reply side is gw_openai_reply.h.
 *
 * What the gateway sends k3d in GENERATE (mode CHAT):
 *   messages   canonical JSON array: every message has "role" (system, user,
 *              assistant or tool; "developer" becomes "system") and, where
 *              given, "content" (a string, or an array of {"type":"text",
 *              "text":...} parts, or null for an assistant), "name",
 *              "reasoning_content" (from reasoning_content or reasoning),
 *              "tool_calls" ([{id,type:"function",function:{name,arguments
 *              (string)}}]) and "tool_call_id". Nothing else.
 *   tools      the request's tools array (JSON), absent when [] or null.
 *   tool_choice JSON value: "auto", "none" or "required".
 *   response_format JSON object, only for json_object / json_schema.
 *   stop       0..4 strings, each 1..256 bytes (applied by k3d to the
 *              answer channel only).
 *   max_new    tokens, reasoning included; absent = until the model stops
 *              or the context fills.
 *   thinking / reasoning_effort  from reasoning_effort (none -> thinking
 *              false; low/high/max -> that effort; absent -> k3d default).
 * Mode RAW (legacy completions): prompt, stop, max_new (default 16).
 */
#ifndef K3_GW_OPENAI_H
#define K3_GW_OPENAI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "k3_proto.h"

enum gw_endpoint { GW_EP_CHAT = 0, GW_EP_COMPLETIONS = 1 };

/* An OpenAI error to send before any response byte. */
struct gw_openai_error {
	int status;             /* HTTP status, 400 for every validation error */
	char message[512];
	char param[128];        /* "" = null */
	char code[64];          /* "" = null */
};

/* The most strings a request owns: messages, tools, tool_choice,
 * response_format, prompt and the stop strings. */
#define GW_OPENAI_OWNED_MAX (5 + K3_LIM_STOP_COUNT)

/* What a valid request asks for. Its strings are NUL-terminated and point
 * into what it owns (owned[], freed by gw_openai_request_release); prompt
 * and stop may hold U+0000 too, hence their lengths. The JSON texts
 * escape it. */
struct gw_openai_request {
	enum gw_endpoint ep;
	bool stream;
	bool include_usage;
	const char *messages;         /* CHAT: canonical messages JSON */
	const char *tools;            /* CHAT: tools JSON or NULL */
	const char *tool_choice;      /* CHAT: JSON or NULL */
	const char *response_format;  /* CHAT: JSON or NULL */
	const char *prompt;           /* RAW */
	uint32_t prompt_len;
	uint32_t n_stop;
	const char *stop[K3_LIM_STOP_COUNT];
	uint32_t stop_len[K3_LIM_STOP_COUNT];
	bool has_max_new;
	uint32_t max_new;
	const char *max_param;  /* the field max_new came from (static string) */
	long long max_asked;    /* its value as sent; above K3_LIM_MAX_NEW, max_new is the bound */
	uint32_t effort;        /* enum k3_proto_effort */
	uint32_t draft;         /* "draft" (a k3d extension): enum k3_proto_draft_policy, 0 = absent */
	/* every string the parse allocated, each once: what release frees */
	char *owned[GW_OPENAI_OWNED_MAX];
	uint32_t n_owned;
};

/*
 * Validates body (a parsed JSON value of any type) for endpoint ep and
 * fills out. Returns 0, or -1 with *e filled (status 400 and OpenAI's
 * type/param/code conventions). out must be zeroed by the caller; on
 * failure it may hold partial allocations: release it either way.
 */
int gw_openai_parse(enum gw_endpoint ep, json_t *body, struct gw_openai_request *out,
		 struct gw_openai_error *e);

/*
 * The whole request side: parses body (len bytes, borrowed, need not be
 * NUL-terminated) as JSON, then gw_openai_parse. Malformed JSON (duplicate
 * keys included) and nesting deeper than K3_LIM_JSON_DEPTH are 400s with
 * param null. Same return, ownership and release rule as gw_openai_parse.
 */
int gw_openai_parse_body(enum gw_endpoint ep, const char *body, size_t len, struct gw_openai_request *out,
			 struct gw_openai_error *e);

/* Frees what r owns (owned[], so also what a failed parse left) and
 * zeroes r, which may be parsed into again. */
void gw_openai_request_release(struct gw_openai_request *r);

/*
 * Error texts are built with snprintf into bounded buffers from strings
 * that may hold any character (a client's key, k3d's message); a cut can
 * leave half a UTF-8 character at the end, which jansson refuses to put in
 * JSON (the error would turn into a 500). Drops such a partial last
 * character from the NUL-terminated s; a string that is valid UTF-8 but
 * for its last character is unchanged otherwise.
 */
void gw_openai_utf8_trim(char *s);

/*
 * Fills a GENERATE frame body from a parsed request. The frame's string
 * views point into r, which must outlive the encode.
 */
void gw_openai_to_generate(const struct gw_openai_request *r, struct k3_msg_generate *g);

#endif

/*
 * gw_openai_reply.c - OpenAI reply shapes and the error map of k3-gateway
 * (see gw_openai_reply.h; docs/k3-gateway.md "k3d answers -> HTTP" is the
 * error map in prose and must agree with the tables below). Pure: the
 * caller does all I/O.
 */
#include "gw_openai_reply.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A request that never ran while k3d drains (HELLO_OK state DRAINING,
 * ERROR{SHUTTING_DOWN} to HELLO or to the GENERATE, which k3d sends for a
 * new job and for a queued one it drops): a retry is safe. */
#define DRAINING_REQUEST GW_OPENAI_DRAINING_WHY "; this request did not run."
/* A running generation k3d cut off while stopping (drain timeout, or
 * asked to stop again): the same 503 shutting_down, retryable. */
#define DRAINING_CUT GW_OPENAI_DRAINING_WHY "; it stopped this generation before it finished."

int gw_openai_reply_init(struct gw_openai_reply *rp, const struct gw_openai_request *rq, const char *id,
			 long long created, const char *model)
{
	memset(rp, 0, sizeof(*rp));
	rp->ep = rq->ep;
	rp->stream = rq->stream;
	rp->include_usage = rq->include_usage;
	snprintf(rp->id, sizeof(rp->id), "%s", id);
	rp->created = created;
	rp->model = model;
	/* No bound of its own: k3d bounds a generation (max_new, context). */
	k3_proto_buf_init(&rp->content, SIZE_MAX);
	k3_proto_buf_init(&rp->reasoning, SIZE_MAX);
	rp->tool_calls = json_array();
	rp->tool_seen = json_object();
	return rp->tool_calls && rp->tool_seen ? 0 : -1;
}

void gw_openai_reply_release(struct gw_openai_reply *rp)
{
	k3_proto_buf_release(&rp->content);
	k3_proto_buf_release(&rp->reasoning);
	json_decref(rp->tool_calls);
	json_decref(rp->tool_seen);
	memset(rp, 0, sizeof(*rp));
}

static json_t *str_or_null(const char *s)
{
	return s && s[0] ? json_string(s) : json_null();
}

static json_t *buf_string(const struct k3_proto_buf *b)
{
	return json_stringn(b->len ? (const char *)b->data : "", b->len);
}

static json_t *chunk_base(const struct gw_openai_reply *rp)
{
	return json_pack("{s:s,s:s,s:I,s:s}", "id", rp->id, "object",
			 rp->ep == GW_EP_CHAT ? "chat.completion.chunk" : "text_completion", "created",
			 (json_int_t)rp->created, "model", rp->model);
}

/* One chat chunk with delta (stolen), or one legacy chunk with text
 * (text_len bytes, NUL included). */
static json_t *delta_chunk(const struct gw_openai_reply *rp, json_t *delta, const char *text, size_t text_len,
			   const char *finish)
{
	json_t *c = chunk_base(rp), *choice;

	if (rp->ep == GW_EP_CHAT)
		choice = json_pack("{s:i,s:o,s:n,s:o}", "index", 0, "delta", delta, "logprobs", "finish_reason",
				   str_or_null(finish));
	else {
		json_decref(delta);
		choice = json_pack("{s:s%,s:i,s:n,s:o}", "text", text ? text : "", text ? text_len : 0, "index", 0,
				   "logprobs", "finish_reason", str_or_null(finish));
	}
	json_object_set_new(c, "choices", json_pack("[o]", choice));
	if (rp->include_usage)
		json_object_set_new(c, "usage", json_null());
	return c;
}

json_t *gw_openai_reply_first_chunk(const struct gw_openai_reply *rp)
{
	if (rp->ep != GW_EP_CHAT)
		return NULL;
	return delta_chunk(rp, json_pack("{s:s,s:s}", "role", "assistant", "content", ""), NULL, 0, NULL);
}

json_t *gw_openai_reply_token(struct gw_openai_reply *rp, const struct k3_msg_token *t)
{
	bool reasoning = t->has_channel && t->channel == K3_CHANNEL_REASONING;

	if (!t->has_text || t->text.len == 0)
		return NULL;
	if (!rp->stream) {
		k3_proto_buf_append(reasoning ? &rp->reasoning : &rp->content, t->text.p, t->text.len);
		return NULL;
	}
	if (rp->ep == GW_EP_CHAT) {
		json_t *delta = json_object();

		json_object_set_new(delta, reasoning ? "reasoning_content" : "content",
				    json_stringn(t->text.p, t->text.len));
		return delta_chunk(rp, delta, NULL, 0, NULL);
	}
	return delta_chunk(rp, NULL, t->text.p, t->text.len, NULL);
}

json_t *gw_openai_reply_tool_call(struct gw_openai_reply *rp, const struct k3_msg_tool_call *tc,
				  const char *fallback_id)
{
	json_t *name = tc->has_name ? json_stringn(tc->name.p, tc->name.len) : NULL;
	json_t *args = json_stringn(tc->has_arguments ? tc->arguments.p : "",
				    tc->has_arguments ? tc->arguments.len : 0);
	json_t *id, *call, *fn, *out = NULL;
	char idx[16];

	if (rp->ep != GW_EP_CHAT) {
		json_decref(name);
		json_decref(args);
		return NULL;
	}
	snprintf(idx, sizeof(idx), "%u", tc->index);
	id = tc->has_id && tc->id.len ? json_stringn(tc->id.p, tc->id.len) : json_string(fallback_id);
	if (!rp->stream) {
		size_t i, had;
		json_t *c, *sofar;
		char *joined;

		call = NULL;
		json_array_foreach(rp->tool_calls, i, c) {
			if (json_integer_value(json_object_get(c, "__index")) == (json_int_t)tc->index)
				call = c;
		}
		if (!call) {
			call = json_pack("{s:I,s:o,s:s,s:{s:s,s:s}}", "__index", (json_int_t)tc->index, "id",
					 json_incref(id), "type", "function", "function", "name", "", "arguments", "");
			json_array_append_new(rp->tool_calls, call);
		}
		fn = json_object_get(call, "function");
		if (name)
			json_object_set(fn, "name", name);
		/* with lengths: arguments may carry a U+0000 the model wrote */
		sofar = json_object_get(fn, "arguments");
		had = json_string_length(sofar);
		if (args && (joined = malloc(had + json_string_length(args) + 1))) {
			memcpy(joined, json_string_value(sofar), had);
			memcpy(joined + had, json_string_value(args), json_string_length(args));
			json_object_set_new(fn, "arguments", json_stringn(joined, had + json_string_length(args)));
			free(joined);
		}
	} else {
		call = json_pack("{s:I}", "index", (json_int_t)tc->index);
		fn = json_object();
		/* id, type and name go out once per call, in its first delta: the
		 * SDK accumulates string fields, so repeating them would corrupt
		 * them. */
		if (!json_object_get(rp->tool_seen, idx)) {
			json_object_set_new(rp->tool_seen, idx, json_true());
			json_object_set(call, "id", id);
			json_object_set_new(call, "type", json_string("function"));
			json_object_set_new(fn, "name", name ? json_incref(name) : json_string(""));
		}
		json_object_set(fn, "arguments", args);
		json_object_set_new(call, "function", fn);
		out = delta_chunk(rp, json_pack("{s:[o]}", "tool_calls", call), NULL, 0, NULL);
	}
	json_decref(name);
	json_decref(args);
	json_decref(id);
	return out;
}

const char *gw_openai_finish_reason(enum gw_endpoint ep, const struct k3_msg_done *d)
{
	switch (d->finish) {
	case K3_FINISH_STOP: return "stop";
	case K3_FINISH_LENGTH: return "length";
	case K3_FINISH_TOOL_CALLS: return ep == GW_EP_CHAT ? "tool_calls" : "stop";
	default: return NULL;
	}
}

json_t *gw_openai_usage(const struct k3_msg_done *d)
{
	return json_pack("{s:I,s:I,s:I,s:{s:I},s:{s:I}}", "prompt_tokens", (json_int_t)d->prompt_tokens,
			 "completion_tokens", (json_int_t)d->completion_tokens, "total_tokens",
			 (json_int_t)d->prompt_tokens + (json_int_t)d->completion_tokens, "prompt_tokens_details",
			 "cached_tokens", (json_int_t)d->cached_tokens, "completion_tokens_details",
			 "reasoning_tokens", (json_int_t)d->reasoning_tokens);
}

json_t *gw_openai_reply_final_chunk(const struct gw_openai_reply *rp, const char *finish)
{
	return delta_chunk(rp, json_object(), "", 0, finish);
}

json_t *gw_openai_reply_usage_chunk(const struct gw_openai_reply *rp, const struct k3_msg_done *d)
{
	json_t *c;

	if (!rp->include_usage)
		return NULL;
	c = chunk_base(rp);
	json_object_set_new(c, "choices", json_array());
	json_object_set_new(c, "usage", gw_openai_usage(d));
	return c;
}

json_t *gw_openai_reply_completion(struct gw_openai_reply *rp, const struct k3_msg_done *d, const char *finish)
{
	json_t *resp = json_pack("{s:s,s:s,s:I,s:s}", "id", rp->id, "object",
				 rp->ep == GW_EP_CHAT ? "chat.completion" : "text_completion", "created",
				 (json_int_t)rp->created, "model", rp->model);
	json_t *choice;

	if (rp->ep == GW_EP_CHAT) {
		json_t *msg = json_pack("{s:s}", "role", "assistant");
		bool calls = rp->tool_calls && json_array_size(rp->tool_calls);

		json_object_set_new(msg, "content", calls && rp->content.len == 0 ? json_null()
									     : buf_string(&rp->content));
		json_object_set_new(msg, "refusal", json_null());
		if (rp->reasoning.len)
			json_object_set_new(msg, "reasoning_content", buf_string(&rp->reasoning));
		if (calls) {
			size_t i;
			json_t *c;

			json_array_foreach(rp->tool_calls, i, c)
				json_object_del(c, "__index");
			json_object_set(msg, "tool_calls", rp->tool_calls);
		}
		choice = json_pack("{s:i,s:o,s:n,s:s}", "index", 0, "message", msg, "logprobs", "finish_reason",
				   finish);
	} else {
		/* Raw mode has no reasoning channel in practice; should k3d send
		 * one, its text follows the answer rather than being lost. */
		k3_proto_buf_append(&rp->content, rp->reasoning.data, rp->reasoning.len);
		k3_proto_buf_reset(&rp->reasoning);
		choice = json_pack("{s:o,s:i,s:n,s:s}", "text", buf_string(&rp->content), "index", 0, "logprobs",
				   "finish_reason", finish);
	}
	json_object_set_new(resp, "choices", json_pack("[o]", choice));
	json_object_set_new(resp, "usage", gw_openai_usage(d));
	return resp;
}

json_t *gw_openai_model(const char *id, long long created)
{
	return json_pack("{s:s,s:s,s:I,s:s}", "id", id, "object", "model", "created", (json_int_t)created,
			 "owned_by", "k3d");
}

json_t *gw_openai_model_list(const char *id, long long created)
{
	return json_pack("{s:s,s:[o]}", "object", "list", "data", gw_openai_model(id, created));
}

/* ---- the error map ------------------------------------------------------ */

json_t *gw_openai_error_json(const char *type, const char *message, const char *param, const char *code)
{
	return json_pack("{s:{s:s,s:s,s:o,s:o}}", "error", "message", message, "type", type, "param",
			 str_or_null(param), "code", str_or_null(code));
}

static void set_error(struct gw_openai_reply_error *e, int status, const char *type, const char *code,
		      const char *param, const char *message)
{
	e->status = status;
	e->type = type;
	e->code = code;
	snprintf(e->param, sizeof(e->param), "%s", param ? param : "");
	snprintf(e->message, sizeof(e->message), "%s", message);
}

/* k3d ERROR status -> OpenAI error. The message is prefix, k3d's message,
 * suffix; with_param passes k3d's (renamed) param on. */
static const struct k3d_error_row {
	uint32_t k3_status;
	int http;
	const char *type, *code;
	bool with_param;
	const char *prefix, *suffix;
} k3d_errors[] = {
	{ K3_STATUS_BUSY, 429, "rate_limit_error", "rate_limit_exceeded", false,
	  "k3d is busy: its generation slot and queue are full (", "). Retry after the Retry-After delay." },
	{ K3_STATUS_NOT_READY, 503, "server_error", "model_not_ready", false, "k3d is still loading the model: ", "" },
	/* k3d's own message ("k3d is shutting down") would only repeat what
	 * the status says: the sentence replaces it (suffix NULL). */
	{ K3_STATUS_SHUTTING_DOWN, 503, "server_error", "shutting_down", false, DRAINING_REQUEST, NULL },
	/* the message and param of CONTEXT_EXCEEDED are built in code */
	{ K3_STATUS_CONTEXT_EXCEEDED, 400, "invalid_request_error", "context_length_exceeded", true, "", "" },
	{ K3_STATUS_INVALID_ARGUMENT, 400, "invalid_request_error", "invalid_value", true, "", "" },
	{ K3_STATUS_BAD_REQUEST, 400, "invalid_request_error", "invalid_value", true, "", "" },
	{ K3_STATUS_UNSUPPORTED, 400, "invalid_request_error", "unsupported_value", true, "", "" },
	{ K3_STATUS_TOO_LARGE, 413, "invalid_request_error", NULL, true, "", "" },
};
static const struct k3d_error_row k3d_error_other = {
	0, 500, "server_error", NULL, false, "k3d failed: ", "",
};

void gw_openai_k3d_error(const struct gw_openai_request *rq, const struct k3_msg_error *ke,
			 struct gw_openai_reply_error *e)
{
	const struct k3d_error_row *row = &k3d_error_other;
	char msg[K3_LIM_MESSAGE_MAX + 1], param[K3_LIM_NAME_MAX + 1];
	const char *max_param = rq->max_param ? rq->max_param : "max_tokens";

	for (size_t i = 0; i < sizeof(k3d_errors) / sizeof(k3d_errors[0]); i++)
		if (k3d_errors[i].k3_status == ke->status)
			row = &k3d_errors[i];
	snprintf(msg, sizeof(msg), "%.*s", (int)ke->message.len, ke->message.p ? ke->message.p : "");
	snprintf(param, sizeof(param), "%.*s", ke->has_param ? (int)ke->param.len : 0,
		 ke->has_param ? ke->param.p : "");
	/* k3d names GENERATE fields; the client knows its OpenAI fields. */
	if (strcmp(param, "max_new") == 0)
		snprintf(param, sizeof(param), "%s", max_param);
	else if (strcmp(param, "prompt") == 0 && rq->ep == GW_EP_CHAT)
		snprintf(param, sizeof(param), "messages");
	set_error(e, row->http, row->type, row->code, row->with_param ? param : NULL, "");
	if (ke->status == K3_STATUS_CONTEXT_EXCEEDED) {
		/* k3d quotes the max_new it got; a larger value was sent as the
		 * wire bound, so name what the client asked for. */
		char asked[128] = "";

		if (rq->has_max_new && rq->max_asked > (long long)rq->max_new && strcmp(param, max_param) == 0)
			snprintf(asked, sizeof(asked), " ('%.32s' was %lld, sent to k3d as its bound %u)", param,
				 rq->max_asked, (unsigned)rq->max_new);
		/* no param: the prompt ran over, under the client's name for it */
		if (!param[0])
			snprintf(e->param, sizeof(e->param), "%s", rq->ep == GW_EP_CHAT ? "messages" : "prompt");
		snprintf(e->message, sizeof(e->message), "%s%s%s", strstr(msg, "maximum context length") ? "" :
			 "This model's maximum context length was exceeded: ", msg, asked);
	} else if (!row->suffix) {
		snprintf(e->message, sizeof(e->message), "%s", row->prefix);
	} else {
		snprintf(e->message, sizeof(e->message), "%s%s%s", row->prefix, msg, row->suffix);
	}
}

void gw_openai_done_error(const struct k3_msg_done *d, struct gw_openai_reply_error *e)
{
	/* Who cancelled it decides what the client can do: a stopping k3d is
	 * worth a retry elsewhere or later (503), an operator's 'k3ctl
	 * cancel' is final. */
	static const struct {
		uint32_t reason;
		int http;
		const char *code, *message;
	} cancelled[] = {
		{ K3_CANCEL_SHUTDOWN, 503, "shutting_down", DRAINING_CUT },
		{ K3_CANCEL_BY_ID, 500, "cancelled", "an operator cancelled this generation in k3d ('k3ctl cancel')" },
	};

	if (d->finish != K3_FINISH_CANCELLED) {
		set_error(e, 500, "server_error", NULL, NULL, "the engine failed during generation");
		return;
	}
	for (size_t i = 0; i < sizeof(cancelled) / sizeof(cancelled[0]); i++) {
		if (d->cancel_reason == cancelled[i].reason) {
			set_error(e, cancelled[i].http, "server_error", cancelled[i].code, NULL, cancelled[i].message);
			return;
		}
	}
	set_error(e, 500, "server_error", NULL, NULL, "the generation was cancelled in k3d");
}

void gw_openai_stopping_error(struct gw_openai_reply_error *e)
{
	set_error(e, 503, "server_error", "shutting_down", NULL,
		  "k3-gateway is shutting down; it stopped this request before it finished.");
}

int gw_openai_state_error(uint32_t state, struct gw_openai_reply_error *e)
{
	static const struct {
		uint32_t state;
		const char *code, *message;
	} states[] = {
		{ K3_STATE_DRAINING, "shutting_down", DRAINING_REQUEST },
		{ K3_STATE_LOADING, "model_not_ready",
		  "k3d is still loading the model; retry after the Retry-After delay." },
		{ K3_STATE_NO_MODEL, "model_not_ready", "k3d has no model loaded; start it with --model DIR." },
	};
	char msg[64];

	if (state == K3_STATE_READY)
		return 0;
	for (size_t i = 0; i < sizeof(states) / sizeof(states[0]); i++) {
		if (states[i].state == state) {
			set_error(e, 503, "server_error", states[i].code, NULL, states[i].message);
			return -1;
		}
	}
	snprintf(msg, sizeof(msg), "k3d is not ready (state %u).", state);
	set_error(e, 503, "server_error", "model_not_ready", NULL, msg);
	return -1;
}

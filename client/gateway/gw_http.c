/*
 * gw_http.c - routing, authentication, CORS, error bodies and the two
 * response shapes (JSON and SSE) of k3-gateway, plus the per-request k3
 * conversation (docs/k3-gateway.md, "Request lifecycle").
 *
 * One struct gw_req lives from the moment a request arrives until both
 * sides are finished: the HTTP reply was sent (or the client went away)
 * and the k3d connection was closed. Whichever side ends second frees it.
 */
#include "gw.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/keyvalq_struct.h>
#include <jansson.h>

#include "gw_daemon.h"
#include "gw_openai.h"
#include "k3_proto.h"

enum gw_kind { K_GENERATE, K_MODELS, K_MODEL_ONE, K_HEALTH, K_METRICS };

enum { RID_HELLO = 0, RID_GENERATE = 1, RID_STATUS = 2 };

/* How long a cancelled job may take to report DONE before the gateway
 * closes its k3d connection anyway (which cancels it too, rule 6). */
#define GW_CANCEL_GRACE_S 5

struct gw_req {
	struct gw *g;
	struct evhttp_request *req;      /* NULL once the reply is complete or the client left */
	struct evhttp_connection *evcon;
	struct event *eof_ev;            /* watches the client socket for EOF */
	struct event *timer;             /* SSE keep-alive, then cancel grace */
	struct gw_daemon *d;
	enum gw_kind kind;
	enum gw_ep_metric mep;
	struct gw_openai_request oai;
	char *model_query;               /* GET /v1/models/{id} */
	char line[160];                  /* "METHOD /path" for the access log */
	struct timeval t0;
	char req_id[40];
	char cmpl_id[48];
	long long created;
	char model[K3_LIM_NAME_MAX + 1];
	bool generate_sent, accepted, started, done, cancel_sent;
	bool counted;                    /* counted in m.in_flight (not a /health or /metrics probe) */
	struct evbuffer *content, *reasoning;
	json_t *tool_calls;              /* non-stream: accumulated calls, by index */
	json_t *tool_seen;               /* stream: indices whose first delta went out */
	unsigned finish;
};

static void req_maybe_free(struct gw_req *r);
static void client_gone(struct gw_req *r);

/* ---- small helpers ----------------------------------------------------- */

static void random_hex(char *out, size_t nbytes)
{
	unsigned char b[32];
	static const char hx[] = "0123456789abcdef";

	if (nbytes > sizeof(b))
		nbytes = sizeof(b);
	if (getrandom(b, nbytes, 0) != (ssize_t)nbytes) {
		/* Ids only need to be unique per process; fall back to a counter. */
		static unsigned long long ctr;
		unsigned long long c = ++ctr ^ (unsigned long long)time(NULL) << 20;

		for (size_t i = 0; i < nbytes; i++)
			b[i] = (unsigned char)(c >> (8 * (i % 8)));
	}
	for (size_t i = 0; i < nbytes; i++) {
		out[2 * i] = hx[b[i] >> 4];
		out[2 * i + 1] = hx[b[i] & 15];
	}
	out[2 * nbytes] = 0;
}

static const char *method_name(enum evhttp_cmd_type c)
{
	switch (c) {
	case EVHTTP_REQ_GET: return "GET";
	case EVHTTP_REQ_POST: return "POST";
	case EVHTTP_REQ_HEAD: return "HEAD";
	case EVHTTP_REQ_PUT: return "PUT";
	case EVHTTP_REQ_DELETE: return "DELETE";
	case EVHTTP_REQ_OPTIONS: return "OPTIONS";
	case EVHTTP_REQ_TRACE: return "TRACE";
	case EVHTTP_REQ_CONNECT: return "CONNECT";
	case EVHTTP_REQ_PATCH: return "PATCH";
	}
	return "?";
}

static const char *cors_origin(struct gw *g, struct evhttp_request *req)
{
	const char *o = evhttp_find_header(evhttp_request_get_input_headers(req), "Origin");

	if (!o)
		return NULL;
	for (unsigned i = 0; i < g->cfg.n_cors; i++)
		if (strcmp(g->cfg.cors[i], "*") == 0 || strcmp(g->cfg.cors[i], o) == 0)
			return o;
	return NULL;
}

/* Headers every response carries. */
static void common_headers(struct gw_req *r)
{
	struct evkeyvalq *h = evhttp_request_get_output_headers(r->req);
	const char *o = cors_origin(r->g, r->req);
	char ka[48];

	evhttp_add_header(h, "x-request-id", r->req_id);
	snprintf(ka, sizeof(ka), "timeout=%u", r->g->cfg.read_timeout_s > 1 ? r->g->cfg.read_timeout_s - 1 : 1);
	evhttp_add_header(h, "Keep-Alive", ka);
	if (o) {
		evhttp_add_header(h, "Access-Control-Allow-Origin", o);
		evhttp_add_header(h, "Vary", "Origin");
		evhttp_add_header(h, "Access-Control-Expose-Headers", "x-request-id, retry-after");
	}
}

static void log_access(struct gw_req *r, int status)
{
	struct timeval now;

	if (r->g->cfg.quiet)
		return;
	gettimeofday(&now, NULL);
	fprintf(stderr, "k3-gateway: %s %s %d %.3fs\n", r->req_id, r->line, status,
		(double)(now.tv_sec - r->t0.tv_sec) + (double)(now.tv_usec - r->t0.tv_usec) / 1e6);
}

/* The HTTP side is finished: count it and forget the request object. */
static void http_finished(struct gw_req *r, int status)
{
	gw_metrics_count(&r->g->m, r->mep, status);
	log_access(r, status);
	if (r->evcon)
		evhttp_connection_set_closecb(r->evcon, NULL, NULL);
	if (r->eof_ev)
		event_del(r->eof_ev);
	r->req = NULL;
	r->evcon = NULL;
}

static void send_body(struct gw_req *r, int status, const char *ctype, const char *body, size_t len)
{
	struct evbuffer *b = evbuffer_new();
	struct evhttp_request *req = r->req;

	if (!req) {
		evbuffer_free(b);
		return;
	}
	common_headers(r);
	evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", ctype);
	evbuffer_add(b, body, len);
	http_finished(r, status);
	/* libevent 2.1 knows no phrase for 429 ("Client Error"). */
	evhttp_send_reply(req, status, status == 429 ? "Too Many Requests" : NULL, b);
	evbuffer_free(b);
}

static void send_json(struct gw_req *r, int status, json_t *v)
{
	char *s = json_dumps(v, JSON_COMPACT | JSON_PRESERVE_ORDER);

	json_decref(v);
	if (!s) {
		static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
					  "\"param\":null,\"code\":null}}";
		send_body(r, 500, "application/json", oom, sizeof(oom) - 1);
		return;
	}
	send_body(r, status, "application/json", s, strlen(s));
	free(s);
}

static json_t *str_or_null(const char *s)
{
	return s && s[0] ? json_string(s) : json_null();
}

static json_t *error_object(const char *type, const char *message, const char *param, const char *code)
{
	return json_pack("{s:{s:s,s:s,s:o,s:o}}", "error", "message", message, "type", type, "param",
			 str_or_null(param), "code", str_or_null(code));
}

static void send_error(struct gw_req *r, int status, const char *type, const char *param, const char *code,
		       const char *fmt, ...) __attribute__((format(printf, 6, 7)));

static void send_error(struct gw_req *r, int status, const char *type, const char *param, const char *code,
		       const char *fmt, ...)
{
	char msg[1024];
	va_list ap;

	if (!r->req)
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (status == 429 || status == 503) {
		char ra[16];

		snprintf(ra, sizeof(ra), "%u", r->g->cfg.retry_after_s);
		evhttp_add_header(evhttp_request_get_output_headers(r->req), "Retry-After", ra);
	}
	send_json(r, status, error_object(type, msg, param, code));
}

/* ---- SSE ---------------------------------------------------------------- */

static void sse_write(struct gw_req *r, const char *data, size_t len)
{
	struct evbuffer *b;
	struct timeval tv = { (time_t)r->g->cfg.keepalive_s, 0 };

	if (!r->req)
		return;
	if (len) {
		b = evbuffer_new();
		evbuffer_add(b, data, len);
		evhttp_send_reply_chunk(r->req, b);
		evbuffer_free(b);
	}
	/* Silence is measured from the last byte sent. */
	event_del(r->timer);
	event_add(r->timer, &tv);
}

static void sse_event(struct gw_req *r, json_t *v)
{
	char *s = json_dumps(v, JSON_COMPACT | JSON_PRESERVE_ORDER);
	struct evbuffer *b;
	size_t n;
	char *p;

	json_decref(v);
	if (!s)
		return;
	b = evbuffer_new();
	evbuffer_add_printf(b, "data: %s\n\n", s);
	free(s);
	n = evbuffer_get_length(b);
	p = (char *)evbuffer_pullup(b, (ev_ssize_t)n);
	sse_write(r, p, n);
	evbuffer_free(b);
}

static json_t *chunk_base(struct gw_req *r)
{
	bool chat = r->oai.ep == GW_EP_CHAT;
	json_t *c = json_pack("{s:s,s:s,s:I,s:s}", "id", r->cmpl_id, "object",
			      chat ? "chat.completion.chunk" : "text_completion", "created",
			      (json_int_t)r->created, "model", r->model);

	return c;
}

/* One chat chunk with delta (stolen) or one legacy chunk with text. */
static void sse_delta(struct gw_req *r, json_t *delta, const char *text, const char *finish)
{
	json_t *c = chunk_base(r), *choice;

	if (r->oai.ep == GW_EP_CHAT)
		choice = json_pack("{s:i,s:o,s:n,s:o}", "index", 0, "delta", delta, "logprobs", "finish_reason",
				   str_or_null(finish));
	else {
		json_decref(delta);
		choice = json_pack("{s:s,s:i,s:n,s:o}", "text", text ? text : "", "index", 0, "logprobs",
				   "finish_reason", str_or_null(finish));
	}
	json_object_set_new(c, "choices", json_pack("[o]", choice));
	if (r->oai.include_usage)
		json_object_set_new(c, "usage", json_null());
	sse_event(r, c);
}

static void keepalive_cb(evutil_socket_t fd, short what, void *arg)
{
	struct gw_req *r = arg;
	static const char ka[] = ": keep-alive\n\n";

	(void)fd;
	(void)what;
	if (r->req && r->started)
		sse_write(r, ka, sizeof(ka) - 1);
}

static void sse_start(struct gw_req *r)
{
	struct evkeyvalq *h = evhttp_request_get_output_headers(r->req);

	common_headers(r);
	evhttp_add_header(h, "Content-Type", "text/event-stream; charset=utf-8");
	evhttp_add_header(h, "Cache-Control", "no-cache");
	evhttp_add_header(h, "X-Accel-Buffering", "no");
	evhttp_send_reply_start(r->req, 200, "OK");
	r->started = true;
	if (r->oai.ep == GW_EP_CHAT)
		sse_delta(r, json_pack("{s:s,s:s}", "role", "assistant", "content", ""), NULL, NULL);
	else
		sse_write(r, "", 0);   /* arms the keep-alive timer */
}

/* Ends an SSE response: the reply is complete on the HTTP side. */
static void sse_end(struct gw_req *r, int status)
{
	struct evhttp_request *req = r->req;

	if (!req)
		return;
	event_del(r->timer);
	http_finished(r, status);
	evhttp_send_reply_end(req);
}

/* An error after the headers are out: one error event, then the end. The
 * client got 200 already; status is what the same error has before the
 * headers, so /metrics and the access log count a stream refused by a
 * draining k3d as 503, like the non-streaming request it could have been. */
static void sse_fail(struct gw_req *r, int status, const char *type, const char *code, const char *message)
{
	sse_event(r, error_object(type, message, NULL, code));
	sse_end(r, status);
}

/* ---- generation results ------------------------------------------------ */

static const char *finish_name(const struct gw_req *r, uint32_t f)
{
	switch (f) {
	case K3_FINISH_STOP: return "stop";
	case K3_FINISH_LENGTH: return "length";
	case K3_FINISH_TOOL_CALLS: return r->oai.ep == GW_EP_CHAT ? "tool_calls" : "stop";
	default: return NULL;
	}
}

static json_t *usage_json(const struct k3_msg_done *d)
{
	return json_pack("{s:I,s:I,s:I,s:{s:I},s:{s:I}}", "prompt_tokens", (json_int_t)d->prompt_tokens,
			 "completion_tokens", (json_int_t)d->completion_tokens, "total_tokens",
			 (json_int_t)d->prompt_tokens + (json_int_t)d->completion_tokens, "prompt_tokens_details",
			 "cached_tokens", (json_int_t)d->cached_tokens, "completion_tokens_details",
			 "reasoning_tokens", (json_int_t)d->reasoning_tokens);
}

static json_t *buf_string(struct evbuffer *b)
{
	size_t n = evbuffer_get_length(b);
	const char *p = n ? (const char *)evbuffer_pullup(b, (ev_ssize_t)n) : "";

	return json_stringn(p, n);
}

/* What a request hears while k3d drains, however the gateway learns it
 * (HELLO_OK state DRAINING, ERROR{SHUTTING_DOWN} to HELLO or to the
 * GENERATE, which k3d sends for a new job and for a queued one it drops):
 * /health's sentence, and the request never ran, so a retry is safe. */
#define GW_DRAINING_WHY "k3d is draining (shutting down or restarting) and takes no new requests"
#define GW_DRAINING_REQUEST GW_DRAINING_WHY "; this request did not run."
/* A running generation k3d cut off while stopping (drain timeout, or
 * asked to stop again): the same 503 shutting_down, retryable. */
#define GW_DRAINING_CUT GW_DRAINING_WHY "; it stopped this generation before it finished."

static void on_done(struct gw_req *r, const struct k3_msg_done *d)
{
	const char *finish = finish_name(r, d->finish);
	struct gw_metrics *m = &r->g->m;

	r->done = true;
	m->done_expert_bytes += d->expert_bytes_read;
	m->done_spine_bytes += d->spine_bytes_read;
	/* The token and time totals describe replies clients received (what
	 * their usage objects add up to); work whose reply never reached its
	 * client (it left, or k3d cancelled or failed the job) is counted
	 * apart, so a disconnect storm does not read as served traffic. */
	if (finish && r->req) {
		m->prompt_tokens += d->prompt_tokens;
		m->completion_tokens += d->completion_tokens;
		m->reasoning_tokens += d->reasoning_tokens;
		m->cached_tokens += d->cached_tokens;
		m->prefill_s += d->prefill_s;
		m->decode_s += d->decode_s;
	} else {
		m->undelivered_prompt_tokens += d->prompt_tokens;
		m->undelivered_completion_tokens += d->completion_tokens;
	}
	if (!r->req)
		return;
	if (!finish) {
		/* Who cancelled it decides what the client can do: a stopping
		 * k3d is worth a retry elsewhere or later (503), an operator's
		 * 'k3ctl cancel' is final. */
		const char *why = "the engine failed during generation", *code = NULL;
		int status = 500;

		if (d->finish == K3_FINISH_CANCELLED && d->cancel_reason == K3_CANCEL_SHUTDOWN) {
			status = 503;
			code = "shutting_down";
			why = GW_DRAINING_CUT;
		} else if (d->finish == K3_FINISH_CANCELLED && d->cancel_reason == K3_CANCEL_BY_ID) {
			code = "cancelled";
			why = "an operator cancelled this generation in k3d ('k3ctl cancel')";
		} else if (d->finish == K3_FINISH_CANCELLED) {
			why = "the generation was cancelled in k3d";
		}
		if (r->started)
			sse_fail(r, status, "server_error", code, why);
		else
			send_error(r, status, "server_error", NULL, code, "%s", why);
		return;
	}
	if (r->oai.stream) {
		if (!r->started)
			sse_start(r);
		sse_delta(r, json_object(), "", finish);
		if (r->oai.include_usage) {
			json_t *c = chunk_base(r);

			json_object_set_new(c, "choices", json_array());
			json_object_set_new(c, "usage", usage_json(d));
			sse_event(r, c);
		}
		sse_write(r, "data: [DONE]\n\n", 14);
		sse_end(r, 200);
		return;
	}
	json_t *resp = json_pack("{s:s,s:s,s:I,s:s}", "id", r->cmpl_id, "object",
				 r->oai.ep == GW_EP_CHAT ? "chat.completion" : "text_completion", "created",
				 (json_int_t)r->created, "model", r->model);
	json_t *choice;

	if (r->oai.ep == GW_EP_CHAT) {
		json_t *msg = json_pack("{s:s}", "role", "assistant");
		bool calls = r->tool_calls && json_array_size(r->tool_calls);

		json_object_set_new(msg, "content", calls && evbuffer_get_length(r->content) == 0
							    ? json_null() : buf_string(r->content));
		json_object_set_new(msg, "refusal", json_null());
		if (evbuffer_get_length(r->reasoning))
			json_object_set_new(msg, "reasoning_content", buf_string(r->reasoning));
		if (calls) {
			size_t i;
			json_t *c;

			json_array_foreach(r->tool_calls, i, c)
				json_object_del(c, "__index");
			json_object_set(msg, "tool_calls", r->tool_calls);
		}
		choice = json_pack("{s:i,s:o,s:n,s:s}", "index", 0, "message", msg, "logprobs", "finish_reason",
				   finish);
	} else {
		evbuffer_add_buffer(r->content, r->reasoning);
		choice = json_pack("{s:o,s:i,s:n,s:s}", "text", buf_string(r->content), "index", 0, "logprobs",
				   "finish_reason", finish);
	}
	json_object_set_new(resp, "choices", json_pack("[o]", choice));
	json_object_set_new(resp, "usage", usage_json(d));
	send_json(r, 200, resp);
}

static void on_token(struct gw_req *r, const struct k3_msg_token *t)
{
	bool reasoning = t->has_channel && t->channel == K3_CHANNEL_REASONING;

	if (!r->req || !t->has_text || t->text.len == 0)
		return;
	if (!r->oai.stream) {
		evbuffer_add(reasoning ? r->reasoning : r->content, t->text.p, t->text.len);
		return;
	}
	if (!r->started)
		sse_start(r);
	if (r->oai.ep == GW_EP_CHAT) {
		json_t *delta = json_object();

		json_object_set_new(delta, reasoning ? "reasoning_content" : "content",
				    json_stringn(t->text.p, t->text.len));
		sse_delta(r, delta, NULL, NULL);
	} else {
		char *s = strndup(t->text.p, t->text.len);

		sse_delta(r, NULL, s, NULL);
		free(s);
	}
}

static void on_tool_call(struct gw_req *r, const struct k3_msg_tool_call *tc)
{
	json_t *name = tc->has_name ? json_stringn(tc->name.p, tc->name.len) : NULL;
	json_t *args = json_stringn(tc->has_arguments ? tc->arguments.p : "", tc->has_arguments ? tc->arguments.len : 0);
	char idx[16], gen_id[40];
	json_t *id;

	if (!r->req || r->oai.ep != GW_EP_CHAT) {
		json_decref(name);
		json_decref(args);
		return;
	}
	snprintf(idx, sizeof(idx), "%u", tc->index);
	if (tc->has_id && tc->id.len) {
		id = json_stringn(tc->id.p, tc->id.len);
	} else {
		memcpy(gen_id, "call_", 5);
		random_hex(gen_id + 5, 12);
		id = json_string(gen_id);
	}
	if (!r->oai.stream) {
		json_t *call = NULL;
		size_t i;
		json_t *c;

		json_array_foreach(r->tool_calls, i, c) {
			if (json_integer_value(json_object_get(c, "__index")) == (json_int_t)tc->index)
				call = c;
		}
		if (!call) {
			call = json_pack("{s:I,s:o,s:s,s:{s:s,s:s}}", "__index", (json_int_t)tc->index, "id",
					 json_incref(id), "type", "function", "function", "name", "", "arguments", "");
			json_array_append_new(r->tool_calls, call);
		}
		json_t *fn = json_object_get(call, "function");
		if (name)
			json_object_set(fn, "name", name);
		char *joined = NULL;
		if (asprintf(&joined, "%s%s", json_string_value(json_object_get(fn, "arguments")),
			     json_string_value(args)) >= 0) {
			json_object_set_new(fn, "arguments", json_string(joined));
			free(joined);
		}
		json_decref(name);
		json_decref(args);
		json_decref(id);
		return;
	}
	if (!r->started)
		sse_start(r);
	json_t *call = json_pack("{s:I}", "index", (json_int_t)tc->index);
	json_t *fn = json_object();

	/* id, type and name go out once per call, in its first delta: the SDK
	 * accumulates string fields, so repeating them would corrupt them. */
	if (!json_object_get(r->tool_seen, idx)) {
		json_object_set_new(r->tool_seen, idx, json_true());
		json_object_set(call, "id", id);
		json_object_set_new(call, "type", json_string("function"));
		json_object_set_new(fn, "name", name ? json_incref(name) : json_string(""));
	}
	json_object_set(fn, "arguments", args);
	json_object_set_new(call, "function", fn);
	sse_delta(r, json_pack("{s:[o]}", "tool_calls", call), NULL, NULL);
	json_decref(name);
	json_decref(args);
	json_decref(id);
}

static void send_draining(struct gw_req *r)
{
	send_error(r, 503, "server_error", NULL, "shutting_down", "%s", GW_DRAINING_REQUEST);
}

/* An ERROR for the GENERATE: its HTTP form, or the same error as an SSE
 * event when the stream's headers are out (a queued stream that k3d drops
 * while draining). */
static void on_generate_error(struct gw_req *r, const struct k3_msg_error *e)
{
	/* text: msg and the longest sentence around it (send_error caps it) */
	char msg[K3_LIM_MESSAGE_MAX + 1], param[K3_LIM_NAME_MAX + 1], text[K3_LIM_MESSAGE_MAX + 512];
	const char *type = "server_error", *eparam = NULL, *code = NULL;
	int status;

	snprintf(msg, sizeof(msg), "%.*s", (int)e->message.len, e->message.p ? e->message.p : "");
	snprintf(param, sizeof(param), "%.*s", e->has_param ? (int)e->param.len : 0,
		 e->has_param ? e->param.p : "");
	/* k3d names GENERATE fields; the client knows its OpenAI fields. */
	if (strcmp(param, "max_new") == 0)
		snprintf(param, sizeof(param), "%s", r->oai.max_param ? r->oai.max_param : "max_tokens");
	else if (strcmp(param, "prompt") == 0 && r->oai.ep == GW_EP_CHAT)
		snprintf(param, sizeof(param), "messages");
	switch (e->status) {
	case K3_STATUS_BUSY:
		status = 429;
		type = "rate_limit_error";
		code = "rate_limit_exceeded";
		snprintf(text, sizeof(text), "k3d is busy: its generation slot and queue are full (%s). Retry "
			 "after the Retry-After delay.", msg);
		break;
	case K3_STATUS_NOT_READY:
		status = 503;
		code = "model_not_ready";
		snprintf(text, sizeof(text), "k3d is still loading the model: %s", msg);
		break;
	case K3_STATUS_SHUTTING_DOWN:
		/* k3d's own message ("k3d is shutting down") would only repeat
		 * what the status says. */
		status = 503;
		code = "shutting_down";
		snprintf(text, sizeof(text), "%s", GW_DRAINING_REQUEST);
		break;
	case K3_STATUS_CONTEXT_EXCEEDED: {
		/* k3d quotes the max_new it got; a larger value was sent as
		 * the wire bound, so name what the client asked for. */
		char asked[128] = "";
		if (r->oai.has_max_new && r->oai.max_asked > (long long)r->oai.max_new &&
		    strcmp(param, r->oai.max_param ? r->oai.max_param : "max_tokens") == 0)
			snprintf(asked, sizeof(asked), " ('%.32s' was %lld, sent to k3d as its bound %u)",
				 param, r->oai.max_asked, (unsigned)r->oai.max_new);
		status = 400;
		type = "invalid_request_error";
		eparam = param[0] ? param : "messages";
		code = "context_length_exceeded";
		snprintf(text, sizeof(text), "%s%s%s", strstr(msg, "maximum context length") ? "" :
			 "This model's maximum context length was exceeded: ", msg, asked);
		break;
	}
	case K3_STATUS_INVALID_ARGUMENT:
	case K3_STATUS_BAD_REQUEST:
		status = 400;
		type = "invalid_request_error";
		eparam = param;
		code = "invalid_value";
		snprintf(text, sizeof(text), "%s", msg);
		break;
	case K3_STATUS_UNSUPPORTED:
		status = 400;
		type = "invalid_request_error";
		eparam = param;
		code = "unsupported_value";
		snprintf(text, sizeof(text), "%s", msg);
		break;
	case K3_STATUS_TOO_LARGE:
		status = 413;
		type = "invalid_request_error";
		eparam = param;
		snprintf(text, sizeof(text), "%s", msg);
		break;
	default:
		status = 500;
		snprintf(text, sizeof(text), "k3d failed: %s", msg);
		break;
	}
	if (r->started)
		sse_fail(r, status, type, code, text);
	else
		send_error(r, status, type, eparam, code, "%s", text);
}

static void daemon_close(struct gw_req *r)
{
	if (!r->d)
		return;
	gw_daemon_free(r->d);
	r->d = NULL;
	if (r->counted)
		r->g->m.in_flight--;
	r->counted = false;
}

static void send_generate(struct gw_req *r)
{
	struct k3_msg_generate gen;
	int rc;

	gw_openai_to_generate(&r->oai, &gen);
	rc = gw_daemon_send(r->d, K3_MSG_GENERATE, RID_GENERATE, &gen);
	if (rc < 0) {
		send_error(r, 400, "invalid_request_error", NULL, NULL,
			   "The request cannot be sent to k3d (%s): a field is over a protocol limit.",
			   k3_proto_error_name(rc));
		daemon_close(r);   /* the caller (daemon_frame) frees r */
		return;
	}
	r->generate_sent = true;
}

/* ---- the k3d conversation ----------------------------------------------- */

/* /health: 200 {"status":"ok","model":ID} when model is set, else 503
 * {"status":STATE,"error":WHY} with Retry-After. STATE tells a load
 * balancer or an operator which not-ready case this is: "loading",
 * "draining", "no_model" (what k3d said in HELLO_OK) or "unavailable" (no
 * connection, no handshake in time, or k3d refused the connection); WHY
 * is a sentence with what to check. */
static void health_reply(struct gw_req *r, const char *model, const char *state, const char *why)
{
	if (!r->req)
		return;
	if (model) {
		send_json(r, 200, json_pack("{s:s,s:s}", "status", "ok", "model", model));
	} else {
		char ra[16];

		snprintf(ra, sizeof(ra), "%u", r->g->cfg.retry_after_s);
		evhttp_add_header(evhttp_request_get_output_headers(r->req), "Retry-After", ra);
		send_json(r, 503, json_pack("{s:s,s:s}", "status", state, "error", why));
	}
}

/* /health when k3d cannot be talked to: why is gw_daemon's sentence (it
 * names the socket path and the errno text). */
static void health_unavailable(struct gw_req *r, const char *why)
{
	char msg[512];

	snprintf(msg, sizeof(msg), "%s; is k3d running? (systemctl status k3d)", why);
	health_reply(r, NULL, "unavailable", msg);
}

/* /health from the state in HELLO_OK. */
static void health_from_state(struct gw_req *r, unsigned state)
{
	char msg[256];

	switch (state) {
	case K3_STATE_READY:
		health_reply(r, r->model, NULL, NULL);
		break;
	case K3_STATE_LOADING:
		health_reply(r, NULL, "loading", "k3d is loading the model; retry after Retry-After seconds");
		break;
	case K3_STATE_DRAINING:
		health_reply(r, NULL, "draining", GW_DRAINING_WHY);
		break;
	case K3_STATE_NO_MODEL:
		health_reply(r, NULL, "no_model", "k3d has no model loaded; start it with --model DIR");
		break;
	default:
		snprintf(msg, sizeof(msg), "k3d reported an unknown state %u", state);
		health_reply(r, NULL, "unavailable", msg);
		break;
	}
}

static void metrics_reply(struct gw_req *r, const struct k3_msg_status_reply *st)
{
	struct evbuffer *b = evbuffer_new();
	size_t n;

	gw_metrics_render(&r->g->m, st, b);
	n = evbuffer_get_length(b);
	send_body(r, 200, "text/plain; version=0.0.4; charset=utf-8", (const char *)evbuffer_pullup(b, (ev_ssize_t)n),
		  n);
	evbuffer_free(b);
}

static json_t *model_object(struct gw_req *r)
{
	return json_pack("{s:s,s:s,s:I,s:s}", "id", r->model, "object", "model", "created",
			 (json_int_t)r->g->started, "owned_by", "k3d");
}

static void on_hello_ok(struct gw_req *r, const struct k3_msg_hello_ok *h)
{
	bool ready = h->state == K3_STATE_READY;

	snprintf(r->model, sizeof(r->model), "%.*s", h->has_model ? (int)h->model.len : 0,
		 h->has_model ? h->model.p : "");
	if (!r->model[0])
		snprintf(r->model, sizeof(r->model), "kimi-k3");
	switch (r->kind) {
	case K_HEALTH:
		health_from_state(r, h->state);
		daemon_close(r);
		break;
	case K_METRICS: {
		struct k3_msg_status st = { 0 };
		struct timeval tv = { (time_t)r->g->cfg.daemon_timeout_s, 0 };

		if (gw_daemon_send(r->d, K3_MSG_STATUS, RID_STATUS, &st) < 0) {
			metrics_reply(r, NULL);
			daemon_close(r);
			break;
		}
		/* A k3d that took the connection and answered HELLO but never
		 * answers STATUS must not hold the scrape forever: timer_cb. */
		event_del(r->timer);
		event_add(r->timer, &tv);
		break;
	}
	case K_MODELS:
	case K_MODEL_ONE:
		if (!h->has_model || h->state == K3_STATE_NO_MODEL) {
			send_error(r, 503, "server_error", NULL, "model_not_ready", "k3d has no model loaded yet.");
		} else if (r->kind == K_MODELS) {
			send_json(r, 200, json_pack("{s:s,s:[o]}", "object", "list", "data", model_object(r)));
		} else if (strcmp(r->model_query, r->model) == 0) {
			send_json(r, 200, model_object(r));
		} else {
			send_error(r, 404, "invalid_request_error", "model", "model_not_found",
				   "The model `%s` does not exist or you do not have access to it. This server "
				   "serves `%s`.", r->model_query, r->model);
		}
		daemon_close(r);
		break;
	case K_GENERATE:
		if (!ready) {
			if (h->state == K3_STATE_DRAINING)
				send_draining(r);
			else if (h->state == K3_STATE_LOADING)
				send_error(r, 503, "server_error", NULL, "model_not_ready",
					   "k3d is still loading the model; retry after the Retry-After delay.");
			else if (h->state == K3_STATE_NO_MODEL)
				send_error(r, 503, "server_error", NULL, "model_not_ready",
					   "k3d has no model loaded; start it with --model DIR.");
			else
				send_error(r, 503, "server_error", NULL, "model_not_ready",
					   "k3d is not ready (state %u).", h->state);
			daemon_close(r);
			break;
		}
		send_generate(r);
		break;
	}
}

static void daemon_frame(struct gw_daemon *d, const struct k3_proto_header *h, const union k3_proto_body *b,
			 void *arg)
{
	struct gw_req *r = arg;

	(void)d;
	switch (h->type) {
	case K3_MSG_HELLO_OK:
		on_hello_ok(r, &b->hello_ok);
		break;
	case K3_MSG_STATUS_REPLY:
		if (r->kind == K_METRICS) {
			event_del(r->timer);
			metrics_reply(r, &b->status_reply);
			daemon_close(r);
		}
		break;
	case K3_MSG_ACCEPTED:
		r->accepted = true;
		/* Admitted (running or queued): a stream can start now, and its
		 * keep-alives cover the queue wait and the prefill. */
		if (r->req && r->oai.stream && !r->started)
			sse_start(r);
		break;
	case K3_MSG_TOKEN:
		if (h->request_id == RID_GENERATE)
			on_token(r, &b->token);
		break;
	case K3_MSG_TOOL_CALL:
		if (h->request_id == RID_GENERATE)
			on_tool_call(r, &b->tool_call);
		break;
	case K3_MSG_DONE:
		if (h->request_id != RID_GENERATE)
			break;
		on_done(r, &b->done);
		daemon_close(r);
		break;
	case K3_MSG_ERROR:
		if (h->request_id == RID_GENERATE && r->generate_sent) {
			if (r->req)
				on_generate_error(r, &b->error);
			r->done = true;
			daemon_close(r);
		} else if (h->request_id == RID_HELLO || h->request_id == RID_STATUS) {
			char why[300];

			snprintf(why, sizeof(why), "k3d refused the %s: %.*s",
				 h->request_id == RID_HELLO ? "connection" : "status request",
				 (int)b->error.message.len, b->error.message.p ? b->error.message.p : "");
			if (r->kind == K_METRICS)
				metrics_reply(r, NULL);
			else if (r->kind == K_HEALTH && b->error.status == K3_STATUS_SHUTTING_DOWN)
				health_reply(r, NULL, "draining", why);
			else if (b->error.status == K3_STATUS_UNAUTHORIZED) {
				/* k3d is running; "is k3d running?" would mislead, and
				 * only the operator can fix it. */
				char msg[512];

				snprintf(msg, sizeof(msg), "%s; k3d is running but does not allow the "
					 "gateway's user: add it with k3d --allow-uid or --allow-gid", why);
				if (r->kind == K_HEALTH)
					health_reply(r, NULL, "unavailable", msg);
				else
					send_error(r, 503, "server_error", NULL, "unauthorized", "%s", msg);
			} else if (r->kind == K_HEALTH)
				health_unavailable(r, why);
			else if (b->error.status == K3_STATUS_SHUTTING_DOWN)
				send_draining(r);
			else
				send_error(r, 503, "server_error", NULL, NULL, "%s", why);
			daemon_close(r);
		}
		break;
	default:
		break;   /* PROGRESS, OK (the CANCEL's answer), PONG */
	}
	req_maybe_free(r);
}

static void daemon_fail(struct gw_daemon *d, const char *why, void *arg)
{
	struct gw_req *r = arg;

	(void)d;
	if (r->req) {
		switch (r->kind) {
		case K_HEALTH:
			health_unavailable(r, why);
			break;
		case K_METRICS:
			metrics_reply(r, NULL);
			break;
		default:
			if (r->started)
				sse_fail(r, 500, "server_error", NULL, why);
			else if (r->accepted)
				send_error(r, 500, "server_error", NULL, NULL, "k3d failed during the request: %s", why);
			else
				send_error(r, 503, "server_error", NULL, NULL, "k3d is not available: %s", why);
		}
	}
	daemon_close(r);
	req_maybe_free(r);
}

/* ---- client disconnects ------------------------------------------------- */

static void client_gone(struct gw_req *r)
{
	struct timeval grace = { GW_CANCEL_GRACE_S, 0 };

	if (!r->req)
		return;
	http_finished(r, 499);
	event_del(r->timer);
	if (!r->d)
		return;
	if (r->kind == K_GENERATE && r->generate_sent && !r->done) {
		struct k3_msg_cancel c = { 0 };

		/* CANCEL at once; closing the connection after DONE (or after the
		 * grace) cancels too, so a lost CANCEL cannot keep the slot. */
		if (gw_daemon_send(r->d, K3_MSG_CANCEL, RID_GENERATE, &c) == 0) {
			r->cancel_sent = true;
			r->g->m.cancels_sent++;
			event_add(r->timer, &grace);
			return;
		}
	}
	daemon_close(r);
}

static void on_close(struct evhttp_connection *evcon, void *arg)
{
	struct gw_req *r = arg;
	struct evhttp_request *req = r->req;

	(void)evcon;
	/* When libevent itself failed the connection (a write error or
	 * timeout mid-reply) it has detached the request and left freeing it
	 * to us; when we freed the connection (eof_cb) the request is still
	 * attached and goes with it. */
	bool detached = req && evhttp_request_get_connection(req) == NULL;

	client_gone(r);
	if (detached)
		evhttp_request_free(req);
	req_maybe_free(r);
}

/* libevent stops reading a connection while its request is processed, so
 * it would notice a client that leaves only at the next write. This
 * watcher notices at once, streaming or not. */
static void eof_cb(evutil_socket_t fd, short what, void *arg)
{
	struct gw_req *r = arg;
	char c;
	ssize_t n;

	(void)what;
	if (!r->req)
		return;
	n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
	if (n > 0)
		return;        /* a pipelined request: not a disconnect; stop watching */
	if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
		event_add(r->eof_ev, NULL);
		return;
	}
	/* Freeing the connection runs on_close, which cancels the job. */
	evhttp_connection_free(r->evcon);
}

static void req_maybe_free(struct gw_req *r)
{
	if (r->req || r->d)
		return;
	if (r->eof_ev)
		event_free(r->eof_ev);
	if (r->timer)
		event_free(r->timer);
	gw_openai_request_release(&r->oai);
	free(r->model_query);
	if (r->content)
		evbuffer_free(r->content);
	if (r->reasoning)
		evbuffer_free(r->reasoning);
	json_decref(r->tool_calls);
	json_decref(r->tool_seen);
	free(r);
}

static void timer_cb(evutil_socket_t fd, short what, void *arg)
{
	struct gw_req *r = arg;

	if (r->req && r->kind == K_METRICS) {
		/* STATUS sent after the handshake, no STATUS_REPLY in time: the
		 * same answer as a k3d that is down (200, the gateway's own
		 * metrics, k3_gateway_daemon_up 0), because a scraper keeps a
		 * 200 series and alerts on daemon_up, where a 503 would only
		 * drop the gateway's counters from the scrape. */
		metrics_reply(r, NULL);
		daemon_close(r);
		req_maybe_free(r);
		return;
	}
	if (r->req) {
		keepalive_cb(fd, what, arg);
		return;
	}
	/* Cancel grace over: drop the connection, which cancels (rule 6). */
	daemon_close(r);
	req_maybe_free(r);
}

/* Opens the k3d connection for r; replies 503 itself on failure. */
static void start_daemon(struct gw_req *r)
{
	r->d = gw_daemon_open(r->g->base, r->g->cfg.socket_path, r->g->cfg.daemon_timeout_s, daemon_frame,
			      daemon_fail, r);
	if (!r->d) {
		send_error(r, 503, "server_error", NULL, NULL, "k3d is not available: out of memory");
		return;
	}
	/* The probes are not counted: a scrape would otherwise always see its
	 * own STATUS connection, and an idle gateway would never read 0. */
	r->counted = r->kind != K_HEALTH && r->kind != K_METRICS;
	if (r->counted)
		r->g->m.in_flight++;
	if (r->evcon) {
		struct bufferevent *bev = evhttp_connection_get_bufferevent(r->evcon);
		evutil_socket_t fd = bev ? bufferevent_getfd(bev) : -1;

		evhttp_connection_set_closecb(r->evcon, on_close, r);
		if (fd >= 0) {
			r->eof_ev = event_new(r->g->base, fd, EV_READ, eof_cb, r);
			if (r->eof_ev)
				event_add(r->eof_ev, NULL);
		}
	}
}

/* ---- request parsing ----------------------------------------------------- */

static bool json_too_deep(json_t *v, unsigned depth)
{
	size_t i;
	const char *k;
	json_t *c;

	if (depth > K3_LIM_JSON_DEPTH)
		return true;
	if (json_is_array(v)) {
		json_array_foreach(v, i, c)
			if (json_too_deep(c, depth + 1))
				return true;
	} else if (json_is_object(v)) {
		json_object_foreach(v, k, c)
			if (json_too_deep(c, depth + 1))
				return true;
	}
	return false;
}

static bool content_type_json(struct evhttp_request *req)
{
	const char *ct = evhttp_find_header(evhttp_request_get_input_headers(req), "Content-Type");
	size_t n = strlen("application/json");

	if (!ct)
		return false;
	while (*ct == ' ')
		ct++;
	return strncasecmp(ct, "application/json", n) == 0 && (ct[n] == 0 || ct[n] == ';' || ct[n] == ' ');
}

static void handle_generate(struct gw_req *r, enum gw_endpoint ep)
{
	struct evbuffer *in = evhttp_request_get_input_buffer(r->req);
	size_t len = evbuffer_get_length(in);
	struct gw_openai_error e = { 0 };
	json_error_t je;
	json_t *body;

	if (!content_type_json(r->req)) {
		send_error(r, 415, "invalid_request_error", NULL, "unsupported_media_type",
			   "Unsupported Content-Type: send the body as 'application/json'.");
		return;
	}
	if (len > r->g->cfg.max_body) {
		send_error(r, 413, "invalid_request_error", NULL, "request_too_large",
			   "The request body has %zu bytes; this server accepts at most %llu (--max-body).", len,
			   (unsigned long long)r->g->cfg.max_body);
		return;
	}
	body = json_loadb(len ? (const char *)evbuffer_pullup(in, (ev_ssize_t)len) : "", len,
			  JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &je);
	if (!body) {
		send_error(r, 400, "invalid_request_error", NULL, NULL,
			   "We could not parse the JSON body of your request (%s at line %d, column %d). The "
			   "body must be valid JSON.", je.text, je.line, je.column);
		return;
	}
	if (json_too_deep(body, 0)) {
		json_decref(body);
		send_error(r, 400, "invalid_request_error", NULL, NULL,
			   "The JSON body nests deeper than %u levels.", K3_LIM_JSON_DEPTH);
		return;
	}
	if (gw_openai_parse(ep, body, &r->oai, &e) < 0) {
		json_decref(body);
		send_error(r, e.status, "invalid_request_error", e.param, e.code, "%s", e.message);
		return;
	}
	json_decref(body);
	memcpy(r->cmpl_id, ep == GW_EP_CHAT ? "chatcmpl-" : "cmpl-", ep == GW_EP_CHAT ? 9 : 5);
	random_hex(r->cmpl_id + (ep == GW_EP_CHAT ? 9 : 5), 12);
	r->content = evbuffer_new();
	r->reasoning = evbuffer_new();
	r->tool_calls = json_array();
	r->tool_seen = json_object();
	start_daemon(r);
}

/* ---- routing ------------------------------------------------------------- */

static bool authorized(struct gw_req *r)
{
	const char *h, *key = r->g->cfg.api_key;
	size_t kl, hl;
	unsigned char diff = 0;

	if (!key)
		return true;
	h = evhttp_find_header(evhttp_request_get_input_headers(r->req), "Authorization");
	if (!h || strncasecmp(h, "Bearer ", 7) != 0)
		return false;
	h += 7;
	kl = strlen(key);
	hl = strlen(h);
	/* Constant time in the key's length. */
	for (size_t i = 0; i < kl; i++)
		diff |= (unsigned char)key[i] ^ (unsigned char)(i < hl ? h[i] : 0);
	return diff == 0 && hl == kl;
}

/* Collapses repeated slashes and drops a trailing one: /v1//models/ ->
 * /v1/models. */
static void normalize_path(const char *in, char *out, size_t cap)
{
	size_t o = 0;

	for (; *in && *in != '?' && *in != '#' && o + 1 < cap; in++) {
		if (*in == '/' && o && out[o - 1] == '/')
			continue;
		out[o++] = *in;
	}
	if (o > 1 && out[o - 1] == '/')
		o--;
	if (o == 0)
		out[o++] = '/';
	out[o] = 0;
}

struct route {
	const char *path;
	bool prefix;                     /* path + "/{id}" */
	unsigned methods;                /* EVHTTP_REQ_* */
	const char *allow;
	enum gw_ep_metric mep;
};

static const struct route routes[] = {
	{ "/v1/chat/completions", false, EVHTTP_REQ_POST, "POST, OPTIONS", GW_M_CHAT },
	{ "/v1/completions", false, EVHTTP_REQ_POST, "POST, OPTIONS", GW_M_COMPLETIONS },
	{ "/v1/models", false, EVHTTP_REQ_GET | EVHTTP_REQ_HEAD, "GET, HEAD, OPTIONS", GW_M_MODELS },
	{ "/v1/models", true, EVHTTP_REQ_GET | EVHTTP_REQ_HEAD, "GET, HEAD, OPTIONS", GW_M_MODELS },
	{ "/health", false, EVHTTP_REQ_GET | EVHTTP_REQ_HEAD, "GET, HEAD, OPTIONS", GW_M_HEALTH },
	{ "/metrics", false, EVHTTP_REQ_GET, "GET, OPTIONS", GW_M_METRICS },
};

static void gencb(struct evhttp_request *req, void *arg)
{
	struct gw *g = arg;
	struct gw_req *r = calloc(1, sizeof(*r));
	/* The raw target, not the parsed URI: "//v1/models" would parse as
	 * host "v1" and path "/models". */
	const char *raw = evhttp_request_get_uri(req);
	enum evhttp_cmd_type cmd = evhttp_request_get_command(req);
	const struct route *rt = NULL;
	char path[1024];

	if (!r) {
		evhttp_send_reply(req, 500, NULL, NULL);
		return;
	}
	r->g = g;
	r->req = req;
	r->evcon = evhttp_request_get_connection(req);
	r->mep = GW_M_OTHER;
	r->created = (long long)time(NULL);
	memcpy(r->req_id, "req_", 4);
	random_hex(r->req_id + 4, 16);
	r->timer = evtimer_new(g->base, timer_cb, r);
	normalize_path(raw && raw[0] ? raw : "/", path, sizeof(path));
	gettimeofday(&r->t0, NULL);
	snprintf(r->line, sizeof(r->line), "%s %.140s", method_name(cmd), path);

	for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++) {
		size_t n = strlen(routes[i].path);

		if (!routes[i].prefix ? strcmp(path, routes[i].path) == 0
				      : strncmp(path, routes[i].path, n) == 0 && path[n] == '/' && path[n + 1]) {
			rt = &routes[i];
			break;
		}
	}
	if (!rt) {
		send_error(r, 404, "invalid_request_error", NULL, NULL, "Invalid URL (%s %s)", method_name(cmd), path);
		goto out;
	}
	r->mep = rt->mep;
	if (cmd == EVHTTP_REQ_OPTIONS) {
		struct evkeyvalq *in = evhttp_request_get_input_headers(req);
		struct evkeyvalq *h = evhttp_request_get_output_headers(req);
		const char *o = cors_origin(g, req);

		evhttp_add_header(h, "Allow", rt->allow);
		if (o) {
			const char *rh = evhttp_find_header(in, "Access-Control-Request-Headers");
			char hdrs[1024];
			size_t k = 0;

			/* Echo the requested header names (token characters only):
			 * the SDK sends x-stainless-*, and '*' would not cover
			 * Authorization. */
			for (const char *p = rh ? rh : ""; *p && k + 1 < sizeof(hdrs); p++)
				if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
				    *p == '-' || *p == '_' || *p == ',' || *p == ' ')
					hdrs[k++] = *p;
			hdrs[k] = 0;
			evhttp_add_header(h, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
			evhttp_add_header(h, "Access-Control-Allow-Headers",
					  k ? hdrs : "authorization, content-type");
			evhttp_add_header(h, "Access-Control-Max-Age", "600");
			if (evhttp_find_header(in, "Access-Control-Request-Private-Network"))
				evhttp_add_header(h, "Access-Control-Allow-Private-Network", "true");
		}
		common_headers(r);
		http_finished(r, 204);
		evhttp_send_reply(req, 204, "No Content", NULL);
		goto out;
	}
	if (!(rt->methods & cmd)) {
		evhttp_add_header(evhttp_request_get_output_headers(req), "Allow", rt->allow);
		send_error(r, 405, "invalid_request_error", NULL, "method_not_allowed",
			   "Method %s is not allowed on %s; allowed: %s.", method_name(cmd), path, rt->allow);
		goto out;
	}
	if (rt->mep != GW_M_HEALTH && !authorized(r)) {
		send_error(r, 401, "invalid_request_error", NULL, "invalid_api_key",
			   "Incorrect or missing API key: send 'Authorization: Bearer <key>' with the key from "
			   "k3-gateway's --api-key-file.");
		goto out;
	}
	switch (rt->mep) {
	case GW_M_CHAT:
	case GW_M_COMPLETIONS:
		r->kind = K_GENERATE;
		handle_generate(r, rt->mep == GW_M_CHAT ? GW_EP_CHAT : GW_EP_COMPLETIONS);
		break;
	case GW_M_MODELS:
		r->kind = rt->prefix ? K_MODEL_ONE : K_MODELS;
		if (rt->prefix) {
			char *dec = evhttp_uridecode(path + strlen(rt->path) + 1, 0, NULL);

			r->model_query = dec ? dec : strdup("");
		}
		start_daemon(r);
		break;
	case GW_M_HEALTH:
		r->kind = K_HEALTH;
		start_daemon(r);
		break;
	case GW_M_METRICS:
		r->kind = K_METRICS;
		start_daemon(r);
		break;
	default:
		break;
	}
out:
	req_maybe_free(r);
}

void gw_http_setup(struct gw *g)
{
	uint64_t backstop = g->cfg.max_body * 2 + (1u << 20);

	evhttp_set_gencb(g->http, gencb, g);
	/* Every method reaches gencb, so a wrong one gets our JSON 405 rather
	 * than libevent's HTML 501. */
	evhttp_set_allowed_methods(g->http, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_HEAD | EVHTTP_REQ_PUT |
						    EVHTTP_REQ_DELETE | EVHTTP_REQ_OPTIONS | EVHTTP_REQ_TRACE |
						    EVHTTP_REQ_CONNECT | EVHTTP_REQ_PATCH);
	/* Our limit answers in JSON from gencb; libevent's cap (which answers
	 * with its own HTML 413 and no body read) is only a backstop against
	 * bodies far beyond it. */
	evhttp_set_max_body_size(g->http, (ev_ssize_t)(backstop > (uint64_t)INT64_MAX / 2 ? (uint64_t)INT64_MAX / 2
											      : backstop));
	evhttp_set_max_headers_size(g->http, K3_LIM_HTTP_HEADERS);
	evhttp_set_timeout(g->http, (int)g->cfg.read_timeout_s);
	evhttp_set_default_content_type(g->http, "application/json");
	/* Past the backstop libevent drains the body before its 413, so the
	 * client still reads the status instead of a reset. */
	evhttp_set_flags(g->http, EVHTTP_SERVER_LINGERING_CLOSE);
}

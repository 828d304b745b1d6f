/*
 * gw_relay.c - the k3d side of each k3-gateway request (gw_req.h): one k3
 * protocol connection per request (HELLO, then GENERATE, STATUS or
 * nothing), its frames relayed to the client through gw_http.c's
 * transport and shaped by the OpenAI dialect (gw_openai_reply.h), the
 * answers of /health and /metrics from what k3d said (HELLO_OK, STATUS), and the CANCEL when
 * a client leaves (docs/k3-gateway.md, "Request lifecycle").
 */
#include "gw_req.h"

#include <stdio.h>
#include <string.h>

#include <event2/buffer.h>

#include "gw_daemon.h"

/* The protocol request ids of a request's connection (protocol rule 2). */
enum { RID_HELLO = 0, RID_GENERATE = 1, RID_STATUS = 2 };

/* How long a cancelled job may take to report DONE before the gateway
 * closes its k3d connection anyway (which cancels it too, rule 6). */
#define GW_CANCEL_GRACE_S 5

/* ---- generation results ------------------------------------------------ */

static void on_done(struct gw_req *r, const struct k3_msg_done *d)
{
	const char *finish = gw_openai_finish_reason(r->oai.ep, d);
	struct gw_metrics *m = &r->g->m;
	json_t *usage;

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
		struct gw_openai_reply_error e;

		gw_openai_done_error(d, &e);
		gw_http_reply_error(r, &e);
		return;
	}
	if (r->oai.stream) {
		if (!r->started)
			gw_http_sse_start(r);
		gw_http_sse_event(r, gw_openai_reply_final_chunk(&r->rp, finish));
		if ((usage = gw_openai_reply_usage_chunk(&r->rp, d)))
			gw_http_sse_event(r, usage);
		gw_http_sse_write(r, "data: [DONE]\n\n", 14);
		gw_http_sse_end(r, 200);
		return;
	}
	gw_http_send_json(r, 200, gw_openai_reply_completion(&r->rp, d, finish));
}

static void on_token(struct gw_req *r, const struct k3_msg_token *t)
{
	json_t *chunk;

	if (!r->req || !(chunk = gw_openai_reply_token(&r->rp, t)))
		return;
	if (!r->started)
		gw_http_sse_start(r);
	gw_http_sse_event(r, chunk);
}

static void on_tool_call(struct gw_req *r, const struct k3_msg_tool_call *tc)
{
	char fallback_id[40];
	json_t *chunk;

	if (!r->req)
		return;
	memcpy(fallback_id, "call_", 5);
	gw_http_random_hex(fallback_id + 5, 12);
	if (!(chunk = gw_openai_reply_tool_call(&r->rp, tc, fallback_id)))
		return;
	if (!r->started)
		gw_http_sse_start(r);
	gw_http_sse_event(r, chunk);
}

static void send_draining(struct gw_req *r)
{
	struct gw_openai_reply_error e;

	gw_openai_state_error(K3_STATE_DRAINING, &e);
	gw_http_reply_error(r, &e);
}

void gw_relay_close(struct gw_req *r)
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
		gw_http_send_error(r, 400, "invalid_request_error", NULL, NULL,
				   "The request cannot be sent to k3d (%s): a field is over a protocol limit.",
				   k3_proto_error_name(rc));
		gw_relay_close(r);   /* the caller (daemon_frame) frees r */
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
 * is a sentence with what to check. k3d_text (NULL: none) is STATUS's
 * status text, added as "k3d" (a streaming install's expert progress is
 * there); text that is not valid UTF-8 is left out rather than sent. */
static void health_reply_text(struct gw_req *r, const char *model, const char *state, const char *why,
			      const struct k3_proto_str *k3d_text)
{
	json_t *body;

	if (!r->req)
		return;
	if (model) {
		body = json_pack("{s:s,s:s}", "status", "ok", "model", model);
	} else {
		char ra[16];

		snprintf(ra, sizeof(ra), "%u", r->g->cfg.retry_after_s);
		evhttp_add_header(evhttp_request_get_output_headers(r->req), "Retry-After", ra);
		body = json_pack("{s:s,s:s}", "status", state, "error", why);
	}
	if (body && k3d_text && k3d_text->p) {
		json_t *t = json_stringn(k3d_text->p, k3d_text->len);

		if (t)
			json_object_set_new(body, "k3d", t);
	}
	gw_http_send_json(r, model ? 200 : 503, body);
}

static void health_reply(struct gw_req *r, const char *model, const char *state, const char *why)
{
	health_reply_text(r, model, state, why, NULL);
}

/* /health when k3d cannot be talked to: why is gw_daemon's sentence (it
 * names the socket path and the errno text). */
static void health_unavailable(struct gw_req *r, const char *why)
{
	char msg[512];

	snprintf(msg, sizeof(msg), "%s; is k3d running? (systemctl status k3d)", why);
	health_reply(r, NULL, "unavailable", msg);
}

/* /health from the state in HELLO_OK, with STATUS's text when k3d gave one. */
static void health_from_state(struct gw_req *r, unsigned state, const struct k3_proto_str *k3d_text)
{
	char msg[256];

	switch (state) {
	case K3_STATE_READY:
		health_reply_text(r, r->model, NULL, NULL, k3d_text);
		break;
	case K3_STATE_LOADING:
		health_reply_text(r, NULL, "loading", "k3d is loading the model; retry after Retry-After seconds",
				  k3d_text);
		break;
	case K3_STATE_DRAINING:
		health_reply(r, NULL, "draining", GW_OPENAI_DRAINING_WHY);
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
	gw_http_send_body(r, 200, "text/plain; version=0.0.4; charset=utf-8",
			  (const char *)evbuffer_pullup(b, (ev_ssize_t)n), n);
	evbuffer_free(b);
}

static void on_hello_ok(struct gw_req *r, const struct k3_msg_hello_ok *h)
{
	snprintf(r->model, sizeof(r->model), "%.*s", h->has_model ? (int)h->model.len : 0,
		 h->has_model ? h->model.p : "");
	if (!r->model[0])
		snprintf(r->model, sizeof(r->model), "kimi-k3");
	switch (r->kind) {
	case K_HEALTH:
	case K_METRICS: {
		struct k3_msg_status st = { 0 };
		struct timeval tv = { (time_t)r->g->cfg.daemon_timeout_s, 0 };

		/* /health asks a ready or loading k3d for its STATUS text too (a
		 * streaming install's expert progress); the answer's code still
		 * comes from HELLO_OK alone, so a STATUS that fails or is late
		 * only leaves the text out (gw_relay_timer_cb). */
		r->hello_state = h->state;
		if (r->kind == K_HEALTH && h->state != K3_STATE_READY && h->state != K3_STATE_LOADING) {
			health_from_state(r, h->state, NULL);
			gw_relay_close(r);
			break;
		}
		if (gw_daemon_send(r->d, K3_MSG_STATUS, RID_STATUS, &st) < 0) {
			if (r->kind == K_HEALTH)
				health_from_state(r, h->state, NULL);
			else
				metrics_reply(r, NULL);
			gw_relay_close(r);
			break;
		}
		/* A k3d that took the connection and answered HELLO but never
		 * answers STATUS must not hold the scrape forever: gw_relay_timer_cb. */
		event_del(r->timer);
		event_add(r->timer, &tv);
		break;
	}
	case K_MODELS:
	case K_MODEL_ONE:
		if (!h->has_model || h->state == K3_STATE_NO_MODEL) {
			gw_http_send_error(r, 503, "server_error", NULL, "model_not_ready",
					   "k3d has no model loaded yet.");
		} else if (r->kind == K_MODELS) {
			gw_http_send_json(r, 200, gw_openai_model_list(r->model, (long long)r->g->started));
		} else if (strcmp(r->model_query, r->model) == 0) {
			gw_http_send_json(r, 200, gw_openai_model(r->model, (long long)r->g->started));
		} else {
			gw_http_send_error(r, 404, "invalid_request_error", "model", "model_not_found",
					   "The model `%s` does not exist or you do not have access to it. This server "
					   "serves `%s`.", r->model_query, r->model);
		}
		gw_relay_close(r);
		break;
	case K_GENERATE: {
		struct gw_openai_reply_error e;

		if (gw_openai_state_error(h->state, &e) < 0) {
			gw_http_reply_error(r, &e);
			gw_relay_close(r);
			break;
		}
		send_generate(r);
		break;
	}
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
		if (r->kind == K_METRICS || r->kind == K_HEALTH) {
			event_del(r->timer);
			if (r->kind == K_METRICS)
				metrics_reply(r, &b->status_reply);
			else
				health_from_state(r, r->hello_state, b->status_reply.has_status_text ?
						  &b->status_reply.status_text : NULL);
			gw_relay_close(r);
		}
		break;
	case K3_MSG_ACCEPTED:
		r->accepted = true;
		/* k3d's job id, once, when k3d admits the request: an operator
		 * who sees a long generation can 'k3ctl cancel' it by that id
		 * while it runs (the access line comes only at its end). */
		if (!r->job_id && b->accepted.job_id) {
			char queued[48] = "";

			r->job_id = b->accepted.job_id;
			if (b->accepted.queue_position)
				snprintf(queued, sizeof(queued), ", queued at position %u", b->accepted.queue_position);
			if (!r->g->cfg.quiet)
				fprintf(stderr, "k3-gateway: %s %s job %llu%s\n", r->req_id, r->line,
					(unsigned long long)r->job_id, queued);
		}
		/* Admitted (running or queued): a stream can start now, and its
		 * keep-alives cover the queue wait and the prefill. */
		if (r->req && r->oai.stream && !r->started)
			gw_http_sse_start(r);
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
		gw_relay_close(r);
		break;
	case K3_MSG_ERROR:
		if (h->request_id == RID_GENERATE && r->generate_sent) {
			if (r->req) {
				/* its HTTP form, or the same error as an SSE event when
				 * the stream's headers are out (a queued stream that k3d
				 * drops while draining) */
				struct gw_openai_reply_error e;

				gw_openai_k3d_error(&r->oai, &b->error, &e);
				gw_http_reply_error(r, &e);
			}
			r->done = true;
			gw_relay_close(r);
		} else if (h->request_id == RID_STATUS && r->kind == K_HEALTH) {
			/* HELLO_OK said how k3d is; only the text is missing */
			event_del(r->timer);
			health_from_state(r, r->hello_state, NULL);
			gw_relay_close(r);
		} else if (h->request_id == RID_HELLO || h->request_id == RID_STATUS) {
			char why[300];

			snprintf(why, sizeof(why), "k3d refused the %s: %.*s",
				 h->request_id == RID_HELLO ? "connection" : "status request",
				 (int)b->error.message.len, b->error.message.p ? b->error.message.p : "");
			gw_openai_utf8_trim(why);
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
					gw_http_send_error(r, 503, "server_error", NULL, "unauthorized", "%s", msg);
			} else if (r->kind == K_HEALTH)
				health_unavailable(r, why);
			else if (b->error.status == K3_STATUS_SHUTTING_DOWN)
				send_draining(r);
			else
				gw_http_send_error(r, 503, "server_error", NULL, NULL, "%s", why);
			gw_relay_close(r);
		}
		break;
	default:
		break;   /* PROGRESS, OK (the CANCEL's answer), PONG */
	}
	gw_http_req_maybe_free(r);
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
				gw_http_sse_fail(r, 500, "server_error", NULL, why);
			else if (r->accepted)
				gw_http_send_error(r, 500, "server_error", NULL, NULL,
						   "k3d failed during the request: %s", why);
			else
				gw_http_send_error(r, 503, "server_error", NULL, NULL, "k3d is not available: %s", why);
		}
	}
	gw_relay_close(r);
	gw_http_req_maybe_free(r);
}

void gw_relay_timer_cb(evutil_socket_t fd, short what, void *arg)
{
	struct gw_req *r = arg;

	if (r->req && r->kind == K_HEALTH) {
		/* STATUS not answered in time: HELLO_OK's answer, without the
		 * text, rather than hold a load balancer's probe. */
		health_from_state(r, r->hello_state, NULL);
		gw_relay_close(r);
		gw_http_req_maybe_free(r);
		return;
	}
	if (r->req && r->kind == K_METRICS) {
		/* STATUS sent after the handshake, no STATUS_REPLY in time: the
		 * same answer as a k3d that is down (200, the gateway's own
		 * metrics, k3_gateway_daemon_up 0), because a scraper keeps a
		 * 200 series and alerts on daemon_up, where a 503 would only
		 * drop the gateway's counters from the scrape. */
		metrics_reply(r, NULL);
		gw_relay_close(r);
		gw_http_req_maybe_free(r);
		return;
	}
	(void)fd;
	(void)what;
	if (r->req) {
		gw_http_keepalive(r);
		return;
	}
	/* Cancel grace over: drop the connection, which cancels (rule 6). */
	gw_relay_close(r);
	gw_http_req_maybe_free(r);
}

void gw_relay_stop(struct gw_req *r)
{
	struct gw_openai_reply_error e;

	if (r->req && r->kind == K_HEALTH) {
		health_reply(r, NULL, "unavailable", "k3-gateway is shutting down");
	} else if (r->req && r->kind == K_METRICS) {
		metrics_reply(r, NULL);
	} else if (r->req) {
		gw_openai_stopping_error(&e);
		if (r->started) {
			/* An error event, then [DONE]: the stream ends as a stream,
			 * not as a cut connection (which clients report as a
			 * network error, and which read as 499 here). */
			gw_http_sse_event(r, gw_openai_error_json(e.type, e.message, NULL, e.code));
			gw_http_sse_write(r, "data: [DONE]\n\n", 14);
			gw_http_sse_end(r, e.status);
		} else {
			gw_http_reply_error(r, &e);
		}
	}
	gw_relay_close(r);
}

void gw_relay_client_gone(struct gw_req *r)
{
	struct timeval grace = { GW_CANCEL_GRACE_S, 0 };

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
	gw_relay_close(r);
}

int gw_relay_start(struct gw_req *r)
{
	r->d = gw_daemon_open(r->g->base, r->g->cfg.socket_path, r->g->cfg.daemon_timeout_s, daemon_frame,
			      daemon_fail, r);
	if (!r->d) {
		gw_http_send_error(r, 503, "server_error", NULL, NULL, "k3d is not available: out of memory");
		return -1;
	}
	/* The probes are not counted: a scrape would otherwise always see its
	 * own STATUS connection, and an idle gateway would never read 0. */
	r->counted = r->kind != K_HEALTH && r->kind != K_METRICS;
	if (r->counted)
		r->g->m.in_flight++;
	return 0;
}

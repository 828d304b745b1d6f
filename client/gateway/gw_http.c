/*
 * gw_http.c - the HTTP side of k3-gateway (gw_req.h): routing,
 * authentication, CORS, the JSON and SSE transport, and noticing clients
 * that leave (docs/k3-gateway.md, "Request lifecycle"). The k3d side of
 * each request is gw_relay.c; what the replies say is the OpenAI
 * dialect's (gw_openai.h for requests, gw_openai_reply.h for replies).
 */
#include "gw_req.h"

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

#include "gw_chunked.h"
#include "gw_openai.h"
#include "gw_openai_reply.h"
#include "k3_proto.h"

/* ---- small helpers ----------------------------------------------------- */

void gw_http_random_hex(char *out, size_t nbytes)
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
	char job[32] = "";

	if (r->g->cfg.quiet)
		return;
	gettimeofday(&now, NULL);
	if (r->job_id)
		snprintf(job, sizeof(job), " job %llu", (unsigned long long)r->job_id);
	fprintf(stderr, "k3-gateway: %s %s %d %.3fs%s\n", r->req_id, r->line, status,
		(double)(now.tv_sec - r->t0.tv_sec) + (double)(now.tv_usec - r->t0.tv_usec) / 1e6, job);
}

/* A stopping gateway leaves its loop once no reply is being written. */
static void stop_when_written(struct gw *g)
{
	if (g->stopping && g->writing == 0)
		event_base_loopexit(g->base, NULL);
}

/* evhttp wrote a reply out (its on-complete callback). */
static void reply_written(struct evhttp_request *req, void *arg)
{
	struct gw *g = arg;

	/* the connection may serve more requests: it no longer owes one */
	evhttp_connection_set_closecb(evhttp_request_get_connection(req), NULL, NULL);
	g->writing--;
	stop_when_written(g);
}

/* The connection closed before its reply was written. */
static void reply_lost(struct evhttp_connection *evcon, void *arg)
{
	struct gw *g = arg;

	(void)evcon;
	g->writing--;
	stop_when_written(g);
}

/* The HTTP side is finished: count it and forget the request object.
 * replied: a reply goes out now, and is tracked until it is written (or
 * its connection closes), so that gw_http_stop can wait for it. */
static void http_finished(struct gw_req *r, int status, bool replied)
{
	gw_metrics_count(&r->g->m, r->mep, status);
	log_access(r, status);
	if (r->evcon)
		evhttp_connection_set_closecb(r->evcon, replied ? reply_lost : NULL, r->g);
	if (replied && r->evcon) {
		r->g->writing++;
		evhttp_request_set_on_complete_cb(r->req, reply_written, r->g);
	}
	if (r->eof_ev)
		event_del(r->eof_ev);
	r->req = NULL;
	r->evcon = NULL;
}

void gw_http_send_body(struct gw_req *r, int status, const char *ctype, const char *body, size_t len)
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
	http_finished(r, status, true);
	/* libevent 2.1 knows no phrase for 429 ("Client Error"). */
	evhttp_send_reply(req, status, status == 429 ? "Too Many Requests" : NULL, b);
	evbuffer_free(b);
}

void gw_http_send_json(struct gw_req *r, int status, json_t *v)
{
	char *s = json_dumps(v, JSON_COMPACT | JSON_PRESERVE_ORDER);

	json_decref(v);
	if (!s) {
		static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
					  "\"param\":null,\"code\":null}}";
		gw_http_send_body(r, 500, "application/json", oom, sizeof(oom) - 1);
		return;
	}
	gw_http_send_body(r, status, "application/json", s, strlen(s));
	free(s);
}

void gw_http_send_error(struct gw_req *r, int status, const char *type, const char *param, const char *code,
			const char *fmt, ...)
{
	char msg[1024];
	va_list ap;

	if (!r->req)
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	gw_openai_utf8_trim(msg);
	if (status == 429 || status == 503) {
		char ra[16];

		snprintf(ra, sizeof(ra), "%u", r->g->cfg.retry_after_s);
		evhttp_add_header(evhttp_request_get_output_headers(r->req), "Retry-After", ra);
	}
	gw_http_send_json(r, status, gw_openai_error_json(type, msg, param, code));
}

/* ---- SSE ---------------------------------------------------------------- */

void gw_http_sse_write(struct gw_req *r, const char *data, size_t len)
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

void gw_http_sse_event(struct gw_req *r, json_t *v)
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
	gw_http_sse_write(r, p, n);
	evbuffer_free(b);
}

void gw_http_keepalive(struct gw_req *r)
{
	static const char ka[] = ": keep-alive\n\n";

	if (r->req && r->started)
		gw_http_sse_write(r, ka, sizeof(ka) - 1);
}

void gw_http_sse_start(struct gw_req *r)
{
	struct evkeyvalq *h = evhttp_request_get_output_headers(r->req);

	common_headers(r);
	evhttp_add_header(h, "Content-Type", "text/event-stream; charset=utf-8");
	evhttp_add_header(h, "Cache-Control", "no-cache");
	evhttp_add_header(h, "X-Accel-Buffering", "no");
	evhttp_send_reply_start(r->req, 200, "OK");
	r->started = true;
	if (r->oai.ep == GW_EP_CHAT)
		gw_http_sse_event(r, gw_openai_reply_first_chunk(&r->rp));
	else
		gw_http_sse_write(r, "", 0);   /* arms the keep-alive timer */
}

/* Ends an SSE response: the reply is complete on the HTTP side. */
void gw_http_sse_end(struct gw_req *r, int status)
{
	struct evhttp_request *req = r->req;

	if (!req)
		return;
	event_del(r->timer);
	http_finished(r, status, true);
	evhttp_send_reply_end(req);
}

/* An error after the headers are out: one error event, then the end. The
 * client got 200 already; status is what the same error has before the
 * headers, so /metrics and the access log count a stream refused by a
 * draining k3d as 503, like the non-streaming request it could have been. */
void gw_http_sse_fail(struct gw_req *r, int status, const char *type, const char *code, const char *message)
{
	gw_http_sse_event(r, gw_openai_error_json(type, message, NULL, code));
	gw_http_sse_end(r, status);
}

void gw_http_reply_error(struct gw_req *r, const struct gw_openai_reply_error *e)
{
	if (r->started)
		gw_http_sse_fail(r, e->status, e->type, e->code, e->message);
	else
		gw_http_send_error(r, e->status, e->type, e->param, e->code, "%s", e->message);
}

/* ---- client disconnects ------------------------------------------------- */

static void client_gone(struct gw_req *r)
{
	if (!r->req)
		return;
	http_finished(r, 499, false);
	event_del(r->timer);
	gw_relay_client_gone(r);
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
	gw_http_req_maybe_free(r);
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

void gw_http_req_maybe_free(struct gw_req *r)
{
	if (r->req || r->d)
		return;
	if (r->prev)
		r->prev->next = r->next;
	else
		r->g->reqs = r->next;
	if (r->next)
		r->next->prev = r->prev;
	if (r->eof_ev)
		event_free(r->eof_ev);
	if (r->timer)
		event_free(r->timer);
	gw_openai_request_release(&r->oai);
	gw_openai_reply_release(&r->rp);
	free(r->model_query);
	free(r);
}

/* Hands r to gw_relay.c and watches its client: a client that leaves
 * cancels the request's job at once. */
static void start_k3d(struct gw_req *r)
{
	if (gw_relay_start(r) < 0)
		return;
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
	char cmpl_id[48];

	if (!content_type_json(r->req)) {
		gw_http_send_error(r, 415, "invalid_request_error", NULL, "unsupported_media_type",
				   "Unsupported Content-Type: send the body as 'application/json'.");
		return;
	}
	if (len > r->g->cfg.max_body) {
		gw_http_send_error(r, 413, "invalid_request_error", NULL, "request_too_large",
				   "The request body has %zu bytes; this server accepts at most %llu (--max-body).",
				   len, (unsigned long long)r->g->cfg.max_body);
		return;
	}
	if (gw_openai_parse_body(ep, len ? (const char *)evbuffer_pullup(in, (ev_ssize_t)len) : "", len, &r->oai,
				 &e) < 0) {
		gw_http_send_error(r, e.status, "invalid_request_error", e.param, e.code, "%s", e.message);
		return;
	}
	memcpy(cmpl_id, ep == GW_EP_CHAT ? "chatcmpl-" : "cmpl-", ep == GW_EP_CHAT ? 9 : 5);
	gw_http_random_hex(cmpl_id + (ep == GW_EP_CHAT ? 9 : 5), 12);
	if (gw_openai_reply_init(&r->rp, &r->oai, cmpl_id, r->created, r->model) < 0) {
		gw_http_send_error(r, 500, "server_error", NULL, NULL, "out of memory");
		return;
	}
	start_k3d(r);
}

/* ---- malformed chunked bodies (gw_chunked.h) ------------------------------ */

/*
 * Every byte a client sends passes gw_chunked_feed in the input buffer's
 * callback, which libevent runs as the bytes arrive and before it parses
 * them. The checker of a connection lives in g->chunk_slots at the index
 * of its socket, which the kernel recycles with the connection: a slot
 * belongs to the bufferevent reading on that socket, and is let go when a
 * new connection's bufferevent is made at the same address (http_bevcb).
 * The buffer callback gets one pointer, the bufferevent, so the gateway
 * it belongs to is kept here (one per process, one thread).
 */
struct gw_chunk_slot {
	struct bufferevent *bev;         /* NULL: free */
	struct gw_chunked chk;
	uint32_t dispatched;             /* requests gencb has seen on this connection */
	bool editing;                    /* chunk_edit is changing the buffer */
};

static struct gw *chunk_gw;

/* The slot of bev's connection; with claim, taken (and grown) for it. */
static struct gw_chunk_slot *chunk_slot(struct gw *g, struct bufferevent *bev, bool claim)
{
	evutil_socket_t fd = bufferevent_getfd(bev);
	struct gw_chunk_slot *s;

	if (fd < 0)
		return NULL;
	if ((size_t)fd >= g->n_chunk_slots) {
		size_t n = (size_t)fd + 64;

		if (!claim || !(s = realloc(g->chunk_slots, n * sizeof(*s))))
			return NULL;
		memset(s + g->n_chunk_slots, 0, (n - g->n_chunk_slots) * sizeof(*s));
		g->chunk_slots = s;
		g->n_chunk_slots = n;
	}
	s = &g->chunk_slots[fd];
	if (s->bev != bev) {
		if (!claim)
			return NULL;
		memset(s, 0, sizeof(*s));
		s->bev = bev;
		gw_chunked_init(&s->chk);
	}
	return s;
}

/* Replaces bytes [a, b) of in by z. Returns 0, or -1 (out of memory:
 * in may have lost bytes, so the connection is beyond checking). */
static int chunk_edit(struct gw_chunk_slot *s, struct evbuffer *in, size_t a, size_t b, const char *z)
{
	struct evbuffer *head = evbuffer_new();
	int rc = -1;

	if (!head)
		return -1;
	s->editing = true;
	if (evbuffer_remove_buffer(in, head, a) == (int)a && evbuffer_drain(in, b - a) == 0 &&
	    evbuffer_add(head, z, strlen(z)) == 0 && evbuffer_add_buffer(head, in) == 0 &&
	    evbuffer_add_buffer(in, head) == 0)
		rc = 0;
	s->editing = false;
	evbuffer_free(head);
	return rc;
}

static void chunk_input_cb(struct evbuffer *in, const struct evbuffer_cb_info *info, void *arg)
{
	struct gw_chunk_slot *s;
	size_t todo = info->n_added;

	if (!todo)
		return;   /* libevent took bytes out */
	s = chunk_slot(chunk_gw, arg, true);
	if (!s || s->editing || gw_chunked_passive(&s->chk))
		return;
	if (info->n_deleted || todo > evbuffer_get_length(in)) {
		gw_chunked_stop(&s->chk);   /* the new bytes are not where they should be */
		return;
	}
	while (todo) {
		size_t len = evbuffer_get_length(in), n, r;
		struct evbuffer_ptr at;
		struct evbuffer_iovec vec;
		struct gw_chunked_verdict v;
		uint64_t opaque = gw_chunked_opaque(&s->chk);

		/* Body bytes are only counted: finding them walks the buffer
		 * from its start (evbuffer_ptr_set), which libevent fills with
		 * the whole body before it takes it, so peeking at each read
		 * made a 64 MB body take 7.7 s to answer, 1.1 s without. */
		if (opaque) {
			n = todo < opaque ? todo : (size_t)opaque;
			gw_chunked_skip(&s->chk, n);
			todo -= n;
			continue;
		}
		/* the new bytes are the last todo of the buffer */
		if (evbuffer_ptr_set(in, &at, len - todo, EVBUFFER_PTR_SET) < 0 ||
		    evbuffer_peek(in, -1, &at, &vec, 1) < 1) {
			gw_chunked_stop(&s->chk);
			return;
		}
		n = vec.iov_len < todo ? vec.iov_len : todo;
		r = gw_chunked_feed(&s->chk, vec.iov_base, n, &v);
		todo -= r;
		if (v.event == GW_CHUNKED_STRIP) {
			size_t end = len - todo;

			if (chunk_edit(s, in, end - v.line_len + v.digits, end, "\r\n") < 0)
				gw_chunked_stop(&s->chk);
		} else if (v.event == GW_CHUNKED_BAD) {
			/* libevent ends the body at end and hands the request to
			 * gencb, which answers 400 (chunk_malformed); the cut is
			 * in bytes libevent has not taken: it reads whole lines */
			if (v.back <= len - todo)
				chunk_edit(s, in, len - todo - v.back, len, v.end);
			return;
		}
	}
}

/* libevent asks for each client connection's bufferevent here: the one
 * it would make itself, plus the input callback. */
static struct bufferevent *http_bevcb(struct event_base *base, void *arg)
{
	struct gw *g = arg;
	struct bufferevent *bev = bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE);

	if (!bev)
		return NULL;   /* libevent makes one itself, unchecked */
	for (size_t i = 0; i < g->n_chunk_slots; i++)
		if (g->chunk_slots[i].bev == bev)
			g->chunk_slots[i].bev = NULL;   /* a closed connection's, at this address */
	evbuffer_add_cb(bufferevent_get_input(bev), chunk_input_cb, bev);
	return bev;
}

/* Counts req on its connection; returns what is wrong with its chunked
 * body when it is the request the checker cut, else NULL. Called once per
 * request, by gencb before anything else. */
static const char *chunk_malformed(struct gw *g, struct evhttp_request *req)
{
	struct evhttp_connection *evcon = evhttp_request_get_connection(req);
	struct bufferevent *bev = evcon ? evhttp_connection_get_bufferevent(evcon) : NULL;
	struct gw_chunk_slot *s = bev ? chunk_slot(g, bev, false) : NULL;

	if (!s)
		return NULL;
	s->dispatched++;
	return s->chk.bad_request && s->dispatched == s->chk.bad_request ? s->chk.why : NULL;
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
	const char *malformed = chunk_malformed(g, req);
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
	gw_http_random_hex(r->req_id + 4, 16);
	r->timer = evtimer_new(g->base, gw_relay_timer_cb, r);
	r->next = g->reqs;
	if (g->reqs)
		g->reqs->prev = r;
	g->reqs = r;
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
	if (malformed) {
		/* libevent read the body only up to the fault: what follows on
		 * the connection is not a request */
		r->mep = rt ? rt->mep : GW_M_OTHER;
		evhttp_add_header(evhttp_request_get_output_headers(req), "Connection", "close");
		gw_http_send_error(r, 400, "invalid_request_error", NULL, NULL,
				   "The request body's chunked framing is malformed: %s.", malformed);
		goto out;
	}
	if (!rt) {
		gw_http_send_error(r, 404, "invalid_request_error", NULL, NULL, "Invalid URL (%s %s)", method_name(cmd),
				   path);
		goto out;
	}
	r->mep = rt->mep;
	if (g->stopping) {
		evhttp_add_header(evhttp_request_get_output_headers(req), "Connection", "close");
		gw_http_send_error(r, 503, "server_error", NULL, "shutting_down",
				   "k3-gateway is shutting down and takes no new requests.");
		goto out;
	}
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
		http_finished(r, 204, true);
		evhttp_send_reply(req, 204, "No Content", NULL);
		goto out;
	}
	if (!(rt->methods & cmd)) {
		evhttp_add_header(evhttp_request_get_output_headers(req), "Allow", rt->allow);
		gw_http_send_error(r, 405, "invalid_request_error", NULL, "method_not_allowed",
				   "Method %s is not allowed on %s; allowed: %s.", method_name(cmd), path, rt->allow);
		goto out;
	}
	if (rt->mep != GW_M_HEALTH && !authorized(r)) {
		gw_http_send_error(r, 401, "invalid_request_error", NULL, "invalid_api_key",
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
		start_k3d(r);
		break;
	case GW_M_HEALTH:
		r->kind = K_HEALTH;
		start_k3d(r);
		break;
	case GW_M_METRICS:
		r->kind = K_METRICS;
		start_k3d(r);
		break;
	default:
		break;
	}
out:
	gw_http_req_maybe_free(r);
}

static void stop_timeout(evutil_socket_t fd, short what, void *arg)
{
	struct gw *g = arg;

	(void)fd;
	(void)what;
	event_base_loopexit(g->base, NULL);
}

void gw_http_stop(struct gw *g)
{
	struct timeval tv = { GW_STOP_FLUSH_S, 0 };
	struct gw_req *r, *next;

	if (g->stopping) {
		event_base_loopexit(g->base, NULL);
		return;
	}
	for (r = g->reqs; r; r = next) {
		next = r->next;
		gw_relay_stop(r);
		gw_http_req_maybe_free(r);
	}
	/* Only now: a reply written at once (an HTTP/1.0 stream) must not end
	 * the loop while others are still to be ended. Replies that finished
	 * before the signal and are still being written count too. */
	g->stopping = true;
	g->stop_timer = evtimer_new(g->base, stop_timeout, g);
	if (g->stop_timer)
		event_add(g->stop_timer, &tv);
	stop_when_written(g);
}

void gw_http_setup(struct gw *g)
{
	uint64_t backstop = g->cfg.max_body * 2 + (1u << 20);

	evhttp_set_gencb(g->http, gencb, g);
	chunk_gw = g;
	evhttp_set_bevcb(g->http, http_bevcb, g);
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

void gw_http_release(struct gw *g)
{
	free(g->chunk_slots);
	g->chunk_slots = NULL;
	g->n_chunk_slots = 0;
	chunk_gw = NULL;
}

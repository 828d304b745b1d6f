/*
 * gw_req.h - one HTTP request of k3-gateway and its k3d conversation,
 * shared by the two files that drive it: gw_http.c (the HTTP side:
 * routing, auth, CORS, the JSON and SSE transport, client disconnects)
 * and gw_relay.c (the k3d side: the protocol conversation, and the
 * /health and /metrics answers built from it). Internal to client/gateway.
 *
 * A struct gw_req lives from the moment a request arrives until both sides
 * are finished: the HTTP reply was sent (or the client went away), so req
 * is NULL, and the k3d connection was closed, so d is NULL. Whichever side
 * ends second frees it (gw_http_req_maybe_free). Single-threaded: every
 * function here runs on the gateway's event loop.
 */
#ifndef K3_GW_REQ_H
#define K3_GW_REQ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/time.h>

#include <event2/event.h>
#include <event2/http.h>
#include <jansson.h>

#include "gw.h"
#include "gw_openai.h"
#include "gw_openai_reply.h"
#include "k3_proto.h"

enum gw_kind { K_GENERATE, K_MODELS, K_MODEL_ONE, K_HEALTH, K_METRICS };

struct gw_req {
	struct gw *g;
	struct gw_req *prev, *next;      /* g->reqs */
	struct evhttp_request *req;      /* NULL once the reply is complete or the client left */
	struct evhttp_connection *evcon;
	struct event *eof_ev;            /* watches the client socket for EOF */
	struct event *timer;             /* SSE keep-alive, then cancel grace (gw_relay_timer_cb) */
	struct gw_daemon *d;             /* NULL once the k3d connection is closed */
	enum gw_kind kind;
	enum gw_ep_metric mep;
	struct gw_openai_request oai;
	char *model_query;               /* GET /v1/models/{id} */
	char line[160];                  /* "METHOD /path" for the access log */
	struct timeval t0;
	char req_id[40];
	long long created;
	char model[K3_LIM_NAME_MAX + 1];
	bool generate_sent, accepted, started, done, cancel_sent;
	bool counted;                    /* counted in m.in_flight (not a /health or /metrics probe) */
	uint64_t job_id;                 /* k3d's id of the generation ('k3ctl cancel' takes it); 0 = none yet */
	unsigned hello_state;            /* K_HEALTH: HELLO_OK's state while its STATUS is out */
	struct gw_openai_reply rp;       /* K_GENERATE: the reply being shaped */
};

/* ---- gw_http.c: the HTTP side --------------------------------------------- */

/* nbytes (at most 32) random bytes as 2 * nbytes hex digits and a NUL. */
void gw_http_random_hex(char *out, size_t nbytes);

/* One complete reply of len bytes (copied) with the common headers. No-op
 * once r->req is NULL; r->req is NULL after it. */
void gw_http_send_body(struct gw_req *r, int status, const char *ctype, const char *body, size_t len);
/* The same for a JSON value (stolen; NULL answers 500 "out of memory"). */
void gw_http_send_json(struct gw_req *r, int status, json_t *v);
/* An OpenAI error body (message at most 1,023 bytes); Retry-After on 429
 * and 503. param and code NULL or "" give null. */
void gw_http_send_error(struct gw_req *r, int status, const char *type, const char *param, const char *code,
			const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* A generation's error from the error map: gw_http_send_error, or once
 * the stream's headers are out, its last SSE event. */
void gw_http_reply_error(struct gw_req *r, const struct gw_openai_reply_error *e);

/* SSE: the headers and (chat) the role chunk; one event from a JSON value
 * (stolen; NULL sends nothing); raw bytes (len 0 only re-arms the
 * keep-alive); the end of the reply, counted as status; an error event
 * and the end. All are no-ops once r->req is NULL. */
void gw_http_sse_start(struct gw_req *r);
void gw_http_sse_event(struct gw_req *r, json_t *v);
void gw_http_sse_write(struct gw_req *r, const char *data, size_t len);
void gw_http_sse_end(struct gw_req *r, int status);
void gw_http_sse_fail(struct gw_req *r, int status, const char *type, const char *code, const char *message);
/* The keep-alive timer fired: a ": keep-alive" comment on a started stream. */
void gw_http_keepalive(struct gw_req *r);

/* Frees r when both sides are finished (req and d NULL); else nothing. */
void gw_http_req_maybe_free(struct gw_req *r);

/* ---- gw_relay.c: the k3d side ---------------------------------------------- */

/* Opens r's k3d connection (HELLO first; the kind decides what follows).
 * Returns 0, or -1 after answering 503 itself (out of memory). */
int gw_relay_start(struct gw_req *r);

/* Closes r's k3d connection, which cancels its jobs (protocol rule 6).
 * Accepts a closed one. Does not free r. */
void gw_relay_close(struct gw_req *r);

/* The client went away (HTTP side already finished): CANCEL a running
 * generation and keep the connection until DONE or the grace ends, else
 * close it. Does not free r. */
void gw_relay_client_gone(struct gw_req *r);

/* r->timer's callback (arg is r): the /metrics STATUS deadline, the SSE
 * keep-alive, or the end of the cancel grace. May free r. */
void gw_relay_timer_cb(evutil_socket_t fd, short what, void *arg);

/* The gateway stops (gw_http_stop): ends r's open reply as that describes
 * and closes its k3d connection. Does not free r. */
void gw_relay_stop(struct gw_req *r);

#endif

/*
 * gw.h - k3-gateway's server state shared by main.c (flags, listening),
 * gw_http.c (routing, handlers, SSE) and gw_metrics.c (Prometheus text).
 * The gateway is single-threaded: everything runs on one event loop.
 */
#ifndef K3_GW_H
#define K3_GW_H

#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include <event2/event.h>
#include <event2/http.h>

#define GW_MAX_CORS 8

struct gw_config {
	const char *listen;          /* "HOST:PORT"; default 127.0.0.1:8000 */
	bool allow_remote;           /* --allow-remote: non-loopback listen */
	const char *socket_path;     /* --socket: k3d's Unix socket */
	char *api_key;               /* from --api-key-file; NULL = no auth */
	const char *cors[GW_MAX_CORS];
	unsigned n_cors;
	uint64_t max_body;           /* bytes */
	unsigned read_timeout_s;     /* headers + body, and write stalls */
	unsigned keepalive_s;        /* SSE comment interval */
	unsigned retry_after_s;      /* Retry-After on 429/503 */
	unsigned daemon_timeout_s;   /* HELLO / control replies from k3d */
	bool quiet;                  /* no access log on stderr */
};

enum gw_ep_metric {
	GW_M_CHAT, GW_M_COMPLETIONS, GW_M_MODELS, GW_M_HEALTH, GW_M_METRICS, GW_M_OTHER, GW_M_COUNT_
};

#define GW_M_STATUSES 24

struct gw_metrics {
	/* requests by endpoint and HTTP status (499 = client went away) */
	struct { int status; uint64_t n; } by_status[GW_M_COUNT_][GW_M_STATUSES];
	/* DONEs whose reply reached the client (finish stop/length/tool_calls) */
	uint64_t prompt_tokens, completion_tokens, reasoning_tokens, cached_tokens;
	double prefill_s, decode_s;
	/* DONEs whose reply did not: the client left, or cancelled/error */
	uint64_t undelivered_prompt_tokens, undelivered_completion_tokens;
	uint64_t expert_bytes_read, expert_hits, expert_misses;
	/* bytes read for every DONE seen, delivered or not (the reads happened) */
	uint64_t done_expert_bytes, done_spine_bytes;
	uint64_t cancels_sent;
	unsigned in_flight;          /* API requests holding a daemon connection (not /health, /metrics) */
};

struct gw_req;
struct gw_chunk_slot;

struct gw {
	struct gw_config cfg;
	struct event_base *base;
	struct evhttp *http;
	struct gw_metrics m;
	time_t started;
	struct gw_req *reqs;         /* every live request (gw_http.c's list) */
	unsigned writing;            /* replies handed to evhttp, not yet written or lost */
	bool stopping;               /* SIGTERM/SIGINT: new requests get 503; exit at writing 0 */
	struct event *stop_timer;    /* bounds the wait for the replies being written */
	/* gw_http.c: the chunked-body check of each client connection, by socket */
	struct gw_chunk_slot *chunk_slots;
	size_t n_chunk_slots;
};

/* Installs the routing callback, the chunked-body check and the server
 * limits on g->http. One gateway per process: the check keeps g. */
void gw_http_setup(struct gw *g);
/* Frees what gw_http_setup allocated; after evhttp_free(g->http). */
void gw_http_release(struct gw *g);

/*
 * The gateway stops (the first SIGTERM or SIGINT). Every open reply ends
 * as a reply: a stream with an error event (503 shutting_down) and
 * "data: [DONE]", any other request with a 503 shutting_down error (a
 * /health probe with its own 503 body, /metrics with the gateway's own
 * counters); every k3d connection closes, which cancels its job; new
 * requests get 503. The event loop exits once those replies, and any
 * finished before that are still being written, are out, or after
 * GW_STOP_FLUSH_S seconds for a client that does not read.
 * Calling it again exits the loop at once.
 */
#define GW_STOP_FLUSH_S 5
void gw_http_stop(struct gw *g);

/* Counts one finished request. */
void gw_metrics_count(struct gw_metrics *m, enum gw_ep_metric ep, int status);

/*
 * Appends the Prometheus text exposition of m, plus the daemon's counters
 * when st is non-NULL (a decoded STATUS_REPLY), to out.
 */
struct evbuffer;
struct k3_msg_status_reply;
void gw_metrics_render(const struct gw_metrics *m, const struct k3_msg_status_reply *st,
		       struct evbuffer *out);

#endif

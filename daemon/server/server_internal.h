/*
 * server_internal.h - what k3d's front-door files share (server.h is the
 * public contract; nothing outside daemon/server/server*.c includes this).
 *
 * Where each behaviour lives:
 *   server.c           listening sockets (passed by systemd, or bound in a
 *                      checked directory), the server's life (create, free,
 *                      the systemd watchdog) and the graceful drain
 *   server_conn.c      a connection's state and life: accept, peer
 *                      authorization, the connection limits (a share per
 *                      uid, room kept for root and k3-gateway), sending and
 *                      backpressure, flush waiters, the deadlines (HELLO,
 *                      --idle-timeout, --frame-timeout) and the large-frame
 *                      budget
 *   server_dispatch.c  frames in: the header-first split that bounds a
 *                      length before its payload is buffered, and the
 *                      answer to each request (HELLO, PING, STATUS,
 *                      SHUTDOWN here; the engine's through the hooks)
 *
 * Everything runs on the libevent loop thread.
 */
#ifndef K3_SERVER_SERVER_INTERNAL_H
#define K3_SERVER_SERVER_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>
#include <time.h>

#include <event2/bufferevent.h>
#include <event2/listener.h>

#include "server/server.h"

/* listening sockets: k3d's own, or those systemd passes */
enum { MAX_LISTENERS = 8 };

struct k3_conn {
	struct k3_server *srv;
	struct bufferevent *bev;       /* NULL once the peer is gone */
	struct k3_conn *prev, *next;   /* live list; owned by srv */
	unsigned refs;
	uint64_t id;
	uid_t uid;
	gid_t gid;
	pid_t pid;
	uint64_t caps;                 /* HELLO's capability bits */
	bool hello_done;
	bool may_shutdown;             /* own uid, root or --allow-uid */
	bool gateway;                  /* a --gateway-uid peer: counted in srv->n_gateway */
	bool idle_closed;              /* closing because of --idle-timeout */
	bool closing;                  /* close once output is flushed */
	bool read_paused;              /* backpressure */
	struct event *hello_timer;     /* deadline for HELLO, from the accept */
	struct event *idle_timer;      /* --idle-timeout, armed once HELLO is done */
	double last_active_s;          /* monotonic: last byte read or frame queued */
	struct event *large_timer;     /* deadline for the large frame in front */
	uint32_t large_reserved;       /* share of srv->large_reserved for the frame in front */
	struct {
		void (*cb)(void *arg, bool written);
		void *arg;
	} flush[K3_CONN_FLUSH_WAITERS];
	unsigned n_flush;
};

struct k3_server {
	struct event_base *base;
	const struct k3_options *opts;
	struct evconnlistener *listeners[MAX_LISTENERS];
	unsigned n_listeners;
	char own_path[sizeof(((struct sockaddr_un *)0)->sun_path)];  /* "" unless we bound it */
	struct k3_conn *conns;
	unsigned n_conns;
	unsigned n_gateway;            /* of n_conns, --gateway-uid peers */
	double refusal_logged_s;       /* last "refusing connection" log line */
	unsigned refusals_unlogged;    /* refusals since, not logged one by one */
	uint64_t next_conn_id;
	struct k3_proto_buf scratch;
	struct k3_server_hooks hooks;
	struct k3_server_info info;
	struct timespec started;
	struct event *drain_timer;
	struct event *watchdog;
	bool draining;
	bool drain_waiting;            /* running jobs still finishing */
	bool drain_cancelled;          /* out of time: running work was cancelled */
	bool drain_hurried;            /* asked to stop again: no waiting for the timeout */
	uint64_t large_reserved;       /* payload bytes reserved by large frames in flight */
};

/* Monotonic seconds, and seconds as a timeval for the libevent timers. */
static inline double server_mono_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static inline struct timeval server_timeval_of(double s)
{
	struct timeval tv = { (time_t)s, (suseconds_t)((s - (double)(time_t)s) * 1e6) };

	return tv;
}

/* ---- server.c ---------------------------------------------------------- */

/* Ends the loop once a drain has nothing left to wait for. */
void server_maybe_exit(struct k3_server *s);

/* ---- server_conn.c ------------------------------------------------------ */

/* The listeners' accept callback: peer credentials, the allow list, the
 * connection limits, then a new connection waiting for its HELLO. */
void server_accept_cb(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa,
		      int socklen, void *arg);
/* Tears the connection down now: the peer is gone or misbehaved. */
void server_conn_close(struct k3_conn *c);
/* Closes after the queued output has been written. */
void server_conn_close_after_write(struct k3_conn *c);
/* HELLO was accepted: its deadline ends, the peer's capability bits are
 * kept and --idle-timeout starts counting. */
void server_conn_hello_done(struct k3_conn *c, uint64_t caps);
/* The frame in front of c (header h, h->length > K3_LIM_PAYLOAD_SMALL)
 * takes its share of K3_LIM_INBUF_LARGE_TOTAL until it is handled, under
 * --frame-timeout. Returns 0, or -EBUSY after answering ERROR{BUSY} and
 * closing c when the budget is spent. */
int server_conn_reserve_large(struct k3_conn *c, const struct k3_proto_header *h);
/* The frame in front of c is done with (or c is gone): its reservation
 * against K3_LIM_INBUF_LARGE_TOTAL ends. */
void server_conn_release_large(struct k3_conn *c);

/* ---- server_dispatch.c -------------------------------------------------- */

/* The bufferevent read callback: splits and answers every whole frame
 * waiting on c, one at a time. */
void server_conn_read_cb(struct bufferevent *bev, void *arg);

#endif

/*
 * server.c - sockets, peers, connections and frames for k3d (see server.h).
 *
 * A connection reads frames with k3_proto_frame_split on the first 20
 * bytes only, so a hostile length is refused before its payload is waited
 * for or buffered; it then linearizes exactly one frame at a time. Replies
 * are encoded into one scratch buffer (the loop is single-threaded) and
 * queued on the bufferevent. Errors in a frame get an ERROR reply and a
 * close after the reply is written; no input can make the loop block.
 */
#include "server/server.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/listener.h>
#include <systemd/sd-daemon.h>

#include "base/log.h"
#include "base/sockact.h"
#include "k3_build_config.h"

enum {
	MAX_LISTENERS = 8,
	DRAIN_GRACE_S = 5,
	/* fds k3d keeps for itself beyond its connections: listeners, model
	 * shards and packs, the router trace, libevent and thread wakeups */
	OWN_FDS = 256,
	/* an idle-closed peer that does not read its ERROR is cut off after */
	IDLE_CLOSE_GRACE_S = 5,
};

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

static void conn_close(struct k3_conn *c);
static void server_maybe_exit(struct k3_server *s);

static double mono_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static struct timeval timeval_of(double s)
{
	struct timeval tv = { (time_t)s, (suseconds_t)((s - (double)(time_t)s) * 1e6) };

	return tv;
}

/* The frame in front of c is done with (or c is gone): its reservation
 * against K3_LIM_INBUF_LARGE_TOTAL ends. */
static void conn_release_large(struct k3_conn *c)
{
	c->srv->large_reserved -= c->large_reserved;
	c->large_reserved = 0;
	if (c->large_timer)
		evtimer_del(c->large_timer);
}

/* ---- connection lifetime -------------------------------------------- */

struct k3_conn *k3_conn_ref(struct k3_conn *c)
{
	c->refs++;
	return c;
}

struct k3_conn *k3_conn_unref(struct k3_conn *c)
{
	if (c && --c->refs == 0)
		free(c);
	return NULL;
}

bool k3_conn_is_open(const struct k3_conn *c)
{
	return c->bev && !c->closing;
}

uid_t k3_conn_uid(const struct k3_conn *c) { return c->uid; }
pid_t k3_conn_pid(const struct k3_conn *c) { return c->pid; }
uint64_t k3_conn_caps(const struct k3_conn *c) { return c->caps; }
uint64_t k3_conn_id(const struct k3_conn *c) { return c->id; }
bool k3_conn_is_admin(const struct k3_conn *c) { return c->may_shutdown; }

/* Runs (and clears) the flush waiters with the given outcome. */
static void conn_run_flush(struct k3_conn *c, bool written)
{
	unsigned n = c->n_flush;

	c->n_flush = 0;
	for (unsigned i = 0; i < n; i++)
		c->flush[i].cb(c->flush[i].arg, written);
}

/* Tears the connection down now: the peer is gone or misbehaved. */
static void conn_close(struct k3_conn *c)
{
	struct k3_server *s = c->srv;

	if (!c->bev)
		return;
	conn_run_flush(c, false);
	conn_release_large(c);
	if (c->large_timer) {
		event_free(c->large_timer);
		c->large_timer = NULL;
	}
	if (c->hello_timer) {
		event_free(c->hello_timer);
		c->hello_timer = NULL;
	}
	if (c->idle_timer) {
		event_free(c->idle_timer);
		c->idle_timer = NULL;
	}
	bufferevent_free(c->bev);
	c->bev = NULL;
	if (c->prev)
		c->prev->next = c->next;
	else
		s->conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	s->n_conns--;
	if (c->gateway)
		s->n_gateway--;
	if (s->hooks.conn_closed)
		s->hooks.conn_closed(s->hooks.ctx, c);
	k3_log_debug("connection %llu closed", (unsigned long long)c->id);
	k3_conn_unref(c);
	server_maybe_exit(s);
}

/* Closes after the queued output has been written. */
static void conn_close_after_write(struct k3_conn *c)
{
	if (!c->bev)
		return;
	c->closing = true;
	bufferevent_disable(c->bev, EV_READ);
	if (evbuffer_get_length(bufferevent_get_output(c->bev)) == 0)
		conn_close(c);
}

int k3_conn_when_flushed(struct k3_conn *c, void (*cb)(void *arg, bool written), void *arg)
{
	if (!c->bev || c->closing) {
		cb(arg, false);
		return 0;
	}
	if (evbuffer_get_length(bufferevent_get_output(c->bev)) == 0) {
		cb(arg, true);
		return 0;
	}
	if (c->n_flush == K3_CONN_FLUSH_WAITERS)
		return -EBUSY;
	c->flush[c->n_flush].cb = cb;
	c->flush[c->n_flush].arg = arg;
	c->n_flush++;
	return 0;
}

int k3_conn_send_raw(struct k3_conn *c, const void *frame, size_t len)
{
	struct evbuffer *out;

	if (!c->bev || c->closing)
		return -EPIPE;
	out = bufferevent_get_output(c->bev);
	if (evbuffer_add(out, frame, len) != 0)
		return -ENOMEM;
	c->last_active_s = mono_s();
	if (!c->read_paused && evbuffer_get_length(out) > K3_LIM_CONN_OUTBUF) {
		/* A peer that does not read its replies stops being read. */
		c->read_paused = true;
		bufferevent_disable(c->bev, EV_READ);
	}
	return 0;
}

int k3_conn_send(struct k3_conn *c, uint32_t type, uint32_t request_id, const void *body)
{
	struct k3_server *s = c->srv;
	struct k3_proto_err perr;

	if (!c->bev)
		return -EPIPE;
	k3_proto_buf_reset(&s->scratch);
	if (k3_proto_encode(&s->scratch, type, request_id, body, &perr) != 0) {
		k3_log_err("cannot encode %s for connection %llu: %s", k3_proto_type_name(type),
			   (unsigned long long)c->id, perr.msg);
		return -EINVAL;
	}
	return k3_conn_send_raw(c, s->scratch.data, s->scratch.len);
}

int k3_conn_send_error(struct k3_conn *c, uint32_t request_id, enum k3_proto_status status,
		       const char *param, const char *fmt, ...)
{
	struct k3_msg_error e;
	char msg[K3_LIM_MESSAGE_MAX];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	memset(&e, 0, sizeof(e));
	e.status = status; e.has_status = true;
	/* Keep the message valid UTF-8 even if it quotes peer bytes. */
	for (char *p = msg; *p; p++)
		if ((unsigned char)*p >= 0x80)
			*p = '?';
	e.message = k3_proto_str_of(msg); e.has_message = true;
	if (param) {
		e.param = k3_proto_str_of(param);
		e.has_param = true;
	}
	return k3_conn_send(c, K3_MSG_ERROR, request_id, &e);
}

/* ---- requests ---------------------------------------------------------- */

static double uptime_s(const struct k3_server *s)
{
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	return (double)(now.tv_sec - s->started.tv_sec) + (double)(now.tv_nsec - s->started.tv_nsec) * 1e-9;
}

static void handle_status(struct k3_conn *c, uint32_t rid)
{
	struct k3_server *s = c->srv;
	struct k3_server_info info = s->info;
	struct k3_msg_status_reply r;

	memset(&r, 0, sizeof(r));
	if (s->hooks.status)
		s->hooks.status(s->hooks.ctx, c, &info, &r);
	if (s->draining) {
		/* The engine's text ("ready") would contradict the state. */
		info.state = K3_STATE_DRAINING;
		info.status_text = s->drain_cancelled
			? "out of time, cancelling the running work"
			: "finishing running work, taking none new";
	}
	r.version = k3_proto_str_of(K3_VERSION); r.has_version = true;
	r.state = info.state; r.has_state = true;
	if (info.status_text) {
		r.status_text = k3_proto_str_of(info.status_text);
		r.has_status_text = true;
	}
	if (info.model_id) {
		r.model = k3_proto_str_of(info.model_id);
		r.has_model = true;
	}
	r.pid = (uint32_t)getpid(); r.has_pid = true;
	r.uptime_s = uptime_s(s); r.has_uptime_s = true;
	r.connections = s->n_conns; r.has_connections = true;
	r.running = info.running; r.has_running = true;
	r.queued = info.queued; r.has_queued = true;
	r.queue_max = s->opts->queue_max; r.has_queue_max = true;
	k3_conn_send(c, K3_MSG_STATUS_REPLY, rid, &r);
}

/*
 * --idle-timeout. Idle means: nothing read from the peer and no frame
 * queued to it for the whole timeout, and nothing of its own queued or
 * running, which is exactly "nobody else holds a reference": the scheduler
 * holds one per queued or running request (server.h, k3_conn_ref). The
 * timer is not re-armed on every byte; it checks the last activity when it
 * fires and sleeps for the rest.
 */
static void idle_timeout_cb(evutil_socket_t fd, short what, void *arg)
{
	struct k3_conn *c = arg;
	struct k3_server *s = c->srv;
	double t = s->opts->idle_timeout_s, idle = mono_s() - c->last_active_s;
	struct timeval tv;

	(void)fd; (void)what;
	if (!c->bev)
		return;
	if (c->closing) {
		/* Our idle ERROR was not read within the grace period; any
		 * other close (a drain, a bad frame) runs its own course. */
		if (c->idle_closed)
			conn_close(c);
		return;
	}
	if (idle < t || c->refs > 1) {
		tv = timeval_of(idle < t ? t - idle : t);
		evtimer_add(c->idle_timer, &tv);
		return;
	}
	k3_log_info("connection %llu (uid %u pid %d): idle for %g s (--idle-timeout), closing",
		    (unsigned long long)c->id, (unsigned)c->uid, (int)c->pid, t);
	if (evbuffer_get_length(bufferevent_get_output(c->bev)) > 0) {
		/* Replies queued for a whole timeout: the peer is not reading. */
		conn_close(c);
		return;
	}
	k3_conn_send_error(c, 0, K3_STATUS_IDLE_TIMEOUT, NULL,
			   "k3d closed this connection: idle for %g s (k3d --idle-timeout); "
			   "reconnect to go on", t);
	c->idle_closed = true;
	conn_close_after_write(c);
	if (c->bev) {
		tv = timeval_of(IDLE_CLOSE_GRACE_S);
		evtimer_add(c->idle_timer, &tv);
	}
}

static void handle_hello(struct k3_conn *c, uint32_t rid, const struct k3_msg_hello *m)
{
	struct k3_server *s = c->srv;
	struct k3_msg_hello_ok r;

	if (m->version != K3_PROTO_VERSION) {
		k3_conn_send_error(c, rid, K3_STATUS_UNSUPPORTED_VERSION, "version",
				   "protocol version %u is not supported; this k3d speaks %u",
				   m->version, K3_PROTO_VERSION);
		conn_close_after_write(c);
		return;
	}
	c->hello_done = true;
	c->caps = m->has_caps ? m->caps : 0;
	if (c->hello_timer) {
		event_free(c->hello_timer);
		c->hello_timer = NULL;
	}
	if (s->opts->idle_timeout_s > 0 && !c->idle_timer) {
		struct timeval tv = timeval_of(s->opts->idle_timeout_s);

		c->idle_timer = evtimer_new(s->base, idle_timeout_cb, c);
		if (c->idle_timer)
			evtimer_add(c->idle_timer, &tv);
	}
	memset(&r, 0, sizeof(r));
	r.server = k3_proto_str_of("k3d/" K3_VERSION); r.has_server = true;
	r.version = K3_PROTO_VERSION; r.has_version = true;
	r.caps = K3_PROTO_CAP_CHAT | K3_PROTO_CAP_TOOLS | K3_PROTO_CAP_PROGRESS | K3_PROTO_CAP_JOBS;
	r.has_caps = true;
	if (s->info.model_id) {
		r.model = k3_proto_str_of(s->info.model_id);
		r.has_model = true;
	}
	r.state = s->draining ? K3_STATE_DRAINING : s->info.state; r.has_state = true;
	k3_conn_send(c, K3_MSG_HELLO_OK, rid, &r);
	k3_log_debug("connection %llu: hello from '%.*s' (uid %u pid %d)", (unsigned long long)c->id,
		     (int)m->client.len, m->client.p, (unsigned)c->uid, (int)c->pid);
}

/* SHUTDOWN's OK text: what k3_server_drain is about to do, so that a
 * second `k3ctl shutdown` can say the running work was cancelled
 * (docs/protocol.md, "Conversation"). */
static const char *shutdown_outcome(const struct k3_server *s)
{
	if (!s->draining)
		return "draining";
	if (!s->drain_waiting)
		return "already draining";
	if (s->drain_cancelled)
		return "already draining; the running work was already cancelled";
	return s->drain_timer ? "already draining; the running work was cancelled"
			      : "already draining";
}

static void handle_frame(struct k3_conn *c, const struct k3_proto_header *h, const uint8_t *payload)
{
	struct k3_server *s = c->srv;
	union k3_proto_body body;
	struct k3_proto_err perr;

	if (k3_proto_decode(h->type, payload, h->length, &body, &perr) != 0) {
		k3_log_info("connection %llu (uid %u pid %d): bad %s frame: %s", (unsigned long long)c->id,
			    (unsigned)c->uid, (int)c->pid, k3_proto_type_name(h->type), perr.msg);
		k3_conn_send_error(c, h->request_id, K3_STATUS_BAD_REQUEST, NULL, "%s (%s)", perr.msg,
				   k3_proto_error_name(perr.code));
		conn_close_after_write(c);
		return;
	}
	if (!c->hello_done && h->type != K3_MSG_HELLO) {
		k3_conn_send_error(c, h->request_id, K3_STATUS_BAD_REQUEST, NULL,
				   "the first frame must be HELLO, not %s", k3_proto_type_name(h->type));
		conn_close_after_write(c);
		return;
	}
	switch (h->type) {
	case K3_MSG_HELLO:
		if (c->hello_done) {
			k3_conn_send_error(c, h->request_id, K3_STATUS_BAD_REQUEST, NULL, "HELLO sent twice");
			break;
		}
		handle_hello(c, h->request_id, &body.hello);
		break;
	case K3_MSG_PING: {
		struct k3_msg_pong r;

		memset(&r, 0, sizeof(r));
		r.state = s->draining ? K3_STATE_DRAINING : s->info.state; r.has_state = true;
		k3_conn_send(c, K3_MSG_PONG, h->request_id, &r);
		break;
	}
	case K3_MSG_STATUS:
		handle_status(c, h->request_id);
		break;
	case K3_MSG_SHUTDOWN: {
		struct k3_msg_ok r;

		if (!c->may_shutdown) {
			k3_log_notice("refusing SHUTDOWN from uid %u pid %d: only the daemon's uid, root "
				      "and --allow-uid users may stop it", (unsigned)c->uid, (int)c->pid);
			k3_conn_send_error(c, h->request_id, K3_STATUS_UNAUTHORIZED, NULL,
					   "uid %u may not shut k3d down", (unsigned)c->uid);
			break;
		}
		k3_log_notice("SHUTDOWN requested by uid %u pid %d", (unsigned)c->uid, (int)c->pid);
		memset(&r, 0, sizeof(r));
		r.message = k3_proto_str_of(shutdown_outcome(s)); r.has_message = true;
		k3_conn_send(c, K3_MSG_OK, h->request_id, &r);
		k3_server_drain(s);
		break;
	}
	case K3_MSG_GENERATE:
	case K3_MSG_CANCEL:
	case K3_MSG_TOKENIZE:
	case K3_MSG_DETOKENIZE:
	case K3_MSG_MODEL_INFO:
	case K3_MSG_WARM_EXPERTS:
		if (s->draining && (h->type == K3_MSG_GENERATE || h->type == K3_MSG_WARM_EXPERTS)) {
			k3_conn_send_error(c, h->request_id, K3_STATUS_SHUTTING_DOWN, NULL,
					   "k3d is shutting down");
			break;
		}
		if (s->hooks.request) {
			s->hooks.request(s->hooks.ctx, c, h, &body);
			break;
		}
		k3_conn_send_error(c, h->request_id, K3_STATUS_NOT_READY, NULL,
				   "no model is loaded; start k3d with --model DIR");
		break;
	default:
		k3_conn_send_error(c, h->request_id, K3_STATUS_BAD_REQUEST, NULL,
				   "%s is not a request", k3_proto_type_name(h->type));
		conn_close_after_write(c);
		break;
	}
}

static void large_timeout_cb(evutil_socket_t fd, short what, void *arg);

static void conn_read_cb(struct bufferevent *bev, void *arg)
{
	struct k3_conn *c = arg;
	struct evbuffer *in = bufferevent_get_input(bev);

	k3_conn_ref(c);
	c->last_active_s = mono_s();
	while (c->bev && !c->closing) {
		size_t len = evbuffer_get_length(in), n = len < K3_PROTO_HEADER_SIZE ? len : K3_PROTO_HEADER_SIZE;
		struct k3_proto_header h;
		const uint8_t *payload;
		struct k3_proto_err perr;
		uint8_t *p;
		int r;

		if (len == 0)
			break;
		p = evbuffer_pullup(in, (ssize_t)n);
		r = k3_proto_frame_split(p, n, &h, &payload, &perr);
		if (r < 0) {
			k3_log_info("connection %llu (uid %u pid %d): %s", (unsigned long long)c->id,
				    (unsigned)c->uid, (int)c->pid, perr.msg);
			k3_conn_send_error(c, r == K3_PROTO_E_BAD_MAGIC ? 0 : h.request_id,
					   r == K3_PROTO_E_BAD_VERSION ? K3_STATUS_UNSUPPORTED_VERSION :
					   r == K3_PROTO_E_UNKNOWN_TYPE ? K3_STATUS_UNKNOWN_TYPE :
					   r == K3_PROTO_E_OVERSIZED ? K3_STATUS_TOO_LARGE : K3_STATUS_BAD_REQUEST,
					   NULL, "%s (%s)", perr.msg, k3_proto_error_name(r));
			conn_close_after_write(c);
			break;
		}
		if (len >= K3_PROTO_HEADER_SIZE && h.length > K3_LIM_PAYLOAD_SMALL && !c->large_reserved) {
			/* Each frame is bounded; the sum over all connections must be too. */
			if (c->srv->large_reserved + h.length > K3_LIM_INBUF_LARGE_TOTAL) {
				k3_log_notice("connection %llu (uid %u pid %d): refusing a %u-byte %s: "
					      "%llu bytes of large frames already in flight",
					      (unsigned long long)c->id, (unsigned)c->uid, (int)c->pid,
					      h.length, k3_proto_type_name(h.type),
					      (unsigned long long)c->srv->large_reserved);
				k3_conn_send_error(c, h.request_id, K3_STATUS_BUSY, NULL,
						   "k3d is already receiving %llu MiB of large requests; retry "
						   "when they are done",
						   (unsigned long long)(c->srv->large_reserved >> 20));
				conn_close_after_write(c);
				break;
			}
			c->large_reserved = h.length;
			c->srv->large_reserved += h.length;
			if (!c->large_timer)
				c->large_timer = evtimer_new(c->srv->base, large_timeout_cb, c);
			if (c->large_timer) {
				/* --frame-timeout (default 60 s: 132 MiB at 2.2 MB/s, where a
				 * local socket moves GB/s): a peer cannot hold its share of
				 * the large-frame budget by sending half a frame. */
				struct timeval tv = timeval_of(c->srv->opts->frame_timeout_s);

				evtimer_add(c->large_timer, &tv);
			}
		}
		if (len < K3_PROTO_HEADER_SIZE || len - K3_PROTO_HEADER_SIZE < h.length)
			break;   /* wait for the rest; the length is already bounded */
		n = K3_PROTO_HEADER_SIZE + h.length;
		p = evbuffer_pullup(in, (ssize_t)n);
		if (!p || k3_proto_frame_split(p, n, &h, &payload, &perr) != (int)n) {
			conn_close(c);
			break;
		}
		handle_frame(c, &h, payload);
		conn_release_large(c);
		if (c->bev)
			evbuffer_drain(in, n);
	}
	k3_conn_unref(c);
}

static void conn_write_cb(struct bufferevent *bev, void *arg)
{
	struct k3_conn *c = arg;
	size_t left = evbuffer_get_length(bufferevent_get_output(bev));

	if (left == 0 && c->n_flush)
		conn_run_flush(c, true);
	if (c->closing && left == 0) {
		conn_close(c);
		return;
	}
	if (c->read_paused && left <= K3_LIM_CONN_OUTBUF / 2) {
		c->read_paused = false;
		bufferevent_enable(bev, EV_READ);
		conn_read_cb(bev, c);   /* frames may be waiting already */
	}
}

static void conn_event_cb(struct bufferevent *bev, short what, void *arg)
{
	struct k3_conn *c = arg;

	(void)bev; (void)what;
	conn_close(c);
}

/* A deadline from the accept, not a read timeout: a peer trickling one
 * byte at a time would reset a read timeout forever. */
static void hello_timeout_cb(evutil_socket_t fd, short what, void *arg)
{
	struct k3_conn *c = arg;

	(void)fd; (void)what;
	k3_log_info("connection %llu (uid %u pid %d): no HELLO within %u s, closing",
		    (unsigned long long)c->id, (unsigned)c->uid, (int)c->pid, K3_LIM_HELLO_TIMEOUT_S);
	conn_close(c);
}

static void large_timeout_cb(evutil_socket_t fd, short what, void *arg)
{
	struct k3_conn *c = arg;

	(void)fd; (void)what;
	k3_log_info("connection %llu (uid %u pid %d): a %u-byte frame did not arrive within %g s "
		    "(--frame-timeout), closing", (unsigned long long)c->id, (unsigned)c->uid,
		    (int)c->pid, c->large_reserved, c->srv->opts->frame_timeout_s);
	conn_close(c);
}

/* ---- accepting ----------------------------------------------------------- */

static bool is_gateway_uid(const struct k3_options *o, uid_t uid)
{
	for (unsigned i = 0; i < o->n_gateway_uid; i++)
		if (o->gateway_uid[i] == uid)
			return true;
	return false;
}

static bool peer_allowed(const struct k3_server *s, uid_t uid, gid_t gid, bool *may_shutdown)
{
	const struct k3_options *o = s->opts;

	*may_shutdown = uid == 0 || uid == getuid();
	for (unsigned i = 0; i < o->n_allow_uid; i++)
		if (o->allow_uid[i] == uid)
			*may_shutdown = true;
	if (*may_shutdown || is_gateway_uid(o, uid))
		return true;
	for (unsigned i = 0; i < o->n_allow_gid; i++)
		if (o->allow_gid[i] == gid)
			return true;
	return false;
}

static unsigned conns_of_uid(const struct k3_server *s, uid_t uid)
{
	unsigned n = 0;

	for (const struct k3_conn *c = s->conns; c; c = c->next)
		n += c->uid == uid;
	return n;
}

/*
 * Whether a new connection from uid fits (docs/k3d.8, "CONNECTIONS").
 * --max-connections is split three ways: --gateway-connections for the
 * --gateway-uid peers (when any is given), which use nothing else; the
 * rest for everyone else, of which only root may take the last
 * K3_LIM_CONN_ROOT_RESERVED; and every uid but root and the gateway's holds
 * at most --max-connections-per-uid. Returns 0, or -EBUSY with why (for
 * the peer) filled.
 */
static int admit(const struct k3_server *s, uid_t uid, bool gateway, char *why, size_t n)
{
	const struct k3_options *o = s->opts;
	unsigned gw_share = o->n_gateway_uid ? o->gateway_connections : 0;
	unsigned others = s->n_conns - s->n_gateway, mine;

	if (gateway) {
		if (s->n_gateway < gw_share)
			return 0;
		snprintf(why, n, "too many connections: k3-gateway's %u (k3d --gateway-connections) "
			 "are all in use", gw_share);
		return -EBUSY;
	}
	if (uid == 0) {
		if (others < o->max_connections - gw_share)
			return 0;
		snprintf(why, n, "too many connections: all %u are in use, root's %u included "
			 "(k3d --max-connections)", o->max_connections - gw_share, K3_LIM_CONN_ROOT_RESERVED);
		return -EBUSY;
	}
	if (others >= o->max_connections - gw_share - K3_LIM_CONN_ROOT_RESERVED) {
		snprintf(why, n, "too many connections: all %u for local clients are in use "
			 "(k3d --max-connections %u keeps %u for root%s)",
			 o->max_connections - gw_share - K3_LIM_CONN_ROOT_RESERVED, o->max_connections,
			 K3_LIM_CONN_ROOT_RESERVED, gw_share ? " and the rest for k3-gateway" : "");
		return -EBUSY;
	}
	mine = conns_of_uid(s, uid);
	if (mine >= o->max_connections_per_uid) {
		snprintf(why, n, "too many connections: uid %u already holds %u (k3d "
			 "--max-connections-per-uid); close some, or wait for idle ones to time out "
			 "(--idle-timeout)", (unsigned)uid, mine);
		return -EBUSY;
	}
	return 0;
}

/* A refused connection is logged, but a peer retrying in a loop must not
 * flood the journal: at most one line a second, with the count since. */
static void log_refusal(struct k3_server *s, uid_t uid, pid_t pid, const char *why)
{
	double now = mono_s();

	if (now - s->refusal_logged_s < 1.0) {
		s->refusals_unlogged++;
		return;
	}
	if (s->refusals_unlogged)
		k3_log_warning("refusing connection from uid %u pid %d: %s (and %u more refusals "
			       "since the last such line)", (unsigned)uid, (int)pid, why, s->refusals_unlogged);
	else
		k3_log_warning("refusing connection from uid %u pid %d: %s", (unsigned)uid, (int)pid, why);
	s->refusal_logged_s = now;
	s->refusals_unlogged = 0;
}

/* Writes one ERROR frame straight to a socket we are about to close. */
static void refuse_fd(struct k3_server *s, int fd, enum k3_proto_status status, const char *msg)
{
	struct k3_msg_error e;

	memset(&e, 0, sizeof(e));
	e.status = status; e.has_status = true;
	e.message = k3_proto_str_of(msg); e.has_message = true;
	k3_proto_buf_reset(&s->scratch);
	if (k3_proto_encode(&s->scratch, K3_MSG_ERROR, 0, &e, NULL) == 0 &&
	    send(fd, s->scratch.data, s->scratch.len, MSG_DONTWAIT | MSG_NOSIGNAL) < 0)
		k3_log_debug("refusal not delivered: %s", strerror(errno));
	close(fd);
}

static void accept_cb(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa, int socklen,
		      void *arg)
{
	struct k3_server *s = arg;
	struct ucred cred;
	socklen_t len = sizeof(cred);
	struct timeval hello_tv = { K3_LIM_HELLO_TIMEOUT_S, 0 };
	struct k3_conn *c;
	char why[256];
	bool may_shutdown, gateway;

	(void)l; (void)sa; (void)socklen;
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
		k3_log_warning("cannot read peer credentials: %s, refusing", strerror(errno));
		close(fd);
		return;
	}
	if (!peer_allowed(s, cred.uid, cred.gid, &may_shutdown)) {
		k3_log_notice("refusing connection from uid %u gid %u pid %d: not in the allow list "
			      "(see --allow-uid/--allow-gid)", (unsigned)cred.uid, (unsigned)cred.gid,
			      (int)cred.pid);
		refuse_fd(s, fd, K3_STATUS_UNAUTHORIZED, "peer uid is not allowed by this k3d");
		return;
	}
	gateway = is_gateway_uid(s->opts, cred.uid);
	if (admit(s, cred.uid, gateway, why, sizeof(why)) < 0) {
		log_refusal(s, cred.uid, cred.pid, why);
		refuse_fd(s, fd, K3_STATUS_BUSY, why);
		return;
	}
	c = calloc(1, sizeof(*c));
	if (!c) {
		close(fd);
		return;
	}
	c->hello_timer = evtimer_new(s->base, hello_timeout_cb, c);
	c->bev = c->hello_timer ? bufferevent_socket_new(s->base, fd, BEV_OPT_CLOSE_ON_FREE) : NULL;
	if (!c->bev) {
		if (c->hello_timer)
			event_free(c->hello_timer);
		free(c);
		close(fd);
		return;
	}
	c->srv = s;
	c->refs = 1;
	c->id = ++s->next_conn_id;
	c->uid = cred.uid;
	c->gid = cred.gid;
	c->pid = cred.pid;
	c->may_shutdown = may_shutdown;
	c->gateway = gateway;
	c->last_active_s = mono_s();
	c->next = s->conns;
	if (s->conns)
		s->conns->prev = c;
	s->conns = c;
	s->n_conns++;
	s->n_gateway += gateway;
	bufferevent_setcb(c->bev, conn_read_cb, conn_write_cb, conn_event_cb, c);
	bufferevent_setwatermark(c->bev, EV_WRITE, 0, 0);
	evtimer_add(c->hello_timer, &hello_tv);
	bufferevent_enable(c->bev, EV_READ | EV_WRITE);
	k3_log_debug("connection %llu from uid %u pid %d", (unsigned long long)c->id,
		     (unsigned)cred.uid, (int)cred.pid);
}

static void listener_error_cb(struct evconnlistener *l, void *arg)
{
	int e = EVUTIL_SOCKET_ERROR();

	(void)l; (void)arg;
	/* EMFILE and friends: keep serving existing clients. */
	k3_log_warning("accept failed: %s", evutil_socket_error_to_string(e));
}

static int add_listener(struct k3_server *s, int fd, struct k3_err *err)
{
	struct evconnlistener *l;

	if (s->n_listeners == MAX_LISTENERS)
		return k3_err_set(err, -EMFILE, "more than %d listening sockets", MAX_LISTENERS);
	l = evconnlistener_new(s->base, accept_cb, s, LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC,
			       -1, fd);
	if (!l)
		return k3_err_set(err, -ENOMEM, "cannot watch listening socket %d", fd);
	evconnlistener_set_error_cb(l, listener_error_cb);
	s->listeners[s->n_listeners++] = l;
	return 0;
}

/* The socket's directory must not let anyone else swap the socket. */
static int check_socket_dir(const char *path, struct k3_err *err)
{
	char dir[sizeof(((struct sockaddr_un *)0)->sun_path)];
	char *slash;
	struct stat st;

	snprintf(dir, sizeof(dir), "%s", path);
	slash = strrchr(dir, '/');
	if (!slash)
		snprintf(dir, sizeof(dir), ".");
	else if (slash == dir)
		dir[1] = '\0';
	else
		*slash = '\0';
	if (lstat(dir, &st) != 0)
		return k3_err_set(err, -errno, "socket directory '%s': %s (create it with mode 0700 "
				  "or pick another --socket)", dir, strerror(errno));
	if (!S_ISDIR(st.st_mode))
		return k3_err_set(err, -ENOTDIR, "socket directory '%s' is not a directory "
				  "(symbolic links are refused)", dir);
	if (st.st_uid != getuid() && st.st_uid != 0)
		return k3_err_set(err, -EPERM, "socket directory '%s' belongs to uid %u, not to us or root",
				  dir, (unsigned)st.st_uid);
	if ((st.st_mode & (S_IWGRP | S_IWOTH)) && !(st.st_mode & S_ISVTX))
		return k3_err_set(err, -EPERM, "socket directory '%s' is writable by others (mode %03o); "
				  "use a private directory", dir, (unsigned)(st.st_mode & 0777));
	return 0;
}

/* Removes a stale socket left by a crashed k3d; refuses a live one. */
static int clear_stale_socket(const struct sockaddr_un *sun, struct k3_err *err)
{
	struct stat st;
	int fd, r;

	if (lstat(sun->sun_path, &st) != 0)
		return errno == ENOENT ? 0 : k3_err_set(err, -errno, "'%s': %s", sun->sun_path, strerror(errno));
	if (!S_ISSOCK(st.st_mode))
		return k3_err_set(err, -EEXIST, "'%s' exists and is not a socket; refusing to replace it",
				  sun->sun_path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return k3_err_set(err, -errno, "socket: %s", strerror(errno));
	r = connect(fd, (const struct sockaddr *)sun, sizeof(*sun));
	close(fd);
	if (r == 0)
		return k3_err_set(err, -EADDRINUSE, "another k3d is already serving '%s'", sun->sun_path);
	if (unlink(sun->sun_path) != 0)
		return k3_err_set(err, -errno, "cannot remove stale socket '%s': %s", sun->sun_path,
				  strerror(errno));
	return 0;
}

static int bind_own(struct k3_server *s, struct k3_err *err)
{
	struct sockaddr_un sun;
	mode_t old;
	int fd, r;

	memset(&sun, 0, sizeof(sun));
	sun.sun_family = AF_UNIX;
	if (strlen(s->opts->socket_path) >= sizeof(sun.sun_path))
		return k3_err_set(err, -ENAMETOOLONG, "socket path '%s' is too long", s->opts->socket_path);
	strcpy(sun.sun_path, s->opts->socket_path);
	if ((r = check_socket_dir(sun.sun_path, err)) < 0 || (r = clear_stale_socket(&sun, err)) < 0)
		return r;
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return k3_err_set(err, -errno, "socket: %s", strerror(errno));
	/* The socket is born with its final mode: no window where others can connect. */
	old = umask(s->opts->n_allow_gid ? 0117 : 0177);
	r = bind(fd, (struct sockaddr *)&sun, sizeof(sun));
	umask(old);
	if (r != 0) {
		r = -errno;
		close(fd);
		return k3_err_set(err, r, "cannot bind '%s': %s", sun.sun_path, strerror(-r));
	}
	if (listen(fd, 64) != 0) {
		r = -errno;
		close(fd);
		unlink(sun.sun_path);
		return k3_err_set(err, r, "cannot listen on '%s': %s", sun.sun_path, strerror(-r));
	}
	strcpy(s->own_path, sun.sun_path);
	return add_listener(s, fd, err);
}

int k3_server_listen(struct k3_server *s, struct k3_err *err)
{
	int n = k3_sockact_listen_fds(AF_UNIX, "k3d.socket", err), r;

	if (n < 0)
		return n;
	for (int i = 0; i < n; i++)
		if ((r = add_listener(s, K3_SOCKACT_FIRST_FD + i, err)) < 0)
			return r;
	if (n > 0) {
		k3_log_info("serving %d socket(s) passed by systemd", n);
		return 0;
	}
	if ((r = bind_own(s, err)) < 0)
		return r;
	k3_log_info("listening on %s", s->own_path);
	return 0;
}

const char *k3_server_socket_path(const struct k3_server *s)
{
	return s->own_path;
}

/* ---- lifecycle ------------------------------------------------------------ */

static void watchdog_cb(evutil_socket_t fd, short what, void *arg)
{
	(void)fd; (void)what; (void)arg;
	sd_notify(0, "WATCHDOG=1");
}

/* --max-connections needs that many fds and k3d's own: raise the soft
 * open-file limit up to the hard one if it is short (systemd's
 * LimitNOFILE= sets both), and say so when even that is not enough, since
 * accept() would then fail with EMFILE before the connection limits
 * apply. */
static void raise_fd_limit(rlim_t want)
{
	struct rlimit rl;
	rlim_t was;

	if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= want)
		return;
	was = rl.rlim_cur;
	rl.rlim_cur = rl.rlim_max < want ? rl.rlim_max : want;
	if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
		rl.rlim_cur = was;
	if (rl.rlim_cur < want)
		k3_log_warning("open-file limit %llu is below --max-connections plus %d for k3d's own "
			       "files; raise it (ulimit -n, LimitNOFILE=) or lower --max-connections",
			       (unsigned long long)rl.rlim_cur, OWN_FDS);
}

struct k3_server *k3_server_new(struct event_base *base, const struct k3_options *opts,
				struct k3_err *err)
{
	struct k3_server *s = calloc(1, sizeof(*s));
	uint64_t usec = 0;

	if (!s) {
		k3_err_set(err, -ENOMEM, "out of memory");
		return NULL;
	}
	s->base = base;
	s->opts = opts;
	s->info.state = K3_STATE_NO_MODEL;
	s->info.status_text = "no model loaded";
	k3_proto_buf_init(&s->scratch, K3_LIM_PAYLOAD_MAX + K3_PROTO_HEADER_SIZE);
	clock_gettime(CLOCK_MONOTONIC, &s->started);
	raise_fd_limit(opts->max_connections + OWN_FDS);
	if (sd_watchdog_enabled(0, &usec) > 0 && usec > 0) {
		struct timeval tv = { (time_t)(usec / 2 / 1000000), (suseconds_t)(usec / 2 % 1000000) };

		s->watchdog = event_new(base, -1, EV_PERSIST, watchdog_cb, s);
		if (s->watchdog)
			event_add(s->watchdog, &tv);
		k3_log_info("systemd watchdog: pinging every %.1f s", (double)usec / 2e6);
	}
	return s;
}

struct k3_server *k3_server_free(struct k3_server *s)
{
	if (!s)
		return NULL;
	while (s->conns)
		conn_close(s->conns);
	for (unsigned i = 0; i < s->n_listeners; i++)
		evconnlistener_free(s->listeners[i]);
	if (s->own_path[0])
		unlink(s->own_path);
	if (s->drain_timer)
		event_free(s->drain_timer);
	if (s->watchdog)
		event_free(s->watchdog);
	k3_proto_buf_release(&s->scratch);
	free(s);
	return NULL;
}

void k3_server_set_hooks(struct k3_server *s, const struct k3_server_hooks *hooks)
{
	s->hooks = *hooks;
}

void k3_server_set_info(struct k3_server *s, const struct k3_server_info *info)
{
	s->info = *info;
}

static void server_maybe_exit(struct k3_server *s)
{
	if (s->draining && !s->drain_waiting && s->n_conns == 0)
		event_base_loopexit(s->base, NULL);
}

/* Stops accepting and removes the socket file we bound (a systemd socket
 * is systemd's to keep). */
static void close_listeners(struct k3_server *s)
{
	for (unsigned i = 0; i < s->n_listeners; i++)
		evconnlistener_free(s->listeners[i]);
	s->n_listeners = 0;
	if (s->own_path[0]) {
		unlink(s->own_path);
		s->own_path[0] = '\0';
	}
}

/* Running work is done (or out of time): flush every client and go. */
static void drain_finish(struct k3_server *s)
{
	struct k3_conn *c = s->conns, *next;

	s->drain_waiting = false;
	close_listeners(s);
	for (; c; c = next) {
		next = c->next;
		conn_close_after_write(c);
	}
	server_maybe_exit(s);
}

static void drain_timer_cb(evutil_socket_t fd, short what, void *arg)
{
	struct k3_server *s = arg;
	struct timeval grace = { DRAIN_GRACE_S, 0 };

	(void)fd; (void)what;
	if (s->drain_waiting && !s->drain_cancelled && s->hooks.cancel_running) {
		/* Cancelled work stops within one layer step and still sends its
		 * client DONE{cancelled}; closing now would cut the stream off
		 * without a terminal frame. */
		k3_log_warning("%s: cancelling the running generation",
			       s->drain_hurried ? "asked to stop again" : "drain timeout");
		s->drain_cancelled = true;
		evtimer_add(s->drain_timer, &grace);
		s->hooks.cancel_running(s->hooks.ctx);
		return;
	}
	if (s->drain_waiting) {
		k3_log_warning("drain timeout: stopping with work still running");
		drain_finish(s);
		/* One more grace period for clients to read their last bytes. */
		evtimer_add(s->drain_timer, &grace);
		return;
	}
	/* Clients that do not read their last bytes do not hold us up. */
	k3_log_warning("clients did not read their last replies, exiting");
	event_base_loopexit(s->base, NULL);
}

void k3_server_drain(struct k3_server *s)
{
	double t = s->opts->drain_timeout_s;
	struct timeval tv = timeval_of(t);
	unsigned running = 0;

	if (s->draining) {
		/* Asked again (a second Ctrl-C, SIGTERM or shutdown): the user
		 * does not want to wait for the drain timeout. */
		if (s->drain_waiting && !s->drain_cancelled && s->drain_timer) {
			s->drain_hurried = true;
			drain_timer_cb(-1, 0, s);
		}
		return;
	}
	s->draining = true;
	sd_notify(0, "STOPPING=1\nSTATUS=Draining");
	k3_log_notice("draining: no new work");
	/* The listeners stay open while running work finishes (drain_finish
	 * closes them): a client that connects now, such as k3-gateway's
	 * /health, gets HELLO_OK{DRAINING} and GENERATE gets SHUTTING_DOWN,
	 * instead of a missing socket that reads as "k3d is not running". */
	if (s->hooks.drain)
		running = s->hooks.drain(s->hooks.ctx);
	s->drain_timer = evtimer_new(s->base, drain_timer_cb, s);
	if (s->drain_timer)
		evtimer_add(s->drain_timer, &tv);
	if (running) {
		k3_log_notice("waiting up to %g s for %u running generation(s)", t, running);
		s->drain_waiting = true;
		return;
	}
	drain_finish(s);
}

void k3_server_drain_done(struct k3_server *s)
{
	if (s->draining && s->drain_waiting)
		drain_finish(s);
}

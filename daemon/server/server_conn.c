/*
 * server_conn.c - k3d's connections (server_internal.h says which server
 * file does what): accepting a peer by its SO_PEERCRED credentials and the
 * connection limits of docs/k3d.8 "CONNECTIONS", reference counting,
 * sending with backpressure, flush waiters, and the deadlines that close a
 * connection (no HELLO in time, --idle-timeout, a large frame that does
 * not arrive within --frame-timeout).
 *
 * A refused peer gets one ERROR frame written straight to its socket and
 * is closed; refusals are logged at most once a second.
 */
#include "server/server_internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/buffer.h>

#include "base/log.h"

/* an idle-closed peer that does not read its ERROR is cut off after */
enum { IDLE_CLOSE_GRACE_S = 5 };

void server_conn_release_large(struct k3_conn *c)
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

void server_conn_close(struct k3_conn *c)
{
	struct k3_server *s = c->srv;

	if (!c->bev)
		return;
	conn_run_flush(c, false);
	server_conn_release_large(c);
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

void server_conn_close_after_write(struct k3_conn *c)
{
	if (!c->bev)
		return;
	c->closing = true;
	bufferevent_disable(c->bev, EV_READ);
	if (evbuffer_get_length(bufferevent_get_output(c->bev)) == 0)
		server_conn_close(c);
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
	c->last_active_s = server_mono_s();
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
	k3_msg_error_set_status(&e, status);
	/* Keep the message valid UTF-8 even if it quotes peer bytes. */
	for (char *p = msg; *p; p++)
		if ((unsigned char)*p >= 0x80)
			*p = '?';
	k3_msg_error_set_message(&e, k3_proto_str_of(msg));
	if (param)
		k3_msg_error_set_param(&e, k3_proto_str_of(param));
	return k3_conn_send(c, K3_MSG_ERROR, request_id, &e);
}

/* ---- deadlines and the large-frame budget --------------------------------- */

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
	double t = s->opts->idle_timeout_s, idle = server_mono_s() - c->last_active_s;
	struct timeval tv;

	(void)fd; (void)what;
	if (!c->bev)
		return;
	if (c->closing) {
		/* Our idle ERROR was not read within the grace period; any
		 * other close (a drain, a bad frame) runs its own course. */
		if (c->idle_closed)
			server_conn_close(c);
		return;
	}
	if (idle < t || c->refs > 1) {
		tv = server_timeval_of(idle < t ? t - idle : t);
		evtimer_add(c->idle_timer, &tv);
		return;
	}
	k3_log_info("connection %llu (uid %u pid %d): idle for %g s (--idle-timeout), closing",
		    (unsigned long long)c->id, (unsigned)c->uid, (int)c->pid, t);
	if (evbuffer_get_length(bufferevent_get_output(c->bev)) > 0) {
		/* Replies queued for a whole timeout: the peer is not reading. */
		server_conn_close(c);
		return;
	}
	k3_conn_send_error(c, 0, K3_STATUS_IDLE_TIMEOUT, NULL,
			   "k3d closed this connection: idle for %g s (k3d --idle-timeout); "
			   "reconnect to go on", t);
	c->idle_closed = true;
	server_conn_close_after_write(c);
	if (c->bev) {
		tv = server_timeval_of(IDLE_CLOSE_GRACE_S);
		evtimer_add(c->idle_timer, &tv);
	}
}

void server_conn_hello_done(struct k3_conn *c, uint64_t caps)
{
	struct k3_server *s = c->srv;

	c->hello_done = true;
	c->caps = caps;
	if (c->hello_timer) {
		event_free(c->hello_timer);
		c->hello_timer = NULL;
	}
	if (s->opts->idle_timeout_s > 0 && !c->idle_timer) {
		struct timeval tv = server_timeval_of(s->opts->idle_timeout_s);

		c->idle_timer = evtimer_new(s->base, idle_timeout_cb, c);
		if (c->idle_timer)
			evtimer_add(c->idle_timer, &tv);
	}
}

static void large_timeout_cb(evutil_socket_t fd, short what, void *arg);

int server_conn_reserve_large(struct k3_conn *c, const struct k3_proto_header *h)
{
	/* Each frame is bounded; the sum over all connections must be too. */
	if (c->srv->large_reserved + h->length > K3_LIM_INBUF_LARGE_TOTAL) {
		k3_log_notice("connection %llu (uid %u pid %d): refusing a %u-byte %s: "
			      "%llu bytes of large frames already in flight",
			      (unsigned long long)c->id, (unsigned)c->uid, (int)c->pid,
			      h->length, k3_proto_type_name(h->type),
			      (unsigned long long)c->srv->large_reserved);
		k3_conn_send_error(c, h->request_id, K3_STATUS_BUSY, NULL,
				   "k3d is already receiving %llu MiB of large requests; retry "
				   "when they are done",
				   (unsigned long long)(c->srv->large_reserved >> 20));
		server_conn_close_after_write(c);
		return -EBUSY;
	}
	c->large_reserved = h->length;
	c->srv->large_reserved += h->length;
	if (!c->large_timer)
		c->large_timer = evtimer_new(c->srv->base, large_timeout_cb, c);
	if (c->large_timer) {
		/* --frame-timeout (default 60 s: 132 MiB at 2.2 MB/s, where a
		 * local socket moves GB/s): a peer cannot hold its share of
		 * the large-frame budget by sending half a frame. */
		struct timeval tv = server_timeval_of(c->srv->opts->frame_timeout_s);

		evtimer_add(c->large_timer, &tv);
	}
	return 0;
}

static void conn_write_cb(struct bufferevent *bev, void *arg)
{
	struct k3_conn *c = arg;
	size_t left = evbuffer_get_length(bufferevent_get_output(bev));

	if (left == 0 && c->n_flush)
		conn_run_flush(c, true);
	if (c->closing && left == 0) {
		server_conn_close(c);
		return;
	}
	if (c->read_paused && left <= K3_LIM_CONN_OUTBUF / 2) {
		c->read_paused = false;
		bufferevent_enable(bev, EV_READ);
		server_conn_read_cb(bev, c);   /* frames may be waiting already */
	}
}

static void conn_event_cb(struct bufferevent *bev, short what, void *arg)
{
	struct k3_conn *c = arg;

	(void)bev; (void)what;
	server_conn_close(c);
}

/* A deadline from the accept, not a read timeout: a peer trickling one
 * byte at a time would reset a read timeout forever. */
static void hello_timeout_cb(evutil_socket_t fd, short what, void *arg)
{
	struct k3_conn *c = arg;

	(void)fd; (void)what;
	k3_log_info("connection %llu (uid %u pid %d): no HELLO within %u s, closing",
		    (unsigned long long)c->id, (unsigned)c->uid, (int)c->pid, K3_LIM_HELLO_TIMEOUT_S);
	server_conn_close(c);
}

static void large_timeout_cb(evutil_socket_t fd, short what, void *arg)
{
	struct k3_conn *c = arg;

	(void)fd; (void)what;
	k3_log_info("connection %llu (uid %u pid %d): a %u-byte frame did not arrive within %g s "
		    "(--frame-timeout), closing", (unsigned long long)c->id, (unsigned)c->uid,
		    (int)c->pid, c->large_reserved, c->srv->opts->frame_timeout_s);
	server_conn_close(c);
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
	double now = server_mono_s();

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
	k3_msg_error_set_status(&e, status);
	k3_msg_error_set_message(&e, k3_proto_str_of(msg));
	k3_proto_buf_reset(&s->scratch);
	if (k3_proto_encode(&s->scratch, K3_MSG_ERROR, 0, &e, NULL) == 0 &&
	    send(fd, s->scratch.data, s->scratch.len, MSG_DONTWAIT | MSG_NOSIGNAL) < 0)
		k3_log_debug("refusal not delivered: %s", strerror(errno));
	close(fd);
}

void server_accept_cb(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa,
		      int socklen, void *arg)
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
	c->last_active_s = server_mono_s();
	c->next = s->conns;
	if (s->conns)
		s->conns->prev = c;
	s->conns = c;
	s->n_conns++;
	s->n_gateway += gateway;
	bufferevent_setcb(c->bev, server_conn_read_cb, conn_write_cb, conn_event_cb, c);
	bufferevent_setwatermark(c->bev, EV_WRITE, 0, 0);
	evtimer_add(c->hello_timer, &hello_tv);
	bufferevent_enable(c->bev, EV_READ | EV_WRITE);
	k3_log_debug("connection %llu from uid %u pid %d", (unsigned long long)c->id,
		     (unsigned)cred.uid, (int)cred.pid);
}

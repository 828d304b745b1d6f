/*
 * gw_daemon.c - k3 protocol client connection on a libevent bufferevent.
 * Framing and schema checks are libk3proto's; this file only moves bytes.
 */
#include "gw_daemon.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>

#include "k3_client_socket.h"

struct gw_daemon {
	struct event_base *base;
	struct bufferevent *bev;
	struct event *timer;        /* handshake timeout, then deferred failure */
	gw_daemon_frame_fn frame_fn;
	gw_daemon_fail_fn fail_fn;
	void *arg;
	bool hello_ok;
	bool failed;                /* fail_fn ran (or is scheduled): no more callbacks */
	bool free_pending;          /* gw_daemon_free called inside a callback */
	unsigned depth;             /* callbacks currently on the stack */
	char why[256];              /* pending failure reason */
	char path[108];             /* socket path, for failure messages */
	unsigned timeout_s;         /* handshake bound, for failure messages */
	union k3_proto_body body;
};

static void really_free(struct gw_daemon *d)
{
	if (d->bev)
		bufferevent_free(d->bev);
	if (d->timer)
		event_free(d->timer);
	free(d);
}

/*
 * Every libevent callback of this module is bracketed by enter() and
 * leave(): a gw_daemon_free from inside a user callback only marks the
 * object, and the outermost leave() frees it. Nothing else frees while a
 * callback runs, so no code after a user callback touches freed memory.
 */
static void enter(struct gw_daemon *d)
{
	d->depth++;
}

static void leave(struct gw_daemon *d)
{
	d->depth--;
	if (d->free_pending && d->depth == 0)
		really_free(d);
}

/* Reports a failure once; later failures are dropped. Called only between
 * enter() and leave(), so it never frees d itself. */
static void fail_now(struct gw_daemon *d, const char *why)
{
	if (d->failed)
		return;
	d->failed = true;
	if (d->bev)
		bufferevent_disable(d->bev, EV_READ | EV_WRITE);
	d->fail_fn(d, why, d->arg);
}

/* fail_now with a formatted reason (each names the socket path). */
static void fail_fmt(struct gw_daemon *d, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
static void fail_fmt(struct gw_daemon *d, const char *fmt, ...)
{
	char why[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	fail_now(d, why);
}

static void timer_cb(evutil_socket_t fd, short what, void *arg)
{
	struct gw_daemon *d = arg;

	(void)fd;
	(void)what;
	enter(d);
	if (d->why[0])
		fail_now(d, d->why);
	else if (!d->hello_ok)
		fail_fmt(d, "k3d at '%s' accepted the connection but did not answer HELLO within %u s",
			 d->path, d->timeout_s);
	leave(d);
}

/* Fails from the event loop rather than from the caller's stack. */
static void fail_later(struct gw_daemon *d, const char *why)
{
	struct timeval zero = { 0, 0 };

	snprintf(d->why, sizeof(d->why), "%s", why);
	event_del(d->timer);
	event_add(d->timer, &zero);
}

static void read_cb(struct bufferevent *bev, void *arg)
{
	struct gw_daemon *d = arg;
	struct evbuffer *in = bufferevent_get_input(bev);

	enter(d);
	while (!d->failed && !d->free_pending) {
		size_t have = evbuffer_get_length(in);
		struct k3_proto_header h;
		struct k3_proto_err err;
		const uint8_t *payload;
		uint8_t *p;
		int r;

		if (have < K3_PROTO_HEADER_SIZE)
			break;
		p = evbuffer_pullup(in, K3_PROTO_HEADER_SIZE);
		r = k3_proto_frame_split(p, K3_PROTO_HEADER_SIZE, &h, &payload, &err);
		if (r < 0) {
			fail_fmt(d, "bad frame from k3d: %s", err.msg);
			break;
		}
		if (have < (size_t)K3_PROTO_HEADER_SIZE + h.length)
			break;
		p = evbuffer_pullup(in, (ev_ssize_t)(K3_PROTO_HEADER_SIZE + h.length));
		if (!p) {
			fail_now(d, "out of memory reading from k3d");
			break;
		}
		r = k3_proto_frame_split(p, K3_PROTO_HEADER_SIZE + h.length, &h, &payload, &err);
		if (r > 0)
			r = k3_proto_decode(h.type, payload, h.length, &d->body, &err);
		if (r < 0) {
			fail_fmt(d, "bad frame from k3d: %s", err.msg);
			break;
		}
		if (!d->hello_ok && h.type == K3_MSG_HELLO_OK) {
			d->hello_ok = true;
			event_del(d->timer);
		}
		d->frame_fn(d, &h, &d->body, d->arg);
		if (d->free_pending)
			break;
		evbuffer_drain(in, K3_PROTO_HEADER_SIZE + h.length);
	}
	leave(d);
}

static void event_cb(struct bufferevent *bev, short what, void *arg)
{
	struct gw_daemon *d = arg;
	int e = EVUTIL_SOCKET_ERROR();
	bool closed = (what & BEV_EVENT_EOF) ||
		      ((what & BEV_EVENT_ERROR) && (e == ECONNRESET || e == EPIPE));

	(void)bev;
	if (what & BEV_EVENT_CONNECTED)
		return;
	/* A peer that closes with our HELLO unread makes the kernel report
	 * ECONNRESET (or EPIPE on write) rather than EOF: all three mean the
	 * other end hung up, which "Connection reset by peer" does not say. */
	enter(d);
	if (closed && !d->hello_ok)
		fail_fmt(d, "k3d at '%s' closed the connection before answering HELLO (is it a k3d "
			 "socket?)", d->path);
	else if (closed)
		fail_fmt(d, "k3d at '%s' closed the connection", d->path);
	else if (what & BEV_EVENT_ERROR)
		fail_fmt(d, "cannot reach k3d at '%s': %s", d->path, evutil_socket_error_to_string(e));
	leave(d);
}

struct gw_daemon *gw_daemon_open(struct event_base *base, const char *path, unsigned timeout_s,
				 gw_daemon_frame_fn frame_fn, gw_daemon_fail_fn fail_fn, void *arg)
{
	struct gw_daemon *d = calloc(1, sizeof(*d));
	struct sockaddr_un sun = { .sun_family = AF_UNIX };
	struct timeval tv = { (time_t)timeout_s, 0 };
	struct k3_msg_hello hello = { 0 };

	if (!d)
		return NULL;
	d->base = base;
	d->frame_fn = frame_fn;
	d->fail_fn = fail_fn;
	d->arg = arg;
	d->timeout_s = timeout_s;
	snprintf(d->path, sizeof(d->path), "%s", path);
	d->timer = evtimer_new(base, timer_cb, d);
	d->bev = bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE);
	if (!d->timer || !d->bev) {
		really_free(d);
		return NULL;
	}
	bufferevent_setcb(d->bev, read_cb, NULL, event_cb, d);
	event_add(d->timer, &tv);
	{
		char why[256];

		/* main() refuses such a path at start-up; this keeps the module safe
		 * on its own. */
		if (k3_client_socket_check(path, why, sizeof(why)) < 0) {
			fail_later(d, why);
			return d;
		}
	}
	memcpy(sun.sun_path, path, strlen(path) + 1);
	if (bufferevent_socket_connect(d->bev, (struct sockaddr *)&sun, sizeof(sun)) < 0) {
		char why[256];

		snprintf(why, sizeof(why), "cannot connect to k3d at '%s': %s", path, strerror(errno));
		fail_later(d, why);
		return d;
	}
	bufferevent_enable(d->bev, EV_READ | EV_WRITE);
	k3_msg_hello_set_client(&hello, k3_proto_str_of("k3-gateway"));
	k3_msg_hello_set_version(&hello, K3_PROTO_VERSION);
	k3_msg_hello_set_caps(&hello, K3_PROTO_CAP_CHAT | K3_PROTO_CAP_TOOLS | K3_PROTO_CAP_PROGRESS);
	if (gw_daemon_send(d, K3_MSG_HELLO, 0, &hello) < 0)
		fail_later(d, "cannot encode HELLO");
	return d;
}

int gw_daemon_send(struct gw_daemon *d, uint32_t type, uint32_t request_id, const void *body)
{
	struct k3_proto_buf buf;
	struct k3_proto_err err;
	int r;

	if (d->failed)
		return -EPIPE;
	k3_proto_buf_init(&buf, (size_t)K3_LIM_PAYLOAD_MAX + K3_PROTO_HEADER_SIZE);
	r = k3_proto_encode(&buf, type, request_id, body, &err);
	if (r == 0 && bufferevent_write(d->bev, buf.data, buf.len) < 0)
		r = -ENOMEM;
	k3_proto_buf_release(&buf);
	return r;
}

void gw_daemon_free(struct gw_daemon *d)
{
	if (!d)
		return;
	if (d->depth) {
		d->free_pending = true;
		d->failed = true;
		return;
	}
	really_free(d);
}

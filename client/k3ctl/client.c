/* client.c - k3ctl's blocking k3 protocol client (see client.h). */
#include "client.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "k3_build_config.h"
#include "k3_client_socket.h"

static int write_all(int fd, const uint8_t *p, size_t n)
{
	while (n) {
		ssize_t w = send(fd, p, n, MSG_NOSIGNAL);

		if (w < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

int k3ctl_client_send(struct k3ctl_client *c, uint32_t type, const void *body,
		      uint32_t *request_id, struct k3_err *err)
{
	struct k3_proto_buf out;
	struct k3_proto_err perr;
	uint32_t rid = c->next_request_id++;
	int r;

	if (c->fd < 0)
		return k3_err_set(err, -ECONNRESET, "%s", c->closed_why[0] ? c->closed_why :
				  "not connected to k3d");
	k3_proto_buf_init(&out, K3_LIM_PAYLOAD_MAX + K3_PROTO_HEADER_SIZE);
	if (k3_proto_encode(&out, type, rid, body, &perr) != 0) {
		k3_proto_buf_release(&out);
		return k3_err_set(err, -EINVAL, "%s", perr.msg);
	}
	r = write_all(c->fd, out.data, out.len);
	k3_proto_buf_release(&out);
	/* One code for "the peer hung up" however it was noticed (recv's EOF
	 * and ECONNRESET give -ECONNRESET too): callers map it to exit 3. */
	if (r == -EPIPE || r == -ECONNRESET)
		return k3_err_set(err, -ECONNRESET, "k3d closed the connection");
	if (r < 0)
		return k3_err_set(err, r, "cannot send to k3d: %s", strerror(-r));
	if (request_id)
		*request_id = rid;
	return 0;
}

int k3ctl_client_recv(struct k3ctl_client *c, int timeout_ms, struct k3_proto_header *h,
		      union k3_proto_body *body, struct k3_err *err)
{
	struct k3_proto_err perr;
	const uint8_t *payload;
	uint8_t chunk[65536];

	k3_proto_buf_consume(&c->in, c->consumed);
	c->consumed = 0;
	for (;;) {
		struct pollfd pfd = { c->fd, POLLIN, 0 };
		ssize_t n;
		int r = k3_proto_frame_split(c->in.data, c->in.len, h, &payload, &perr);

		if (r < 0)
			return k3_err_set(err, -EPROTO, "bad frame from k3d: %s", perr.msg);
		if (r > 0) {
			c->consumed = (size_t)r;
			if (k3_proto_decode(h->type, payload, h->length, body, &perr) != 0)
				return k3_err_set(err, -EPROTO, "bad frame from k3d: %s", perr.msg);
			return 0;
		}
		r = poll(&pfd, 1, timeout_ms);
		if (r < 0 && errno == EINTR)
			return k3_err_set(err, -EINTR, "interrupted");
		if (r < 0)
			return k3_err_set(err, -errno, "poll: %s", strerror(errno));
		if (r == 0)
			return k3_err_set(err, -ETIMEDOUT, "k3d did not answer within %d ms", timeout_ms);
		n = recv(c->fd, chunk, sizeof(chunk), 0);
		if (n < 0 && errno == EINTR)
			return k3_err_set(err, -EINTR, "interrupted");
		/* ECONNRESET: the peer closed with bytes of ours unread; for the
		 * user that is the same as a plain close. */
		if (n == 0 || (n < 0 && errno == ECONNRESET))
			return k3_err_set(err, -ECONNRESET, "k3d closed the connection");
		if (n < 0)
			return k3_err_set(err, -errno, "cannot read from k3d: %s", strerror(errno));
		if (k3_proto_buf_append(&c->in, chunk, (size_t)n) != 0)
			return k3_err_set(err, -ENOMEM, "frame from k3d too large");
	}
}

int k3ctl_client_call(struct k3ctl_client *c, uint32_t type, const void *body, int timeout_ms,
		      struct k3_proto_header *h, union k3_proto_body *reply, uint32_t *status,
		      struct k3_err *err)
{
	uint32_t rid = 0;
	int r = k3ctl_client_send(c, type, body, &rid, err);
	/* A peer that says why and hangs up (k3d refusing a uid it does not
	 * allow) can close before our request is written: its ERROR frame is
	 * still queued for us, so read it instead of reporting a bare close. */
	bool unsent = r == -ECONNRESET;

	if (unsent)
		r = 0;
	while (r == 0) {
		r = k3ctl_client_recv(c, timeout_ms, h, reply, err);
		if (r < 0)
			break;
		if (unsent && h->type != K3_MSG_ERROR)
			return k3_err_set(err, -ECONNRESET, "k3d closed the connection");
		if (h->request_id != rid && h->request_id != 0)
			continue;   /* an event for another request */
		if (h->type == K3_MSG_ERROR) {
			if (status)
				*status = reply->error.status;
			return k3_err_set(err, -EREMOTEIO, "%.*s", (int)reply->error.message.len,
					  reply->error.message.p);
		}
		return 0;
	}
	return r;
}

int k3ctl_client_open(struct k3ctl_client *c, const char *path, struct k3_err *err)
{
	struct sockaddr_un sun;
	struct k3_msg_hello hello;
	struct k3_proto_header h;
	union k3_proto_body reply;
	int r;

	memset(c, 0, sizeof(*c));
	c->fd = -1;
	c->next_request_id = 1;
	/* kept even when this open fails, for k3ctl_client_reopen_if_closed
	 * (a longer path fails k3_client_socket_check below) */
	snprintf(c->path, sizeof(c->path), "%s", path);
	k3_proto_buf_init(&c->in, K3_LIM_PAYLOAD_MAX + K3_PROTO_HEADER_SIZE);
	memset(&sun, 0, sizeof(sun));
	sun.sun_family = AF_UNIX;
	{
		char why[sizeof(err->msg)];

		if ((r = k3_client_socket_check(path, why, sizeof(why))) < 0)
			return k3_err_set(err, r, "%s", why);
	}
	strcpy(sun.sun_path, path);
	c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (c->fd < 0)
		return k3_err_set(err, -errno, "socket: %s", strerror(errno));
	if (connect(c->fd, (struct sockaddr *)&sun, sizeof(sun)) != 0) {
		r = -errno;
		k3ctl_client_close(c);
		return k3_err_set(err, r, "cannot reach k3d at '%s': %s (is it running? "
				  "start it with 'systemctl start k3d' or 'k3d --socket PATH', "
				  "or point --socket/K3D_SOCKET at it)", path, strerror(-r));
	}
	memset(&hello, 0, sizeof(hello));
	k3_msg_hello_set_client(&hello, k3_proto_str_of("k3ctl/" K3_VERSION));
	k3_msg_hello_set_version(&hello, K3_PROTO_VERSION);
	/* jobs: cmd_status decodes STATUS_REPLY's job list */
	k3_msg_hello_set_caps(&hello, K3_PROTO_CAP_CHAT | K3_PROTO_CAP_TOOLS | K3_PROTO_CAP_PROGRESS |
			      K3_PROTO_CAP_JOBS);
	uint32_t status = 0;
	r = k3ctl_client_call(c, K3_MSG_HELLO, &hello, 10000, &h, &reply, &status, err);
	if (r == -EREMOTEIO && (status == K3_STATUS_UNAUTHORIZED || status == K3_STATUS_BUSY)) {
		/* Not this request's fault: the daemon is unavailable to us. */
		k3_err_prefix(err, "k3d at '%s' refused the connection", path);
		k3ctl_client_close(c);
		return status == K3_STATUS_UNAUTHORIZED ? -EPERM : -EBUSY;
	}
	if (r == -EPROTO) {
		/* Bytes that are not a k3d frame: something else owns the path. */
		k3_err_prefix(err, "'%s' answered HELLO with bytes that are not k3d's protocol (is it a "
			      "k3d socket?)", path);
		k3ctl_client_close(c);
		return -EBADMSG;
	}
	if (r == -ECONNRESET) {
		/* Not a k3d, or one that died: say so instead of a bare close. */
		k3ctl_client_close(c);
		return k3_err_set(err, -ECONNRESET, "k3d at '%s' closed the connection before "
				  "answering HELLO (is it a k3d socket? check 'systemctl status k3d')",
				  path);
	}
	if (r < 0 || h.type != K3_MSG_HELLO_OK) {
		if (r == 0 || r == -EREMOTEIO)
			k3_err_prefix(err, "'%s' did not accept k3ctl's HELLO", path);
		k3ctl_client_close(c);
		return r < 0 ? (r == -EREMOTEIO ? -EPROTO : r) : -EPROTO;
	}
	/* Keep HELLO_OK's strings alive past the next recv. */
	if (c->consumed <= sizeof(c->hello_frame)) {
		memcpy(c->hello_frame, c->in.data, c->consumed);
		k3_proto_decode(h.type, c->hello_frame + K3_PROTO_HEADER_SIZE, h.length, &c->hello, NULL);
	}
	return 0;
}

int k3ctl_client_reopen_if_closed(struct k3ctl_client *c)
{
	char path[sizeof(c->path)];
	struct k3_err err = { 0, "" };
	struct pollfd pfd = { c->fd, POLLIN, 0 };
	struct k3_proto_header h;
	union k3_proto_body b;
	int r = 0;

	if (c->fd >= 0) {
		if (poll(&pfd, 1, 0) == 0)
			return 0;   /* nothing arrived: still open */
		/* Between requests k3d sends nothing but its reason to close
		 * (ERROR{idle_timeout}); read up to the end of the stream. */
		while ((r = k3ctl_client_recv(c, 0, &h, &b, &err)) == 0)
			;
		if (r == -ETIMEDOUT)
			return 0;   /* stray frames, but the connection is open */
	}
	snprintf(path, sizeof(path), "%s", c->path);
	k3ctl_client_close(c);
	r = k3ctl_client_open(c, path, &err);
	if (r < 0) {
		k3_err_prefix(&err, "k3d closed the connection, and reconnecting failed");
		memcpy(c->closed_why, err.msg, sizeof(c->closed_why));
	}
	return r;
}

void k3ctl_client_close(struct k3ctl_client *c)
{
	if (c->fd >= 0)
		close(c->fd);
	c->fd = -1;
	k3_proto_buf_release(&c->in);
}

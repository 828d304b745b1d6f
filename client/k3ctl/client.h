/*
 * client.h - k3ctl's blocking connection to k3d: connect, HELLO, send
 * requests, receive frames. One connection, one thread.
 */
#ifndef K3CTL_CLIENT_H
#define K3CTL_CLIENT_H

#include <stdint.h>

#include "base/err.h"
#include "k3_proto.h"

struct k3ctl_client {
	int fd;                      /* -1 when closed */
	char path[108];              /* the socket, for k3ctl_client_reopen_if_closed */
	char closed_why[K3_ERR_MSG_MAX]; /* why a reopen failed ("" if none); sends report it */
	uint32_t next_request_id;
	struct k3_proto_buf in;      /* bytes received, frame at the front */
	size_t consumed;             /* bytes of the frame last returned */
	struct k3_msg_hello_ok hello;/* valid while the client is open */
	uint8_t hello_frame[1024];   /* backing bytes for hello's strings */
};

/*
 * Connects to the socket at path and exchanges HELLO. Returns 0, or a
 * negative errno: -ENOENT / -ECONNREFUSED / -EACCES when no daemon can be
 * reached there, -ENAMETOOLONG for a path longer than
 * K3_CLIENT_SOCKET_PATH_MAX, -ECONNRESET when the peer closed before
 * answering HELLO, -EPERM / -EBUSY when k3d refused the connection (uid
 * not allowed / too many connections), -EBADMSG when the peer answered
 * with bytes that are not k3d frames (k3ctl exits 3 for all of these);
 * -EINVAL for an empty path; -EPROTO when k3d refused the HELLO itself
 * (another protocol version). err names the path and what to do.
 */
int k3ctl_client_open(struct k3ctl_client *c, const char *path, struct k3_err *err);
void k3ctl_client_close(struct k3ctl_client *c);

/* Sends a request; *request_id (may be NULL) gets its id. Returns 0,
 * -EINVAL when the body does not encode, -ECONNRESET when the daemon
 * closed the connection (EPIPE included, and a connection that
 * k3ctl_client_reopen_if_closed could not reopen: err says why), or
 * another negative errno. */
int k3ctl_client_send(struct k3ctl_client *c, uint32_t type, const void *body,
		      uint32_t *request_id, struct k3_err *err);

/*
 * For a client that waits on its user between requests (k3ctl chat at its
 * prompt), longer than k3d's --idle-timeout: when k3d has closed the
 * connection meanwhile (ERROR{idle_timeout}, or any close), reopens it on
 * the same socket path (connect and HELLO, as k3ctl_client_open) and
 * returns 0; also 0 when it is still open. Call it only between requests:
 * frames still waiting are read and dropped. When the reopen fails it
 * returns k3ctl_client_open's code, leaves the client closed, and the next
 * k3ctl_client_send fails with -ECONNRESET and the reason.
 */
int k3ctl_client_reopen_if_closed(struct k3ctl_client *c);

/*
 * Waits up to timeout_ms (-1: forever) for the next frame and decodes it
 * into *body, whose strings point into c's buffer until the next call.
 * Returns 0, -ETIMEDOUT, -ECONNRESET when the daemon closed the
 * connection, or -EPROTO for a malformed frame.
 */
int k3ctl_client_recv(struct k3ctl_client *c, int timeout_ms, struct k3_proto_header *h,
		      union k3_proto_body *body, struct k3_err *err);

/*
 * One request, one reply: sends and waits for the frame answering it. An
 * ERROR reply becomes -EREMOTEIO with the daemon's message in err (and the
 * status in *status if non-NULL).
 */
int k3ctl_client_call(struct k3ctl_client *c, uint32_t type, const void *body, int timeout_ms,
		      struct k3_proto_header *h, union k3_proto_body *reply, uint32_t *status,
		      struct k3_err *err);

#endif

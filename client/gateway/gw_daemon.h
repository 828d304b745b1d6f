/*
 * gw_daemon.h - one k3 protocol connection from k3-gateway to k3d over a
 * Unix socket, driven by the gateway's libevent loop.
 *
 * The gateway opens one connection per HTTP request that needs the daemon
 * (protocol rule 6: closing a connection cancels its jobs, so a client that
 * goes away can never leave a job behind even if a CANCEL is lost). The
 * connection sends HELLO at once; every decoded frame, HELLO_OK included,
 * goes to the frame callback. Any failure (connect refused, protocol error,
 * daemon closed) goes to the fail callback exactly once, after which no
 * callback runs again.
 *
 * Callbacks may call gw_daemon_free() on their own connection: the free is
 * deferred until the callback returns.
 */
#ifndef K3_GW_DAEMON_H
#define K3_GW_DAEMON_H

#include <stdint.h>

#include <event2/event.h>

#include "k3_proto.h"

struct gw_daemon;

/* A frame for the owner. body points into the connection's input buffer:
 * valid only during the call. */
typedef void (*gw_daemon_frame_fn)(struct gw_daemon *d, const struct k3_proto_header *h,
				   const union k3_proto_body *body, void *arg);
/* The connection failed; why is a sentence for logs and 503 bodies. */
typedef void (*gw_daemon_fail_fn)(struct gw_daemon *d, const char *why, void *arg);

/*
 * Connects to the Unix socket at path and queues HELLO (request_id 0,
 * client "k3-gateway"). A connect failure is reported through fail_fn from
 * the event loop (never from inside this call), so callers handle one path.
 * timeout_s bounds the handshake: no HELLO_OK within it is a failure.
 * Returns NULL only when memory or the event base fails.
 */
struct gw_daemon *gw_daemon_open(struct event_base *base, const char *path, unsigned timeout_s,
				 gw_daemon_frame_fn frame_fn, gw_daemon_fail_fn fail_fn, void *arg);

/* Encodes and queues one frame. Returns 0, or a negative enum k3_proto_error
 * (the body broke the schema) or -EPIPE when the connection already failed. */
int gw_daemon_send(struct gw_daemon *d, uint32_t type, uint32_t request_id, const void *body);

/* Closes the socket (which cancels the connection's jobs in k3d) and frees.
 * Accepts NULL. */
void gw_daemon_free(struct gw_daemon *d);

#endif

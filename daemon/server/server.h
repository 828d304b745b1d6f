/*
 * server.h - k3d's front door: listening sockets (own or passed by
 * systemd), peer authorization by SO_PEERCRED, connections that turn bytes
 * into frames and frames into replies, and the graceful drain.
 *
 * Connections are admitted by the limits of docs/k3d.8 "CONNECTIONS"
 * (a share per uid, room kept for root and for k3-gateway) and closed
 * when idle past --idle-timeout.
 *
 * Runs on the libevent loop thread only. Nothing here touches model state:
 * requests that need the engine go through the request hooks (set by the
 * scheduler), which own all engine-side state.
 */
#ifndef K3_SERVER_H
#define K3_SERVER_H

#include <event2/event.h>
#include <stdint.h>

#include "base/err.h"
#include "k3_proto.h"
#include "server/options.h"

struct k3_server;
struct k3_conn;

/* What the server reports about itself in STATUS and HELLO_OK. */
struct k3_server_info {
	enum k3_proto_state state;
	const char *model_id;          /* NULL when no model */
	const char *status_text;
	uint32_t running, queued, queue_max;
};

/*
 * Hooks through which engine-facing requests (GENERATE, CANCEL, TOKENIZE,
 * DETOKENIZE, MODEL_INFO) reach the scheduler. Each returns 0 when it has
 * taken the request (it will answer through k3_conn_send), or a negative
 * errno after answering with an ERROR itself. When no hooks are set those
 * requests get ERROR{NOT_READY}.
 */
struct k3_server_hooks {
	void *ctx;
	int (*request)(void *ctx, struct k3_conn *c, const struct k3_proto_header *h,
		       const union k3_proto_body *body);
	/* The connection is going away: cancel everything it owns. */
	void (*conn_closed)(void *ctx, struct k3_conn *c);
	/* Fills the engine part of STATUS (state, counters, and the job list
	 * for a peer c that announced K3_PROTO_CAP_JOBS); reply may point
	 * into ctx until the next call. */
	void (*status)(void *ctx, const struct k3_conn *c, struct k3_server_info *info,
		       struct k3_msg_status_reply *reply);
	/* Drain started (SIGTERM or SHUTDOWN): cancel queued work, refuse new
	 * work, and return how many jobs are still running. When that is not
	 * zero the scheduler calls k3_server_drain_done() once the last one
	 * ends; the server stops waiting after drain_timeout_s regardless. */
	unsigned (*drain)(void *ctx);
	/* The drain ran out of time: stop the running job at its next step so
	 * that it still ends with DONE{cancelled} and then calls
	 * k3_server_drain_done(). Optional. */
	void (*cancel_running)(void *ctx);
};

/* Creates the server on base. opts is borrowed and must outlive it. */
struct k3_server *k3_server_new(struct event_base *base, const struct k3_options *opts,
				struct k3_err *err);
/* NULL-safe; closes every connection and listener, unlinks an own socket. */
struct k3_server *k3_server_free(struct k3_server *s);

/*
 * Starts listening: adopts sockets passed by systemd (LISTEN_FDS) when
 * present, else binds opts->socket_path after checking its directory
 * (must be a real directory owned by us or root, not writable by others
 * unless sticky) and refusing to replace a live socket. Returns 0 or a
 * negative errno with err saying what to fix.
 */
int k3_server_listen(struct k3_server *s, struct k3_err *err);

/* The socket path in use, or "" when only passed sockets are used. */
const char *k3_server_socket_path(const struct k3_server *s);

void k3_server_set_hooks(struct k3_server *s, const struct k3_server_hooks *hooks);
void k3_server_set_info(struct k3_server *s, const struct k3_server_info *info);

/* Starts the graceful drain: STOPPING=1, queued work cancelled by the
 * hooks, running work given drain_timeout_s (then cancelled, and given a
 * few more seconds to send its DONE) while the listeners stay open
 * (clients see state draining), then listeners closed, connections
 * flushed and the loop exits. Called again during the drain, it cancels
 * the running work at once instead of waiting for the timeout. */
void k3_server_drain(struct k3_server *s);
/* Tells the server the last running job finished during a drain. */
void k3_server_drain_done(struct k3_server *s);

/* Sends one frame on c. Returns 0, or a negative errno if the body does
 * not encode (a bug: logged) or c is closing. Never blocks: output is
 * queued; a connection whose queue passes K3_LIM_CONN_OUTBUF stops being
 * read until it drains. */
int k3_conn_send(struct k3_conn *c, uint32_t type, uint32_t request_id, const void *body);
/* Queues an already-encoded frame (from another thread's encoder). */
int k3_conn_send_raw(struct k3_conn *c, const void *frame, size_t len);
/* Calls cb(arg, true) once everything queued so far on c has been written
 * to the socket, or cb(arg, false) if c closes first. At most
 * K3_CONN_FLUSH_WAITERS may wait at once (-EBUSY beyond that; cb is not
 * called then). */
enum { K3_CONN_FLUSH_WAITERS = 8 };
int k3_conn_when_flushed(struct k3_conn *c, void (*cb)(void *arg, bool written), void *arg);
/* Sends ERROR{status, message, param (may be NULL)}. */
int k3_conn_send_error(struct k3_conn *c, uint32_t request_id, enum k3_proto_status status,
		       const char *param, const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* Peer credentials (SO_PEERCRED at accept), a per-process unique
 * connection number, and the capability bits of the peer's HELLO (0
 * before it). */
uid_t k3_conn_uid(const struct k3_conn *c);
pid_t k3_conn_pid(const struct k3_conn *c);
uint64_t k3_conn_id(const struct k3_conn *c);
uint64_t k3_conn_caps(const struct k3_conn *c);
/* True for the daemon's uid, root and --allow-uid peers (they may send
 * SHUTDOWN and cancel anyone's job); false for --allow-gid members. */
bool k3_conn_is_admin(const struct k3_conn *c);
/* Reference counting, so the scheduler can hold a connection across
 * events; the server drops its own reference when the peer goes away.
 * k3_conn_send on a gone connection returns -EPIPE. A reference besides
 * the server's own also marks the connection busy: it is never closed
 * for --idle-timeout while one is held, so the holder of a queued or
 * running request (the scheduler takes one per request) keeps it open. */
struct k3_conn *k3_conn_ref(struct k3_conn *c);
struct k3_conn *k3_conn_unref(struct k3_conn *c);
bool k3_conn_is_open(const struct k3_conn *c);

#endif

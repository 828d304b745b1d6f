/*
 * server_dispatch.c - frames in, answers out, on k3d's connections
 * (server_internal.h says which server file does what).
 *
 * A connection reads frames with k3_proto_frame_split on the first 20
 * bytes only, so a hostile length is refused before its payload is waited
 * for or buffered; it then linearizes exactly one frame at a time. Replies
 * are encoded into one scratch buffer (the loop is single-threaded) and
 * queued on the bufferevent. Errors in a frame get an ERROR reply and a
 * close after the reply is written; no input can make the loop block.
 * HELLO, PING, STATUS and SHUTDOWN are answered here; the requests that
 * need the engine go to the scheduler's hooks.
 */
#include "server/server_internal.h"

#include <string.h>
#include <unistd.h>

#include <event2/buffer.h>

#include "base/log.h"
#include "k3_build_config.h"

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
	k3_msg_status_reply_set_version(&r, k3_proto_str_of(K3_VERSION));
	k3_msg_status_reply_set_state(&r, info.state);
	if (info.status_text)
		k3_msg_status_reply_set_status_text(&r, k3_proto_str_of(info.status_text));
	if (info.model_id)
		k3_msg_status_reply_set_model(&r, k3_proto_str_of(info.model_id));
	k3_msg_status_reply_set_pid(&r, (uint32_t)getpid());
	k3_msg_status_reply_set_uptime_s(&r, uptime_s(s));
	k3_msg_status_reply_set_connections(&r, s->n_conns);
	k3_msg_status_reply_set_running(&r, info.running);
	k3_msg_status_reply_set_queued(&r, info.queued);
	k3_msg_status_reply_set_queue_max(&r, s->opts->queue_max);
	k3_conn_send(c, K3_MSG_STATUS_REPLY, rid, &r);
}

static void handle_hello(struct k3_conn *c, uint32_t rid, const struct k3_msg_hello *m)
{
	struct k3_server *s = c->srv;
	struct k3_msg_hello_ok r;

	if (m->version != K3_PROTO_VERSION) {
		k3_conn_send_error(c, rid, K3_STATUS_UNSUPPORTED_VERSION, "version",
				   "protocol version %u is not supported; this k3d speaks %u",
				   m->version, K3_PROTO_VERSION);
		server_conn_close_after_write(c);
		return;
	}
	server_conn_hello_done(c, m->has_caps ? m->caps : 0);
	memset(&r, 0, sizeof(r));
	k3_msg_hello_ok_set_server(&r, k3_proto_str_of("k3d/" K3_VERSION));
	k3_msg_hello_ok_set_version(&r, K3_PROTO_VERSION);
	k3_msg_hello_ok_set_caps(&r, K3_PROTO_CAP_CHAT | K3_PROTO_CAP_TOOLS | K3_PROTO_CAP_PROGRESS |
				     K3_PROTO_CAP_JOBS);
	if (s->info.model_id)
		k3_msg_hello_ok_set_model(&r, k3_proto_str_of(s->info.model_id));
	k3_msg_hello_ok_set_state(&r, s->draining ? K3_STATE_DRAINING : s->info.state);
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
		server_conn_close_after_write(c);
		return;
	}
	if (!c->hello_done && h->type != K3_MSG_HELLO) {
		k3_conn_send_error(c, h->request_id, K3_STATUS_BAD_REQUEST, NULL,
				   "the first frame must be HELLO, not %s", k3_proto_type_name(h->type));
		server_conn_close_after_write(c);
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
		k3_msg_pong_set_state(&r, s->draining ? K3_STATE_DRAINING : s->info.state);
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
		k3_msg_ok_set_message(&r, k3_proto_str_of(shutdown_outcome(s)));
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
		server_conn_close_after_write(c);
		break;
	}
}

void server_conn_read_cb(struct bufferevent *bev, void *arg)
{
	struct k3_conn *c = arg;
	struct evbuffer *in = bufferevent_get_input(bev);

	k3_conn_ref(c);
	c->last_active_s = server_mono_s();
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
			server_conn_close_after_write(c);
			break;
		}
		if (len >= K3_PROTO_HEADER_SIZE && h.length > K3_LIM_PAYLOAD_SMALL && !c->large_reserved &&
		    server_conn_reserve_large(c, &h) < 0)
			break;
		if (len < K3_PROTO_HEADER_SIZE || len - K3_PROTO_HEADER_SIZE < h.length)
			break;   /* wait for the rest; the length is already bounded */
		n = K3_PROTO_HEADER_SIZE + h.length;
		p = evbuffer_pullup(in, (ssize_t)n);
		if (!p || k3_proto_frame_split(p, n, &h, &payload, &perr) != (int)n) {
			server_conn_close(c);
			break;
		}
		handle_frame(c, &h, payload);
		server_conn_release_large(c);
		if (c->bev)
			evbuffer_drain(in, n);
	}
	k3_conn_unref(c);
}

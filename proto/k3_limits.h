/*
 * k3_limits.h - every user-controllable size in k3d, k3ctl and k3-gateway,
 * in one place (the sqliteLimit.h habit). Each bound is checked before any
 * allocation sized from outside input. Changing a wire limit below is a
 * protocol change only when it shrinks a bound (see docs/protocol.md).
 */
#ifndef K3_LIMITS_H
#define K3_LIMITS_H

/* Largest frame payload of any type: a GENERATE carrying a whole chat
 * history. 132 MiB = the gateway's default 128 MiB body plus room for the
 * other fields, so every body the gateway accepts fits in one frame. */
#define K3_LIM_PAYLOAD_MAX        (132u << 20)

/* Small control frames (HELLO, STATUS, CANCEL, ...) never need more; a
 * larger length is refused from the header alone, before reading the body. */
#define K3_LIM_PAYLOAD_SMALL      (64u << 10)

/* Any single text field: prompt text, messages JSON, tools JSON, tokenize
 * input. Same bound as the payload. */
#define K3_LIM_TEXT_MAX           (128u << 20)

/* Names and short strings: client/server names, model id, stop strings. */
#define K3_LIM_NAME_MAX           256u

/* Free-form messages (ERROR text, STATUS text). */
#define K3_LIM_MESSAGE_MAX        4096u

/* One stop string, in bytes, and how many (the OpenAI API allows 4). */
#define K3_LIM_STOP_BYTES         256u
#define K3_LIM_STOP_COUNT         4u
/* Per-drive arrays in DONE and STATUS_REPLY: at most this many drives
 * (K3_STORE_MAX_DRIVES; docs/drives.md). */
#define K3_LIM_DRIVES             4u

/* Stop token ids per request. */
#define K3_LIM_STOP_IDS           64u

/* Token ids in one field: prompt ids, TOKENIZE reply, DETOKENIZE input.
 * K3's context is 1,048,576 positions; no id list can usefully exceed it. */
#define K3_LIM_IDS_MAX            (1u << 20)

/* Ids carried by one TOKEN event (a verified draft run emits several). */
#define K3_LIM_TOKEN_IDS          64u

/* New tokens one request may ask for. */
#define K3_LIM_MAX_NEW            (1u << 20)

/* Daemon: queued generations (--queue, 0..this). */
#define K3_LIM_QUEUE_MAX          1024u

/* Jobs listed in one STATUS_REPLY (running first, then queued in order;
 * the running/queued counters still give the totals). 64 x 32 bytes keeps
 * the reply far inside the small payload bound. */
#define K3_LIM_STATUS_JOBS        64u

/*
 * Daemon: client connections (docs/k3d.8, "CONNECTIONS"). All of them are
 * options; these are the defaults and bounds.
 *
 * --max-connections: all connections together. 256 is far more than local
 * use needs (k3ctl holds one per command, k3-gateway one per HTTP request
 * that needs k3d) and costs little: an idle connection is one fd and a few
 * KiB. At most 4,096: k3d.service allows 65,536 fds, and each connection
 * may queue up to K3_LIM_CONN_OUTBUF of replies its peer does not read.
 */
#define K3_LIM_CONNECTIONS_DEFAULT      256u
#define K3_LIM_CONNECTIONS_MIN          16u
#define K3_LIM_CONNECTIONS_MAX          4096u

/* --max-connections-per-uid: what one uid may hold, so one process that
 * leaks connections (a desktop app's pool) cannot lock every other user
 * out. Root and the --gateway-uid users have no per-uid cap (root has its
 * reserve, the gateway its share). 32 covers a user's k3ctl chat, runs,
 * status polls and an app or two; at least 1, at most --max-connections. */
#define K3_LIM_CONN_PER_UID_DEFAULT     32u

/* Connections only root (uid 0) may use: however many other uids hold,
 * root can still run k3ctl status, cancel and shutdown (the PostgreSQL
 * superuser_reserved_connections idea). A constant: k3ctl needs one per
 * command, and 8 allows several at once. */
#define K3_LIM_CONN_ROOT_RESERVED       8u

/* --gateway-connections: the share of --max-connections kept for the
 * --gateway-uid users (k3-gateway opens one connection per HTTP request
 * that needs k3d, and /health polls); nobody else may use it, and the
 * gateway uses nothing else. 64 covers --queue up to ~60 plus health and
 * metrics probes; raise it with --queue. 1 .. --max-connections minus the
 * root reserve minus 1. Reserved only when a --gateway-uid is given. */
#define K3_LIM_CONN_GATEWAY_DEFAULT     64u

/* --idle-timeout: an authenticated connection with no request queued or
 * running, that has read or written nothing for this long, is sent
 * ERROR{idle_timeout} and closed, so leaked connections free their uid's
 * share by themselves. 300 s outlasts any pause inside one exchange; an
 * interactive k3ctl chat reconnects before its next turn. 0 = never, else
 * 1 .. 86,400 s. */
#define K3_LIM_IDLE_TIMEOUT_DEFAULT_S   300u
#define K3_LIM_IDLE_TIMEOUT_MAX_S       86400u

/* Daemon: a connection must complete HELLO this long after connecting,
 * however it spaces its bytes (a deadline, not a read timeout). */
#define K3_LIM_HELLO_TIMEOUT_S          10u

/* Daemon: bytes of unsent output per connection before it stops reading
 * that connection (backpressure). */
#define K3_LIM_CONN_OUTBUF        (8u << 20)

/* Daemon: payload bytes that all connections together may be receiving
 * in frames over the small bound (announced lengths, reserved when a
 * header arrives). Without it 256 connections x 132 MiB could make k3d
 * buffer 33 GiB. Two largest frames fit at once. */
#define K3_LIM_INBUF_LARGE_TOTAL  (2ull * K3_LIM_PAYLOAD_MAX)

/* Gateway: request body (default, --max-body), header bytes, JSON depth. */
#define K3_LIM_HTTP_BODY_DEFAULT  (128u << 20)
#define K3_LIM_HTTP_HEADERS       (64u << 10)
#define K3_LIM_JSON_DEPTH         64u

#endif

/*
 * k3_proto.h - the k3 wire protocol: frame header, message schema, status
 * codes, encoder and decoder. docs/protocol.md is the normative description;
 * this header and that document must agree.
 *
 * A frame is a 20-byte little-endian header followed by `length` payload
 * bytes. The payload is a sequence of fields, each `tag u16, length u32,
 * value`; the message type's schema (K3_PROTO_MESSAGES below) says which
 * tags exist, their kind, whether they are required and their bounds.
 * Unknown types, unknown tags, duplicate tags, wrong lengths and bad UTF-8
 * are errors with their own codes, never guessed around.
 *
 * The library is pure: no I/O, no logging, no globals. Decoded messages
 * point into the caller's payload buffer (zero copy); they stay valid only
 * while that buffer does.
 *
 * Version history (K3_PROTO_VERSION; bump when the layout or meaning of an
 * existing message or field changes; new message types and new optional
 * fields do not need a bump because peers negotiate them in HELLO):
 *   1  2026-11-29  first version.
 *      (additions within 1: WARM_EXPERTS; STATUS_REPLY 26-28; DONE
 *      cancel_reason; STATUS_REPLY's job list 29-34 with kind U64S, sent
 *      only to peers whose HELLO has K3_PROTO_CAP_JOBS; spine counters
 *      DONE 22-25, STATUS_REPLY 35-38; GENERATE's draft_policy read,
 *      DONE's draft statistics 26-32 and STATUS_REPLY's draft totals
 *      52-56; STATUS_REPLY 40-46: peak RSS and the memory plan's split;
 *      spine and spine_label: DONE 40-41, STATUS_REPLY 50-51,
 *      MODEL_INFO_REPLY 20-21; several sequences in one pass: DONE
 *      77-79, STATUS_REPLY 78-81.)
 */
#ifndef K3_PROTO_H
#define K3_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "k3_limits.h"

#define K3_PROTO_MAGIC        0x5033334bu   /* bytes 'K' '3' '3' 'P' */
#define K3_PROTO_VERSION      1u
#define K3_PROTO_HEADER_SIZE  20u
#define K3_PROTO_FIELD_HEADER 6u            /* tag u16 + length u32 */

/* HELLO capability bits (a peer ignores bits it does not know). */
enum k3_proto_caps {
	K3_PROTO_CAP_CHAT     = 1u << 0,   /* GENERATE mode chat */
	K3_PROTO_CAP_TOOLS    = 1u << 1,   /* TOOL_CALL events */
	K3_PROTO_CAP_PROGRESS = 1u << 2,   /* PROGRESS events during prefill */
	K3_PROTO_CAP_DRAFT    = 1u << 3,   /* draft policies */
	K3_PROTO_CAP_JOBS     = 1u << 4,   /* STATUS_REPLY's job list (tags 29-34): a
					    * client sets it to receive the list, k3d to
					    * say it sends one */
};

/* Wire status codes carried by ERROR. Never renumber; add at the end. */
enum k3_proto_status {
	K3_STATUS_OK = 0,
	K3_STATUS_BAD_REQUEST = 1,      /* malformed frame or invalid field value */
	K3_STATUS_UNSUPPORTED_VERSION = 2,
	K3_STATUS_UNKNOWN_TYPE = 3,
	K3_STATUS_TOO_LARGE = 4,        /* frame or field over a limit */
	K3_STATUS_BUSY = 5,             /* engine slot and queue are full */
	K3_STATUS_NOT_FOUND = 6,        /* e.g. CANCEL of an unknown job */
	K3_STATUS_CANCELLED = 7,
	K3_STATUS_UNAUTHORIZED = 8,     /* peer credentials not allowed for this request */
	K3_STATUS_SHUTTING_DOWN = 9,
	K3_STATUS_NOT_READY = 10,       /* model still loading */
	K3_STATUS_CONTEXT_EXCEEDED = 11,
	K3_STATUS_INVALID_ARGUMENT = 12,/* well-formed request the engine cannot honour exactly */
	K3_STATUS_UNSUPPORTED = 13,     /* e.g. image parts in a text-only model */
	K3_STATUS_INTERNAL = 14,
	K3_STATUS_IDLE_TIMEOUT = 15,    /* k3d closed a connection idle past --idle-timeout */
	K3_STATUS_COUNT
};

/* Decoder/encoder error codes: one per way a frame can be malformed. */
enum k3_proto_error {
	K3_PROTO_OK = 0,
	K3_PROTO_E_BAD_MAGIC = -1,
	K3_PROTO_E_BAD_VERSION = -2,
	K3_PROTO_E_UNKNOWN_TYPE = -3,
	K3_PROTO_E_BAD_FLAGS = -4,
	K3_PROTO_E_RESERVED = -5,        /* reserved header bits not zero */
	K3_PROTO_E_OVERSIZED = -6,       /* payload length over the type's limit */
	K3_PROTO_E_TRUNCATED = -7,       /* buffer ends inside the frame */
	K3_PROTO_E_TRAILING = -8,        /* bytes after the last field (or after the frame) */
	K3_PROTO_E_FIELD_OVERRUN = -9,   /* a field's length runs past the payload */
	K3_PROTO_E_UNKNOWN_FIELD = -10,
	K3_PROTO_E_DUPLICATE_FIELD = -11,
	K3_PROTO_E_MISSING_FIELD = -12,
	K3_PROTO_E_FIELD_SIZE = -13,     /* length wrong for the field's kind */
	K3_PROTO_E_TOO_LONG = -14,       /* string/array over its bound */
	K3_PROTO_E_TOO_MANY = -15,       /* repeated field past its count */
	K3_PROTO_E_BAD_UTF8 = -16,
	K3_PROTO_E_BAD_VALUE = -17,      /* e.g. a bool that is neither 0 nor 1 */
	K3_PROTO_E_NOMEM = -18,          /* output buffer would pass its max */
	K3_PROTO_E_COUNT_ = -19
};

struct k3_proto_err {
	enum k3_proto_error code;
	char msg[192];
};

/* Field kinds and their C types in decoded structs. */
struct k3_proto_str {          /* STR (valid UTF-8) or BYTES (any bytes) */
	const char *p;             /* not NUL-terminated; NULL when absent */
	uint32_t len;
};
struct k3_proto_ids {          /* IDS: array of u32 token ids */
	uint32_t n;
	const uint32_t *v;         /* encode: host-order source array */
	const uint8_t *le;         /* decode: n little-endian u32 in the payload */
};
struct k3_proto_strv {         /* STRV: repeated STR, at most K3_LIM_STOP_COUNT */
	uint32_t n;
	struct k3_proto_str v[K3_LIM_STOP_COUNT];
};
struct k3_proto_u64s {         /* U64S: array of u64 */
	uint32_t n;
	const uint64_t *v;         /* encode: host-order source array */
	const uint8_t *le;         /* decode: n little-endian u64 in the payload */
};

typedef uint32_t k3_proto_u32;
typedef uint64_t k3_proto_u64;
typedef double   k3_proto_f64;
typedef bool     k3_proto_bool;
typedef struct k3_proto_str  k3_proto_STR_t;
typedef struct k3_proto_str  k3_proto_BYTES_t;
typedef struct k3_proto_ids  k3_proto_IDS_t;
typedef struct k3_proto_strv k3_proto_STRV_t;
typedef struct k3_proto_u64s k3_proto_U64S_t;
typedef k3_proto_u32  k3_proto_U32_t;
typedef k3_proto_u64  k3_proto_U64_t;
typedef k3_proto_f64  k3_proto_F64_t;
typedef k3_proto_bool k3_proto_BOOL_t;

enum k3_proto_kind {
	K3_PROTO_U32 = 1, K3_PROTO_U64, K3_PROTO_F64, K3_PROTO_BOOL,
	K3_PROTO_STR, K3_PROTO_BYTES, K3_PROTO_IDS, K3_PROTO_STRV,
	K3_PROTO_U64S,
};

/* GENERATE.mode */
enum k3_proto_mode { K3_MODE_RAW = 0, K3_MODE_CHAT = 1 };
/* GENERATE.reasoning_effort: UNSET = the renderer's default */
enum k3_proto_effort {
	K3_EFFORT_UNSET = 0, K3_EFFORT_NONE = 1, K3_EFFORT_LOW = 2,
	K3_EFFORT_HIGH = 3, K3_EFFORT_MAX = 4,
};
/* TOKEN.channel */
enum k3_proto_channel { K3_CHANNEL_CONTENT = 0, K3_CHANNEL_REASONING = 1 };
/* DONE.finish */
enum k3_proto_finish {
	K3_FINISH_STOP = 0, K3_FINISH_LENGTH = 1, K3_FINISH_CANCELLED = 2,
	K3_FINISH_ERROR = 3, K3_FINISH_TOOL_CALLS = 4,
};
/* DONE.cancel_reason, with finish = cancelled: who cancelled the job
 * (absent from daemons before it: treat as UNSET). */
enum k3_proto_cancel_reason {
	K3_CANCEL_UNSET = 0,
	K3_CANCEL_CLIENT = 1,     /* its own connection: CANCEL, or the client left */
	K3_CANCEL_BY_ID = 2,      /* CANCEL by job id from another connection (k3ctl cancel) */
	K3_CANCEL_SHUTDOWN = 3,   /* k3d stopping: drain timeout, or asked to stop again */
};
/* GENERATE.draft_policy and DONE.draft_policy (speculative decoding,
 * docs/draft.md): UNSET = k3d's --draft default. The same values as enum
 * k3_draft_policy (daemon/draft/draft.h). */
enum k3_proto_draft_policy {
	K3_PROTO_DRAFT_UNSET = 0, K3_PROTO_DRAFT_OFF = 1, K3_PROTO_DRAFT_AUTO = 2,
	K3_PROTO_DRAFT_NGRAM = 3, K3_PROTO_DRAFT_DSPARK = 4, K3_PROTO_DRAFT_COUNT
};
/* STATUS_REPLY.job_kinds: what a job does */
enum k3_proto_job_kind { K3_JOB_GENERATE = 0, K3_JOB_WARM_EXPERTS = 1 };
/* STATUS_REPLY.job_states */
enum k3_proto_job_state { K3_JOB_RUNNING = 0, K3_JOB_QUEUED = 1 };
/* DONE / STATUS_REPLY / MODEL_INFO_REPLY .spine: the weights the spine
 * runs from (absent from daemons before it: BF16). Anything but BF16 is
 * not the checkpoint's weights, and comes with spine_label saying so. */
enum k3_proto_spine {
	K3_SPINE_BF16 = 0,        /* the checkpoint's BF16 spine: weight-exact */
	K3_SPINE_INT8 = 1,        /* row-wise int8 + per-row scale (k3d --spine int8) */
};
/* spine_label of K3_SPINE_INT8, as k3d sends it and clients print it. */
#define K3_PROTO_SPINE_INT8_LABEL "int8 spine (not weight-exact)"
/* STATUS_REPLY.state */
enum k3_proto_state {
	K3_STATE_LOADING = 0, K3_STATE_READY = 1, K3_STATE_DRAINING = 2,
	K3_STATE_NO_MODEL = 3,
};

/*
 * The schema. Field rows: F(m, tag, KIND, name, bound, required), m being
 * the message's lower-case name (for generated code) and bound the byte
 * limit of STR/BYTES or the count limit of IDS/STRV (0 for scalars).
 * Tags are never reused or renumbered within a message.
 */
#define K3_PROTO_FIELDS_HELLO(F, m) \
	F(m, 1, STR, client, K3_LIM_NAME_MAX, 1) \
	F(m, 2, U32, version, 0, 1) \
	F(m, 3, U64, caps, 0, 0)
#define K3_PROTO_FIELDS_HELLO_OK(F, m) \
	F(m, 1, STR, server, K3_LIM_NAME_MAX, 1) \
	F(m, 2, U32, version, 0, 1) \
	F(m, 3, U64, caps, 0, 0) \
	F(m, 4, STR, model, K3_LIM_NAME_MAX, 0) \
	F(m, 5, U32, state, 0, 1)
#define K3_PROTO_FIELDS_ERROR(F, m) \
	F(m, 1, U32, status, 0, 1) \
	F(m, 2, STR, message, K3_LIM_MESSAGE_MAX, 1) \
	F(m, 3, STR, param, K3_LIM_NAME_MAX, 0)
#define K3_PROTO_FIELDS_OK(F, m) \
	F(m, 1, STR, message, K3_LIM_MESSAGE_MAX, 0)
#define K3_PROTO_FIELDS_PING(F, m)
#define K3_PROTO_FIELDS_PONG(F, m) \
	F(m, 1, U32, state, 0, 1)
#define K3_PROTO_FIELDS_STATUS(F, m)
/* Tags 60-70, the same rows in STATUS_REPLY (k3d's totals) and DONE (the
 * job's share): per-drive columns, K3_LIM_DRIVES long, and the demand and
 * prefetch-used bytes of experts and spine that they add up to. */
#define K3_PROTO_FIELDS_DRIVES_(F, m) \
	F(m, 60, U64S, drive_expert_bytes_read, K3_LIM_DRIVES, 0) \
	F(m, 61, U64S, drive_expert_demand_bytes, K3_LIM_DRIVES, 0) \
	F(m, 62, U64S, drive_prefetch_used_bytes, K3_LIM_DRIVES, 0) \
	F(m, 63, U64S, drive_prefetch_wasted_bytes, K3_LIM_DRIVES, 0) \
	F(m, 64, U64S, drive_spine_bytes_read, K3_LIM_DRIVES, 0) \
	F(m, 65, U64S, drive_hedges, K3_LIM_DRIVES, 0) \
	F(m, 66, U64S, drive_hedges_won, K3_LIM_DRIVES, 0) \
	F(m, 67, U64, expert_demand_bytes, 0, 0) \
	F(m, 68, U64, prefetch_used_bytes, 0, 0) \
	F(m, 69, U64, spine_demand_bytes, 0, 0) \
	F(m, 70, U64, spine_wasted_bytes, 0, 0)
/* Tags 29-34 are the job list: parallel arrays of one length, entry i
 * describing one job (running first, then queued in queue order), sent
 * only to peers that announced K3_PROTO_CAP_JOBS, and only the jobs that
 * peer may cancel. Tags 40-46: k3d's peak RSS (VmHWM) and the memory
 * plan's split (docs/plan.md): the limit, the resident spine prefix of
 * spine_layers layers and its bytes, the spine ring, the sequence state;
 * expert_cache_bytes (20) is the plan's expert tier. */
#define K3_PROTO_FIELDS_STATUS_REPLY(F, m) \
	F(m, 1, STR, version, K3_LIM_NAME_MAX, 1) \
	F(m, 2, U32, state, 0, 1) \
	F(m, 3, STR, status_text, K3_LIM_MESSAGE_MAX, 0) \
	F(m, 4, STR, model, K3_LIM_NAME_MAX, 0) \
	F(m, 5, U32, pid, 0, 1) \
	F(m, 6, F64, uptime_s, 0, 1) \
	F(m, 7, U32, connections, 0, 1) \
	F(m, 8, U32, running, 0, 1) \
	F(m, 9, U32, queued, 0, 1) \
	F(m, 10, U32, queue_max, 0, 1) \
	F(m, 11, U64, requests_total, 0, 0) \
	F(m, 12, U64, prompt_tokens_total, 0, 0) \
	F(m, 13, U64, completion_tokens_total, 0, 0) \
	F(m, 14, U64, expert_bytes_read, 0, 0) \
	F(m, 15, U64, expert_hits, 0, 0) \
	F(m, 16, U64, expert_misses, 0, 0) \
	F(m, 17, U64, prefetch_issued, 0, 0) \
	F(m, 18, U64, prefetch_used, 0, 0) \
	F(m, 19, U64, prefetch_wasted_bytes, 0, 0) \
	F(m, 20, U64, expert_cache_bytes, 0, 0) \
	F(m, 21, U64, requests_by_status, 0, 0) \
	F(m, 22, F64, prefill_s_total, 0, 0) \
	F(m, 23, F64, decode_s_total, 0, 0) \
	F(m, 24, U64, reasoning_tokens_total, 0, 0) \
	F(m, 25, U64, prefetch_issued_bytes, 0, 0) \
	F(m, 26, F64, io_wait_s_total, 0, 0) \
	F(m, 27, F64, compute_s_total, 0, 0) \
	F(m, 28, U64, positions_total, 0, 0) \
	F(m, 29, U64S, job_ids, K3_LIM_STATUS_JOBS, 0) \
	F(m, 30, IDS, job_states, K3_LIM_STATUS_JOBS, 0) \
	F(m, 31, IDS, job_kinds, K3_LIM_STATUS_JOBS, 0) \
	F(m, 32, IDS, job_uids, K3_LIM_STATUS_JOBS, 0) \
	F(m, 33, IDS, job_pids, K3_LIM_STATUS_JOBS, 0) \
	F(m, 34, U64S, job_ages_ms, K3_LIM_STATUS_JOBS, 0) \
	F(m, 35, U64, spine_bytes_read, 0, 0) \
	F(m, 36, U64, spine_loads, 0, 0) \
	F(m, 37, U64, spine_memory_bytes, 0, 0) \
	F(m, 38, F64, spine_io_wait_s_total, 0, 0) \
	F(m, 40, U64, peak_rss_bytes, 0, 0) \
	F(m, 41, U64, memory_limit_bytes, 0, 0) \
	F(m, 42, U32, spine_layers, 0, 0) \
	F(m, 43, U32, spine_resident_layers, 0, 0) \
	F(m, 44, U64, spine_resident_bytes, 0, 0) \
	F(m, 45, U64, spine_ring_bytes, 0, 0) \
	F(m, 46, U64, state_bytes, 0, 0) \
	F(m, 50, U32, spine, 0, 0) \
	F(m, 51, STR, spine_label, K3_LIM_NAME_MAX, 0) \
	F(m, 52, U64, draft_proposed_total, 0, 0) \
	F(m, 53, U64, draft_accepted_total, 0, 0) \
	F(m, 54, U64, decode_passes_total, 0, 0) \
	F(m, 55, F64, draft_s_total, 0, 0) \
	F(m, 56, F64, verify_s_total, 0, 0) \
	K3_PROTO_FIELDS_DRIVES_(F, m) \
	F(m, 71, U64S, drive_rate, K3_LIM_DRIVES, 0) \
	F(m, 72, U64S, drive_p95_ns, K3_LIM_DRIVES, 0) \
	F(m, 73, IDS, drive_prefetch_on, K3_LIM_DRIVES, 0) \
	F(m, 74, IDS, drive_experts, K3_LIM_DRIVES, 0) \
	F(m, 75, U64, hedges, 0, 0) \
	F(m, 76, U64, hedges_won, 0, 0) \
	F(m, 77, U32, prefill_chunk, 0, 0) \
	F(m, 78, U32, parallel, 0, 0) \
	F(m, 79, U32, pass_width, 0, 0) \
	F(m, 80, F64, pass_width_mean, 0, 0) \
	F(m, 81, U64, passes_total, 0, 0)
#define K3_PROTO_FIELDS_MODEL_INFO(F, m)
#define K3_PROTO_FIELDS_MODEL_INFO_REPLY(F, m) \
	F(m, 1, STR, id, K3_LIM_NAME_MAX, 1) \
	F(m, 2, STR, path, K3_LIM_MESSAGE_MAX, 0) \
	F(m, 3, STR, provider, K3_LIM_NAME_MAX, 0) \
	F(m, 4, U32, context_length, 0, 1) \
	F(m, 5, U32, vocab_size, 0, 0) \
	F(m, 6, U32, n_layers, 0, 0) \
	F(m, 7, U32, hidden_size, 0, 0) \
	F(m, 8, U32, n_experts, 0, 0) \
	F(m, 9, U32, experts_per_token, 0, 0) \
	F(m, 10, U64, params_total, 0, 0) \
	F(m, 11, U64, bytes_total, 0, 0) \
	F(m, 12, U64, created, 0, 0) \
	F(m, 20, U32, spine, 0, 0) \
	F(m, 21, STR, spine_label, K3_LIM_NAME_MAX, 0)
#define K3_PROTO_FIELDS_TOKENIZE(F, m) \
	F(m, 1, STR, text, K3_LIM_TEXT_MAX, 1) \
	F(m, 2, BOOL, special, 0, 0)
#define K3_PROTO_FIELDS_TOKENIZE_REPLY(F, m) \
	F(m, 1, IDS, ids, K3_LIM_IDS_MAX, 1)
#define K3_PROTO_FIELDS_DETOKENIZE(F, m) \
	F(m, 1, IDS, ids, K3_LIM_IDS_MAX, 1)
#define K3_PROTO_FIELDS_DETOKENIZE_REPLY(F, m) \
	F(m, 1, BYTES, bytes, K3_LIM_TEXT_MAX, 1)
#define K3_PROTO_FIELDS_GENERATE(F, m) \
	F(m, 1, U32, mode, 0, 1) \
	F(m, 2, STR, prompt, K3_LIM_TEXT_MAX, 0) \
	F(m, 3, IDS, prompt_ids, K3_LIM_IDS_MAX, 0) \
	F(m, 4, STR, messages, K3_LIM_TEXT_MAX, 0) \
	F(m, 5, STR, tools, K3_LIM_TEXT_MAX, 0) \
	F(m, 6, STR, tool_choice, K3_LIM_TEXT_MAX, 0) \
	F(m, 7, STR, response_format, K3_LIM_TEXT_MAX, 0) \
	F(m, 8, U32, max_new, 0, 0) \
	F(m, 9, STRV, stop, K3_LIM_STOP_COUNT, 0) \
	F(m, 10, IDS, stop_ids, K3_LIM_STOP_IDS, 0) \
	F(m, 11, BOOL, thinking, 0, 0) \
	F(m, 12, U32, reasoning_effort, 0, 0) \
	F(m, 13, U32, draft_policy, 0, 0) \
	F(m, 14, BOOL, trace, 0, 0) \
	F(m, 15, BOOL, no_generation_prompt, 0, 0)
#define K3_PROTO_FIELDS_ACCEPTED(F, m) \
	F(m, 1, U64, job_id, 0, 1) \
	F(m, 2, U32, queue_position, 0, 1) \
	F(m, 3, U32, prompt_tokens, 0, 0)
#define K3_PROTO_FIELDS_PROGRESS(F, m) \
	F(m, 1, U32, done, 0, 1) \
	F(m, 2, U32, total, 0, 1)
#define K3_PROTO_FIELDS_TOKEN(F, m) \
	F(m, 1, IDS, ids, K3_LIM_TOKEN_IDS, 1) \
	F(m, 2, STR, text, K3_LIM_TEXT_MAX, 0) \
	F(m, 3, U32, channel, 0, 0)
#define K3_PROTO_FIELDS_TOOL_CALL(F, m) \
	F(m, 1, U32, index, 0, 1) \
	F(m, 2, STR, id, K3_LIM_NAME_MAX, 0) \
	F(m, 3, STR, name, K3_LIM_NAME_MAX, 0) \
	F(m, 4, STR, arguments, K3_LIM_TEXT_MAX, 0)
#define K3_PROTO_FIELDS_DONE(F, m) \
	F(m, 1, U32, finish, 0, 1) \
	F(m, 2, U32, prompt_tokens, 0, 1) \
	F(m, 3, U32, completion_tokens, 0, 1) \
	F(m, 4, U32, reasoning_tokens, 0, 0) \
	F(m, 5, U32, cached_tokens, 0, 0) \
	F(m, 6, F64, queued_s, 0, 0) \
	F(m, 7, F64, prefill_s, 0, 0) \
	F(m, 8, F64, decode_s, 0, 0) \
	F(m, 9, F64, prefill_tps, 0, 0) \
	F(m, 10, F64, decode_tps, 0, 0) \
	F(m, 11, U64, expert_bytes_read, 0, 0) \
	F(m, 12, U64, expert_hits, 0, 0) \
	F(m, 13, U64, expert_misses, 0, 0) \
	F(m, 14, U64, prefetch_issued, 0, 0) \
	F(m, 15, U64, prefetch_used, 0, 0) \
	F(m, 16, U64, prefetch_wasted_bytes, 0, 0) \
	F(m, 17, F64, io_wait_s, 0, 0) \
	F(m, 18, F64, compute_s, 0, 0) \
	F(m, 19, STR, stop_matched, K3_LIM_STOP_BYTES, 0) \
	F(m, 20, U64, prefetch_issued_bytes, 0, 0) \
	F(m, 21, U32, cancel_reason, 0, 0) \
	F(m, 22, U64, spine_bytes_read, 0, 0) \
	F(m, 23, U64, spine_loads, 0, 0) \
	F(m, 24, U64, spine_rows_read, 0, 0) \
	F(m, 25, F64, spine_io_wait_s, 0, 0) \
	F(m, 26, U32, draft_policy, 0, 0) \
	F(m, 27, U64, draft_proposed, 0, 0) \
	F(m, 28, U64, draft_accepted, 0, 0) \
	F(m, 29, U64, decode_passes, 0, 0) \
	F(m, 30, F64, tokens_per_pass, 0, 0) \
	F(m, 31, F64, draft_s, 0, 0) \
	F(m, 32, F64, verify_s, 0, 0) \
	F(m, 40, U32, spine, 0, 0) \
	F(m, 41, STR, spine_label, K3_LIM_NAME_MAX, 0) \
	K3_PROTO_FIELDS_DRIVES_(F, m) \
	F(m, 71, U64, prefill_expert_bytes, 0, 0) \
	F(m, 72, U64, prefill_distinct_experts, 0, 0) \
	F(m, 73, U64, expert_span_bytes, 0, 0) \
	F(m, 74, U32, prefill_chunk, 0, 0) \
	F(m, 75, U64, hedges, 0, 0) \
	F(m, 76, U64, hedges_won, 0, 0) \
	F(m, 77, F64, ttft_s, 0, 0) \
	F(m, 78, U64, shared_passes, 0, 0) \
	F(m, 79, F64, pass_width_mean, 0, 0)
#define K3_PROTO_FIELDS_CANCEL(F, m) \
	F(m, 1, U64, job_id, 0, 0)
#define K3_PROTO_FIELDS_SHUTDOWN(F, m)
/* Preload routed experts into the daemon's RAM cache, best first:
 * (layers[i], experts[i]) pairs, equal counts (docs/protocol.md). */
#define K3_PROTO_FIELDS_WARM_EXPERTS(F, m) \
	F(m, 1, IDS, layers, K3_LIM_IDS_MAX, 1) \
	F(m, 2, IDS, experts, K3_LIM_IDS_MAX, 1)
#define K3_PROTO_FIELDS_WARM_EXPERTS_REPLY(F, m) \
	F(m, 1, U32, requested, 0, 1) \
	F(m, 2, U32, loaded, 0, 1) \
	F(m, 3, U32, resident, 0, 1) \
	F(m, 4, U64, bytes_read, 0, 1) \
	F(m, 5, F64, seconds, 0, 0)

/* Message rows: M(type id, NAME, name, payload bound). Never renumber. */
#define K3_PROTO_MESSAGES(M) \
	M(1, HELLO, hello, K3_LIM_PAYLOAD_SMALL) \
	M(2, HELLO_OK, hello_ok, K3_LIM_PAYLOAD_SMALL) \
	M(3, ERROR, error, K3_LIM_PAYLOAD_SMALL) \
	M(4, OK, ok, K3_LIM_PAYLOAD_SMALL) \
	M(5, PING, ping, K3_LIM_PAYLOAD_SMALL) \
	M(6, PONG, pong, K3_LIM_PAYLOAD_SMALL) \
	M(7, STATUS, status, K3_LIM_PAYLOAD_SMALL) \
	M(8, STATUS_REPLY, status_reply, K3_LIM_PAYLOAD_SMALL) \
	M(9, MODEL_INFO, model_info, K3_LIM_PAYLOAD_SMALL) \
	M(10, MODEL_INFO_REPLY, model_info_reply, K3_LIM_PAYLOAD_SMALL) \
	M(11, TOKENIZE, tokenize, K3_LIM_PAYLOAD_MAX) \
	M(12, TOKENIZE_REPLY, tokenize_reply, K3_LIM_PAYLOAD_MAX) \
	M(13, DETOKENIZE, detokenize, K3_LIM_PAYLOAD_MAX) \
	M(14, DETOKENIZE_REPLY, detokenize_reply, K3_LIM_PAYLOAD_MAX) \
	M(15, GENERATE, generate, K3_LIM_PAYLOAD_MAX) \
	M(16, ACCEPTED, accepted, K3_LIM_PAYLOAD_SMALL) \
	M(17, PROGRESS, progress, K3_LIM_PAYLOAD_SMALL) \
	M(18, TOKEN, token, K3_LIM_PAYLOAD_MAX) \
	M(19, TOOL_CALL, tool_call, K3_LIM_PAYLOAD_MAX) \
	M(20, DONE, done, K3_LIM_PAYLOAD_SMALL) \
	M(21, CANCEL, cancel, K3_LIM_PAYLOAD_SMALL) \
	M(22, SHUTDOWN, shutdown, K3_LIM_PAYLOAD_SMALL) \
	M(23, WARM_EXPERTS, warm_experts, K3_LIM_PAYLOAD_MAX) \
	M(24, WARM_EXPERTS_REPLY, warm_experts_reply, K3_LIM_PAYLOAD_SMALL)

enum k3_proto_type {
#define K3_PROTO_ENUM_(id, NAME, name, bound) K3_MSG_##NAME = id,
	K3_PROTO_MESSAGES(K3_PROTO_ENUM_)
#undef K3_PROTO_ENUM_
	K3_MSG_COUNT
};

/* One struct per message, struct k3_msg_<name>: every field, plus
 * has_<field> for presence. */
#define K3_PROTO_MEMBER_(m, tag, KIND, fname, bound, req) \
	k3_proto_##KIND##_t fname; bool has_##fname;
#define K3_PROTO_STRUCT_(id, NAME, name, bound) \
	struct k3_msg_##name { int unused_; K3_PROTO_FIELDS_##NAME(K3_PROTO_MEMBER_, name) };
K3_PROTO_MESSAGES(K3_PROTO_STRUCT_)
#undef K3_PROTO_STRUCT_
#undef K3_PROTO_MEMBER_

/* One setter per field, k3_msg_<message>_set_<field>(msg, value): stores
 * the value and marks the field present, so an encoder never forgets
 * has_<field> (an optional field without it is silently not sent):
 *   k3_msg_done_set_prompt_tokens(&done, n);
 *   k3_msg_error_set_message(&e, k3_proto_str_of("busy"));
 * Generated from the schema rows, so a new field gets its setter too.
 * Strings and id arrays are views: the setter copies the pointer, not the
 * bytes, which must outlive the encode. */
#define K3_PROTO_SETTER_(m, tag, KIND, fname, bound, req) \
	static inline void k3_msg_##m##_set_##fname(struct k3_msg_##m *msg, k3_proto_##KIND##_t v) \
	{ msg->fname = v; msg->has_##fname = true; }
#define K3_PROTO_SETTERS_(id, NAME, name, bound) K3_PROTO_FIELDS_##NAME(K3_PROTO_SETTER_, name)
K3_PROTO_MESSAGES(K3_PROTO_SETTERS_)
#undef K3_PROTO_SETTERS_
#undef K3_PROTO_SETTER_

/* Any decoded body; the frame's type says which member is live. */
union k3_proto_body {
#define K3_PROTO_UNION_(id, NAME, name, bound) struct k3_msg_##name name;
	K3_PROTO_MESSAGES(K3_PROTO_UNION_)
#undef K3_PROTO_UNION_
};

struct k3_proto_header {
	uint32_t magic;
	uint16_t version;
	uint16_t type;
	uint16_t flags;       /* no flags are defined in version 1: must be 0 */
	uint16_t reserved;    /* must be 0 */
	uint32_t request_id;  /* chosen by the requester, echoed in every reply */
	uint32_t length;      /* payload bytes after the header */
};

/* ---- bounded output buffer ------------------------------------------ */

/* A growable byte buffer that refuses to grow past `max` (curl dynbuf). */
struct k3_proto_buf {
	uint8_t *data;   /* owned; freed by k3_proto_buf_release */
	size_t len, cap, max;
};
void k3_proto_buf_init(struct k3_proto_buf *b, size_t max);
void k3_proto_buf_release(struct k3_proto_buf *b);
void k3_proto_buf_reset(struct k3_proto_buf *b);
/* Appends n bytes. Returns 0 or K3_PROTO_E_NOMEM (len would pass max or
 * malloc failed); b is unchanged on failure. */
int k3_proto_buf_append(struct k3_proto_buf *b, const void *p, size_t n);
/* Drops the first n bytes (n <= len). */
void k3_proto_buf_consume(struct k3_proto_buf *b, size_t n);

/* ---- schema queries -------------------------------------------------- */

/* "HELLO", "GENERATE", ...; NULL for an unknown type. */
const char *k3_proto_type_name(uint32_t type);
/* Payload bound of a type; 0 for an unknown type. */
uint32_t k3_proto_type_payload_max(uint32_t type);
/* Stable lower-case name of a status ("busy") and of an error code. */
const char *k3_proto_status_name(uint32_t status);
const char *k3_proto_error_name(int code);
/* Draft policy names ("off", "auto", "ngram", "dspark"; "unset" for 0, "?"
 * out of range), and the reverse for the four a client may ask for:
 * 0, or -1 for any other string. */
const char *k3_proto_draft_policy_name(uint32_t p);
int k3_proto_draft_policy_parse(const char *s, uint32_t *out);

/* ---- frames ---------------------------------------------------------- */

/* Writes the 20 header bytes (explicit little endian). */
void k3_proto_header_encode(const struct k3_proto_header *h, uint8_t out[K3_PROTO_HEADER_SIZE]);

/*
 * Splits one frame off the front of a byte stream.
 *   buf, len   bytes received so far (borrowed)
 *   h          out: the decoded header
 *   payload    out: points into buf at the payload (h->length bytes)
 * Returns the frame's total size (> 0) when a whole frame is there, 0 when
 * more bytes are needed, or a negative enum k3_proto_error. The header is
 * validated (magic, version, type, flags, reserved, length vs the type's
 * bound) as soon as its 20 bytes have arrived, so an oversized length is
 * refused before anyone waits for or allocates its payload. A version
 * mismatch still fills *h, so the caller can answer with its own version.
 */
int k3_proto_frame_split(const uint8_t *buf, size_t len, struct k3_proto_header *h,
			 const uint8_t **payload, struct k3_proto_err *err);

/*
 * Decodes a payload of `type` into body (which must be the member of
 * union k3_proto_body for that type; it is zeroed first). Strings and id
 * arrays in body point into payload. Returns 0 or a negative
 * enum k3_proto_error naming what is wrong, with a message in err.
 */
int k3_proto_decode(uint32_t type, const uint8_t *payload, size_t len, void *body,
		    struct k3_proto_err *err);

/*
 * Appends one whole frame (header + payload) for `type` and request_id to
 * out. body is the message struct; only fields with has_<field> set are
 * written. Enforces the same schema as the decoder (a required field
 * missing, a string over its bound or invalid UTF-8 is an error), so a
 * k3 peer never sends what another k3 peer would refuse. out is unchanged
 * on failure.
 */
int k3_proto_encode(struct k3_proto_buf *out, uint32_t type, uint32_t request_id,
		    const void *body, struct k3_proto_err *err);

/*
 * Splits and decodes exactly one frame occupying all of buf[0..len):
 * K3_PROTO_E_TRUNCATED when it ends early, K3_PROTO_E_TRAILING when bytes
 * follow it. For tests, fuzzing and datagram-like use.
 */
int k3_proto_frame_decode(const uint8_t *buf, size_t len, struct k3_proto_header *h,
			  union k3_proto_body *body, struct k3_proto_err *err);

/* ---- helpers --------------------------------------------------------- */

/* The i-th id of a decoded or encoder-side id array. */
static inline uint32_t k3_proto_ids_at(const struct k3_proto_ids *ids, uint32_t i)
{
	if (ids->v)
		return ids->v[i];
	return (uint32_t)ids->le[4 * i] | (uint32_t)ids->le[4 * i + 1] << 8 |
	       (uint32_t)ids->le[4 * i + 2] << 16 | (uint32_t)ids->le[4 * i + 3] << 24;
}

/* The i-th value of a decoded or encoder-side u64 array. */
static inline uint64_t k3_proto_u64s_at(const struct k3_proto_u64s *a, uint32_t i)
{
	uint64_t v = 0;

	if (a->v)
		return a->v[i];
	for (int b = 7; b >= 0; b--)
		v = v << 8 | a->le[8 * i + (uint32_t)b];
	return v;
}

/* A view of a C string for encoding (NULL gives an empty view). */
static inline struct k3_proto_str k3_proto_str_of(const char *s)
{
	struct k3_proto_str r = { s, s ? (uint32_t)strlen(s) : 0 };
	return r;
}

/* True when p[0..n) is well-formed UTF-8 (no overlongs, no surrogates,
 * nothing above U+10FFFF). */
bool k3_proto_utf8_valid(const void *p, size_t n);

#endif

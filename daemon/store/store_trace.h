/*
 * store_trace.h - router traces: one JSON line per (request, position,
 * layer) with the authoritative routed expert ids and their fp32 weights as
 * hex bit patterns (exact, no decimal rounding):
 *
 *   {"request":7,"position":12,"layer":3,"ids":[5,17,...],
 *    "weights":["3e4ccccd",...]}
 *
 * Written by k3d --router-trace FILE; read back to rank experts by use
 * (k3ctl warm-expert-cache) and to replay cache policies (docs/store.md).
 * The writer appends, refuses symlinks and anything but a regular file, and
 * stops at a size cap (8 GiB by default) rather than fill the disk.
 */
#ifndef K3_STORE_TRACE_H
#define K3_STORE_TRACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"

enum {
	K3_STORE_TRACE_MAX_K = 64,          /* ids per record (K3: 16) */
	K3_STORE_TRACE_LINE_MAX = 8192,     /* bytes of one line, newline included */
};
#define K3_STORE_TRACE_CAP_DEFAULT ((uint64_t)8 << 30)

enum k3_store_trace_mode {
	K3_STORE_TRACE_BUFFERED = 0,   /* 1 MiB buffer, written when full and at close */
	K3_STORE_TRACE_SYNC = 1,       /* each record written with write(2) at once */
};

struct k3_store_trace_rec {
	uint64_t request;     /* request id (the protocol's) */
	uint64_t position;    /* token position in the sequence */
	uint32_t layer;       /* 0-based model layer */
	uint32_t k;           /* ids used, 1 .. K3_STORE_TRACE_MAX_K */
	uint32_t ids[K3_STORE_TRACE_MAX_K];
	float weights[K3_STORE_TRACE_MAX_K];   /* routing weights, bit-exact */
};

/* A writer is used by one thread at a time (the engine's). */
struct k3_store_trace;

/* Opens path for appending (created 0640 if missing). Refuses a symlink as
 * any component of path (-ELOOP: every directory is opened with O_NOFOLLOW
 * from "/" or the working directory, so a link planted in a parent cannot
 * redirect the writes) and anything but a regular file (-EINVAL).
 * A last line without its newline (a writer stopped mid-record) is cut off
 * first; a non-empty file with no newline in its last
 * K3_STORE_TRACE_LINE_MAX bytes is refused (-EINVAL: not a trace).
 * cap_bytes: the file never grows beyond it (0 = the default, 8 GiB).
 * Returns 0 or a negative errno with the reason in err. */
int k3_store_trace_open(const char *path, uint64_t cap_bytes, enum k3_store_trace_mode mode,
			struct k3_store_trace **out, struct k3_err *err);

/* Appends one record. Returns 0; -EFBIG when the record would pass the cap
 * (it and every later record are dropped; k3_store_trace_capped says so);
 * -EINVAL for k out of range; a write errno. */
int k3_store_trace_write(struct k3_store_trace *t, const struct k3_store_trace_rec *rec,
			 struct k3_err *err);

/* Appends the routes of one engine forward call: T positions starting at
 * pos0, n_moe MoE layers (their model layer indices in moe_layers), k ids
 * and weights per (position, layer) laid out [T][n_moe][k] as
 * struct k3_engine_out returns them. Stops at the first error (-EFBIG at
 * the cap) and returns it. */
int k3_store_trace_write_routes(struct k3_store_trace *t, uint64_t request, uint64_t pos0,
				uint32_t T, const uint32_t *moe_layers, uint32_t n_moe,
				uint32_t k, const uint32_t *ids, const float *weights,
				struct k3_err *err);

/* True once the cap stopped the trace. */
bool k3_store_trace_capped(const struct k3_store_trace *t);
/* File size including buffered bytes. */
uint64_t k3_store_trace_bytes(const struct k3_store_trace *t);

/* Writes the buffered records to the file now (k3d calls it after each
 * request, so a reader such as k3ctl warm-expert-cache sees every finished
 * request and a crash loses at most the running one). A no-op in sync mode.
 * Returns 0 or the write errno; the buffer is emptied either way. */
int k3_store_trace_flush(struct k3_store_trace *t, struct k3_err *err);

/* Flushes and closes. Returns 0 or the flush/close errno. Accepts NULL. */
int k3_store_trace_close(struct k3_store_trace *t, struct k3_err *err);

/* Formats rec as one line (with '\n') into buf[size]. Returns the length,
 * or -ENOSPC / -EINVAL. */
int k3_store_trace_format(const struct k3_store_trace_rec *rec, char *buf, size_t size);

/* Parses one line (len bytes, trailing newline optional) strictly: the five
 * fields, integer types and bounds, ids and weights of equal count, 8-hex
 * weights. Returns 0 or -EINVAL with what is wrong in err. */
int k3_store_trace_parse(const char *line, size_t len, struct k3_store_trace_rec *rec,
			 struct k3_err *err);

/* One expert's use in a trace. */
struct k3_store_trace_rank {
	uint32_t layer, expert;
	uint64_t uses;           /* records that routed to it */
	double weight_sum;       /* sum of its routing weights */
};

/* Reads the trace at path and ranks every (layer, expert) seen by uses,
 * most used first (ties: layer, then expert ascending). *out is malloc'd
 * (free it), *n its length, *records the lines read. Refuses non-regular
 * files; a malformed line fails with its line number, except a last line
 * without a newline that does not parse (torn: being written, or cut by a
 * full disk or a crash), which is skipped.
 * Returns 0 or a negative errno. */
int k3_store_trace_rank(const char *path, struct k3_store_trace_rank **out, size_t *n,
			uint64_t *records, struct k3_err *err);

#endif

/*
 * setup_remote.h - routed experts of a streaming install, fetched on
 * demand by range requests into their sparse shards: for k3ctl
 * fetch-weights and warm-expert-cache --fetch (a batch, run to the end),
 * and for k3d --fetch-experts (a background thread; the expert store asks
 * before it reads an expert that is not on disk, and waits).
 *
 * An expert is used only after its bytes were written and synced, and,
 * when the install has a per-expert SHA-256 table, after they hash to the
 * pinned digest (a mismatch is fetched once more, then fails: never
 * used). Without a table it counts as verified only by TLS until every
 * expert of its shard has arrived; then the whole shard is hashed against
 * the inventory. A shard that fails that check has every expert marked
 * absent again and its record marked for a fresh download (k3ctl setup),
 * and the failure is counted and reported: its experts were used on TLS's
 * word, which is why per-expert tables exist.
 */
#ifndef K3_SETUP_REMOTE_H
#define K3_SETUP_REMOTE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "model/model.h"
#include "setup/setup_install.h"
#include "store/store_source.h"

struct k3_setup_remote;

struct k3_setup_remote_stats {
	uint64_t experts_fetched;       /* experts that arrived and were accepted */
	uint64_t bytes;                 /* body bytes received */
	uint64_t verified_expert;       /* of them, checked against the per-expert table */
	uint64_t expert_mismatches;     /* digests that failed (each fetched again or failed) */
	uint64_t failed;                /* experts whose fetch failed for good */
	uint64_t shards_verified;       /* whole shards hashed and found equal */
	uint64_t shards_failed;         /* whole shards hashed and found different */
	unsigned in_flight;             /* experts being fetched now */
};

/* Opens the streaming install at o->dir for fetching, with m opened on the
 * same directory by the caller (it must outlive the fetcher). threaded:
 * start a background thread that runs the transfers (k3d); otherwise
 * k3_setup_remote_run does. The install's pinned inventory, state, expert
 * map and (when it lists one) per-expert table are loaded; the base URL
 * and CA bundle come from o (from, cacert) or from the install's state.
 * Returns 0, -ENOENT (not a streaming install: no expert map), or an errno. */
int k3_setup_remote_open(const struct k3_setup_opts *o, const struct k3_model *m, bool threaded,
			 struct k3_setup_remote **out, struct k3_err *err);
/* Stops the thread (in-flight fetches are abandoned: what they wrote is
 * never marked present) and frees. Accepts NULL. */
void k3_setup_remote_close(struct k3_setup_remote *r);

/* True when (layer, expert) is on disk and usable. */
bool k3_setup_remote_present(struct k3_setup_remote *r, uint32_t layer, uint32_t expert);
/* Queues the fetch of (layer, expert) unless it is present or on its way.
 * Returns 0, -ENOENT (not a routed expert), -EIO (it failed for good). */
int k3_setup_remote_want(struct k3_setup_remote *r, uint32_t layer, uint32_t expert,
			 struct k3_err *err);
/* Blocks until every expert with bytes in [off, off + len) of shard
 * `shard` is present, fetching those that are not (threaded fetchers
 * only). Returns 0 or the failed fetch's errno (err says which expert and
 * why). Thread-safe. */
int k3_setup_remote_ensure_range(struct k3_setup_remote *r, uint32_t shard, uint64_t off,
				 uint64_t len, struct k3_err *err);
/* Runs the transfers of a non-threaded fetcher until every wanted expert
 * is done. Returns 0 or the first failure's errno. */
int k3_setup_remote_run(struct k3_setup_remote *r, struct k3_err *err);
void k3_setup_remote_stats_get(struct k3_setup_remote *r, struct k3_setup_remote_stats *st);

/* Whether dir is a streaming install that still lacks bytes: some shard is
 * recorded sparse. *absent gets the routed experts not on disk (0 when the
 * expert map is missing). Returns 0 (*stream false for a full install or a
 * directory setup did not make) or an errno. */
int k3_setup_stream_status(const char *dir, bool *stream, uint64_t *absent, struct k3_err *err);

/* The expert store's reader for a streaming install (store.h, cfg.read):
 * ensures the bytes of rd (file index = shard index: a source made from
 * the shards alone, store_model.h) are on disk, fetching the experts they
 * belong to, then preads them from src. Returns what
 * k3_store_source_pread returns, or the fetch's errno (logged with its
 * reason). */
struct k3_setup_remote_reader {
	struct k3_setup_remote *remote;
	const struct k3_store_source *src;
};
int64_t k3_setup_remote_read(void *ctx, const struct k3_store_read *rd, uint8_t *dst);

/* One line for k3d's STATUS text: "streaming experts: N fetched (X GB),
 * K in flight, S shards verified, F failed". */
void k3_setup_remote_describe(struct k3_setup_remote *r, char *buf, size_t size);

#endif

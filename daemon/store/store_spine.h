/*
 * store_spine.h - the spine loader: the engine's spine source (engine.h,
 * struct k3_spine_source) over the spine pack (store_pack.h, one span per
 * layer, the embedding, the head) or, without a valid one, the shards'
 * tensor extents (a few reads per layer; for a model opened with the int8
 * spine overlay, model.h, its I8 matrices from the overlay's shards and
 * the rest from the model's), read with O_DIRECT where the file
 * system allows it through the store's reader pool (store_io.h, class
 * K3_STORE_IO_SPINE). docs/spine.md has the design and the numbers.
 *
 * Units: each layer, the head (model.norm, the output AttnRes pair,
 * lm_head) and the embedding. Memory:
 *
 *   - resident: layers 0..R-1 (an immutable ordered prefix), the head when
 *     head_resident, the embedding when embed_resident: each read once at
 *     creation into its own anonymous buffer, never changed after;
 *   - the ring: ring_arenas arenas of arena_bytes (the largest streamed
 *     unit) into which every other layer (and a streamed head) is read in
 *     each pass that uses it;
 *   - the embedding's rows, when it streams, are read per pass for the
 *     tokens in hand (one demand read per row) into a small scratch.
 *
 * Reading ahead: the engine's prefetch hints and every release fill the
 * arenas not in use with the next streamed layers in pass order, cyclically
 * (after the last layer comes the next pass's first streamed layer), giving
 * up the arena whose unit is needed furthest in the future (the one just
 * released): with two arenas, layer L+1 is read while layer L computes, and
 * the next pass's first streamed layer while the last one (or the head)
 * computes. The head is read only when the engine asks for it (a pass that
 * computes logits). A unit is read as jobs of chunk_bytes (file offsets
 * aligned, so O_DIRECT never reads a block twice), several readers at once;
 * a demand read (the current layer's experts) waits for at most one job.
 * Nothing the loader does maps or touches a shard's mmapped pages.
 *
 * Threads: the engine thread calls the source and the queries; reader
 * threads complete the jobs. One lock: the reader pool's.
 */
#ifndef K3_STORE_SPINE_H
#define K3_STORE_SPINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "engine/engine.h"
#include "model/model.h"
#include "store/store_io.h"
#include "store/store_source.h"

enum { K3_STORE_SPINE_RING_MIN = 2 };
/* Bytes per read job of a unit: big enough for sequential bandwidth, small
 * enough that a demand read waits little behind one. */
#define K3_STORE_SPINE_CHUNK_BYTES ((uint64_t)8 << 20)

/* --spine-resident (k3d, k3ctl bench) is the memory planner's
 * (store_plan.h): it fills the resident set of the config below. */

struct k3_store_spine_config {
	uint32_t resident_layers;    /* R <= n_layers: layers 0..R-1 resident */
	bool head_resident;
	bool embed_resident;
	/* Arenas of the ring (0 = K3_STORE_SPINE_RING_MIN); at least
	 * K3_STORE_SPINE_RING_MIN when a layer streams, at least 1 when only
	 * the head does. */
	uint32_t ring_arenas;
	enum k3_store_direct direct; /* how the pack (or the shards) are opened */
	/* The reader pool to read through (the expert store's, so demand
	 * reads of experts go first); NULL: the loader starts its own with
	 * io_threads readers (0 = 2). */
	struct k3_store_io *io;
	unsigned io_threads;
	uint64_t chunk_bytes;        /* multiple of 4096; 0 = K3_STORE_SPINE_CHUNK_BYTES */
	uint32_t max_rows;           /* embedding rows read at once; 0 = 64 */
};

/* Bytes each unit takes in the loader's memory (its reads' aligned extent,
 * the larger of the pack's and the shards' layout), from the model alone:
 * for budgets and the choice of a resident prefix before anything is
 * read. */
struct k3_store_spine_sizes {
	uint32_t n_layers;
	uint64_t layer[K3_PROV_MAX_LAYERS];
	uint64_t head, embed;
	uint64_t embed_row;          /* bytes of one embedding row (D x element size) */
	uint64_t spine_bytes;        /* every spine tensor's bytes (what a spine pack holds) */
};

/* Returns 0, -EINVAL (a spine tensor the provider ABI cannot carry),
 * -ENOMEM. */
int k3_store_spine_sizes(const struct k3_model *m, struct k3_store_spine_sizes *out,
			 struct k3_err *err);

/* The loader's memory for cfg over units of these sizes: resident units,
 * ring arenas (the largest streamed unit each) and row scratch, bytes. */
uint64_t k3_store_spine_memory(const struct k3_store_spine_sizes *z,
			       const struct k3_store_spine_config *cfg);

/* What creation found. */
struct k3_store_spine_report {
	bool from_pack;              /* the spine pack is read (else the shards) */
	bool pack_rejected;          /* a spine pack is there but stale or malformed */
	char rejection[K3_ERR_MSG_MAX];
	uint32_t files_direct, files_buffered;
};

struct k3_store_spine;

/* Creates the loader for m (which must outlive it): opens pack_path when
 * it names a spine pack valid for the files m's spine lies in (the
 * start-up check of store_pack.h: header and metadata hashes, the identity
 * of every source, k3_store_spine_idents: the shards and, for the int8
 * spine, the overlay's shards; and every tensor's name, dtype, shape and
 * length against the spine m runs: a BF16 spine pack never serves an int8
 * model, nor the reverse), else those files (rep says why:
 * k3_store_spine_pack_path names the pack of m's spine); allocates the
 * arenas; reads the resident units, waiting for them. pack_path NULL: the
 * shards. rep may be NULL. Returns 0, -EINVAL (bad config: R > layers, a
 * ring too small, chunk not aligned; or a tensor outside the files
 * opened), -EMEDIUMTYPE (direct on, and O_DIRECT is refused: the message
 * says what to do), -ENOMEM, or the read error of a resident unit (naming
 * it). A rejected pack is not an error. */
int k3_store_spine_new(const struct k3_model *m, const char *pack_path,
		       const struct k3_store_spine_config *cfg, struct k3_store_spine **out,
		       struct k3_store_spine_report *rep, struct k3_err *err);

/* Waits for the loader's reads in flight (queued ones are dropped) and
 * frees everything; a borrowed pool must outlive this call. No unit may
 * be acquired. Accepts NULL. */
void k3_store_spine_free(struct k3_store_spine *sp);

/* Fills *out with the source (ctx = sp) for k3_engine_open's opts.spine. */
void k3_store_spine_source(struct k3_store_spine *sp, struct k3_spine_source *out);

/* Monotonic counters since k3_store_spine_new returned (what reading the
 * resident units at creation cost is in the info's startup_bytes); a
 * request reports the difference of two snapshots. */
struct k3_store_spine_stats {
	uint64_t bytes_read;         /* device bytes, O_DIRECT alignment included: the ground truth */
	uint64_t reads;              /* read jobs completed */
	uint64_t loads;              /* units read whole (layers, the head; resident ones at creation) */
	uint64_t rows_read;          /* embedding rows read */
	uint64_t wasted_bytes;       /* units read ahead and given up before any use */
	/* units and rows a pass used, and (k3_store_spine_drain) what was read
	 * ahead into the next pass: after a drain, bytes_read = demand_bytes +
	 * wasted_bytes exactly (the spine reads no guesses) */
	uint64_t demand_bytes;
	uint64_t io_wait_ns;         /* time the engine waited in acquire and embed_rows */
};

void k3_store_spine_stats_get(struct k3_store_spine *sp, struct k3_store_spine_stats *st);
/* out = a - b, field by field. */
void k3_store_spine_stats_sub(const struct k3_store_spine_stats *a,
			      const struct k3_store_spine_stats *b,
			      struct k3_store_spine_stats *out);

struct k3_store_spine_info {
	uint32_t n_layers, resident_layers, ring_arenas;
	bool head_resident, embed_resident, from_pack;
	uint64_t arena_bytes;        /* each ring arena */
	uint64_t resident_bytes;     /* the resident units' buffers */
	uint64_t memory_bytes;       /* resident + ring + row scratch */
	uint64_t startup_bytes;      /* device bytes read at creation (the resident units) */
	/* bytes one pass reads when the head is used: every streamed layer,
	 * the streamed head (without the embedding's rows) */
	uint64_t streamed_bytes_per_pass;
};

void k3_store_spine_info_get(struct k3_store_spine *sp, struct k3_store_spine_info *info);

/* Blocks until none of the loader's reads is queued or in flight (the end
 * of a request, so every byte is charged to the request that caused it),
 * and counts what was read ahead into the next pass as demand. */
void k3_store_spine_drain(struct k3_store_spine *sp);

#endif

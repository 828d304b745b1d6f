/*
 * store_spine_internal.h - what store_spine.c (the loads, the engine's
 * spine source, the queries) and store_spine_new.c (the sizes, planning
 * the units, the buffers, creation and free) share. Not part of the
 * contract: store_spine.h is.
 */
#ifndef K3_STORE_SPINE_INTERNAL_H
#define K3_STORE_SPINE_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "store/store_io.h"
#include "store/store_source.h"
#include "store/store_spine.h"

enum arena_state { A_EMPTY = 0, A_LOADING, A_READY, A_FAILED };

/* A layer (pos < n_layers), the head (pos == n_layers) or the embedding
 * (pos == n_layers + 1): the reads that bring it into a buffer and where
 * each of its provider fields then lies. */
struct spine_unit {
	uint32_t pos;
	struct k3_store_read *rd;        /* slot offsets relative to the unit's buffer */
	unsigned n_rd;
	uint64_t bytes;                  /* buffer bytes its reads need (aligned) */
	uint32_t n_jobs;                 /* chunk jobs that read it */
	unsigned n_fields;
	struct k3_prov_tensor tmpl[K3_ENGINE_LAYER_FIELDS];   /* data NULL; dtype NONE: absent */
	uint64_t off[K3_ENGINE_LAYER_FIELDS];
	int arena;                       /* the arena holding or loading it, -1 */
	bool resident, streamed;         /* streamed: read per pass into the ring */
};

/* A buffer and the jobs that fill it: a ring arena (any streamed unit) or
 * a resident unit's own buffer. */
struct spine_arena {
	struct k3_store_spine *sp;
	uint8_t *mem;
	uint64_t bytes;
	int unit;                        /* -1: empty */
	enum arena_state state;
	bool in_use;                     /* acquired by the engine */
	bool used;                       /* acquired since it was loaded */
	bool abandoned;                  /* given up while jobs were running */
	uint32_t pending, n_jobs;        /* jobs of the current load: not done, all */
	int rc;
	uint64_t load_bytes;             /* device bytes of the current load */
	struct k3_store_io_job *jobs;
	struct k3_store_read *jrd;
	uint32_t cap_jobs;
};

struct k3_store_spine {
	const struct k3_model *model;
	struct k3_store_spine_config cfg;
	struct k3_store_source *src;
	struct k3_store_io *io;
	bool own_io, from_pack;
	uint32_t n_layers, vocab;
	struct spine_unit *units;        /* [n_layers + 2] */
	struct spine_arena *arenas;      /* [n_arenas]: the ring first, then resident buffers */
	uint32_t n_ring, n_arenas;
	uint64_t arena_bytes, resident_bytes, startup_bytes;
	uint32_t cursor;                 /* position of the most recently acquired unit */
	bool head_wanted;                /* this pass computes logits (the head may be read) */
	/* the embedding's rows, when they stream */
	uint32_t embed_file;
	uint64_t embed_offset, row_bytes, row_stride;
	uint8_t *row_mem;
	struct k3_store_io_job *row_jobs;
	struct k3_store_read *row_rd;
	uint32_t rows_pending;
	int rows_rc;
	struct k3_store_spine_stats st;
};

/* Chunk jobs of one read cut at file offsets that are multiples of chunk
 * from its aligned start (store_io.c cuts pieces the same way). */
static inline uint32_t k3_store_spine_read_jobs(const struct k3_store_read *r, uint64_t chunk)
{
	return (uint32_t)((r->offset % K3_STORE_ALIGN + r->length + chunk - 1) / chunk);
}

/* "layer N", "the head" or "the embedding", for messages; into buf. */
const char *k3_store_spine_unit_name(const struct k3_store_spine *sp, uint32_t pos, char *buf,
				     size_t size);

/* Loads, the pool's lock held (store_spine.c). Queues the reads of unit u
 * into arena a (empty), as chunk jobs. */
void k3_store_spine_start_load(struct k3_store_spine *sp, struct spine_arena *a, uint32_t u);
/* Gives up a loading arena: its queued jobs are taken back, the running
 * ones finish (then it is empty). */
void k3_store_spine_abandon(struct k3_store_spine *sp, struct spine_arena *a);
/* Waits until arena a is no longer loading, the time counted as I/O wait. */
void k3_store_spine_wait_arena(struct k3_store_spine *sp, struct spine_arena *a);
/* Sets err for a failed read of unit pos (naming it and its file) and
 * returns rc, the read's negative errno. */
int k3_store_spine_read_error(struct k3_store_spine *sp, uint32_t pos, int rc, struct k3_err *err);

#endif

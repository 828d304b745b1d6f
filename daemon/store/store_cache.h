/*
 * store_cache.h - the expert cache inside the store (internal to
 * daemon/store; the engine uses store.h): the state of one store, its
 * fixed slots, pins, and the eviction choice, shared by the files that
 * implement store.h. store_cache.c holds the acquire path (request, wait,
 * release) and the slot bookkeeping declared here; store_prefetch.c puts
 * guesses into slots through the same calls; store.c creates and queries
 * the store. Each slot embeds the read job (store_io.h) that fills it, and
 * the slot's state changes only under the reader pool's lock, in the same
 * critical sections in which the pool's job state changes.
 *
 * Every function here must be called with the lock held
 * (k3_store_io_lock(s->io)).
 */
#ifndef K3_STORE_CACHE_H
#define K3_STORE_CACHE_H

#include <stdbool.h>
#include <stdint.h>

#include "store/store.h"
#include "store/store_io.h"
#include "store/store_prefetch.h"
#include "store/store_source.h"

enum k3_store_slot_state {
	K3_STORE_SLOT_FREE = 0,
	K3_STORE_SLOT_QUEUED,    /* assigned, its read not started (queued, or about to be) */
	K3_STORE_SLOT_READING,   /* a reader thread owns the memory */
	K3_STORE_SLOT_READY,
	K3_STORE_SLOT_ERROR,
};

struct k3_store_slot {
	uint8_t *mem;                /* slot_bytes, K3_STORE_ALIGN-aligned; NULL in dry_run */
	int64_t ex;                  /* source expert index, -1 when free */
	enum k3_store_slot_state state;
	unsigned pins;
	bool demand;                 /* read as demand (else prefetch) */
	bool prefetched;             /* loaded by a prefetch not yet credited or wasted */
	bool missed;                 /* prefetched, and its layer's real routing did not choose
				      * it: the cold end, evicted before anything else */
	uint8_t guess_kind;          /* enum k3_store_guess_kind of its prefetch */
	uint64_t prefetch_step;      /* step the prefetch was submitted in */
	uint64_t last_use;           /* tick of the last acquire */
	uint64_t read_bytes;         /* bytes its read cost */
	uint64_t acq_gen;            /* acquire call that last pinned it */
	uint64_t counted_step;       /* step whose demand counters already include it */
	int err;                     /* read errno when ERROR */
	struct k3_store_plan plan;   /* of ex: the reads and where each array lands */
	struct k3_store_io_job job;  /* the read that fills it; job.owner = the store */
};

struct k3_store {
	const struct k3_store_source *src;
	struct k3_store_config cfg;
	uint64_t slot_bytes;
	uint32_t n_slots;
	struct k3_store_slot *slots;
	int32_t *slot_of;            /* per source expert: slot or -1 */
	uint32_t *uses;              /* per source expert: decayed acquire count (FREQ) */
	uint64_t uses_total;         /* acquisitions since the last decay */
	struct k3_store_io *io;      /* reader pool; its lock guards everything here */
	uint32_t prefetch_outstanding;   /* slots with prefetched == true */
	uint64_t piece_bytes;        /* a guess's read is cut at these (cfg or default) */
	uint64_t step, tick, acq_gen;
	uint64_t last_exit_ns;
	struct k3_store_stats st;
	struct k3_store_guesses guesses;
};

/* The layer of source expert ex. */
uint32_t k3_store_cache_layer_of(const struct k3_store *s, int64_t ex);

/* The slot owning a job of the cache. */
int32_t k3_store_cache_slot_of_job(const struct k3_store *s, const struct k3_store_io_job *job);

/* A free slot, or -1. */
int32_t k3_store_cache_find_free(const struct k3_store *s);

/* The eviction choice among unpinned READY/ERROR slots; -1 if none.
 *
 * Guesses read ahead and not (yet) used are the cold end: a demand read
 * takes the oldest of them before anything a demand read brought in, so a
 * wrong guess never costs a useful expert (the guess's own read is the
 * whole price of the mistake, counted as prefetch_wasted_bytes).
 *
 * for_prefetch (a guess needs a slot): an unresolved guess is never taken
 * (a guess must not evict another guess), nor any expert of `layer`, the
 * layer being guessed (its real routing may need it: evicting it would
 * turn a hit into a read). */
int32_t k3_store_cache_victim(const struct k3_store *s, bool for_prefetch, uint32_t layer);

/* Gives slot i to source expert ex, QUEUED, unpinned, with its plan; the
 * caller sets demand / prefetch fields and then issues it. */
void k3_store_cache_assign(struct k3_store *s, int32_t i, int64_t ex);

/* Returns a resident or queued slot to FREE (taking its queued read back),
 * settling prefetch accounting. The slot must be unpinned and not being
 * read. eviction: count it in the evictions counter (when READY). */
void k3_store_cache_drop(struct k3_store *s, int32_t i, bool eviction);

/* Issues the reads of slots[0..n) (QUEUED, not yet submitted) sorted by
 * the (file, offset) of their first read (sorts slots[] in place), each in
 * the class its slot's demand flag says. In dry_run they complete on the
 * spot. */
void k3_store_cache_issue(struct k3_store *s, int32_t *slots, size_t n);

#endif

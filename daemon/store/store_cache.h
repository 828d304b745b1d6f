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
	uint8_t drive;               /* where its bytes came (or come) from */
	uint8_t fate;                /* enum k3_store_fate: a guess acquired while being read */
	int8_t hedge;                /* the hedge racing its read (index), -1 */
	bool loser;                  /* a hedge won; its own read still runs into the
				      * buffer the hedge holds: not reusable until done */
	uint64_t acq_gen;            /* acquire call that last pinned it */
	uint64_t counted_step;       /* step whose demand counters already include it */
	int err;                     /* read errno when ERROR */
	struct k3_store_plan plan;   /* of ex: the reads and where each array lands */
	/* the plan its read was issued with, for that read alone: a hedge
	 * that wins replaces `plan` while this read still runs */
	struct k3_store_plan job_plan;
	struct k3_store_io_job job;  /* the read that fills it; job.owner = the store */
};

/* What the bytes of a guess acquired while it was being read become when
 * the read ends. */
enum k3_store_fate {
	K3_STORE_FATE_NONE = 0,
	K3_STORE_FATE_USED,          /* prefetch_used_bytes */
	K3_STORE_FATE_LATE,          /* demand_bytes: the same step wanted it */
};

enum { K3_STORE_MAX_HEDGES = 4 };

/* A hedge: a second read of a slot's expert from another copy, into its
 * own buffer. If it wins, the slot takes its buffer and plan and the
 * slot's old buffer waits here until the losing read ends. */
struct k3_store_hedge {
	struct k3_store_io_job job;
	struct k3_store_plan plan;
	uint8_t *mem;                /* slot_bytes */
	bool busy;
	int32_t slot;                /* racing for it; -1 once the slot's own read won */
	int32_t loser_slot;          /* holding that slot's old buffer until its read ends, -1 */
	uint8_t drive;
};

/* "auto" prefetch per drive: the fate of its guesses' bytes (windowed),
 * and whether it takes guesses now. */
struct k3_store_drive_prefetch {
	double used, wasted;
	bool off;
	uint64_t off_step;           /* step it turned off at */
};

struct k3_store {
	const struct k3_store_source *src;
	struct k3_store_config cfg;
	uint64_t slot_bytes;
	uint32_t n_slots;
	void *arrays;                /* one block (base/carve.h): slots, slot_of, uses, seen */
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
	uint32_t n_drives;
	struct k3_store_drive_prefetch dpf[K3_STORE_MAX_DRIVES];
	struct k3_store_hedge hedges[K3_STORE_MAX_HEDGES];
	uint32_t n_hedges;
	double hedge_factor;
	uint32_t *seen;              /* per source expert: epoch it was last counted distinct in */
	uint32_t epoch;
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

/* Issues the reads of slots[0..n) (QUEUED, not yet submitted): each from
 * the copy whose drive predicts the earliest completion (a guess only to
 * a drive whose prefetch is on, if any), then sorted by the (drive, file,
 * offset) of their first read (sorts slots[] in place), each in the class
 * its slot's demand flag says. In dry_run they complete on the spot. */
void k3_store_cache_issue(struct k3_store *s, int32_t *slots, size_t n);

/* The copy of source expert ex a read should use: the earliest predicted
 * completion among its drives (for a guess, among those whose prefetch
 * is on; -1 when there is none), counting `extra[d]` bytes already chosen
 * for drive d in this batch (may be NULL). */
int k3_store_cache_pick_copy(struct k3_store *s, int64_t ex, bool guess, const uint64_t *extra);

/* A guess's bytes met their fate on drive d: used (or late: right, but
 * in the step that wanted it) or wasted. Feeds "auto"'s per-drive record
 * (prefetch turns off on a drive whose guesses do not pay). */
void k3_store_cache_guess_fate(struct k3_store *s, uint32_t d, uint64_t bytes, bool right);

/* A slot whose read is done (ready, or failed with its error to report). */
static inline bool k3_store_slot_readable(const struct k3_store_slot *sl)
{
	return sl->state != K3_STORE_SLOT_QUEUED && sl->state != K3_STORE_SLOT_READING;
}

/* Counts one demand acquisition of source expert ex for the frequency
 * policy. Counts halve every 8 x n_slots acquisitions, so popularity
 * follows the workload. */
void k3_store_cache_note_use(struct k3_store *s, int64_t ex);

/* Bytes of a finished read from drive d whose fate is known now: a used
 * guess's (FATE_USED) or demand bytes (a late guess also feeds the drive's
 * record). */
void k3_store_cache_charge(struct k3_store *s, uint32_t d, uint64_t bytes, enum k3_store_fate fate);

/* Waits (lock held) until some read completes, first hedging the demand
 * reads among views[0..n) (those not taken[k]; taken may be NULL) that
 * run well past their drive's p95, and waking in time for the next one to
 * pass it. */
void k3_store_cache_wait_reads(struct k3_store *s, const struct k3_store_view *views, size_t n,
			       const uint8_t *taken);

#endif

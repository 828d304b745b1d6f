/*
 * store.h - the expert streaming store: a bounded RAM cache of routed
 * experts, filled by a pool of reader threads, with router-lookahead
 * prefetch and honest counters (docs/architecture.md, "Model store", "Honest
 * numbers").
 *
 * The cache is `cache_bytes / slot_bytes` fixed slots; slot_bytes is the
 * largest expert plan of the source (store_source.h; 17,547,264 bytes for a
 * K3 pack). A slot holds one expert's six arrays. The engine drives it:
 *
 *   k3_store_step_begin(s);                 one step = one layer of one
 *                                           token (or prefill chunk)
 *   k3_store_acquire(s, L, ids, 16, views)  real routing: pins the experts,
 *                                           reads the misses (sorted by file
 *                                           offset, ahead of any prefetch),
 *                                           waits, returns six pointers each
 *   ... compute with views[i].array[...] ...
 *   k3_store_release(s, views, 16)          unpins
 *   k3_store_prefetch(s, L + 1, guess, n)   lookahead guesses, low priority
 *
 * Invariants: a pinned expert is never evicted or overwritten; an expert the
 * step needs that cannot get a slot fails the acquire with -ENOSPC (never
 * skipped); prefetch only ever changes which bytes are read, never what
 * acquire returns. All functions are thread-safe (one mutex); the engine
 * thread is the expected caller.
 */
#ifndef K3_STORE_STORE_H
#define K3_STORE_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "store/store_io.h"
#include "store/store_source.h"

enum {
	K3_STORE_MAX_IO_THREADS = 16,
	/* >= 2 reads in flight (issue 7); prefetch reads may occupy all
	 * readers but one (a demand read never waits behind a guess). */
	K3_STORE_DEFAULT_IO_THREADS = 2,
	K3_STORE_GUESS_RANKS = 64,         /* ranks the precision gate tracks */
};

/* Default precision gate of "--prefetch auto": a wrong guess costs one
 * expert read, so at 0.9 at most about a tenth of the prefetch bytes are
 * waste (docs/store.md, "Prefetch", has the measurements). */
#define K3_STORE_PREFETCH_MIN_PRECISION 0.9
/* A guess is read in pieces of this many bytes (demand reads whole), so a
 * guess the real routing rejects while it is being read stops at the next
 * piece. docs/store.md "Stopping wrong guesses" has the measurements. */
#define K3_STORE_PREFETCH_PIECE_BYTES ((uint64_t)4 << 20)
/* A demand read running this many times its drive's recent p95 read time
 * is hedged with a read of another copy (docs/drives.md, "Placement and
 * hedging"): well past the p95, so about one read in twenty is not hedged
 * for being merely slow, and late enough that a hedge is rare. */
#define K3_STORE_HEDGE_FACTOR 1.5

/* Eviction policy among unpinned resident experts. docs/store.md has the
 * trace measurements behind the default (bench_store_policy). */
enum k3_store_policy {
	/* The default: the most recently acquired quarter of the slots is
	 * protected; outside it, fewest acquisitions (halved every 8 x slots
	 * acquisitions) first, then least recent. Never worse than LRU on the
	 * traces measured, up to 11 points fewer misses on skewed ones. */
	K3_STORE_POLICY_FREQ = 0,
	K3_STORE_POLICY_LRU = 1,    /* least recently acquired */
	K3_STORE_POLICY_COUNT
};

struct k3_store_config {
	uint64_t cache_bytes;        /* RAM budget in bytes; must hold >= 1 slot */
	unsigned io_threads;         /* 0 = K3_STORE_DEFAULT_IO_THREADS; max 16 */
	enum k3_store_policy policy;
	/* Most slots that may hold prefetched experts not yet used (queued,
	 * reading or resident): bounds what a bad guess can evict.
	 * -1 = auto (half the slots), 0 = prefetch off. */
	int prefetch_slots;
	/* The precision gate ("--prefetch auto"). false: every guess offered
	 * is read (within prefetch_slots). true: a guess of rank r for layer L
	 * is read only while the measured precision of rank r at layer L (the
	 * share of such guesses, read or not, that L's real routing then
	 * chose, shrunk towards rank r's precision over all layers, which
	 * starts at 50%: nothing is read ahead before guesses were scored) is
	 * at least prefetch_min_precision. */
	bool prefetch_auto;
	double prefetch_min_precision;   /* 0 = K3_STORE_PREFETCH_MIN_PRECISION */
	/* Piece size of a guess's read, bytes: a multiple of K3_STORE_ALIGN;
	 * 0 = K3_STORE_PREFETCH_PIECE_BYTES. */
	uint64_t prefetch_piece_bytes;
	/* Touch every page of every slot at creation, so a budget the machine
	 * cannot back fails at start (or is visible in RSS) instead of in the
	 * middle of a generation; costs about 1 s per 10 GB at start. */
	bool prefault;
	/* Check the three E8M0 scale arrays of every expert read for the
	 * forbidden byte 255 (docs/model.md §9; model.h leaves this to the store
	 * for checkpoints too big to scan at open). A bad expert fails its
	 * acquire with -EBADMSG naming it. */
	bool check_scales;
	/* The emulated drive of the reader pool (store_io.h): every read
	 * limited to io_rate_bytes_per_s bytes per second across the readers
	 * of a drive, each request io_latency_ns later; 0 = off. drive[d]
	 * overrides them for drive d (the source's file drives,
	 * store_source.h), and adds its stall fault and reader count. */
	uint64_t io_rate_bytes_per_s;
	uint64_t io_latency_ns;
	struct k3_store_io_drive_config drive[K3_STORE_MAX_DRIVES];
	/* Hedged reads, when experts have copies on several drives: a demand
	 * read running past hedge_factor x its drive's recent p95 gets a
	 * second read of another copy, the first to finish wins. 0 = off;
	 * K3_STORE_HEDGE_FACTOR is the default k3d uses. The hedge buffers
	 * (hedge_buffers slots' worth of memory; 0 = 2 per extra drive, at
	 * most 4) come out of cache_bytes while at least min_slots slots stay
	 * (0 = 1); otherwise hedging is off. */
	double hedge_factor;
	unsigned hedge_buffers;
	unsigned min_slots;
	/* Simulation: no memory, no threads, no reads; acquire completes at once
	 * and counters count the bytes the reads would have cost. Used to
	 * compare eviction policies on router traces (bench_store_policy). */
	bool dry_run;
	/* What the readers read expert bytes with: NULL = k3_store_io_read_source
	 * on the source (pread). A streaming install passes one that first
	 * fetches an expert that is not on disk yet (setup_remote.h); read_ctx
	 * is its argument. */
	k3_store_io_read_fn *read;
	void *read_ctx;
};

/* What acquire hands the engine for one expert. Pointers stay valid until
 * the matching k3_store_release. */
struct k3_store_view {
	uint32_t layer, expert;
	uint32_t slot;                               /* internal; for release */
	const uint8_t *array[K3_STORE_ARRAYS];       /* by enum k3_store_array; NULL in dry_run */
	uint64_t length[K3_STORE_ARRAYS];            /* bytes */
};

/* Monotonic counters since k3_store_new; a request reports the difference
 * of two snapshots (k3_store_stats_sub). */
struct k3_store_stats {
	uint64_t steps;                  /* k3_store_step_begin calls */
	uint64_t bytes_read;             /* from the device, incl. O_DIRECT alignment: ground truth */
	uint64_t reads;                  /* experts read (one job each) */
	/* demand_hits + demand_misses count each expert once per step, however
	 * many positions of a chunk or calls of the step ask for it. */
	uint64_t demand_hits;            /* resident and not read for this very step */
	uint64_t demand_misses;          /* everything else the real routing asked for */
	uint64_t demand_bytes;           /* bytes of reads issued as demand */
	uint64_t prefetch_issued;        /* prefetch reads that started */
	uint64_t prefetch_issued_bytes;
	uint64_t prefetch_used;          /* prefetched, then acquired in a LATER step */
	uint64_t prefetch_late;          /* prefetched and acquired in the same step: no credit */
	uint64_t prefetch_cancelled;     /* queued guesses dropped before their read started */
	uint64_t prefetch_aborted;       /* guesses rejected while being read, stopped part-way
					  * (the pieces read count in prefetch_wasted_bytes) */
	uint64_t prefetch_wasted_bytes;  /* read by prefetch, evicted before any use */
	uint64_t prefetch_skipped;       /* guesses not read: their rank's precision was below the gate */
	/* Lookahead quality, whether or not the guess was read: guesses of
	 * single-position lookaheads for experts not resident at the time
	 * (the ones a read would cost), and how many of them the layer's real
	 * routing then chose. */
	uint64_t guesses_scored;
	uint64_t guesses_right;
	uint64_t evictions;
	uint64_t io_wait_ns;             /* time acquire spent waiting for reads */
	uint64_t compute_ns;             /* time between acquires (the engine computing) */
	uint64_t emulated_wait_ns;       /* readers' sleep for the emulated drive (--io-rate) */
	/* Where the bytes went (docs/store.md, "Counters"): once
	 * the store is idle (k3_store_idle settles the guesses still unused),
	 * bytes_read = demand_bytes + prefetch_used_bytes +
	 * prefetch_wasted_bytes exactly, in total and per drive. demand_bytes
	 * holds the reads issued as demand (hedges and their losers included)
	 * and guesses that arrived in the very step that wanted them. */
	uint64_t prefetch_used_bytes;    /* bytes of guesses acquired in a later step */
	uint64_t hedges;                 /* duplicate reads of another copy issued */
	uint64_t hedges_won;             /* of which the duplicate finished first */
	uint64_t hedge_bytes;            /* bytes of the losing reads (part of demand_bytes) */
	uint64_t distinct_experts;       /* (layer, expert) pairs acquired for the first time
					  * since k3_store_epoch_begin */
	uint64_t drive_bytes_read[K3_STORE_MAX_DRIVES];
	uint64_t drive_reads[K3_STORE_MAX_DRIVES];
	uint64_t drive_demand_bytes[K3_STORE_MAX_DRIVES];
	uint64_t drive_prefetch_used_bytes[K3_STORE_MAX_DRIVES];
	uint64_t drive_prefetch_wasted_bytes[K3_STORE_MAX_DRIVES];
	/* reads on this drive that were hedged (it ran past its p95), and of
	 * those the ones another drive's copy then won */
	uint64_t drive_hedges[K3_STORE_MAX_DRIVES];
	uint64_t drive_hedges_won[K3_STORE_MAX_DRIVES];
	/* guesses not read because every drive holding the expert had its
	 * prefetch turned off by "auto" (part of prefetch_skipped) */
	uint64_t drive_prefetch_off_skips[K3_STORE_MAX_DRIVES];
};

/* Gauges describing the store now. */
struct k3_store_info {
	uint32_t n_slots;
	uint64_t slot_bytes;
	uint32_t resident;               /* slots holding or loading an expert */
	uint32_t pinned;
	uint32_t files_direct, files_buffered;
	unsigned io_threads;
	/* Bytes read by prefetch, resident and not used (yet): waste if they
	 * are evicted unused (then counted in prefetch_wasted_bytes). */
	uint64_t prefetch_unused_bytes;
	uint32_t n_drives;               /* of the source */
	uint32_t hedge_buffers;          /* 0: hedging off */
	/* per drive: experts it holds a copy of, whether "auto" has prefetch
	 * on there now, and its reader pool's view (rate, p95, queue) */
	uint32_t drive_experts[K3_STORE_MAX_DRIVES];
	bool drive_prefetch_on[K3_STORE_MAX_DRIVES];
	struct k3_store_io_drive_info drive[K3_STORE_MAX_DRIVES];
};

struct k3_store;

/* Creates a store over src (borrowed: it must outlive the store and not be
 * changed while the store exists) and starts
 * its reader threads. Returns 0, -EINVAL (empty source, budget below one
 * slot, bad config: the message says which), -ENOMEM. */
int k3_store_new(const struct k3_store_source *src, const struct k3_store_config *cfg,
		 struct k3_store **out, struct k3_err *err);

/* Stops the readers (waiting for reads in flight) and frees every slot.
 * No expert may be pinned. Accepts NULL. */
void k3_store_free(struct k3_store *s);

/* Starts a new step. Prefetches submitted from now on belong to it; an
 * acquire in this same step that finds them earns no prefetch credit. */
void k3_store_step_begin(struct k3_store *s);

/* Makes experts[0..n) of `layer` resident and pinned, and fills views[0..n)
 * in the same order (duplicates allowed: one read, one pin each). First
 * cancels this layer's queued prefetches that the real routing did not
 * choose. Misses go to the head of the read queue sorted by (file, offset).
 * Blocks until every expert is readable.
 * Returns 0; -ENOENT for an expert the source does not have; -ENOSPC when
 * the unpinned slots cannot hold this call's misses (nothing is evicted that
 * is pinned, nothing is skipped; the message gives the budget needed); a
 * read errno (-EIO...) naming the expert. On error nothing stays pinned. */
int k3_store_acquire(struct k3_store *s, uint32_t layer, const uint32_t *experts,
		     size_t n, struct k3_store_view *views, struct k3_err *err);

/* The two halves of k3_store_acquire, so the reads of a layer's misses
 * run while the caller computes something else (the shared experts):
 * k3_store_request does everything acquire does except waiting (pins,
 * counts demand hits and misses, cancels the layer's wrong guesses, queues
 * the misses ahead of every prefetch) and fills views[0..n) with layer,
 * expert and slot only; k3_store_wait then blocks until those experts are
 * readable and fills their arrays. After a 0 from request exactly one of
 * k3_store_wait (then k3_store_release as usual) or k3_store_request_abort
 * must follow. Errors as acquire; on an error of either half nothing of
 * this request stays pinned. Time inside both counts as I/O wait, time
 * between them as compute. */
int k3_store_request(struct k3_store *s, uint32_t layer, const uint32_t *experts,
		     size_t n, struct k3_store_view *views, struct k3_err *err);
int k3_store_wait(struct k3_store *s, struct k3_store_view *views, size_t n, struct k3_err *err);
/* Like k3_store_wait, one expert at a time in the order they become
 * readable: among views[0..n) whose taken[k] is 0, picks one that is ready
 * (blocking until one is), fills its arrays and those of its duplicates
 * (same slot), sets their taken[] to 1, and returns 1 with *which = its
 * index; returns 0 when every view is taken. On an error (as wait) every
 * view of the request is unpinned, taken or not. */
int k3_store_wait_any(struct k3_store *s, struct k3_store_view *views, size_t n,
		      uint8_t *taken, size_t *which, struct k3_err *err);
/* True when the next k3_store_wait_any on the same views and taken[]
 * would block: some view is not taken and none of those is readable yet
 * (its read queued or in flight). The engine runs its partial lookahead
 * then, in time it would otherwise spend waiting. Does not block. */
bool k3_store_would_block(struct k3_store *s, const struct k3_store_view *views, size_t n,
			  const uint8_t *taken);
/* Gives up a request that will not be waited for: unpins its experts and
 * drops those of its reads that have not started. */
void k3_store_request_abort(struct k3_store *s, const struct k3_store_view *views, size_t n);

/* Unpins views[0..n) from one acquire. */
void k3_store_release(struct k3_store *s, const struct k3_store_view *views, size_t n);

/* Which lookahead made a guess. Each kind is scored and gated on its own
 * record: they guess with different precision. */
enum k3_store_guess_kind {
	/* the next MoE layer's router on the residual after a layer (or on
	 * the embedding, for the first MoE layer) */
	K3_STORE_GUESS_AFTER = 0,
	/* the same on the residual with only part of the layer's routed
	 * experts, while the layer waits for its last reads (engine.h,
	 * would_block) */
	K3_STORE_GUESS_PARTIAL = 1,
	K3_STORE_GUESS_KINDS
};

/* Queues low-priority reads of experts[0..n) of `layer` (guesses, best
 * first; at most 64 per call are considered) into free slots, or slots the
 * policy would evict anyway (never an unresolved guess, never an expert of
 * `layer`: its own routing may need it), within the prefetch_slots bound.
 * Experts already resident or unknown are skipped. ranks[i] is the rank of
 * experts[i] in its position's router order (0 = most confident; NULL:
 * ranks[i] = i); with prefetch_auto only ranks whose measured precision
 * passes the gate are read. score: the guesses come from a one-position
 * lookahead and count towards the precision estimate (a chunk's guesses
 * are judged against the union of its positions' routes, which would
 * flatter them). kind: which lookahead guessed; the gate and the scores
 * are kept per kind, and a new lookahead of one kind replaces that kind's
 * unscored guesses of `layer` only. A lookahead after the layer also drops
 * the partial lookahead's guesses of `layer` whose reads have not started
 * and that it does not repeat among experts[0..n) (prefetch_cancelled). A
 * guess read and not chosen by the real routing sits at the cold end of
 * the cache: the next eviction takes it before anything a demand read
 * brought in. Returns how many reads were queued (0 for an unknown kind). */
size_t k3_store_prefetch_ranked(struct k3_store *s, uint32_t layer, const uint32_t *experts,
				const uint32_t *ranks, size_t n, bool score,
				enum k3_store_guess_kind kind);
/* k3_store_prefetch_ranked(s, layer, experts, NULL, n, true, K3_STORE_GUESS_AFTER). */
size_t k3_store_prefetch(struct k3_store *s, uint32_t layer, const uint32_t *experts, size_t n);

/* Lookahead quality of one kind by rank since the store started, summed
 * over layers: scored[r] guesses of rank r (not resident when guessed),
 * right[r] of them chosen by the real routing. r < K3_STORE_GUESS_RANKS. */
void k3_store_guess_table(struct k3_store *s, enum k3_store_guess_kind kind, uint64_t *scored,
			  uint64_t *right);

/* Drops every queued (not yet started) prefetch of `layer`, or of all
 * layers when layer == UINT32_MAX, and moves that layer's guesses being
 * read or resident to the cold end. Returns how many were dropped. */
size_t k3_store_prefetch_cancel(struct k3_store *s, uint32_t layer);

/* Marks the engine idle (end of a request), so the wait until the next
 * acquire is not counted as compute time, and settles every guess read and
 * not used yet as wasted (it stays cached, at the cold end), so that a
 * request's counters add up (bytes_read = demand + prefetch used +
 * prefetch wasted). Call after k3_store_prefetch_cancel and
 * k3_store_drain. */
void k3_store_idle(struct k3_store *s);

/* Starts counting distinct experts afresh: distinct_experts counts each
 * (layer, expert) the next acquires pin for the first time since this
 * call (a prompt's prefill: its cost against one read of each). */
void k3_store_epoch_begin(struct k3_store *s);

/* While held, reader threads start no prefetch read (queued guesses stay
 * queued; demand reads are unaffected). For tests that need a guess to stay
 * cancellable, and for phases where the disk must serve demand only. */
void k3_store_hold_prefetch(struct k3_store *s, bool hold);
/* While held, reader threads start no read at all, demand reads included:
 * for tests that need a request's reads to stay queued (a wait for one of
 * them blocks until the hold is lifted; k3_store_drain ignores them). */
void k3_store_hold_reads(struct k3_store *s, bool hold);
/* While held, a guess being read pauses after each piece until the hold
 * is lifted (then a guess its layer's real routing rejected meanwhile is
 * dropped there): for tests that need a guess still in flight when the
 * routing comes. k3_store_drain and a wait for a held guess block: lift
 * the hold first. */
void k3_store_hold_pieces(struct k3_store *s, bool hold);

/* Blocks until no read is queued or in flight (tests, shutdown, preload). */
void k3_store_drain(struct k3_store *s);

/* True when (layer, expert) is resident and ready (tests, warm-up). */
bool k3_store_resident(struct k3_store *s, uint32_t layer, uint32_t expert);

/* The store's reader pool, for other clients that should share its
 * readers and its priorities (the spine loader, store_spine.h): valid
 * until k3_store_free. */
struct k3_store_io *k3_store_reader_pool(struct k3_store *s);

void k3_store_stats_get(struct k3_store *s, struct k3_store_stats *st);
void k3_store_info_get(struct k3_store *s, struct k3_store_info *info);

/* out = a - b, field by field (a later snapshot minus an earlier one). */
void k3_store_stats_sub(const struct k3_store_stats *a, const struct k3_store_stats *b,
			struct k3_store_stats *out);

const char *k3_store_policy_name(enum k3_store_policy p);
/* Parses "lru" or "freq". Returns 0 or -EINVAL. */
int k3_store_policy_parse(const char *s, enum k3_store_policy *out, struct k3_err *err);

#endif

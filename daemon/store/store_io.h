/*
 * store_io.h - the store's reader pool: a fixed set of reader threads that
 * take read jobs from per-class queues, most urgent class first, and read
 * them with pread (store_source.h), a guess in pieces so it can be stopped
 * part-way. The expert cache (store_cache.h) and prefetch
 * (store_prefetch.h) are its clients today; it knows nothing of slots,
 * experts or layers.
 *
 * A job is a list of planned reads (struct k3_store_read: file, offset,
 * length, where in the destination) of one source, a destination buffer
 * (K3_STORE_ALIGN-aligned), a class and four callbacks. Lifecycle of one
 * job:
 *
 *   client: fills the job, k3_store_io_submit        -> queued in its class
 *   reader: takes it, calls ops->start (lock held)   -> running
 *           reads every piece (lock released), between two pieces checks
 *           the job's stop flag (lock held)
 *           calls ops->check on the bytes (lock released), if it read all
 *           calls ops->done(rc, bytes, stopped) (lock held) -> idle again;
 *           the pool never touches the job after done returns
 *   client: k3_store_io_cancel takes a queued job back (no callback ever);
 *           k3_store_io_set_stop stops a running job at its next piece
 *
 * One lock. The pool's mutex is also its clients' lock: a client keeps its
 * own state about its jobs under it (the cache's slot states), and the
 * callbacks run with it held, so a job's state in the pool and in its
 * client never disagree (a reader takes a job and the client marks its
 * slot reading in one critical section). Every function below but new,
 * free, lock and unlock must be called with the lock held; reads
 * themselves run without it.
 *
 * Scheduling: a reader takes the head of the first class (in enum order)
 * that has a queued job, is not held and is under its reader cap. Demand
 * reads always go first, then the next spine layer's reads (the spine
 * loader, store_spine.h, reads a layer as many jobs of a few MiB, so a
 * demand read waits at most for one of them), then guesses. The cap of a
 * class past DEMAND counts the running jobs of every class from SPINE to
 * it, so with the expert store's prefetch cap of threads - 1 a guess never
 * takes the last reader not busy with demand or spine reads: a demand read
 * never waits behind a guess.
 *
 * How the next issues plug in:
 *   - spine streaming (issue 17, built): the class K3_STORE_IO_SPINE; the
 *     spine loader is one more client of the store's pool, its layer
 *     arenas the destinations.
 *   - an emulated drive (built: --io-rate GBPS, --io-latency MS): see
 *     rate_bytes_per_s and latency_ns in struct k3_store_io_config.
 *   - several drives, hedged reads (issue 19): readers grouped per drive
 *     (a job's first read names its file, so its drive); a hedge is a
 *     second job for the same bytes in another drive's queue, and the
 *     client cancels or stops the loser in its done callback.
 *   - remote fetch (issue 20): a job's read callback need not be pread: an
 *     HTTPS range fetcher is another k3_store_io_read_fn (with its own
 *     ctx), and check verifies what arrived.
 */
#ifndef K3_STORE_IO_H
#define K3_STORE_IO_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "store/store_source.h"

/* Job classes, most urgent first. Grow only between the two or at the end,
 * ordered by priority (the scheduler scans them in this order). */
enum k3_store_io_class {
	K3_STORE_IO_DEMAND = 0,     /* the engine waits for it (experts, embedding rows) */
	K3_STORE_IO_SPINE = 1,      /* the next spine layer: read when no demand job waits */
	K3_STORE_IO_PREFETCH = 2,   /* a guess: read only when no demand or spine job waits */
	K3_STORE_IO_CLASSES
};

enum { K3_STORE_IO_MAX_THREADS = 16 };

struct k3_store_io_job;

/* Reads rd into dst + rd->slot_offset (dst K3_STORE_ALIGN-aligned).
 * Returns the bytes read from the device (>= rd->length; more with
 * O_DIRECT alignment) or a negative errno. Runs without the lock, on a
 * reader thread; must be thread-safe. */
typedef int64_t k3_store_io_read_fn(void *ctx, const struct k3_store_read *rd, uint8_t *dst);

struct k3_store_io_ops {
	/* A reader took the job from its queue (lock held). May be NULL. */
	void (*start)(struct k3_store_io_job *job);
	/* Every read succeeded and the job was not stopped: a check on the
	 * bytes, run without the lock. Returns 0 or a negative errno (the
	 * job then completes with it). May be NULL. */
	int (*check)(struct k3_store_io_job *job);
	/* The job is over (lock held): rc 0 or a negative errno; bytes: read
	 * from the device, including pieces of a stopped job; stopped: the
	 * stop flag ended it at a piece boundary (rc is 0 then). The job is
	 * idle when this is called and may be resubmitted or freed from it. */
	void (*done)(struct k3_store_io_job *job, int rc, uint64_t bytes, bool stopped);
};

/* One read job. The client owns the storage, fills the fields above the
 * line before k3_store_io_submit and must not change them or free the job
 * (nor rd[] or dst) until it is cancelled or done. */
struct k3_store_io_job {
	k3_store_io_read_fn *read;        /* k3_store_io_read_source, or another reader */
	void *read_ctx;                   /* read's ctx (for read_source: the source) */
	const struct k3_store_read *rd;   /* [n_rd], borrowed */
	unsigned n_rd;
	uint8_t *dst;                     /* K3_STORE_ALIGN-aligned */
	/* 0: each read is one request. Else a multiple of K3_STORE_ALIGN: each
	 * read is cut into pieces at file offsets that are multiples of it
	 * from the read's aligned start (so O_DIRECT never reads a block
	 * twice), and the stop flag is checked between pieces. */
	uint64_t piece_bytes;
	const struct k3_store_io_ops *ops;
	void *owner;                      /* the client's, untouched by the pool */
	/* ---- the pool's, under the lock ---- */
	enum k3_store_io_class cls;
	int state;                        /* idle, queued, running */
	bool stop;
	struct k3_store_io_job *prev, *next;
};

/* Reader caps (0 = no cap): for DEMAND, most demand jobs running at once;
 * for a later class c, most jobs of the classes SPINE..c running at once
 * while a job of c starts.
 *
 * The emulated drive (benchmarks and tests: I/O-bound behaviour measured
 * at a fixed bandwidth over files the page cache serves): every request
 * (a piece, or a whole read) of any class and reader books the drive for
 * latency_ns after it was issued plus its device bytes / rate_bytes_per_s
 * on one shared transfer timeline (a token bucket with no burst: requests
 * in flight overlap their latencies, never their transfers), and its
 * reader sleeps until the booking ends. A request the real file is slower
 * for than the emulation ends when the real read does: the drive only ever
 * slows reads down. Bytes counted stay the device bytes, exactly. */
struct k3_store_io_config {
	unsigned threads;                                  /* 0 .. K3_STORE_IO_MAX_THREADS */
	unsigned class_readers[K3_STORE_IO_CLASSES];
	uint64_t rate_bytes_per_s;                         /* 0 = no bandwidth limit */
	uint64_t latency_ns;                               /* per request; 0 = none */
};

/* Monotonic counters since k3_store_io_new, per class. */
struct k3_store_io_stats {
	uint64_t jobs[K3_STORE_IO_CLASSES];      /* jobs completed (done called), stopped ones too */
	uint64_t bytes[K3_STORE_IO_CLASSES];     /* device bytes read */
	uint64_t stopped[K3_STORE_IO_CLASSES];   /* ended by their stop flag */
	uint64_t failed[K3_STORE_IO_CLASSES];    /* completed with rc != 0 */
	uint64_t emulated_wait_ns;               /* readers' sleep for the emulated drive, all classes */
};

struct k3_store_io;

/* Creates the pool and starts cfg->threads readers (0 is allowed: a pool
 * that queues but never reads, for a client that simulates its reads).
 * Returns 0, -EINVAL (too many threads), -ENOMEM, -EAGAIN (a thread would
 * not start; the message says which). */
int k3_store_io_new(const struct k3_store_io_config *cfg, struct k3_store_io **out,
		    struct k3_err *err);

/* Stops the readers, waiting for the jobs they are reading (whose done
 * callbacks run), and frees the pool. Queued jobs are dropped without a
 * callback. Call without the lock. Accepts NULL. */
void k3_store_io_free(struct k3_store_io *io);

void k3_store_io_lock(struct k3_store_io *io);
void k3_store_io_unlock(struct k3_store_io *io);

/* Blocks until some job completes or a hold changes (a condition wait on
 * the pool's lock: spurious wake-ups happen; re-check your condition). */
void k3_store_io_wait(struct k3_store_io *io);

/* Queues an idle job at the tail of class cls and wakes a reader. */
void k3_store_io_submit(struct k3_store_io *io, struct k3_store_io_job *job,
			enum k3_store_io_class cls);

/* Takes a queued job back: returns true and the job is idle (no callback
 * will run); false when it was not queued (idle, or already running). */
bool k3_store_io_cancel(struct k3_store_io *io, struct k3_store_io_job *job);

/* Sets or clears the stop flag of a running job: set, it ends at its next
 * piece boundary (done gets stopped = true); cleared before then, it reads
 * on. No effect on a job that is not running (submit clears the flag). */
void k3_store_io_set_stop(struct k3_store_io *io, struct k3_store_io_job *job, bool stop);

/* The class a job is queued in, or -1 when it is not queued. */
int k3_store_io_queued(const struct k3_store_io_job *job);

/* Queued jobs of a class in queue order: the first, and the one after job
 * (NULL at the end). */
struct k3_store_io_job *k3_store_io_first(struct k3_store_io *io, enum k3_store_io_class cls);
struct k3_store_io_job *k3_store_io_next(const struct k3_store_io_job *job);

/* Holds (tests, and phases where the disk must serve some class alone):
 * while a class is held no reader starts a job of it; while all are held
 * none starts at all; while pieces are held a running job with pieces
 * pauses before each next piece (and then checks its stop flag). */
void k3_store_io_hold_class(struct k3_store_io *io, enum k3_store_io_class cls, bool hold);
void k3_store_io_hold_all(struct k3_store_io *io, bool hold);
void k3_store_io_hold_pieces(struct k3_store_io *io, bool hold);

/* Blocks until no job is running and no job that a reader could start is
 * queued (jobs of held classes are not waited for). */
void k3_store_io_drain(struct k3_store_io *io);

unsigned k3_store_io_threads(const struct k3_store_io *io);
void k3_store_io_stats_get(const struct k3_store_io *io, struct k3_store_io_stats *st);

/* The usual read: ctx is a const struct k3_store_source *, and the read
 * is k3_store_source_pread of it. */
int64_t k3_store_io_read_source(void *ctx, const struct k3_store_read *rd, uint8_t *dst);

#endif

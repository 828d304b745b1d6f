/*
 * store_io.h - the store's reader pool: one or more drives, each with its
 * own reader threads and per-class read queues (most urgent class first),
 * reading with pread (store_source.h), a guess in pieces so it can be
 * stopped or paused part-way. The expert cache (store_cache.h), prefetch
 * (store_prefetch.h) and the spine loader (store_spine.h) are its clients;
 * it knows nothing of slots, experts or layers.
 *
 * A job is a list of planned reads (struct k3_store_read: file, offset,
 * length, where in the destination) of one source, a destination buffer
 * (K3_STORE_ALIGN-aligned), the drive whose readers read it, a class and
 * three callbacks. Lifecycle of one job:
 *
 *   client: fills the job, k3_store_io_submit        -> queued on its drive
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
 * free, lock, unlock and now_ns must be called with the lock held; reads
 * themselves run without it.
 *
 * Drives (issue 19). A drive is a set of files that share one device's
 * bandwidth (a copy of the packs on one disk); its readers take only its
 * jobs. A client that has copies of the same bytes on several drives picks
 * one per read with k3_store_io_predict (measured bandwidth and what is
 * queued there), and may hedge a read that runs past its drive's recent
 * p95 (k3_store_io_hedge_after) with a second job for the same bytes on
 * another drive, cancelling or stopping the loser from its done callback.
 *
 * Scheduling on each drive: a reader takes the head of the first class (in
 * enum order) that has a queued job there, is not held and is under its
 * reader cap. Demand reads always go first, then the next spine layer's
 * reads (the spine loader reads a layer as many jobs of a few MiB, so a
 * demand read waits at most for one of them), then guesses. The cap of a
 * class past DEMAND counts the running jobs of every class from SPINE to
 * it, on the same drive. A guess costs demand nothing (docs/drives.md,
 * "Idle capacity"): it starts only while no demand job is queued on any
 * drive and none is running on its own; a guess being read pauses before
 * its next piece while demand is queued or running on its drive (unless
 * it was promoted: the routing wants it), and resumes when the drive is
 * free of demand again.
 *
 * The emulated drive (benchmarks and tests: I/O-bound behaviour measured
 * at a fixed bandwidth over files the page cache serves): every request
 * (a piece, or a whole read) of any class and reader of a drive books the
 * drive for its latency after it was issued plus its device bytes / rate
 * on the drive's one transfer timeline (a token bucket with no burst:
 * requests in flight overlap their latencies, never their transfers), and
 * its reader sleeps until the booking ends. A stalled request (a fault, a
 * fraction of requests drawn from a seeded sequence) ends stall_ns later
 * than its booking without holding the timeline: the drive serves others
 * meanwhile, as a read retried inside one device would. A request the
 * real file is slower for than the emulation ends when the real read
 * does. Byte counters stay the device bytes, exactly.
 *
 * How the next issues plug in:
 *   - remote fetch (issue 20): a job's read callback need not be pread: an
 *     HTTPS range fetcher is another k3_store_io_read_fn (with its own
 *     ctx), and check verifies what arrived; a remote mirror is a drive.
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
	K3_STORE_IO_PREFETCH = 2,   /* a guess: read only in idle capacity (see above) */
	K3_STORE_IO_CLASSES
};

enum {
	K3_STORE_IO_MAX_THREADS = 16,    /* readers of one drive */
	K3_STORE_IO_MAX_DRIVES = K3_STORE_MAX_DRIVES,
	/* Read times a drive remembers for its p95 (the latest ones), and how
	 * many it needs before it names one. */
	K3_STORE_IO_TIME_SAMPLES = 64,
	K3_STORE_IO_TIME_MIN_SAMPLES = 16,
};

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
	unsigned drive;                   /* whose readers read it; < the pool's drives */
	/* Its read time counts in the drive's p95 (k3_store_io_hedge_after):
	 * set it on reads of one kind and size (the cache's expert reads). */
	bool timed;
	const struct k3_store_io_ops *ops;
	void *owner;                      /* the client's, untouched by the pool */
	/* ---- the pool's, under the lock ---- */
	enum k3_store_io_class cls;
	int state;                        /* idle, queued, running */
	bool stop;
	bool promoted;                    /* a guess the routing wants: never paused */
	bool untimed;                     /* its time says nothing of the drive (a hedged read) */
	uint64_t bytes_planned;           /* sum of rd[].length */
	uint64_t t_queued_ns, t_start_ns; /* CLOCK_MONOTONIC */
	struct k3_store_io_job *prev, *next;
};

/* One drive: its readers and its emulation. Zeros take the pool's values. */
struct k3_store_io_drive_config {
	unsigned threads;                  /* readers; 0 = the pool's threads */
	uint64_t rate_bytes_per_s;         /* emulated bandwidth; 0 = the pool's */
	uint64_t latency_ns;               /* emulated latency per request; 0 = the pool's */
	/* A fault for the hedging tests and benchmarks: this fraction of the
	 * drive's requests (in [0, 1], drawn from a sequence seeded by
	 * stall_seed and the drive) ends stall_ns after its booking. */
	double stall_fraction;
	uint64_t stall_ns;
	uint64_t stall_seed;
};

/* Reader caps per drive (0 = no cap): for DEMAND, most demand jobs running
 * at once; for a later class c, most jobs of the classes SPINE..c running
 * at once while a job of c starts. */
struct k3_store_io_config {
	unsigned threads;                                  /* per drive, 0 .. K3_STORE_IO_MAX_THREADS */
	unsigned class_readers[K3_STORE_IO_CLASSES];
	uint64_t rate_bytes_per_s;                         /* every drive's emulation; 0 = none */
	uint64_t latency_ns;                               /* per request; 0 = none */
	unsigned n_drives;                                 /* 0 = 1 */
	struct k3_store_io_drive_config drive[K3_STORE_IO_MAX_DRIVES];
};

/* Monotonic counters of one drive since k3_store_io_new. */
struct k3_store_io_drive_stats {
	uint64_t jobs[K3_STORE_IO_CLASSES];      /* jobs completed (done called), stopped ones too */
	uint64_t bytes[K3_STORE_IO_CLASSES];     /* device bytes read */
	uint64_t stopped[K3_STORE_IO_CLASSES];   /* ended by their stop flag */
	uint64_t failed[K3_STORE_IO_CLASSES];    /* completed with rc != 0 */
	uint64_t busy_ns;                        /* time with at least one job running */
	uint64_t emulated_wait_ns;               /* readers' sleep for the emulated drive */
	uint64_t stalls;                         /* requests given the emulated stall */
	uint64_t pauses;                         /* guesses paused before a piece for demand */
};

/* Monotonic counters since k3_store_io_new: per class over every drive,
 * and per drive. */
struct k3_store_io_stats {
	uint64_t jobs[K3_STORE_IO_CLASSES];
	uint64_t bytes[K3_STORE_IO_CLASSES];
	uint64_t stopped[K3_STORE_IO_CLASSES];
	uint64_t failed[K3_STORE_IO_CLASSES];
	uint64_t emulated_wait_ns;               /* all drives */
	struct k3_store_io_drive_stats drive[K3_STORE_IO_MAX_DRIVES];
};

/* What a drive looks like now. */
struct k3_store_io_drive_info {
	unsigned threads;
	uint64_t rate_bytes_per_s;     /* measured: recent bytes over recent busy time; 0 = none yet */
	uint64_t p95_ns;               /* of its recent timed reads; 0 = too few yet */
	uint64_t p95_bytes;            /* their mean size */
	uint64_t queued_bytes;         /* demand and spine jobs queued */
	uint32_t running, queued;      /* jobs of every class */
	uint64_t emulated_rate, emulated_latency_ns;
};

struct k3_store_io;

/* Creates the pool and starts cfg->threads readers per drive (0 is
 * allowed: a pool that queues but never reads, for a client that
 * simulates its reads). Returns 0, -EINVAL (too many threads or drives, a
 * stall fraction outside [0, 1]), -ENOMEM, -EAGAIN (a thread would not
 * start; the message says which). */
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
/* The same, giving up at CLOCK_MONOTONIC time deadline_ns (0 = never). */
void k3_store_io_wait_until(struct k3_store_io *io, uint64_t deadline_ns);

/* CLOCK_MONOTONIC now, ns (no lock needed). */
uint64_t k3_store_io_now_ns(void);

/* Queues an idle job at the tail of class cls on job->drive and wakes a
 * reader there. */
void k3_store_io_submit(struct k3_store_io *io, struct k3_store_io_job *job,
			enum k3_store_io_class cls);

/* Takes a queued job back: returns true and the job is idle (no callback
 * will run); false when it was not queued (idle, or already running). */
bool k3_store_io_cancel(struct k3_store_io *io, struct k3_store_io_job *job);

/* Sets or clears the stop flag of a running job: set, it ends at its next
 * piece boundary (done gets stopped = true); cleared before then, it reads
 * on. No effect on a job that is not running (submit clears the flag). */
void k3_store_io_set_stop(struct k3_store_io *io, struct k3_store_io_job *job, bool stop);

/* A running guess the routing now wants: it no longer pauses for demand
 * (it is demand). No effect on a job that is not running. */
void k3_store_io_promote(struct k3_store_io *io, struct k3_store_io_job *job);

/* The class a job is queued in, or -1 when it is not queued. */
int k3_store_io_queued(const struct k3_store_io_job *job);
/* True while a reader is reading the job. */
bool k3_store_io_running(const struct k3_store_io_job *job);

/* Queued jobs of a class in queue order, drive after drive: the first,
 * and the one after job (NULL at the end). */
struct k3_store_io_job *k3_store_io_first(struct k3_store_io *io, enum k3_store_io_class cls);
struct k3_store_io_job *k3_store_io_next(struct k3_store_io *io, const struct k3_store_io_job *job);

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

/* Readers of every drive together, and the drive count. */
unsigned k3_store_io_threads(const struct k3_store_io *io);
unsigned k3_store_io_drives(const struct k3_store_io *io);
void k3_store_io_stats_get(const struct k3_store_io *io, struct k3_store_io_stats *st);
void k3_store_io_drive_info_get(struct k3_store_io *io, unsigned drive,
				struct k3_store_io_drive_info *info);

/* When a demand read of `bytes` submitted now on `drive` should complete,
 * ns from now: the demand and spine bytes ahead of it there (queued, and
 * what running jobs have left) plus its own, at the drive's measured rate
 * (before it has one: the emulated rate, else the mean of the measured
 * ones, else 1 GB/s), plus the emulated latency. The client sends a read
 * with several copies where this is least (ties to the lower drive). */
uint64_t k3_store_io_predict(struct k3_store_io *io, unsigned drive, uint64_t bytes);

/* The CLOCK_MONOTONIC time after which running job `job` (timed, on its
 * drive) is well past the drive's recent p95 read time: start + factor x
 * p95 scaled to the job's size (the p95 capped at 4 x the median, so that
 * stalls of a twentieth of the reads do not become the norm); 0 when the drive has too few samples, the
 * job is not running or factor is 0. The sample of a job marked with
 * k3_store_io_untime is left out (a hedged read: its time is censored). */
uint64_t k3_store_io_hedge_after(struct k3_store_io *io, const struct k3_store_io_job *job,
				 double factor);
void k3_store_io_untime(struct k3_store_io *io, struct k3_store_io_job *job);

/* The usual read: ctx is a const struct k3_store_source *, and the read
 * is k3_store_source_pread of it. */
int64_t k3_store_io_read_source(void *ctx, const struct k3_store_read *rd, uint8_t *dst);

#endif

/*
 * store_io.c - the reader pool (see store_io.h): per drive, per-class FIFO
 * queues of jobs and reader threads that take the most urgent job their
 * class caps and the idle-capacity rule allow; the piece-by-piece read
 * that lets a guess be stopped or paused part-way; the emulated drive
 * around each request; each drive's measured rate and recent read times.
 * Everything but the reads and the emulated sleeps runs under the one pool
 * lock.
 */
#include "store/store_io.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { JOB_IDLE = 0, JOB_QUEUED, JOB_RUNNING };

/* The measured rate forgets: its byte and time sums halve past this. */
#define RATE_WINDOW_BYTES ((double)(512u << 20))
/* Bytes a drive must have read before its own rate is trusted. */
#define RATE_MIN_BYTES ((double)(4u << 20))
/* The rate assumed for a drive nothing is known about. */
#define RATE_DEFAULT 1e9

struct io_queue {
	struct k3_store_io_job *head, *tail;
	uint32_t len;
	uint64_t bytes;            /* bytes_planned of the queued jobs */
};

struct io_drive {
	struct k3_store_io *io;
	unsigned idx;
	unsigned n_threads;
	pthread_t threads[K3_STORE_IO_MAX_THREADS];
	unsigned cap[K3_STORE_IO_CLASSES];       /* most running jobs per class */
	struct io_queue q[K3_STORE_IO_CLASSES];
	uint32_t running[K3_STORE_IO_CLASSES];
	uint32_t in_flight;
	struct k3_store_io_job *run_head;        /* running jobs (prev/next reused) */
	uint64_t busy_since_ns;                  /* in_flight became > 0 */
	/* measured rate: decayed sums of bytes read and busy time */
	double rate_bytes, rate_ns;
	uint64_t rate_since_ns;                  /* busy time after it is not in rate_ns yet */
	/* recent timed reads, ns per planned byte, a ring */
	double sample[K3_STORE_IO_TIME_SAMPLES];
	double sample_bytes[K3_STORE_IO_TIME_SAMPLES];
	uint32_t n_samples, next_sample;
	/* the emulated drive */
	uint64_t rate, latency_ns, stall_ns;
	double stall_fraction;
	uint64_t rng;
	uint64_t free_ns;                        /* its transfer timeline is free from here */
	struct k3_store_io_drive_stats st;
};

struct k3_store_io {
	pthread_mutex_t mu;
	pthread_cond_t work_cv;   /* readers wait for jobs (and held or paused pieces) */
	pthread_cond_t done_cv;   /* clients wait for completions (CLOCK_MONOTONIC) */
	unsigned n_drives;
	struct io_drive drive[K3_STORE_IO_MAX_DRIVES];
	uint32_t demand_queued;   /* DEMAND jobs queued on every drive */
	uint32_t in_flight;       /* running jobs on every drive */
	bool stop;
	bool hold_all, hold_pieces;
	bool held[K3_STORE_IO_CLASSES];
};

uint64_t k3_store_io_now_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static struct io_drive *drive_of(struct k3_store_io *io, const struct k3_store_io_job *job)
{
	return &io->drive[job->drive < io->n_drives ? job->drive : 0];
}

/* Demand and spine jobs are what a new demand read waits behind. */
static bool ahead_class(enum k3_store_io_class c)
{
	return c == K3_STORE_IO_DEMAND || c == K3_STORE_IO_SPINE;
}

/* Takes job out of the doubly linked list at *head: a class queue, or a
 * drive's running list, which keeps no tail (tail NULL). */
static void list_unlink(struct k3_store_io_job **head, struct k3_store_io_job **tail,
			struct k3_store_io_job *job)
{
	if (job->prev)
		job->prev->next = job->next;
	else
		*head = job->next;
	if (job->next)
		job->next->prev = job->prev;
	else if (tail)
		*tail = job->prev;
	job->prev = job->next = NULL;
}

static void q_remove(struct k3_store_io *io, struct k3_store_io_job *job)
{
	struct io_queue *q = &drive_of(io, job)->q[job->cls];

	list_unlink(&q->head, &q->tail, job);
	q->len--;
	q->bytes -= job->bytes_planned;
	if (job->cls == K3_STORE_IO_DEMAND)
		io->demand_queued--;
}

static void q_push(struct k3_store_io *io, struct k3_store_io_job *job)
{
	struct io_queue *q = &drive_of(io, job)->q[job->cls];

	job->next = NULL;
	job->prev = q->tail;
	if (q->tail)
		q->tail->next = job;
	else
		q->head = job;
	q->tail = job;
	q->len++;
	q->bytes += job->bytes_planned;
	if (job->cls == K3_STORE_IO_DEMAND)
		io->demand_queued++;
}

static void run_add(struct io_drive *d, struct k3_store_io_job *job)
{
	job->prev = NULL;
	job->next = d->run_head;
	if (d->run_head)
		d->run_head->prev = job;
	d->run_head = job;
}

/* The job a free reader of drive d should start now, or NULL. A guess
 * only in idle capacity: no demand job queued on any drive, none running
 * on this one. */
static struct k3_store_io_job *pick(const struct k3_store_io *io, const struct io_drive *d)
{
	if (io->hold_all)
		return NULL;
	uint32_t busy = 0;   /* running jobs of the classes SPINE..c */

	for (int c = 0; c < K3_STORE_IO_CLASSES; c++) {
		busy = c == K3_STORE_IO_DEMAND ? d->running[c] : busy + d->running[c];
		if (d->q[c].len && !io->held[c] && busy < d->cap[c] &&
		    (c != K3_STORE_IO_PREFETCH ||
		     (io->demand_queued == 0 && d->running[K3_STORE_IO_DEMAND] == 0)))
			return d->q[c].head;
		if (c == K3_STORE_IO_DEMAND)
			busy = 0;
	}
	return NULL;
}

/* A running guess pauses before its next piece while demand uses its
 * drive: running there, or queued with a reader free to take it (were
 * every reader busy, the queued demand waits for one of them anyway, and
 * a paused guess holding the last one would never let it start). */
static bool paused(const struct io_drive *d, const struct k3_store_io_job *job)
{
	if (job->cls != K3_STORE_IO_PREFETCH || job->promoted)
		return false;
	return d->running[K3_STORE_IO_DEMAND] ||
	       (d->q[K3_STORE_IO_DEMAND].len && d->in_flight < d->n_threads);
}

/* Piece p of a read cut at multiples of `piece` bytes (a multiple of
 * K3_STORE_ALIGN) from the read's aligned start: every piece but the first
 * starts aligned, so O_DIRECT never reads a block twice and the pieces
 * cost exactly the bytes of the whole read. */
static uint64_t read_pieces(const struct k3_store_read *rd, uint64_t piece)
{
	return (rd->offset % K3_STORE_ALIGN + rd->length + piece - 1) / piece;
}

static struct k3_store_read read_piece(const struct k3_store_read *rd, uint64_t piece,
				       uint64_t p)
{
	uint64_t a = rd->offset - rd->offset % K3_STORE_ALIGN + p * piece, b = a + piece;
	uint64_t end = rd->offset + rd->length;

	if (a < rd->offset)
		a = rd->offset;
	if (b > end)
		b = end;
	return (struct k3_store_read){ .file = rd->file, .offset = a, .length = b - a,
				       .slot_offset = rd->slot_offset + (a - rd->offset) };
}

/* splitmix64: the stall draws of a drive, reproducible from its seed. */
static uint64_t next_draw(uint64_t *x)
{
	uint64_t z = (*x += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* The emulated drive (store_io.h): a request issued at t_issue that read
 * `bytes` from the device books its transfer on the drive's timeline after
 * its latency, a stalled one ends stall_ns later, and its reader sleeps
 * until then. Returns the ns slept. */
static uint64_t emulate(struct k3_store_io *io, struct io_drive *d, uint64_t t_issue,
			uint64_t bytes)
{
	uint64_t dur = d->rate ? (uint64_t)((double)bytes * 1e9 / (double)d->rate) : 0;
	uint64_t ready = t_issue + d->latency_ns, end;

	pthread_mutex_lock(&io->mu);
	uint64_t start = ready > d->free_ns ? ready : d->free_ns;
	end = d->free_ns = start + dur;
	if (d->stall_fraction > 0 &&
	    (double)(next_draw(&d->rng) >> 11) * 0x1p-53 < d->stall_fraction) {
		end += d->stall_ns;
		d->st.stalls++;
	}
	pthread_mutex_unlock(&io->mu);
	uint64_t t = k3_store_io_now_ns();
	if (t >= end)
		return 0;
	struct timespec ts = { (time_t)(end / 1000000000u), (long)(end % 1000000000u) };
	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
	return end - t;
}

/* Between two pieces (lock held): waits while pieces are held or the
 * guess is paused for demand; returns true when the stop flag ends the
 * job here. A stop ends a paused guess at once, a held one after the
 * hold. */
static bool between_pieces(struct k3_store_io *io, struct io_drive *d,
			   struct k3_store_io_job *job)
{
	bool counted = false;

	while (!io->stop) {
		if (io->hold_pieces) {
			pthread_cond_wait(&io->work_cv, &io->mu);
			continue;
		}
		if (job->stop || !paused(d, job))
			break;
		if (!counted) {
			d->st.pauses++;
			counted = true;
		}
		pthread_cond_wait(&io->work_cv, &io->mu);
	}
	return job->stop;
}

/* Reads every read of job; returns 0 or a negative errno, with the device
 * bytes in *bytes and the emulated drive's sleep in *waited. Between two
 * pieces, under the lock, a job whose stop flag is set ends there: then it
 * returns with the lock held and *stopped set; otherwise without the
 * lock. */
static int read_job(struct k3_store_io *io, struct io_drive *d, struct k3_store_io_job *job,
		    uint64_t *bytes, bool *stopped, uint64_t *waited)
{
	bool first = true, emulated = d->rate || d->latency_ns || d->stall_fraction > 0;

	*bytes = 0;
	*stopped = false;
	*waited = 0;
	for (unsigned r = 0; r < job->n_rd; r++) {
		uint64_t n = job->piece_bytes ? read_pieces(&job->rd[r], job->piece_bytes) : 1;
		for (uint64_t p = 0; p < n; p++) {
			struct k3_store_read rd = job->piece_bytes
				? read_piece(&job->rd[r], job->piece_bytes, p) : job->rd[r];
			int64_t got;
			if (job->piece_bytes && !first) {
				pthread_mutex_lock(&io->mu);
				if (between_pieces(io, d, job)) {
					*stopped = true;
					return 0;
				}
				pthread_mutex_unlock(&io->mu);
			}
			first = false;
			uint64_t t_issue = emulated ? k3_store_io_now_ns() : 0;
			got = job->read(job->read_ctx, &rd, job->dst);
			if (got < 0)
				return (int)got;
			*bytes += (uint64_t)got;
			if (emulated)
				*waited += emulate(io, d, t_issue, (uint64_t)got);
		}
	}
	return 0;
}

/* Folds the busy time since rate_since_ns into the rate's sums (lock held). */
static void rate_fold(struct io_drive *d, uint64_t now)
{
	if (d->in_flight && now > d->rate_since_ns) {
		d->rate_ns += (double)(now - d->rate_since_ns);
		d->rate_since_ns = now;
	}
}

static void job_begins(struct io_drive *d, struct k3_store_io_job *job, uint64_t now)
{
	if (d->in_flight++ == 0) {
		d->busy_since_ns = now;
		d->rate_since_ns = now;
	}
	d->io->in_flight++;
	d->running[job->cls]++;
	run_add(d, job);
	job->state = JOB_RUNNING;
	job->t_start_ns = now;
}

static void job_ends(struct io_drive *d, struct k3_store_io_job *job, uint64_t bytes,
		     bool ok, uint64_t now)
{
	rate_fold(d, now);
	d->rate_bytes += (double)bytes;
	if (d->rate_bytes > RATE_WINDOW_BYTES) {
		d->rate_bytes /= 2;
		d->rate_ns /= 2;
	}
	if (--d->in_flight == 0)
		d->st.busy_ns += now - d->busy_since_ns;
	d->io->in_flight--;
	d->running[job->cls]--;
	list_unlink(&d->run_head, NULL, job);
	if (ok && job->timed && !job->untimed && job->bytes_planned) {
		d->sample[d->next_sample] = (double)(now - job->t_start_ns) /
					    (double)job->bytes_planned;
		d->sample_bytes[d->next_sample] = (double)job->bytes_planned;
		d->next_sample = (d->next_sample + 1) % K3_STORE_IO_TIME_SAMPLES;
		if (d->n_samples < K3_STORE_IO_TIME_SAMPLES)
			d->n_samples++;
	}
}

static void *reader_main(void *arg)
{
	struct io_drive *d = arg;
	struct k3_store_io *io = d->io;

	pthread_mutex_lock(&io->mu);
	for (;;) {
		struct k3_store_io_job *job;
		enum k3_store_io_class cls;
		uint64_t bytes, waited;
		bool stopped;
		int rc;

		while (!io->stop && !(job = pick(io, d)))
			pthread_cond_wait(&io->work_cv, &io->mu);
		if (io->stop)
			break;
		cls = job->cls;
		q_remove(io, job);
		job_begins(d, job, k3_store_io_now_ns());
		/* The last queued demand job started: other drives may take
		 * guesses now. */
		if (cls == K3_STORE_IO_DEMAND && io->demand_queued == 0)
			pthread_cond_broadcast(&io->work_cv);
		if (job->ops->start)
			job->ops->start(job);
		pthread_mutex_unlock(&io->mu);

		rc = read_job(io, d, job, &bytes, &stopped, &waited);
		if (rc == 0 && !stopped && job->ops->check)
			rc = job->ops->check(job);

		if (!stopped)
			pthread_mutex_lock(&io->mu);
		job_ends(d, job, bytes, rc == 0 && !stopped, k3_store_io_now_ns());
		/* A capped class (or, through the shared caps, a later one) may
		 * start its next job now; the end of demand on this drive
		 * resumes its paused guesses and may open guesses anywhere. */
		if (cls == K3_STORE_IO_DEMAND)
			pthread_cond_broadcast(&io->work_cv);
		else
			for (int c = cls; c < K3_STORE_IO_CLASSES; c++)
				if (d->cap[c] < d->n_threads && d->q[c].len) {
					pthread_cond_signal(&io->work_cv);
					break;
				}
		d->st.jobs[cls]++;
		d->st.bytes[cls] += bytes;
		d->st.stopped[cls] += stopped;
		d->st.failed[cls] += rc != 0;
		d->st.emulated_wait_ns += waited;
		job->state = JOB_IDLE;
		job->stop = false;
		job->ops->done(job, rc, bytes, stopped);
		pthread_cond_broadcast(&io->done_cv);
	}
	pthread_mutex_unlock(&io->mu);
	return NULL;
}

static int check_config(const struct k3_store_io_config *cfg, struct k3_err *err)
{
	unsigned n = cfg->n_drives ? cfg->n_drives : 1;

	if (n > K3_STORE_IO_MAX_DRIVES)
		return k3_err_set(err, -EINVAL, "%u drives; at most %d", n, K3_STORE_IO_MAX_DRIVES);
	for (unsigned i = 0; i < n; i++) {
		const struct k3_store_io_drive_config *dc = &cfg->drive[i];
		unsigned t = dc->threads ? dc->threads : cfg->threads;
		if (t > K3_STORE_IO_MAX_THREADS)
			return k3_err_set(err, -EINVAL, "%u I/O threads; at most %d", t,
					  K3_STORE_IO_MAX_THREADS);
		if (!(dc->stall_fraction >= 0 && dc->stall_fraction <= 1))
			return k3_err_set(err, -EINVAL, "drive %u: stall fraction %g is not in [0, 1]",
					  i, dc->stall_fraction);
	}
	return 0;
}

int k3_store_io_new(const struct k3_store_io_config *cfg, struct k3_store_io **out,
		    struct k3_err *err)
{
	struct k3_store_io *io;
	pthread_condattr_t ca;
	int rc;

	*out = NULL;
	if ((rc = check_config(cfg, err)) != 0)
		return rc;
	io = calloc(1, sizeof(*io));
	if (!io)
		return k3_err_set(err, -ENOMEM, "out of memory");
	io->n_drives = cfg->n_drives ? cfg->n_drives : 1;
	for (unsigned i = 0; i < io->n_drives; i++) {
		const struct k3_store_io_drive_config *dc = &cfg->drive[i];
		struct io_drive *d = &io->drive[i];
		unsigned t = dc->threads ? dc->threads : cfg->threads;
		d->io = io;
		d->idx = i;
		for (int c = 0; c < K3_STORE_IO_CLASSES; c++)
			d->cap[c] = cfg->class_readers[c] && cfg->class_readers[c] < t
				    ? cfg->class_readers[c] : t;
		d->rate = dc->rate_bytes_per_s ? dc->rate_bytes_per_s : cfg->rate_bytes_per_s;
		d->latency_ns = dc->latency_ns ? dc->latency_ns : cfg->latency_ns;
		d->stall_fraction = dc->stall_fraction;
		d->stall_ns = dc->stall_ns;
		d->rng = dc->stall_seed ^ (0x9e3779b97f4a7c15ull * (i + 1));
	}
	pthread_mutex_init(&io->mu, NULL);
	pthread_cond_init(&io->work_cv, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&io->done_cv, &ca);
	pthread_condattr_destroy(&ca);
	for (unsigned i = 0; i < io->n_drives; i++) {
		struct io_drive *d = &io->drive[i];
		unsigned t = cfg->drive[i].threads ? cfg->drive[i].threads : cfg->threads;
		for (unsigned k = 0; k < t; k++) {
			if (pthread_create(&d->threads[k], NULL, reader_main, d) != 0) {
				k3_store_io_free(io);
				return k3_err_set(err, -EAGAIN, "cannot start I/O thread %u of drive %u",
						  k, i);
			}
			d->n_threads = k + 1;
		}
	}
	*out = io;
	return 0;
}

void k3_store_io_free(struct k3_store_io *io)
{
	if (!io)
		return;
	pthread_mutex_lock(&io->mu);
	io->stop = true;
	pthread_cond_broadcast(&io->work_cv);
	pthread_mutex_unlock(&io->mu);
	for (unsigned i = 0; i < io->n_drives; i++)
		for (unsigned t = 0; t < io->drive[i].n_threads; t++)
			pthread_join(io->drive[i].threads[t], NULL);
	pthread_cond_destroy(&io->done_cv);
	pthread_cond_destroy(&io->work_cv);
	pthread_mutex_destroy(&io->mu);
	free(io);
}

void k3_store_io_lock(struct k3_store_io *io)
{
	pthread_mutex_lock(&io->mu);
}

void k3_store_io_unlock(struct k3_store_io *io)
{
	pthread_mutex_unlock(&io->mu);
}

void k3_store_io_wait(struct k3_store_io *io)
{
	pthread_cond_wait(&io->done_cv, &io->mu);
}

void k3_store_io_wait_until(struct k3_store_io *io, uint64_t deadline_ns)
{
	if (!deadline_ns) {
		pthread_cond_wait(&io->done_cv, &io->mu);
		return;
	}
	struct timespec ts = { (time_t)(deadline_ns / 1000000000u),
			       (long)(deadline_ns % 1000000000u) };
	pthread_cond_timedwait(&io->done_cv, &io->mu, &ts);
}

void k3_store_io_submit(struct k3_store_io *io, struct k3_store_io_job *job,
			enum k3_store_io_class cls)
{
	job->cls = cls;
	job->state = JOB_QUEUED;
	job->stop = job->promoted = job->untimed = false;
	job->bytes_planned = 0;
	for (unsigned r = 0; r < job->n_rd; r++)
		job->bytes_planned += job->rd[r].length;
	job->t_queued_ns = k3_store_io_now_ns();
	q_push(io, job);
	pthread_cond_broadcast(&io->work_cv);
}

bool k3_store_io_cancel(struct k3_store_io *io, struct k3_store_io_job *job)
{
	if (job->state != JOB_QUEUED)
		return false;
	q_remove(io, job);
	job->state = JOB_IDLE;
	/* no demand queued any more: guesses may start */
	if (job->cls == K3_STORE_IO_DEMAND && io->demand_queued == 0)
		pthread_cond_broadcast(&io->work_cv);
	return true;
}

void k3_store_io_set_stop(struct k3_store_io *io, struct k3_store_io_job *job, bool stop)
{
	if (job->state == JOB_RUNNING) {
		job->stop = stop;
		if (stop)   /* a paused guess ends at once */
			pthread_cond_broadcast(&io->work_cv);
	}
}

void k3_store_io_promote(struct k3_store_io *io, struct k3_store_io_job *job)
{
	if (job->state == JOB_RUNNING && !job->promoted) {
		job->promoted = true;
		pthread_cond_broadcast(&io->work_cv);
	}
}

int k3_store_io_queued(const struct k3_store_io_job *job)
{
	return job->state == JOB_QUEUED ? (int)job->cls : -1;
}

bool k3_store_io_running(const struct k3_store_io_job *job)
{
	return job->state == JOB_RUNNING;
}

struct k3_store_io_job *k3_store_io_first(struct k3_store_io *io, enum k3_store_io_class cls)
{
	for (unsigned d = 0; d < io->n_drives; d++)
		if (io->drive[d].q[cls].head)
			return io->drive[d].q[cls].head;
	return NULL;
}

struct k3_store_io_job *k3_store_io_next(struct k3_store_io *io, const struct k3_store_io_job *job)
{
	if (job->next)
		return job->next;
	for (unsigned d = job->drive + 1; d < io->n_drives; d++)
		if (io->drive[d].q[job->cls].head)
			return io->drive[d].q[job->cls].head;
	return NULL;
}

/* A hold changed: readers re-check what they may start, waiters re-check
 * their condition (a drain stops waiting for held jobs). */
static void holds_changed(struct k3_store_io *io)
{
	pthread_cond_broadcast(&io->work_cv);
	pthread_cond_broadcast(&io->done_cv);
}

void k3_store_io_hold_class(struct k3_store_io *io, enum k3_store_io_class cls, bool hold)
{
	io->held[cls] = hold;
	holds_changed(io);
}

void k3_store_io_hold_all(struct k3_store_io *io, bool hold)
{
	io->hold_all = hold;
	holds_changed(io);
}

void k3_store_io_hold_pieces(struct k3_store_io *io, bool hold)
{
	io->hold_pieces = hold;
	holds_changed(io);
}

void k3_store_io_drain(struct k3_store_io *io)
{
	for (;;) {
		bool startable = false;
		for (unsigned d = 0; d < io->n_drives && !io->hold_all; d++)
			for (int c = 0; c < K3_STORE_IO_CLASSES; c++)
				startable |= io->drive[d].q[c].len && !io->held[c];
		if (!startable && !io->in_flight)
			return;
		pthread_cond_wait(&io->done_cv, &io->mu);
	}
}

unsigned k3_store_io_threads(const struct k3_store_io *io)
{
	unsigned n = 0;

	for (unsigned d = 0; d < io->n_drives; d++)
		n += io->drive[d].n_threads;
	return n;
}

unsigned k3_store_io_drives(const struct k3_store_io *io)
{
	return io->n_drives;
}

void k3_store_io_stats_get(const struct k3_store_io *io, struct k3_store_io_stats *st)
{
	memset(st, 0, sizeof(*st));
	for (unsigned d = 0; d < io->n_drives; d++) {
		const struct k3_store_io_drive_stats *ds = &io->drive[d].st;
		st->drive[d] = *ds;
		for (int c = 0; c < K3_STORE_IO_CLASSES; c++) {
			st->jobs[c] += ds->jobs[c];
			st->bytes[c] += ds->bytes[c];
			st->stopped[c] += ds->stopped[c];
			st->failed[c] += ds->failed[c];
		}
		st->emulated_wait_ns += ds->emulated_wait_ns;
	}
}

/* The drive's measured rate, bytes/s, or 0 before it has read enough. */
static double measured_rate(struct io_drive *d, uint64_t now)
{
	rate_fold(d, now);
	if (d->rate_bytes < RATE_MIN_BYTES || d->rate_ns <= 0)
		return 0;
	return d->rate_bytes * 1e9 / d->rate_ns;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* The p95 of the drive's recent timed reads, ns per planned byte, capped
 * at 4 x their median: a drive whose stalls reach a twentieth of its
 * reads would otherwise have a stall for its p95 and never be hedged (the
 * hedged ones then leave the record, k3_store_io_untime). 0 with too few
 * samples. */
static double p95_per_byte(const struct io_drive *d)
{
	double v[K3_STORE_IO_TIME_SAMPLES];

	if (d->n_samples < K3_STORE_IO_TIME_MIN_SAMPLES)
		return 0;
	memcpy(v, d->sample, d->n_samples * sizeof(double));
	qsort(v, d->n_samples, sizeof(double), cmp_double);
	double p95 = v[(d->n_samples * 95 + 99) / 100 - 1], p50 = v[(d->n_samples - 1) / 2];
	return p95 < 4 * p50 ? p95 : 4 * p50;
}

void k3_store_io_drive_info_get(struct k3_store_io *io, unsigned drive,
				struct k3_store_io_drive_info *info)
{
	memset(info, 0, sizeof(*info));
	if (drive >= io->n_drives)
		return;
	struct io_drive *d = &io->drive[drive];
	double mean = 0;
	for (uint32_t i = 0; i < d->n_samples; i++)
		mean += d->sample_bytes[i];
	mean = d->n_samples ? mean / d->n_samples : 0;
	info->threads = d->n_threads;
	info->rate_bytes_per_s = (uint64_t)measured_rate(d, k3_store_io_now_ns());
	info->p95_bytes = (uint64_t)mean;
	info->p95_ns = (uint64_t)(p95_per_byte(d) * mean);
	info->queued_bytes = d->q[K3_STORE_IO_DEMAND].bytes + d->q[K3_STORE_IO_SPINE].bytes;
	for (int c = 0; c < K3_STORE_IO_CLASSES; c++) {
		info->running += d->running[c];
		info->queued += d->q[c].len;
	}
	info->emulated_rate = d->rate;
	info->emulated_latency_ns = d->latency_ns;
}

uint64_t k3_store_io_predict(struct k3_store_io *io, unsigned drive, uint64_t bytes)
{
	if (drive >= io->n_drives)
		return UINT64_MAX;
	uint64_t now = k3_store_io_now_ns();
	struct io_drive *d = &io->drive[drive];
	double rate = measured_rate(d, now);

	if (rate <= 0)
		rate = (double)d->rate;
	if (rate <= 0) {
		double sum = 0;
		unsigned n = 0;
		for (unsigned i = 0; i < io->n_drives; i++) {
			double r = measured_rate(&io->drive[i], now);
			if (r > 0) {
				sum += r;
				n++;
			}
		}
		rate = n ? sum / n : RATE_DEFAULT;
	}
	double ahead = (double)(d->q[K3_STORE_IO_DEMAND].bytes + d->q[K3_STORE_IO_SPINE].bytes);
	for (const struct k3_store_io_job *j = d->run_head; j; j = j->next) {
		if (!ahead_class(j->cls))
			continue;
		double left = (double)j->bytes_planned - (double)(now - j->t_start_ns) * rate * 1e-9;
		if (left > 0)
			ahead += left;
	}
	return (uint64_t)((ahead + (double)bytes) * 1e9 / rate) + d->latency_ns;
}

uint64_t k3_store_io_hedge_after(struct k3_store_io *io, const struct k3_store_io_job *job,
				 double factor)
{
	if (job->state != JOB_RUNNING || !job->timed || factor <= 0)
		return 0;
	double p = p95_per_byte(drive_of(io, job));
	if (p <= 0)
		return 0;
	return job->t_start_ns + (uint64_t)(p * (double)job->bytes_planned * factor);
}

void k3_store_io_untime(struct k3_store_io *io, struct k3_store_io_job *job)
{
	(void)io;
	job->untimed = true;
}

int64_t k3_store_io_read_source(void *ctx, const struct k3_store_read *rd, uint8_t *dst)
{
	return k3_store_source_pread(ctx, rd, dst);
}

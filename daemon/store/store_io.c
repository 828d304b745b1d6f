/*
 * store_io.c - the reader pool (see store_io.h): per-class FIFO queues of
 * jobs, reader threads that take the most urgent job their class caps
 * allow, the piece-by-piece read that lets a guess be stopped part-way,
 * and the emulated drive around each request. Everything but the reads
 * (and the drive's one atomic timeline) runs under the one pool lock.
 */
#include "store/store_io.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { JOB_IDLE = 0, JOB_QUEUED, JOB_RUNNING };

struct io_queue {
	struct k3_store_io_job *head, *tail;
	uint32_t len;
};

struct k3_store_io {
	pthread_mutex_t mu;
	pthread_cond_t work_cv;   /* readers wait for jobs (and held pieces for the hold) */
	pthread_cond_t done_cv;   /* clients wait for completions */
	pthread_t threads[K3_STORE_IO_MAX_THREADS];
	unsigned n_threads;
	unsigned cap[K3_STORE_IO_CLASSES];       /* most running jobs per class */
	struct io_queue q[K3_STORE_IO_CLASSES];
	uint32_t running[K3_STORE_IO_CLASSES];
	uint32_t in_flight;
	bool stop;
	bool hold_all, hold_pieces;
	bool held[K3_STORE_IO_CLASSES];
	struct k3_store_io_stats st;
	/* the emulated drive: its config, and the CLOCK_MONOTONIC ns at
	 * which its transfer timeline is free again */
	uint64_t rate, latency_ns;
	_Atomic uint64_t drive_free_ns;
};

static void q_remove(struct k3_store_io *io, struct k3_store_io_job *job)
{
	struct io_queue *q = &io->q[job->cls];

	if (job->prev)
		job->prev->next = job->next;
	else
		q->head = job->next;
	if (job->next)
		job->next->prev = job->prev;
	else
		q->tail = job->prev;
	q->len--;
	job->prev = job->next = NULL;
}

static void q_push(struct k3_store_io *io, struct k3_store_io_job *job)
{
	struct io_queue *q = &io->q[job->cls];

	job->next = NULL;
	job->prev = q->tail;
	if (q->tail)
		q->tail->next = job;
	else
		q->head = job;
	q->tail = job;
	q->len++;
}

/* The job a free reader should start now, or NULL. */
static struct k3_store_io_job *pick(const struct k3_store_io *io)
{
	if (io->hold_all)
		return NULL;
	uint32_t busy = 0;   /* running jobs of the classes SPINE..c */

	for (int c = 0; c < K3_STORE_IO_CLASSES; c++) {
		busy = c == K3_STORE_IO_DEMAND ? io->running[c] : busy + io->running[c];
		if (io->q[c].len && !io->held[c] && busy < io->cap[c])
			return io->q[c].head;
		if (c == K3_STORE_IO_DEMAND)
			busy = 0;
	}
	return NULL;
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

static uint64_t now_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* The emulated drive (store_io.h): a request issued at t_issue that read
 * `bytes` from the device books its transfer on the shared timeline after
 * its latency and sleeps until the booking ends. Returns the ns slept. */
static uint64_t emulate(struct k3_store_io *io, uint64_t t_issue, uint64_t bytes)
{
	uint64_t dur = io->rate ? (uint64_t)((double)bytes * 1e9 / (double)io->rate) : 0;
	uint64_t ready = t_issue + io->latency_ns, start, end;
	uint64_t free_at = atomic_load(&io->drive_free_ns);

	do {
		start = ready > free_at ? ready : free_at;
		end = start + dur;
	} while (!atomic_compare_exchange_weak(&io->drive_free_ns, &free_at, end));
	uint64_t t = now_ns();
	if (t >= end)
		return 0;
	struct timespec ts = { (time_t)(end / 1000000000u), (long)(end % 1000000000u) };
	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
	return end - t;
}

/* Reads every read of job; returns 0 or a negative errno, with the device
 * bytes in *bytes and the emulated drive's sleep in *waited. Between two pieces, under the lock, a job whose stop
 * flag is set ends there: then it returns with the lock held and *stopped
 * set; otherwise without the lock. */
static int read_job(struct k3_store_io *io, struct k3_store_io_job *job, uint64_t *bytes,
		    bool *stopped, uint64_t *waited)
{
	bool first = true, drive = io->rate || io->latency_ns;

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
				while (io->hold_pieces && !io->stop)
					pthread_cond_wait(&io->work_cv, &io->mu);
				if (job->stop) {
					*stopped = true;
					return 0;
				}
				pthread_mutex_unlock(&io->mu);
			}
			first = false;
			uint64_t t_issue = drive ? now_ns() : 0;
			got = job->read(job->read_ctx, &rd, job->dst);
			if (got < 0)
				return (int)got;
			*bytes += (uint64_t)got;
			if (drive)
				*waited += emulate(io, t_issue, (uint64_t)got);
		}
	}
	return 0;
}

static void *reader_main(void *arg)
{
	struct k3_store_io *io = arg;

	pthread_mutex_lock(&io->mu);
	for (;;) {
		struct k3_store_io_job *job;
		enum k3_store_io_class cls;
		uint64_t bytes, waited;
		bool stopped;
		int rc;

		while (!io->stop && !(job = pick(io)))
			pthread_cond_wait(&io->work_cv, &io->mu);
		if (io->stop)
			break;
		cls = job->cls;
		q_remove(io, job);
		job->state = JOB_RUNNING;
		io->running[cls]++;
		io->in_flight++;
		if (job->ops->start)
			job->ops->start(job);
		pthread_mutex_unlock(&io->mu);

		rc = read_job(io, job, &bytes, &stopped, &waited);
		if (rc == 0 && !stopped && job->ops->check)
			rc = job->ops->check(job);

		if (!stopped)
			pthread_mutex_lock(&io->mu);
		io->in_flight--;
		io->running[cls]--;
		/* A capped class (or, through the shared caps, a later one) may
		 * start its next job now. */
		for (int c = cls; c < K3_STORE_IO_CLASSES; c++)
			if (io->cap[c] < io->n_threads && io->q[c].len) {
				pthread_cond_signal(&io->work_cv);
				break;
			}
		io->st.jobs[cls]++;
		io->st.bytes[cls] += bytes;
		io->st.stopped[cls] += stopped;
		io->st.failed[cls] += rc != 0;
		io->st.emulated_wait_ns += waited;
		job->state = JOB_IDLE;
		job->stop = false;
		job->ops->done(job, rc, bytes, stopped);
		pthread_cond_broadcast(&io->done_cv);
	}
	pthread_mutex_unlock(&io->mu);
	return NULL;
}

int k3_store_io_new(const struct k3_store_io_config *cfg, struct k3_store_io **out,
		    struct k3_err *err)
{
	struct k3_store_io *io;

	*out = NULL;
	if (cfg->threads > K3_STORE_IO_MAX_THREADS)
		return k3_err_set(err, -EINVAL, "%u I/O threads; at most %d", cfg->threads,
				  K3_STORE_IO_MAX_THREADS);
	io = calloc(1, sizeof(*io));
	if (!io)
		return k3_err_set(err, -ENOMEM, "out of memory");
	for (int c = 0; c < K3_STORE_IO_CLASSES; c++)
		io->cap[c] = cfg->class_readers[c] && cfg->class_readers[c] < cfg->threads
			     ? cfg->class_readers[c] : cfg->threads;
	io->rate = cfg->rate_bytes_per_s;
	io->latency_ns = cfg->latency_ns;
	atomic_init(&io->drive_free_ns, 0);
	pthread_mutex_init(&io->mu, NULL);
	pthread_cond_init(&io->work_cv, NULL);
	pthread_cond_init(&io->done_cv, NULL);
	for (unsigned t = 0; t < cfg->threads; t++) {
		if (pthread_create(&io->threads[t], NULL, reader_main, io) != 0) {
			k3_store_io_free(io);
			return k3_err_set(err, -EAGAIN, "cannot start I/O thread %u", t);
		}
		io->n_threads = t + 1;
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
	for (unsigned t = 0; t < io->n_threads; t++)
		pthread_join(io->threads[t], NULL);
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

void k3_store_io_submit(struct k3_store_io *io, struct k3_store_io_job *job,
			enum k3_store_io_class cls)
{
	job->cls = cls;
	job->state = JOB_QUEUED;
	job->stop = false;
	q_push(io, job);
	pthread_cond_broadcast(&io->work_cv);
}

bool k3_store_io_cancel(struct k3_store_io *io, struct k3_store_io_job *job)
{
	if (job->state != JOB_QUEUED)
		return false;
	q_remove(io, job);
	job->state = JOB_IDLE;
	return true;
}

void k3_store_io_set_stop(struct k3_store_io *io, struct k3_store_io_job *job, bool stop)
{
	(void)io;
	if (job->state == JOB_RUNNING)
		job->stop = stop;
}

int k3_store_io_queued(const struct k3_store_io_job *job)
{
	return job->state == JOB_QUEUED ? (int)job->cls : -1;
}

struct k3_store_io_job *k3_store_io_first(struct k3_store_io *io, enum k3_store_io_class cls)
{
	return io->q[cls].head;
}

struct k3_store_io_job *k3_store_io_next(const struct k3_store_io_job *job)
{
	return job->next;
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
		for (int c = 0; c < K3_STORE_IO_CLASSES && !io->hold_all; c++)
			startable |= io->q[c].len && !io->held[c];
		if (!startable && !io->in_flight)
			return;
		pthread_cond_wait(&io->done_cv, &io->mu);
	}
}

unsigned k3_store_io_threads(const struct k3_store_io *io)
{
	return io->n_threads;
}

void k3_store_io_stats_get(const struct k3_store_io *io, struct k3_store_io_stats *st)
{
	*st = io->st;
}

int64_t k3_store_io_read_source(void *ctx, const struct k3_store_read *rd, uint8_t *dst)
{
	return k3_store_source_pread(ctx, rd, dst);
}

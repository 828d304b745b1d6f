/*
 * kern_pool.c - the compute thread pool (kern_pool.h).
 *
 * One job at a time: the caller publishes (fn, ctx, n, piece bounds) and bumps a
 * generation counter; workers wake, run their piece, and count down. Short
 * spins on the counter before sleeping on a condition variable keep the
 * per-call latency low for back-to-back matmuls of one token (decode runs
 * hundreds per token) without burning a shared CPU while idle.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/err.h"
#include "kern_pool.h"

/* Fills struct k3_err directly (header only, no err.c): kernels are a
 * leaf library linked after the core and must not call back into it. */

static void set_err(struct k3_err *err, int code, const char *msg, long v)
{
	if (!err)
		return;
	err->code = code;
	snprintf(err->msg, sizeof(err->msg), msg, v);
}

/*
 * Job word: generation (32 bits) | piece count (16) | next unclaimed piece
 * (16). Claiming a piece is a CAS on this one word, so a worker that wakes
 * late (descheduled on a busy host) can neither take a piece of a newer job
 * by mistake nor run one twice; whoever is free, caller included, takes the
 * next piece. Which thread runs a piece never changes its result.
 */
#define JOB_GEN(v)    ((uint32_t)((v) >> 32))
#define JOB_PIECES(v) ((unsigned)(((v) >> 16) & 0xFFFFu))
#define JOB_NEXT(v)   ((unsigned)((v) & 0xFFFFu))

/*
 * Pieces shrink geometrically (a "guided" schedule): piece k holds
 * ceil(remaining / (4 x threads)) blocks, but at least 1/(8 x threads) of
 * the job. The first piece is as long as the former equal pieces (a
 * quarter of a thread's share: a worker descheduled while holding one
 * stalls the call no longer than before) and the last ones are half that:
 * the thread that finishes first waits at most 1/(8 x threads) of the job
 * for the others, half the former join tail, for about 14 piece claims
 * per job at 2 threads instead of 8 (each a CAS on a shared line, ~0.1 us).
 * The bounds depend only on (n, grain, threads); which thread runs a
 * piece never changes a result either way.
 */
enum { MAX_PIECES = 128 };

struct k3_kern_pool {
	int n_threads;
	pthread_t *workers;
	int n_started;
	pthread_mutex_t mu;
	pthread_cond_t wake;
	pthread_cond_t done_cv;
	_Atomic uint64_t job;
	atomic_uint done;          /* pieces finished in the current job */
	atomic_int sleepers;       /* workers blocked on `wake` */
	atomic_bool stop;
	atomic_bool in_job;
	/* the current job, written before `job` is published */
	k3_kern_task_fn fn;
	void *ctx;
	size_t n, grain;
	size_t bound[MAX_PIECES + 1];   /* piece k = blocks [bound[k], bound[k+1]) */
};

struct worker_arg {
	struct k3_kern_pool *pool;
};

enum { SPIN_ITERS = 2000 };

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield");
#endif
}

/* Claims and runs pieces of generation `gen` until none is left. */
static void run_pieces(struct k3_kern_pool *p, uint32_t gen)
{
	uint64_t v = atomic_load_explicit(&p->job, memory_order_acquire);

	for (;;) {
		unsigned piece, np;

		if (JOB_GEN(v) != gen || JOB_NEXT(v) >= JOB_PIECES(v))
			return;
		if (!atomic_compare_exchange_weak_explicit(&p->job, &v, v + 1,
		    memory_order_acq_rel, memory_order_acquire))
			continue;
		piece = JOB_NEXT(v);
		np = JOB_PIECES(v);
		{
			size_t b = p->bound[piece] * p->grain;
			size_t e = p->bound[piece + 1] * p->grain;

			if (e > p->n)
				e = p->n;
			if (b < e)
				p->fn(p->ctx, b, e);
		}
		if (atomic_fetch_add_explicit(&p->done, 1, memory_order_acq_rel) + 1 == np) {
			pthread_mutex_lock(&p->mu);
			pthread_cond_signal(&p->done_cv);
			pthread_mutex_unlock(&p->mu);
		}
		v = atomic_load_explicit(&p->job, memory_order_acquire);
	}
}

static void *worker_main(void *argp)
{
	struct worker_arg *arg = argp;
	struct k3_kern_pool *p = arg->pool;
	uint32_t seen = 0;

	free(arg);
	for (;;) {
		uint32_t g;
		int spins = 0;

		while ((g = JOB_GEN(atomic_load_explicit(&p->job, memory_order_acquire))) == seen &&
		       !atomic_load(&p->stop) && spins < SPIN_ITERS) {
			cpu_relax();
			spins++;
		}
		if (g == seen && !atomic_load(&p->stop)) {
			pthread_mutex_lock(&p->mu);
			atomic_fetch_add(&p->sleepers, 1);
			while ((g = JOB_GEN(atomic_load(&p->job))) == seen && !atomic_load(&p->stop))
				pthread_cond_wait(&p->wake, &p->mu);
			atomic_fetch_sub(&p->sleepers, 1);
			pthread_mutex_unlock(&p->mu);
		}
		if (atomic_load(&p->stop))
			return NULL;
		seen = g;
		run_pieces(p, g);
	}
}

int k3_kern_pool_default_threads(void)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);

	if (n < 1)
		return 1;
	return n > K3_KERN_POOL_MAX_THREADS ? K3_KERN_POOL_MAX_THREADS : (int)n;
}

struct k3_kern_pool *k3_kern_pool_new(int n_threads, struct k3_err *err)
{
	struct k3_kern_pool *p;

	if (n_threads <= 0)
		n_threads = k3_kern_pool_default_threads();
	if (n_threads > K3_KERN_POOL_MAX_THREADS) {
		set_err(err, -EINVAL, "thread count '%ld' is above the limit 256",
			(long)n_threads);
		return NULL;
	}
	p = calloc(1, sizeof(*p));
	if (!p) {
		set_err(err, -ENOMEM, "out of memory for a pool of %ld threads",
			(long)n_threads);
		return NULL;
	}
	p->n_threads = n_threads;
	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->wake, NULL);
	pthread_cond_init(&p->done_cv, NULL);
	if (n_threads > 1) {
		p->workers = calloc((size_t)n_threads - 1, sizeof(*p->workers));
		if (!p->workers) {
			set_err(err, -ENOMEM, "out of memory for a pool of %ld threads",
				(long)n_threads);
			k3_kern_pool_free(p);
			return NULL;
		}
	}
	for (int i = 1; i < n_threads; i++) {
		struct worker_arg *a = malloc(sizeof(*a));
		int rc;

		if (!a) {
			set_err(err, -ENOMEM, "out of memory starting worker %ld", (long)i);
			k3_kern_pool_free(p);
			return NULL;
		}
		a->pool = p;
		rc = pthread_create(&p->workers[i - 1], NULL, worker_main, a);
		if (rc != 0) {
			free(a);
			set_err(err, -rc, "cannot start compute worker %ld", (long)i);
			k3_kern_pool_free(p);
			return NULL;
		}
		p->n_started++;
	}
	return p;
}

void k3_kern_pool_free(struct k3_kern_pool *p)
{
	if (!p)
		return;
	pthread_mutex_lock(&p->mu);
	atomic_store(&p->stop, true);
	pthread_cond_broadcast(&p->wake);
	pthread_mutex_unlock(&p->mu);
	for (int i = 0; i < p->n_started; i++)
		pthread_join(p->workers[i], NULL);
	pthread_cond_destroy(&p->wake);
	pthread_cond_destroy(&p->done_cv);
	pthread_mutex_destroy(&p->mu);
	free(p->workers);
	free(p);
}

int k3_kern_pool_threads(const struct k3_kern_pool *p)
{
	return p ? p->n_threads : 1;
}

void k3_kern_pool_for(struct k3_kern_pool *p, size_t n, size_t grain,
	k3_kern_task_fn fn, void *ctx)
{
	size_t blocks, pieces;
	uint64_t v;
	uint32_t gen;

	if (n == 0)
		return;
	if (grain == 0)
		grain = 1;
	blocks = (n + grain - 1) / grain;
	/* A nested call from inside a task (or a 1-thread pool) runs inline. */
	if (!p || p->n_threads == 1 || blocks == 1 ||
	    atomic_exchange(&p->in_job, true)) {
		fn(ctx, 0, n);
		return;
	}
	{
		size_t div = 4 * (size_t)p->n_threads, b = 0;
		size_t floor_sz = (blocks + 8 * (size_t)p->n_threads - 1) /
			(8 * (size_t)p->n_threads);

		pieces = 0;
		while (b < blocks) {
			size_t sz = (blocks - b + div - 1) / div;

			if (sz < floor_sz)
				sz = floor_sz;
			if (sz > blocks - b)
				sz = blocks - b;

			if (pieces == MAX_PIECES - 1)
				sz = blocks - b;     /* the last slot takes the rest */
			p->bound[pieces++] = b;
			b += sz;
		}
		p->bound[pieces] = blocks;
	}
	p->fn = fn;
	p->ctx = ctx;
	p->n = n;
	p->grain = grain;
	atomic_store_explicit(&p->done, 0, memory_order_relaxed);
	v = atomic_load_explicit(&p->job, memory_order_relaxed);
	gen = JOB_GEN(v) + 1;
	if (gen == 0)           /* 0 is the workers' initial "seen" */
		gen = 1;
	/* seq_cst: pairs with the sleeper count (store job, load sleepers here;
	 * add sleepers, load job in the worker), so a worker going to sleep
	 * either sees this job or is counted and woken */
	atomic_store(&p->job, ((uint64_t)gen << 32) | ((uint64_t)pieces << 16));
	if (atomic_load(&p->sleepers) > 0) {
		pthread_mutex_lock(&p->mu);
		pthread_cond_broadcast(&p->wake);
		pthread_mutex_unlock(&p->mu);
	}

	run_pieces(p, gen);

	for (int spins = 0; atomic_load_explicit(&p->done, memory_order_acquire) < pieces &&
	     spins < SPIN_ITERS; spins++)
		cpu_relax();
	if (atomic_load_explicit(&p->done, memory_order_acquire) < pieces) {
		pthread_mutex_lock(&p->mu);
		while (atomic_load(&p->done) < pieces)
			pthread_cond_wait(&p->done_cv, &p->mu);
		pthread_mutex_unlock(&p->mu);
	}
	atomic_store(&p->in_job, false);
}

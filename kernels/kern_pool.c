/*
 * kern_pool.c - the compute thread pool (kern_pool.h).
 *
 * One job at a time: the caller publishes (fn, ctx, n, chunk) and bumps a
 * generation counter; workers wake, run their piece, and count down. Short
 * spins on the counter before sleeping on a condition variable keep the
 * per-call latency low for back-to-back matmuls of one token (decode runs
 * hundreds per token) without burning a shared CPU while idle.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
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

struct k3_kern_pool {
	int n_threads;
	pthread_t *workers;
	int n_started;
	pthread_mutex_t mu;
	pthread_cond_t wake;
	pthread_cond_t done;
	atomic_uint gen;
	atomic_int pending;       /* workers still running the current job */
	atomic_bool stop;
	atomic_bool in_job;
	/* the current job, written before gen is bumped */
	k3_kern_task_fn fn;
	void *ctx;
	size_t n, chunk;
};

struct worker_arg {
	struct k3_kern_pool *pool;
	int index;
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

static void run_piece(struct k3_kern_pool *p, int index)
{
	size_t b = (size_t)index * p->chunk;
	size_t e = b + p->chunk;

	if (b >= p->n)
		return;
	if (e > p->n)
		e = p->n;
	p->fn(p->ctx, b, e);
}

static void *worker_main(void *argp)
{
	struct worker_arg *arg = argp;
	struct k3_kern_pool *p = arg->pool;
	int index = arg->index;
	unsigned seen = 0;

	free(arg);
	for (;;) {
		unsigned g;
		int spins = 0;

		while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen &&
		       !atomic_load(&p->stop) && spins < SPIN_ITERS) {
			cpu_relax();
			spins++;
		}
		if (g == seen && !atomic_load(&p->stop)) {
			pthread_mutex_lock(&p->mu);
			while ((g = atomic_load(&p->gen)) == seen && !atomic_load(&p->stop))
				pthread_cond_wait(&p->wake, &p->mu);
			pthread_mutex_unlock(&p->mu);
		}
		if (atomic_load(&p->stop))
			return NULL;
		seen = g;
		run_piece(p, index);
		if (atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel) == 1) {
			pthread_mutex_lock(&p->mu);
			pthread_cond_signal(&p->done);
			pthread_mutex_unlock(&p->mu);
		}
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
	pthread_cond_init(&p->done, NULL);
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
		a->index = i;
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
	pthread_cond_destroy(&p->done);
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
	size_t blocks, pieces, per;

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
	pieces = blocks < (size_t)p->n_threads ? blocks : (size_t)p->n_threads;
	per = (blocks + pieces - 1) / pieces;
	p->fn = fn;
	p->ctx = ctx;
	p->n = n;
	p->chunk = per * grain;
	atomic_store(&p->pending, p->n_threads - 1);
	pthread_mutex_lock(&p->mu);
	atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
	pthread_cond_broadcast(&p->wake);
	pthread_mutex_unlock(&p->mu);

	run_piece(p, 0);

	for (int spins = 0; atomic_load_explicit(&p->pending, memory_order_acquire) > 0 &&
	     spins < SPIN_ITERS; spins++)
		cpu_relax();
	if (atomic_load_explicit(&p->pending, memory_order_acquire) > 0) {
		pthread_mutex_lock(&p->mu);
		while (atomic_load(&p->pending) > 0)
			pthread_cond_wait(&p->done, &p->mu);
		pthread_mutex_unlock(&p->mu);
	}
	atomic_store(&p->in_job, false);
}

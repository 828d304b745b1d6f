/*
 * kern_pool.h - the compute thread pool: a fixed set of workers that run
 * one parallel-for at a time over an index range (rows, heads, experts).
 *
 * The range [0, n) is cut into up to 4 x n_threads contiguous pieces,
 * which the caller and the workers claim as they become free (a worker
 * descheduled by a busy host does not hold the call up). Callers make each
 * item's result independent of which thread runs it and of the split (no
 * kernel splits one output element's reduction), so results are
 * bit-identical for any thread count: the batch-invariance contract relies
 * on it.
 *
 * One pool serves one caller thread at a time (the engine thread); a pool
 * is not re-entrant: calling k3_kern_pool_for from inside a task runs that
 * inner loop serially on the calling worker.
 */
#ifndef K3_KERN_POOL_H
#define K3_KERN_POOL_H

#include <stddef.h>

struct k3_err;
struct k3_kern_pool;

/* Upper bound on workers (bounded before allocation). */
enum { K3_KERN_POOL_MAX_THREADS = 256 };

/* Task body: process items [begin, end). `ctx` is the caller's. */
typedef void (*k3_kern_task_fn)(void *ctx, size_t begin, size_t end);

/* Starts n_threads - 1 workers (the caller is the n-th). n_threads <= 0
 * means "one per online CPU". Returns NULL on failure with err filled
 * (-EINVAL for n_threads > K3_KERN_POOL_MAX_THREADS, -ENOMEM, or the
 * pthread_create error). Free with k3_kern_pool_free. */
struct k3_kern_pool *k3_kern_pool_new(int n_threads, struct k3_err *err);

/* Joins the workers and frees the pool. Accepts NULL. */
void k3_kern_pool_free(struct k3_kern_pool *pool);

/* Number of threads that run a parallel-for (workers + caller); 1 for a
 * NULL pool. */
int k3_kern_pool_threads(const struct k3_kern_pool *pool);

/* Runs fn over [0, n) split into contiguous pieces of whole `grain`-item
 * blocks (grain 0 = 1; the last piece may be shorter) and returns when all
 * are done; fn may run on any of the pool's threads or the caller's. pool
 * NULL, a 1-thread pool or a single block runs fn(ctx, 0, n) on the calling
 * thread. Does not allocate. */
void k3_kern_pool_for(struct k3_kern_pool *pool, size_t n, size_t grain,
	k3_kern_task_fn fn, void *ctx);

/* Online CPU count (>= 1): the default for --threads. */
int k3_kern_pool_default_threads(void);

#endif

/*
 * test_kern_pool.c - the compute pool runs every index of a parallel-for
 * exactly once, for any n, grain and thread count, under many back-to-back
 * jobs (late workers must not run a piece of a newer job or run one twice),
 * and runs nested calls inline. Also with more threads than the guided
 * schedule has piece slots for.
 */
#include <errno.h>
#include <stdatomic.h>

#include "base/err.h"

#include "k3_kernels.h"
#include "t.h"

enum { NMAX = 5000 };

struct cover {
	atomic_int hits[NMAX];
	atomic_int bad_range;
	size_t n;
};

static void cover_task(void *ctx, size_t b, size_t e)
{
	struct cover *c = ctx;

	if (b >= e || e > c->n)
		atomic_fetch_add(&c->bad_range, 1);
	for (size_t i = b; i < e && i < NMAX; i++)
		atomic_fetch_add(&c->hits[i], 1);
}

static struct k3_kern_pool *nested_pool;
static atomic_int nested_calls;

static void inner_task(void *ctx, size_t b, size_t e)
{
	(void)ctx;
	atomic_fetch_add(&nested_calls, (int)(e - b));
}

static void outer_task(void *ctx, size_t b, size_t e)
{
	(void)ctx;
	for (size_t i = b; i < e; i++)
		k3_kern_pool_for(nested_pool, 10, 1, inner_task, NULL);
}

int main(void)
{
	static const size_t ns[] = { 1, 2, 3, 15, 16, 17, 100, 1000, 4999 };
	static const size_t grains[] = { 0, 1, 3, 16, 64 };
	static struct cover c;
	struct k3_err err = { 0 };

	T_OK(k3_kern_pool_new(K3_KERN_POOL_MAX_THREADS + 1, &err) == NULL);
	T_EQ_INT(err.code, -EINVAL);
	T_OK(k3_kern_pool_default_threads() >= 1);
	for (int th = 1; th <= 4; th++) {
		struct k3_kern_pool *p = k3_kern_pool_new(th, NULL);
		int wrong = 0;

		T_OK(p != NULL);
		if (!p)
			break;
		for (int rep = 0; rep < 200; rep++) {
			for (size_t a = 0; a < sizeof(ns) / sizeof(ns[0]); a++) {
				size_t n = ns[a], g = grains[(size_t)rep % 5];

				c.n = n;
				for (size_t i = 0; i < n; i++)
					atomic_store(&c.hits[i], 0);
				k3_kern_pool_for(p, n, g, cover_task, &c);
				for (size_t i = 0; i < n; i++)
					wrong += atomic_load(&c.hits[i]) != 1;
			}
		}
		T_EQ_INT(wrong, 0);
		T_EQ_INT(atomic_load(&c.bad_range), 0);
		nested_pool = p;
		atomic_store(&nested_calls, 0);
		k3_kern_pool_for(p, 8, 1, outer_task, NULL);
		T_EQ_INT(atomic_load(&nested_calls), 80);
		k3_kern_pool_free(p);
	}
	/* Many threads: the guided schedule would want more than its 128
	 * piece slots (4999 blocks, 48 threads: 1/384-of-the-job floor), so
	 * the last slot must take the rest. A few jobs only: 47 workers spin
	 * on the 2 cores of a build box. */
	{
		struct k3_kern_pool *p = k3_kern_pool_new(48, NULL);
		int wrong = 0;

		T_OK(p != NULL);
		for (int rep = 0; p && rep < 3; rep++) {
			c.n = 4999;
			for (size_t i = 0; i < c.n; i++)
				atomic_store(&c.hits[i], 0);
			k3_kern_pool_for(p, c.n, rep == 2 ? 3 : 1, cover_task, &c);
			for (size_t i = 0; i < c.n; i++)
				wrong += atomic_load(&c.hits[i]) != 1;
		}
		T_EQ_INT(wrong, 0);
		T_EQ_INT(atomic_load(&c.bad_range), 0);
		k3_kern_pool_free(p);
	}
	k3_kern_pool_for(NULL, 7, 2, cover_task, &c);   /* NULL pool: inline */
	T_EQ_INT(atomic_load(&c.bad_range), 0);
	return t_done();
}

/*
 * kern_dispatch.c - picks the ISA once per process (cpuid + K3_KERNELS) and
 * implements the public k3_kern_* entry points that route to its table.
 *
 * Why once: batch invariance and bit-reproducibility hold within one ISA;
 * switching tables mid-process would change rounding between calls.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "kern_i8.h"
#include "kern_ops.h"

static const char *const isa_names[K3_KERN_ISA_COUNT] = {
	[K3_KERN_ISA_REF] = "ref",
	[K3_KERN_ISA_AVX2] = "avx2",
	[K3_KERN_ISA_AVX512] = "avx512",
	[K3_KERN_ISA_NEON] = "neon",
};

const char *k3_kern_isa_name(enum k3_kern_isa isa)
{
	if ((unsigned)isa >= K3_KERN_ISA_COUNT)
		return "?";
	return isa_names[isa];
}

static bool cpu_has(enum k3_kern_isa isa)
{
	switch (isa) {
	case K3_KERN_ISA_REF:
		return true;
#if defined(__x86_64__) || defined(__i386__)
	case K3_KERN_ISA_AVX2:
		__builtin_cpu_init();
		return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
	case K3_KERN_ISA_AVX512:
		__builtin_cpu_init();
		return __builtin_cpu_supports("avx512f") &&
			__builtin_cpu_supports("avx512bw") &&
			__builtin_cpu_supports("avx512vl") &&
			__builtin_cpu_supports("avx512dq") &&
			__builtin_cpu_supports("fma");
#endif
#if defined(__aarch64__)
	case K3_KERN_ISA_NEON:
		return true;   /* Advanced SIMD is mandatory on aarch64 */
#endif
	default:
		return false;
	}
}

const struct k3_kern_ops *k3_kern_ops_for(enum k3_kern_isa isa)
{
	const struct k3_kern_ops *ops = NULL;

	switch (isa) {
	case K3_KERN_ISA_REF:
		ops = &k3_kern_ops_ref;
		break;
#if defined(K3_KERN_HAVE_AVX2)
	case K3_KERN_ISA_AVX2:
		ops = &k3_kern_ops_avx2;
		break;
#endif
#if defined(K3_KERN_HAVE_AVX512)
	case K3_KERN_ISA_AVX512:
		ops = &k3_kern_ops_avx512;
		break;
#endif
#if defined(K3_KERN_HAVE_NEON)
	case K3_KERN_ISA_NEON:
		ops = &k3_kern_ops_neon;
		break;
#endif
	default:
		break;
	}
	return ops && cpu_has(isa) ? ops : NULL;
}

bool k3_kern_isa_available(enum k3_kern_isa isa)
{
	return k3_kern_ops_for(isa) != NULL;
}

static const struct k3_kern_ops *active_ops;
static pthread_once_t active_once = PTHREAD_ONCE_INIT;

static void choose_isa(void)
{
	static const enum k3_kern_isa best_first[] = {
		K3_KERN_ISA_AVX512, K3_KERN_ISA_AVX2, K3_KERN_ISA_NEON,
		K3_KERN_ISA_REF,
	};
	const char *want = getenv("K3_KERNELS");
	size_t start = 0;

	if (want && *want && strcmp(want, "auto") != 0) {
		/* A named ISA is the ceiling: fall back down from it, never up. */
		start = sizeof(best_first) / sizeof(best_first[0]) - 1;
		for (size_t i = 0; i < sizeof(best_first) / sizeof(best_first[0]); i++)
			if (strcmp(want, isa_names[best_first[i]]) == 0)
				start = i;
	}
	for (size_t i = start; i < sizeof(best_first) / sizeof(best_first[0]); i++) {
		const struct k3_kern_ops *ops = k3_kern_ops_for(best_first[i]);

		if (ops) {
			active_ops = ops;
			return;
		}
	}
	active_ops = &k3_kern_ops_ref;
}

const struct k3_kern_ops *k3_kern_ops_active(void)
{
	pthread_once(&active_once, choose_isa);
	return active_ops;
}

const struct k3_kern_elem_ops *k3_kern_elem_for(enum k3_kern_isa isa)
{
	if (!k3_kern_ops_for(isa))
		return NULL;
#if defined(K3_KERN_HAVE_AVX2)
	/* every CPU with AVX-512F has AVX2 + FMA */
	if (isa == K3_KERN_ISA_AVX2 || isa == K3_KERN_ISA_AVX512)
		return &k3_kern_elem_avx2;
#endif
	return &k3_kern_elem_ref;
}

static const struct k3_kern_elem_ops *active_elem;
static pthread_once_t elem_once = PTHREAD_ONCE_INIT;

static void choose_elem(void)
{
	active_elem = k3_kern_elem_for(k3_kern_ops_active()->isa);
	if (!active_elem)
		active_elem = &k3_kern_elem_ref;
}

const struct k3_kern_elem_ops *k3_kern_elem_active(void)
{
	pthread_once(&elem_once, choose_elem);
	return active_elem;
}

enum k3_kern_isa k3_kern_active_isa(void)
{
	return k3_kern_ops_active()->isa;
}

const struct k3_kern_i8_ops *k3_kern_i8_for(enum k3_kern_isa isa)
{
	if (!k3_kern_ops_for(isa))
		return NULL;
	switch (isa) {
#if defined(K3_KERN_HAVE_AVX2)
	case K3_KERN_ISA_AVX2:
		return &k3_kern_i8_avx2;
#endif
#if defined(K3_KERN_HAVE_AVX512)
	case K3_KERN_ISA_AVX512:
		return &k3_kern_i8_avx512;
#endif
#if defined(K3_KERN_HAVE_NEON)
	case K3_KERN_ISA_NEON:
		return &k3_kern_i8_neon;
#endif
	default:
		return &k3_kern_i8_ref;
	}
}

const struct k3_kern_i8_ops *k3_kern_i8_active(void)
{
	/* follows the one ISA choice of the process (never mixes orders) */
	return k3_kern_i8_for(k3_kern_active_isa());
}

/* The row function for w: the ISA's int8 table for I8, its main table
 * otherwise. */
static k3_kern_rows_fn rows_fn(const struct k3_kern_ops *ops, const struct k3_kern_mat *w)
{
	return w->dtype == K3_KERN_DT_I8 ? k3_kern_i8_for(ops->isa)->matmul_rows : ops->matmul_rows;
}

/* ------------------------------------------------------------------ */

struct matmul_job {
	const struct k3_kern_ops *ops;
	const struct k3_kern_mat *w;
	size_t row_begin, T, ldx, ldy;
	const float *x;
	float *y;
};

static void matmul_task(void *ctx, size_t begin, size_t end)
{
	const struct matmul_job *j = ctx;

	rows_fn(j->ops, j->w)(j->w, j->row_begin + begin, j->row_begin + end,
		j->T, j->x, j->ldx, j->y + begin, j->ldy);
}

static bool mat_ok(const struct k3_kern_mat *w)
{
	if (!w || !w->data || w->cols == 0)
		return false;
	if (w->dtype == K3_KERN_DT_MXFP4)
		return w->scales && w->ld == 0 && w->cols % 32 == 0;
	if (w->dtype == K3_KERN_DT_F32 || w->dtype == K3_KERN_DT_BF16)
		return w->ld == 0 || w->ld >= w->cols;
	if (w->dtype == K3_KERN_DT_I8)
		return w->row_scales && (w->ld == 0 || w->ld >= w->cols);
	return false;
}

/* Row blocks of 16 keep each thread's share contiguous and large enough
 * that the hardware prefetcher sees long streams. */
enum { MATMUL_GRAIN = 16 };

int k3_kern_matmul(struct k3_kern_pool *pool, const struct k3_kern_mat *w,
	size_t row_begin, size_t row_end, size_t T,
	const float *x, size_t ldx, float *y, size_t ldy)
{
	struct matmul_job j;

	if (!mat_ok(w) || row_begin > row_end || row_end > w->rows || !x || !y)
		return -EINVAL;
	if (T > 1 && (ldx < w->cols || ldy < row_end - row_begin))
		return -EINVAL;
	if (row_begin == row_end || T == 0)
		return 0;
	j = (struct matmul_job){ .ops = k3_kern_ops_active(), .w = w,
		.row_begin = row_begin, .T = T, .ldx = ldx, .ldy = ldy,
		.x = x, .y = y };
	k3_kern_pool_for(pool, row_end - row_begin, MATMUL_GRAIN, matmul_task, &j);
	return 0;
}

struct many_job {
	const struct k3_kern_ops *ops;
	const struct k3_kern_matmul_job *jobs;
	size_t n_jobs;
	size_t start[K3_KERN_MATMUL_MANY_MAX + 1];   /* prefix sums of rows */
};

static void many_task(void *ctx, size_t begin, size_t end)
{
	const struct many_job *m = ctx;
	size_t j = 0;

	while (j + 1 < m->n_jobs && m->start[j + 1] <= begin)
		j++;
	for (; j < m->n_jobs && m->start[j] < end; j++) {
		const struct k3_kern_matmul_job *jb = &m->jobs[j];
		size_t b = begin > m->start[j] ? begin - m->start[j] : 0;
		size_t e = (end < m->start[j + 1] ? end : m->start[j + 1]) - m->start[j];

		if (b < e)
			rows_fn(m->ops, jb->w)(jb->w, jb->row_begin + b, jb->row_begin + e,
				jb->T, jb->x, jb->ldx, jb->y + b, jb->ldy);
	}
}

int k3_kern_matmul_many(struct k3_kern_pool *pool, size_t n_jobs,
	const struct k3_kern_matmul_job *jobs)
{
	struct many_job m;

	if (n_jobs > K3_KERN_MATMUL_MANY_MAX || (n_jobs && !jobs))
		return -EINVAL;
	m.ops = k3_kern_ops_active();
	m.jobs = jobs;
	m.n_jobs = n_jobs;
	m.start[0] = 0;
	for (size_t j = 0; j < n_jobs; j++) {
		const struct k3_kern_matmul_job *jb = &jobs[j];
		size_t rows;

		if (!mat_ok(jb->w) || jb->row_begin > jb->row_end ||
		    jb->row_end > jb->w->rows || !jb->x || !jb->y)
			return -EINVAL;
		if (jb->T > 1 && (jb->ldx < jb->w->cols ||
		    jb->ldy < jb->row_end - jb->row_begin))
			return -EINVAL;
		rows = jb->T ? jb->row_end - jb->row_begin : 0;
		m.start[j + 1] = m.start[j] + rows;
	}
	if (m.start[n_jobs] == 0)
		return 0;
	k3_kern_pool_for(pool, m.start[n_jobs], MATMUL_GRAIN, many_task, &m);
	return 0;
}

struct matmul_t_job {
	void (*t_cols)(const struct k3_kern_mat *w, size_t c0, size_t c1,
		size_t T, const float *x, size_t ldx, float *y, size_t ldy);
	const struct k3_kern_mat *w;
	size_t T, ldx, ldy;
	const float *x;
	float *y;
};

static void matmul_t_task(void *ctx, size_t begin, size_t end)
{
	const struct matmul_t_job *j = ctx;

	j->t_cols(j->w, begin, end, j->T, j->x, j->ldx, j->y, j->ldy);
}

int k3_kern_matmul_t(struct k3_kern_pool *pool, const struct k3_kern_mat *w,
	size_t T, const float *x, size_t ldx, float *y, size_t ldy)
{
	struct matmul_t_job j;

	if (!mat_ok(w) || w->dtype == K3_KERN_DT_MXFP4 || w->dtype == K3_KERN_DT_I8 || !x || !y)
		return -EINVAL;
	if (T > 1 && (ldx < w->rows || ldy < w->cols))
		return -EINVAL;
	if (T == 0)
		return 0;
	j = (struct matmul_t_job){ .t_cols = k3_kern_elem_active()->matmul_t_cols,
		.w = w, .T = T, .ldx = ldx, .ldy = ldy, .x = x, .y = y };
	if (!j.t_cols)
		j.t_cols = k3_kern_ops_active()->matmul_t_cols;
	k3_kern_pool_for(pool, w->cols, 64, matmul_t_task, &j);
	return 0;
}

float k3_kern_dot(size_t n, const float *a, const float *b)
{
	return k3_kern_ops_active()->dot(n, a, b);
}

float k3_kern_sumsq(size_t n, const float *x)
{
	return k3_kern_ops_active()->sumsq(n, x);
}

void k3_kern_axpy(size_t n, float a, const float *x, float *y)
{
	k3_kern_ops_active()->axpy(n, a, x, y);
}

void k3_kern_kda_step(size_t dk, size_t dv, float *S, const float *q,
	const float *k, const float *v, const float *alpha, float beta,
	float *o, float *scratch)
{
	k3_kern_ops_active()->kda_step(dk, dv, S, q, k, v, alpha, beta, o, scratch);
}

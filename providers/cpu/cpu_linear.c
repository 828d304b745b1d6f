/*
 * cpu_linear.c - matrix products of the cpu provider (see cpu_linear.h).
 */
#include "cpu/cpu_linear.h"
#include "cpu/cpu_ops.h"

#include <errno.h>

#include "base/err.h"

int k3_cpu_ctx_init(struct k3_cpu_ctx *ctx, uint32_t threads, int reference)
{
	ctx->reference = reference;
	ctx->threads = 1;
	ctx->pool = NULL;
	return k3_cpu_ctx_set_threads(ctx, threads ? threads
				      : (uint32_t)k3_kern_pool_default_threads());
}

int k3_cpu_ctx_set_threads(struct k3_cpu_ctx *ctx, uint32_t threads)
{
	struct k3_err err = { 0 };
	if (threads < 1 || threads > K3_KERN_POOL_MAX_THREADS)
		return -EINVAL;
	k3_kern_pool_free(ctx->pool);
	ctx->pool = NULL;
	ctx->threads = threads;
	/* The reference path is single-threaded by design. */
	if (threads > 1 && !ctx->reference) {
		ctx->pool = k3_kern_pool_new((int)threads, &err);
		if (!ctx->pool) {
			ctx->threads = 1;
			return err.code ? err.code : -ENOMEM;
		}
	}
	return 0;
}

void k3_cpu_ctx_release(struct k3_cpu_ctx *ctx)
{
	k3_kern_pool_free(ctx->pool);
	ctx->pool = NULL;
}

void k3_cpu_linear(struct k3_cpu_ctx *ctx, const struct k3_cpu_mat *W,
		   const float *x, size_t ldx, uint32_t T, float *y, size_t ldy)
{
	if (ctx->reference) {
		for (uint32_t t = 0; t < T; t++)
			k3_cpu_ref_linear(W->data, W->dtype, W->rows, W->cols,
					  x + t * ldx, y + t * ldy);
		return;
	}
	struct k3_kern_mat km = {
		.dtype = W->dtype == 2 ? K3_KERN_DT_BF16 : K3_KERN_DT_F32,
		.rows = W->rows, .cols = W->cols, .ld = 0, .data = W->data,
	};
	size_t bytes = (size_t)W->rows * W->cols * (W->dtype == 2 ? 2 : 4);
	struct k3_kern_pool *pool = ctx->split_all || bytes >= K3_CPU_PARALLEL_MIN_BYTES
		? ctx->pool : NULL;
	/* shapes were validated at open; a failure here is a provider bug */
	int rc = k3_kern_matmul(pool, &km, 0, W->rows, T, x, ldx, y, ldy);
	(void)rc;
}

void k3_cpu_mxfp4_linear(struct k3_cpu_ctx *ctx, const uint8_t *packed,
			 const uint8_t *scale, uint32_t rows, uint32_t cols,
			 const float *x, size_t ldx, uint32_t T, float *y, size_t ldy)
{
	if (ctx->reference) {
		for (uint32_t t = 0; t < T; t++)
			k3_cpu_ref_mxfp4_linear(packed, scale, rows, cols,
						x + t * ldx, y + t * ldy);
		return;
	}
	struct k3_kern_mat km = {
		.dtype = K3_KERN_DT_MXFP4, .rows = rows, .cols = cols, .ld = 0,
		.data = packed, .scales = scale,
	};
	size_t bytes = (size_t)rows * cols / 2;
	struct k3_kern_pool *pool = ctx->split_all || bytes >= K3_CPU_PARALLEL_MIN_BYTES
		? ctx->pool : NULL;
	int rc = k3_kern_matmul(pool, &km, 0, rows, T, x, ldx, y, ldy);
	(void)rc;
}

struct multi {
	const struct k3_cpu_job *jobs;
	uint32_t n;
	size_t start[65];            /* first global row of each job; start[n] = total */
};

static void job_rows(const struct k3_cpu_job *j, size_t r0, size_t r1)
{
	struct k3_kern_mat km;
	if (j->W) {
		km = (struct k3_kern_mat){
			.dtype = j->W->dtype == 2 ? K3_KERN_DT_BF16 : K3_KERN_DT_F32,
			.rows = j->W->rows, .cols = j->W->cols, .data = j->W->data,
		};
	} else {
		km = (struct k3_kern_mat){ .dtype = K3_KERN_DT_MXFP4, .rows = j->rows,
			.cols = j->cols, .data = j->packed, .scales = j->scale };
	}
	int rc = k3_kern_matmul(NULL, &km, r0, r1, j->T, j->x, j->ldx, j->y + r0, j->ldy);
	(void)rc;
}

static void multi_task(void *arg, size_t begin, size_t end)
{
	const struct multi *m = arg;
	for (uint32_t i = 0; i < m->n && begin < end; i++) {
		size_t s = m->start[i], e = m->start[i + 1];
		if (end <= s || begin >= e)
			continue;
		size_t b = begin > s ? begin : s, f = end < e ? end : e;
		job_rows(&m->jobs[i], b - s, f - s);
	}
}

void k3_cpu_linear_multi(struct k3_cpu_ctx *ctx, const struct k3_cpu_job *jobs, uint32_t n)
{
	while (!ctx->reference && n > 64) {
		k3_cpu_linear_multi(ctx, jobs, 64);
		jobs += 64;
		n -= 64;
	}
	if (ctx->reference) {
		for (uint32_t i = 0; i < n; i++) {
			const struct k3_cpu_job *j = &jobs[i];
			if (j->W)
				k3_cpu_linear(ctx, j->W, j->x, j->ldx, j->T, j->y, j->ldy);
			else
				k3_cpu_mxfp4_linear(ctx, j->packed, j->scale, j->rows, j->cols,
						    j->x, j->ldx, j->T, j->y, j->ldy);
		}
		return;
	}
	struct multi m = { .jobs = jobs, .n = n };
	size_t total = 0, bytes = 0;
	for (uint32_t i = 0; i < n; i++) {
		const struct k3_cpu_job *j = &jobs[i];
		m.start[i] = total;
		total += j->W ? j->W->rows : j->rows;
		bytes += j->W ? (size_t)j->W->rows * j->W->cols * (j->W->dtype == 2 ? 2 : 4)
			      : (size_t)j->rows * j->cols / 2;
	}
	m.start[n] = total;
	k3_kern_pool_for(ctx->split_all || bytes >= K3_CPU_PARALLEL_MIN_BYTES ? ctx->pool : NULL,
			 total, 16, multi_task, &m);
}

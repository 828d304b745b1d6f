/*
 * cpu_linear.c - matrix products of the cpu provider (see cpu_linear.h).
 */
#include "cpu/cpu_linear.h"
#include "cpu/cpu_ops.h"

#include <errno.h>

#include "k3_provider.h"

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

const float *k3_cpu_mat_row_scales(const struct k3_cpu_mat *W)
{
	if (W->dtype != K3_PROV_DTYPE_I8)
		return NULL;
	return (const float *)(const void *)((const char *)W->data +
					     K3_PROV_I8_SCALE_OFFSET(W->rows, W->cols));
}

/* The kernels' view of a bf16 / f32 / I8 matrix and its weight bytes. */
static struct k3_kern_mat kern_mat(const struct k3_cpu_mat *W, size_t *bytes)
{
	struct k3_kern_mat km = {
		.dtype = W->dtype == K3_PROV_DTYPE_BF16 ? K3_KERN_DT_BF16 :
			 W->dtype == K3_PROV_DTYPE_I8 ? K3_KERN_DT_I8 : K3_KERN_DT_F32,
		.rows = W->rows, .cols = W->cols, .ld = 0, .data = W->data,
		.row_scales = k3_cpu_mat_row_scales(W),
	};
	*bytes = (size_t)W->rows * W->cols * (W->dtype == K3_PROV_DTYPE_BF16 ? 2 :
					      W->dtype == K3_PROV_DTYPE_I8 ? 1 : 4);
	return km;
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
	size_t bytes;
	struct k3_kern_mat km = kern_mat(W, &bytes);
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

static struct k3_kern_mat job_mat(const struct k3_cpu_job *j, size_t *bytes)
{
	if (j->W)
		return kern_mat(j->W, bytes);
	*bytes = (size_t)j->rows * j->cols / 2;
	return (struct k3_kern_mat){ .dtype = K3_KERN_DT_MXFP4, .rows = j->rows,
		.cols = j->cols, .data = j->packed, .scales = j->scale };
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
	struct k3_kern_mat mats[64];
	struct k3_kern_matmul_job kj[64];
	size_t bytes = 0;
	for (uint32_t i = 0; i < n; i++) {
		const struct k3_cpu_job *j = &jobs[i];
		size_t b;
		mats[i] = job_mat(j, &b);
		kj[i] = (struct k3_kern_matmul_job){ .w = &mats[i], .row_begin = 0,
			.row_end = mats[i].rows, .T = j->T, .x = j->x, .ldx = j->ldx,
			.y = j->y, .ldy = j->ldy };
		bytes += b;
	}
	/* shapes were validated at open; a failure here is a provider bug */
	int rc = k3_kern_matmul_many(ctx->split_all || bytes >= K3_CPU_PARALLEL_MIN_BYTES
				     ? ctx->pool : NULL, n, kj);
	(void)rc;
}

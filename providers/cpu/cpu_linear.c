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
	/* shapes were validated at open; a failure here is a provider bug */
	int rc = k3_kern_matmul(ctx->pool, &km, 0, W->rows, T, x, ldx, y, ldy);
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
	int rc = k3_kern_matmul(ctx->pool, &km, 0, rows, T, x, ldx, y, ldy);
	(void)rc;
}

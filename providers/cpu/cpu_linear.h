/*
 * cpu_linear.h - the cpu provider's matrix products and compute threads
 * (internal to providers/cpu): the reference path runs the scalar loops of
 * cpu_ref.c on the calling thread; the fast path runs kernels/
 * (k3_kern_matmul, run-time ISA, thread pool).
 *
 * Batch invariance rule (both paths): y[t][r] is computed by one thread,
 * from row r of W and x[t], with a reduction order that depends only on the
 * number of columns, never on T, the row split or the thread count.
 */
#ifndef K3_CPU_LINEAR_H
#define K3_CPU_LINEAR_H

#include <stddef.h>
#include <stdint.h>

#include "k3_kernels.h"

/* A borrowed weight matrix [rows][cols] (row stride cols): bf16 (2), f32
 * (1), or the int8 spine's row-wise int8 (K3_PROV_DTYPE_I8: q then the
 * row scales at K3_PROV_I8_SCALE_OFFSET, providers/k3_provider.h). */
struct k3_cpu_mat {
	const void *data;
	uint32_t dtype;
	uint32_t rows, cols;
};

struct k3_cpu_ctx {
	int reference;               /* 1: scalar reference kernels only */
	int split_all;               /* 1: split even tiny products (tests) */
	uint32_t threads;            /* >= 1 */
	struct k3_kern_pool *pool;   /* NULL when threads == 1 or reference */
};

/* threads 0 = online cores. Returns 0 or -errno. */
int k3_cpu_ctx_init(struct k3_cpu_ctx *ctx, uint32_t threads, int reference);
int k3_cpu_ctx_set_threads(struct k3_cpu_ctx *ctx, uint32_t threads);
void k3_cpu_ctx_release(struct k3_cpu_ctx *ctx);

/* The row scales of an I8 matrix (NULL for another dtype). */
const float *k3_cpu_mat_row_scales(const struct k3_cpu_mat *W);

/* y[t*ldy + r] = sum_c W[r][c] x[t*ldx + c] for t < T, r < W->rows. */
void k3_cpu_linear(struct k3_cpu_ctx *ctx, const struct k3_cpu_mat *W,
		   const float *x, size_t ldx, uint32_t T, float *y, size_t ldy);

/* The same for an MXFP4 matrix (spec §9): packed [rows][cols/2], scale
 * [rows][cols/32], cols % 32 == 0. */
void k3_cpu_mxfp4_linear(struct k3_cpu_ctx *ctx, const uint8_t *packed,
			 const uint8_t *scale, uint32_t rows, uint32_t cols,
			 const float *x, size_t ldx, uint32_t T, float *y, size_t ldy);

/* One product of a batch run by k3_cpu_linear_multi: y = W x over T
 * positions, as k3_cpu_linear (bf16/f32) or k3_cpu_mxfp4_linear (when
 * packed is set: W is then rows x cols MXFP4 with scale). */
struct k3_cpu_job {
	const struct k3_cpu_mat *W;  /* bf16/f32, or NULL for MXFP4 */
	const uint8_t *packed, *scale;
	uint32_t rows, cols;         /* MXFP4 shape (ignored for W) */
	const float *x;
	size_t ldx;
	uint32_t T;
	float *y;
	size_t ldy;
};

/* Runs independent products as one parallel region: their rows form one
 * index space split across the threads, so a decode step pays one pool
 * dispatch for, e.g., q/k/v/g projections or all experts of a layer instead
 * of one each. Results are identical to running the jobs one by one (each
 * row's reduction is the same; k3_kern_matmul_many). Runs of more than 64
 * jobs go 64 at a time. */
void k3_cpu_linear_multi(struct k3_cpu_ctx *ctx, const struct k3_cpu_job *jobs, uint32_t n);

/* Weight bytes below which a product runs on the calling thread: a pool
 * dispatch costs a wake-up, which is more than streaming 64 KiB. Where a
 * product runs never changes its result. */
enum { K3_CPU_PARALLEL_MIN_BYTES = 64 << 10 };

#endif

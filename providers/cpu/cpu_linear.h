/*
 * cpu_linear.h - the cpu provider's matrix products and compute threads
 * (internal to providers/cpu).
 *
 * Batch invariance rule: y[t][r] is always computed by one thread, from
 * row r of W and x[t], with a reduction order that depends only on the
 * number of columns (never on T, on r's neighbours or on the thread
 * count). Threads split rows, never the reduced dimension.
 */
#ifndef K3_CPU_LINEAR_H
#define K3_CPU_LINEAR_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

/* A borrowed weight matrix [rows][cols], bf16 (2) or f32 (1). */
struct k3_cpu_mat {
	const void *data;
	uint32_t dtype;
	uint32_t rows, cols;
};

struct k3_cpu_pool;

struct k3_cpu_ctx {
	int reference;               /* 1: scalar reference kernels only */
	uint32_t threads;            /* >= 1 */
	struct k3_cpu_pool *pool;    /* NULL when threads == 1 */
};

/* threads 0 = online cores. Returns 0 or -errno. */
int k3_cpu_ctx_init(struct k3_cpu_ctx *ctx, uint32_t threads, int reference);
int k3_cpu_ctx_set_threads(struct k3_cpu_ctx *ctx, uint32_t threads);
void k3_cpu_ctx_release(struct k3_cpu_ctx *ctx);

/* y[t*ldy + r] = sum_c W[r][c] x[t*ldx + c] for t < T, r < W->rows. */
void k3_cpu_linear(struct k3_cpu_ctx *ctx, const struct k3_cpu_mat *W,
		   const float *x, size_t ldx, uint32_t T, float *y, size_t ldy);

/* y[r] = sum_c W[r][c] x[c] for one position, W MXFP4 (spec §9):
 * packed [rows][cols/2], scale [rows][cols/32], cols % 32 == 0. */
void k3_cpu_mxfp4_linear(struct k3_cpu_ctx *ctx, const uint8_t *packed,
			 const uint8_t *scale, uint32_t rows, uint32_t cols,
			 const float *x, float *y);

/* Runs fn(arg, begin, end) over [0, n) split into contiguous ranges, one
 * per thread, and waits for all. Which range a thread gets never changes a
 * result as long as fn computes each index independently. */
void k3_cpu_parallel(struct k3_cpu_ctx *ctx, size_t n, size_t min_per_thread,
		     void (*fn)(void *arg, size_t begin, size_t end), void *arg);

#endif

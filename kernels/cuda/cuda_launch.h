/*
 * cuda_launch.h - internal: what k3_cuda.c (host C, validation and
 * errors) hands the kernel files (mxfp4.cu, bf16.cu) for one launch.
 * Shared by C and CUDA C++, so plain structs and extern "C" launchers.
 *
 * A launch is a list of jobs cut into warp items: one item = RPW rows x up
 * to TT positions of one job, item0 = the job's first item (prefix sums,
 * ascending). The kernel finds its job by scanning item0. The split into
 * items never changes a y element's arithmetic (k3_cuda.h).
 */
#ifndef K3_CUDA_LAUNCH_H
#define K3_CUDA_LAUNCH_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#include "k3_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

enum {
	K3_CUDA_RPW = 4,       /* rows per warp: one x load serves 4 rows */
	K3_CUDA_WARPS = 8,     /* warps per block (256 threads) */
};

struct k3_cuda_desc {
	const void *w;             /* MXFP4 packed bytes or BF16 words */
	const uint8_t *scales;     /* MXFP4 only */
	const float *x;
	float *y;
	uint32_t rows, cols, ld;   /* ld: BF16 row stride in elements */
	uint32_t T, ldx, ldy;
	uint32_t item0;
	uint32_t row_items;        /* ceil(rows / K3_CUDA_RPW) */
};

/* Kernel parameters (passed by value: 64 jobs fit the 4 KiB limit). */
struct k3_cuda_launch {
	uint32_t n_jobs, n_items;
	uint32_t tt;               /* positions per item: 1, 4 or 8 */
	struct k3_cuda_desc job[K3_CUDA_JOBS_MAX];
};

/* Queue the kernel on s; returns the launch's cudaError_t (configuration
 * errors only: execution errors surface at the next sync). */
cudaError_t k3_cuda_launch_mxfp4(const struct k3_cuda_launch *l, cudaStream_t s);
cudaError_t k3_cuda_launch_bf16(const struct k3_cuda_launch *l, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif

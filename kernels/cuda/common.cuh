/*
 * common.cuh - internal device helpers shared by the kernel files: the
 * job of a warp item, the fixed warp reduction and the store of an
 * item's results, and the host-side TT dispatch.
 */
#ifndef K3_CUDA_COMMON_CUH
#define K3_CUDA_COMMON_CUH

#include "cuda_launch.h"

namespace k3cuda {

/* The job holding warp item `item` (jobs' item0 ascend; at most 64). */
__device__ __forceinline__ const k3_cuda_desc &find_job(const k3_cuda_launch &l,
	uint32_t item)
{
	uint32_t j = 0;

	while (j + 1 < l.n_jobs && l.job[j + 1].item0 <= item)
		j++;
	return l.job[j];
}

/* The first row and position of warp item `item` (of job J), and its
 * accumulators set to +0. */
template <int TT>
__device__ __forceinline__ void item_origin(const k3_cuda_desc &J, uint32_t item,
	uint32_t *r0, uint32_t *t0, float (&acc)[K3_CUDA_RPW][TT])
{
	const uint32_t local = item - J.item0;

	*r0 = (local % J.row_items) * K3_CUDA_RPW;
	*t0 = (local / J.row_items) * TT;
#pragma unroll
	for (int i = 0; i < K3_CUDA_RPW; i++)
#pragma unroll
		for (int t = 0; t < TT; t++)
			acc[i][t] = 0.0f;
}

/* Butterfly sum over the 32 lanes in a fixed tree (xor 16, 8, 4, 2, 1);
 * every lane ends with the same bits (fp addition commutes). Then lane 0
 * stores the rows and positions of the item that exist. */
template <int TT>
__device__ __forceinline__ void store_item(const k3_cuda_desc &J, uint32_t lane,
	uint32_t r0, uint32_t t0, float (&acc)[K3_CUDA_RPW][TT])
{
#pragma unroll
	for (int i = 0; i < K3_CUDA_RPW; i++)
#pragma unroll
		for (int t = 0; t < TT; t++) {
			float v = acc[i][t];

#pragma unroll
			for (int off = 16; off >= 1; off >>= 1)
				v = __fadd_rn(v, __shfl_xor_sync(0xFFFFFFFFu, v, off));
			if (lane == 0 && r0 + i < J.rows && t0 + t < J.T)
				J.y[(size_t)(t0 + t) * J.ldy + r0 + i] = v;
		}
}

/* Launches KERNEL<1|4|8> for l->tt on stream s; returns the launch error. */
#define K3_CUDA_LAUNCH_TT(KERNEL, l, s) do {                                   \
	dim3 grid_(((l)->n_items + K3_CUDA_WARPS - 1) / K3_CUDA_WARPS);            \
	dim3 block_(K3_CUDA_WARPS * 32);                                           \
	switch ((l)->tt) {                                                         \
	case 1: KERNEL<1><<<grid_, block_, 0, (s)>>>(*(l)); break;                 \
	case 4: KERNEL<4><<<grid_, block_, 0, (s)>>>(*(l)); break;                 \
	default: KERNEL<8><<<grid_, block_, 0, (s)>>>(*(l)); break;                \
	}                                                                          \
	return cudaGetLastError();                                                 \
} while (0)

} /* namespace k3cuda */

#endif

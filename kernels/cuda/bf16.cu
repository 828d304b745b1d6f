/*
 * bf16.cu - the BF16 matrix-product kernel for T = 1..64 positions, in the
 * fixed reduction order of k3_cuda.h (lane l: 8-column chunks at
 * 256 i + 8 l, FMA chain ascending; butterfly over lanes).
 *
 * Same item layout as mxfp4.cu: K3_CUDA_RPW rows x up to TT positions per
 * warp, x loaded once per chunk for all rows; explicit round-to-nearest
 * intrinsics, so the instantiations agree bit for bit.
 */
#include "common.cuh"

namespace {

__device__ __forceinline__ float bf16_lo(uint32_t u)
{
	return __uint_as_float(u << 16);
}

__device__ __forceinline__ float bf16_hi(uint32_t u)
{
	return __uint_as_float(u & 0xFFFF0000u);
}

template <int TT>
__global__ void __launch_bounds__(K3_CUDA_WARPS * 32)
bf16_rows(const __grid_constant__ k3_cuda_launch l)
{
	const uint32_t lane = threadIdx.x & 31;
	const uint32_t item = blockIdx.x * K3_CUDA_WARPS + threadIdx.x / 32;

	if (item >= l.n_items)
		return;

	const k3_cuda_desc &J = k3cuda::find_job(l, item);
	const uint16_t *w = static_cast<const uint16_t *>(J.w);
	float acc[K3_CUDA_RPW][TT];
	uint32_t r0, t0;

	k3cuda::item_origin<TT>(J, item, &r0, &t0, acc);

	for (uint32_t c = 8 * lane; c < J.cols; c += 256) {
		uint4 q[K3_CUDA_RPW];
		float4 xa[TT], xb[TT];

#pragma unroll
		for (int i = 0; i < K3_CUDA_RPW; i++) {
			uint32_t r = r0 + i < J.rows ? r0 + i : r0;

			q[i] = __ldcs(reinterpret_cast<const uint4 *>(w + (size_t)r * J.ld + c));
		}
#pragma unroll
		for (int t = 0; t < TT; t++) {
			uint32_t tt = t0 + t < J.T ? t0 + t : t0;
			const float4 *xp = reinterpret_cast<const float4 *>(J.x + (size_t)tt * J.ldx + c);

			xa[t] = __ldg(xp);
			xb[t] = __ldg(xp + 1);
		}
#pragma unroll
		for (int i = 0; i < K3_CUDA_RPW; i++)
#pragma unroll
			for (int t = 0; t < TT; t++) {
				float a = acc[i][t];

				a = __fmaf_rn(bf16_lo(q[i].x), xa[t].x, a);
				a = __fmaf_rn(bf16_hi(q[i].x), xa[t].y, a);
				a = __fmaf_rn(bf16_lo(q[i].y), xa[t].z, a);
				a = __fmaf_rn(bf16_hi(q[i].y), xa[t].w, a);
				a = __fmaf_rn(bf16_lo(q[i].z), xb[t].x, a);
				a = __fmaf_rn(bf16_hi(q[i].z), xb[t].y, a);
				a = __fmaf_rn(bf16_lo(q[i].w), xb[t].z, a);
				a = __fmaf_rn(bf16_hi(q[i].w), xb[t].w, a);
				acc[i][t] = a;
			}
	}
	k3cuda::store_item<TT>(J, lane, r0, t0, acc);
}

} /* namespace */

extern "C" cudaError_t k3_cuda_launch_bf16(const struct k3_cuda_launch *l, cudaStream_t s)
{
	K3_CUDA_LAUNCH_TT(bf16_rows, l, s);
}

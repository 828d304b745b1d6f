/*
 * mxfp4.cu - the exact MXFP4 matrix-product kernel (docs/model.md §9) for
 * T = 1..64 positions, in the fixed reduction order of k3_cuda.h.
 *
 * One warp item = K3_CUDA_RPW rows x up to TT positions of one job. Lane l
 * reads the 16 packed bytes of group g = l + 32 i of each row (32 lanes x
 * 16 bytes: one coalesced 512-byte read per row), decodes each code with
 * a 16-entry shared-memory table (the 16 entries sit in 16 different
 * banks, so any mix of codes is conflict-free), and reuses every x value
 * it loads for all RPW rows. The arithmetic uses explicit round-to-
 * nearest intrinsics (__fmaf_rn, __fadd_rn) so that no instantiation (TT
 * = 1, 4, 8) can contract or reorder differently: a y element is the same
 * bits whatever T, the item split or the launch shape.
 */
#include "common.cuh"

namespace {

__device__ __forceinline__ float e8m0_scale(unsigned s)
{
	/* 2^(s-127): exact; s = 0 is the subnormal 2^-127 (not 0), s = 255
	 * gives inf as the CPU kernels do */
	return s ? __uint_as_float(s << 23) : __uint_as_float(0x00400000u);
}

template <int TT>
__global__ void __launch_bounds__(K3_CUDA_WARPS * 32)
mxfp4_rows(const __grid_constant__ k3_cuda_launch l)
{
	__shared__ float lut[16];
	const uint32_t lane = threadIdx.x & 31;
	const uint32_t item = blockIdx.x * K3_CUDA_WARPS + threadIdx.x / 32;

	if (threadIdx.x < 16) {
		const float e2m1[8] = { 0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f };
		float v = e2m1[threadIdx.x & 7];

		lut[threadIdx.x] = threadIdx.x & 8 ? -v : v;
	}
	__syncthreads();
	if (item >= l.n_items)
		return;

	const k3_cuda_desc &J = k3cuda::find_job(l, item);
	const uint32_t ngroups = J.cols / 32;
	const uint8_t *packed = static_cast<const uint8_t *>(J.w);
	float acc[K3_CUDA_RPW][TT];
	uint32_t r0, t0;

	k3cuda::item_origin<TT>(J, item, &r0, &t0, acc);

	for (uint32_t g = lane; g < ngroups; g += 32) {
		uint4 q[K3_CUDA_RPW];
		float s[K3_CUDA_RPW], p[K3_CUDA_RPW][TT];
		const float *xr[TT];

#pragma unroll
		for (int i = 0; i < K3_CUDA_RPW; i++) {
			/* rows past the end read row r0 again; never stored */
			uint32_t r = r0 + i < J.rows ? r0 + i : r0;

			q[i] = __ldcs(reinterpret_cast<const uint4 *>(
				packed + (size_t)r * (J.cols / 2) + 16 * (size_t)g));
			s[i] = e8m0_scale(__ldcs(J.scales + (size_t)r * ngroups + g));
#pragma unroll
			for (int t = 0; t < TT; t++)
				p[i][t] = 0.0f;
		}
#pragma unroll
		for (int t = 0; t < TT; t++) {
			uint32_t tt = t0 + t < J.T ? t0 + t : t0;

			xr[t] = J.x + (size_t)tt * J.ldx + 32 * (size_t)g;
		}
		/* columns ascending, four at a time (one float4 of x each) */
#pragma unroll
		for (int c4 = 0; c4 < 8; c4++) {
			float4 xv[TT];

#pragma unroll
			for (int t = 0; t < TT; t++)
				xv[t] = __ldg(reinterpret_cast<const float4 *>(xr[t]) + c4);
#pragma unroll
			for (int i = 0; i < K3_CUDA_RPW; i++) {
				uint32_t word = c4 < 2 ? q[i].x : c4 < 4 ? q[i].y : c4 < 6 ? q[i].z : q[i].w;
				uint32_t sh = 16 * (c4 & 1);
				float w0 = lut[(word >> sh) & 15], w1 = lut[(word >> (sh + 4)) & 15];
				float w2 = lut[(word >> (sh + 8)) & 15], w3 = lut[(word >> (sh + 12)) & 15];

#pragma unroll
				for (int t = 0; t < TT; t++) {
					p[i][t] = __fmaf_rn(w0, xv[t].x, p[i][t]);
					p[i][t] = __fmaf_rn(w1, xv[t].y, p[i][t]);
					p[i][t] = __fmaf_rn(w2, xv[t].z, p[i][t]);
					p[i][t] = __fmaf_rn(w3, xv[t].w, p[i][t]);
				}
			}
		}
#pragma unroll
		for (int i = 0; i < K3_CUDA_RPW; i++)
#pragma unroll
			for (int t = 0; t < TT; t++)
				acc[i][t] = __fmaf_rn(p[i][t], s[i], acc[i][t]);
	}
	k3cuda::store_item<TT>(J, lane, r0, t0, acc);
}

} /* namespace */

extern "C" cudaError_t k3_cuda_launch_mxfp4(const struct k3_cuda_launch *l, cudaStream_t s)
{
	K3_CUDA_LAUNCH_TT(mxfp4_rows, l, s);
}

/*
 * arm_neon_i8.c - the int8 x fp32 product on aarch64 Advanced SIMD (built
 * with the k3kern_neon library; always runnable on aarch64).
 *
 * Fixed reduction order of y[r][t] = scale[r] * (q[r] . x[t]):
 *   four 4-lane accumulators over 16-column steps: acc_k += cols
 *   16i+4k..16i+4k+3 (q widened exactly to fp32: sxtl, sxtl, scvtf; then
 *   FMA with x); the remaining whole 4-blocks go to acc0, acc1, acc2 in
 *   turn, a last partial block (zero-padded) to acc3; then (acc0 + acc1) +
 *   (acc2 + acc3), the pairwise lane sum (vaddvq_f32), times the row's
 *   scale. One inline row kernel serves every rows x tokens block (the
 *   row walk of kern_i8_rows.h).
 *
 * Freestanding headers only (builtins for memcpy), like arm_neon.c, so the
 * file can be syntax-checked without a target libc.
 */
#include <arm_neon.h>

#include "kern_i8.h"

#define INLINE static inline __attribute__((always_inline))
#define K3_UNROLL _Pragma("GCC unroll 8")

INLINE float32x4_t s8_lo4(int16x8_t v)
{
	return vcvtq_f32_s32(vmovl_s16(vget_low_s16(v)));
}

INLINE float32x4_t s8_hi4(int16x8_t v)
{
	return vcvtq_f32_s32(vmovl_high_s16(v));
}

/* 4 int8 (n of them real, the rest zero) -> 4 fp32. */
INLINE float32x4_t cvt4(const int8_t *p, size_t n)
{
	int8_t tmp[8] = { 0, 0, 0, 0, 0, 0, 0, 0 };

	__builtin_memcpy(tmp, p, n);
	return s8_lo4(vmovl_s8(vld1_s8(tmp)));
}

INLINE float32x4_t f32_part(const float *p, size_t n)
{
	float tmp[4] = { 0, 0, 0, 0 };

	__builtin_memcpy(tmp, p, n * sizeof(*p));
	return vld1q_f32(tmp);
}

INLINE void rows_i8(size_t nr, size_t nt, size_t cols, const int8_t *const *wr,
	const float *sc, const float *const *xt, float *out, size_t ldo, size_t pf)
{
	float32x4_t a[8][4];
	(void)pf;   /* the hardware prefetchers follow these streams */
	size_t c = 0, k4 = 0;

	K3_UNROLL for (size_t k = 0; k < nr * nt; k++)
		for (int j = 0; j < 4; j++)
			a[k][j] = vdupq_n_f32(0.0f);
	for (; c + 16 <= cols; c += 16) {
		K3_UNROLL for (size_t i = 0; i < nr; i++) {
			int8x16_t v = vld1q_s8(wr[i] + c);
			int16x8_t lo = vmovl_s8(vget_low_s8(v)), hi = vmovl_high_s8(v);
			float32x4_t w0 = s8_lo4(lo), w1 = s8_hi4(lo), w2 = s8_lo4(hi), w3 = s8_hi4(hi);
			K3_UNROLL for (size_t t = 0; t < nt; t++) {
				float32x4_t *A = a[i * nt + t];
				A[0] = vfmaq_f32(A[0], w0, vld1q_f32(xt[t] + c));
				A[1] = vfmaq_f32(A[1], w1, vld1q_f32(xt[t] + c + 4));
				A[2] = vfmaq_f32(A[2], w2, vld1q_f32(xt[t] + c + 8));
				A[3] = vfmaq_f32(A[3], w3, vld1q_f32(xt[t] + c + 12));
			}
		}
	}
	for (; c + 4 <= cols; c += 4, k4++) {
		K3_UNROLL for (size_t i = 0; i < nr; i++) {
			float32x4_t w0 = cvt4(wr[i] + c, 4);
			K3_UNROLL for (size_t t = 0; t < nt; t++)
				a[i * nt + t][k4] = vfmaq_f32(a[i * nt + t][k4], w0, vld1q_f32(xt[t] + c));
		}
	}
	if (c < cols) {
		K3_UNROLL for (size_t i = 0; i < nr; i++) {
			float32x4_t w0 = cvt4(wr[i] + c, cols - c);
			K3_UNROLL for (size_t t = 0; t < nt; t++)
				a[i * nt + t][3] = vfmaq_f32(a[i * nt + t][3], w0,
					f32_part(xt[t] + c, cols - c));
		}
	}
	K3_UNROLL for (size_t i = 0; i < nr; i++)
		K3_UNROLL for (size_t t = 0; t < nt; t++) {
			float32x4_t *A = a[i * nt + t];
			out[t * ldo + i] = sc[i] * vaddvq_f32(vaddq_f32(vaddq_f32(A[0], A[1]),
				vaddq_f32(A[2], A[3])));
		}
}

#define K3_I8_ROWS_NAME neon_i8_rows
#include "kern_i8_rows.h"

const struct k3_kern_i8_ops k3_kern_i8_neon = {
	.isa = K3_KERN_ISA_NEON,
	.matmul_rows = neon_i8_rows,
};

/*
 * arm_neon.c - the aarch64 Advanced SIMD ISA (NEON is mandatory on
 * aarch64, so this file is built on every aarch64 host and always runnable
 * there).
 *
 * Fixed reduction orders (kern_ops.h batch-invariance contract):
 *
 *  BF16/F32 row . x: four 4-lane accumulators over 16-column steps
 *    (acc_k += cols 16i+4k..16i+4k+3, FMA); the remaining whole 4-blocks go
 *    to acc0, acc1, acc2 in turn, a last partial block (zero-padded) to
 *    acc3; then (acc0 + acc1) + (acc2 + acc3) and a pairwise lane sum.
 *  MXFP4 row . x: per 32-column group the eight decoded 4-lane vectors
 *    w0..w7 (E2M1 x 2 as exact integers, column order) give
 *    q_k = w_2k x + w_2k+1 x (mul, FMA), p = (q0 + q1) + (q2 + q3),
 *    acc = fma(p, 2^(s-128), acc); pairwise lane sum at the end.
 *  One inline row kernel serves every rows x tokens block, so a y element
 *  does not depend on T, the row range or the thread split.
 *
 * Only freestanding headers are used (builtins for memcpy/fmaf/ldexpf), so
 * the file can be syntax-checked with a cross compiler that has no target
 * libc (docs/kernels.md).
 */
#include <arm_neon.h>

#include "kern_ops.h"

#define INLINE static inline __attribute__((always_inline))
#define K3_UNROLL _Pragma("GCC unroll 8")

INLINE float hsum4(float32x4_t v)
{
	return vaddvq_f32(v);
}

INLINE float32x4_t load_bf16x4(const uint16_t *p)
{
	return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16));
}

INLINE float32x4_t load_bf16_part(const uint16_t *p, size_t n)
{
	uint16_t tmp[4] = { 0, 0, 0, 0 };

	__builtin_memcpy(tmp, p, n * sizeof(*p));
	return load_bf16x4(tmp);
}

INLINE float32x4_t load_f32x4(const float *p)
{
	return vld1q_f32(p);
}

INLINE float32x4_t load_f32_part(const float *p, size_t n)
{
	float tmp[4] = { 0, 0, 0, 0 };

	__builtin_memcpy(tmp, p, n * sizeof(*p));
	return vld1q_f32(tmp);
}

#define DEF_ROWS_DENSE(NAME, WT, LOAD4, LOADPART)                            \
INLINE void NAME(size_t nr, size_t nt, size_t cols, const WT *const *wr,    \
	const float *const *xt, float *out, size_t ldo)                       \
{                                                                            \
	float32x4_t a[8][4];                                                     \
	size_t c = 0, k4 = 0;                                                    \
	K3_UNROLL for (size_t k = 0; k < nr * nt; k++)                           \
		for (int j = 0; j < 4; j++)                                          \
			a[k][j] = vdupq_n_f32(0.0f);                                     \
	for (; c + 16 <= cols; c += 16) {                                        \
		K3_UNROLL for (size_t i = 0; i < nr; i++) {                          \
			float32x4_t w0 = LOAD4(wr[i] + c), w1 = LOAD4(wr[i] + c + 4);    \
			float32x4_t w2 = LOAD4(wr[i] + c + 8), w3 = LOAD4(wr[i] + c + 12);\
			K3_UNROLL for (size_t t = 0; t < nt; t++) {                      \
				float32x4_t *A = a[i * nt + t];                              \
				A[0] = vfmaq_f32(A[0], w0, vld1q_f32(xt[t] + c));            \
				A[1] = vfmaq_f32(A[1], w1, vld1q_f32(xt[t] + c + 4));        \
				A[2] = vfmaq_f32(A[2], w2, vld1q_f32(xt[t] + c + 8));        \
				A[3] = vfmaq_f32(A[3], w3, vld1q_f32(xt[t] + c + 12));       \
			}                                                                \
		}                                                                    \
	}                                                                        \
	for (; c + 4 <= cols; c += 4, k4++) {                                    \
		K3_UNROLL for (size_t i = 0; i < nr; i++) {                          \
			float32x4_t w0 = LOAD4(wr[i] + c);                               \
			K3_UNROLL for (size_t t = 0; t < nt; t++)                        \
				a[i * nt + t][k4] = vfmaq_f32(a[i * nt + t][k4], w0,         \
					vld1q_f32(xt[t] + c));                                   \
		}                                                                    \
	}                                                                        \
	if (c < cols) {                                                          \
		K3_UNROLL for (size_t i = 0; i < nr; i++) {                          \
			float32x4_t w0 = LOADPART(wr[i] + c, cols - c);                  \
			K3_UNROLL for (size_t t = 0; t < nt; t++)                        \
				a[i * nt + t][3] = vfmaq_f32(a[i * nt + t][3], w0,           \
					load_f32_part(xt[t] + c, cols - c));                     \
		}                                                                    \
	}                                                                        \
	K3_UNROLL for (size_t i = 0; i < nr; i++)                                \
		K3_UNROLL for (size_t t = 0; t < nt; t++) {                          \
			float32x4_t *A = a[i * nt + t];                                  \
			out[t * ldo + i] = hsum4(vaddq_f32(vaddq_f32(A[0], A[1]),        \
				vaddq_f32(A[2], A[3])));                                     \
		}                                                                    \
}

DEF_ROWS_DENSE(rows_bf16, uint16_t, load_bf16x4, load_bf16_part)
DEF_ROWS_DENSE(rows_f32, float, load_f32x4, load_f32_part)

static const int8_t e2m1x2[16] = { 0, 1, 2, 3, 4, 6, 8, 12,
	0, -1, -2, -3, -4, -6, -8, -12 };

INLINE float group_scale(uint8_t s)
{
	uint32_t bits;
	float f;

	if (s < 2)      /* subnormal 2^(s-128) */
		return __builtin_ldexpf(1.0f, (int)s - 128);
	bits = (uint32_t)(s - 1) << 23;
	__builtin_memcpy(&f, &bits, sizeof(f));
	return f;
}

INLINE float32x4_t cvt_s16_lo(int16x8_t v)
{
	return vcvtq_f32_s32(vmovl_s16(vget_low_s16(v)));
}

INLINE float32x4_t cvt_s16_hi(int16x8_t v)
{
	return vcvtq_f32_s32(vmovl_high_s16(v));
}

/* 16 packed bytes (32 columns) -> eight 4-lane vectors in column order. */
INLINE void decode_group(const uint8_t *p, int8x16_t lut, float32x4_t w[8])
{
	uint8x16_t v = vld1q_u8(p);
	int8x16_t lo = vqtbl1q_s8(lut, vandq_u8(v, vdupq_n_u8(0x0F)));
	int8x16_t hi = vqtbl1q_s8(lut, vshrq_n_u8(v, 4));
	int8x16_t a = vzip1q_s8(lo, hi);      /* columns 0..15 */
	int8x16_t b = vzip2q_s8(lo, hi);      /* columns 16..31 */
	int16x8_t a0 = vmovl_s8(vget_low_s8(a)), a1 = vmovl_high_s8(a);
	int16x8_t b0 = vmovl_s8(vget_low_s8(b)), b1 = vmovl_high_s8(b);

	w[0] = cvt_s16_lo(a0);
	w[1] = cvt_s16_hi(a0);
	w[2] = cvt_s16_lo(a1);
	w[3] = cvt_s16_hi(a1);
	w[4] = cvt_s16_lo(b0);
	w[5] = cvt_s16_hi(b0);
	w[6] = cvt_s16_lo(b1);
	w[7] = cvt_s16_hi(b1);
}

INLINE float32x4_t group_dot(const float32x4_t w[8], const float *x)
{
	float32x4_t q[4];

	for (int k = 0; k < 4; k++) {
		q[k] = vmulq_f32(w[2 * k], vld1q_f32(x + 8 * k));
		q[k] = vfmaq_f32(q[k], w[2 * k + 1], vld1q_f32(x + 8 * k + 4));
	}
	return vaddq_f32(vaddq_f32(q[0], q[1]), vaddq_f32(q[2], q[3]));
}

INLINE void rows_mxfp4(size_t nr, size_t nt, size_t cols,
	const uint8_t *const *pr, const uint8_t *const *sr,
	const float *const *xt, float *out, size_t ldo)
{
	const int8x16_t lut = vld1q_s8(e2m1x2);
	float32x4_t acc[8];

	K3_UNROLL for (size_t k = 0; k < nr * nt; k++)
		acc[k] = vdupq_n_f32(0.0f);
	for (size_t g = 0; g < cols / 32; g++) {
		K3_UNROLL for (size_t i = 0; i < nr; i++) {
			float32x4_t w[8];
			float s = group_scale(sr[i][g]);

			decode_group(pr[i] + 16 * g, lut, w);
			K3_UNROLL for (size_t t = 0; t < nt; t++)
				acc[i * nt + t] = vfmaq_n_f32(acc[i * nt + t],
					group_dot(w, xt[t] + 32 * g), s);
		}
	}
	K3_UNROLL for (size_t i = 0; i < nr; i++)
		K3_UNROLL for (size_t t = 0; t < nt; t++)
			out[t * ldo + i] = hsum4(acc[i * nt + t]);
}

static void neon_matmul_rows(const struct k3_kern_mat *w, size_t r0, size_t r1,
	size_t T, const float *x, size_t ldx, float *y, size_t ldy)
{
	size_t cols = w->cols, ld = w->ld ? w->ld : w->cols;
	size_t r = r0;

	while (r < r1) {
		size_t nr = (T == 1 && r + 4 <= r1) ? 4 : 1;

		for (size_t t = 0; t < T; ) {
			size_t nt = T - t >= 4 ? 4 : T - t;
			const float *xt[4] = { 0 };
			float *out = y + t * ldy + (r - r0);

			if (nr > 1)
				nt = 1;
			for (size_t k = 0; k < nt; k++)
				xt[k] = x + (t + k) * ldx;
			if (w->dtype == K3_KERN_DT_MXFP4) {
				const uint8_t *pr[4] = { 0 }, *sr[4] = { 0 };

				for (size_t i = 0; i < nr; i++) {
					pr[i] = (const uint8_t *)w->data + (r + i) * (cols / 2);
					sr[i] = w->scales + (r + i) * (cols / 32);
				}
				K3_KERN_BLOCK(rows_mxfp4, nr, nt, cols, pr, sr, xt, out, ldy);
			} else if (w->dtype == K3_KERN_DT_BF16) {
				const uint16_t *wr[4] = { 0 };

				for (size_t i = 0; i < nr; i++)
					wr[i] = (const uint16_t *)w->data + (r + i) * ld;
				K3_KERN_BLOCK(rows_bf16, nr, nt, cols, wr, xt, out, ldy);
			} else {
				const float *wr[4] = { 0 };

				for (size_t i = 0; i < nr; i++)
					wr[i] = (const float *)w->data + (r + i) * ld;
				K3_KERN_BLOCK(rows_f32, nr, nt, cols, wr, xt, out, ldy);
			}
			t += nt;
		}
		r += nr;
	}
}

/* The FMA-chain ops (transposed product, axpy, KDA step) of kern_chain.h
 * at 4 lanes: the same bits as the x86 tables' 8. */
typedef float32x4_t kc_t;
enum { KC_LANES = 4 };
#define kc_zero() vdupq_n_f32(0)
#define kc_set1(s) vdupq_n_f32(s)
#define kc_load(p) vld1q_f32(p)
#define kc_store(p, v) vst1q_f32((p), (v))
#define kc_load_bf16(p) load_bf16x4(p)
#define kc_mul(a, b) vmulq_f32((a), (b))
#define kc_fma(a, b, c) vfmaq_f32((c), (a), (b))
#define KC_PREFIX neon
#include "kern_chain.h"

static float neon_dot(size_t n, const float *a, const float *b)
{
	const float *wr[1] = { a }, *xt[1] = { b };
	float out;

	rows_f32(1, 1, n, wr, xt, &out, 1);
	return out;
}

static float neon_sumsq(size_t n, const float *x)
{
	return neon_dot(n, x, x);
}

const struct k3_kern_ops k3_kern_ops_neon = { K3_KERN_OPS_INIT(K3_KERN_ISA_NEON, neon) };

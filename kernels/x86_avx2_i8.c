/*
 * x86_avx2_i8.c - the int8 x fp32 product on AVX2 + FMA (built with the
 * k3kern_avx2 library's -mavx2 -mfma; chosen with the AVX2 ISA).
 *
 * Fixed reduction order of y[r][t] = scale[r] * (q[r] . x[t]):
 *   two 8-lane accumulators over 16-column steps: acc0 += cols 16i..16i+7,
 *   acc1 += cols 16i+8..16i+15, each q converted exactly to fp32
 *   (vpmovsxbd + vcvtdq2ps) and FMA'd with x; a remaining 8-block goes to
 *   acc0, a final partial block (zero-padded) to acc1; then (acc0 + acc1)
 *   is folded 8 -> 4 -> 2 -> 1 and multiplied by the row's scale.
 * The main loop is unrolled to 32 columns (one software prefetch per 32
 * bytes of a row); the unrolled steps keep the 16-column order exactly.
 * One inline row kernel serves every rows x tokens block (4 rows x 1 token
 * at T = 1, 1 row x up to 4 tokens for T > 1; the row walk of
 * kern_i8_rows.h), so an element's bits do not depend on T, the row range
 * or the thread split.
 */
#include <immintrin.h>
#include <string.h>

#include "kern_i8.h"
#include "x86_fold.h"

#define INLINE static inline __attribute__((always_inline))
#define K3_UNROLL _Pragma("GCC unroll 8")

/* 8 int8 -> 8 fp32 (exact). */
INLINE __m256 cvt8(const int8_t *p)
{
	return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

INLINE __m256 cvt_part(const int8_t *p, size_t n)
{
	int8_t tmp[8] = { 0 };

	memcpy(tmp, p, n);
	return cvt8(tmp);
}

/* One 16-column step of nr rows x nt tokens at column c. */
#define STEP16(C) do {                                                        \
	K3_UNROLL for (size_t i = 0; i < nr; i++) {                              \
		__m256 w0 = cvt8(wr[i] + (C)), w1 = cvt8(wr[i] + (C) + 8);           \
		K3_UNROLL for (size_t t = 0; t < nt; t++) {                          \
			a0[i * nt + t] = _mm256_fmadd_ps(w0,                             \
				_mm256_loadu_ps(xt[t] + (C)), a0[i * nt + t]);               \
			a1[i * nt + t] = _mm256_fmadd_ps(w1,                             \
				_mm256_loadu_ps(xt[t] + (C) + 8), a1[i * nt + t]);           \
		}                                                                    \
	}                                                                        \
} while (0)

INLINE void rows_i8(size_t nr, size_t nt, size_t cols, const int8_t *const *wr,
	const float *sc, const float *const *xt, float *out, size_t ldo, size_t pf)
{
	__m256 a0[8], a1[8];
	size_t c = 0;

	K3_UNROLL for (size_t k = 0; k < nr * nt; k++) {
		a0[k] = _mm256_setzero_ps();
		a1[k] = _mm256_setzero_ps();
	}
	for (; c + 32 <= cols; c += 32) {
		if (pf)
			K3_UNROLL for (size_t i = 0; i < nr; i++)
				_mm_prefetch((const char *)(wr[i] + c + pf), _MM_HINT_T0);
		STEP16(c);
		STEP16(c + 16);
	}
	if (c + 16 <= cols) {
		STEP16(c);
		c += 16;
	}
	if (c + 8 <= cols) {
		K3_UNROLL for (size_t i = 0; i < nr; i++) {
			__m256 w0 = cvt8(wr[i] + c);
			K3_UNROLL for (size_t t = 0; t < nt; t++)
				a0[i * nt + t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xt[t] + c),
					a0[i * nt + t]);
		}
		c += 8;
	}
	if (c < cols) {
		__m256i m = fold_tail_mask8(cols - c);
		K3_UNROLL for (size_t i = 0; i < nr; i++) {
			__m256 w0 = cvt_part(wr[i] + c, cols - c);
			K3_UNROLL for (size_t t = 0; t < nt; t++)
				a1[i * nt + t] = _mm256_fmadd_ps(w0, _mm256_maskload_ps(xt[t] + c, m),
					a1[i * nt + t]);
		}
	}
	K3_UNROLL for (size_t i = 0; i < nr; i++)
		K3_UNROLL for (size_t t = 0; t < nt; t++)
			out[t * ldo + i] = sc[i] * fold_hsum8(_mm256_add_ps(a0[i * nt + t], a1[i * nt + t]));
}
#undef STEP16

#define K3_I8_ROWS_NAME avx2_i8_rows
#include "kern_i8_rows.h"

const struct k3_kern_i8_ops k3_kern_i8_avx2 = {
	.isa = K3_KERN_ISA_AVX2,
	.matmul_rows = avx2_i8_rows,
};

/*
 * x86_avx512_i8.c - the int8 x fp32 product on AVX-512 F/BW/VL (built with
 * the k3kern_avx512 library's flags; chosen with the AVX-512 ISA).
 *
 * Fixed reduction order of y[r][t] = scale[r] * (q[r] . x[t]):
 *   two 16-lane accumulators over 32-column steps: acc0 += cols
 *   32i..32i+15, acc1 += cols 32i+16..32i+31, each q converted exactly to
 *   fp32 (vpmovsxbd + vcvtdq2ps) and FMA'd with x; a remaining 16-block
 *   goes to acc0, a final partial block (masked loads, zeros) to acc1;
 *   then s = acc0 + acc1 is folded 16 -> 8 (low half + high half), 8 -> 4
 *   -> 2 -> 1 as on AVX2, and multiplied by the row's scale.
 * The main loop is unrolled to 64 columns (one software prefetch per 64
 * bytes of a row, a cache line) and keeps the 32-column order exactly. One
 * inline row kernel serves every rows x tokens block (4 rows x 1 token at
 * T = 1, 1 row x up to 4 tokens for T > 1; the row walk of
 * kern_i8_rows.h): an element's bits do not depend on T, the row range or
 * the thread split.
 */
#include <immintrin.h>
#include <string.h>

#include "kern_i8.h"
#include "x86_fold.h"

#define INLINE static inline __attribute__((always_inline))
#define K3_UNROLL _Pragma("GCC unroll 8")

/* 16 int8 -> 16 fp32 (exact). */
INLINE __m512 cvt16(const int8_t *p)
{
	return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}

#define STEP32(C) do {                                                        \
	K3_UNROLL for (size_t i = 0; i < nr; i++) {                              \
		__m512 w0 = cvt16(wr[i] + (C)), w1 = cvt16(wr[i] + (C) + 16);        \
		K3_UNROLL for (size_t t = 0; t < nt; t++) {                          \
			a0[i * nt + t] = _mm512_fmadd_ps(w0,                             \
				_mm512_loadu_ps(xt[t] + (C)), a0[i * nt + t]);               \
			a1[i * nt + t] = _mm512_fmadd_ps(w1,                             \
				_mm512_loadu_ps(xt[t] + (C) + 16), a1[i * nt + t]);          \
		}                                                                    \
	}                                                                        \
} while (0)

INLINE void rows_i8(size_t nr, size_t nt, size_t cols, const int8_t *const *wr,
	const float *sc, const float *const *xt, float *out, size_t ldo, size_t pf)
{
	__m512 a0[8], a1[8];
	size_t c = 0;

	K3_UNROLL for (size_t k = 0; k < nr * nt; k++) {
		a0[k] = _mm512_setzero_ps();
		a1[k] = _mm512_setzero_ps();
	}
	for (; c + 64 <= cols; c += 64) {
		if (pf)
			K3_UNROLL for (size_t i = 0; i < nr; i++)
				_mm_prefetch((const char *)(wr[i] + c + pf), _MM_HINT_T0);
		STEP32(c);
		STEP32(c + 32);
	}
	if (c + 32 <= cols) {
		STEP32(c);
		c += 32;
	}
	if (c + 16 <= cols) {
		K3_UNROLL for (size_t i = 0; i < nr; i++) {
			__m512 w0 = cvt16(wr[i] + c);
			K3_UNROLL for (size_t t = 0; t < nt; t++)
				a0[i * nt + t] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xt[t] + c),
					a0[i * nt + t]);
		}
		c += 16;
	}
	if (c < cols) {
		__mmask16 m = (__mmask16)((1u << (cols - c)) - 1);
		K3_UNROLL for (size_t i = 0; i < nr; i++) {
			__m512 w0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
				_mm_maskz_loadu_epi8(m, wr[i] + c)));
			K3_UNROLL for (size_t t = 0; t < nt; t++)
				a1[i * nt + t] = _mm512_fmadd_ps(w0, _mm512_maskz_loadu_ps(m, xt[t] + c),
					a1[i * nt + t]);
		}
	}
	K3_UNROLL for (size_t i = 0; i < nr; i++)
		K3_UNROLL for (size_t t = 0; t < nt; t++)
			out[t * ldo + i] = sc[i] * fold_hsum16(_mm512_add_ps(a0[i * nt + t],
				a1[i * nt + t]));
}
#undef STEP32

#define K3_I8_ROWS_NAME avx512_i8_rows
#include "kern_i8_rows.h"

const struct k3_kern_i8_ops k3_kern_i8_avx512 = {
	.isa = K3_KERN_ISA_AVX512,
	.matmul_rows = avx512_i8_rows,
};

/*
 * x86_vec.h - internal: the row kernels that AVX2 and AVX-512 write the
 * same way but for the lane width, written once over a small vocabulary
 * (xv_*) of one vector width. The includer defines X86_VEC_BITS as 256
 * (x86_avx2.c, x86_avx2_i8.c) or 512 (x86_avx512.c, x86_avx512_i8.c)
 * first; everything here is inline and compiles with that file's -m flags.
 *
 * Both kernels keep the reduction order their files document: two
 * accumulators over steps of 2 x XV_LANES columns (a0 the first half, a1
 * the second), a remaining XV_LANES block into a0, a final partial block
 * (zero-filled lanes) into a1, then xv_hsum(a0 + a1) (x86_fold.h). With
 * the vocabulary of one width each expands to the instructions of that
 * file's former hand-written kernel, so results are bit for bit the same.
 */
#ifndef K3_X86_VEC_H
#define K3_X86_VEC_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "x86_fold.h"

#define INLINE static inline __attribute__((always_inline))
/* Full unrolling of the rows x tokens loops keeps every accumulator in a
 * register (block sizes are compile-time constants at each call site). */
#define K3_UNROLL _Pragma("GCC unroll 8")

#if X86_VEC_BITS == 256
typedef __m256 xv_t;
typedef __m256i xv_mask_t;
enum { XV_LANES = 8 };
#define xv_zero() _mm256_setzero_ps()
#define xv_fma(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define xv_add(a, b) _mm256_add_ps((a), (b))
#define xv_loadx(p) _mm256_loadu_ps(p)
#define xv_hsum(v) fold_hsum8(v)
/* Lanes [0, n) set, the rest clear (n in 0..XV_LANES). */
#define xv_tail_mask(n) fold_tail_mask8(n)
#define xv_loadx_part(p, m) _mm256_maskload_ps((p), (m))

/* XV_LANES int8 -> fp32 (exact); the partial one reads only n bytes. */
INLINE xv_t xv_cvt_i8(const int8_t *p)
{
	return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

INLINE xv_t xv_cvt_i8_part(const int8_t *p, size_t n, xv_mask_t m)
{
	int8_t tmp[8] = { 0 };

	(void)m;
	memcpy(tmp, p, n);
	return xv_cvt_i8(tmp);
}
#elif X86_VEC_BITS == 512
typedef __m512 xv_t;
typedef __mmask16 xv_mask_t;
enum { XV_LANES = 16 };
#define xv_zero() _mm512_setzero_ps()
#define xv_fma(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define xv_add(a, b) _mm512_add_ps((a), (b))
#define xv_loadx(p) _mm512_loadu_ps(p)
#define xv_hsum(v) fold_hsum16(v)
#define xv_tail_mask(n) ((__mmask16)((1u << (n)) - 1u))
#define xv_loadx_part(p, m) _mm512_maskz_loadu_ps((m), (p))

INLINE xv_t xv_cvt_i8(const int8_t *p)
{
	return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}

INLINE xv_t xv_cvt_i8_part(const int8_t *p, size_t n, xv_mask_t m)
{
	(void)n;
	return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, p)));
}
#else
#error "define X86_VEC_BITS as 256 or 512 before including x86_vec.h"
#endif

/*
 * BF16 / F32 rows: NAME(nr, nt, cols, wr, xt, out, ldo, pf), nr rows x nt
 * tokens per call, out[t * ldo + i] = row i . x row t; pf (elements, 0 =
 * none) is how far ahead each row stream is prefetched, one prefetch per
 * 64-byte line of a step. LOADW(p) loads XV_LANES weights as fp32;
 * LOADWPART(p, n, m) the first n (m: their lane mask), the rest zero.
 */
#define X86_DEF_ROWS_DENSE(NAME, WT, LOADW, LOADWPART)                        \
INLINE void NAME(size_t nr, size_t nt, size_t cols, const WT *const *wr,    \
	const float *const *xt, float *out, size_t ldo, size_t pf)            \
{                                                                            \
	xv_t a0[8], a1[8];                                                       \
	size_t c = 0;                                                            \
	K3_UNROLL for (size_t k = 0; k < nr * nt; k++) {                         \
		a0[k] = xv_zero();                                                   \
		a1[k] = xv_zero();                                                   \
	}                                                                        \
	for (; c + 2 * XV_LANES <= cols; c += 2 * XV_LANES) {                    \
		K3_UNROLL for (size_t i = 0; i < nr; i++) {                          \
			xv_t w0 = LOADW(wr[i] + c), w1 = LOADW(wr[i] + c + XV_LANES);    \
			if (pf)                                                          \
				K3_UNROLL for (size_t b = 0; b < 2 * XV_LANES * sizeof(WT);  \
					b += 64)                                                 \
					_mm_prefetch((const char *)(wr[i] + c + pf) + b,         \
						_MM_HINT_T0);                                        \
			K3_UNROLL for (size_t t = 0; t < nt; t++) {                      \
				a0[i * nt + t] = xv_fma(w0, xv_loadx(xt[t] + c),             \
					a0[i * nt + t]);                                         \
				a1[i * nt + t] = xv_fma(w1, xv_loadx(xt[t] + c + XV_LANES),  \
					a1[i * nt + t]);                                         \
			}                                                                \
		}                                                                    \
	}                                                                        \
	if (c + XV_LANES <= cols) {                                              \
		K3_UNROLL for (size_t i = 0; i < nr; i++) {                          \
			xv_t w0 = LOADW(wr[i] + c);                                      \
			K3_UNROLL for (size_t t = 0; t < nt; t++)                        \
				a0[i * nt + t] = xv_fma(w0, xv_loadx(xt[t] + c),             \
					a0[i * nt + t]);                                         \
		}                                                                    \
		c += XV_LANES;                                                       \
	}                                                                        \
	if (c < cols) {                                                          \
		xv_mask_t m = xv_tail_mask(cols - c);                                \
		K3_UNROLL for (size_t i = 0; i < nr; i++) {                          \
			xv_t w0 = LOADWPART(wr[i] + c, cols - c, m);                     \
			K3_UNROLL for (size_t t = 0; t < nt; t++)                        \
				a1[i * nt + t] = xv_fma(w0, xv_loadx_part(xt[t] + c, m),     \
					a1[i * nt + t]);                                         \
		}                                                                    \
	}                                                                        \
	K3_UNROLL for (size_t i = 0; i < nr; i++)                                \
		K3_UNROLL for (size_t t = 0; t < nt; t++)                            \
			out[t * ldo + i] = xv_hsum(xv_add(a0[i * nt + t],                \
				a1[i * nt + t]));                                            \
}

/* One step of 2 x XV_LANES int8 columns of nr rows x nt tokens at C. */
#define XV_STEP_I8(C) do {                                                    \
	K3_UNROLL for (size_t i = 0; i < nr; i++) {                              \
		xv_t w0 = xv_cvt_i8(wr[i] + (C)), w1 = xv_cvt_i8(wr[i] + (C) + XV_LANES); \
		K3_UNROLL for (size_t t = 0; t < nt; t++) {                          \
			a0[i * nt + t] = xv_fma(w0, xv_loadx(xt[t] + (C)), a0[i * nt + t]); \
			a1[i * nt + t] = xv_fma(w1, xv_loadx(xt[t] + (C) + XV_LANES),    \
				a1[i * nt + t]);                                             \
		}                                                                    \
	}                                                                        \
} while (0)

/*
 * rows_i8, the int8 row kernel that kern_i8_rows.h walks (its contract
 * there) for x86_avx2_i8.c and x86_avx512_i8.c: the main
 * loop unrolled to two steps (4 x XV_LANES columns, one prefetch of pf
 * bytes ahead per row), the steps in the order above; out = scale x dot.
 */
INLINE void rows_i8(size_t nr, size_t nt, size_t cols, const int8_t *const *wr,
	const float *sc, const float *const *xt, float *out, size_t ldo, size_t pf)
{
	xv_t a0[8], a1[8];
	size_t c = 0;

	K3_UNROLL for (size_t k = 0; k < nr * nt; k++) {
		a0[k] = xv_zero();
		a1[k] = xv_zero();
	}
	for (; c + 4 * XV_LANES <= cols; c += 4 * XV_LANES) {
		if (pf)
			K3_UNROLL for (size_t i = 0; i < nr; i++)
				_mm_prefetch((const char *)(wr[i] + c + pf), _MM_HINT_T0);
		XV_STEP_I8(c);
		XV_STEP_I8(c + 2 * XV_LANES);
	}
	if (c + 2 * XV_LANES <= cols) {
		XV_STEP_I8(c);
		c += 2 * XV_LANES;
	}
	if (c + XV_LANES <= cols) {
		K3_UNROLL for (size_t i = 0; i < nr; i++) {
			xv_t w0 = xv_cvt_i8(wr[i] + c);
			K3_UNROLL for (size_t t = 0; t < nt; t++)
				a0[i * nt + t] = xv_fma(w0, xv_loadx(xt[t] + c), a0[i * nt + t]);
		}
		c += XV_LANES;
	}
	if (c < cols) {
		xv_mask_t m = xv_tail_mask(cols - c);
		K3_UNROLL for (size_t i = 0; i < nr; i++) {
			xv_t w0 = xv_cvt_i8_part(wr[i] + c, cols - c, m);
			K3_UNROLL for (size_t t = 0; t < nt; t++)
				a1[i * nt + t] = xv_fma(w0, xv_loadx_part(xt[t] + c, m),
					a1[i * nt + t]);
		}
	}
	K3_UNROLL for (size_t i = 0; i < nr; i++)
		K3_UNROLL for (size_t t = 0; t < nt; t++)
			out[t * ldo + i] = sc[i] * xv_hsum(xv_add(a0[i * nt + t], a1[i * nt + t]));
}
#undef XV_STEP_I8

#endif

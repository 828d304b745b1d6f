/*
 * x86_fold.h - internal: the last steps every x86 row kernel shares (the
 * BF16/F32/MXFP4 kernels of x86_avx2.c and x86_avx512.c, the int8 ones of
 * x86_avx2_i8.c and x86_avx512_i8.c), so their fixed reduction trees end
 * the same documented way: the horizontal sum 8 -> 4 (low half + high
 * half) -> 2 -> 1 (16 -> 8 first for a zmm), and the lane mask of a
 * partial block. Inline only; compiled with the including file's -m flags.
 */
#ifndef K3_X86_FOLD_H
#define K3_X86_FOLD_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

/* 8 -> 4 -> 2 -> 1; fold_hsum16 first folds 16 -> 8 the same way. */
static inline __attribute__((always_inline)) float fold_hsum8(__m256 v)
{
	__m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));

	a = _mm_add_ps(a, _mm_movehl_ps(a, a));
	a = _mm_add_ss(a, _mm_movehdup_ps(a));
	return _mm_cvtss_f32(a);
}

#if defined(__AVX512F__)
static inline __attribute__((always_inline)) float fold_hsum16(__m512 v)
{
	return fold_hsum8(_mm256_add_ps(_mm512_castps512_ps256(v),
		_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))));
}
#endif

/* Lanes [0, n) all-ones, the rest zero (n in 0..8). */
static inline __attribute__((always_inline)) __m256i fold_tail_mask8(size_t n)
{
	static const int32_t m[16] = { -1, -1, -1, -1, -1, -1, -1, -1,
		0, 0, 0, 0, 0, 0, 0, 0 };

	return _mm256_loadu_si256((const __m256i *)(m + 8 - n));
}

#endif

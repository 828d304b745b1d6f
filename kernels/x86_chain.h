/*
 * x86_chain.h - internal: the x86 ops whose every output element is one
 * FMA chain in a fixed order (transposed product, axpy, KDA step, the
 * code of kern_chain.h at 8 lanes), shared by the AVX2 and AVX-512 ISA
 * files (with x86_fold.h, the horizontal sums their row kernels end with),
 * and the bf16 load both use. Included by each, so it compiles with that
 * file's -m flags; the lane width never changes an element's bits, so
 * both tables give the same results here.
 *
 * Functions are static: each including file gets its own copy, compiled
 * for its ISA.
 */
#ifndef K3_X86_CHAIN_H
#define K3_X86_CHAIN_H

#include <immintrin.h>
#include <string.h>

#include "kern_ops.h"
#include "x86_fold.h"

/* 8 bf16 -> 8 fp32 (exact: the bf16 bits are the top half). */
static inline __attribute__((always_inline)) __m256 chain_bf16x8(const uint16_t *p)
{
	__m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));

	return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

/* kern_chain.h's vocabulary at 8 lanes (the AVX-512 file too: the lane
 * width does not change these ops' bits). */
typedef __m256 kc_t;
enum { KC_LANES = 8 };
#define kc_zero() _mm256_setzero_ps()
#define kc_set1(s) _mm256_set1_ps(s)
#define kc_load(p) _mm256_loadu_ps(p)
#define kc_store(p, v) _mm256_storeu_ps((p), (v))
#define kc_load_bf16(p) chain_bf16x8(p)
#define kc_mul(a, b) _mm256_mul_ps((a), (b))
#define kc_fma(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define KC_PREFIX x86
#include "kern_chain.h"

#endif

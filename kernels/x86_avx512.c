/*
 * x86_avx512.c - the AVX-512 ISA: native 16-lane matrix products (built
 * with -mavx512f/bw/vl/dq; chosen at run time only when cpuid reports
 * AVX-512 F, BW, VL and DQ with the zmm state enabled by the OS).
 *
 * Fixed reduction orders (the batch-invariance contract of kern_ops.h).
 * They are not the AVX2 orders, so the two ISAs round differently; each is
 * fixed, and within one ISA a result never depends on T, the row range or
 * the thread count:
 *
 *  BF16/F32 row . x: two 16-lane accumulators over 32-column steps
 *    (acc0 += cols 32i..32i+15, acc1 += cols 32i+16..32i+31, FMA); a
 *    remaining 16-block into acc0; a final partial block (masked loads,
 *    absent lanes +0) into acc1; then acc0 + acc1 folded 16 -> 8 -> 4 ->
 *    2 -> 1 (hsum16: low 256 bits + high 256 bits, then hsum8).
 *  MXFP4 row . x: blocks of 128 columns (64 packed bytes = four groups).
 *    The block is one zmm of 16 dwords; dword j holds columns 8j..8j+7,
 *    nibble k of it column 8j + k. vpermps reads only bits 0..3 of each
 *    index, so w_k = vpermps(dwords >> 4k, E2M1 table) decodes nibble k
 *    of all 16 dwords, sign included, in one shuffle: lane j of w_k is
 *    column 8j + k, and lanes 4g..4g+3 hold group g of the block. x is
 *    copied once per call into that lane order (perm_x). Per block:
 *      p0 = w0 x0 (mul), then FMA w1 x1, w2 x2, w3 x3 into p0;
 *      p1 = w4 x4 (mul), then FMA w5 x5, w6 x6, w7 x7 into p1;
 *      acc = fma(p0 + p1, S, acc),  S lane j = 2^(s[g] - 127), g = j / 4
 *    and fold_hsum16(acc) at the end. A last block of 32, 64 or 96 columns is
 *    zero-padded (codes and x); its absent groups get scale 2^-127, which
 *    only ever multiplies +0. S is exact: s << 23 is 2^(s-127) for s in
 *    1..255 (255 gives inf, as the AVX2 table does), and s = 0 is set to
 *    the subnormal 2^-127 by an unsigned max (docs/model.md §9: no flush to
 *    zero).
 *  The same inline row kernel serves every (rows x tokens) block size, so
 *  a y element is the same bits whether T = 1 or T = 64 and however the
 *  rows are split among threads.
 *  Transposed product, axpy, KDA step: the FMA chains of x86_chain.h
 *  (bit-identical to AVX2). Elementwise transcendentals use the AVX2
 *  table (kern_dispatch.c).
 *
 * Why this decode: on AVX2 the MXFP4 kernel is bound by the shuffle and
 * shift ports (30 vector ops per 64 weights, docs/kernels.md). Here 128
 * weights take 7 shifts, 8 vpermps and 10 FP ops, plus 4 integer ops for
 * the scales: about twice the AVX2 kernel's rate on the same core, at or
 * near the memory bandwidth on one thread (docs/kernels.md).
 */
#include <immintrin.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "kern_ops.h"
#include "x86_chain.h"
#define X86_VEC_BITS 512
#include "x86_vec.h"

INLINE __m512 load_bf16x16(const uint16_t *p)
{
	__m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));

	return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}

INLINE __m512 load_bf16_part(const uint16_t *p, size_t n, __mmask16 m)
{
	__m512i v = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p));

	(void)n;
	return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}

INLINE __m512 load_f32_part(const float *p, size_t n, __mmask16 m)
{
	(void)n;
	return _mm512_maskz_loadu_ps(m, p);
}

/* ------------------------------------------------------------------ */
/* BF16 / F32 rows: NR rows x NT tokens per call, 2 accumulators each
 * (x86_vec.h).                                                        */

X86_DEF_ROWS_DENSE(rows_bf16, uint16_t, load_bf16x16, load_bf16_part)
X86_DEF_ROWS_DENSE(rows_f32, float, _mm512_loadu_ps, load_f32_part)

/* ------------------------------------------------------------------ */
/* MXFP4 rows                                                           */

enum { MX_BLOCK = 128 };   /* columns per decoded block (64 bytes, 4 groups) */

/* Stack scratch for permuted x, in floats (64 KiB): up to 4 tokens of
 * K3's 3584-column rows per pass; rows wider than this read x with
 * gathers instead (same lanes, same bits). */
enum { PERM_SCRATCH = 16384 };

/* Permuted x of the tokens sharing a pass is re-read for every row, so it
 * must stay in L1 (48 KiB on Zen 5) beside the weight stream: at most this
 * many bytes of it per pass (one token always). Measured, 256x3584, one
 * thread: 4 tokens per pass (57 KiB of x) ran at 33 GMAC/s, 2 tokens at
 * 67. */
enum { X_L1_BYTES = 32768 };

/* Bytes ahead of the current block that each row stream prefetches. */
enum { MX_PREFETCH = 4096 };

static const float e2m1_tab[16] __attribute__((aligned(64))) = K3_KERN_E2M1_VALUES;

/* x[128b + 8j + k] -> xp[128b + 16k + j] for every block b of
 * ceil(cols / 128), zero past cols. */
static void perm_x(size_t cols, const float *x, float *xp)
{
	size_t nb = (cols + MX_BLOCK - 1) / MX_BLOCK;

	for (size_t b = 0; b < nb; b++)
		for (size_t k = 0; k < 8; k++)
			for (size_t j = 0; j < 16; j++) {
				size_t c = MX_BLOCK * b + 8 * j + k;

				xp[MX_BLOCK * b + 16 * k + j] = c < cols ? x[c] : 0.0f;
			}
}

/* The eight weight vectors of one block (lane order above). */
INLINE void decode_block(__m512i v, __m512 lut, __m512 w[8])
{
	w[0] = _mm512_permutexvar_ps(v, lut);
	w[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), lut);
	w[2] = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 8), lut);
	w[3] = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 12), lut);
	w[4] = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 16), lut);
	w[5] = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 20), lut);
	w[6] = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 24), lut);
	w[7] = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 28), lut);
}

/* Lane j = 2^(s[j / 4] - 127) from the block's four E8M0 bytes (as one
 * little-endian word), exact for every s: s << 23 for s >= 1, the
 * subnormal 2^-127 (bits 0x00400000) for s = 0. */
INLINE __m512 block_scales(uint32_t s4)
{
	const __m512i sh = _mm512_set_epi32(24, 24, 24, 24, 16, 16, 16, 16,
		8, 8, 8, 8, 0, 0, 0, 0);
	__m512i s = _mm512_and_si512(_mm512_srlv_epi32(_mm512_set1_epi32((int)s4), sh),
		_mm512_set1_epi32(0xFF));
	/* s >= 1 gives at least 0x00800000, so an unsigned max with the bits
	 * of 2^-127 changes only s = 0 */
	return _mm512_castsi512_ps(_mm512_max_epu32(_mm512_slli_epi32(s, 23),
		_mm512_set1_epi32(0x00400000)));
}

/* x vector k of block b for one token: from the permuted copy, or (rows
 * wider than PERM_SCRATCH) gathered from x in the same lane order; m
 * masks the lanes past cols in a last partial block. */
INLINE __m512 block_x(const float *xb, size_t k, bool perm, __mmask16 m)
{
	const __m512i j8 = _mm512_set_epi32(120, 112, 104, 96, 88, 80, 72, 64,
		56, 48, 40, 32, 24, 16, 8, 0);

	if (perm)
		return _mm512_loadu_ps(xb + 16 * k);
	return _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m,
		_mm512_add_epi32(j8, _mm512_set1_epi32((int)k)), xb, 4);
}

INLINE __m512 block_dot(const __m512 w[8], __m512 s, const float *xb, bool perm,
	__mmask16 m, __m512 acc)
{
	__m512 p0 = _mm512_mul_ps(w[0], block_x(xb, 0, perm, m));
	__m512 p1 = _mm512_mul_ps(w[4], block_x(xb, 4, perm, m));

	p0 = _mm512_fmadd_ps(w[1], block_x(xb, 1, perm, m), p0);
	p1 = _mm512_fmadd_ps(w[5], block_x(xb, 5, perm, m), p1);
	p0 = _mm512_fmadd_ps(w[2], block_x(xb, 2, perm, m), p0);
	p1 = _mm512_fmadd_ps(w[6], block_x(xb, 6, perm, m), p1);
	p0 = _mm512_fmadd_ps(w[3], block_x(xb, 3, perm, m), p0);
	p1 = _mm512_fmadd_ps(w[7], block_x(xb, 7, perm, m), p1);
	return _mm512_fmadd_ps(_mm512_add_ps(p0, p1), s, acc);
}

/*
 * nr rows x nt tokens. pr[i], sr[i]: packed bytes and scales of row i;
 * xt[t]: token t's x, permuted (perm) or as given. perm is a compile-time
 * constant at each call site.
 */
INLINE void rows_mxfp4(size_t nr, size_t nt, size_t cols,
	const uint8_t *const *pr, const uint8_t *const *sr,
	const float *const *xt, float *out, size_t ldo, bool perm)
{
	const __m512 lut = _mm512_load_ps(e2m1_tab);
	const size_t nfull = cols / MX_BLOCK, tail = cols % MX_BLOCK;
	__m512 acc[8];

	K3_UNROLL for (size_t k = 0; k < nr * nt; k++)
		acc[k] = _mm512_setzero_ps();
	for (size_t b = 0; b < nfull; b++) {
		K3_UNROLL for (size_t i = 0; i < nr; i++) {
			__m512 w[8], s;
			uint32_t s4;

			_mm_prefetch((const char *)(pr[i] + 64 * b + MX_PREFETCH), _MM_HINT_T0);
			decode_block(_mm512_loadu_si512(pr[i] + 64 * b), lut, w);
			memcpy(&s4, sr[i] + 4 * b, 4);
			s = block_scales(s4);
			K3_UNROLL for (size_t t = 0; t < nt; t++)
				acc[i * nt + t] = block_dot(w, s, xt[t] + MX_BLOCK * b, perm,
					0xFFFF, acc[i * nt + t]);
		}
	}
	if (tail) {   /* 32, 64 or 96 columns: 1..3 groups */
		size_t b = nfull, ng = tail / 32;
		__mmask64 mb = (__mmask64)((1ull << (16 * ng)) - 1);

		K3_UNROLL for (size_t i = 0; i < nr; i++) {
			__m512 w[8], s;
			uint32_t s4 = 0;

			decode_block(_mm512_maskz_loadu_epi8(mb, pr[i] + 64 * b), lut, w);
			memcpy(&s4, sr[i] + 4 * b, ng);
			s = block_scales(s4);
			K3_UNROLL for (size_t t = 0; t < nt; t++)
				acc[i * nt + t] = block_dot(w, s, xt[t] + MX_BLOCK * b, perm,
					xv_tail_mask(4 * ng), acc[i * nt + t]);
		}
	}
	K3_UNROLL for (size_t i = 0; i < nr; i++)
		K3_UNROLL for (size_t t = 0; t < nt; t++)
			out[t * ldo + i] = fold_hsum16(acc[i * nt + t]);
}

/* ------------------------------------------------------------------ */

/* x permuted for the MXFP4 kernels (one layout here). */
INLINE void x86_perm(bool pair, size_t cols, const float *x, float *xp)
{
	(void)pair;
	perm_x(cols, x, xp);
}

/* ROW_TILE, DENSE_SHORT_ROW: x86_rows.h. */
#include "x86_rows.h"

/* Rows per call at T = 1 for MXFP4 (measured: see docs/kernels.md). */
enum { MX_ROWS = 1 };

/* Block shapes (K3_KERN_BLOCK): T = 1 takes NR rows at once (dense rows: 4, see
 * DENSE_SHORT_ROW; MXFP4: MX_ROWS); T > 1 takes 1 row x up to 4 tokens
 * (weights decoded once per 4 tokens). All call the same row kernel, so
 * results match. */

static void x86_matmul_rows(const struct k3_kern_mat *w, size_t r0, size_t r1,
	size_t T, const float *x, size_t ldx, float *y, size_t ldy)
{
	const size_t cols = w->cols, ld = w->ld ? w->ld : w->cols;
	const bool mx = w->dtype == K3_KERN_DT_MXFP4;
	const size_t padded = (cols + MX_BLOCK - 1) / MX_BLOCK * MX_BLOCK;
	/* token slots of permuted x (64 KiB of stack, no allocation) */
	float xperm[PERM_SCRATCH] __attribute__((aligned(64)));
	/* tokens per permuted pass: 1..4 as L1 allows, 0 if one does not fit
	 * the scratch (gather path) */
	const size_t l1_slots = X_L1_BYTES / (padded * sizeof(float));
	const size_t want = l1_slots > 4 ? 4 : l1_slots > 1 ? l1_slots : 1;
	const size_t slots = PERM_SCRATCH / padded < want ? PERM_SCRATCH / padded : want;
	const bool perm = mx && slots >= 1;
	const size_t elem = w->dtype == K3_KERN_DT_BF16 ? 2 : 4;
	const struct x86_walk wk = {
		.nr1 = mx ? MX_ROWS : ld * elem <= DENSE_SHORT_ROW ? 1 : 4,
		.max_nt = perm ? slots : 4,
		.perm = perm,
		.xperm = xperm,
		.perm_stride = padded,
		.pair = false,
	};

	x86_matmul_walk(w, r0, r1, T, x, ldx, y, ldy, &wk);
}

const struct k3_kern_ops k3_kern_ops_avx512 = { K3_KERN_OPS_INIT(K3_KERN_ISA_AVX512, x86) };

/*
 * x86_avx2.c - the AVX2 + FMA ISA (built with -mavx2 -mfma; chosen at run
 * time only when cpuid reports both).
 *
 * Fixed reduction orders (the batch-invariance contract of kern_ops.h):
 *
 *  BF16/F32 row . x: two 8-lane accumulators over 16-column steps
 *    (acc0 += cols 16i..16i+7, acc1 += cols 16i+8..16i+15, FMA); a
 *    remaining 8-block goes to acc0, a final partial block (zero-padded) to
 *    acc1; then (acc0 + acc1) is folded 8 -> 4 -> 2 -> 1 (hsum8).
 *  MXFP4 row . x: per 32-column group g, four decoded 8-lane vectors
 *    w0..w3 give p = (w0 x0 + w1 x1) + (w2 x2 + w3 x3) (mul then FMA,
 *    pairwise add) and acc = fma(p, group scale, acc): one scale multiply
 *    per group; hsum8 at the end. For cols <= 16384 the vectors hold the
 *    group's columns in the fixed permuted lane order of perm_col()
 *    (bf16-pattern decode, no int->float conversions); when cols is also a
 *    multiple of 64 (every K3 MXFP4 matrix) two groups are decoded at once
 *    and reduced as described at rows_mxfp4_pair(); wider matrices use the
 *    column-order int8 decode (rows_mxfp4).
 *  The same inline row kernel serves every (rows x tokens) block size, so a
 *  y element is the same bits whether T = 1 or T = 64 and however the rows
 *  are split among threads.
 *  Transposed product, axpy, KDA step: elementwise FMA chains in row order
 *  (x86_chain.h, shared with the AVX-512 file).
 */
#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "kern_ops.h"
#include "x86_chain.h"
#define X86_VEC_BITS 256
#include "x86_vec.h"

INLINE __m256 load_bf16_part(const uint16_t *p, size_t n, __m256i m)
{
	uint16_t tmp[8] = { 0 };

	(void)m;
	memcpy(tmp, p, n * sizeof(*p));
	return chain_bf16x8(tmp);
}

INLINE __m256 load_f32_part(const float *p, size_t n, __m256i m)
{
	(void)n;
	return _mm256_maskload_ps(p, m);
}

/* ------------------------------------------------------------------ */
/* BF16 / F32 rows: NR rows x NT tokens per call, 2 accumulators each
 * (x86_vec.h).                                                        */

X86_DEF_ROWS_DENSE(rows_bf16, uint16_t, chain_bf16x8, load_bf16_part)
X86_DEF_ROWS_DENSE(rows_f32, float, _mm256_loadu_ps, load_f32_part)

/* ------------------------------------------------------------------ */
/* MXFP4 rows                                                           */

/* 2 x E2M1 (§9) as int8, so the decode is exact integer work; the 1/2 is
 * folded into the group scale 2^(s-128). */
static const int8_t e2m1x2[16] = { 0, 1, 2, 3, 4, 6, 8, 12,
	0, -1, -2, -3, -4, -6, -8, -12 };

/* 2^(s-128) for every E8M0 byte s, so a group's scale is one broadcast
 * load (no integer-to-vector move on the hot path). Exact powers of two,
 * subnormal for s < 2 (docs/model.md §9: do not flush to zero). */
static float scale_tab[257];
static pthread_once_t scale_once = PTHREAD_ONCE_INIT;

static void scale_init(void)
{
	for (int s = 0; s < 257; s++)        /* [256] = 2^128 = inf (s = 255) */
		scale_tab[s] = ldexpf(1.0f, s - 128);
}

/* 16 packed bytes (32 columns) -> four 8-lane vectors in column order. */
INLINE void decode_group(const uint8_t *p, __m128i lut, __m256 w[4])
{
	const __m128i m = _mm_set1_epi8(0x0F);
	__m128i v = _mm_loadu_si128((const __m128i *)p);
	__m128i lo = _mm_shuffle_epi8(lut, _mm_and_si128(v, m));
	__m128i hi = _mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(v, 4), m));
	__m128i a = _mm_unpacklo_epi8(lo, hi);     /* columns 0..15 */
	__m128i b = _mm_unpackhi_epi8(lo, hi);     /* columns 16..31 */

	w[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(a));
	w[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(a, 8)));
	w[2] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
	w[3] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8)));
}

INLINE __m256 group_dot(const __m256 w[4], const float *x)
{
	__m256 p0 = _mm256_mul_ps(w[0], _mm256_loadu_ps(x));
	__m256 p1 = _mm256_mul_ps(w[2], _mm256_loadu_ps(x + 16));

	p0 = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(x + 8), p0);
	p1 = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(x + 24), p1);
	return _mm256_add_ps(p0, p1);
}

/*
 * Permuted-x MXFP4 path (cols <= PERM_SCRATCH: every K3 MXFP4 matrix).
 * No int->float conversion at all: two pshufb LUTs give the high and low
 * bytes of each code's bf16 bit pattern (E2M1 values are exact in bf16:
 * 0.5 = 0x3F00 ... 6 = 0x40C0, sign in bit 15), one byte-unpack forms the
 * bf16 words, and a shift / an AND turn word pairs into fp32 lanes. One
 * group of 32 columns: idx = [low nibbles | high nibbles] (even | odd
 * columns), then four vectors A_lo, B_lo, A_hi, B_hi whose lane order is
 * fixed by perm_col(); x is copied into that order once per call.
 * Reduction per group: p = (A_lo x + B_lo x) + (A_hi x + B_hi x) (mul,
 * FMA, add), acc = fma(p, 2^(s-127), acc); hsum8 at the end.
 */
/* Stack scratch for permuted x, in floats: 4 tokens of up to 4096 columns
 * or fewer tokens of wider rows (the token-group size never changes an
 * element's arithmetic). */
enum { PERM_SCRATCH = 16384 };

/* Column (within its group) of lane k (0..7) of vector v (0..3). */
static inline size_t perm_col(int v, int k)
{
	int j = 8 * (v >> 1) + 2 * (k & 3) + (v & 1);   /* nibble index 0..15 */

	return (size_t)(2 * j + (k >> 2));               /* lanes 4..7: odd */
}

static void perm_x(size_t cols, const float *x, float *xp)
{
	for (size_t g = 0; g < cols / 32; g++)
		for (int v = 0; v < 4; v++)
			for (int k = 0; k < 8; k++)
				xp[32 * g + 8 * v + k] = x[32 * g + perm_col(v, k)];
}

/* high and low bytes of bf16(E2M1[code]) */
static const uint8_t e2m1_hb[16] = { 0x00, 0x3F, 0x3F, 0x3F, 0x40, 0x40, 0x40, 0x40,
	0x80, 0xBF, 0xBF, 0xBF, 0xC0, 0xC0, 0xC0, 0xC0 };
static const uint8_t e2m1_lb[16] = { 0x00, 0x00, 0x80, 0xC0, 0x00, 0x40, 0x80, 0xC0,
	0x00, 0x00, 0x80, 0xC0, 0x00, 0x40, 0x80, 0xC0 };

INLINE void decode_perm(const uint8_t *p, __m256i lut_hb, __m256i lut_lb,
	__m256 w[4])
{
	const __m256i m = _mm256_set1_epi8(0x0F);
	const __m256i hi16 = _mm256_set1_epi32((int)0xFFFF0000u);
	__m128i v = _mm_loadu_si128((const __m128i *)p);
	__m256i idx = _mm256_and_si256(_mm256_inserti128_si256(
		_mm256_castsi128_si256(v), _mm_srli_epi16(v, 4), 1), m);
	__m256i hb = _mm256_shuffle_epi8(lut_hb, idx);
	__m256i lb = _mm256_shuffle_epi8(lut_lb, idx);
	__m256i wlo = _mm256_unpacklo_epi8(lb, hb);    /* nibbles 0..7 as bf16 */
	__m256i whi = _mm256_unpackhi_epi8(lb, hb);    /* nibbles 8..15 */

	w[0] = _mm256_castsi256_ps(_mm256_slli_epi32(wlo, 16));
	w[1] = _mm256_castsi256_ps(_mm256_and_si256(wlo, hi16));
	w[2] = _mm256_castsi256_ps(_mm256_slli_epi32(whi, 16));
	w[3] = _mm256_castsi256_ps(_mm256_and_si256(whi, hi16));
}

/* acc[i * nt + t] -> out[t * ldo + i]: the final 8 -> 1 fold of every
 * MXFP4 row kernel. */
INLINE void store_rows(size_t nr, size_t nt, const __m256 *acc, float *out, size_t ldo)
{
	K3_UNROLL for (size_t i = 0; i < nr; i++)
		K3_UNROLL for (size_t t = 0; t < nt; t++)
			out[t * ldo + i] = fold_hsum8(acc[i * nt + t]);
}

/* One 32-column group per step. perm (a compile-time constant at each call
 * site): the bf16-pattern decode into perm_col() lane order, scale
 * 2^(s-127); otherwise the column-order int8 decode (2 x E2M1), scale
 * 2^(s-128). The rest of the reduction is the same. */
INLINE void rows_mxfp4(size_t nr, size_t nt, size_t cols,
	const uint8_t *const *pr, const uint8_t *const *sr,
	const float *const *xt, float *out, size_t ldo, bool perm)
{
	const __m128i lut = _mm_loadu_si128((const __m128i *)e2m1x2);
	const __m256i lut_hb = _mm256_broadcastsi128_si256(
		_mm_loadu_si128((const __m128i *)e2m1_hb));
	const __m256i lut_lb = _mm256_broadcastsi128_si256(
		_mm_loadu_si128((const __m128i *)e2m1_lb));
	__m256 acc[8];

	K3_UNROLL for (size_t k = 0; k < nr * nt; k++)
		acc[k] = _mm256_setzero_ps();
	for (size_t g = 0; g < cols / 32; g++) {
		K3_UNROLL for (size_t i = 0; i < nr; i++) {
			__m256 w[4];
			__m256 s = _mm256_broadcast_ss(&scale_tab[sr[i][g] + (perm ? 1 : 0)]);

			if (perm) {
				_mm_prefetch((const char *)(pr[i] + nr * (cols / 2) + 16 * g), _MM_HINT_T0);
				decode_perm(pr[i] + 16 * g, lut_hb, lut_lb, w);
			} else {
				_mm_prefetch((const char *)(pr[i] + 16 * g + 512), _MM_HINT_T0);
				decode_group(pr[i] + 16 * g, lut, w);
			}
			K3_UNROLL for (size_t t = 0; t < nt; t++)
				acc[i * nt + t] = _mm256_fmadd_ps(group_dot(w, xt[t] + 32 * g),
					s, acc[i * nt + t]);
		}
	}
	store_rows(nr, nt, acc, out, ldo);
}

/*
 * Pair-of-groups MXFP4 path (cols a multiple of 64 and <= PERM_SCRATCH:
 * every K3 MXFP4 matrix). One 32-byte load holds groups g (bytes 0..15,
 * 128-bit lane 0) and g+1 (lane 1), so the nibble split, the two pshufb
 * LUTs and the byte unpacks each serve 64 columns at once and no
 * cross-lane insert is needed; the two scales form one [s_g x4 | s_g+1 x4]
 * vector. Eight fp32 vectors A_e, A_o, B_e, B_o, C_e, C_o, D_e, D_o (lane
 * order: perm64_col()); reduction per pair:
 *   p0 = A_e x0 (mul), then FMA A_o x1, B_e x2, B_o x3 into p0;
 *   p1 = C_e x4 (mul), then FMA C_o x5, D_e x6, D_o x7 into p1;
 *   acc = fma(p0 + p1, scales, acc); fold_hsum8(acc) at the end.
 * Why: the shuffle ports are what bound this kernel on AVX2 (Zen 3: FP1/FP2
 * carry every shuffle and shift and FP1 half the FMAs); per 64 weights this
 * issues 8 shuffles + 1 insert instead of 10, with the same 8 shift/AND ops.
 */
static inline size_t perm64_col(int v, int k)
{
	int q = v >> 1, o = v & 1, h = k >> 2, j = k & 3;

	return (size_t)(32 * h + 16 * (q & 1) + (q >> 1) + 4 * j + 2 * o);
}

static void perm64_x(size_t cols, const float *x, float *xp)
{
	for (size_t g = 0; g < cols / 64; g++)
		for (int v = 0; v < 8; v++)
			for (int k = 0; k < 8; k++)
				xp[64 * g + 8 * v + k] = x[64 * g + perm64_col(v, k)];
}

/* Bytes ahead of the current pair that each row stream prefetches: far
 * enough to cover DRAM latency at the decode rate (measured 512..2048
 * about equal, 1024 best on Zen 3). */
enum { MX64_PREFETCH = 1024 };
/* Rows per call at T = 1: one row keeps all eight weight vectors, the
 * eight x vectors and the accumulator in registers; 2 and 4 rows measured
 * 10-25 % slower (spills). */
enum { MX64_ROWS = 1 };

INLINE void rows_mxfp4_pair(size_t nr, size_t nt, size_t cols,
	const uint8_t *const *pr, const uint8_t *const *sr,
	const float *const *xp, float *out, size_t ldo)
{
	const __m256i lut_hb = _mm256_broadcastsi128_si256(
		_mm_loadu_si128((const __m128i *)e2m1_hb));
	const __m256i lut_lb = _mm256_broadcastsi128_si256(
		_mm_loadu_si128((const __m128i *)e2m1_lb));
	const __m256i m = _mm256_set1_epi8(0x0F);
	const __m256i hi16 = _mm256_set1_epi32((int)0xFFFF0000u);
	__m256 acc[8];

	K3_UNROLL for (size_t k = 0; k < nr * nt; k++)
		acc[k] = _mm256_setzero_ps();
	for (size_t g = 0; g < cols / 32; g += 2) {
		K3_UNROLL for (size_t i = 0; i < nr; i++) {
			__m256i v, il, ih, a, b, c, d, hb, lb;
			__m256 w[8], s;

			_mm_prefetch((const char *)(pr[i] + 16 * g + MX64_PREFETCH), _MM_HINT_T0);
			v = _mm256_loadu_si256((const __m256i *)(pr[i] + 16 * g));
			il = _mm256_and_si256(v, m);
			ih = _mm256_and_si256(_mm256_srli_epi16(v, 4), m);
			hb = _mm256_shuffle_epi8(lut_hb, il);
			lb = _mm256_shuffle_epi8(lut_lb, il);
			a = _mm256_unpacklo_epi8(lb, hb);
			b = _mm256_unpackhi_epi8(lb, hb);
			hb = _mm256_shuffle_epi8(lut_hb, ih);
			lb = _mm256_shuffle_epi8(lut_lb, ih);
			c = _mm256_unpacklo_epi8(lb, hb);
			d = _mm256_unpackhi_epi8(lb, hb);
			w[0] = _mm256_castsi256_ps(_mm256_slli_epi32(a, 16));
			w[1] = _mm256_castsi256_ps(_mm256_and_si256(a, hi16));
			w[2] = _mm256_castsi256_ps(_mm256_slli_epi32(b, 16));
			w[3] = _mm256_castsi256_ps(_mm256_and_si256(b, hi16));
			w[4] = _mm256_castsi256_ps(_mm256_slli_epi32(c, 16));
			w[5] = _mm256_castsi256_ps(_mm256_and_si256(c, hi16));
			w[6] = _mm256_castsi256_ps(_mm256_slli_epi32(d, 16));
			w[7] = _mm256_castsi256_ps(_mm256_and_si256(d, hi16));
			s = _mm256_insertf128_ps(
				_mm256_castps128_ps256(_mm_broadcast_ss(&scale_tab[sr[i][g] + 1])),
				_mm_broadcast_ss(&scale_tab[sr[i][g + 1] + 1]), 1);
			K3_UNROLL for (size_t t = 0; t < nt; t++) {
				const float *x = xp[t] + 32 * g;
				__m256 p0 = _mm256_mul_ps(w[0], _mm256_loadu_ps(x));
				__m256 p1 = _mm256_mul_ps(w[4], _mm256_loadu_ps(x + 32));

				p0 = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(x + 8), p0);
				p1 = _mm256_fmadd_ps(w[5], _mm256_loadu_ps(x + 40), p1);
				p0 = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(x + 16), p0);
				p1 = _mm256_fmadd_ps(w[6], _mm256_loadu_ps(x + 48), p1);
				p0 = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(x + 24), p0);
				p1 = _mm256_fmadd_ps(w[7], _mm256_loadu_ps(x + 56), p1);
				acc[i * nt + t] = _mm256_fmadd_ps(_mm256_add_ps(p0, p1), s,
					acc[i * nt + t]);
			}
		}
	}
	store_rows(nr, nt, acc, out, ldo);
}

/* T = 1 over rows [r, r1): the row loop sits next to the inline kernel so
 * a short row (K3's smallest MXFP4 rows are 1536 bytes, a demo model's
 * 256) pays only two pointer increments between rows, not the block
 * dispatch of x86_matmul_rows. Same row kernel, same bits. */
static void mx64_rows_t1(size_t cols, const uint8_t *data, const uint8_t *scales,
	size_t r, size_t r1, const float *xp, float *out)
{
	const uint8_t *pr = data + r * (cols / 2), *sr = scales + r * (cols / 32);

	for (; r < r1; r++, pr += cols / 2, sr += cols / 32, out++)
		rows_mxfp4_pair(1, 1, cols, &pr, &sr, &xp, out, 1);
}

/* ------------------------------------------------------------------ */

/* x permuted for the pair or the column-order MXFP4 kernels. */
INLINE void x86_perm(bool pair, size_t cols, const float *x, float *xp)
{
	if (pair)
		perm64_x(cols, x, xp);
	else
		perm_x(cols, x, xp);
}

/* ROW_TILE, DENSE_SHORT_ROW: x86_rows.h. */
#define X86_ROWS_HAVE_PAIR
#include "x86_rows.h"

/* Block shapes (K3_KERN_BLOCK): T = 1 takes 4 rows at once (independent FMA chains hide
 * latency, 4 weight streams); T > 1 takes 1 row x 4 tokens (weights decoded
 * once per 4 tokens). Both call the same row kernel, so results match. */
static void x86_matmul_rows(const struct k3_kern_mat *w, size_t r0, size_t r1,
	size_t T, const float *x, size_t ldx, float *y, size_t ldy)
{
	size_t cols = w->cols, ld = w->ld ? w->ld : w->cols;
	/* token slots of permuted x (64 KiB of stack, no allocation) */
	float xperm[PERM_SCRATCH] __attribute__((aligned(32)));
	size_t slots = PERM_SCRATCH / cols > 4 ? 4 : PERM_SCRATCH / cols;
	bool perm = w->dtype == K3_KERN_DT_MXFP4 && slots >= 1;
	bool pair = perm && cols % 64 == 0;
	size_t elem = w->dtype == K3_KERN_DT_BF16 ? 2 : 4;
	const struct x86_walk wk = {
		/* rows per call at T = 1 (the pair path keeps its eight weight
		 * vectors in registers only with few rows; short dense rows stream
		 * best one at a time, see DENSE_SHORT_ROW) */
		.nr1 = pair ? MX64_ROWS : w->dtype == K3_KERN_DT_MXFP4 ? 4 :
			ld * elem <= DENSE_SHORT_ROW ? 1 : 4,
		.max_nt = perm ? slots : 4,
		.perm = perm,
		.xperm = xperm,
		.perm_stride = cols,
		.pair = pair,
	};

	if (w->dtype == K3_KERN_DT_MXFP4)
		pthread_once(&scale_once, scale_init);
	x86_matmul_walk(w, r0, r1, T, x, ldx, y, ldy, &wk);
}

const struct k3_kern_ops k3_kern_ops_avx2 = { K3_KERN_OPS_INIT(K3_KERN_ISA_AVX2, x86) };

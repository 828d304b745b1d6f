/*
 * x86_avx2_elem.c - AVX2 + FMA elementwise transcendentals (exp, sigmoid,
 * SiLU, tanh, SiTU-GLU, KDA decay) and a streaming transposed product: the
 * table k3_kern_elem_avx2 of kern_ops.h. Part of the k3kern_avx2 static
 * library (-mavx2 -mfma); kept apart from x86_avx2.c, whose matmul code is
 * tuned separately.
 *
 * Why: libm's expf/tanhf are scalar calls (about 10-20 ns each with the
 * expm1f inside tanhf); a decode token of the "mid" model runs about 230k
 * of them, on the engine thread while the other compute threads wait. Here
 * eight lanes take about as long as one libm call.
 *
 * Determinism: every lane is computed by the same instruction sequence,
 * and a tail of fewer than 8 elements is copied into a zero-padded vector
 * and run through the same code, so an element's result depends only on
 * its own inputs: never on n, on its index, on the batch or on the thread
 * (batch invariance). No FP environment state is read or changed.
 *
 * Accuracy (measured against libm and against double precision over dense
 * sweeps; asserted by tests/kernels/test_kern_elem.c, see docs/kernels.md):
 *   exp      Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2, degree-7
 *            Taylor polynomial in Horner form (truncation 5e-9 relative),
 *            2^n applied as two exact power-of-two products so subnormal
 *            results and n = 128 need no special case. x > 88.73 -> +inf,
 *            x < -103.98 -> 0, NaN -> NaN.
 *   tanh     |z| < 0.5: z + z^3 p(z^2), the Taylor series through z^19
 *            (truncation < 1e-10); |z| >= 0.5: 1 - 2/(e^{2|z|} + 1) with the
 *            sign of z (no cancellation: tanh(0.5) = 0.46).
 *   sigmoid  1 / (1 + exp(-x)), the formula of the libm path.
 */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "kern_ops.h"

#define INLINE static inline __attribute__((always_inline))

/* exp(x) for 8 lanes (see the top for the method and its range). */
INLINE __m256 v_exp(__m256 x)
{
	const __m256 log2e = _mm256_set1_ps(1.44269504088896341f);
	const __m256 ln2_hi = _mm256_set1_ps(0.693147182464599609375f);
	const __m256 ln2_lo = _mm256_set1_ps(-1.904654323148236e-09f);
	__m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
	__m256 xc = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-104.0f)),
		_mm256_set1_ps(89.0f));
	__m256 n = _mm256_round_ps(_mm256_mul_ps(xc, log2e),
		_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
	/* fnmadd rounds once: r = x - n ln2_hi is exact to within one rounding
	 * of a value <= 0.35, then the low part of ln2 */
	__m256 r = _mm256_fnmadd_ps(n, ln2_hi, xc);
	__m256 p;
	__m256i ni, n1, n2;
	__m256 s1, s2, y;

	r = _mm256_fnmadd_ps(n, ln2_lo, r);
	p = _mm256_set1_ps(1.0f / 5040.0f);
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
	/* n in [-150, 128]: 2^n = 2^n1 2^n2 with both halves normal */
	ni = _mm256_cvtps_epi32(n);
	n1 = _mm256_srai_epi32(ni, 1);
	n2 = _mm256_sub_epi32(ni, n1);
	s1 = _mm256_castsi256_ps(_mm256_slli_epi32(
		_mm256_add_epi32(n1, _mm256_set1_epi32(127)), 23));
	s2 = _mm256_castsi256_ps(_mm256_slli_epi32(
		_mm256_add_epi32(n2, _mm256_set1_epi32(127)), 23));
	y = _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
	return _mm256_blendv_ps(y, _mm256_add_ps(x, x), nan);
}

INLINE __m256 v_sigmoid(__m256 x)
{
	const __m256 one = _mm256_set1_ps(1.0f);
	__m256 e = v_exp(_mm256_sub_ps(_mm256_setzero_ps(), x));

	return _mm256_div_ps(one, _mm256_add_ps(one, e));
}

INLINE __m256 v_tanh(__m256 z)
{
	const __m256 sign = _mm256_set1_ps(-0.0f);
	const __m256 one = _mm256_set1_ps(1.0f);
	__m256 a = _mm256_andnot_ps(sign, z);
	__m256 a2 = _mm256_mul_ps(a, a);
	__m256 p, small, e, big, r;

	/* Taylor coefficients of tanh: 2^2k (2^2k - 1) B_2k / (2k)! */
	p = _mm256_set1_ps(-443861162.0f / 1856156927625.0f);
	p = _mm256_fmadd_ps(p, a2, _mm256_set1_ps(6404582.0f / 10854718875.0f));
	p = _mm256_fmadd_ps(p, a2, _mm256_set1_ps(-929569.0f / 638512875.0f));
	p = _mm256_fmadd_ps(p, a2, _mm256_set1_ps(21844.0f / 6081075.0f));
	p = _mm256_fmadd_ps(p, a2, _mm256_set1_ps(-1382.0f / 155925.0f));
	p = _mm256_fmadd_ps(p, a2, _mm256_set1_ps(62.0f / 2835.0f));
	p = _mm256_fmadd_ps(p, a2, _mm256_set1_ps(-17.0f / 315.0f));
	p = _mm256_fmadd_ps(p, a2, _mm256_set1_ps(2.0f / 15.0f));
	p = _mm256_fmadd_ps(p, a2, _mm256_set1_ps(-1.0f / 3.0f));
	small = _mm256_fmadd_ps(_mm256_mul_ps(a, a2), p, a);

	e = v_exp(_mm256_add_ps(a, a));
	big = _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.0f),
		_mm256_add_ps(e, one)));
	r = _mm256_blendv_ps(big, small,
		_mm256_cmp_ps(a, _mm256_set1_ps(0.5f), _CMP_LT_OQ));
	/* both branches are >= 0 (or NaN): tanh is odd, -0 stays -0 */
	return _mm256_or_ps(r, _mm256_and_ps(sign, z));
}

/* Each entry point below: full 8-lane blocks straight from memory, then
 * the tail through a zero-padded copy, so tail lanes run the same code. */

/* y = f(x) elementwise; f is a constant at every call site, so it inlines. */
INLINE void map8(size_t n, const float *x, float *y, __m256 (*f)(__m256))
{
	size_t i = 0;

	for (; i + 8 <= n; i += 8)
		_mm256_storeu_ps(y + i, f(_mm256_loadu_ps(x + i)));
	if (i < n) {
		float b[8] = { 0 };

		memcpy(b, x + i, (n - i) * sizeof(float));
		_mm256_storeu_ps(b, f(_mm256_loadu_ps(b)));
		memcpy(y + i, b, (n - i) * sizeof(float));
	}
}

static void avx2_exp_shift(size_t n, const float *x, float shift, float *y)
{
	__m256 sh = _mm256_set1_ps(shift);
	size_t i = 0;

	for (; i + 8 <= n; i += 8)
		_mm256_storeu_ps(y + i, v_exp(_mm256_sub_ps(_mm256_loadu_ps(x + i), sh)));
	if (i < n) {
		float b[8] = { 0 };

		memcpy(b, x + i, (n - i) * sizeof(float));
		_mm256_storeu_ps(b, v_exp(_mm256_sub_ps(_mm256_loadu_ps(b), sh)));
		memcpy(y + i, b, (n - i) * sizeof(float));
	}
}

static void avx2_sigmoid(size_t n, const float *x, float *y)
{
	map8(n, x, y, v_sigmoid);
}

INLINE __m256 v_silu(__m256 x)
{
	return _mm256_mul_ps(x, v_sigmoid(x));
}

static void avx2_silu(size_t n, const float *x, float *y)
{
	map8(n, x, y, v_silu);
}

static void avx2_tanh(size_t n, const float *x, float *y)
{
	map8(n, x, y, v_tanh);
}

/* The operation order of the libm path (kern_elem.c): (b1 tanh(g/b1))
 * sigmoid(g), times b2 tanh(u/b2) (or u), divisions kept as divisions. */
INLINE __m256 v_situ(__m256 g, __m256 u, __m256 b1, __m256 b2, int cap_up)
{
	__m256 a = _mm256_mul_ps(_mm256_mul_ps(b1, v_tanh(_mm256_div_ps(g, b1))),
		v_sigmoid(g));
	__m256 up = cap_up ? _mm256_mul_ps(b2, v_tanh(_mm256_div_ps(u, b2))) : u;

	return _mm256_mul_ps(a, up);
}

static void avx2_situ_glu(size_t n, const float *g, const float *u, float beta1,
	float beta2, float *act)
{
	int cap = beta2 > 0.0f;
	__m256 b1, b2;
	size_t i = 0;

	if (beta1 <= 0.0f)
		beta1 = 1.0f;
	b1 = _mm256_set1_ps(beta1);
	b2 = _mm256_set1_ps(cap ? beta2 : 1.0f);
	for (; i + 8 <= n; i += 8)
		_mm256_storeu_ps(act + i, v_situ(_mm256_loadu_ps(g + i),
			_mm256_loadu_ps(u + i), b1, b2, cap));
	if (i < n) {
		float bg[8] = { 0 }, bu[8] = { 0 };

		memcpy(bg, g + i, (n - i) * sizeof(float));
		memcpy(bu, u + i, (n - i) * sizeof(float));
		_mm256_storeu_ps(bg, v_situ(_mm256_loadu_ps(bg), _mm256_loadu_ps(bu),
			b1, b2, cap));
		memcpy(act + i, bg, (n - i) * sizeof(float));
	}
}

INLINE __m256 v_decay(__m256 f, __m256 dt, __m256 A, __m256 lb)
{
	return v_exp(_mm256_mul_ps(lb, v_sigmoid(_mm256_mul_ps(A,
		_mm256_add_ps(f, dt)))));
}

static void avx2_kda_decay(size_t n, const float *f, const float *dt_bias,
	float A, float lower_bound, float *alpha)
{
	__m256 av = _mm256_set1_ps(A), lb = _mm256_set1_ps(lower_bound);
	size_t i = 0;

	for (; i + 8 <= n; i += 8)
		_mm256_storeu_ps(alpha + i, v_decay(_mm256_loadu_ps(f + i),
			_mm256_loadu_ps(dt_bias + i), av, lb));
	if (i < n) {
		float bf[8] = { 0 }, bd[8] = { 0 };

		memcpy(bf, f + i, (n - i) * sizeof(float));
		memcpy(bd, dt_bias + i, (n - i) * sizeof(float));
		_mm256_storeu_ps(bf, v_decay(_mm256_loadu_ps(bf), _mm256_loadu_ps(bd),
			av, lb));
		memcpy(alpha + i, bf, (n - i) * sizeof(float));
	}
}

/* ------------------------------------------------------------------ */
/* Transposed product, streaming W in storage order                    */

INLINE __m256 load_w8(const struct k3_kern_mat *w, size_t r, size_t ld, size_t c)
{
	if (w->dtype == K3_KERN_DT_BF16) {
		__m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)w->data + r * ld + c));

		return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
	}
	return _mm256_loadu_ps((const float *)w->data + r * ld + c);
}

static float load_w1(const struct k3_kern_mat *w, size_t r, size_t ld, size_t c)
{
	float f;

	if (w->dtype == K3_KERN_DT_BF16) {
		uint32_t u = (uint32_t)((const uint16_t *)w->data)[r * ld + c] << 16;

		memcpy(&f, &u, sizeof(f));
		return f;
	}
	return ((const float *)w->data)[r * ld + c];
}

/*
 * y[t][c] = sum_r W[r][c] x[t][r] for c in [c0, c1): the same FMA chain in
 * r order from +0 as k3_kern_ops.matmul_t_cols (so bit-identical to it for
 * every element), but W is read row after row in storage order, once for
 * all T, with y kept in L1. The column-block form of x86_avx2.c reads each
 * row 8 times with a 512-byte stride (one cache line per pass) for K3's
 * 128 x 512 WUK_h, which the prefetcher hides poorly: at decode it ran at
 * about a tenth of the GEMV's bandwidth.
 */
static void avx2_matmul_t_stream(const struct k3_kern_mat *w, size_t c0,
	size_t c1, size_t T, const float *x, size_t ldx, float *y, size_t ldy)
{
	size_t ld = w->ld ? w->ld : w->cols;

	for (size_t t = 0; t < T; t++)
		memset(y + t * ldy + c0, 0, (c1 - c0) * sizeof(float));
	for (size_t r = 0; r < w->rows; r++) {
		for (size_t t = 0; t < T; t++) {
			float xs = x[t * ldx + r];
			__m256 xr = _mm256_set1_ps(xs);
			float *yt = y + t * ldy;
			size_t c = c0;

			for (; c + 8 <= c1; c += 8)
				_mm256_storeu_ps(yt + c, _mm256_fmadd_ps(load_w8(w, r, ld, c),
					xr, _mm256_loadu_ps(yt + c)));
			for (; c < c1; c++)
				yt[c] = fmaf(load_w1(w, r, ld, c), xs, yt[c]);
		}
	}
}

const struct k3_kern_elem_ops k3_kern_elem_avx2 = {
	K3_KERN_ELEM_INIT(K3_KERN_ISA_AVX2, avx2),
	.matmul_t_cols = avx2_matmul_t_stream,
};

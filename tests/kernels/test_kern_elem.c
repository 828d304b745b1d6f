/*
 * test_kern_elem.c - accuracy and invariance of the elementwise
 * transcendentals (kern_ops.h: struct k3_kern_elem_ops) of every ISA this
 * CPU runs: libm in the ref ISA, polynomial kernels on AVX2.
 *
 * Accuracy: a dense sweep over float bit patterns (every STRIDE-th pattern
 * of each range; K3_ELEM_STRIDE overrides, 1 = every float) against the
 * double-precision function rounded to float, in ulps (distance in the
 * ordered float encoding, so subnormal results count in subnormal ulps).
 * The bounds asserted are the measured maxima of docs/kernels.md with a
 * little margin. Also printed: the error against libm's float functions.
 *
 * Invariance: a value is bit-identical whether computed alone (n = 1), in
 * a block of 8, or in a run starting at any offset (tail lanes).
 *
 * The table's streaming transposed product (AVX2) is bit-identical to the
 * ISA's k3_kern_ops.matmul_t_cols.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3_kernels.h"
#include "kern_ops.h"
#include "kern_test_util.h"
#include "t.h"

enum { BATCH = 4099 };   /* not a multiple of 8: every call has a tail */

static int64_t ordered(float f)
{
	int32_t i;

	memcpy(&i, &f, sizeof(i));
	return i < 0 ? (int64_t)INT32_MIN - i : i;
}

static int64_t ulp_dist(float a, float b)
{
	int64_t d = ordered(a) - ordered(b);

	return d < 0 ? -d : d;
}

static float from_bits(uint32_t u)
{
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

enum fn { FN_EXP, FN_SIGMOID, FN_SILU, FN_TANH, FN_COUNT };

static const char *const fn_name[FN_COUNT] = { "exp", "sigmoid", "silu", "tanh" };

static double ref_d(enum fn f, double x)
{
	switch (f) {
	case FN_EXP:
		return exp(x);
	case FN_SIGMOID:
		return 1.0 / (1.0 + exp(-x));
	case FN_SILU:
		return x / (1.0 + exp(-x));
	default:
		return tanh(x);
	}
}

static float libm_f(enum fn f, float x)
{
	switch (f) {
	case FN_EXP:
		return expf(x);
	case FN_SIGMOID:
		return 1.0f / (1.0f + expf(-x));
	case FN_SILU:
		return x * (1.0f / (1.0f + expf(-x)));
	default:
		return tanhf(x);
	}
}

static void run_fn(const struct k3_kern_elem_ops *el, enum fn f, size_t n,
	const float *x, float *y)
{
	switch (f) {
	case FN_EXP:
		el->exp_shift(n, x, 0.0f, y);
		break;
	case FN_SIGMOID:
		el->sigmoid(n, x, y);
		break;
	case FN_SILU:
		el->silu(n, x, y);
		break;
	default:
		el->tanh(n, x, y);
		break;
	}
}

struct err_stats {
	int64_t max_ulp, max_ulp_libm;
	double max_rel;
	float worst_x;
};

/* Sweeps the bit patterns of [lo, hi] (both signs handled by the caller
 * giving two ranges of one sign each) with the given stride. */
static void sweep(const struct k3_kern_elem_ops *el, enum fn f, float lo, float hi,
	uint32_t stride, struct err_stats *st, float *x, float *y)
{
	/* iterate magnitudes |v| in [0, max(|lo|,|hi|)] for each sign in range */
	for (int sgn = 0; sgn < 2; sgn++) {
		float lim = sgn ? -lo : hi;
		uint32_t top, u;
		size_t n = 0;

		if (lim < 0.0f)
			continue;
		memcpy(&top, &lim, sizeof(top));
		for (u = 0;; u += stride) {
			int last = u >= top || u + stride < u;

			if (u > top)
				u = top;
			x[n++] = from_bits(u | (sgn ? 0x80000000u : 0u));
			if (n == BATCH || last) {
				run_fn(el, f, n, x, y);
				for (size_t i = 0; i < n; i++) {
					double r = ref_d(f, (double)x[i]);
					float rf = (float)r;
					int64_t d = ulp_dist(y[i], rf);
					int64_t dl = ulp_dist(y[i], libm_f(f, x[i]));
					double rel = r != 0.0 && isfinite(r)
						? fabs(((double)y[i] - r) / r) : 0.0;

					/* below the normal range the relative error
					 * is meaningless; ulps still count */
					if (fabs(r) < 1e-37)
						rel = 0.0;
					if (d > st->max_ulp) {
						st->max_ulp = d;
						st->worst_x = x[i];
					}
					if (dl > st->max_ulp_libm)
						st->max_ulp_libm = dl;
					if (rel > st->max_rel)
						st->max_rel = rel;
				}
				n = 0;
			}
			if (last)
				break;
		}
	}
}

/* Bounds in ulps against the correctly rounded value (measured maxima in
 * docs/kernels.md, plus margin). ref = libm float functions. */
static const int64_t bound_ref[FN_COUNT] = { 1, 2, 3, 2 };
static const int64_t bound_avx2[FN_COUNT] = { 2, 3, 4, 4 };

static void test_accuracy(const struct k3_kern_elem_ops *el, uint32_t stride)
{
	static float x[BATCH], y[BATCH];
	/* sigmoid / SiLU below -88.7: exp(-x) overflows, so the formula of
	 * both paths (1 / (1 + exp(-x))) gives 0 instead of a subnormal */
	static const float lo[FN_COUNT] = { -104.0f, -88.0f, -88.0f, -30.0f };
	static const float hi[FN_COUNT] = { 88.7f, 110.0f, 110.0f, 30.0f };
	const int64_t *bound = el->isa == K3_KERN_ISA_REF ? bound_ref : bound_avx2;

	for (int f = 0; f < FN_COUNT; f++) {
		struct err_stats st = { 0 };

		sweep(el, (enum fn)f, lo[f], hi[f], stride, &st, x, y);
		printf("%-6s %-8s max %lld ulp (at x = %.9g), max rel %.3g, vs libm max %lld ulp\n",
			k3_kern_isa_name(el->isa), fn_name[f], (long long)st.max_ulp,
			(double)st.worst_x, st.max_rel, (long long)st.max_ulp_libm);
		T_OK(st.max_ulp <= bound[f]);
		T_OK(st.max_rel < 4e-7);
	}
}

static void test_special(const struct k3_kern_elem_ops *el)
{
	const float in[6] = { INFINITY, -INFINITY, NAN, -0.0f, 89.0f, -200.0f };
	float e[6], s[6], t[6];

	el->exp_shift(6, in, 0.0f, e);
	el->sigmoid(6, in, s);
	el->tanh(6, in, t);
	T_OK(isinf(e[0]) && e[0] > 0 && e[1] == 0.0f && isnan(e[2]) && e[3] == 1.0f);
	T_OK(isinf(e[4]) && e[5] == 0.0f);
	T_OK(s[0] == 1.0f && s[1] == 0.0f && isnan(s[2]) && s[3] == 0.5f);
	T_OK(s[4] == 1.0f && s[5] == 0.0f);
	T_OK(t[0] == 1.0f && t[1] == -1.0f && isnan(t[2]));
	T_OK(t[3] == 0.0f && signbit(t[3]));
	T_OK(t[4] == 1.0f && t[5] == -1.0f);
	/* just around the overflow threshold: finite below, inf above */
	{
		float a[2] = { 88.72f, 88.73f }, b[2];

		el->exp_shift(2, a, 0.0f, b);
		T_OK(isfinite(b[0]) && ulp_dist(b[0], (float)exp((double)a[0])) <= 2);
		T_OK(isinf(b[1]));
	}
}

/* SiTU-GLU (K3 betas 4 and 25, and the uncapped up) and the KDA decay
 * against double precision on random inputs of the magnitudes K3 sees. */
static void test_composites(const struct k3_kern_elem_ops *el)
{
	enum { N = 20011 };
	static float g[N], u[N], act[N], f[N], dt[N], al[N];
	double worst = 0.0, worst_d = 0.0;

	for (size_t i = 0; i < N; i++) {
		g[i] = kt_unif() * 40.0f;
		u[i] = kt_unif() * (i % 3 ? 40.0f : 400.0f);
		f[i] = kt_unif() * 8.0f;
		dt[i] = kt_unif() * 2.0f;
	}
	for (int cap = 0; cap < 2; cap++) {
		float b2 = cap ? 25.0f : 0.0f;

		el->situ_glu(N, g, u, 4.0f, b2, act);
		for (size_t i = 0; i < N; i++) {
			double gd = g[i], ud = u[i];
			double a = 4.0 * tanh(gd / 4.0) / (1.0 + exp(-gd));
			double up = cap ? 25.0 * tanh(ud / 25.0) : ud;
			double r = a * up;
			/* relative to the magnitude of the factors: act can be
			 * near zero where g or u is */
			double scale = fabs(r) > 1e-30 ? fabs(r) : 1e-30;
			double e = fabs((double)act[i] - r) / scale;

			if (e > worst)
				worst = e;
		}
	}
	el->kda_decay(N, f, dt, 1.7f, -5.0f, al);
	for (size_t i = 0; i < N; i++) {
		double z = 1.7 * ((double)f[i] + dt[i]);
		double r = exp(-5.0 / (1.0 + exp(-z)));
		double e = fabs((double)al[i] - r) / r;

		if (e > worst_d)
			worst_d = e;
	}
	printf("%-6s situ_glu max rel %.3g, kda_decay max rel %.3g\n",
		k3_kern_isa_name(el->isa), worst, worst_d);
	/* a few fp32 roundings of ~1 ulp each, plus the input rounding of
	 * g/beta and the f + dt sum amplified by at most |z| */
	T_OK(worst < 2e-6);
	T_OK(worst_d < 2e-6);
}

/* Every element's value is independent of n and of its position. */
static void test_invariance(const struct k3_kern_elem_ops *el)
{
	enum { N = 77 };
	float x[N], u[N], full[N], one[N], part[N];

	for (size_t i = 0; i < N; i++) {
		x[i] = kt_unif() * 30.0f;
		u[i] = kt_unif() * 60.0f;
	}
	for (int f = 0; f < FN_COUNT; f++) {
		run_fn(el, (enum fn)f, N, x, full);
		for (size_t i = 0; i < N; i++)
			run_fn(el, (enum fn)f, 1, x + i, one + i);
		for (size_t i = 0; i < N; i += 13)
			run_fn(el, (enum fn)f, N - i < 13 ? N - i : 13, x + i, part + i);
		T_EQ_MEM(full, one, sizeof(full));
		T_EQ_MEM(full, part, sizeof(full));
	}
	el->situ_glu(N, x, u, 4.0f, 25.0f, full);
	for (size_t i = 0; i < N; i++)
		el->situ_glu(1, x + i, u + i, 4.0f, 25.0f, one + i);
	for (size_t i = 0; i < N; i += 5)
		el->situ_glu(N - i < 5 ? N - i : 5, x + i, u + i, 4.0f, 25.0f, part + i);
	T_EQ_MEM(full, one, sizeof(full));
	T_EQ_MEM(full, part, sizeof(full));
	el->kda_decay(N, x, u, 0.9f, -5.0f, full);
	for (size_t i = 0; i < N; i++)
		el->kda_decay(1, x + i, u + i, 0.9f, -5.0f, one + i);
	T_EQ_MEM(full, one, sizeof(full));
	/* in place equals out of place */
	memcpy(part, x, sizeof(part));
	el->sigmoid(N, part, part);
	el->sigmoid(N, x, full);
	T_EQ_MEM(full, part, sizeof(full));
}

/* A table's transposed product (when it has one) is bit-identical to the
 * ISA's matmul_t_cols: same FMA chain per element, only the memory order
 * differs. Odd shapes, padded ld, sub-ranges of columns, T up to 9. */
static void test_matmul_t(const struct k3_kern_elem_ops *el, const struct k3_kern_ops *ops)
{
	static const size_t shapes[][5] = {
		/* rows, cols, ld, T, dtype */
		{ 128, 512, 512, 1, K3_KERN_DT_BF16 },
		{ 128, 256, 256, 1, K3_KERN_DT_BF16 },
		{ 7, 45, 53, 3, K3_KERN_DT_BF16 },
		{ 150, 256, 320, 8, K3_KERN_DT_F32 },
		{ 1, 9, 9, 9, K3_KERN_DT_F32 },
		{ 33, 131, 140, 2, K3_KERN_DT_F32 },
	};

	if (!el->matmul_t_cols)
		return;
	for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
		size_t R = shapes[s][0], C = shapes[s][1], ld = shapes[s][2], T = shapes[s][3];
		int bf = shapes[s][4] == K3_KERN_DT_BF16;
		void *wd = kt_alloc(R * ld * (bf ? 2 : 4));
		float *x = kt_alloc(T * R * sizeof(float));
		float *y0 = kt_alloc(T * C * sizeof(float)), *y1 = kt_alloc(T * C * sizeof(float));
		struct k3_kern_mat m = { .dtype = bf ? K3_KERN_DT_BF16 : K3_KERN_DT_F32,
			.rows = R, .cols = C, .ld = ld, .data = wd };

		if (bf)
			kt_fill_bf16(wd, R * ld);
		else
			kt_fill(wd, R * ld);
		kt_fill(x, T * R);
		ops->matmul_t_cols(&m, 0, C, T, x, R, y0, C);
		el->matmul_t_cols(&m, 0, C, T, x, R, y1, C);
		T_EQ_MEM(y0, y1, T * C * sizeof(float));
		/* a sub-range writes only its columns, with the same values */
		memset(y1, 0xAB, T * C * sizeof(float));
		el->matmul_t_cols(&m, C / 3, C, T, x, R, y1, C);
		for (size_t t = 0; t < T; t++)
			T_EQ_MEM(y0 + t * C + C / 3, y1 + t * C + C / 3, (C - C / 3) * sizeof(float));
		T_OK(((const uint8_t *)y1)[0] == 0xAB || C / 3 == 0);
		free(wd);
		free(x);
		free(y0);
		free(y1);
	}
}

/* The public entry points use the active ISA's table. */
static void test_public(void)
{
	const struct k3_kern_elem_ops *el = k3_kern_elem_active();
	float x[19], a[19], b[19];

	T_OK(el == k3_kern_elem_for(k3_kern_active_isa()));
	for (size_t i = 0; i < 19; i++)
		x[i] = kt_unif() * 12.0f;
	k3_kern_sigmoid(19, x, a);
	el->sigmoid(19, x, b);
	T_EQ_MEM(a, b, sizeof(a));
	k3_kern_silu(19, x, a);
	el->silu(19, x, b);
	T_EQ_MEM(a, b, sizeof(a));
	memcpy(a, x, sizeof(a));
	k3_kern_softmax(19, a);
	{
		float mx = x[0], sum = 0.0f;

		for (size_t i = 1; i < 19; i++)
			mx = x[i] > mx ? x[i] : mx;
		el->exp_shift(19, x, mx, b);
		for (size_t i = 0; i < 19; i++)
			sum += b[i];
		for (size_t i = 0; i < 19; i++)
			b[i] *= 1.0f / sum;
		T_EQ_MEM(a, b, sizeof(a));
	}
}

int main(void)
{
	uint32_t stride = 257;
	const char *s = getenv("K3_ELEM_STRIDE");

	if (s && *s) {
		uint32_t v = 0;
		size_t i = 0;

		for (; s[i] >= '0' && s[i] <= '9' && v <= 1u << 20; i++)
			v = v * 10 + (uint32_t)(s[i] - '0');
		if (s[i] == '\0' && v >= 1 && v <= 1u << 20)
			stride = v;
	}
	for (int isa = 0; isa < K3_KERN_ISA_COUNT; isa++) {
		const struct k3_kern_elem_ops *el = k3_kern_elem_for((enum k3_kern_isa)isa);

		if (!el || (isa != K3_KERN_ISA_REF && el == &k3_kern_elem_ref))
			continue;
		if (isa == K3_KERN_ISA_AVX512 && el == k3_kern_elem_for(K3_KERN_ISA_AVX2)) {
			/* the same elementwise table, already tested; but the
			 * AVX-512 ops table has its own transposed product */
			test_matmul_t(el, k3_kern_ops_for(K3_KERN_ISA_AVX512));
			continue;
		}
		test_accuracy(el, stride);
		test_special(el);
		test_composites(el);
		test_invariance(el);
		test_matmul_t(el, k3_kern_ops_for((enum k3_kern_isa)isa));
	}
	test_public();
	return t_done();
}

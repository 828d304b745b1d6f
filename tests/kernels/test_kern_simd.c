/*
 * test_kern_simd.c - every SIMD ISA this CPU runs against the scalar
 * reference, op by op, over odd shapes (columns not a multiple of the
 * vector width, single rows, tails). Tolerances are named and relative to
 * the magnitude of the summed terms, since the two paths add in different
 * (each fixed) orders.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kern_ops.h"
#include "kern_test_util.h"
#include "t.h"

/* |simd - ref| <= TOL_SUM * sum_i |a_i b_i| (+ tiny floor) for reductions;
 * FMA vs mul+add and tree vs serial order differ by a few ulps of the
 * partial sums, far below 1e-5 of the absolute sum for n <= 4096. */
#define TOL_SUM 1e-5
#define TOL_FLOOR 1e-30

static int n_isa_tested;

static double abs_dot_bf16(size_t n, const uint16_t *w, const float *x)
{
	double s = 0;

	for (size_t i = 0; i < n; i++) {
		uint32_t u = (uint32_t)w[i] << 16;
		float f;

		memcpy(&f, &u, sizeof(f));
		s += fabs((double)f * x[i]);
	}
	return s;
}

static void check_matmul(const struct k3_kern_ops *simd, enum k3_kern_dtype dt,
	size_t rows, size_t cols, size_t T)
{
	const struct k3_kern_ops *ref = &k3_kern_ops_ref;
	size_t ld = dt == K3_KERN_DT_MXFP4 ? cols : cols + (cols % 3);
	uint16_t *wb = NULL;
	float *wf = NULL;
	uint8_t *wp = NULL, *ws = NULL;
	struct k3_kern_mat m = { .dtype = dt, .rows = rows, .cols = cols };
	float *x = kt_alloc(T * cols * sizeof(float));
	float *y0 = kt_alloc(T * rows * sizeof(float));
	float *y1 = kt_alloc(T * rows * sizeof(float));
	int bad = 0;

	kt_fill(x, T * cols);
	if (dt == K3_KERN_DT_BF16) {
		wb = kt_alloc(rows * ld * 2);
		kt_fill_bf16(wb, rows * ld);
		m.data = wb;
		m.ld = ld;
	} else if (dt == K3_KERN_DT_F32) {
		wf = kt_alloc(rows * ld * 4);
		kt_fill(wf, rows * ld);
		m.data = wf;
		m.ld = ld;
	} else {
		wp = kt_alloc(rows * cols / 2);
		ws = kt_alloc(rows * cols / 32);
		kt_fill_bytes(wp, rows * cols / 2);
		kt_fill_scales(ws, rows * cols / 32);
		m.data = wp;
		m.scales = ws;
	}
	ref->matmul_rows(&m, 0, rows, T, x, cols, y0, rows);
	simd->matmul_rows(&m, 0, rows, T, x, cols, y1, rows);
	for (size_t t = 0; t < T; t++) {
		for (size_t r = 0; r < rows; r++) {
			double mag;
			double d = fabs((double)y0[t * rows + r] - y1[t * rows + r]);

			if (dt == K3_KERN_DT_BF16) {
				mag = abs_dot_bf16(cols, wb + r * ld, x + t * cols);
			} else if (dt == K3_KERN_DT_F32) {
				mag = 0;
				for (size_t c = 0; c < cols; c++)
					mag += fabs((double)wf[r * ld + c] * x[t * cols + c]);
			} else {
				mag = 0;   /* |w| <= 6 * 2^-6 for scales 121..127 */
				for (size_t c = 0; c < cols; c++)
					mag += 6.0 * ldexp(1.0, ws[r * cols / 32 + c / 32] - 127) *
						fabs(x[t * cols + c]);
			}
			if (!(d <= TOL_SUM * mag + TOL_FLOOR) && bad++ < 3)
				printf("  %s dt %d %zux%zu T %zu: y[%zu][%zu] ref %.9g simd %.9g\n",
					k3_kern_isa_name(simd->isa), (int)dt, rows, cols, T,
					t, r, y0[t * rows + r], y1[t * rows + r]);
		}
	}
	T_EQ_INT(bad, 0);
	free(x), free(y0), free(y1), free(wb), free(wf), free(wp), free(ws);
}

static void check_matmul_t(const struct k3_kern_ops *simd, size_t rows,
	size_t cols, size_t T, enum k3_kern_dtype dt)
{
	size_t ld = cols + 5;
	void *w = kt_alloc(rows * ld * 4);
	struct k3_kern_mat m = { .dtype = dt, .rows = rows, .cols = cols, .ld = ld, .data = w };
	float *x = kt_alloc(T * rows * 4), *y0 = kt_alloc(T * cols * 4), *y1 = kt_alloc(T * cols * 4);
	int bad = 0;

	if (dt == K3_KERN_DT_BF16)
		kt_fill_bf16(w, rows * ld);
	else
		kt_fill(w, rows * ld);
	kt_fill(x, T * rows);
	k3_kern_ops_ref.matmul_t_cols(&m, 0, cols, T, x, rows, y0, cols);
	simd->matmul_t_cols(&m, 0, cols, T, x, rows, y1, cols);
	for (size_t i = 0; i < T * cols; i++)
		if (!(fabs((double)y0[i] - y1[i]) <= TOL_SUM * rows + TOL_FLOOR))
			bad++;
	T_EQ_INT(bad, 0);
	free(w), free(x), free(y0), free(y1);
}

static void check_vec(const struct k3_kern_ops *simd)
{
	static const size_t ns[] = { 1, 3, 7, 8, 9, 15, 16, 17, 31, 33, 100, 1027 };

	for (size_t k = 0; k < sizeof(ns) / sizeof(ns[0]); k++) {
		size_t n = ns[k];
		float *a = kt_alloc(n * 4), *b = kt_alloc(n * 4);
		float *y0 = kt_alloc(n * 4), *y1 = kt_alloc(n * 4);
		double mag = 0, sq = 0;
		int bad = 0;

		kt_fill(a, n);
		kt_fill(b, n);
		for (size_t i = 0; i < n; i++) {
			mag += fabs((double)a[i] * b[i]);
			sq += (double)a[i] * a[i];
		}
		T_NEAR(simd->dot(n, a, b), k3_kern_ops_ref.dot(n, a, b), TOL_SUM * mag);
		T_NEAR(simd->sumsq(n, a), k3_kern_ops_ref.sumsq(n, a), TOL_SUM * sq);
		memcpy(y0, b, n * 4);
		memcpy(y1, b, n * 4);
		k3_kern_ops_ref.axpy(n, 0.37f, a, y0);
		simd->axpy(n, 0.37f, a, y1);
		for (size_t i = 0; i < n; i++)
			if (!(fabs((double)y0[i] - y1[i]) <= 1e-6))
				bad++;
		T_EQ_INT(bad, 0);
		free(a), free(b), free(y0), free(y1);
	}
}

static void check_kda(const struct k3_kern_ops *simd, size_t dk, size_t dv)
{
	float *S0 = kt_alloc(dk * dv * 4), *S1 = kt_alloc(dk * dv * 4);
	float *q = kt_alloc(dk * 4), *k = kt_alloc(dk * 4), *al = kt_alloc(dk * 4);
	float *v = kt_alloc(dv * 4), *o0 = kt_alloc(dv * 4), *o1 = kt_alloc(dv * 4);
	float *sc = kt_alloc(2 * dv * 4);
	int bad = 0;

	kt_fill(S0, dk * dv);
	memcpy(S1, S0, dk * dv * 4);
	for (int step = 0; step < 5; step++) {
		kt_fill(q, dk);
		kt_fill(k, dk);
		k3_kern_l2norm(dk, k, 1e-6f, 1.0f, k);
		kt_fill(v, dv);
		for (size_t i = 0; i < dk; i++)
			al[i] = 0.5f + 0.5f * fabsf(kt_unif());
		k3_kern_ops_ref.kda_step(dk, dv, S0, q, k, v, al, 0.6f, o0, sc);
		simd->kda_step(dk, dv, S1, q, k, v, al, 0.6f, o1, sc);
		for (size_t j = 0; j < dv; j++)
			if (!(fabs((double)o0[j] - o1[j]) <= 1e-5 * dk))
				bad++;
	}
	for (size_t i = 0; i < dk * dv; i++)
		if (!(fabs((double)S0[i] - S1[i]) <= 1e-5))
			bad++;
	T_EQ_INT(bad, 0);
	free(S0), free(S1), free(q), free(k), free(al), free(v), free(o0), free(o1), free(sc);
}

/*
 * MXFP4 with E8M0 scales across the whole range (docs/model.md §9): s = 0
 * must give the subnormal 2^-127, never 0 (no flush to zero), and large
 * scales must not overflow (up to 252: above it 6 * 2^(s-127) itself is
 * not a finite fp32 weight, and the reference dequantizes to fp32). One row per scale byte, every group of
 * it at that scale; widths 128 (one full AVX-512 block) and 160 (a block
 * plus a one-group tail). Checked against the exact sum in double,
 * relative to sum |w x| (a flushed or wrong scale is off by ~100 %).
 */
static void check_mxfp4_scales(const struct k3_kern_ops *ops)
{
	static const uint8_t sv[] = { 0, 1, 2, 64, 126, 127, 128, 200, 251, 252 };
	static const size_t widths[] = { 128, 160 };
	static const double e2m1[16] = { 0, .5, 1, 1.5, 2, 3, 4, 6,
		-0.0, -.5, -1, -1.5, -2, -3, -4, -6 };
	int bad = 0;

	for (size_t wi = 0; wi < 2; wi++) {
		size_t C = widths[wi], R = sizeof(sv);
		uint8_t *p = kt_alloc(R * C / 2), *sc = kt_alloc(R * C / 32);
		float *x = kt_alloc(C * 4), *y = kt_alloc(R * 4);
		struct k3_kern_mat m = { .dtype = K3_KERN_DT_MXFP4, .rows = R, .cols = C,
			.data = p, .scales = sc };

		kt_fill_bytes(p, R * C / 2);
		for (size_t r = 0; r < R; r++)
			memset(sc + r * C / 32, sv[r], C / 32);
		for (size_t c = 0; c < C; c++)
			x[c] = kt_unif();
		ops->matmul_rows(&m, 0, R, 1, x, C, y, R);
		/* rows with s >= 128 again with |x| < 2^-12, which keeps
		 * 160 * 6 * 2^125 * |x| finite; y of the other rows stays */
		for (size_t c = 0; c < C; c++)
			x[c] *= 0x1p-12f;
		ops->matmul_rows(&m, 6, R, 1, x, C, y + 6, R);
		for (size_t c = 0; c < C; c++)
			x[c] *= 0x1p12f;
		for (size_t r = 0; r < R; r++) {
			double xs = r >= 6 ? 0x1p-12 : 1.0;
			double want = 0, mag = 0, sf = ldexp(1.0, (int)sv[r] - 127);

			for (size_t c = 0; c < C; c++) {
				uint8_t b = p[r * C / 2 + c / 2];
				double t = e2m1[(c & 1) ? b >> 4 : b & 15] * sf * (x[c] * xs);

				want += t;
				mag += fabs(t);
			}
			if (!(fabs(y[r] - want) <= TOL_SUM * mag) && bad++ < 3)
				printf("  %s mxfp4 scale %u cols %zu: got %.9g want %.9g\n",
					k3_kern_isa_name(ops->isa), sv[r], C, y[r], want);
		}
		free(p), free(sc), free(x), free(y);
	}
	T_EQ_INT(bad, 0);
}

/* The process's ISA is the best one the CPU runs at or below the
 * K3_KERNELS ceiling (unset / auto: no ceiling), so AVX-512 is chosen
 * exactly when cpuid reports it (k3_kern_isa_available). */
static void check_dispatch(void)
{
	static const enum k3_kern_isa order[] = { K3_KERN_ISA_AVX512,
		K3_KERN_ISA_AVX2, K3_KERN_ISA_NEON, K3_KERN_ISA_REF };
	const char *want = getenv("K3_KERNELS");
	size_t start = 0;

	if (want && *want && strcmp(want, "auto") != 0) {
		start = 3;
		for (size_t i = 0; i < 4; i++)
			if (strcmp(want, k3_kern_isa_name(order[i])) == 0)
				start = i;
	}
	while (!k3_kern_isa_available(order[start]))
		start++;
	printf("K3_KERNELS=%s: active %s (avx512 %s, avx2 %s)\n", want ? want : "(unset)",
		k3_kern_isa_name(k3_kern_active_isa()),
		k3_kern_isa_available(K3_KERN_ISA_AVX512) ? "yes" : "no",
		k3_kern_isa_available(K3_KERN_ISA_AVX2) ? "yes" : "no");
	T_EQ_INT(k3_kern_active_isa(), order[start]);
}

int main(void)
{
	static const size_t rows[] = { 1, 2, 3, 4, 5, 9, 17 };
	static const size_t dcols[] = { 1, 7, 8, 9, 15, 16, 17, 33, 100, 257, 1031 };
	static const size_t mcols[] = { 32, 64, 96, 160, 3584, 4160, 16416 };
	static const size_t Ts[] = { 1, 2, 3, 4, 5, 7 };

	check_dispatch();
	check_mxfp4_scales(&k3_kern_ops_ref);
	for (int isa = 1; isa < K3_KERN_ISA_COUNT; isa++) {
		const struct k3_kern_ops *simd = k3_kern_ops_for((enum k3_kern_isa)isa);

		if (!simd)
			continue;
		n_isa_tested++;
		printf("testing %s against ref\n", k3_kern_isa_name(simd->isa));
		for (size_t a = 0; a < sizeof(rows) / sizeof(rows[0]); a++)
			for (size_t t = 0; t < sizeof(Ts) / sizeof(Ts[0]); t++) {
				for (size_t c = 0; c < sizeof(dcols) / sizeof(dcols[0]); c++) {
					check_matmul(simd, K3_KERN_DT_BF16, rows[a], dcols[c], Ts[t]);
					check_matmul(simd, K3_KERN_DT_F32, rows[a], dcols[c], Ts[t]);
				}
				for (size_t c = 0; c < sizeof(mcols) / sizeof(mcols[0]); c++)
					check_matmul(simd, K3_KERN_DT_MXFP4, rows[a], mcols[c], Ts[t]);
			}
		check_matmul_t(simd, 128, 512, 1, K3_KERN_DT_BF16);
		check_matmul_t(simd, 7, 45, 3, K3_KERN_DT_BF16);
		check_matmul_t(simd, 5, 77, 2, K3_KERN_DT_F32);
		check_vec(simd);
		check_kda(simd, 128, 128);
		check_kda(simd, 5, 13);
		check_mxfp4_scales(simd);
	}
	if (n_isa_tested == 0)
		return t_skip("no SIMD ISA available on this CPU/build");
	return t_done();
}

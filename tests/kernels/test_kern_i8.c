/*
 * test_kern_i8.c - the int8 spine's kernels (docs/kernels.md, "int8"):
 *
 *  - the quantizer k3_kern_quantize_i8_bf16 on known values (the per-row
 *    scale max|w| / 127, round half to even, the clamp, a zero row, a
 *    padded row stride) and its refusal of NaN / infinite weights;
 *  - every SIMD int8 table this CPU runs against the scalar reference over
 *    odd shapes (rows 1..17, columns 1..1031 not multiples of the vector
 *    widths, padded ld, T 1..7), within TOL_SUM of the summed magnitudes;
 *  - the public k3_kern_matmul on I8 (whatever ISA the process chose)
 *    against the same sums in double, and its refusals (no row scales;
 *    the transposed product).
 * Bit-exact batch and thread invariance of I8 is in test_kern_invariance.
 */
#include <errno.h>
#include <math.h>

#include "kern_i8.h"
#include "kern_ops.h"
#include "kern_test_util.h"
#include "t.h"

/* As in test_kern_simd: two fixed orders differ by a few ulps of the
 * partial sums, far below 1e-5 of the absolute sum. */
#define TOL_SUM 1e-5
#define TOL_FLOOR 1e-30

static uint16_t bf16_of(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	return (uint16_t)(u >> 16);   /* the values used below are exact in bf16 */
}

static void check_quantizer(void)
{
	/* row 0: amax 2.5 -> scale 2.5/127; 1.25 / s = 63.5 exactly (fp32)
	 * -> 64 (even), -0.0625 / s = -3.175 -> -3; row 1: amax 127, scale 1:
	 * ties at odd and even floors; row 2: zeros (and -0); row 3: -amax ->
	 * -127, 48 / s = 63.5 -> 64. Columns 5, 6 are row padding (ld 7). */
	enum { R = 4, C = 5, LD = 7 };
	float src[R][LD] = {
		{ 2.5f, 1.25f, -0.0625f, -2.5f, 0.0f, 9.0f, 9.0f },
		{ 127.0f, 2.5f, 3.5f, -2.5f, -3.5f, 9.0f, 9.0f },
		{ 0.0f, -0.0f, 0.0f, 0.0f, 0.0f, 9.0f, 9.0f },
		{ -96.0f, 48.0f, 0.75f, 1.5f, 3.0f, 9.0f, 9.0f },
	};
	uint16_t w[R * LD];
	int8_t q[R * C];
	float sc[R];
	size_t bad = 99;

	for (int r = 0; r < R; r++)
		for (int c = 0; c < LD; c++)
			w[r * LD + c] = bf16_of(src[r][c]);
	T_EQ_INT(k3_kern_quantize_i8_bf16(R, C, LD, w, q, sc, &bad), 0);
	T_OK(sc[0] == 2.5f / 127.0f);
	T_OK(sc[1] == 1.0f);
	T_OK(sc[2] == 0.0f);
	T_OK(sc[3] == 96.0f / 127.0f);
	static const int8_t want[R * C] = {
		127, 64, -3, -127, 0,
		127, 2, 4, -2, -4,       /* 2.5 -> 2, 3.5 -> 4, -2.5 -> -2, -3.5 -> -4 */
		0, 0, 0, 0, 0,
		-127, 64, 1, 2, 4,       /* 48/s = 63.5 -> 64; 0.75/s = 0.99 -> 1 */
	};
	for (int i = 0; i < R * C; i++)
		if (q[i] != want[i])
			printf("  q[%d] = %d, want %d\n", i, q[i], want[i]);
	T_EQ_MEM(q, want, sizeof(want));
	/* every value is within half a step of its weight */
	for (int r = 0; r < R; r++)
		for (int c = 0; c < C; c++)
			T_OK(fabsf(q[r * C + c] * sc[r] - src[r][c]) <= 0.5f * sc[r] * 1.0001f);
	/* NaN and infinity are refused and name their row */
	w[2 * LD + 3] = 0x7FC0;
	T_EQ_INT(k3_kern_quantize_i8_bf16(R, C, LD, w, q, sc, &bad), -EINVAL);
	T_EQ_INT(bad, 2);
	w[2 * LD + 3] = 0;
	w[3 * LD + 4] = 0xFF80;   /* -inf */
	T_EQ_INT(k3_kern_quantize_i8_bf16(R, C, LD, w, q, sc, &bad), -EINVAL);
	T_EQ_INT(bad, 3);
	/* the padding past cols is never read */
	w[3 * LD + 4] = bf16_of(3.0f);
	w[0 * LD + 5] = 0x7FC0;
	T_EQ_INT(k3_kern_quantize_i8_bf16(R, C, LD, w, q, sc, NULL), 0);
}

struct i8mat {
	struct k3_kern_mat m;
	int8_t *q;
	float *s;
};

/* Random q in [-127, 127] and scales like a BF16 matrix's (max|w| ~ 0.25). */
static void i8_make(struct i8mat *f, size_t rows, size_t cols, size_t ld)
{
	f->q = kt_alloc(rows * ld);
	f->s = kt_alloc(rows * sizeof(float));
	for (size_t i = 0; i < rows * ld; i++)
		f->q[i] = (int8_t)((int)(kt_next() % 255) - 127);
	for (size_t r = 0; r < rows; r++)
		f->s[r] = (0.5f + 0.5f * (kt_unif() + 1.0f)) * (0.25f / 127.0f);
	f->m = (struct k3_kern_mat){ .dtype = K3_KERN_DT_I8, .rows = rows, .cols = cols,
		.ld = ld == cols ? 0 : ld, .data = f->q, .row_scales = f->s };
}

static void i8_drop(struct i8mat *f)
{
	free(f->q);
	free(f->s);
}

static double abs_sum(const struct i8mat *f, size_t r, size_t cols, size_t ld, const float *x)
{
	double s = 0;

	for (size_t c = 0; c < cols; c++)
		s += fabs((double)f->q[r * ld + c] * x[c]);
	return s * f->s[r];
}

static int check_vs_ref(const struct k3_kern_i8_ops *simd, size_t rows, size_t cols, size_t T)
{
	size_t ld = cols + (cols % 3);
	struct i8mat f;
	float *x = kt_alloc(T * cols * 4), *y0 = kt_alloc(T * rows * 4), *y1 = kt_alloc(T * rows * 4);
	int bad = 0;

	i8_make(&f, rows, cols, ld);
	kt_fill(x, T * cols);
	k3_kern_i8_ref.matmul_rows(&f.m, 0, rows, T, x, cols, y0, rows);
	simd->matmul_rows(&f.m, 0, rows, T, x, cols, y1, rows);
	for (size_t t = 0; t < T; t++)
		for (size_t r = 0; r < rows; r++) {
			double d = fabs((double)y0[t * rows + r] - y1[t * rows + r]);

			if (!(d <= TOL_SUM * abs_sum(&f, r, cols, ld, x + t * cols) + TOL_FLOOR) &&
			    bad++ < 3)
				printf("  %s i8 %zux%zu T %zu: y[%zu][%zu] ref %.9g simd %.9g\n",
					k3_kern_isa_name(simd->isa), rows, cols, T, t, r,
					y0[t * rows + r], y1[t * rows + r]);
		}
	i8_drop(&f);
	free(x), free(y0), free(y1);
	return bad;
}

static void check_public(void)
{
	size_t R = 13, C = 2085, T = 5;
	struct i8mat f;
	float *x = kt_alloc(T * C * 4), *y = kt_alloc(T * R * 4);

	i8_make(&f, R, C, C);
	kt_fill(x, T * C);
	T_EQ_INT(k3_kern_matmul(NULL, &f.m, 0, R, T, x, C, y, R), 0);
	for (size_t t = 0; t < T; t++)
		for (size_t r = 0; r < R; r++) {
			double want = 0;

			for (size_t c = 0; c < C; c++)
				want += (double)f.q[r * C + c] * x[t * C + c];
			want *= f.s[r];
			T_NEAR(y[t * R + r], want, TOL_SUM * abs_sum(&f, r, C, C, x + t * C) + TOL_FLOOR);
		}
	/* no row scales: refused, nothing written */
	struct k3_kern_mat bad = f.m;
	bad.row_scales = NULL;
	memset(y, 0x5A, T * R * 4);
	T_EQ_INT(k3_kern_matmul(NULL, &bad, 0, R, T, x, C, y, R), -EINVAL);
	T_EQ_INT(((unsigned char *)y)[0], 0x5A);
	/* the transposed product takes only F32 / BF16 */
	T_EQ_INT(k3_kern_matmul_t(NULL, &f.m, 1, x, R, y, C), -EINVAL);
	i8_drop(&f);
	free(x), free(y);
}

int main(void)
{
	static const size_t colv[] = { 1, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100,
		127, 513, 1031, 2049 };
	int n_simd = 0;

	printf("isa %s\n", k3_kern_isa_name(k3_kern_active_isa()));
	check_quantizer();
	for (int isa = 1; isa < K3_KERN_ISA_COUNT; isa++) {
		const struct k3_kern_i8_ops *simd = k3_kern_i8_for((enum k3_kern_isa)isa);
		int bad = 0;

		if (!simd)
			continue;
		n_simd++;
		printf("i8 %s vs ref\n", k3_kern_isa_name(simd->isa));
		for (size_t k = 0; k < sizeof(colv) / sizeof(colv[0]); k++)
			for (size_t rows = 1; rows <= 17; rows += 4)
				for (size_t T = 1; T <= 7; T += 3)
					bad += check_vs_ref(simd, rows, colv[k], T);
		T_EQ_INT(bad, 0);
	}
	if (!n_simd)
		printf("no SIMD int8 table runs here: reference only\n");
	T_OK(k3_kern_i8_active() != NULL && k3_kern_i8_active()->isa == k3_kern_active_isa());
	check_public();
	return t_done();
}

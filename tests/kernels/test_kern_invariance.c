/*
 * test_kern_invariance.c - batch invariance (issue 8 item 5), bit-exact:
 * a matmul output y[t][r] must not depend on T (1 vs 7 vs 64 positions per
 * call), on the row range of the call, or on the pool's thread count
 * (1, 2, 3). Checked for every ISA this CPU runs (through its table; the
 * int8 spine's I8 matrices through its int8 table) and for the public
 * entry point (the ISA this process chose, with pools).
 */
#include <errno.h>
#include <math.h>

#include "kern_i8.h"
#include "kern_ops.h"
#include "kern_test_util.h"
#include "t.h"

enum { TMAX = 64 };

struct fixture {
	struct k3_kern_mat m;
	float *x;        /* TMAX x cols */
};

static void make(struct fixture *f, enum k3_kern_dtype dt, size_t rows, size_t cols)
{
	memset(f, 0, sizeof(*f));
	f->m.dtype = dt;
	f->m.rows = rows;
	f->m.cols = cols;
	if (dt == K3_KERN_DT_I8) {
		int8_t *q = kt_alloc(rows * cols);
		float *s = kt_alloc(rows * 4);

		kt_fill_bytes((uint8_t *)q, rows * cols);
		kt_fill(s, rows);
		f->m.data = q;
		f->m.row_scales = s;
	} else if (dt == K3_KERN_DT_MXFP4) {
		uint8_t *p = kt_alloc(rows * cols / 2), *s = kt_alloc(rows * cols / 32);

		kt_fill_bytes(p, rows * cols / 2);
		kt_fill_scales(s, rows * cols / 32);
		f->m.data = p;
		f->m.scales = s;
	} else if (dt == K3_KERN_DT_BF16) {
		uint16_t *w = kt_alloc(rows * cols * 2);

		kt_fill_bf16(w, rows * cols);
		f->m.data = w;
	} else {
		float *w = kt_alloc(rows * cols * 4);

		kt_fill(w, rows * cols);
		f->m.data = w;
	}
	f->x = kt_alloc(TMAX * cols * 4);
	kt_fill(f->x, TMAX * cols);
}

static void drop(struct fixture *f)
{
	free((void *)f->m.data);
	free((void *)f->m.scales);
	free((void *)f->m.row_scales);
	free(f->x);
}

/* Through one ISA's table directly (its int8 table for I8): T and row
 * ranges. */
static void check_table(const struct k3_kern_ops *isa_ops, const struct fixture *f)
{
	struct k3_kern_ops i8 = { .isa = isa_ops->isa };
	const struct k3_kern_ops *ops = isa_ops;
	size_t R = f->m.rows, C = f->m.cols;

	if (f->m.dtype == K3_KERN_DT_I8) {
		i8.matmul_rows = k3_kern_i8_for(isa_ops->isa)->matmul_rows;
		ops = &i8;
	}
	float *full = kt_alloc(TMAX * R * 4), *part = kt_alloc(TMAX * R * 4);

	ops->matmul_rows(&f->m, 0, R, TMAX, f->x, C, full, R);
	/* T = 1, one position at a time */
	for (size_t t = 0; t < TMAX; t++) {
		ops->matmul_rows(&f->m, 0, R, 1, f->x + t * C, C, part + t * R, R);
	}
	T_EQ_MEM(full, part, TMAX * R * 4);
	/* chunks of 7 (last one short) */
	for (size_t t = 0; t < TMAX; t += 7) {
		size_t n = TMAX - t < 7 ? TMAX - t : 7;

		ops->matmul_rows(&f->m, 0, R, n, f->x + t * C, C, part + t * R, R);
	}
	T_EQ_MEM(full, part, TMAX * R * 4);
	/* odd row splits: [0,1) [1,6) [6,R) for T = 1 and T = 5 */
	memset(part, 0, TMAX * R * 4);
	for (size_t T = 1; T <= 5; T += 4) {
		size_t cut[4] = { 0, 1, R < 6 ? R : 6, R };

		for (int k = 0; k < 3; k++)
			ops->matmul_rows(&f->m, cut[k], cut[k + 1], T, f->x, C,
				part + cut[k], R);
		T_EQ_MEM(full, part, T * R * 4);
	}
	free(full);
	free(part);
}

/* Through the public API with pools of 1, 2, 3 threads. */
static void check_pools(const struct fixture *f, struct k3_kern_pool **pools)
{
	size_t R = f->m.rows, C = f->m.cols;
	float *ref = kt_alloc(TMAX * R * 4), *got = kt_alloc(TMAX * R * 4);

	T_EQ_INT(k3_kern_matmul(NULL, &f->m, 0, R, TMAX, f->x, C, ref, R), 0);
	for (int p = 0; p < 3; p++) {
		static const size_t Ts[] = { 1, 7, 64 };

		for (int k = 0; k < 3; k++) {
			size_t T = Ts[k];

			memset(got, 0xFF, TMAX * R * 4);
			for (size_t t = 0; t < TMAX; t += T)
				T_EQ_INT(k3_kern_matmul(pools[p], &f->m, 0, R,
					TMAX - t < T ? TMAX - t : T,
					f->x + t * C, C, got + t * R, R), 0);
			T_EQ_MEM(ref, got, TMAX * R * 4);
		}
		/* an expert-style row slice on a pool: rows [3, R-2) */
		T_EQ_INT(k3_kern_matmul(pools[p], &f->m, 3, R - 2, 7, f->x, C, got, R - 5), 0);
		for (size_t t = 0; t < 7; t++)
			T_EQ_MEM(ref + t * R + 3, got + t * (R - 5), (R - 5) * 4);
	}
	free(ref);
	free(got);
}

static void check_matmul_t(struct k3_kern_pool **pools)
{
	size_t R = 128, C = 517;
	uint16_t *w = kt_alloc(R * C * 2);
	struct k3_kern_mat m = { .dtype = K3_KERN_DT_BF16, .rows = R, .cols = C, .data = w };
	float *x = kt_alloc(9 * R * 4), *ref = kt_alloc(9 * C * 4), *got = kt_alloc(9 * C * 4);

	kt_fill_bf16(w, R * C);
	kt_fill(x, 9 * R);
	T_EQ_INT(k3_kern_matmul_t(NULL, &m, 9, x, R, ref, C), 0);
	for (int p = 0; p < 3; p++) {
		for (size_t t = 0; t < 9; t++)
			T_EQ_INT(k3_kern_matmul_t(pools[p], &m, 1, x + t * R, R, got + t * C, C), 0);
		T_EQ_MEM(ref, got, 9 * C * 4);
	}
	free(w), free(x), free(ref), free(got);
}

/* k3_kern_matmul_many == one k3_kern_matmul per job, bit for bit. */
static void check_many(struct k3_kern_pool **pools)
{
	struct fixture f[4];
	struct k3_kern_matmul_job jobs[5];
	float *want[5], *got[5];
	size_t rb[5] = { 0, 2, 0, 5, 1 }, re[5] = { 37, 20, 19, 30, 29 }, T[5] = { 1, 3, 1, 2, 3 };

	make(&f[0], K3_KERN_DT_BF16, 37, 259);
	make(&f[1], K3_KERN_DT_MXFP4, 23, 3584);
	make(&f[2], K3_KERN_DT_F32, 19, 577);
	make(&f[3], K3_KERN_DT_I8, 29, 1031);
	for (int j = 0; j < 5; j++) {
		const struct fixture *fx = &f[j < 3 ? j : j == 3 ? 0 : 3];
		size_t rows = re[j] - rb[j];

		want[j] = kt_alloc(T[j] * rows * 4);
		got[j] = kt_alloc(T[j] * rows * 4);
		jobs[j] = (struct k3_kern_matmul_job){ .w = &fx->m, .row_begin = rb[j],
			.row_end = re[j], .T = T[j], .x = fx->x + j, .ldx = fx->m.cols + 1,
			.y = got[j], .ldy = rows };
		T_EQ_INT(k3_kern_matmul(NULL, &fx->m, rb[j], re[j], T[j], fx->x + j,
			fx->m.cols + 1, want[j], rows), 0);
	}
	for (int p = 0; p < 3; p++) {
		for (int j = 0; j < 5; j++)
			memset(got[j], 0xFF, T[j] * (re[j] - rb[j]) * 4);
		T_EQ_INT(k3_kern_matmul_many(pools[p], 5, jobs), 0);
		for (int j = 0; j < 5; j++)
			T_EQ_MEM(want[j], got[j], T[j] * (re[j] - rb[j]) * 4);
	}
	jobs[1].row_end = 24;     /* past the matrix: rejected, nothing run */
	T_EQ_INT(k3_kern_matmul_many(pools[1], 5, jobs), -EINVAL);
	T_EQ_INT(k3_kern_matmul_many(pools[1], 0, NULL), 0);
	for (int j = 0; j < 5; j++) {
		free(want[j]);
		free(got[j]);
	}
	for (int j = 0; j < 4; j++)
		drop(&f[j]);
}

int main(void)
{
	struct k3_kern_pool *pools[3];
	static const struct { enum k3_kern_dtype dt; size_t rows, cols; } shapes[] = {
		{ K3_KERN_DT_BF16, 37, 259 },
		{ K3_KERN_DT_BF16, 40, 1024 },   /* short rows: one row per call at T = 1 */
		{ K3_KERN_DT_BF16, 21, 2080 },   /* long rows: four per call, plus a tail */
		{ K3_KERN_DT_F32, 19, 577 },
		{ K3_KERN_DT_MXFP4, 37, 288 },
		{ K3_KERN_DT_MXFP4, 23, 3584 },
		{ K3_KERN_DT_MXFP4, 9, 4160 },   /* AVX2: 3 tokens per permuted pass; AVX-512: 1 (L1 cap) */
		{ K3_KERN_DT_MXFP4, 7, 16416 },  /* above the permuted-x limit */
		{ K3_KERN_DT_I8, 37, 259 },      /* int8 spine: tails of every width */
		{ K3_KERN_DT_I8, 40, 1024 },     /* short rows: one row per call at T = 1 */
		{ K3_KERN_DT_I8, 21, 7175 },     /* long rows: four per call, plus a tail */
	};

	printf("isa %s\n", k3_kern_isa_name(k3_kern_active_isa()));
	for (int p = 0; p < 3; p++) {
		pools[p] = k3_kern_pool_new(p + 1, NULL);
		T_OK(pools[p] != NULL);
		if (!pools[p])
			return t_done();
		T_EQ_INT(k3_kern_pool_threads(pools[p]), p + 1);
	}
	for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
		struct fixture f;

		make(&f, shapes[s].dt, shapes[s].rows, shapes[s].cols);
		for (int isa = 0; isa < K3_KERN_ISA_COUNT; isa++) {
			const struct k3_kern_ops *ops = k3_kern_ops_for((enum k3_kern_isa)isa);

			if (ops)
				check_table(ops, &f);
		}
		check_pools(&f, pools);
		drop(&f);
	}
	check_matmul_t(pools);
	check_many(pools);
	for (int p = 0; p < 3; p++)
		k3_kern_pool_free(pools[p]);
	k3_kern_pool_free(NULL);
	return t_done();
}

/*
 * test_cuda.c - the CUDA kernels (kernels/cuda/k3_cuda.h) on a real GPU;
 * exits 77 (skip) when there is no device or driver.
 *
 *  - batch invariance, bit for bit on the device: T = 1 one position at a
 *    time, chunks of 7, and one T = 64 call give identical y; a job inside
 *    a 3-job launch equals the job alone; MXFP4 at K3 expert shapes
 *    (w1/w3 3072x3584, w2 3584x3072) and odd ones (tails of 1..3 groups
 *    per lane, rows not a multiple of 4), BF16 likewise;
 *  - device vs the CPU scalar reference (k3_kern_ops_ref) within
 *    TOL_DEVICE relative to sum |w x|: the orders differ (k3_cuda.h);
 *  - E8M0 edge scales 0 (subnormal 2^-127, not 0), 1, 252;
 *  - expert upload places the six arrays where the views say;
 *  - bad arguments give -EINVAL with a message and launch nothing; an
 *    impossible allocation gives -ENOMEM and leaves the device usable.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3_cuda.h"
#include "kern_ops.h"
#include "kern_test_util.h"
#include "t.h"

/* Same rule as TOL_SUM in test_kern_simd.c: two fixed fp32 orders differ
 * by a few ulps of the partial sums, far below 1e-5 of sum |terms|. */
#define TOL_DEVICE 1e-5

static struct k3_cuda_dev *dev;
static struct k3_cuda_status st;

static void *dalloc(size_t bytes)
{
	void *p = NULL;

	if (k3_cuda_alloc(dev, bytes, &p, &st) != 0) {
		printf("alloc %zu: %s\n", bytes, st.msg);
		exit(1);
	}
	return p;
}

static void up(void *d, const void *h, size_t n)
{
	T_EQ_INT(k3_cuda_upload(dev, d, h, n, &st), 0);
}

static void down(void *h, const void *d, size_t n)
{
	T_EQ_INT(k3_cuda_download(dev, h, d, n, &st), 0);
	T_EQ_INT(k3_cuda_sync(dev, &st), 0);
}

/* host matrix + device copy */
struct mat {
	struct k3_kern_mat h;
	struct k3_cuda_mxfp4 mx;
	struct k3_cuda_bf16 bf;
	void *d_w, *d_s;
};

static void mat_make(struct mat *m, enum k3_kern_dtype dt, uint32_t rows, uint32_t cols,
	const uint8_t *scale_fill)
{
	memset(m, 0, sizeof(*m));
	m->h = (struct k3_kern_mat){ .dtype = dt, .rows = rows, .cols = cols };
	if (dt == K3_KERN_DT_MXFP4) {
		uint8_t *p = kt_alloc((size_t)rows * cols / 2), *s = kt_alloc((size_t)rows * cols / 32);

		kt_fill_bytes(p, (size_t)rows * cols / 2);
		if (scale_fill)
			memset(s, *scale_fill, (size_t)rows * cols / 32);
		else
			kt_fill_scales(s, (size_t)rows * cols / 32);
		m->h.data = p;
		m->h.scales = s;
		m->d_w = dalloc((size_t)rows * cols / 2);
		m->d_s = dalloc((size_t)rows * cols / 32);
		up(m->d_w, p, (size_t)rows * cols / 2);
		up(m->d_s, s, (size_t)rows * cols / 32);
		m->mx = (struct k3_cuda_mxfp4){ m->d_w, m->d_s, rows, cols };
	} else {
		uint16_t *w = kt_alloc((size_t)rows * cols * 2);

		kt_fill_bf16(w, (size_t)rows * cols);
		m->h.data = w;
		m->d_w = dalloc((size_t)rows * cols * 2);
		up(m->d_w, w, (size_t)rows * cols * 2);
		m->bf = (struct k3_cuda_bf16){ m->d_w, rows, cols, 0 };
	}
}

static void mat_drop(struct mat *m)
{
	k3_cuda_free(dev, m->d_w);
	k3_cuda_free(dev, m->d_s);
	free((void *)m->h.data);
	free((void *)m->h.scales);
}

static int run(const struct mat *m, uint32_t T, const float *dx, uint32_t ldx,
	float *dy, uint32_t ldy)
{
	if (m->h.dtype == K3_KERN_DT_MXFP4)
		return k3_cuda_mxfp4_matmul(dev, &m->mx, T, dx, ldx, dy, ldy, &st);
	return k3_cuda_bf16_matmul(dev, &m->bf, T, dx, ldx, dy, ldy, &st);
}

/* sum_c |W[r][c] x[c]| in double, for the tolerance */
static double mag_row(const struct k3_kern_mat *w, size_t r, const float *x)
{
	double s = 0;

	for (size_t c = 0; c < w->cols; c++) {
		double wv;

		if (w->dtype == K3_KERN_DT_MXFP4) {
			static const double e2m1[8] = { 0, .5, 1, 1.5, 2, 3, 4, 6 };
			uint8_t b = ((const uint8_t *)w->data)[r * w->cols / 2 + c / 2];

			wv = e2m1[((c & 1) ? b >> 4 : b) & 7] *
				ldexp(1.0, w->scales[r * w->cols / 32 + c / 32] - 127);
		} else {
			uint32_t u = (uint32_t)((const uint16_t *)w->data)[r * w->cols + c] << 16;
			float f;

			memcpy(&f, &u, sizeof(f));
			wv = f;
		}
		s += fabs(wv * x[c]);
	}
	return s;
}

/* One matrix: invariance on the device and parity with the CPU reference. */
static void check_matrix(enum k3_kern_dtype dt, uint32_t rows, uint32_t cols,
	uint32_t TN, const uint8_t *scale_fill, float xamp)
{
	struct mat m;
	uint32_t ldx = cols + 4;   /* padded rows of x exercise ldx */
	size_t xn = (size_t)TN * ldx, yn = (size_t)TN * rows;
	float *x = kt_alloc(xn * 4), *full = kt_alloc(yn * 4), *part = kt_alloc(yn * 4);
	float *ref = kt_alloc(yn * 4), *got = kt_alloc(yn * 4);
	float *dx, *dy;
	int bad = 0;

	mat_make(&m, dt, rows, cols, scale_fill);
	kt_fill(x, xn);
	for (size_t i = 0; i < xn; i++)
		x[i] *= xamp;
	dx = dalloc(xn * 4);
	dy = dalloc(yn * 4);
	up(dx, x, xn * 4);
	memset(part, 0xFF, yn * 4);

	T_EQ_INT(run(&m, TN, dx, ldx, dy, rows), 0);
	down(full, dy, yn * 4);
	/* T = 1 one position at a time; chunks of 7 (items of TT 8 holding 7
	 * or fewer); chunks of 3 (TT 4 items) */
	for (int k = 0; k < 3; k++) {
		static const uint32_t chunk[3] = { 1, 7, 3 };

		up(dy, part, yn * 4);   /* NaN: an unwritten y cannot match */
		for (uint32_t t = 0; t < TN; t += chunk[k]) {
			uint32_t n = TN - t < chunk[k] ? TN - t : chunk[k];

			T_EQ_INT(run(&m, n, dx + (size_t)t * ldx, ldx, dy + (size_t)t * rows,
				rows), 0);
		}
		down(got, dy, yn * 4);
		T_EQ_MEM(full, got, yn * 4);
	}

	/* against the CPU scalar reference */
	k3_kern_ops_ref.matmul_rows(&m.h, 0, rows, TN, x, ldx, ref, rows);
	for (uint32_t t = 0; t < TN; t++)
		for (uint32_t r = 0; r < rows; r++) {
			double d = fabs((double)full[(size_t)t * rows + r] - ref[(size_t)t * rows + r]);
			double mg = mag_row(&m.h, r, x + (size_t)t * ldx);

			if (!(d <= TOL_DEVICE * mg + 1e-30) && bad++ < 3)
				printf("  dt %d %ux%u T %u: y[%u][%u] device %.9g ref %.9g\n", (int)dt,
					rows, cols, TN, t, r, full[(size_t)t * rows + r],
					ref[(size_t)t * rows + r]);
		}
	T_EQ_INT(bad, 0);
	k3_cuda_free(dev, dx);
	k3_cuda_free(dev, dy);
	mat_drop(&m);
	free(x), free(full), free(part), free(ref), free(got);
}

/* A job inside a batched launch equals the same job alone. */
static void check_many(void)
{
	struct mat m[3];
	const uint32_t shapes[3][3] = { { 3072, 3584, 1 }, { 37, 160, 5 }, { 3584, 3072, 9 } };
	struct k3_cuda_mxfp4_job jobs[3];
	float *dx[3], *dy[3], *alone[3], *batched[3];

	for (int j = 0; j < 3; j++) {
		uint32_t R = shapes[j][0], C = shapes[j][1], T = shapes[j][2];
		float *x = kt_alloc((size_t)T * C * 4);

		mat_make(&m[j], K3_KERN_DT_MXFP4, R, C, NULL);
		kt_fill(x, (size_t)T * C);
		dx[j] = dalloc((size_t)T * C * 4);
		dy[j] = dalloc((size_t)T * R * 4);
		up(dx[j], x, (size_t)T * C * 4);
		free(x);
		alone[j] = kt_alloc((size_t)T * R * 4);
		batched[j] = kt_alloc((size_t)T * R * 4);
		T_EQ_INT(k3_cuda_mxfp4_matmul(dev, &m[j].mx, T, dx[j], C, dy[j], R, &st), 0);
		down(alone[j], dy[j], (size_t)T * R * 4);
		jobs[j] = (struct k3_cuda_mxfp4_job){ .w = &m[j].mx, .T = T, .x = dx[j],
			.ldx = C, .y = dy[j], .ldy = R };
	}
	T_EQ_INT(k3_cuda_mxfp4_matmul_many(dev, 3, jobs, &st), 0);
	for (int j = 0; j < 3; j++) {
		down(batched[j], dy[j], (size_t)shapes[j][2] * shapes[j][0] * 4);
		T_EQ_MEM(alone[j], batched[j], (size_t)shapes[j][2] * shapes[j][0] * 4);
		k3_cuda_free(dev, dx[j]);
		k3_cuda_free(dev, dy[j]);
		mat_drop(&m[j]);
		free(alone[j]);
		free(batched[j]);
	}
}

/* The six arrays land where the views point. */
static void check_expert_upload(void)
{
	const uint32_t inter = 96, latent = 160;
	struct k3_cuda_expert_src src;
	struct k3_cuda_expert e;
	uint8_t *h[6], *back;
	size_t len[6] = { inter * latent / 2, inter * latent / 32, inter * latent / 2,
		inter * latent / 32, latent * inter / 2, latent * inter / 32 };

	for (int i = 0; i < 6; i++) {
		h[i] = kt_alloc(len[i]);
		kt_fill_bytes(h[i], len[i]);
	}
	src = (struct k3_cuda_expert_src){ h[0], h[1], h[2], h[3], h[4], h[5] };
	T_EQ_INT(k3_cuda_expert_upload(dev, inter, latent, &src, &e, &st), 0);
	T_OK(e.bytes == k3_cuda_expert_bytes(inter, latent) && e.bytes >= 2 * len[0]);
	T_OK(e.w1.rows == inter && e.w1.cols == latent && e.w2.rows == latent &&
		e.w2.cols == inter);
	back = kt_alloc(len[0]);
	{
		const void *where[6] = { e.w1.packed, e.w1.scales, e.w3.packed, e.w3.scales,
			e.w2.packed, e.w2.scales };

		for (int i = 0; i < 6; i++) {
			down(back, where[i], len[i]);
			T_EQ_MEM(back, h[i], len[i]);
		}
	}
	k3_cuda_expert_free(dev, &e);
	T_OK(e.mem == NULL);
	T_EQ_INT(k3_cuda_expert_upload(dev, 100, latent, &src, &e, &st), -EINVAL);
	printf("  bad expert shape: %s\n", st.msg);
	free(back);
	for (int i = 0; i < 6; i++)
		free(h[i]);
}

static void check_errors(void)
{
	struct mat m;
	float *dx, *dy;
	void *huge = NULL;

	mat_make(&m, K3_KERN_DT_MXFP4, 8, 64, NULL);
	dx = dalloc(65 * 64 * 4);
	dy = dalloc(65 * 8 * 4);
	T_EQ_INT(k3_cuda_mxfp4_matmul(dev, &m.mx, 0, dx, 64, dy, 8, &st), -EINVAL);
	T_EQ_INT(k3_cuda_mxfp4_matmul(dev, &m.mx, 65, dx, 64, dy, 8, &st), -EINVAL);
	printf("  T 65: %s\n", st.msg);
	T_EQ_INT(k3_cuda_mxfp4_matmul(dev, &m.mx, 2, dx, 62, dy, 8, &st), -EINVAL);
	T_EQ_INT(k3_cuda_mxfp4_matmul(dev, &m.mx, 1, dx + 1, 64, dy, 8, &st), -EINVAL);
	m.mx.cols = 48;
	T_EQ_INT(k3_cuda_mxfp4_matmul(dev, &m.mx, 1, dx, 64, dy, 8, &st), -EINVAL);
	printf("  cols 48: %s\n", st.msg);
	m.mx.cols = 64;
	T_EQ_INT(k3_cuda_mxfp4_matmul_many(dev, K3_CUDA_JOBS_MAX + 1, NULL, &st), -EINVAL);
	/* recoverable: an allocation no device has */
	T_EQ_INT(k3_cuda_alloc(dev, (size_t)1 << 52, &huge, &st), -ENOMEM);
	printf("  4 PiB: %s\n", st.msg);
	T_OK(!k3_cuda_dead(dev));
	T_EQ_INT(k3_cuda_mxfp4_matmul(dev, &m.mx, 1, dx, 64, dy, 8, &st), 0);
	T_EQ_INT(k3_cuda_sync(dev, &st), 0);
	k3_cuda_free(dev, dx);
	k3_cuda_free(dev, dy);
	mat_drop(&m);
}

int main(void)
{
	struct k3_cuda_info info;
	int n = 0;
	const uint8_t s0 = 0, s1 = 1, s252 = 252;

	if (k3_cuda_device_count(&n, &st) != 0 || n == 0)
		return t_skip("no CUDA device or driver");
	if (k3_cuda_open(0, &dev, &st) != 0) {
		printf("open: %s\n", st.msg);
		return 1;
	}
	T_EQ_INT(k3_cuda_query(dev, &info, &st), 0);
	printf("device %d: %s, sm_%d%d, %d SMs, %zu MiB\n", info.device, info.name,
		info.cc_major, info.cc_minor, info.sm_count, info.mem_total >> 20);

	check_matrix(K3_KERN_DT_MXFP4, 3072, 3584, 64, NULL, 1.0f);   /* w1 / w3 */
	check_matrix(K3_KERN_DT_MXFP4, 3584, 3072, 64, NULL, 1.0f);   /* w2 */
	check_matrix(K3_KERN_DT_MXFP4, 37, 160, 19, NULL, 1.0f);      /* 5 groups: lanes 0..4 */
	check_matrix(K3_KERN_DT_MXFP4, 5, 1056, 9, NULL, 1.0f);       /* 33 groups: lane 0 twice */
	check_matrix(K3_KERN_DT_MXFP4, 1, 32, 3, NULL, 1.0f);
	check_matrix(K3_KERN_DT_MXFP4, 9, 512, 5, &s0, 1.0f);         /* subnormal scale */
	check_matrix(K3_KERN_DT_MXFP4, 9, 512, 5, &s1, 1.0f);
	check_matrix(K3_KERN_DT_MXFP4, 9, 512, 5, &s252, 0x1p-12f);   /* finite sums */
	check_matrix(K3_KERN_DT_BF16, 1024, 7168, 64, NULL, 1.0f);
	check_matrix(K3_KERN_DT_BF16, 13, 8, 7, NULL, 1.0f);
	check_matrix(K3_KERN_DT_BF16, 21, 2056, 9, NULL, 1.0f);       /* chunk tail: lanes 0 */
	check_many();
	check_expert_upload();
	check_errors();
	T_OK(!k3_cuda_dead(dev));
	dev = k3_cuda_close(dev);
	return t_done();
}

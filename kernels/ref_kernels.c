/*
 * ref_kernels.c - the scalar reference ISA: plain loops in the order the
 * spec writes them (docs/model.md §3, §5.4, §9). It is the oracle the SIMD
 * files are tested against and the path K3_KERNELS=ref selects.
 *
 * Reduction order: every sum runs in ascending index with one fp32
 * accumulator, so each output depends only on its own row and input.
 */
#include <math.h>
#include <string.h>

#include "kern_ops.h"

static float bf16_f32(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

static float ref_dot(size_t n, const float *a, const float *b)
{
	float acc = 0.0f;

	for (size_t i = 0; i < n; i++)
		acc += a[i] * b[i];
	return acc;
}

static float ref_sumsq(size_t n, const float *x)
{
	return ref_dot(n, x, x);
}

static void ref_axpy(size_t n, float a, const float *x, float *y)
{
	for (size_t i = 0; i < n; i++)
		y[i] += a * x[i];
}

static float row_dot_bf16(size_t cols, const uint16_t *w, const float *x)
{
	float acc = 0.0f;

	for (size_t c = 0; c < cols; c++)
		acc += bf16_f32(w[c]) * x[c];
	return acc;
}

static float row_dot_mxfp4(size_t cols, const uint8_t *packed,
	const uint8_t *scales, const float *x)
{
	static const float e2m1[16] = K3_KERN_E2M1_VALUES;
	float acc = 0.0f;

	float scale = 0.0f;

	for (size_t c = 0; c < cols; c++) {
		uint8_t byte = packed[c >> 1];
		unsigned code = (c & 1) ? (byte >> 4) : (byte & 0x0Fu);
		float w;

		if ((c & 31) == 0)   /* §9: 2^(s-127), exact (subnormal for s = 0) */
			scale = ldexpf(1.0f, (int)scales[c >> 5] - 127);
		w = e2m1[code] * scale;
		acc += w * x[c];
	}
	return acc;
}

static void ref_matmul_rows(const struct k3_kern_mat *w, size_t r0, size_t r1,
	size_t T, const float *x, size_t ldx, float *y, size_t ldy)
{
	size_t cols = w->cols, ld = w->ld ? w->ld : w->cols;

	for (size_t r = r0; r < r1; r++) {
		for (size_t t = 0; t < T; t++) {
			const float *xt = x + t * ldx;
			float v;

			switch (w->dtype) {
			case K3_KERN_DT_F32:
				v = ref_dot(cols, (const float *)w->data + r * ld, xt);
				break;
			case K3_KERN_DT_BF16:
				v = row_dot_bf16(cols, (const uint16_t *)w->data + r * ld, xt);
				break;
			default:
				v = row_dot_mxfp4(cols,
					(const uint8_t *)w->data + r * (cols / 2),
					w->scales + r * (cols / 32), xt);
				break;
			}
			y[t * ldy + (r - r0)] = v;
		}
	}
}

static void ref_matmul_t_cols(const struct k3_kern_mat *w, size_t c0,
	size_t c1, size_t T, const float *x, size_t ldx, float *y, size_t ldy)
{
	size_t ld = w->ld ? w->ld : w->cols;

	for (size_t t = 0; t < T; t++) {
		float *yt = y + t * ldy;

		for (size_t c = c0; c < c1; c++)
			yt[c] = 0.0f;
		for (size_t r = 0; r < w->rows; r++) {
			float a = x[t * ldx + r];

			if (w->dtype == K3_KERN_DT_F32) {
				const float *wr = (const float *)w->data + r * ld;

				for (size_t c = c0; c < c1; c++)
					yt[c] += wr[c] * a;
			} else {
				const uint16_t *wr = (const uint16_t *)w->data + r * ld;

				for (size_t c = c0; c < c1; c++)
					yt[c] += bf16_f32(wr[c]) * a;
			}
		}
	}
}

static void ref_kda_step(size_t dk, size_t dv, float *S, const float *q,
	const float *k, const float *v, const float *alpha, float beta,
	float *o, float *scratch)
{
	float *pred = scratch, *u = scratch + dv;

	for (size_t j = 0; j < dv; j++)
		pred[j] = 0.0f;
	for (size_t i = 0; i < dk; i++) {
		float *Si = S + i * dv;

		for (size_t j = 0; j < dv; j++) {
			Si[j] *= alpha[i];
			pred[j] += k[i] * Si[j];
		}
	}
	for (size_t j = 0; j < dv; j++) {
		u[j] = beta * (v[j] - pred[j]);
		o[j] = 0.0f;
	}
	for (size_t i = 0; i < dk; i++) {
		float *Si = S + i * dv;

		for (size_t j = 0; j < dv; j++) {
			Si[j] += k[i] * u[j];
			o[j] += q[i] * Si[j];
		}
	}
}

const struct k3_kern_ops k3_kern_ops_ref = { K3_KERN_OPS_INIT(K3_KERN_ISA_REF, ref) };

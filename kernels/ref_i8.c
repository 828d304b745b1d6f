/*
 * ref_i8.c - the scalar reference of the int8 spine's arithmetic: the
 * row-wise quantizer (k3_kern_quantize_i8_bf16) and the int8 x fp32
 * product (the oracle the SIMD files are tested against; K3_KERNELS=ref).
 *
 * Reduction order: one fp32 accumulator over c ascending of
 * float(q[r][c]) * x[c] (each product rounded, then added), and the row's
 * scale multiplied into the finished sum: y = scale * acc.
 */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "kern_i8.h"

static float bf16_value(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

/* Round half to even of |v| <= 2^23, independent of the rounding mode:
 * v - floor(v) is exact there. */
static float round_half_even(float v)
{
	float f = floorf(v), d = v - f;

	if (d > 0.5f || (d == 0.5f && fmodf(f, 2.0f) != 0.0f))
		f += 1.0f;
	return f;
}

int k3_kern_quantize_i8_bf16(size_t rows, size_t cols, size_t ld, const uint16_t *w,
	int8_t *q, float *scales, size_t *bad_row)
{
	if (!ld)
		ld = cols;
	for (size_t r = 0; r < rows; r++) {
		const uint16_t *wr = w + r * ld;
		int8_t *qr = q + r * cols;
		float amax = 0.0f;

		for (size_t c = 0; c < cols; c++) {
			float a = fabsf(bf16_value(wr[c]));

			if (!isfinite(a)) {
				if (bad_row)
					*bad_row = r;
				return -EINVAL;
			}
			if (a > amax)
				amax = a;
		}
		float s = amax / 127.0f;

		scales[r] = s;
		for (size_t c = 0; c < cols; c++) {
			float v = s > 0.0f ? round_half_even(bf16_value(wr[c]) / s) : 0.0f;

			/* amax / s may exceed 127 by an ulp: the clamp keeps it */
			qr[c] = (int8_t)(v > 127.0f ? 127 : v < -127.0f ? -127 : (int)v);
		}
	}
	return 0;
}

static void ref_i8_rows(const struct k3_kern_mat *w, size_t r0, size_t r1,
	size_t T, const float *x, size_t ldx, float *y, size_t ldy)
{
	size_t cols = w->cols, ld = w->ld ? w->ld : w->cols;

	for (size_t r = r0; r < r1; r++) {
		const int8_t *qr = (const int8_t *)w->data + r * ld;
		float s = w->row_scales[r];

		for (size_t t = 0; t < T; t++) {
			const float *xt = x + t * ldx;
			float acc = 0.0f;

			for (size_t c = 0; c < cols; c++)
				acc += (float)qr[c] * xt[c];
			y[t * ldy + (r - r0)] = s * acc;
		}
	}
}

const struct k3_kern_i8_ops k3_kern_i8_ref = {
	.isa = K3_KERN_ISA_REF,
	.matmul_rows = ref_i8_rows,
};

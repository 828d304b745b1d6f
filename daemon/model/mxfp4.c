/* mxfp4.c - scalar MXFP4 decode/encode and bf16 rows (see mxfp4.h,
 * docs/model.md §9). */
#include "model/mxfp4.h"

#include <errno.h>
#include <math.h>

#include "k3_kernels.h"

static const float e2m1[16] = K3_KERN_E2M1_VALUES;

float k3_mxfp4_e2m1(uint8_t code)
{
	return e2m1[code & 15u];
}

float k3_mxfp4_scale(uint8_t s)
{
	if (s == K3_MXFP4_SCALE_NAN)
		return INFINITY;
	/* ldexpf, not the s<<23 bit trick: s = 0 must give the subnormal 2^-127. */
	return ldexpf(1.0f, (int)s - 127);
}

int k3_mxfp4_decode_row(const uint8_t *packed, const uint8_t *scale,
			size_t cols, float *out)
{
	if (cols == 0 || cols % K3_MXFP4_GROUP)
		return -EINVAL;
	for (size_t g = 0; g < cols / K3_MXFP4_GROUP; g++) {
		if (scale[g] == K3_MXFP4_SCALE_NAN)
			return -EINVAL;
		float f = k3_mxfp4_scale(scale[g]);
		for (size_t c = g * K3_MXFP4_GROUP; c < (g + 1) * K3_MXFP4_GROUP; c += 2) {
			uint8_t b = packed[c >> 1];
			out[c] = e2m1[b & 15u] * f;
			out[c + 1] = e2m1[b >> 4] * f;
		}
	}
	return 0;
}

int k3_mxfp4_check_scales(const uint8_t *scale, size_t n, const char *what,
			  struct k3_err *err)
{
	const uint8_t *p = memchr(scale, K3_MXFP4_SCALE_NAN, n);

	if (p)
		return k3_err_set(err, -EINVAL,
				  "%s: MXFP4 scale byte 255 (NaN exponent) at byte offset %zu; the checkpoint is corrupt",
				  what ? what : "scale", (size_t)(p - scale));
	return 0;
}

/* Index of the E2M1 magnitude nearest to a (a >= 0, already divided by the
 * group scale). The thresholds are the midpoints of {0, .5, 1, 1.5, 2, 3, 4,
 * 6}; at a midpoint the even index wins (round half to even): hence '>' where
 * the lower neighbour is even and '>=' where the upper one is. */
static uint8_t nearest_mag(float a)
{
	return (uint8_t)((a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) +
			 (a > 2.5f) + (a >= 3.5f) + (a > 5.0f));
}

int k3_mxfp4_encode_row(const float *in, size_t cols, uint8_t *packed,
			uint8_t *scale)
{
	if (cols == 0 || cols % K3_MXFP4_GROUP)
		return -EINVAL;
	for (size_t g = 0; g < cols / K3_MXFP4_GROUP; g++) {
		const float *x = in + g * K3_MXFP4_GROUP;
		float amax = 0.0f;
		for (size_t i = 0; i < K3_MXFP4_GROUP; i++)
			if (fabsf(x[i]) > amax)
				amax = fabsf(x[i]);
		/* smallest s with amax <= 6 * 2^(s-127): frexpf gives
		 * amax/6 = m * 2^e with m in [0.5, 1) */
		int s = 1;
		if (amax > 0.0f) {
			int e;
			float m = frexpf(amax / 6.0f, &e);
			s = (m == 0.5f ? e - 1 : e) + 127;
			if (s < 1)
				s = 1;
			if (s > 254)
				s = 254;
			if (amax > 6.0f * ldexpf(1.0f, s - 127) && s < 254)
				s++;   /* amax/6 rounded down */
		}
		scale[g] = (uint8_t)s;
		float inv = ldexpf(1.0f, 127 - s);
		for (size_t i = 0; i < K3_MXFP4_GROUP; i += 2) {
			uint8_t lo = nearest_mag(fabsf(x[i]) * inv);
			uint8_t hi = nearest_mag(fabsf(x[i + 1]) * inv);
			if (x[i] < 0.0f)
				lo |= 8u;
			if (x[i + 1] < 0.0f)
				hi |= 8u;
			packed[(g * K3_MXFP4_GROUP + i) >> 1] = (uint8_t)(lo | (hi << 4));
		}
	}
	return 0;
}

void k3_bf16_to_f32_row(const void *src, float *dst, size_t n)
{
	const uint8_t *p = src;

	for (size_t i = 0; i < n; i++) {
		uint16_t h = (uint16_t)(p[2 * i] | (p[2 * i + 1] << 8));
		dst[i] = k3_bf16_to_f32(h);
	}
}

/*
 * mxfp4.h - scalar reference decode of the compressed-tensors
 * "mxfp4-pack-quantized" expert format (docs/model.md §9) and the bf16 -> fp32
 * conversion. These are the oracles for tests and the loader's validation;
 * the fast kernels decode in registers elsewhere.
 *
 * Layout of a logical weight W [R, C] (C a multiple of 32):
 *   packed U8 [R, C/2]:  low nibble (byte & 0x0F) = even column c,
 *                        high nibble (byte >> 4)  = odd column c+1;
 *   scale  U8 [R, C/32]: E8M0 exponent per 32 consecutive input columns,
 *                        factor 2^(s - 127); s = 255 is forbidden (NaN in
 *                        the OCP MX spec) and is a load error here.
 *   code: bit 3 sign, bits 0..2 index into {0, .5, 1, 1.5, 2, 3, 4, 6}.
 */
#ifndef K3_MODEL_MXFP4_H
#define K3_MODEL_MXFP4_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "base/err.h"

/* Columns per scale byte. */
#define K3_MXFP4_GROUP 32u
/* The forbidden scale byte. */
#define K3_MXFP4_SCALE_NAN 255u

/* E2M1 code (0..15) -> value, exact. Codes above 15 use their low 4 bits. */
float k3_mxfp4_e2m1(uint8_t code);

/* E8M0 byte -> 2^(s-127) computed with ldexpf (exact, 2^-127 subnormal for
 * s = 0). s = 255 yields +inf; callers must have validated first. */
float k3_mxfp4_scale(uint8_t s);

/* Decodes one row of cols logical columns:
 *   out[c] = E2M1(code(c)) * 2^(scale[c/32] - 127)        (§9)
 * packed: cols/2 bytes; scale: cols/32 bytes; out: cols floats.
 * Returns 0, or -EINVAL when cols is not a positive multiple of 32 or a
 * scale byte of the row is 255 (out is then unspecified). */
int k3_mxfp4_decode_row(const uint8_t *packed, const uint8_t *scale,
			size_t cols, float *out);

/* Checks n scale bytes for the forbidden value 255. Returns 0, or -EINVAL
 * with "... scale byte 255 at byte offset N ..." in err (what names the
 * tensor or span for the message). */
int k3_mxfp4_check_scales(const uint8_t *scale, size_t n, const char *what,
			  struct k3_err *err);

/* Quantizes one row of cols fp32 values (cols a positive multiple of 32)
 * to packed/scale in the same layout, per group: s = the smallest exponent
 * with max|x| <= 6 * 2^(s-127) (clamped to 1..254), codes by
 * round-to-nearest on the E2M1 grid (ties to the even code). Used by the
 * demo-model generator. Returns 0 or -EINVAL for a bad cols. */
int k3_mxfp4_encode_row(const float *in, size_t cols, uint8_t *packed,
			uint8_t *scale);

/* bfloat16 bits -> fp32, exact (the top 16 bits of the fp32 word). */
static inline float k3_bf16_to_f32(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

/* fp32 -> bfloat16 bits, round to nearest even (docs/model.md "rb()");
 * NaN stays a quiet NaN. */
static inline uint16_t k3_f32_to_bf16(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x40u);
	u += 0x7fffu + ((u >> 16) & 1u);
	return (uint16_t)(u >> 16);
}

/* n bf16 values at src (any alignment) -> dst[n] fp32. */
void k3_bf16_to_f32_row(const void *src, float *dst, size_t n);

#endif

/*
 * test_mxfp4.c - MXFP4 decode against the worked bytes of docs/model.md §9 and
 * §13.5, the full E2M1 table, E8M0 edge scales, the 255 rule, an
 * encode/decode round trip, and bf16 conversion.
 */
#include <errno.h>

#include "t.h"
#include "model/mxfp4.h"

int main(void)
{
	/* §9 worked example: packed[0] = 0xB3, packed[1] = 0x7F, scale 0x7E;
	 * columns 32..63 use scale 0x85 (2^6), code 0x1 -> 32 */
	uint8_t packed[32] = { 0xB3, 0x7F };
	uint8_t scale[2] = { 0x7E, 0x85 };
	float out[64];

	for (int i = 16; i < 32; i++)
		packed[i] = 0x11;
	T_EQ_INT(k3_mxfp4_decode_row(packed, scale, 64, out), 0);
	T_OK(out[0] == 0.75f);
	T_OK(out[1] == -0.75f);
	T_OK(out[2] == -3.0f);
	T_OK(out[3] == 3.0f);
	T_OK(out[4] == 0.0f);
	for (int c = 32; c < 64; c++)
		T_OK(out[c] == 32.0f);

	/* the whole E2M1 table (bit 3 sign) */
	static const float mag[8] = { 0, 0.5f, 1, 1.5f, 2, 3, 4, 6 };
	for (uint8_t code = 0; code < 16; code++) {
		float want = (code & 8) ? -mag[code & 7] : mag[code & 7];
		T_OK(k3_mxfp4_e2m1(code) == want);
	}
	T_OK(signbit(k3_mxfp4_e2m1(8)));   /* -0 */

	/* E8M0: 127 -> 1, 0 -> 2^-127 (subnormal, not flushed), 254 -> 2^127 */
	T_OK(k3_mxfp4_scale(127) == 1.0f);
	T_OK(k3_mxfp4_scale(0) == ldexpf(1.0f, -127));
	T_OK(k3_mxfp4_scale(0) > 0.0f);
	T_OK(k3_mxfp4_scale(254) == ldexpf(1.0f, 127));

	/* 255 is refused by decode and by the check, which names the offset */
	uint8_t bad[4] = { 1, 2, 255, 3 };
	struct k3_err err = { 0 };
	T_EQ_INT(k3_mxfp4_check_scales(bad, 4, "t.weight_scale", &err), -EINVAL);
	T_OK(strstr(err.msg, "scale byte 255") && strstr(err.msg, "offset 2") &&
	     strstr(err.msg, "t.weight_scale"));
	T_EQ_INT(k3_mxfp4_check_scales(bad, 2, "x", NULL), 0);
	uint8_t s255[2] = { 127, 255 };
	T_EQ_INT(k3_mxfp4_decode_row(packed, s255, 64, out), -EINVAL);
	T_EQ_INT(k3_mxfp4_decode_row(packed, scale, 48, out), -EINVAL);

	/* encode: values on the grid round-trip exactly, per-group scale */
	float in[64], back[64];
	uint8_t p2[32], s2[2];
	for (int c = 0; c < 32; c++)
		in[c] = (c & 1 ? -1.0f : 1.0f) * mag[c % 8] * 0.25f;     /* max 1.5 = 6 * 2^-2 */
	for (int c = 32; c < 64; c++)
		in[c] = mag[c % 8] * 8.0f;                               /* max 48 = 6 * 2^3 */
	T_EQ_INT(k3_mxfp4_encode_row(in, 64, p2, s2), 0);
	T_EQ_INT(s2[0], 125);
	T_EQ_INT(s2[1], 130);
	T_EQ_INT(k3_mxfp4_decode_row(p2, s2, 64, back), 0);
	T_EQ_MEM(in, back, sizeof(in));
	/* the layout: low nibble even column (in[0] = 0 -> 0x0, in[1] = -0.5*0.25
	 * -> code 0x9 at scale 2^-2 = 0.5 * 0.25 -> index 1, sign) */
	T_EQ_INT(p2[0], 0x90);
	/* off-grid values round to the nearest grid point */
	float r[32] = { 6.0f, 2.4f, 2.6f, 0.2f };
	T_EQ_INT(k3_mxfp4_encode_row(r, 32, p2, s2), 0);
	T_EQ_INT(k3_mxfp4_decode_row(p2, s2, 32, back), 0);
	T_OK(back[0] == 6.0f && back[1] == 2.0f && back[2] == 3.0f && back[3] == 0.0f);

	/* bf16 */
	T_OK(k3_bf16_to_f32(0x3f80) == 1.0f);
	T_OK(k3_bf16_to_f32(0xc040) == -3.0f);
	T_EQ_INT(k3_f32_to_bf16(1.0f), 0x3f80);
	T_EQ_INT(k3_f32_to_bf16(1.00390625f), 0x3f80);   /* tie -> even */
	T_EQ_INT(k3_f32_to_bf16(1.01171875f), 0x3f82);   /* tie -> even (up) */
	uint8_t raw[4] = { 0x80, 0x3f, 0x40, 0xc0 };
	float two[2];
	k3_bf16_to_f32_row(raw, two, 2);
	T_OK(two[0] == 1.0f && two[1] == -3.0f);
	return t_done();
}

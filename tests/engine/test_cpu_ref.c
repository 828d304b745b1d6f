/*
 * test_cpu_ref.c - the cpu provider's scalar reference ops against the
 * worked examples of docs/model.md §13 (computed there in double
 * precision) and the tie rule of §8.1.
 */
#include "t.h"

#include "cpu/cpu_ops.h"

static void situ(void)
{
	static const float v[4][3] = {
		{ 2.0f, 30.0f, 33.9323637f }, { -3.0f, 1.0f, -0.120425754f },
		{ 0.5f, -2.0f, -0.617919824f }, { 10.0f, 100.0f, 98.5907816f },
	};
	for (int i = 0; i < 4; i++)
		T_NEAR(k3_cpu_situ(v[i][0], v[i][1], 4.0f, 25.0f), v[i][2], 2e-6 * fabs(v[i][2]));
	/* null linear beta: the up branch is not capped */
	T_NEAR(k3_cpu_situ(2.0f, 30.0f, 4.0f, 0.0f), 1.62812577 * 30.0, 1e-4);
}

static void conv(void)
{
	const float w[4] = { 0.1f, 0.2f, 0.3f, 0.4f };
	float win[3] = { 0 }, y;
	const float in[3] = { 1.0f, 2.0f, -1.0f }, want[3] = { 0.239475064f, 0.825286116f, 0.239475064f };
	for (int t = 0; t < 3; t++) {
		k3_cpu_ref_conv_step(win, w, 1, 4, &in[t], &y);
		T_NEAR(y, want[t], 1e-7);
	}
	/* the window holds the last 3 raw inputs (not SiLU outputs), oldest first */
	T_NEAR(win[0], 1.0, 0);
	T_NEAR(win[1], 2.0, 0);
	T_NEAR(win[2], -1.0, 0);
}

static void kda(void)
{
	float S[4] = { 0 }, o[2], alpha[2];
	const float q1[2] = { 1, 0 }, k1[2] = { 3, 4 }, v1[2] = { 1, 2 }, f1[2] = { 0, 1 };
	const float q2[2] = { 0, 1 }, k2[2] = { 0, 2 }, v2[2] = { 1, -1 }, f2[2] = { 2, -2 };

	for (int i = 0; i < 2; i++)
		alpha[i] = expf(-5.0f * k3_cpu_sigmoid(1.0f * (f1[i] + 0.0f)));
	T_NEAR(alpha[0], 0.0820849986, 1e-8);
	T_NEAR(alpha[1], 0.0258539239, 1e-8);
	k3_cpu_ref_kda_head(S, 2, 2, q1, k1, v1, alpha, k3_cpu_sigmoid(0.0f), o);
	T_NEAR(o[0], 0.212131924, 1e-7);
	T_NEAR(o[1], 0.424263848, 1e-7);
	T_NEAR(S[0], 0.299999994, 1e-7);
	T_NEAR(S[3], 0.799999984, 1e-7);

	for (int i = 0; i < 2; i++)
		alpha[i] = expf(-5.0f * k3_cpu_sigmoid(f2[i]));
	k3_cpu_ref_kda_head(S, 2, 2, q2, k2, v2, alpha, k3_cpu_sigmoid(logf(3.0f)), o);
	T_NEAR(o[0], 0.569291575, 1e-6);
	T_NEAR(o[1], -0.452406113, 1e-6);
	T_NEAR(S[0], 0.00366855211, 1e-8);
	T_NEAR(S[1], 0.00733710423, 1e-8);
	T_NEAR(S[2], 0.805100269, 1e-6);
	T_NEAR(S[3], -0.63979918, 1e-6);
}

static void attnres(void)
{
	const float u[2] = { 1.0f * 1.0f, 1.0f * -1.0f }, c0[2] = { 1, 0 }, c1[2] = { 0, 2 };
	const float *c[2] = { c0, c1 };
	float out[2];
	k3_cpu_ref_attnres(c, 2, 2, u, 1e-5f, out);
	T_NEAR(out[0], 0.944191849, 1e-7);
	T_NEAR(out[1], 0.111616301, 1e-7);
}

static void mxfp4(void)
{
	uint8_t packed[32] = { 0xB3, 0x7F }, scale[2] = { 0x7E, 0x85 };
	packed[16] = 0x01;                  /* column 32: code 1 -> 0.5 * 64 */
	T_NEAR(k3_cpu_mxfp4_value(packed, scale, 0), 0.75, 0);
	T_NEAR(k3_cpu_mxfp4_value(packed, scale, 1), -0.75, 0);
	T_NEAR(k3_cpu_mxfp4_value(packed, scale, 2), -3.0, 0);
	T_NEAR(k3_cpu_mxfp4_value(packed, scale, 3), 3.0, 0);
	T_NEAR(k3_cpu_mxfp4_value(packed, scale, 32), 32.0, 0);
	/* s = 0 is 2^-127 (subnormal), not 0 */
	uint8_t s0[1] = { 0 }, p1[16] = { 0x02 };
	T_OK(k3_cpu_mxfp4_value(p1, s0, 0) == ldexpf(1.0f, -127));
	/* linear: x = 1 at columns 0 and 32 sums those two weights */
	float x[64] = { 0 }, y;
	x[0] = 1.0f;
	x[32] = 1.0f;
	k3_cpu_ref_mxfp4_linear(packed, scale, 1, 64, x, &y);
	T_NEAR(y, 32.75, 0);
}

static void topk(void)
{
	/* ties of s + bias go to the lower id; the bias selects, never weighs */
	/* binary fractions, so s + bias ties exactly */
	const float s[6] = { 0.5f, 0.75f, 0.5f, 0.875f, 0.125f, 0.5f };
	const float bias[6] = { 0.0f, 0.0f, 0.0f, 0.0f, 0.625f, 0.0f };
	uint32_t ids[4];
	float w[4];
	k3_cpu_ref_topk(s, bias, 6, 3, 1, 2.0f, ids, w);
	T_EQ_INT(ids[0], 3);
	T_EQ_INT(ids[1], 1);
	T_EQ_INT(ids[2], 4);     /* 0.125 + 0.625 ties id 1's 0.75: id 1 first */
	T_NEAR(w[2], 2.0 * 0.125 / (0.875 + 0.75 + 0.125), 1e-6);
	k3_cpu_ref_topk(s, bias, 6, 4, 1, 1.0f, ids, w);
	T_EQ_INT(ids[3], 0);     /* 0.5 at ids 0, 2, 5: lowest wins */
}

static void rmsnorm(void)
{
	const float x[4] = { 1, 2, 3, 4 }, w[4] = { 1, 1, 2, 1 };
	float y[4];
	k3_cpu_ref_rmsnorm(x, w, 4, 1e-5f, y);
	double r = 1.0 / sqrt(30.0 / 4 + 1e-5);
	T_NEAR(y[0], 1 * r, 1e-7);
	T_NEAR(y[2], 2 * 3 * r, 1e-6);
}

int main(void)
{
	situ();
	conv();
	kda();
	attnres();
	mxfp4();
	topk();
	rmsnorm();
	return t_done();
}

/*
 * test_kern_spec.c - the worked examples of docs/model.md §13 through the
 * public kernels API (whatever ISA this process chose), plus MXFP4 decode of
 * the known bytes of §9.
 */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "k3_kernels.h"
#include "t.h"

static void test_mxfp4_bytes(void)
{
	/* one row, 64 columns: bytes 0xB3 0x7F then zeros; scale 0x7E, 0x85;
	 * byte 16 (columns 32, 33) = 0x01 -> column 32 code 1 -> 0.5 * 64 */
	uint8_t packed[32] = { 0xB3, 0x7F };
	uint8_t scales[2] = { 0x7E, 0x85 };
	struct k3_kern_mat w = { .dtype = K3_KERN_DT_MXFP4, .rows = 1, .cols = 64,
		.data = packed, .scales = scales };
	float x[64], y;
	const float want[5] = { 0.75f, -0.75f, -3.0f, 3.0f, 32.0f };
	const int col[5] = { 0, 1, 2, 3, 32 };

	packed[16] = 0x01;
	for (int i = 0; i < 5; i++) {
		memset(x, 0, sizeof(x));
		x[col[i]] = 1.0f;
		T_EQ_INT(k3_kern_matmul(NULL, &w, 0, 1, 1, x, 64, &y, 1), 0);
		T_NEAR(y, want[i], 0.0);
	}
}

static void test_situ(void)
{
	const float g[4] = { 2.0f, -3.0f, 0.5f, 10.0f };
	const float u[4] = { 30.0f, 1.0f, -2.0f, 100.0f };
	const float want[4] = { 33.9323637f, -0.120425754f, -0.617919824f, 98.5907816f };
	float act[4];

	k3_kern_situ_glu(4, g, u, 4.0f, 25.0f, act);
	for (int i = 0; i < 4; i++)
		T_NEAR(act[i], want[i], 2e-6 * fabs(want[i]) + 1e-7);
}

static void test_attnres(void)
{
	const float c0[2] = { 1, 0 }, c1[2] = { 0, 2 }, nw[2] = { 1, 1 }, pw[2] = { 1, -1 };
	const float *cand[2] = { c0, c1 };
	float u[2], out[2];

	k3_kern_attnres_score_vec(2, nw, pw, u);
	T_EQ_INT(k3_kern_attnres(2, 2, cand, u, 1e-5f, out), 0);
	T_NEAR(out[0], 0.944191849, 1e-6);
	T_NEAR(out[1], 0.111616301, 1e-6);
}

/* §13.2: taps [0.1, 0.2, 0.3, 0.4], inputs 1, 2, -1, zero history. */
static void test_conv(void)
{
	const float w[4] = { 0.1f, 0.2f, 0.3f, 0.4f };
	const float in[3] = { 1.0f, 2.0f, -1.0f };
	const double want[3] = { 0.239475064, 0.825286116, 0.239475064 };
	float hist[3] = { 0, 0, 0 }, y;

	for (int t = 0; t < 3; t++) {
		k3_kern_kda_conv_silu(1, w, hist, &in[t], &y);
		T_NEAR(y, want[t], 1e-6);
	}
	T_NEAR(hist[2], -1.0, 0.0);
	T_NEAR(hist[1], 2.0, 0.0);
}

/* §13.3: one KDA head, dk = dv = 2, two tokens. */
static void test_kda_head(void)
{
	const float qs[2][2] = { { 1, 0 }, { 0, 1 } }, ks[2][2] = { { 3, 4 }, { 0, 2 } };
	const float vs[2][2] = { { 1, 2 }, { 1, -1 } }, fs[2][2] = { { 0, 1 }, { 2, -2 } };
	const float bs[2] = { 0.0f, 1.0986122886681098f };
	const double want_o[2][2] = { { 0.212131924, 0.424263848 }, { 0.569291575, -0.452406113 } };
	const double want_z[2][2] = { { 0.316213712, 0.632427425 }, { 0.553580175, -0.439920536 } };
	const double want_S[4] = { 0.00366855211, 0.00733710423, 0.805100269, -0.63979918 };
	const float dt[2] = { 0, 0 }, ones[2] = { 1, 1 }, gz[2] = { 0, 0 };
	float S[4] = { 0 }, scratch[4], q[2], k[2], alpha[2], o[2], z[2], beta;

	for (int t = 0; t < 2; t++) {
		k3_kern_l2norm(2, qs[t], 1e-6f, 1.0f / sqrtf(2.0f), q);
		k3_kern_l2norm(2, ks[t], 1e-6f, 1.0f, k);
		k3_kern_sigmoid(1, &bs[t], &beta);
		k3_kern_kda_decay(2, fs[t], dt, 1.0f, -5.0f, alpha);
		k3_kern_kda_step(2, 2, S, q, k, vs[t], alpha, beta, o, scratch);
		k3_kern_rmsnorm_gated(2, o, ones, gz, 1e-5f, z);
		for (int j = 0; j < 2; j++) {
			T_NEAR(o[j], want_o[t][j], 2e-6);
			T_NEAR(z[j], want_z[t][j], 2e-6);
		}
	}
	for (int i = 0; i < 4; i++)
		T_NEAR(S[i], want_S[i], 2e-6);
}

static void test_bf16_round(void)
{
	const float in[4] = { 1.0f, 1.00390625f, 1.01171875f, -3.0e38f };
	uint16_t out[4];

	k3_kern_f32_to_bf16(4, in, out);
	T_EQ_INT(out[0], 0x3F80);
	T_EQ_INT(out[1], 0x3F80);   /* tie 1 + 2^-8 -> even (down) */
	T_EQ_INT(out[2], 0x3F82);   /* tie 1 + 3*2^-8 -> even (up) */
	T_EQ_INT(out[3], 0xFF62);
	T_NEAR(k3_kern_bf16_round1(1.00390625f), 1.0, 0.0);
}

static void test_router(void)
{
	/* logits of 6 experts; bias lifts expert 5 to the top */
	const float logit[6] = { 0.0f, 2.0f, 1.0f, 2.0f, -1.0f, -3.0f };
	const float bias[6] = { 0, 0, 0, 0, 0, 1.0f };
	int32_t idx[3];
	float w[3], s1 = 1.0f / (1.0f + expf(-2.0f)), s5 = 1.0f / (1.0f + expf(3.0f));

	T_EQ_INT(k3_kern_router_topk(6, logit, NULL, 2, true, 1.0f, idx, w, NULL), 0);
	T_EQ_INT(idx[0], 1);          /* tie between 1 and 3: lower index first */
	T_EQ_INT(idx[1], 3);
	T_NEAR(w[0], 0.5, 1e-7);
	T_EQ_INT(k3_kern_router_topk(6, logit, bias, 3, true, 2.0f, idx, w, NULL), 0);
	T_EQ_INT(idx[0], 5);          /* sigma(-3) + 1 beats sigma(2) */
	T_EQ_INT(idx[1], 1);
	T_EQ_INT(idx[2], 3);
	/* weights use the unbiased scores */
	T_NEAR(w[0], 2.0 * s5 / (s5 + 2.0 * s1), 1e-6);
	T_NEAR(w[1], 2.0 * s1 / (s5 + 2.0 * s1), 1e-6);
	T_EQ_INT(k3_kern_router_topk(6, logit, NULL, 7, true, 1.0f, idx, w, NULL), -EINVAL);
}

int main(void)
{
	const char *want = getenv("K3_KERNELS");
	enum k3_kern_isa isa = k3_kern_active_isa();

	printf("isa %s\n", k3_kern_isa_name(isa));
	/* dispatch: ref and unknown names force the reference; auto never
	 * picks an ISA the CPU lacks, nor ref when AVX2 is there */
	T_OK(k3_kern_isa_available(isa));
	T_EQ_INT(k3_kern_active_isa(), isa);
	if (want && (strcmp(want, "ref") == 0 || strcmp(want, "bogus") == 0))
		T_EQ_INT(isa, K3_KERN_ISA_REF);
	if (!want || strcmp(want, "auto") == 0)
		T_OK(!k3_kern_isa_available(K3_KERN_ISA_AVX2) || isa >= K3_KERN_ISA_AVX2);
	T_EQ_STR(k3_kern_isa_name(K3_KERN_ISA_COUNT), "?");
	test_mxfp4_bytes();
	test_situ();
	test_attnres();
	test_conv();
	test_kda_head();
	test_bf16_round();
	test_router();
	return t_done();
}

/*
 * test_kern_spec.c - the worked examples of k3-model.md §13 through the
 * public kernels API (whatever ISA this process chose), plus MXFP4 decode of
 * the known bytes of §9.
 */
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

int main(void)
{
	printf("isa %s\n", k3_kern_isa_name(k3_kern_active_isa()));
	test_mxfp4_bytes();
	test_situ();
	test_attnres();
	return t_done();
}

/*
 * test_cpu_i8.c - the cpu provider and the int8 spine's dtype
 * (K3_PROV_DTYPE_I8, providers/k3_provider.h), on a hand-built one-layer
 * MLA + dense model:
 *
 *  - an I8 lm_head computes the logits of its dequantized values
 *    (q * scale as F32 weights) within TOL of the summed magnitudes, on the
 *    fast path and on the scalar reference path;
 *  - I8 is accepted for linear operands (q_a_proj, the MLP) and refused,
 *    naming the tensor, for the embedding and MLA kv_b_proj (not operands
 *    of a row-wise product), for a misaligned payload and a wrong shape.
 */
#include "t.h"

#include <errno.h>

#include "k3_kernels.h"
#include "k3_provider.h"

extern const struct k3_provider k3_provider_cpu;

/* Two fixed reduction orders (scale after the sum vs per element) */
#define TOL 2e-5

enum { D = 64, V = 96, INTER = 96, H = 2, QL = 32, KVL = 32, NOPE = 16, ROPE = 8, VH = 16 };

static uint64_t rng = 0x243F6A8885A308D3ull;

static float unif(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (float)((double)(rng >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

static uint16_t to_bf16(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return (uint16_t)(u >> 16);
}

/* Allocations of this test, freed at the end. */
static void *owned[128];
static int n_owned;

static void *alloc64(size_t n)
{
	void *p = aligned_alloc(64, (n + 63) / 64 * 64);
	if (!p)
		abort();
	memset(p, 0, (n + 63) / 64 * 64);
	owned[n_owned++] = p;
	return p;
}

static struct k3_prov_tensor bf16_tensor(uint32_t ndim, uint64_t d0, uint64_t d1, float scale)
{
	uint64_t n = d0 * d1;
	uint16_t *w = alloc64(n * 2);
	for (uint64_t i = 0; i < n; i++)
		w[i] = to_bf16(scale * unif());
	return (struct k3_prov_tensor){ .data = w, .dtype = K3_PROV_DTYPE_BF16, .ndim = ndim,
		.shape = { d0, ndim == 2 ? d1 : 1, 1 } };
}

static struct k3_prov_tensor vec(uint64_t n)
{
	struct k3_prov_tensor t = bf16_tensor(1, n, 1, 1.0f);
	uint16_t *w = (uint16_t *)t.data;
	for (uint64_t i = 0; i < n; i++)
		w[i] = to_bf16(1.0f + 0.05f * unif());
	return t;
}

/* The I8 form of a BF16 matrix (q, zero gap, scales), and optionally its
 * dequantized F32 values. */
static struct k3_prov_tensor i8_of(const struct k3_prov_tensor *b, struct k3_prov_tensor *deq)
{
	size_t rows = b->shape[0], cols = b->shape[1];
	uint8_t *p = alloc64(K3_PROV_I8_BYTES(rows, cols));
	float *s = (float *)(p + K3_PROV_I8_SCALE_OFFSET(rows, cols));
	T_EQ_INT(k3_kern_quantize_i8_bf16(rows, cols, 0, b->data, (int8_t *)p, s, NULL), 0);
	if (deq) {
		float *f = alloc64(rows * cols * 4);
		for (size_t r = 0; r < rows; r++)
			for (size_t c = 0; c < cols; c++)
				f[r * cols + c] = (float)((int8_t *)p)[r * cols + c] * s[r];
		*deq = (struct k3_prov_tensor){ .data = f, .dtype = K3_PROV_DTYPE_F32, .ndim = 2,
			.shape = { rows, cols, 1 } };
	}
	return (struct k3_prov_tensor){ .data = p, .dtype = K3_PROV_DTYPE_I8, .ndim = 2,
		.shape = { rows, cols, 1 } };
}

static struct k3_prov_config cfg;
static struct k3_prov_layer_weights lw;
static struct k3_prov_weights w;

static void build(void)
{
	memset(&cfg, 0, sizeof(cfg));
	cfg.struct_size = sizeof(cfg);
	cfg.hidden = D;
	cfg.n_layers = 1;
	cfg.vocab = V;
	cfg.dense_inter = INTER;
	cfg.attn_res_block = 1;
	cfg.kda_heads = 2;
	cfg.kda_head_dim = 16;
	cfg.conv_kernel = 4;
	cfg.mla_heads = H;
	cfg.q_lora = QL;
	cfg.kv_lora = KVL;
	cfg.qk_nope = NOPE;
	cfg.qk_rope = ROPE;
	cfg.v_head = VH;
	cfg.rms_eps = 1e-5f;
	cfg.mla_norm_eps = 1e-6f;
	cfg.situ_beta1 = 4.0f;
	cfg.situ_beta2 = 25.0f;
	cfg.gate_lower_bound = -5.0f;
	cfg.routed_scale = 1.0f;
	cfg.attn_kind[0] = K3_PROV_ATTN_MLA;
	cfg.ffn_kind[0] = K3_PROV_FFN_DENSE;
	memset(&lw, 0, sizeof(lw));
	lw.input_norm = vec(D);
	lw.post_attn_norm = vec(D);
	lw.mlp_res_norm = vec(D);
	lw.mlp_res_proj = bf16_tensor(2, 1, D, 1.0f);
	lw.q_a_proj = bf16_tensor(2, QL, D, 0.125f);
	lw.q_a_norm = vec(QL);
	lw.q_b_proj = bf16_tensor(2, H * (NOPE + ROPE), QL, 0.17f);
	lw.kv_a_proj = bf16_tensor(2, KVL + ROPE, D, 0.125f);
	lw.kv_a_norm = vec(KVL);
	lw.kv_b_proj = bf16_tensor(2, H * (NOPE + VH), KVL, 0.17f);
	lw.g_proj = bf16_tensor(2, H * VH, D, 0.125f);
	lw.o_proj = bf16_tensor(2, D, H * VH, 0.09f);
	lw.mlp_gate = bf16_tensor(2, INTER, D, 0.125f);
	lw.mlp_up = bf16_tensor(2, INTER, D, 0.125f);
	lw.mlp_down = bf16_tensor(2, D, INTER, 0.05f);
	memset(&w, 0, sizeof(w));
	w.struct_size = sizeof(w);
	w.n_layers = 1;
	w.embed = bf16_tensor(2, V, D, 1.0f);
	w.lm_head = bf16_tensor(2, V, D, 0.125f);
	w.norm = vec(D);
	w.out_res_norm = vec(D);
	w.out_res_proj = bf16_tensor(2, 1, D, 1.0f);
	w.layers = &lw;
}

static int open_model(uint32_t flags, k3_prov_model **m, struct k3_prov_status *st)
{
	struct k3_prov_open_args a = { .struct_size = sizeof(a), .threads = 1, .max_batch = 4,
		.flags = flags, .config = &cfg, .weights = &w };
	memset(st, 0, sizeof(*st));
	return k3_provider_cpu.open(&a, m, st);
}

/* open() with one tensor replaced must fail naming `needle` */
static void refused(struct k3_prov_tensor *slot, struct k3_prov_tensor t, const char *needle)
{
	struct k3_prov_tensor keep = *slot;
	struct k3_prov_status st;
	k3_prov_model *m = NULL;

	*slot = t;
	T_EQ_INT(open_model(0, &m, &st), -EINVAL);
	if (!T_OK(strstr(st.msg, needle) != NULL))
		printf("     message: %s\n", st.msg);
	T_OK(m == NULL);
	k3_provider_cpu.close(m);
	*slot = keep;
}

static void accepted(struct k3_prov_tensor *slot, struct k3_prov_tensor t)
{
	struct k3_prov_tensor keep = *slot;
	struct k3_prov_status st;
	k3_prov_model *m = NULL;

	*slot = t;
	T_EQ_INT(open_model(0, &m, &st), 0);
	if (!m)
		printf("     message: %s\n", st.msg);
	k3_provider_cpu.close(m);
	*slot = keep;
}

/* logits with lm_head = I8 against lm_head = its dequantized F32 values */
static void logits_match(uint32_t flags)
{
	struct k3_prov_tensor keep = w.lm_head, deq;
	struct k3_prov_tensor i8 = i8_of(&keep, &deq);
	struct k3_prov_status st;
	k3_prov_model *a = NULL, *b = NULL;
	float z[3 * D], la[3 * V], lb[3 * V];

	for (int i = 0; i < 3 * D; i++)
		z[i] = unif();
	w.lm_head = i8;
	T_EQ_INT(open_model(flags, &a, &st), 0);
	w.lm_head = deq;
	T_EQ_INT(open_model(flags, &b, &st), 0);
	w.lm_head = keep;
	if (!a || !b) {
		printf("     %s\n", st.msg);
		k3_provider_cpu.close(a);
		k3_provider_cpu.close(b);
		return;
	}
	T_EQ_INT(k3_provider_cpu.logits(a, z, 3, la, &st), 0);
	T_EQ_INT(k3_provider_cpu.logits(b, z, 3, lb, &st), 0);
	/* |l| is bounded by the sum of |w x|, about sqrt(D) here */
	double worst = 0, mag = 0;
	for (int i = 0; i < 3 * V; i++) {
		if (fabs((double)la[i] - lb[i]) > worst)
			worst = fabs((double)la[i] - lb[i]);
		if (fabs(lb[i]) > mag)
			mag = fabs(lb[i]);
	}
	if (!T_OK(worst <= TOL * (mag + 1.0)))
		printf("     %s path: I8 vs dequantized logits differ by %.3g (max |l| %.3g)\n",
		       flags ? "reference" : "fast", worst, mag);
	/* and they are not the BF16 logits: the int8 spine changes them */
	k3_prov_model *c = NULL;
	T_EQ_INT(open_model(flags, &c, &st), 0);
	T_EQ_INT(k3_provider_cpu.logits(c, z, 3, lb, &st), 0);
	T_OK(memcmp(la, lb, sizeof(la)) != 0);
	k3_provider_cpu.close(a);
	k3_provider_cpu.close(b);
	k3_provider_cpu.close(c);
}

int main(void)
{
	struct k3_prov_status st;
	k3_prov_model *m = NULL;

	build();
	T_EQ_INT(open_model(0, &m, &st), 0);
	k3_provider_cpu.close(m);

	logits_match(0);
	logits_match(K3_PROV_OPEN_REFERENCE);

	accepted(&lw.q_a_proj, i8_of(&lw.q_a_proj, NULL));
	accepted(&lw.mlp_down, i8_of(&lw.mlp_down, NULL));
	accepted(&lw.o_proj, i8_of(&lw.o_proj, NULL));
	refused(&w.embed, i8_of(&w.embed, NULL), "embed_tokens");
	refused(&lw.kv_b_proj, i8_of(&lw.kv_b_proj, NULL), "kv_b_proj");
	struct k3_prov_tensor t = i8_of(&lw.g_proj, NULL);
	t.data = (const char *)t.data + 1;
	refused(&lw.g_proj, t, "aligned");
	t = i8_of(&lw.g_proj, NULL);
	t.shape[1] = D - 1;
	refused(&lw.g_proj, t, "g_proj");
	/* a vector is never I8 */
	t = lw.input_norm;
	t.dtype = K3_PROV_DTYPE_I8;
	refused(&lw.input_norm, t, "input_layernorm");
	for (int i = 0; i < n_owned; i++)
		free(owned[i]);
	return t_done();
}

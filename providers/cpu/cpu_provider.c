/*
 * cpu_provider.c - the "cpu" provider: the complete Kimi K3 text forward
 * in fp32 on the host (docs/model.md, "spec §n"), behind the ABI of
 * providers/k3_provider.h.
 *
 * Weights stay where the loader mapped them (bf16 / MXFP4 bytes, read in
 * place); only small vectors (norm weights, AttnRes score vectors, conv
 * taps, decay parameters) are converted to fp32 copies at open. Scratch for
 * max_batch positions is allocated at open, the MLA score row with its
 * cache, so the per-token path does not allocate.
 *
 * Batch invariance: every op computes position t from position t's inputs
 * (and, for KDA/MLA, the sequence state) with a loop order that does not
 * depend on T or on threads; cpu_linear's reduction order is fixed per
 * output element (see cpu_linear.c).
 */
#include "k3_provider.h"
#include "cpu/cpu_ops.h"
#include "cpu/cpu_linear.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct cpu_layer {
	uint32_t attn, ffn;
	/* The weights are readable: always, unless open() got the layer
	 * without data (a streamed layer); then between bind_layer calls.
	 * The fp32 vectors below are allocated at open either way and
	 * refilled by each bind, so binding allocates nothing. */
	bool bound;
	float *input_norm, *post_norm, *attn_u, *mlp_u;
	/* KDA */
	struct k3_cpu_mat q, k, v, fa, fb, b, g, o;
	float *conv[3];          /* [P][K] taps for q, k, v */
	float *a_exp;            /* [H] exp(A_log[h]) */
	float *dt_bias;          /* [P] */
	float *o_norm;           /* [dk] */
	/* MLA (g, o above are shared with KDA) */
	struct k3_cpu_mat qa, qb, kva, kvb;
	float *qa_norm, *kva_norm;
	/* dense MLP or shared experts */
	struct k3_cpu_mat mg, mu, md;
	/* MoE */
	struct k3_cpu_mat router, ldown, lup;
	float *rbias, *lnorm;
};

struct k3_prov_model {
	struct k3_prov_config cfg;
	uint32_t max_batch;
	int reference;
	struct k3_cpu_ctx ctx;
	struct k3_cpu_mat embed, lm_head;
	float *norm, *out_u;
	bool head_bound;         /* lm_head, norm, out_u readable (see cpu_layer.bound) */
	struct cpu_layer *layers;
	uint32_t P;              /* KDA width */
	uint32_t qhd;            /* MLA q head dim (nope + rope) */
	uint32_t wide;           /* widest per-position scratch row */
	float *sx, *s[8];        /* [max_batch][D], [max_batch][wide] */
	float *tmp;              /* [wide] per-position temporaries */
	float *tmp2;             /* [wide] */
	float *work;             /* [kda_heads][6 * kda_head_dim] KDA head temporaries */
	float *kda_win, *kda_S;  /* one KDA layer's state: kda_verify's scratch copy */
	float *mla_q;            /* [mla_heads][kv_lora + qk_rope] absorbed queries */
	float *mla_cbar;         /* [mla_heads][kv_lora] */
	float *mla_s;            /* [mla_heads][mla_s_cap] attention scores */
	struct k3_cpu_mat *mla_wuv;   /* [mla_heads] WUV_h views */
	struct k3_cpu_job *mla_jobs;  /* [mla_heads] */
	uint32_t mla_s_cap;      /* tokens; grows with the largest MLA cache */
	/* routed experts: [max_batch * top_k] slots */
	float *ey;               /* [slots][latent] per-slot expert outputs */
	float *ex;               /* [slots][max(latent, moe_inter)] gathered inputs / outputs */
	float *eg, *eu;          /* [slots][moe_inter] gate / up */
	uint32_t *eslot;         /* [slots] */
	struct k3_cpu_job *ejobs;  /* [3 * slots] */
	uint8_t *edone;          /* [slots] */
	/* routed_begin .. routed_end in progress (routed_expert fills rows) */
	const uint32_t *r_ids;   /* borrowed from routed_begin */
	uint32_t r_layer, r_T, r_rows;
	bool r_open;
};

struct k3_prov_kda_state {
	k3_prov_model *m;
	uint32_t layer;
	float *win;              /* [3 streams][K-1][P] raw projections */
	float *S;                /* [H][dk][dk], row = key channel */
	size_t n_win, n_S;
};

struct k3_prov_mla_cache {
	k3_prov_model *m;
	uint32_t layer, len, cap, row;   /* row = kv_lora + qk_rope */
	float *rows;             /* [cap][row] */
	float *score;            /* [cap] */
};

static int fail(struct k3_prov_status *st, int code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static int fail(struct k3_prov_status *st, int code, const char *fmt, ...)
{
	if (st) {
		va_list ap;
		va_start(ap, fmt);
		st->code = code;
		vsnprintf(st->msg, sizeof(st->msg), fmt, ap);
		va_end(ap);
	}
	return code;
}

/* ---------------------------------------------------------------- open */

/* How open_layer / open_head treat the tensors they are given. */
enum load_mode {
	LOAD_OPEN,       /* open(): data present, or NULL for a layer bound later */
	LOAD_DEFERRED,   /* open() of a layer bound later: shapes only, every data NULL */
	LOAD_BIND,       /* bind_layer / bind_head: data present, dtypes as at open */
};

/* Matrices the cpu provider reads other than as the operand of a row-wise
 * product, so never as I8: the embedding (rows gathered) and MLA's
 * kv_b_proj (its WUK half runs transposed, spec §6.5). */
static const char *const no_i8[] = { "embed_tokens", "kv_b_proj" };

/* An I8 matrix (the int8 spine, k3_provider.h): q[rows][cols] then the
 * row scales, 4-byte aligned. */
static int get_mat_i8(const struct k3_prov_tensor *t, uint32_t rows, uint32_t cols,
		      struct k3_cpu_mat *out, const char *name, uint32_t layer,
		      enum load_mode mode, struct k3_prov_status *st)
{
	for (size_t i = 0; i < sizeof(no_i8) / sizeof(no_i8[0]); i++)
		if (strcmp(name, no_i8[i]) == 0)
			return fail(st, -EINVAL, "layer %u tensor '%s': int8 (I8) is not accepted here"
				    " (not the operand of a row-wise product); keep it bf16",
				    layer, name);
	if ((mode == LOAD_DEFERRED) != !t->data || t->ndim != 2 || t->shape[0] != rows ||
	    t->shape[1] != cols)
		return fail(st, -EINVAL, "layer %u tensor '%s': I8 shape [%llu, %llu] (ndim %u)%s, want"
			    " [%u, %u]%s", layer, name, (unsigned long long)t->shape[0],
			    (unsigned long long)t->shape[1], t->ndim, t->data ? "" : " without data",
			    rows, cols, mode == LOAD_DEFERRED ? " without data (the layer is bound later)"
							      : " with data");
	if ((uintptr_t)t->data % 4)
		return fail(st, -EINVAL, "layer %u tensor '%s': I8 payload not 4-byte aligned (its row"
			    " scales follow it)", layer, name);
	if (mode == LOAD_BIND && t->dtype != out->dtype)
		return fail(st, -EINVAL, "layer %u tensor '%s': bound with dtype %u, opened with %u",
			    layer, name, t->dtype, out->dtype);
	out->data = t->data;
	out->dtype = t->dtype;
	out->rows = rows;
	out->cols = cols;
	return 0;
}

static int get_mat(const struct k3_prov_tensor *t, uint32_t rows, uint32_t cols,
		   struct k3_cpu_mat *out, const char *name, uint32_t layer,
		   enum load_mode mode, struct k3_prov_status *st)
{
	if (t->dtype == K3_PROV_DTYPE_I8)
		return get_mat_i8(t, rows, cols, out, name, layer, mode, st);
	if (t->dtype != K3_PROV_DTYPE_BF16 && t->dtype != K3_PROV_DTYPE_F32)
		return fail(st, -EINVAL, "layer %u tensor '%s': dtype %u is not bf16 or f32",
			    layer, name, t->dtype);
	if (t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols ||
	    (mode == LOAD_DEFERRED) != !t->data)
		return fail(st, -EINVAL, "layer %u tensor '%s': shape [%llu, %llu] (ndim %u)%s, want"
			    " [%u, %u]%s", layer, name, (unsigned long long)t->shape[0],
			    (unsigned long long)t->shape[1], t->ndim, t->data ? "" : " without data",
			    rows, cols, mode == LOAD_DEFERRED ? " without data (the layer is bound later)"
							      : " with data");
	if ((uintptr_t)t->data % (t->dtype == K3_PROV_DTYPE_BF16 ? 2 : 4))
		return fail(st, -EINVAL, "layer %u tensor '%s': payload not aligned to its element size",
			    layer, name);
	if (mode == LOAD_BIND && t->dtype != out->dtype)
		return fail(st, -EINVAL, "layer %u tensor '%s': bound with dtype %u, opened with %u",
			    layer, name, t->dtype, out->dtype);
	out->data = t->data;
	out->dtype = t->dtype;
	out->rows = rows;
	out->cols = cols;
	return 0;
}

static uint64_t numel(const struct k3_prov_tensor *t)
{
	uint64_t n = 1;
	for (uint32_t i = 0; i < t->ndim && i < 3; i++)
		n *= t->shape[i];
	return n;
}

/* Value i of a small bf16 or f32 tensor (memcpy: small tensors carry no
 * alignment promise). */
static float vec_at(const struct k3_prov_tensor *t, uint64_t i)
{
	if (t->dtype == K3_PROV_DTYPE_BF16) {
		uint16_t b;
		memcpy(&b, (const char *)t->data + 2 * i, 2);
		return k3_cpu_bf16(b);
	}
	float f;
	memcpy(&f, (const char *)t->data + 4 * i, 4);
	return f;
}

/* fp32 copy of the first n values of a small tensor (bf16 or f32); the
 * tensor must hold exactly n values, or at least n when at_least. *out is
 * allocated when NULL (open), else refilled (bind); LOAD_DEFERRED only
 * allocates. */
static int get_vec(const struct k3_prov_tensor *t, uint32_t n, int at_least,
		   float **out, const char *name, uint32_t layer, enum load_mode mode,
		   struct k3_prov_status *st)
{
	uint64_t have = numel(t);
	if ((mode == LOAD_DEFERRED) != !t->data || t->ndim < 1 || t->ndim > 3 ||
	    (t->dtype != K3_PROV_DTYPE_BF16 && t->dtype != K3_PROV_DTYPE_F32) ||
	    (at_least ? have < n : have != n))
		return fail(st, -EINVAL, "layer %u tensor '%s': want %s%u bf16/f32 values%s, have %llu"
			    " (dtype %u%s)", layer, name, at_least ? ">= " : "", n,
			    mode == LOAD_DEFERRED ? " without data (the layer is bound later)" : "",
			    (unsigned long long)have, t->dtype, t->data ? "" : ", no data");
	if (!*out && !(*out = calloc(n, sizeof(float))))
		return fail(st, -ENOMEM, "out of memory for '%s'", name);
	if (mode != LOAD_DEFERRED)
		for (uint32_t i = 0; i < n; i++)
			(*out)[i] = vec_at(t, i);
	return 0;
}

/* u = nw * pw, the folded AttnRes score vector (spec §4.2). */
static int get_mix(const struct k3_prov_tensor *nw, const struct k3_prov_tensor *pw,
		   uint32_t D, float **out, const char *name, uint32_t layer,
		   enum load_mode mode, struct k3_prov_status *st)
{
	int rc = get_vec(nw, D, 0, out, name, layer, mode, st);
	if (rc)
		return rc;
	if ((mode == LOAD_DEFERRED) != !pw->data || numel(pw) != D ||
	    (pw->dtype != K3_PROV_DTYPE_BF16 && pw->dtype != K3_PROV_DTYPE_F32) ||
	    pw->ndim < 1 || pw->ndim > 3)
		return fail(st, -EINVAL, "layer %u tensor '%s': the projection wants %u bf16/f32"
			    " values, has %llu (dtype %u)", layer, name, D,
			    (unsigned long long)numel(pw), pw->dtype);
	if (mode != LOAD_DEFERRED)
		for (uint32_t d = 0; d < D; d++)
			(*out)[d] *= vec_at(pw, d);
	return 0;
}

static void free_layer(struct cpu_layer *L)
{
	free(L->input_norm); free(L->post_norm); free(L->attn_u); free(L->mlp_u);
	for (int i = 0; i < 3; i++)
		free(L->conv[i]);
	free(L->a_exp); free(L->dt_bias); free(L->o_norm);
	free(L->qa_norm); free(L->kva_norm);
	free(L->rbias); free(L->lnorm);
}

static void cpu_close(k3_prov_model *m)
{
	if (!m)
		return;
	if (m->layers)
		for (uint32_t l = 0; l < m->cfg.n_layers; l++)
			free_layer(&m->layers[l]);
	free(m->layers);
	free(m->norm);
	free(m->out_u);
	free(m->sx);
	for (int i = 0; i < 8; i++)
		free(m->s[i]);
	free(m->tmp);
	free(m->tmp2);
	free(m->work);
	free(m->kda_win);
	free(m->kda_S);
	free(m->mla_q);
	free(m->mla_cbar);
	free(m->mla_s);
	free(m->mla_wuv);
	free(m->mla_jobs);
	free(m->ey);
	free(m->ex);
	free(m->eg);
	free(m->eu);
	free(m->eslot);
	free(m->ejobs);
	free(m->edone);
	k3_cpu_ctx_release(&m->ctx);
	free(m);
}

static int check_config(const struct k3_prov_config *c, struct k3_prov_status *st)
{
	if (c->struct_size < sizeof(*c))
		return fail(st, -EPROTO, "config struct_size %u < %zu", c->struct_size, sizeof(*c));
	if (!c->hidden || !c->n_layers || c->n_layers > K3_PROV_MAX_LAYERS || !c->vocab)
		return fail(st, -EINVAL, "config: hidden, layers (1..%d) and vocab must be set",
			    K3_PROV_MAX_LAYERS);
	if (!c->attn_res_block ||
	    (c->n_layers + c->attn_res_block - 1) / c->attn_res_block + 2 > K3_KERN_ATTNRES_MAX_CAND)
		return fail(st, -EINVAL, "config: attn_res_block %u gives too many AttnRes candidates",
			    c->attn_res_block);
	if (c->n_experts > 1024 || c->top_k > c->n_experts)
		return fail(st, -EINVAL, "config: %u experts top-%u unsupported (<= 1024 experts)",
			    c->n_experts, c->top_k);
	if (c->latent % 32 || c->moe_inter % 32)
		return fail(st, -EINVAL, "config: MXFP4 expert dims %u, %u must be multiples of 32",
			    c->latent, c->moe_inter);
	if (!c->kda_head_dim || c->kda_head_dim > 1024 || c->top_k > 64)
		return fail(st, -EINVAL, "config: KDA head dim %u (1..1024) or top-k %u (<= 64) unsupported",
			    c->kda_head_dim, c->top_k);
	if (!c->conv_kernel || c->conv_kernel > 16)
		return fail(st, -EINVAL, "config: conv kernel %u unsupported", c->conv_kernel);
	for (uint32_t l = 0; l < c->n_layers; l++) {
		if (c->attn_kind[l] != K3_PROV_ATTN_KDA && c->attn_kind[l] != K3_PROV_ATTN_MLA)
			return fail(st, -EINVAL, "config: layer %u attention kind %u", l, c->attn_kind[l]);
		if (c->ffn_kind[l] != K3_PROV_FFN_DENSE && c->ffn_kind[l] != K3_PROV_FFN_MOE)
			return fail(st, -EINVAL, "config: layer %u ffn kind %u", l, c->ffn_kind[l]);
		if (c->ffn_kind[l] == K3_PROV_FFN_MOE && (!c->n_experts || !c->top_k || !c->latent))
			return fail(st, -EINVAL, "config: layer %u is MoE without experts/latent", l);
	}
	return 0;
}

static uint32_t umax(uint32_t a, uint32_t b)
{
	return a > b ? a : b;
}

/* Layer l's view of w: its matrices borrowed, its vectors converted into
 * the layer's fp32 buffers (allocated the first time). mode LOAD_OPEN
 * decides between a readable layer and one bound later (input_layernorm
 * without data: then every tensor must come without data). */
static int open_layer(k3_prov_model *m, uint32_t l, const struct k3_prov_layer_weights *w,
		      enum load_mode mode, struct k3_prov_status *st)
{
	const struct k3_prov_config *c = &m->cfg;
	struct cpu_layer *L = &m->layers[l];
	uint32_t D = c->hidden, P = m->P;
	int rc;

	if (mode == LOAD_OPEN)
		mode = w->input_norm.data ? LOAD_OPEN : LOAD_DEFERRED;
	L->attn = c->attn_kind[l];
	L->ffn = c->ffn_kind[l];
	L->bound = false;
#define TRY(x) do { if ((rc = (x)) != 0) return rc; } while (0)
	TRY(get_vec(&w->input_norm, D, 0, &L->input_norm, "input_layernorm", l, mode, st));
	TRY(get_vec(&w->post_attn_norm, D, 0, &L->post_norm, "post_attention_layernorm", l, mode, st));
	if (l > 0)
		TRY(get_mix(&w->attn_res_norm, &w->attn_res_proj, D, &L->attn_u,
			    "self_attention_res_{norm,proj}", l, mode, st));
	TRY(get_mix(&w->mlp_res_norm, &w->mlp_res_proj, D, &L->mlp_u, "mlp_res_{norm,proj}", l, mode, st));

	if (L->attn == K3_PROV_ATTN_KDA) {
		uint32_t H = c->kda_heads, dk = c->kda_head_dim, K = c->conv_kernel;
		TRY(get_mat(&w->q_proj, P, D, &L->q, "q_proj", l, mode, st));
		TRY(get_mat(&w->k_proj, P, D, &L->k, "k_proj", l, mode, st));
		TRY(get_mat(&w->v_proj, P, D, &L->v, "v_proj", l, mode, st));
		TRY(get_mat(&w->f_a_proj, dk, D, &L->fa, "f_a_proj", l, mode, st));
		TRY(get_mat(&w->f_b_proj, P, dk, &L->fb, "f_b_proj", l, mode, st));
		TRY(get_mat(&w->b_proj, H, D, &L->b, "b_proj", l, mode, st));
		TRY(get_mat(&w->g_proj, P, D, &L->g, "g_proj", l, mode, st));
		TRY(get_mat(&w->o_proj, D, P, &L->o, "o_proj", l, mode, st));
		TRY(get_vec(&w->q_conv, P * K, 0, &L->conv[0], "q_conv1d", l, mode, st));
		TRY(get_vec(&w->k_conv, P * K, 0, &L->conv[1], "k_conv1d", l, mode, st));
		TRY(get_vec(&w->v_conv, P * K, 0, &L->conv[2], "v_conv1d", l, mode, st));
		/* A_log: stored padded (K3: [128] for 96 heads); first H are per head. */
		TRY(get_vec(&w->a_log, H, 1, &L->a_exp, "A_log", l, mode, st));
		for (uint32_t h = 0; h < H && mode != LOAD_DEFERRED; h++)
			L->a_exp[h] = expf(L->a_exp[h]);
		TRY(get_vec(&w->dt_bias, P, 0, &L->dt_bias, "dt_bias", l, mode, st));
		TRY(get_vec(&w->o_norm, dk, 0, &L->o_norm, "o_norm", l, mode, st));
	} else {
		uint32_t H = c->mla_heads;
		TRY(get_mat(&w->q_a_proj, c->q_lora, D, &L->qa, "q_a_proj", l, mode, st));
		TRY(get_vec(&w->q_a_norm, c->q_lora, 0, &L->qa_norm, "q_a_layernorm", l, mode, st));
		TRY(get_mat(&w->q_b_proj, H * m->qhd, c->q_lora, &L->qb, "q_b_proj", l, mode, st));
		TRY(get_mat(&w->kv_a_proj, c->kv_lora + c->qk_rope, D, &L->kva,
			    "kv_a_proj_with_mqa", l, mode, st));
		TRY(get_vec(&w->kv_a_norm, c->kv_lora, 0, &L->kva_norm, "kv_a_layernorm", l, mode, st));
		TRY(get_mat(&w->kv_b_proj, H * (c->qk_nope + c->v_head), c->kv_lora, &L->kvb,
			    "kv_b_proj", l, mode, st));
		TRY(get_mat(&w->g_proj, H * c->v_head, D, &L->g, "g_proj", l, mode, st));
		TRY(get_mat(&w->o_proj, D, H * c->v_head, &L->o, "o_proj", l, mode, st));
	}

	uint32_t inter = L->ffn == K3_PROV_FFN_DENSE ? c->dense_inter : c->shared_inter;
	TRY(get_mat(&w->mlp_gate, inter, D, &L->mg, "gate_proj", l, mode, st));
	TRY(get_mat(&w->mlp_up, inter, D, &L->mu, "up_proj", l, mode, st));
	TRY(get_mat(&w->mlp_down, D, inter, &L->md, "down_proj", l, mode, st));
	if (L->ffn == K3_PROV_FFN_MOE) {
		TRY(get_mat(&w->router, c->n_experts, D, &L->router, "gate", l, mode, st));
		TRY(get_vec(&w->router_bias, c->n_experts, 0, &L->rbias, "e_score_correction_bias", l, mode, st));
		TRY(get_mat(&w->lat_down, c->latent, D, &L->ldown, "routed_expert_down_proj", l, mode, st));
		TRY(get_vec(&w->lat_norm, c->latent, 0, &L->lnorm, "routed_expert_norm", l, mode, st));
		TRY(get_mat(&w->lat_up, D, c->latent, &L->lup, "routed_expert_up_proj", l, mode, st));
	}
#undef TRY
	L->bound = mode != LOAD_DEFERRED;
	return 0;
}

/* The head's view of w (lm_head, model.norm, the output AttnRes pair), as
 * open_layer does for a layer. */
static int open_head(k3_prov_model *m, const struct k3_prov_weights *w, enum load_mode mode,
		     struct k3_prov_status *st)
{
	uint32_t D = m->cfg.hidden;
	int rc;

	if (mode == LOAD_OPEN)
		mode = w->lm_head.data ? LOAD_OPEN : LOAD_DEFERRED;
	m->head_bound = false;
	rc = get_mat(&w->lm_head, m->cfg.vocab, D, &m->lm_head, "lm_head", 0, mode, st);
	if (!rc)
		rc = get_vec(&w->norm, D, 0, &m->norm, "model.norm", 0, mode, st);
	if (!rc)
		rc = get_mix(&w->out_res_norm, &w->out_res_proj, D, &m->out_u,
			     "output_attn_res_{norm,proj}", 0, mode, st);
	m->head_bound = rc == 0 && mode != LOAD_DEFERRED;
	return rc;
}

static int cpu_open(const struct k3_prov_open_args *a, k3_prov_model **out,
		    struct k3_prov_status *st)
{
	if (!a || a->struct_size < sizeof(*a))
		return fail(st, -EPROTO, "open args struct too small");
	if (!a->config || !a->weights)
		return fail(st, -EINVAL, "open args: config and weights are required");
	int rc = check_config(a->config, st);
	if (rc)
		return rc;
	const struct k3_prov_weights *w = a->weights;
	if (w->struct_size < sizeof(*w) || w->n_layers != a->config->n_layers || !w->layers)
		return fail(st, -EINVAL, "weights: %u layers for a %u-layer config",
			    w->n_layers, a->config->n_layers);
	if (!a->max_batch || a->max_batch > 65536)
		return fail(st, -EINVAL, "max_batch %u not in 1..65536", a->max_batch);

	k3_prov_model *m = calloc(1, sizeof(*m));
	if (!m)
		return fail(st, -ENOMEM, "out of memory");
	m->cfg = *a->config;
	m->max_batch = a->max_batch;
	m->reference = (a->flags & K3_PROV_OPEN_REFERENCE) != 0;
	const struct k3_prov_config *c = &m->cfg;
	uint32_t D = c->hidden;
	m->P = c->kda_heads * c->kda_head_dim;
	m->qhd = c->qk_nope + c->qk_rope;

	rc = k3_cpu_ctx_init(&m->ctx, a->threads, m->reference);
	m->ctx.split_all = (a->flags & K3_PROV_OPEN_SPLIT_ALL) != 0;
	if (rc) {
		free(m);
		return fail(st, rc, "cannot start %u compute threads", a->threads);
	}
	m->layers = calloc(c->n_layers, sizeof(*m->layers));
	if (!m->layers) {
		rc = fail(st, -ENOMEM, "out of memory");
		goto err;
	}
	/* The embedding without data is streamed: only embed_rows reads it. */
	rc = get_mat(&w->embed, c->vocab, D, &m->embed, "embed_tokens", 0,
		     w->embed.data ? LOAD_OPEN : LOAD_DEFERRED, st);
	if (!rc)
		rc = open_head(m, w, LOAD_OPEN, st);
	for (uint32_t l = 0; !rc && l < c->n_layers; l++)
		rc = open_layer(m, l, &w->layers[l], LOAD_OPEN, st);
	if (rc)
		goto err;

	uint32_t wide = D;
	wide = umax(wide, m->P);
	wide = umax(wide, c->mla_heads * m->qhd);
	wide = umax(wide, c->mla_heads * c->v_head);
	wide = umax(wide, c->mla_heads * (c->qk_nope + c->v_head));
	wide = umax(wide, c->dense_inter);
	wide = umax(wide, c->shared_inter);
	wide = umax(wide, c->q_lora);
	wide = umax(wide, c->kv_lora + c->qk_rope);
	wide = umax(wide, c->latent);
	wide = umax(wide, c->moe_inter);
	wide = umax(wide, c->n_experts);
	m->wide = wide;
	size_t B = m->max_batch;
	m->sx = malloc(B * D * sizeof(float));
	m->tmp = malloc((size_t)wide * sizeof(float));
	m->tmp2 = malloc((size_t)wide * sizeof(float));
	size_t slots = B * (c->top_k ? c->top_k : 1);
	size_t ew = umax(umax(c->latent, c->moe_inter), 1);
	m->mla_q = malloc((size_t)umax(c->mla_heads, 1) * (c->kv_lora + c->qk_rope + 1) * sizeof(float));
	m->mla_wuv = calloc(umax(c->mla_heads, 1), sizeof(*m->mla_wuv));
	m->mla_jobs = calloc(umax(c->mla_heads, 1), sizeof(*m->mla_jobs));
	m->mla_cbar = malloc((size_t)umax(c->mla_heads, 1) * (c->kv_lora + 1) * sizeof(float));
	m->work = malloc((size_t)6 * umax(c->kda_head_dim, 1) * umax(c->kda_heads, 1) * sizeof(float));
	m->kda_win = malloc(((size_t)3 * (c->conv_kernel - 1) * m->P + 1) * sizeof(float));
	m->kda_S = malloc(((size_t)c->kda_heads * c->kda_head_dim * c->kda_head_dim + 1) * sizeof(float));
	m->ey = malloc(slots * ew * sizeof(float));
	m->ex = malloc(slots * ew * sizeof(float));
	m->eg = malloc(slots * ew * sizeof(float));
	m->eu = malloc(slots * ew * sizeof(float));
	m->eslot = malloc(slots * sizeof(uint32_t));
	m->ejobs = malloc(3 * slots * sizeof(struct k3_cpu_job));
	m->edone = malloc(slots);
	rc = (m->sx && m->tmp && m->tmp2 && m->work && m->kda_win && m->kda_S && m->mla_q &&
	      m->mla_cbar && m->mla_wuv &&
	      m->mla_jobs && m->ey && m->ex && m->eg && m->eu &&
	      m->eslot && m->ejobs && m->edone) ? 0 : -ENOMEM;
	for (int i = 0; i < 8; i++) {
		m->s[i] = malloc(B * wide * sizeof(float));
		if (!m->s[i])
			rc = -ENOMEM;
	}
	if (rc) {
		fail(st, rc, "out of memory for scratch (%zu x %u floats)", B, wide);
		goto err;
	}
	*out = m;
	return 0;
err:
	cpu_close(m);
	return rc;
}

/* ---------------------------------------------------------------- state */

static int cpu_kda_state_new(k3_prov_model *m, uint32_t layer, k3_prov_kda_state **out,
			     struct k3_prov_status *st)
{
	if (layer >= m->cfg.n_layers || m->cfg.attn_kind[layer] != K3_PROV_ATTN_KDA)
		return fail(st, -EINVAL, "layer %u is not a KDA layer", layer);
	k3_prov_kda_state *s = calloc(1, sizeof(*s));
	if (!s)
		return fail(st, -ENOMEM, "out of memory");
	s->m = m;
	s->layer = layer;
	s->n_win = (size_t)3 * (m->cfg.conv_kernel - 1) * m->P;
	s->n_S = (size_t)m->cfg.kda_heads * m->cfg.kda_head_dim * m->cfg.kda_head_dim;
	s->win = calloc(s->n_win + 1, sizeof(float));
	s->S = calloc(s->n_S, sizeof(float));
	if (!s->win || !s->S) {
		free(s->win);
		free(s->S);
		free(s);
		return fail(st, -ENOMEM, "out of memory for KDA state");
	}
	*out = s;
	return 0;
}

static void cpu_kda_state_free(k3_prov_kda_state *s)
{
	if (!s)
		return;
	free(s->win);
	free(s->S);
	free(s);
}

static void cpu_kda_state_reset(k3_prov_kda_state *s)
{
	memset(s->win, 0, s->n_win * sizeof(float));
	memset(s->S, 0, s->n_S * sizeof(float));
}

static int cpu_kda_state_copy(k3_prov_kda_state *dst, const k3_prov_kda_state *src,
			      struct k3_prov_status *st)
{
	if (dst->m != src->m || dst->layer != src->layer)
		return fail(st, -EINVAL, "KDA state copy across layers %u -> %u", src->layer, dst->layer);
	memcpy(dst->win, src->win, src->n_win * sizeof(float));
	memcpy(dst->S, src->S, src->n_S * sizeof(float));
	return 0;
}

static int mla_reserve(k3_prov_mla_cache *c, uint32_t need, struct k3_prov_status *st)
{
	if (need <= c->cap)
		return 0;
	uint64_t cap = c->cap ? c->cap : 16;
	while (cap < need)
		cap *= 2;
	if (cap > (1u << 24))
		return fail(st, -E2BIG, "MLA cache of %u tokens exceeds the limit of %u", need, 1u << 24);
	float *rows = realloc(c->rows, cap * c->row * sizeof(float));
	if (!rows)
		return fail(st, -ENOMEM, "out of memory for an MLA cache of %u tokens", need);
	c->rows = rows;
	float *score = realloc(c->score, cap * sizeof(float));
	if (!score)
		return fail(st, -ENOMEM, "out of memory for an MLA cache of %u tokens", need);
	c->score = score;
	c->cap = (uint32_t)cap;
	/* the provider-wide score rows must hold the longest cache */
	k3_prov_model *m = c->m;
	if (m->mla_s_cap < cap) {
		float *ms = realloc(m->mla_s, (size_t)umax(m->cfg.mla_heads, 1) * cap * sizeof(float));
		if (!ms)
			return fail(st, -ENOMEM, "out of memory for MLA scores of %u tokens", need);
		m->mla_s = ms;
		m->mla_s_cap = (uint32_t)cap;
	}
	return 0;
}

static void cpu_mla_cache_free(k3_prov_mla_cache *c)
{
	if (!c)
		return;
	free(c->rows);
	free(c->score);
	free(c);
}

static int cpu_mla_cache_new(k3_prov_model *m, uint32_t layer, uint32_t capacity,
			     k3_prov_mla_cache **out, struct k3_prov_status *st)
{
	if (layer >= m->cfg.n_layers || m->cfg.attn_kind[layer] != K3_PROV_ATTN_MLA)
		return fail(st, -EINVAL, "layer %u is not an MLA layer", layer);
	k3_prov_mla_cache *c = calloc(1, sizeof(*c));
	if (!c)
		return fail(st, -ENOMEM, "out of memory");
	c->m = m;
	c->layer = layer;
	c->row = m->cfg.kv_lora + m->cfg.qk_rope;
	int rc = mla_reserve(c, capacity ? capacity : 16, st);
	if (rc) {
		cpu_mla_cache_free(c);
		return rc;
	}
	*out = c;
	return 0;
}

static uint32_t cpu_mla_cache_len(const k3_prov_mla_cache *c)
{
	return c->len;
}

static void cpu_mla_cache_truncate(k3_prov_mla_cache *c, uint32_t n)
{
	if (n < c->len)
		c->len = n;
}

static int cpu_mla_cache_copy(k3_prov_mla_cache *dst, const k3_prov_mla_cache *src,
			      struct k3_prov_status *st)
{
	if (dst->m != src->m || dst->layer != src->layer)
		return fail(st, -EINVAL, "MLA cache copy across layers %u -> %u", src->layer, dst->layer);
	int rc = mla_reserve(dst, src->len, st);
	if (rc)
		return rc;
	memcpy(dst->rows, src->rows, (size_t)src->len * src->row * sizeof(float));
	dst->len = src->len;
	return 0;
}

/* ---------------------------------------------------------------- ops */

static int check_T(k3_prov_model *m, uint32_t T, struct k3_prov_status *st)
{
	if (T == 0 || T > m->max_batch)
		return fail(st, -EINVAL, "batch of %u positions not in 1..%u", T, m->max_batch);
	return 0;
}

/* Layer in range and of the given kinds (0: any); its weights need not
 * be bound (KDA records and replay read only the provider's own vectors). */
static int check_kind(k3_prov_model *m, uint32_t layer, uint32_t attn, uint32_t ffn,
		      struct k3_prov_status *st)
{
	if (layer >= m->cfg.n_layers)
		return fail(st, -EINVAL, "layer %u out of range (%u layers)", layer, m->cfg.n_layers);
	if (attn && m->layers[layer].attn != attn)
		return fail(st, -EINVAL, "layer %u has attention kind %u, not %u",
			    layer, m->layers[layer].attn, attn);
	if (ffn && m->layers[layer].ffn != ffn)
		return fail(st, -EINVAL, "layer %u has ffn kind %u, not %u",
			    layer, m->layers[layer].ffn, ffn);
	return 0;
}

static int check_layer(k3_prov_model *m, uint32_t layer, uint32_t attn, uint32_t ffn,
		       struct k3_prov_status *st)
{
	int rc = check_kind(m, layer, attn, ffn, st);
	if (rc)
		return rc;
	if (!m->layers[layer].bound)
		return fail(st, -EINVAL, "layer %u is not bound (its weights stream: bind_layer"
			    " before its ops)", layer);
	return 0;
}

static void linear(k3_prov_model *m, const struct k3_cpu_mat *W, const float *x,
		   uint32_t T, float *y)
{
	k3_cpu_linear(&m->ctx, W, x, W->cols, T, y, W->rows);
}

#define JOB(Wm, X, LDX, TT, Y, LDY) \
	((struct k3_cpu_job){ .W = (Wm), .x = (X), .ldx = (LDX), .T = (TT), .y = (Y), .ldy = (LDY) })
#define MXJOB(P_, S_, R_, C_, X, LDX, TT, Y, LDY) \
	((struct k3_cpu_job){ .packed = (P_), .scale = (S_), .rows = (R_), .cols = (C_), \
			      .x = (X), .ldx = (LDX), .T = (TT), .y = (Y), .ldy = (LDY) })

static void store(float *out, const float *y, size_t n, uint32_t flags)
{
	if (flags & K3_PROV_OUT_ACCUMULATE)
		for (size_t i = 0; i < n; i++)
			out[i] += y[i];
	else
		memcpy(out, y, n * sizeof(float));
}

static int cpu_embed(k3_prov_model *m, const int32_t *ids, uint32_t T, float *out,
		     struct k3_prov_status *st)
{
	uint32_t D = m->cfg.hidden;
	if (!m->embed.data)
		return fail(st, -EINVAL, "the embedding was opened without data (streamed): use"
			    " embed_rows");
	for (uint32_t t = 0; t < T; t++) {
		if (ids[t] < 0 || (uint32_t)ids[t] >= m->cfg.vocab)
			return fail(st, -EINVAL, "token id %d not in 0..%u", ids[t], m->cfg.vocab - 1);
		size_t off = (size_t)ids[t] * D;
		for (uint32_t d = 0; d < D; d++)
			out[(size_t)t * D + d] = m->embed.dtype == K3_PROV_DTYPE_BF16
				? k3_cpu_bf16(((const uint16_t *)m->embed.data)[off + d])
				: ((const float *)m->embed.data)[off + d];
	}
	return 0;
}

static int cpu_attnres_mix(k3_prov_model *m, uint32_t site, uint32_t layer,
			   const float *const *cands, uint32_t n, uint32_t T,
			   float *out, struct k3_prov_status *st)
{
	const float *u;
	uint32_t D = m->cfg.hidden;

	if (n == 0 || n > K3_KERN_ATTNRES_MAX_CAND)
		return fail(st, -EINVAL, "AttnRes mix of %u candidates not in 1..%d",
			    n, K3_KERN_ATTNRES_MAX_CAND);
	if (site == K3_PROV_MIX_OUTPUT) {
		if (!m->head_bound)
			return fail(st, -EINVAL, "the head is not bound (it streams: bind_head first)");
		u = m->out_u;
	} else {
		int rc = check_layer(m, layer, 0, 0, st);
		if (rc)
			return rc;
		u = site == K3_PROV_MIX_ATTN ? m->layers[layer].attn_u
		  : site == K3_PROV_MIX_MLP ? m->layers[layer].mlp_u : NULL;
		if (!u)
			return fail(st, -EINVAL, "layer %u has no AttnRes site %u", layer, site);
	}
	const float *row[K3_KERN_ATTNRES_MAX_CAND];
	for (uint32_t t = 0; t < T; t++) {
		for (uint32_t j = 0; j < n; j++)
			row[j] = cands[j] + (size_t)t * D;
		if (m->reference)
			k3_cpu_ref_attnres(row, n, D, u, m->cfg.rms_eps, out + (size_t)t * D);
		else
			k3_kern_attnres(D, n, row, u, m->cfg.rms_eps, out + (size_t)t * D);
	}
	return 0;
}

static void rmsnorm(const k3_prov_model *m, const float *x, const float *w, uint32_t n,
		    float eps, float *y)
{
	if (m->reference)
		k3_cpu_ref_rmsnorm(x, w, n, eps, y);
	else
		k3_kern_rmsnorm(n, x, w, eps, y);
}

static void norm_rows(const k3_prov_model *m, const float *h, const float *w, uint32_t T,
		      uint32_t n, float eps, float *x, size_t ld_in, size_t ld_out)
{
	for (uint32_t t = 0; t < T; t++)
		rmsnorm(m, h + t * ld_in, w, n, eps, x + t * ld_out);
}

static void situ_rows(const k3_prov_model *m, float *g, const float *u, uint32_t n)
{
	const struct k3_prov_config *c = &m->cfg;
	if (m->reference)
		for (uint32_t i = 0; i < n; i++)
			g[i] = k3_cpu_situ(g[i], u[i], c->situ_beta1, c->situ_beta2);
	else
		k3_kern_situ_glu(n, g, u, c->situ_beta1, c->situ_beta2, g);
}

/* One KDA position of head hh (spec §5.3-5.6): q, k, v post-conv, f decay
 * logits, b beta logit, gz gate logits; writes z[dk]. z == NULL (a replay,
 * which only advances the state) skips the gated output norm, which reads
 * the state but never writes it. */
static void kda_head(const k3_prov_model *m, const struct cpu_layer *L, float *S,
		     uint32_t hh, const float *q, const float *k, const float *v,
		     const float *f, float b, const float *gz, float *z, float *work)
{
	const struct k3_prov_config *c = &m->cfg;
	uint32_t dk = c->kda_head_dim;
	size_t c0 = (size_t)hh * dk;
	float *alpha = work, *o = work + dk, *qn = work + 2 * dk, *kn = work + 3 * dk;
	float *scratch = work + 4 * dk;
	float beta = k3_cpu_sigmoid(b);

	if (m->reference) {
		for (uint32_t i = 0; i < dk; i++)
			alpha[i] = expf(c->gate_lower_bound *
				k3_cpu_sigmoid(L->a_exp[hh] * (f[i] + L->dt_bias[c0 + i])));
		k3_cpu_ref_kda_head(S, dk, dk, q, k, v, alpha, beta, o);
		if (!z)
			return;
		double ss = 0.0;
		for (uint32_t j = 0; j < dk; j++)
			ss += (double)o[j] * o[j];
		float r = (float)(1.0 / sqrt(ss / dk + c->rms_eps));
		for (uint32_t j = 0; j < dk; j++)
			z[j] = o[j] * r * L->o_norm[j] * k3_cpu_sigmoid(gz[j]);
		return;
	}
	k3_kern_kda_decay(dk, f, L->dt_bias + c0, L->a_exp[hh], c->gate_lower_bound, alpha);
	k3_kern_l2norm(dk, q, 1e-6f, 1.0f / sqrtf((float)dk), qn);
	k3_kern_l2norm(dk, k, 1e-6f, 1.0f, kn);
	k3_kern_kda_step(dk, dk, S, qn, kn, v, alpha, beta, o, scratch);
	if (z)
		k3_kern_rmsnorm_gated(dk, o, L->o_norm, gz, c->rms_eps, z);
}

/* Heads [begin, end) of one KDA position; each head uses its own slice of
 * m->work, so heads can run on different threads. */
struct kda_heads_job {
	const k3_prov_model *m;
	const struct cpu_layer *L;
	float *S;
	const float *q, *k, *v, *f, *b, *gz;
	float *z;                /* NULL: state only (replay) */
};

static void kda_heads_task(void *arg, size_t begin, size_t end)
{
	const struct kda_heads_job *j = arg;
	uint32_t dk = j->m->cfg.kda_head_dim;
	for (size_t hh = begin; hh < end; hh++) {
		size_t c0 = hh * dk;
		kda_head(j->m, j->L, j->S + c0 * dk, (uint32_t)hh, j->q + c0, j->k + c0, j->v + c0,
			 j->f + c0, j->b[hh], j->gz ? j->gz + c0 : NULL, j->z ? j->z + c0 : NULL,
			 j->m->work + 6 * c0);
	}
}

static void conv_step(const k3_prov_model *m, float *win, const float *w, const float *x,
		      float *y)
{
	uint32_t K = m->cfg.conv_kernel;
	if (m->reference || K != 4)
		k3_cpu_ref_conv_step(win, w, m->P, K, x, y);
	else
		k3_kern_kda_conv_silu(m->P, w, win, x, y);
}

/*
 * The per-token part of a KDA sub-layer (spec §5.2-5.6) over T positions,
 * strictly in order, on the state (win, S): rows [T][ld] of the raw q, k,
 * v projections (qp's rows are consumed: the v conv output lands there),
 * the decay logits f, the beta logits bl and the gate logits gz, into the
 * head outputs z ([T][ld]; NULL for a replay, which advances the state
 * only). Decode, prefill, verification and replay all run this one
 * routine, which is what makes a replayed state bit-identical to a
 * decoded one.
 */
static void kda_steps(k3_prov_model *m, const struct cpu_layer *L, float *win, float *S,
		      float *qp, const float *kp, const float *vp, const float *f,
		      const float *bl, const float *gz, float *z, uint32_t T, size_t ld)
{
	const struct k3_prov_config *c = &m->cfg;
	uint32_t P = m->P, H = c->kda_heads, dk = c->kda_head_dim;
	size_t wstride = (size_t)(c->conv_kernel - 1) * P;
	float *q1 = m->tmp, *k1 = m->tmp2;

	for (uint32_t t = 0; t < T; t++) {
		float *qt = qp + t * ld;
		/* q -> tmp, k -> tmp2, v -> the consumed raw-q row */
		conv_step(m, win, L->conv[0], qt, q1);
		conv_step(m, win + wstride, L->conv[1], kp + t * ld, k1);
		conv_step(m, win + 2 * wstride, L->conv[2], vp + t * ld, qt);
		struct kda_heads_job job = { m, L, S, q1, k1, qt, f + t * ld, bl + t * ld,
					     gz ? gz + t * ld : NULL, z ? z + t * ld : NULL };
		/* heads are independent: split them across threads when the
		 * state is big enough to be worth a dispatch (K3: 6 MB/layer) */
		size_t state_bytes = (size_t)H * dk * dk * sizeof(float);
		if (!m->reference && (m->ctx.split_all || state_bytes >= K3_CPU_PARALLEL_MIN_BYTES))
			k3_kern_pool_for(m->ctx.pool, H, 1, kda_heads_task, &job);
		else
			kda_heads_task(&job, 0, H);
	}
}

static int kda_check(k3_prov_model *m, uint32_t layer, uint32_t T, const k3_prov_kda_state *s,
		     struct k3_prov_status *st)
{
	int rc = check_T(m, T, st);
	if (!rc)
		rc = check_layer(m, layer, K3_PROV_ATTN_KDA, 0, st);
	if (rc)
		return rc;
	if (s->m != m || s->layer != layer)
		return fail(st, -EINVAL, "KDA state of layer %u used for layer %u", s->layer, layer);
	return 0;
}

/* input_layernorm and the six input projections of T positions into the
 * scratch rows m->s[0..7] (q, k, v, f, gz; fa and bl), row stride m->wide. */
static void kda_project(k3_prov_model *m, const struct cpu_layer *L, const float *h, uint32_t T)
{
	const struct k3_prov_config *c = &m->cfg;
	uint32_t D = c->hidden;
	size_t W = m->wide;
	float *x = m->sx;

	norm_rows(m, h, L->input_norm, T, D, c->rms_eps, x, D, D);
	const struct k3_cpu_job proj[6] = {
		JOB(&L->q, x, D, T, m->s[0], W), JOB(&L->k, x, D, T, m->s[1], W),
		JOB(&L->v, x, D, T, m->s[2], W), JOB(&L->g, x, D, T, m->s[4], W),
		JOB(&L->fa, x, D, T, m->s[6], W), JOB(&L->b, x, D, T, m->s[7], W),
	};
	k3_cpu_linear_multi(&m->ctx, proj, 6);
	k3_cpu_linear(&m->ctx, &L->fb, m->s[6], W, T, m->s[3], W);
}

/* o_proj of the head outputs in m->s[5], stored (:= or +=) into out. */
static void kda_output(k3_prov_model *m, const struct cpu_layer *L, uint32_t T, float *out,
		       uint32_t flags)
{
	uint32_t D = m->cfg.hidden;
	size_t W = m->wide;
	float *y = m->s[0];

	k3_cpu_linear(&m->ctx, &L->o, m->s[5], W, T, y, W);
	for (uint32_t t = 0; t < T; t++)
		store(out + (size_t)t * D, y + t * W, D, flags);
}

static int cpu_kda(k3_prov_model *m, uint32_t layer, const float *h, uint32_t T,
		   k3_prov_kda_state *s, float *out, uint32_t flags,
		   struct k3_prov_status *st)
{
	int rc = kda_check(m, layer, T, s, st);
	if (rc)
		return rc;
	const struct cpu_layer *L = &m->layers[layer];
	kda_project(m, L, h, T);
	kda_steps(m, L, s->win, s->S, m->s[0], m->s[1], m->s[2], m->s[3], m->s[7], m->s[4],
		  m->s[5], T, m->wide);
	kda_output(m, L, T, out, flags);
	return 0;
}

/* ---------------------------------------------------------------- KDA verify / replay */

struct k3_prov_kda_record {
	k3_prov_model *m;
	uint32_t layer;
	uint32_t cap;            /* positions */
	uint32_t n;              /* positions the last verify recorded */
	size_t row;              /* floats per position: 4 P + H */
	float *v;                /* [cap][row]: qp | kp | vp | f | bl */
};

static int cpu_kda_record_new(k3_prov_model *m, uint32_t layer, uint32_t max_T,
			      k3_prov_kda_record **out, struct k3_prov_status *st)
{
	int rc = check_kind(m, layer, K3_PROV_ATTN_KDA, 0, st);
	if (rc)
		return rc;
	if (max_T == 0 || max_T > m->max_batch)
		return fail(st, -EINVAL, "KDA record of %u positions not in 1..%u", max_T, m->max_batch);
	k3_prov_kda_record *r = calloc(1, sizeof(*r));
	if (!r)
		return fail(st, -ENOMEM, "out of memory");
	r->m = m;
	r->layer = layer;
	r->cap = max_T;
	r->row = (size_t)4 * m->P + m->cfg.kda_heads;
	r->v = malloc((size_t)max_T * r->row * sizeof(float));
	if (!r->v) {
		free(r);
		return fail(st, -ENOMEM, "out of memory for a %u-position KDA record", max_T);
	}
	*out = r;
	return 0;
}

static void cpu_kda_record_free(k3_prov_kda_record *r)
{
	if (!r)
		return;
	free(r->v);
	free(r);
}

static int cpu_kda_verify(k3_prov_model *m, uint32_t layer, const float *h, uint32_t T,
			  const k3_prov_kda_state *s, k3_prov_kda_record *rec, float *out,
			  uint32_t flags, struct k3_prov_status *st)
{
	int rc = kda_check(m, layer, T, s, st);
	if (rc)
		return rc;
	if (rec->m != m || rec->layer != layer || T > rec->cap)
		return fail(st, -EINVAL, "KDA record (layer %u, %u positions) used for layer %u, %u positions",
			    rec->layer, rec->cap, layer, T);
	const struct cpu_layer *L = &m->layers[layer];
	uint32_t P = m->P, H = m->cfg.kda_heads;
	size_t W = m->wide;

	kda_project(m, L, h, T);
	/* Record the inputs before the per-token loop consumes the q rows. */
	for (uint32_t t = 0; t < T; t++) {
		float *r = rec->v + t * rec->row;
		memcpy(r, m->s[0] + t * W, P * sizeof(float));
		memcpy(r + P, m->s[1] + t * W, P * sizeof(float));
		memcpy(r + 2 * (size_t)P, m->s[2] + t * W, P * sizeof(float));
		memcpy(r + 3 * (size_t)P, m->s[3] + t * W, P * sizeof(float));
		memcpy(r + 4 * (size_t)P, m->s[7] + t * W, H * sizeof(float));
	}
	rec->n = T;
	/* One layer's state of scratch: the published state is only read. */
	memcpy(m->kda_win, s->win, s->n_win * sizeof(float));
	memcpy(m->kda_S, s->S, s->n_S * sizeof(float));
	kda_steps(m, L, m->kda_win, m->kda_S, m->s[0], m->s[1], m->s[2], m->s[3], m->s[7],
		  m->s[4], m->s[5], T, W);
	kda_output(m, L, T, out, flags);
	return 0;
}

static int cpu_kda_replay(k3_prov_model *m, uint32_t layer, k3_prov_kda_state *s,
			  const k3_prov_kda_record *rec, uint32_t n, struct k3_prov_status *st)
{
	/* Unbound is fine: the per-token step reads only the conv taps and
	 * decay vectors the provider converted when the layer was last bound
	 * (for the kda_verify that filled rec), never a borrowed matrix. */
	int rc = check_kind(m, layer, K3_PROV_ATTN_KDA, 0, st);
	if (rc)
		return rc;
	if (s->m != m || s->layer != layer || rec->m != m || rec->layer != layer)
		return fail(st, -EINVAL, "KDA replay of a layer %u record onto a layer %u state for layer %u",
			    rec->layer, s->layer, layer);
	if (n > rec->n)
		return fail(st, -EINVAL, "KDA replay of %u positions; the record holds %u", n, rec->n);
	if (n == 0)
		return 0;
	uint32_t P = m->P, H = m->cfg.kda_heads;
	size_t W = m->wide;
	/* Back into the row layout kda_steps reads (m->s holds max_batch >= cap rows). */
	for (uint32_t t = 0; t < n; t++) {
		const float *r = rec->v + t * rec->row;
		memcpy(m->s[0] + t * W, r, P * sizeof(float));
		memcpy(m->s[1] + t * W, r + P, P * sizeof(float));
		memcpy(m->s[2] + t * W, r + 2 * (size_t)P, P * sizeof(float));
		memcpy(m->s[3] + t * W, r + 3 * (size_t)P, P * sizeof(float));
		memcpy(m->s[7] + t * W, r + 4 * (size_t)P, H * sizeof(float));
	}
	kda_steps(m, &m->layers[layer], s->win, s->S, m->s[0], m->s[1], m->s[2], m->s[3],
		  m->s[7], NULL, NULL, n, W);
	return 0;
}

static int export_bytes(void *dst, size_t cap, size_t *n, const void *a, size_t na,
			const void *b, size_t nb, struct k3_prov_status *st)
{
	*n = na + nb;
	if (!dst)
		return 0;
	if (cap < *n)
		return fail(st, -ENOSPC, "state export needs %zu bytes, got %zu", *n, cap);
	memcpy(dst, a, na);
	if (nb)
		memcpy((char *)dst + na, b, nb);
	return 0;
}

static int cpu_kda_state_export(const k3_prov_kda_state *s, void *dst, size_t cap, size_t *n,
				struct k3_prov_status *st)
{
	return export_bytes(dst, cap, n, s->win, s->n_win * sizeof(float), s->S,
			    s->n_S * sizeof(float), st);
}

static int cpu_mla_cache_export(const k3_prov_mla_cache *c, void *dst, size_t cap, size_t *n,
				struct k3_prov_status *st)
{
	return export_bytes(dst, cap, n, c->rows, (size_t)c->len * c->row * sizeof(float), NULL, 0, st);
}

/* Reference attention of one head (spec §6.5): cbar = sum_s softmax_s(
 * scale * (qa . c(s) + qr . kr(s))) c(s) over the n cached rows, q = [qa | qr].
 * The fast path does all heads at once (cpu_mla). */
static void mla_attend_ref(const k3_prov_model *m, const k3_prov_mla_cache *cache, uint32_t n,
			   const float *q, float scale, float *cbar)
{
	uint32_t kvl = m->cfg.kv_lora, row = cache->row;
	float mx = -INFINITY;
	for (uint32_t sidx = 0; sidx < n; sidx++) {
		const float *cr = cache->rows + (size_t)sidx * row;
		double a = 0.0;
		for (uint32_t cc = 0; cc < row; cc++)
			a += (double)q[cc] * cr[cc];
		float sc = (float)(a * scale);
		cache->score[sidx] = sc;
		if (sc > mx)
			mx = sc;
	}
	double sum = 0.0;
	for (uint32_t sidx = 0; sidx < n; sidx++) {
		cache->score[sidx] = expf(cache->score[sidx] - mx);
		sum += cache->score[sidx];
	}
	for (uint32_t sidx = 0; sidx < n; sidx++)
		cache->score[sidx] = (float)(cache->score[sidx] / sum);
	for (uint32_t cc = 0; cc < kvl; cc++) {
		double acc = 0.0;
		for (uint32_t sidx = 0; sidx < n; sidx++)
			acc += (double)cache->score[sidx] * cache->rows[(size_t)sidx * row + cc];
		cbar[cc] = (float)acc;
	}
}

/* Absorbed queries of heads [begin, end) for one position (spec §6.5):
 * q[h] = [WUK_h^T qn_h | qr_h], WUK_h^T summed over d ascending. */
struct mla_q_job {
	const k3_prov_model *m;
	const struct cpu_layer *L;
	const float *Q;          /* this position's [H][nope + rope] */
	float *qall;             /* [H][kv_lora + rope] */
};

static void mla_q_task(void *arg, size_t begin, size_t end)
{
	const struct mla_q_job *j = arg;
	const struct k3_prov_config *c = &j->m->cfg;
	uint32_t kvl = c->kv_lora, nope = c->qk_nope, vh = c->v_head, rope = c->qk_rope;
	uint32_t qhd = nope + rope, row = kvl + rope;
	size_t esz = j->L->kvb.dtype == K3_PROV_DTYPE_BF16 ? 2 : 4;
	for (size_t hh = begin; hh < end; hh++) {
		const float *qn = j->Q + hh * qhd, *qr = qn + nope;
		const char *wuk = (const char *)j->L->kvb.data + hh * (nope + vh) * kvl * esz;
		float *qcat = j->qall + hh * row;
		if (j->m->reference) {
			for (uint32_t cc = 0; cc < kvl; cc++) {
				double acc = 0.0;
				for (uint32_t d = 0; d < nope; d++) {
					const char *wr = wuk + ((size_t)d * kvl + cc) * esz;
					float wv = esz == 2 ? k3_cpu_bf16(*(const uint16_t *)wr)
							    : *(const float *)wr;
					acc += (double)qn[d] * wv;
				}
				qcat[cc] = (float)acc;
			}
		} else {
			struct k3_kern_mat wm = {
				.dtype = esz == 2 ? K3_KERN_DT_BF16 : K3_KERN_DT_F32,
				.rows = nope, .cols = kvl, .ld = kvl, .data = wuk,
			};
			k3_kern_matmul_t(NULL, &wm, 1, qn, nope, qcat, kvl);
		}
		memcpy(qcat + kvl, qr, rope * sizeof(float));
	}
}

static int cpu_mla(k3_prov_model *m, uint32_t layer, const float *h, uint32_t T,
		   k3_prov_mla_cache *cache, float *out, uint32_t flags,
		   struct k3_prov_status *st)
{
	int rc = check_T(m, T, st);
	if (!rc)
		rc = check_layer(m, layer, K3_PROV_ATTN_MLA, 0, st);
	if (rc)
		return rc;
	if (cache->m != m || cache->layer != layer)
		return fail(st, -EINVAL, "MLA cache of layer %u used for layer %u", cache->layer, layer);
	rc = mla_reserve(cache, cache->len + T, st);
	if (rc)
		return rc;

	const struct k3_prov_config *c = &m->cfg;
	const struct cpu_layer *L = &m->layers[layer];
	uint32_t D = c->hidden, H = c->mla_heads, kvl = c->kv_lora, rope = c->qk_rope;
	uint32_t nope = c->qk_nope, vh = c->v_head, qhd = m->qhd, row = cache->row;
	size_t W = m->wide;
	float *x = m->sx, *cq = m->s[0], *Q = m->s[1], *ckv = m->s[2];
	float *gz = m->s[3], *att = m->s[4];
	float scale = 1.0f / sqrtf((float)qhd);
	size_t esz = L->kvb.dtype == K3_PROV_DTYPE_BF16 ? 2 : 4;

	norm_rows(m, h, L->input_norm, T, D, c->rms_eps, x, D, D);
	const struct k3_cpu_job proj[3] = {
		JOB(&L->qa, x, D, T, cq, W), JOB(&L->kva, x, D, T, ckv, W),
		JOB(&L->g, x, D, T, gz, W),
	};
	k3_cpu_linear_multi(&m->ctx, proj, 3);
	norm_rows(m, cq, L->qa_norm, T, c->q_lora, c->mla_norm_eps, cq, W, W);
	k3_cpu_linear(&m->ctx, &L->qb, cq, W, T, Q, W);

	uint32_t len0 = cache->len;
	for (uint32_t t = 0; t < T; t++) {
		float *dst = cache->rows + (size_t)(len0 + t) * row;
		rmsnorm(m, ckv + t * W, L->kva_norm, kvl, c->mla_norm_eps, dst);
		memcpy(dst + kvl, ckv + t * W + kvl, rope * sizeof(float));
	}
	cache->len = len0 + T;

	float *qall = m->mla_q, *call = m->mla_cbar;
	for (uint32_t t = 0; t < T; t++) {
		uint32_t n = len0 + t + 1;      /* causal: positions 0..len0+t */
		/* 1) absorbed queries qall[h] = [WUK_h^T qn_h | qr_h] (spec §6.5);
		 * heads are independent, so they split across threads */
		struct mla_q_job qj = { m, L, Q + t * W, qall };
		size_t wuk_bytes = (size_t)H * nope * kvl * esz;
		if (!m->reference && (m->ctx.split_all || wuk_bytes >= K3_CPU_PARALLEL_MIN_BYTES))
			k3_kern_pool_for(m->ctx.pool, H, 1, mla_q_task, &qj);
		else
			mla_q_task(&qj, 0, H);
		/* 2) attention over the n cached rows: cbar_h = sum_s p_h(s) c(s) */
		if (m->reference) {
			for (uint32_t hh = 0; hh < H; hh++)
				mla_attend_ref(m, cache, n, qall + (size_t)hh * row, scale,
					   call + (size_t)hh * kvl);
		} else {
			/* All heads share the one latent cache (MLA absorbed is
			 * multi-query), so each cached row is read once for all
			 * heads: scores[h][s] = c(s) . q_h as a product with the
			 * cache as the matrix, then cbar = P C by the transposed
			 * product. Per (h, s) the reduction order is fixed, so a
			 * position's result does not depend on the batch. */
			struct k3_cpu_mat cm = { .data = cache->rows, .dtype = K3_PROV_DTYPE_F32,
						 .rows = n, .cols = row };
			float *sc = m->mla_s;
			k3_cpu_linear(&m->ctx, &cm, qall, row, H, sc, n);
			for (uint32_t hh = 0; hh < H; hh++) {
				k3_kern_scale(n, scale, sc + (size_t)hh * n, sc + (size_t)hh * n);
				k3_kern_softmax(n, sc + (size_t)hh * n);
			}
			struct k3_kern_mat cv = { .dtype = K3_KERN_DT_F32, .rows = n, .cols = kvl,
						  .ld = row, .data = cache->rows };
			size_t bytes = (size_t)n * kvl * sizeof(float);
			k3_kern_matmul_t(m->ctx.split_all || bytes >= K3_CPU_PARALLEL_MIN_BYTES
					 ? m->ctx.pool : NULL, &cv, H, sc, n, call, kvl);
		}
		/* 3) o_h = WUV_h cbar_h (all heads as one parallel region), times
		 * the output gate (spec §6.3) */
		for (uint32_t hh = 0; hh < H; hh++) {
			m->mla_wuv[hh] = (struct k3_cpu_mat){
				.data = (const char *)L->kvb.data +
					((size_t)hh * (nope + vh) + nope) * kvl * esz,
				.dtype = L->kvb.dtype, .rows = vh, .cols = kvl,
			};
			m->mla_jobs[hh] = JOB(&m->mla_wuv[hh], call + (size_t)hh * kvl, kvl, 1,
					      att + t * W + (size_t)hh * vh, vh);
		}
		k3_cpu_linear_multi(&m->ctx, m->mla_jobs, H);
		if (m->reference) {
			for (uint32_t hh = 0; hh < H; hh++) {
				float *ot = att + t * W + (size_t)hh * vh;
				const float *gt = gz + t * W + (size_t)hh * vh;
				for (uint32_t j = 0; j < vh; j++)
					ot[j] *= k3_cpu_sigmoid(gt[j]);
			}
		} else {
			k3_kern_sigmoid((size_t)H * vh, gz + t * W, m->tmp);
			k3_kern_mul((size_t)H * vh, att + t * W, m->tmp, att + t * W);
		}
	}
	float *y = m->s[0];
	k3_cpu_linear(&m->ctx, &L->o, att, W, T, y, W);
	for (uint32_t t = 0; t < T; t++)
		store(out + (size_t)t * D, y + t * W, D, flags);
	return 0;
}

static int cpu_ffn_norm(k3_prov_model *m, uint32_t layer, const float *h2, uint32_t T,
			float *x, struct k3_prov_status *st)
{
	int rc = check_layer(m, layer, 0, 0, st);
	if (rc)
		return rc;
	uint32_t D = m->cfg.hidden;
	norm_rows(m, h2, m->layers[layer].post_norm, T, D, m->cfg.rms_eps, x, D, D);
	return 0;
}

static int cpu_router(k3_prov_model *m, uint32_t layer, const float *x, uint32_t T,
		      uint32_t *ids, float *weights, struct k3_prov_status *st)
{
	int rc = check_T(m, T, st);
	if (!rc)
		rc = check_layer(m, layer, 0, K3_PROV_FFN_MOE, st);
	if (rc)
		return rc;
	const struct cpu_layer *L = &m->layers[layer];
	const struct k3_prov_config *c = &m->cfg;
	size_t W = m->wide;
	uint32_t K = c->top_k;
	/* not s[0..2]: the lookahead runs the router inside a routed call */
	float *lg = m->s[3];
	k3_cpu_linear(&m->ctx, &L->router, x, c->hidden, T, lg, W);
	for (uint32_t t = 0; t < T; t++) {
		float *s = lg + t * W;
		uint32_t *it = ids + (size_t)t * K;
		float *wt = weights + (size_t)t * K;
		if (m->reference) {
			for (uint32_t e = 0; e < c->n_experts; e++)
				s[e] = k3_cpu_sigmoid(s[e]);
			k3_cpu_ref_topk(s, L->rbias, c->n_experts, K, (int)c->moe_renormalize,
					c->routed_scale, it, wt);
		} else {
			int32_t idx[64];
			/* HF renormalizes only when top_k > 1 (spec §8.1) */
			rc = k3_kern_router_topk(c->n_experts, s, L->rbias, K,
						 c->moe_renormalize && K > 1, c->routed_scale,
						 idx, wt, NULL);
			if (rc)
				return fail(st, rc, "layer %u: router top-%u failed", layer, K);
			for (uint32_t j = 0; j < K; j++)
				it[j] = (uint32_t)idx[j];
		}
	}
	return 0;
}

/* Validates ids and spans of a routed call's slots; spans may be NULL
 * (routed_begin: they come later). */
static int routed_check(k3_prov_model *m, uint32_t layer, uint32_t T, const uint32_t *ids,
			const struct k3_prov_expert *experts, struct k3_prov_status *st)
{
	int rc = check_T(m, T, st);
	if (!rc)
		rc = check_layer(m, layer, 0, K3_PROV_FFN_MOE, st);
	if (rc)
		return rc;
	size_t TK = (size_t)T * m->cfg.top_k;
	for (size_t i = 0; i < TK; i++) {
		const struct k3_prov_expert *e = experts ? &experts[i] : NULL;
		if (ids[i] >= m->cfg.n_experts ||
		    (e && (!e->w1_packed || !e->w1_scale || !e->w2_packed || !e->w2_scale ||
			   !e->w3_packed || !e->w3_scale)))
			return fail(st, -EINVAL, "layer %u: expert slot %zu (id %u) has no span",
				    layer, i, ids[i]);
	}
	return 0;
}

/* The n slots rows[first..first+n) of one expert (inputs gathered in gx):
 * W1/W3, SiTU, W2 into Y rows first..first+n. Batch invariant, so a
 * slot's output does not depend on its companions or on which call
 * computed it. */
static void expert_rows(k3_prov_model *m, const struct k3_prov_expert *sp, uint32_t first,
			uint32_t n)
{
	const struct k3_prov_config *c = &m->cfg;
	uint32_t lat = c->latent, I = c->moe_inter;
	float *gx = m->ex, *g = m->eg, *u = m->eu, *Y = m->ey;
	struct k3_cpu_job jobs[3];

	jobs[0] = MXJOB(sp->w1_packed, sp->w1_scale, I, lat, gx + (size_t)first * lat, lat, n,
			g + (size_t)first * I, I);
	jobs[1] = MXJOB(sp->w3_packed, sp->w3_scale, I, lat, gx + (size_t)first * lat, lat, n,
			u + (size_t)first * I, I);
	jobs[2] = MXJOB(sp->w2_packed, sp->w2_scale, lat, I, g + (size_t)first * I, I, n,
			Y + (size_t)first * lat, lat);
	k3_cpu_linear_multi(&m->ctx, jobs, 2);
	for (uint32_t r = first; r < first + n; r++)
		situ_rows(m, g + (size_t)r * I, u + (size_t)r * I, I);
	k3_cpu_linear_multi(&m->ctx, jobs + 2, 1);
}

/* Gathers the not yet computed slots of expert e (z = Wdown x rows) into
 * gx rows from m->r_rows on; returns how many. */
static uint32_t gather_expert(k3_prov_model *m, const uint32_t *ids, size_t TK, uint32_t e,
			      const float *z)
{
	uint32_t lat = m->cfg.latent, K = m->cfg.top_k, rows = m->r_rows, n = 0;
	size_t W = m->wide;

	for (size_t j = 0; j < TK; j++) {
		if (m->edone[j] || ids[j] != e)
			continue;
		m->edone[j] = 1;
		m->eslot[j] = rows + n;
		memcpy(m->ex + (size_t)(rows + n) * lat, z + (j / K) * W, lat * sizeof(float));
		n++;
	}
	return n;
}

/* The end of a routed call: out[T][D] += Wup(RMSNorm(sum_k w[t][k] *
 * Y[row_of[t][k]])), the sum in route order k = 0..K-1; with `partial`,
 * over the slots computed so far only (edone), for routed_partial. Uses
 * s[1] and s[2]: s[0] holds the routed call's down projection. */
static void routed_sum(k3_prov_model *m, const struct cpu_layer *L, uint32_t T,
		       const float *weights, float *out, bool partial)
{
	const struct k3_prov_config *c = &m->cfg;
	uint32_t D = c->hidden, lat = c->latent, K = c->top_k;
	size_t W = m->wide;
	float *ysum = m->s[1], *Y = m->ey;
	const uint32_t *row_of = m->eslot;

	for (uint32_t t = 0; t < T; t++) {
		float *ys = ysum + t * W;
		bool first = true;
		for (uint32_t k = 0; k < K; k++) {
			if (partial && !m->edone[(size_t)t * K + k])
				continue;
			const float *y = Y + (size_t)row_of[(size_t)t * K + k] * lat;
			float wk = weights[(size_t)t * K + k];
			if (first)
				for (uint32_t i = 0; i < lat; i++)
					ys[i] = wk * y[i];
			else
				for (uint32_t i = 0; i < lat; i++)
					ys[i] += wk * y[i];
			first = false;
		}
		if (first)   /* partial, nothing computed yet: RMSNorm(0) = 0 */
			memset(ys, 0, lat * sizeof(float));
		rmsnorm(m, ys, L->lnorm, lat, c->rms_eps, ys);
	}
	float *r = m->s[2];
	k3_cpu_linear(&m->ctx, &L->lup, ysum, W, T, r, W);
	for (uint32_t t = 0; t < T; t++)
		store(out + (size_t)t * D, r + t * W, D, K3_PROV_OUT_ACCUMULATE);
}

static int cpu_routed_experts(k3_prov_model *m, uint32_t layer, const float *x, uint32_t T,
			      const uint32_t *ids, const float *weights,
			      const struct k3_prov_expert *experts, float *out,
			      struct k3_prov_status *st)
{
	int rc = routed_check(m, layer, T, ids, experts, st);
	if (rc)
		return rc;
	const struct cpu_layer *L = &m->layers[layer];
	const struct k3_prov_config *c = &m->cfg;
	uint32_t D = c->hidden, lat = c->latent, I = c->moe_inter, K = c->top_k;
	size_t W = m->wide, TK = (size_t)T * K;
	float *z = m->s[0];
	k3_cpu_linear(&m->ctx, &L->ldown, x, D, T, z, W);

	/* Group the T*K slots by expert so each expert's weights stream once
	 * per call: gather the inputs of its slots (group order), run all
	 * experts' W1/W3 as one parallel region, SiTU, then all W2. The
	 * matmuls are batch invariant, so a slot's output does not depend on
	 * its companions. row_of[slot] = the slot's row in the gathered order. */
	float *gx = m->ex, *g = m->eg, *u = m->eu, *Y = m->ey;
	struct k3_cpu_job *jobs = m->ejobs;
	uint32_t ng = 0, rows = 0;
	m->r_open = false;
	m->r_rows = 0;
	memset(m->edone, 0, TK);
	for (size_t i = 0; i < TK; i++) {
		if (m->edone[i])
			continue;
		uint32_t first = rows;
		m->r_rows = rows;
		rows += gather_expert(m, ids, TK, ids[i], z);
		const struct k3_prov_expert *sp = &experts[i];
		uint32_t n = rows - first;
		jobs[2 * ng] = MXJOB(sp->w1_packed, sp->w1_scale, I, lat, gx + (size_t)first * lat,
				     lat, n, g + (size_t)first * I, I);
		jobs[2 * ng + 1] = MXJOB(sp->w3_packed, sp->w3_scale, I, lat, gx + (size_t)first * lat,
					 lat, n, u + (size_t)first * I, I);
		/* the W2 job of this group, kept past the W1/W3 pairs */
		jobs[2 * TK + ng] = MXJOB(sp->w2_packed, sp->w2_scale, lat, I, g + (size_t)first * I,
					  I, n, Y + (size_t)first * lat, lat);
		ng++;
	}
	k3_cpu_linear_multi(&m->ctx, jobs, 2 * ng);
	for (uint32_t r = 0; r < rows; r++)
		situ_rows(m, g + (size_t)r * I, u + (size_t)r * I, I);
	k3_cpu_linear_multi(&m->ctx, jobs + 2 * TK, ng);
	routed_sum(m, L, T, weights, out, false);
	return 0;
}

static int cpu_routed_begin(k3_prov_model *m, uint32_t layer, const float *x, uint32_t T,
			    const uint32_t *ids, struct k3_prov_status *st)
{
	int rc = routed_check(m, layer, T, ids, NULL, st);
	if (rc)
		return rc;
	const struct cpu_layer *L = &m->layers[layer];
	k3_cpu_linear(&m->ctx, &L->ldown, x, m->cfg.hidden, T, m->s[0], m->wide);
	memset(m->edone, 0, (size_t)T * m->cfg.top_k);
	m->r_ids = ids;
	m->r_layer = layer;
	m->r_T = T;
	m->r_rows = 0;
	m->r_open = true;
	return 0;
}

static int cpu_routed_expert(k3_prov_model *m, uint32_t layer, uint32_t expert,
			     const struct k3_prov_expert *sp, struct k3_prov_status *st)
{
	if (!m->r_open || layer != m->r_layer)
		return fail(st, -EINVAL, "layer %u: routed_expert outside routed_begin..end", layer);
	if (!sp->w1_packed || !sp->w1_scale || !sp->w2_packed || !sp->w2_scale ||
	    !sp->w3_packed || !sp->w3_scale)
		return fail(st, -EINVAL, "layer %u: expert %u has no span", layer, expert);
	uint32_t first = m->r_rows;
	uint32_t n = gather_expert(m, m->r_ids, (size_t)m->r_T * m->cfg.top_k, expert, m->s[0]);
	if (n == 0)
		return fail(st, -EINVAL, "layer %u: expert %u has no slot left in this call",
			    layer, expert);
	m->r_rows += n;
	expert_rows(m, sp, first, n);
	return 0;
}

static int cpu_routed_end(k3_prov_model *m, uint32_t layer, const float *weights, float *out,
			  struct k3_prov_status *st)
{
	if (!m->r_open || layer != m->r_layer)
		return fail(st, -EINVAL, "layer %u: routed_end without routed_begin", layer);
	m->r_open = false;
	if (!m->layers[layer].bound)
		return fail(st, -EINVAL, "layer %u was unbound inside its routed call", layer);
	size_t TK = (size_t)m->r_T * m->cfg.top_k;
	for (size_t j = 0; j < TK; j++)
		if (!m->edone[j])
			return fail(st, -EINVAL, "layer %u: expert %u (slot %zu) was not computed",
				    layer, m->r_ids[j], j);
	routed_sum(m, &m->layers[layer], m->r_T, weights, out, false);
	return 0;
}

static int cpu_routed_partial(k3_prov_model *m, uint32_t layer, const float *weights,
			      float *out, struct k3_prov_status *st)
{
	if (!m->r_open || layer != m->r_layer)
		return fail(st, -EINVAL, "layer %u: routed_partial outside routed_begin..end",
			    layer);
	routed_sum(m, &m->layers[layer], m->r_T, weights, out, true);
	return 0;
}

static int cpu_mlp(k3_prov_model *m, uint32_t layer, const float *x, uint32_t T,
		   float *out, struct k3_prov_status *st)
{
	int rc = check_T(m, T, st);
	if (!rc)
		rc = check_layer(m, layer, 0, 0, st);
	if (rc)
		return rc;
	const struct cpu_layer *L = &m->layers[layer];
	uint32_t D = m->cfg.hidden, I = L->mg.rows;
	size_t W = m->wide;
	float *g = m->s[0], *u = m->s[1], *y = m->s[2];
	const struct k3_cpu_job gu[2] = { JOB(&L->mg, x, D, T, g, W), JOB(&L->mu, x, D, T, u, W) };
	k3_cpu_linear_multi(&m->ctx, gu, 2);
	for (uint32_t t = 0; t < T; t++)
		situ_rows(m, g + t * W, u + t * W, I);
	k3_cpu_linear(&m->ctx, &L->md, g, W, T, y, W);
	for (uint32_t t = 0; t < T; t++)
		memcpy(out + (size_t)t * D, y + t * W, D * sizeof(float));
	return 0;
}

static int cpu_add(k3_prov_model *m, float *dst, const float *src, size_t n,
		   struct k3_prov_status *st)
{
	(void)m;
	(void)st;
	for (size_t i = 0; i < n; i++)
		dst[i] += src[i];
	return 0;
}

static int cpu_logits(k3_prov_model *m, const float *z, uint32_t T, float *out,
		      struct k3_prov_status *st)
{
	int rc = check_T(m, T, st);
	if (rc)
		return rc;
	if (!m->head_bound)
		return fail(st, -EINVAL, "the head is not bound (it streams: bind_head first)");
	uint32_t D = m->cfg.hidden;
	norm_rows(m, z, m->norm, T, D, m->cfg.rms_eps, m->sx, D, D);
	linear(m, &m->lm_head, m->sx, T, out);
	return 0;
}

/* Every borrowed matrix of a layer forgets its bytes (unbind). */
static void unbind_layer(struct cpu_layer *L)
{
	struct k3_cpu_mat *mats[] = { &L->q, &L->k, &L->v, &L->fa, &L->fb, &L->b, &L->g, &L->o,
				      &L->qa, &L->qb, &L->kva, &L->kvb, &L->mg, &L->mu, &L->md,
				      &L->router, &L->ldown, &L->lup };
	for (size_t i = 0; i < sizeof(mats) / sizeof(mats[0]); i++)
		mats[i]->data = NULL;
	L->bound = false;
}

static int cpu_bind_layer(k3_prov_model *m, uint32_t layer, const struct k3_prov_layer_weights *w,
			  struct k3_prov_status *st)
{
	if (layer >= m->cfg.n_layers)
		return fail(st, -EINVAL, "layer %u out of range (%u layers)", layer, m->cfg.n_layers);
	if (m->r_open && m->r_layer == layer)
		return fail(st, -EINVAL, "layer %u rebound inside its routed call", layer);
	struct cpu_layer *L = &m->layers[layer];
	if (!w) {
		unbind_layer(L);
		return 0;
	}
	int rc = open_layer(m, layer, w, LOAD_BIND, st);
	if (rc)
		unbind_layer(L);
	return rc;
}

static int cpu_bind_head(k3_prov_model *m, const struct k3_prov_weights *w,
			 struct k3_prov_status *st)
{
	if (!w) {
		m->lm_head.data = NULL;
		m->head_bound = false;
		return 0;
	}
	int rc = open_head(m, w, LOAD_BIND, st);
	if (rc) {
		m->lm_head.data = NULL;
		m->head_bound = false;
	}
	return rc;
}

static int cpu_embed_rows(k3_prov_model *m, const void *rows, uint32_t T, float *out,
			  struct k3_prov_status *st)
{
	size_t n = (size_t)T * m->cfg.hidden;
	if (m->embed.dtype == K3_PROV_DTYPE_BF16) {
		const uint8_t *b = rows;
		for (size_t i = 0; i < n; i++) {
			uint16_t v;
			memcpy(&v, b + 2 * i, 2);
			out[i] = k3_cpu_bf16(v);
		}
	} else if (m->embed.dtype == K3_PROV_DTYPE_F32) {
		memcpy(out, rows, n * sizeof(float));
	} else {
		return fail(st, -EINVAL, "embedding dtype %u", m->embed.dtype);
	}
	return 0;
}

static int cpu_set_threads(k3_prov_model *m, uint32_t threads, struct k3_prov_status *st)
{
	if (threads < 1 || threads > 256)
		return fail(st, -EINVAL, "threads %u not in 1..256", threads);
	int rc = k3_cpu_ctx_set_threads(&m->ctx, threads);
	if (rc)
		return fail(st, rc, "cannot start %u compute threads", threads);
	return 0;
}

const struct k3_provider k3_provider_cpu = {
	.abi_version = K3_PROVIDER_ABI_VERSION,
	.struct_size = sizeof(struct k3_provider),
	.name = "cpu",
	.open = cpu_open,
	.close = cpu_close,
	.kda_state_new = cpu_kda_state_new,
	.kda_state_free = cpu_kda_state_free,
	.kda_state_reset = cpu_kda_state_reset,
	.kda_state_copy = cpu_kda_state_copy,
	.mla_cache_new = cpu_mla_cache_new,
	.mla_cache_free = cpu_mla_cache_free,
	.mla_cache_len = cpu_mla_cache_len,
	.mla_cache_truncate = cpu_mla_cache_truncate,
	.mla_cache_copy = cpu_mla_cache_copy,
	.embed = cpu_embed,
	.attnres_mix = cpu_attnres_mix,
	.kda = cpu_kda,
	.mla = cpu_mla,
	.ffn_norm = cpu_ffn_norm,
	.router = cpu_router,
	.routed_experts = cpu_routed_experts,
	.routed_begin = cpu_routed_begin,
	.routed_expert = cpu_routed_expert,
	.routed_end = cpu_routed_end,
	.routed_partial = cpu_routed_partial,
	.mlp = cpu_mlp,
	.add = cpu_add,
	.logits = cpu_logits,
	.set_threads = cpu_set_threads,
	.bind_layer = cpu_bind_layer,
	.bind_head = cpu_bind_head,
	.embed_rows = cpu_embed_rows,
	.kda_record_new = cpu_kda_record_new,
	.kda_record_free = cpu_kda_record_free,
	.kda_verify = cpu_kda_verify,
	.kda_replay = cpu_kda_replay,
	.kda_state_export = cpu_kda_state_export,
	.mla_cache_export = cpu_mla_cache_export,
};

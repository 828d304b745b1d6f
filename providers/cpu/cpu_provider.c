/*
 * cpu_provider.c - the "cpu" provider: the complete Kimi K3 text forward
 * in fp32 on the host (docs/model.md, "spec §n"), behind the ABI of
 * providers/k3_provider.h. This file opens, binds and closes the model,
 * runs the small ops (embed, AttnRes mix, add, logits), holds the helpers
 * the other files share (cpu_internal.h) and the ops table; the
 * sub-layers are cpu_kda.c, cpu_mla.c and cpu_moe.c.
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
#include "cpu/cpu_internal.h"

#include "base/carve.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cpu_fail(struct k3_prov_status *st, int code, const char *fmt, ...)
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

/* The shape check every matrix passes: [rows, cols], data present exactly
 * when the mode says so. what: "shape", or "I8 shape" for an I8 matrix. */
static int check_shape(const struct k3_prov_tensor *t, uint32_t rows, uint32_t cols,
		       const char *what, const char *name, uint32_t layer,
		       enum load_mode mode, struct k3_prov_status *st)
{
	if ((mode == LOAD_DEFERRED) != !t->data || t->ndim != 2 || t->shape[0] != rows ||
	    t->shape[1] != cols)
		return cpu_fail(st, -EINVAL, "layer %u tensor '%s': %s [%llu, %llu] (ndim %u)%s, want"
				" [%u, %u]%s", layer, name, what, (unsigned long long)t->shape[0],
				(unsigned long long)t->shape[1], t->ndim, t->data ? "" : " without data",
				rows, cols, mode == LOAD_DEFERRED ? " without data (the layer is bound later)"
								  : " with data");
	return 0;
}

/* An I8 matrix (the int8 spine, k3_provider.h): q[rows][cols] then the
 * row scales, 4-byte aligned. */
static int check_mat_i8(const struct k3_prov_tensor *t, uint32_t rows, uint32_t cols,
			const char *name, uint32_t layer, enum load_mode mode,
			struct k3_prov_status *st)
{
	int r;

	for (size_t i = 0; i < sizeof(no_i8) / sizeof(no_i8[0]); i++)
		if (strcmp(name, no_i8[i]) == 0)
			return cpu_fail(st, -EINVAL, "layer %u tensor '%s': int8 (I8) is not accepted here"
					" (not the operand of a row-wise product); keep it bf16",
					layer, name);
	if ((r = check_shape(t, rows, cols, "I8 shape", name, layer, mode, st)))
		return r;
	if ((uintptr_t)t->data % 4)
		return cpu_fail(st, -EINVAL, "layer %u tensor '%s': I8 payload not 4-byte aligned (its row"
				" scales follow it)", layer, name);
	return 0;
}

/* A BF16 or F32 matrix, aligned to its element size. */
static int check_mat_dense(const struct k3_prov_tensor *t, uint32_t rows, uint32_t cols,
			   const char *name, uint32_t layer, enum load_mode mode,
			   struct k3_prov_status *st)
{
	int r;

	if (t->dtype != K3_PROV_DTYPE_BF16 && t->dtype != K3_PROV_DTYPE_F32)
		return cpu_fail(st, -EINVAL, "layer %u tensor '%s': dtype %u is not bf16 or f32",
				layer, name, t->dtype);
	if ((r = check_shape(t, rows, cols, "shape", name, layer, mode, st)))
		return r;
	if ((uintptr_t)t->data % (t->dtype == K3_PROV_DTYPE_BF16 ? 2 : 4))
		return cpu_fail(st, -EINVAL, "layer %u tensor '%s': payload not aligned to its element size",
				layer, name);
	return 0;
}

static int get_mat(const struct k3_prov_tensor *t, uint32_t rows, uint32_t cols,
		   struct k3_cpu_mat *out, const char *name, uint32_t layer,
		   enum load_mode mode, struct k3_prov_status *st)
{
	int r = t->dtype == K3_PROV_DTYPE_I8 ? check_mat_i8(t, rows, cols, name, layer, mode, st)
					     : check_mat_dense(t, rows, cols, name, layer, mode, st);

	if (r)
		return r;
	if (mode == LOAD_BIND && t->dtype != out->dtype)
		return cpu_fail(st, -EINVAL, "layer %u tensor '%s': bound with dtype %u, opened with %u",
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
		return cpu_fail(st, -EINVAL, "layer %u tensor '%s': want %s%u bf16/f32 values%s, have %llu"
				" (dtype %u%s)", layer, name, at_least ? ">= " : "", n,
				mode == LOAD_DEFERRED ? " without data (the layer is bound later)" : "",
				(unsigned long long)have, t->dtype, t->data ? "" : ", no data");
	if (!*out && !(*out = calloc(n, sizeof(float))))
		return cpu_fail(st, -ENOMEM, "out of memory for '%s'", name);
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
		return cpu_fail(st, -EINVAL, "layer %u tensor '%s': the projection wants %u bf16/f32"
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

/* The per-model scratch arrays, all sized at open and freed with the model:
 * one block (base/carve.h), laid out by this list in its two passes. The +1s
 * keep a part of a model without KDA or MLA layers from being empty. */
static void carve_scratch(struct k3_carve *k, k3_prov_model *m)
{
	const struct k3_prov_config *c = &m->cfg;
	size_t B = m->max_batch;
	size_t slots = B * (c->top_k ? c->top_k : 1);
	size_t ew = cpu_umax(cpu_umax(c->latent, c->moe_inter), 1);
	size_t heads = cpu_umax(c->mla_heads, 1);

	K3_CARVE(k, m->sx, B * c->hidden);
	for (int i = 0; i < 8; i++)
		K3_CARVE(k, m->s[i], B * m->wide);
	K3_CARVE(k, m->tmp, m->wide);
	K3_CARVE(k, m->tmp2, m->wide);
	K3_CARVE(k, m->mla_q, heads * (c->kv_lora + c->qk_rope + 1));
	K3_CARVE(k, m->mla_wuv, heads);
	K3_CARVE(k, m->mla_jobs, heads);
	K3_CARVE(k, m->mla_cbar, heads * (c->kv_lora + 1));
	K3_CARVE(k, m->work, (size_t)6 * cpu_umax(c->kda_head_dim, 1) * cpu_umax(c->kda_heads, 1));
	K3_CARVE(k, m->kda_win, (size_t)3 * (c->conv_kernel - 1) * m->P + 1);
	K3_CARVE(k, m->kda_S, (size_t)c->kda_heads * c->kda_head_dim * c->kda_head_dim + 1);
	K3_CARVE(k, m->ey, slots * ew);
	K3_CARVE(k, m->ex, slots * ew);
	K3_CARVE(k, m->eg, slots * ew);
	K3_CARVE(k, m->eu, slots * ew);
	K3_CARVE(k, m->eslot, slots);
	K3_CARVE(k, m->ejobs, 3 * slots);
	K3_CARVE(k, m->edone, slots);
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
	free(m->scratch);
	free(m->mla_s);
	k3_cpu_ctx_release(&m->ctx);
	free(m);
}

static int check_config(const struct k3_prov_config *c, struct k3_prov_status *st)
{
	if (c->struct_size < sizeof(*c))
		return cpu_fail(st, -EPROTO, "config struct_size %u < %zu", c->struct_size, sizeof(*c));
	if (!c->hidden || !c->n_layers || c->n_layers > K3_PROV_MAX_LAYERS || !c->vocab)
		return cpu_fail(st, -EINVAL, "config: hidden, layers (1..%d) and vocab must be set",
				K3_PROV_MAX_LAYERS);
	if (!c->attn_res_block ||
	    (c->n_layers + c->attn_res_block - 1) / c->attn_res_block + 2 > K3_KERN_ATTNRES_MAX_CAND)
		return cpu_fail(st, -EINVAL, "config: attn_res_block %u gives too many AttnRes candidates",
				c->attn_res_block);
	if (c->n_experts > 1024 || c->top_k > c->n_experts)
		return cpu_fail(st, -EINVAL, "config: %u experts top-%u unsupported (<= 1024 experts)",
				c->n_experts, c->top_k);
	if (c->latent % 32 || c->moe_inter % 32)
		return cpu_fail(st, -EINVAL, "config: MXFP4 expert dims %u, %u must be multiples of 32",
				c->latent, c->moe_inter);
	if (!c->kda_head_dim || c->kda_head_dim > 1024 || c->top_k > 64)
		return cpu_fail(st, -EINVAL, "config: KDA head dim %u (1..1024) or top-k %u (<= 64) unsupported",
				c->kda_head_dim, c->top_k);
	if (!c->conv_kernel || c->conv_kernel > 16)
		return cpu_fail(st, -EINVAL, "config: conv kernel %u unsupported", c->conv_kernel);
	for (uint32_t l = 0; l < c->n_layers; l++) {
		if (c->attn_kind[l] != K3_PROV_ATTN_KDA && c->attn_kind[l] != K3_PROV_ATTN_MLA)
			return cpu_fail(st, -EINVAL, "config: layer %u attention kind %u", l, c->attn_kind[l]);
		if (c->ffn_kind[l] != K3_PROV_FFN_DENSE && c->ffn_kind[l] != K3_PROV_FFN_MOE)
			return cpu_fail(st, -EINVAL, "config: layer %u ffn kind %u", l, c->ffn_kind[l]);
		if (c->ffn_kind[l] == K3_PROV_FFN_MOE && (!c->n_experts || !c->top_k || !c->latent))
			return cpu_fail(st, -EINVAL, "config: layer %u is MoE without experts/latent", l);
	}
	return 0;
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
		return cpu_fail(st, -EPROTO, "open args struct too small");
	if (!a->config || !a->weights)
		return cpu_fail(st, -EINVAL, "open args: config and weights are required");
	int rc = check_config(a->config, st);
	if (rc)
		return rc;
	const struct k3_prov_weights *w = a->weights;
	if (w->struct_size < sizeof(*w) || w->n_layers != a->config->n_layers || !w->layers)
		return cpu_fail(st, -EINVAL, "weights: %u layers for a %u-layer config",
				w->n_layers, a->config->n_layers);
	if (!a->max_batch || a->max_batch > 65536)
		return cpu_fail(st, -EINVAL, "max_batch %u not in 1..65536", a->max_batch);

	k3_prov_model *m = calloc(1, sizeof(*m));
	if (!m)
		return cpu_fail(st, -ENOMEM, "out of memory");
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
		return cpu_fail(st, rc, "cannot start %u compute threads", a->threads);
	}
	m->layers = calloc(c->n_layers, sizeof(*m->layers));
	if (!m->layers) {
		rc = cpu_fail(st, -ENOMEM, "out of memory");
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
	wide = cpu_umax(wide, m->P);
	wide = cpu_umax(wide, c->mla_heads * m->qhd);
	wide = cpu_umax(wide, c->mla_heads * c->v_head);
	wide = cpu_umax(wide, c->mla_heads * (c->qk_nope + c->v_head));
	wide = cpu_umax(wide, c->dense_inter);
	wide = cpu_umax(wide, c->shared_inter);
	wide = cpu_umax(wide, c->q_lora);
	wide = cpu_umax(wide, c->kv_lora + c->qk_rope);
	wide = cpu_umax(wide, c->latent);
	wide = cpu_umax(wide, c->moe_inter);
	wide = cpu_umax(wide, c->n_experts);
	m->wide = wide;
	struct k3_carve k = { 0 };
	while (k3_carve_next(&k))
		carve_scratch(&k, m);
	m->scratch = k.block;
	if (!m->scratch) {
		rc = -ENOMEM;
		cpu_fail(st, rc, "out of memory for scratch (%u x %u floats)", m->max_batch, wide);
		goto err;
	}
	*out = m;
	return 0;
err:
	cpu_close(m);
	return rc;
}

/* ---------------------------------------------------------------- ops */

int cpu_check_T(k3_prov_model *m, uint32_t T, struct k3_prov_status *st)
{
	if (T == 0 || T > m->max_batch)
		return cpu_fail(st, -EINVAL, "batch of %u positions not in 1..%u", T, m->max_batch);
	return 0;
}

int cpu_check_kind(k3_prov_model *m, uint32_t layer, uint32_t attn, uint32_t ffn,
		   struct k3_prov_status *st)
{
	if (layer >= m->cfg.n_layers)
		return cpu_fail(st, -EINVAL, "layer %u out of range (%u layers)", layer, m->cfg.n_layers);
	if (attn && m->layers[layer].attn != attn)
		return cpu_fail(st, -EINVAL, "layer %u has attention kind %u, not %u",
				layer, m->layers[layer].attn, attn);
	if (ffn && m->layers[layer].ffn != ffn)
		return cpu_fail(st, -EINVAL, "layer %u has ffn kind %u, not %u",
				layer, m->layers[layer].ffn, ffn);
	return 0;
}

int cpu_check_layer(k3_prov_model *m, uint32_t layer, uint32_t attn, uint32_t ffn,
		    struct k3_prov_status *st)
{
	int rc = cpu_check_kind(m, layer, attn, ffn, st);
	if (rc)
		return rc;
	if (!m->layers[layer].bound)
		return cpu_fail(st, -EINVAL, "layer %u is not bound (its weights stream: bind_layer"
				" before its ops)", layer);
	return 0;
}

int cpu_check_attn(k3_prov_model *m, uint32_t layer, uint32_t T, uint32_t attn,
		   const k3_prov_model *owner, uint32_t owner_layer, const char *what,
		   struct k3_prov_status *st)
{
	int rc = cpu_check_T(m, T, st);
	if (!rc)
		rc = cpu_check_layer(m, layer, attn, 0, st);
	if (rc)
		return rc;
	if (owner != m || owner_layer != layer)
		return cpu_fail(st, -EINVAL, "%s of layer %u used for layer %u", what, owner_layer,
				layer);
	return 0;
}

static void linear(k3_prov_model *m, const struct k3_cpu_mat *W, const float *x,
		   uint32_t T, float *y)
{
	k3_cpu_linear(&m->ctx, W, x, W->cols, T, y, W->rows);
}

void cpu_store(float *out, const float *y, size_t n, uint32_t flags)
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
		return cpu_fail(st, -EINVAL, "the embedding was opened without data (streamed): use"
				" embed_rows");
	for (uint32_t t = 0; t < T; t++) {
		if (ids[t] < 0 || (uint32_t)ids[t] >= m->cfg.vocab)
			return cpu_fail(st, -EINVAL, "token id %d not in 0..%u", ids[t], m->cfg.vocab - 1);
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
		return cpu_fail(st, -EINVAL, "AttnRes mix of %u candidates not in 1..%d",
				n, K3_KERN_ATTNRES_MAX_CAND);
	if (site == K3_PROV_MIX_OUTPUT) {
		if (!m->head_bound)
			return cpu_fail(st, -EINVAL, "the head is not bound (it streams: bind_head first)");
		u = m->out_u;
	} else {
		int rc = cpu_check_layer(m, layer, 0, 0, st);
		if (rc)
			return rc;
		u = site == K3_PROV_MIX_ATTN ? m->layers[layer].attn_u
		  : site == K3_PROV_MIX_MLP ? m->layers[layer].mlp_u : NULL;
		if (!u)
			return cpu_fail(st, -EINVAL, "layer %u has no AttnRes site %u", layer, site);
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

void cpu_rmsnorm(const k3_prov_model *m, const float *x, const float *w, uint32_t n,
		 float eps, float *y)
{
	if (m->reference)
		k3_cpu_ref_rmsnorm(x, w, n, eps, y);
	else
		k3_kern_rmsnorm(n, x, w, eps, y);
}

void cpu_norm_rows(const k3_prov_model *m, const float *h, const float *w, uint32_t T,
		   uint32_t n, float eps, float *x, size_t ld_in, size_t ld_out)
{
	for (uint32_t t = 0; t < T; t++)
		cpu_rmsnorm(m, h + t * ld_in, w, n, eps, x + t * ld_out);
}

void cpu_situ_rows(const k3_prov_model *m, float *g, const float *u, uint32_t n)
{
	const struct k3_prov_config *c = &m->cfg;
	if (m->reference)
		for (uint32_t i = 0; i < n; i++)
			g[i] = k3_cpu_situ(g[i], u[i], c->situ_beta1, c->situ_beta2);
	else
		k3_kern_situ_glu(n, g, u, c->situ_beta1, c->situ_beta2, g);
}

int cpu_export_bytes(void *dst, size_t cap, size_t *n, const void *a, size_t na,
		     const void *b, size_t nb, struct k3_prov_status *st)
{
	*n = na + nb;
	if (!dst)
		return 0;
	if (cap < *n)
		return cpu_fail(st, -ENOSPC, "state export needs %zu bytes, got %zu", *n, cap);
	memcpy(dst, a, na);
	if (nb)
		memcpy((char *)dst + na, b, nb);
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
	int rc = cpu_check_T(m, T, st);
	if (rc)
		return rc;
	if (!m->head_bound)
		return cpu_fail(st, -EINVAL, "the head is not bound (it streams: bind_head first)");
	uint32_t D = m->cfg.hidden;
	cpu_norm_rows(m, z, m->norm, T, D, m->cfg.rms_eps, m->sx, D, D);
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
		return cpu_fail(st, -EINVAL, "layer %u out of range (%u layers)", layer, m->cfg.n_layers);
	if (m->r_open && m->r_layer == layer)
		return cpu_fail(st, -EINVAL, "layer %u rebound inside its routed call", layer);
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
		return cpu_fail(st, -EINVAL, "embedding dtype %u", m->embed.dtype);
	}
	return 0;
}

static int cpu_set_threads(k3_prov_model *m, uint32_t threads, struct k3_prov_status *st)
{
	if (threads < 1 || threads > 256)
		return cpu_fail(st, -EINVAL, "threads %u not in 1..256", threads);
	int rc = k3_cpu_ctx_set_threads(&m->ctx, threads);
	if (rc)
		return cpu_fail(st, rc, "cannot start %u compute threads", threads);
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

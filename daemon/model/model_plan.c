/*
 * model_plan.c - the typed tensor plan (docs/model.md §2): every tensor the
 * forward pass needs, located by name, with the dtype and shape the config
 * implies. All problems are collected and reported in one message, so a
 * user fixing a checkpoint sees everything at once.
 *
 * dtype policy: matrices (every Linear, the embedding, lm_head, unquantized
 * experts) must be BF16, the release dtype the GEMM kernels take; vectors
 * (norm weights, conv taps, A_log, dt_bias, the routing bias, the AttnRes
 * projections [1, D]) may be BF16, F16 or F32 and are read with
 * k3_tensor_read_f32(); MXFP4 packed and scale tensors must be U8.
 */
#include "model/model_plan.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_tensors.h"

enum { DT_MAT = 1, DT_VEC = 2, DT_U8 = 3 };

struct planctx {
	const struct k3_model_config *cfg;
	const struct k3_tensor *tensors;
	size_t n_tensors;
	char prefix[96];          /* "language_model." or "" */
	size_t problems;
	char msg[K3_ERR_MSG_MAX - 48];   /* room for the "tensor plan: N problems: " head */
	size_t len;
	size_t listed;
	bool nomem;
};

static void problem(struct planctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void problem(struct planctx *c, const char *fmt, ...)
{
	char one[K3_ERR_MSG_MAX];
	va_list ap;

	c->problems++;
	va_start(ap, fmt);
	vsnprintf(one, sizeof(one), fmt, ap);
	va_end(ap);
	/* keep room for the "(+N more)" tail */
	size_t need = strlen(one) + 2;
	if (c->len + need + 24 < sizeof(c->msg)) {
		c->len += (size_t)snprintf(c->msg + c->len, sizeof(c->msg) - c->len, "%s%s",
					   c->listed ? "; " : "", one);
		c->listed++;
	}
}

static bool dtype_ok(int cls, enum k3_dtype t)
{
	switch (cls) {
	case DT_MAT: return t == K3_DTYPE_BF16;
	case DT_VEC: return t == K3_DTYPE_BF16 || t == K3_DTYPE_F16 || t == K3_DTYPE_F32;
	case DT_U8: return t == K3_DTYPE_U8;
	}
	return false;
}

static const char *dtype_want(int cls)
{
	return cls == DT_MAT ? "BF16" : cls == DT_VEC ? "BF16, F16 or F32" : "U8";
}

static void fmt_shape(char *buf, size_t n, uint32_t ndim, const uint64_t *shape)
{
	size_t o = (size_t)snprintf(buf, n, "[");
	for (uint32_t i = 0; i < ndim && o < n; i++)
		o += (size_t)snprintf(buf + o, n - o, "%s%llu", i ? ", " : "", (unsigned long long)shape[i]);
	if (o < n)
		snprintf(buf + o, n - o, "]");
}

/* Looks up prefix + name and checks dtype class and exact shape. ndim 0
 * with numel_min > 0 means "any shape with at least numel_min elements"
 * (A_log, §2.3: flatten and use the first heads entries). */
static const struct k3_tensor *want(struct planctx *c, const char *name, int cls,
				    uint32_t ndim, const uint64_t *shape, uint64_t numel_min)
{
	char full[K3_TENSOR_NAME_MAX + 128];
	char a[128], b[128];

	snprintf(full, sizeof(full), "%s%s", c->prefix, name);
	const struct k3_tensor *t = k3_tensors_find(c->tensors, c->n_tensors, full);
	if (!t) {
		problem(c, "missing tensor '%s'", full);
		return NULL;
	}
	bool ok = true;
	if (!dtype_ok(cls, t->dtype)) {
		problem(c, "'%s' has dtype %s, expected %s", full, k3_dtype_name(t->dtype), dtype_want(cls));
		ok = false;
	}
	if (ndim) {
		bool same = t->ndim == ndim;
		for (uint32_t i = 0; same && i < ndim; i++)
			same = t->shape[i] == shape[i];
		if (!same) {
			fmt_shape(a, sizeof(a), t->ndim, t->shape);
			fmt_shape(b, sizeof(b), ndim, shape);
			problem(c, "'%s' has shape %s, expected %s", full, a, b);
			ok = false;
		}
	} else if (t->nelem < numel_min) {
		problem(c, "'%s' has %llu elements, expected at least %llu", full,
			(unsigned long long)t->nelem, (unsigned long long)numel_min);
		ok = false;
	}
	return ok ? t : NULL;
}

static const struct k3_tensor *want1(struct planctx *c, const char *name, int cls, uint64_t d0)
{
	return want(c, name, cls, 1, (uint64_t[]){ d0 }, 0);
}

static const struct k3_tensor *want2(struct planctx *c, const char *name, int cls,
				     uint64_t d0, uint64_t d1)
{
	return want(c, name, cls, 2, (uint64_t[]){ d0, d1 }, 0);
}

/* "model.layers.<l>.<role>" */
static const char *lname(char *buf, size_t n, uint32_t l, const char *role)
{
	snprintf(buf, n, "model.layers.%u.%s", l, role);
	return buf;
}

static void plan_kda(struct planctx *c, uint32_t l, struct k3_kda_plan *k)
{
	const struct k3_model_config *f = c->cfg;
	uint64_t D = f->hidden_size, P = f->kda_width, dk = f->kda_head_dim, H = f->kda_num_heads;
	uint64_t K = f->short_conv_kernel_size;
	char n[160];

	k->q_proj = want2(c, lname(n, sizeof(n), l, "self_attn.q_proj.weight"), DT_MAT, P, D);
	k->k_proj = want2(c, lname(n, sizeof(n), l, "self_attn.k_proj.weight"), DT_MAT, P, D);
	k->v_proj = want2(c, lname(n, sizeof(n), l, "self_attn.v_proj.weight"), DT_MAT, P, D);
	uint64_t cs[3] = { P, 1, K };
	k->q_conv1d = want(c, lname(n, sizeof(n), l, "self_attn.q_conv1d.weight"), DT_VEC, 3, cs, 0);
	k->k_conv1d = want(c, lname(n, sizeof(n), l, "self_attn.k_conv1d.weight"), DT_VEC, 3, cs, 0);
	k->v_conv1d = want(c, lname(n, sizeof(n), l, "self_attn.v_conv1d.weight"), DT_VEC, 3, cs, 0);
	k->f_a_proj = want2(c, lname(n, sizeof(n), l, "self_attn.f_a_proj.weight"), DT_MAT, dk, D);
	k->f_b_proj = want2(c, lname(n, sizeof(n), l, "self_attn.f_b_proj.weight"), DT_MAT, P, dk);
	k->a_log = want(c, lname(n, sizeof(n), l, "self_attn.A_log"), DT_VEC, 0, NULL, H);
	k->dt_bias = want(c, lname(n, sizeof(n), l, "self_attn.dt_bias"), DT_VEC, 0, NULL, P);
	if (k->dt_bias && k->dt_bias->nelem != P) {
		problem(c, "'%s%s' has %llu elements, expected %llu (one per head and channel)", c->prefix, n,
			(unsigned long long)k->dt_bias->nelem, (unsigned long long)P);
		k->dt_bias = NULL;
	}
	k->b_proj = want2(c, lname(n, sizeof(n), l, "self_attn.b_proj.weight"), DT_MAT, H, D);
	if (f->use_full_rank_gate) {
		k->g_proj = want2(c, lname(n, sizeof(n), l, "self_attn.g_proj.weight"), DT_MAT, P, D);
	} else {
		k->g_a_proj = want2(c, lname(n, sizeof(n), l, "self_attn.g_a_proj.weight"), DT_MAT, dk, D);
		k->g_b_proj = want2(c, lname(n, sizeof(n), l, "self_attn.g_b_proj.weight"), DT_MAT, P, dk);
	}
	k->o_norm = want1(c, lname(n, sizeof(n), l, "self_attn.o_norm.weight"), DT_VEC, dk);
	k->o_proj = want2(c, lname(n, sizeof(n), l, "self_attn.o_proj.weight"), DT_MAT, D, P);
}

static void plan_mla(struct planctx *c, uint32_t l, struct k3_mla_plan *a)
{
	const struct k3_model_config *f = c->cfg;
	uint64_t D = f->hidden_size, H = f->num_attention_heads;
	uint64_t qh = f->mla_q_head_dim, kv = f->kv_lora_rank, qr = f->q_lora_rank;
	char n[160];

	if (qr) {
		a->q_a_proj = want2(c, lname(n, sizeof(n), l, "self_attn.q_a_proj.weight"), DT_MAT, qr, D);
		a->q_a_layernorm = want1(c, lname(n, sizeof(n), l, "self_attn.q_a_layernorm.weight"), DT_VEC, qr);
		a->q_b_proj = want2(c, lname(n, sizeof(n), l, "self_attn.q_b_proj.weight"), DT_MAT, H * qh, qr);
	} else {
		a->q_proj = want2(c, lname(n, sizeof(n), l, "self_attn.q_proj.weight"), DT_MAT, H * qh, D);
	}
	a->kv_a_proj_with_mqa = want2(c, lname(n, sizeof(n), l, "self_attn.kv_a_proj_with_mqa.weight"),
				      DT_MAT, f->mla_kv_a_width, D);
	a->kv_a_layernorm = want1(c, lname(n, sizeof(n), l, "self_attn.kv_a_layernorm.weight"), DT_VEC, kv);
	a->kv_b_proj = want2(c, lname(n, sizeof(n), l, "self_attn.kv_b_proj.weight"), DT_MAT,
			     H * (f->qk_nope_head_dim + f->v_head_dim), kv);
	if (f->mla_use_output_gate)
		a->g_proj = want2(c, lname(n, sizeof(n), l, "self_attn.g_proj.weight"), DT_MAT,
				  f->mla_attn_width, D);
	a->o_proj = want2(c, lname(n, sizeof(n), l, "self_attn.o_proj.weight"), DT_MAT, D, f->mla_attn_width);
}

static void plan_mlp(struct planctx *c, uint32_t l, const char *pre, uint64_t W, struct k3_mlp_plan *p)
{
	uint64_t D = c->cfg->hidden_size;
	char role[96], n[160];

	snprintf(role, sizeof(role), "%sgate_proj.weight", pre);
	p->gate_proj = want2(c, lname(n, sizeof(n), l, role), DT_MAT, W, D);
	snprintf(role, sizeof(role), "%sup_proj.weight", pre);
	p->up_proj = want2(c, lname(n, sizeof(n), l, role), DT_MAT, W, D);
	snprintf(role, sizeof(role), "%sdown_proj.weight", pre);
	p->down_proj = want2(c, lname(n, sizeof(n), l, role), DT_MAT, D, W);
}

/* One expert projection: MXFP4 when <base>.weight_packed exists (§2.7),
 * else <base>.weight. */
static void plan_proj(struct planctx *c, uint32_t l, uint32_t e, const char *w,
		      uint32_t rows, uint32_t cols, struct k3_expert_proj *p)
{
	char role[96], n[160], full[K3_TENSOR_NAME_MAX + 128];

	p->rows = rows;
	p->cols = cols;
	snprintf(role, sizeof(role), "block_sparse_moe.experts.%u.%s.weight_packed", e, w);
	lname(n, sizeof(n), l, role);
	snprintf(full, sizeof(full), "%s%s", c->prefix, n);
	if (k3_tensors_find(c->tensors, c->n_tensors, full)) {
		p->mxfp4 = true;
		if (cols % K3_MXFP4_GROUP) {
			problem(c, "'%s': MXFP4 input width %u is not a multiple of 32", full, cols);
			return;
		}
		p->packed = want2(c, n, DT_U8, rows, cols / 2);
		snprintf(role, sizeof(role), "block_sparse_moe.experts.%u.%s.weight_scale", e, w);
		p->scale = want2(c, lname(n, sizeof(n), l, role), DT_U8, rows, cols / K3_MXFP4_GROUP);
	} else {
		snprintf(role, sizeof(role), "block_sparse_moe.experts.%u.%s.weight", e, w);
		lname(n, sizeof(n), l, role);
		snprintf(full, sizeof(full), "%s%s", c->prefix, n);
		if (!k3_tensors_find(c->tensors, c->n_tensors, full)) {
			problem(c, "missing tensor '%s' (neither .weight_packed nor .weight)", full);
			return;
		}
		p->weight = want2(c, n, DT_MAT, rows, cols);
	}
}

static void add_span(struct k3_expert *x, const struct k3_tensor *t, bool *first)
{
	if (!t)
		return;
	x->payload_bytes += t->nbytes;
	if (*first) {
		x->span_shard = t->shard;
		x->span_offset = t->file_offset;
		x->span_bytes = t->nbytes;
		x->span_one_shard = true;
		*first = false;
		return;
	}
	if (t->shard != x->span_shard) {
		x->span_one_shard = false;
		return;
	}
	uint64_t end = x->span_offset + x->span_bytes;
	if (t->file_offset < x->span_offset)
		x->span_offset = t->file_offset;
	if (t->file_offset + t->nbytes > end)
		end = t->file_offset + t->nbytes;
	x->span_bytes = end - x->span_offset;
}

static void expert_span(struct k3_expert *x)
{
	const struct k3_expert_proj *p[3] = { &x->w1, &x->w2, &x->w3 };
	bool first = true;

	for (int i = 0; i < 3; i++) {
		add_span(x, p[i]->packed, &first);
		add_span(x, p[i]->scale, &first);
		add_span(x, p[i]->weight, &first);
	}
	x->span_contiguous = x->span_one_shard && x->span_bytes == x->payload_bytes;
	if (!x->span_one_shard) {
		x->span_offset = 0;
		x->span_bytes = 0;
	}
}

static void plan_moe(struct planctx *c, uint32_t l, struct k3_moe_plan *q, struct k3_expert *experts)
{
	const struct k3_model_config *f = c->cfg;
	uint64_t D = f->hidden_size, E = f->num_experts, lat = f->routed_expert_hidden_size;
	char n[160];

	q->gate = want2(c, lname(n, sizeof(n), l, "block_sparse_moe.gate.weight"), DT_MAT, E, D);
	q->e_score_correction_bias = want1(c, lname(n, sizeof(n), l,
				"block_sparse_moe.gate.e_score_correction_bias"), DT_VEC, E);
	if (lat) {
		q->routed_expert_down_proj = want2(c, lname(n, sizeof(n), l,
					"block_sparse_moe.routed_expert_down_proj.weight"), DT_MAT, lat, D);
		if (f->latent_moe_use_norm)
			q->routed_expert_norm = want1(c, lname(n, sizeof(n), l,
					"block_sparse_moe.routed_expert_norm.weight"), DT_VEC, lat);
		q->routed_expert_up_proj = want2(c, lname(n, sizeof(n), l,
					"block_sparse_moe.routed_expert_up_proj.weight"), DT_MAT, D, lat);
	}
	if (f->num_shared_experts)
		plan_mlp(c, l, "block_sparse_moe.shared_experts.", f->shared_width, &q->shared_experts);
	q->n_experts = f->num_experts;
	q->experts = experts;
	for (uint32_t e = 0; e < f->num_experts; e++) {
		struct k3_expert *x = &experts[e];
		plan_proj(c, l, e, "w1", f->moe_intermediate_size, f->expert_in, &x->w1);
		plan_proj(c, l, e, "w3", f->moe_intermediate_size, f->expert_in, &x->w3);
		plan_proj(c, l, e, "w2", f->expert_in, f->moe_intermediate_size, &x->w2);
		expert_span(x);
		if (c->problems > 10000)
			return;   /* hopeless checkpoint: stop before listing 800k lines */
	}
}

int k3_model_plan_build(const struct k3_model_config *cfg, const struct k3_tensor *tensors,
			size_t n_tensors, struct k3_model_plan *plan, struct k3_layer_plan **layers,
			struct k3_expert **experts, struct k3_err *err)
{
	const struct k3_model_config *f = cfg;
	struct planctx *c = calloc(1, sizeof(*c));
	uint64_t D = f->hidden_size, V = f->vocab_size;
	bool ar = f->attn_res_block_size != 0;
	char n[160];
	int r = 0;

	if (!c)
		return k3_err_set(err, -ENOMEM, "out of memory");
	c->cfg = cfg;
	c->tensors = tensors;
	c->n_tensors = n_tensors;
	snprintf(c->prefix, sizeof(c->prefix), "%s", f->has_language_model_prefix ? "language_model." : "");
	*layers = calloc(f->num_hidden_layers, sizeof(**layers));
	*experts = calloc((size_t)f->n_moe * f->num_experts + 1, sizeof(**experts));
	if (!*layers || !*experts) {
		free(c);
		return k3_err_set(err, -ENOMEM, "out of memory for the tensor plan");
	}
	struct k3_model_plan *p = plan;
	p->embed_tokens = want2(c, "model.embed_tokens.weight", DT_MAT, V, D);
	p->norm = want1(c, "model.norm.weight", DT_VEC, D);
	if (f->tie_word_embeddings)
		p->lm_head = p->embed_tokens;
	else
		p->lm_head = want2(c, "lm_head.weight", DT_MAT, V, D);
	if (ar) {
		p->output_attn_res_norm = want1(c, "model.output_attn_res_norm.weight", DT_VEC, D);
		p->output_attn_res_proj = want2(c, "model.output_attn_res_proj.weight", DT_VEC, 1, D);
	}
	p->n_layers = f->num_hidden_layers;
	p->layers = *layers;
	size_t ex = 0;
	for (uint32_t l = 0; l < f->num_hidden_layers && c->problems <= 10000; l++) {
		struct k3_layer_plan *y = &(*layers)[l];
		y->index = l;
		y->is_kda = f->is_kda[l];
		y->is_moe = f->is_moe[l];
		y->is_block_start = f->is_block_start[l];
		y->input_layernorm = want1(c, lname(n, sizeof(n), l, "input_layernorm.weight"), DT_VEC, D);
		y->post_attention_layernorm = want1(c, lname(n, sizeof(n), l, "post_attention_layernorm.weight"),
						    DT_VEC, D);
		if (ar) {
			y->self_attention_res_norm = want1(c, lname(n, sizeof(n), l, "self_attention_res_norm.weight"),
							   DT_VEC, D);
			y->self_attention_res_proj = want2(c, lname(n, sizeof(n), l, "self_attention_res_proj.weight"),
							   DT_VEC, 1, D);
			y->mlp_res_norm = want1(c, lname(n, sizeof(n), l, "mlp_res_norm.weight"), DT_VEC, D);
			y->mlp_res_proj = want2(c, lname(n, sizeof(n), l, "mlp_res_proj.weight"), DT_VEC, 1, D);
		}
		if (y->is_kda)
			plan_kda(c, l, &y->kda);
		else
			plan_mla(c, l, &y->mla);
		if (y->is_moe) {
			plan_moe(c, l, &y->moe, &(*experts)[ex]);
			ex += f->num_experts;
		} else {
			plan_mlp(c, l, "mlp.", f->intermediate_size, &y->mlp);
		}
	}
	if (c->problems) {
		size_t more = c->problems - c->listed;
		if (more)
			snprintf(c->msg + c->len, sizeof(c->msg) - c->len, "; (+%zu more)", more);
		r = k3_err_set(err, -EINVAL, "tensor plan: %zu problem%s: %s", c->problems,
			       c->problems == 1 ? "" : "s", c->msg);
	}
	free(c);
	return r;
}

/*
 * engine.c - the K3 layer program over a provider (see engine.h).
 *
 * Residual stream bookkeeping (spec §4.3): `pool` holds n_blocks + 1
 * buffers of [chunk][D]. pool[0..nB-1] are the block snapshots B, pool[nB]
 * is the running sum P; a block start bumps nB, which both snapshots the
 * old P and starts a fresh one, with no copy. AttnRes candidates are
 * therefore always the contiguous prefix pool[0..nB].
 */
#include "engine/engine.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "provider_registry.h"

/* The model's I8 tensors go to the provider as they are mapped: both
 * headers must describe one layout (q, zero gap to 64 bytes, scales). */
_Static_assert(K3_MODEL_I8_SCALE_OFFSET(3, 5) == K3_PROV_I8_SCALE_OFFSET(3, 5) &&
	       K3_MODEL_I8_SCALE_OFFSET(7168, 12288) == K3_PROV_I8_SCALE_OFFSET(7168, 12288) &&
	       K3_MODEL_I8_BYTES(96, 7171) == K3_PROV_I8_BYTES(96, 7171),
	       "model.h and k3_provider.h disagree on the I8 layout");

struct k3_engine {
	const struct k3_model *model;
	const struct k3_provider *prov;
	bool prov_pieces;            /* prov has routed_begin/expert/end */
	bool prov_partial;           /* ... and routed_partial */
	bool prov_verify;            /* prov has kda_record_new/free, kda_verify, kda_replay */
	bool prov_export;            /* prov has kda_state_export, mla_cache_export */
	bool prov_resident;          /* ... and experts_resident (a device tier) */
	k3_prov_model *pm;
	struct k3_prov_config cfg;
	struct k3_prov_weights weights;
	struct k3_prov_layer_weights *lw;
	struct k3_expert_source src;
	/* the spine source (has_spine), what open acquired of it, and the
	 * streamed layer (UINT32_MAX: none) and head bound right now */
	struct k3_spine_source spine;
	bool has_spine, prov_bind;
	uint32_t spine_opened;       /* resident layers acquired at open */
	bool head_opened;            /* resident head acquired at open */
	uint32_t bound;
	bool head_bound;
	void *rows;                  /* [chunk][D] embedding rows, up to 4 bytes each */
	const atomic_bool *cancel;   /* polled between layers; may be NULL */
	uint32_t chunk, n_blocks, n_moe, K, D, V;
	uint32_t moe_layers[K3_PROV_MAX_LAYERS];
	int32_t moe_index[K3_PROV_MAX_LAYERS];   /* layer -> MoE ordinal, -1 */
	/* chunk scratch */
	float **pool;                /* [n_blocks + 1] of [chunk][D] */
	const float **cands;         /* [n_blocks + 1] */
	float *h, *x, *mb, *z;       /* [chunk][D] */
	float *part;                 /* [chunk][D]: the partial lookahead's residual */
	/* the MoE layer being run: its AttnRes block count and the next MoE
	 * layer (UINT32_MAX: none), for the partial lookahead */
	uint32_t cur_nB, next_moe;
	uint32_t *ids;               /* [chunk][K] */
	float *w;                    /* [chunk][K] */
	struct k3_prov_expert *spans;  /* [chunk][K] */
	/* layer-wide sources: grouping and lookahead scratch */
	uint32_t *stamp;             /* [n_experts]: last group that counted it */
	uint32_t stamp_gen;
	uint32_t *pids;              /* [chunk][K] predicted ids */
	float *pw;                   /* [chunk][K] */
	uint32_t *guess;             /* [chunk][K] deduplicated guesses */
	uint32_t *guess_rank;        /* [chunk][K] each guess's rank (0 = most confident) */
	/* target-row capture (k3_engine_set_taps) */
	uint32_t n_taps;
	int32_t tap_index[K3_PROV_MAX_LAYERS];   /* layer -> tap ordinal, -1 */
	float *tap_out;              /* [T][n_taps][D] of the next calls; NULL = none */
	/* batched passes (k3_engine_forward_batch) */
	int32_t *pass_ids;           /* [chunk]: the parts' ids, end to end */
	float *blog;                 /* [blog_rows][V]: LAST logits of several parts */
	uint32_t blog_rows;
	/* verification (k3_engine_verify / commit); at most one pending per
	 * engine, its records sized for vcap positions (grown on demand) */
	struct k3_engine_seq *pending;
	uint32_t pending_T;
	uint32_t vcap;
	uint32_t v_layers;           /* snapshot path: layers whose snapshot this pass took */
	k3_prov_kda_record **vrec;   /* [L] with prov_verify, NULL for MLA layers */
	k3_prov_kda_state **vsnap;   /* [L] without: the state before the pass */
	float **vh;                  /* [L] without: [vcap][D] the pass's KDA inputs */
	/* experts_resident: a chunk's distinct experts, residency, misses */
	uint32_t *tier_ids, *tier_miss;      /* [chunk][K] */
	uint8_t *tier_res;                   /* [chunk][K] */
};

struct k3_engine_seq {
	struct k3_engine *e;
	uint32_t len;
	bool poisoned;
	k3_prov_kda_state **kda;     /* [L], NULL for MLA layers */
	k3_prov_mla_cache **mla;     /* [L], NULL for KDA layers */
};

/* One sequence's rows of a pass: rows [row0, row0 + n) of the pass's
 * activations; pos0 = where its first position goes in out and taps;
 * last = its call's final chunk (LAST logits come from it). */
struct pass_part {
	struct k3_engine_seq *s;
	uint32_t row0, n, pos0;
	bool last;
	const struct k3_engine_out *out;
	float *taps;
};

static int prov_err(const struct k3_engine *e, struct k3_err *err, int rc,
		    const struct k3_prov_status *st)
{
	return k3_err_set(err, rc ? rc : -EIO, "provider '%s': %s", e->prov->name,
			  st->msg[0] ? st->msg : "failed");
}

/* Layer l's weights stream from the spine source (bound per pass). */
static bool streamed(const struct k3_engine *e, uint32_t l)
{
	return e->has_spine && l < e->cfg.n_layers && l >= e->spine.resident_layers;
}

/* ---------------------------------------------------------------- model -> ABI */

struct k3_prov_tensor k3_engine_prov_tensor(const struct k3_tensor *t, const void *data)
{
	struct k3_prov_tensor o = { 0 };
	if (!t)
		return o;
	switch (t->dtype) {
	case K3_DTYPE_BF16: o.dtype = K3_PROV_DTYPE_BF16; break;
	case K3_DTYPE_F32: o.dtype = K3_PROV_DTYPE_F32; break;
	case K3_DTYPE_U8: o.dtype = K3_PROV_DTYPE_U8; break;
	case K3_DTYPE_I8: o.dtype = K3_PROV_DTYPE_I8; break;   /* the int8 spine (model.h) */
	default: o.dtype = K3_PROV_DTYPE_NONE; break;   /* refused by the provider */
	}
	if (t->ndim < 1 || t->ndim > 3) {
		o.dtype = K3_PROV_DTYPE_NONE;
		return o;
	}
	o.data = data;
	o.ndim = t->ndim;
	for (uint32_t i = 0; i < 3; i++)
		o.shape[i] = i < t->ndim ? t->shape[i] : 1;
	return o;
}

static struct k3_prov_tensor tensor(const struct k3_tensor *t)
{
	return k3_engine_prov_tensor(t, t ? t->data : NULL);
}

static int build_config(const struct k3_model_config *mc, struct k3_prov_config *c,
			struct k3_err *err)
{
	const char *why = NULL;
	if (!mc->attn_res_block_size)
		why = "attn_res_block_size null (plain residual)";
	else if (mc->hidden_act != K3_ACT_SITU)
		why = "hidden_act other than \"situ\"";
	else if (mc->num_hidden_layers > K3_PROV_MAX_LAYERS)
		why = "more layers than the provider ABI allows";
	else if (mc->n_kda && (!mc->gate_lower_bound_set || !mc->use_full_rank_gate))
		why = "KDA without gate_lower_bound or use_full_rank_gate";
	else if (mc->n_mla && (!mc->q_lora_rank || !mc->mla_use_output_gate))
		why = "MLA without q_lora_rank or mla_use_output_gate";
	else if (mc->n_moe && !mc->num_shared_experts)
		why = "MoE layers without shared experts";
	else if (mc->n_moe && (!mc->routed_expert_hidden_size || !mc->latent_moe_use_norm ||
			       mc->moe_router_activation_func != K3_ROUTER_SIGMOID ||
			       (mc->num_expert_group > 1 && mc->num_expert_group > mc->topk_group)))
		why = "MoE without latent experts + norm, with a softmax router or grouped top-k";
	if (why)
		return k3_err_set(err, -EINVAL, "model uses %s, which the engine does not support "
				  "(Kimi K3 configuration expected)", why);
	memset(c, 0, sizeof(*c));
	c->struct_size = sizeof(*c);
	c->hidden = mc->hidden_size;
	c->n_layers = mc->num_hidden_layers;
	c->vocab = mc->vocab_size;
	c->dense_inter = mc->intermediate_size;
	c->shared_inter = mc->shared_width;
	c->moe_inter = mc->moe_intermediate_size;
	c->latent = mc->routed_expert_hidden_size;
	c->n_experts = mc->num_experts;
	c->top_k = mc->num_experts_per_token;
	c->attn_res_block = mc->attn_res_block_size;
	c->kda_heads = mc->kda_num_heads;
	c->kda_head_dim = mc->kda_head_dim;
	c->conv_kernel = mc->short_conv_kernel_size;
	c->mla_heads = mc->num_attention_heads;
	c->q_lora = mc->q_lora_rank;
	c->kv_lora = mc->kv_lora_rank;
	c->qk_nope = mc->qk_nope_head_dim;
	c->qk_rope = mc->qk_rope_head_dim;
	c->v_head = mc->v_head_dim;
	c->moe_renormalize = mc->moe_renormalize;
	c->rms_eps = mc->rms_norm_eps;
	c->mla_norm_eps = 1e-6f;     /* HF constructs these norms without eps (spec §3.1) */
	c->situ_beta1 = mc->situ_beta;
	c->situ_beta2 = mc->situ_linear_beta_set ? mc->situ_linear_beta : 0.0f;
	c->gate_lower_bound = mc->gate_lower_bound;
	c->routed_scale = mc->routed_scaling_factor;
	for (uint32_t l = 0; l < mc->num_hidden_layers; l++) {
		c->attn_kind[l] = mc->is_kda[l] ? K3_PROV_ATTN_KDA : K3_PROV_ATTN_MLA;
		c->ffn_kind[l] = mc->is_moe[l] ? K3_PROV_FFN_MOE : K3_PROV_FFN_DENSE;
	}
	return 0;
}

_Static_assert(sizeof(struct k3_prov_layer_weights) ==
	       K3_ENGINE_LAYER_FIELDS * sizeof(struct k3_prov_tensor),
	       "struct k3_prov_layer_weights holds only struct k3_prov_tensor fields");

/* Index of field `name` of struct k3_prov_layer_weights. */
#define LAYER_FIELD(name) \
	(offsetof(struct k3_prov_layer_weights, name) / sizeof(struct k3_prov_tensor))

struct k3_prov_tensor *k3_engine_layer_field(struct k3_prov_layer_weights *w, unsigned i)
{
	return (struct k3_prov_tensor *)((char *)w + (size_t)i * sizeof(struct k3_prov_tensor));
}

struct k3_prov_tensor *k3_engine_head_field(struct k3_prov_weights *w, unsigned i)
{
	struct k3_prov_tensor *f[K3_ENGINE_HEAD_FIELDS] = { &w->lm_head, &w->norm,
							    &w->out_res_norm, &w->out_res_proj };
	return i < K3_ENGINE_HEAD_FIELDS ? f[i] : NULL;
}

void k3_engine_head_tensors(const struct k3_model_plan *p,
			    const struct k3_tensor *f[K3_ENGINE_HEAD_FIELDS])
{
	f[0] = p->lm_head;
	f[1] = p->norm;
	f[2] = p->output_attn_res_norm;
	f[3] = p->output_attn_res_proj;
}

void k3_engine_layer_tensors(const struct k3_layer_plan *p,
			     const struct k3_tensor *f[K3_ENGINE_LAYER_FIELDS])
{
	for (unsigned i = 0; i < K3_ENGINE_LAYER_FIELDS; i++)
		f[i] = NULL;
	f[LAYER_FIELD(input_norm)] = p->input_layernorm;
	f[LAYER_FIELD(post_attn_norm)] = p->post_attention_layernorm;
	f[LAYER_FIELD(attn_res_norm)] = p->self_attention_res_norm;
	f[LAYER_FIELD(attn_res_proj)] = p->self_attention_res_proj;
	f[LAYER_FIELD(mlp_res_norm)] = p->mlp_res_norm;
	f[LAYER_FIELD(mlp_res_proj)] = p->mlp_res_proj;
	if (p->is_kda) {
		const struct k3_kda_plan *k = &p->kda;
		f[LAYER_FIELD(q_proj)] = k->q_proj;
		f[LAYER_FIELD(k_proj)] = k->k_proj;
		f[LAYER_FIELD(v_proj)] = k->v_proj;
		f[LAYER_FIELD(q_conv)] = k->q_conv1d;
		f[LAYER_FIELD(k_conv)] = k->k_conv1d;
		f[LAYER_FIELD(v_conv)] = k->v_conv1d;
		f[LAYER_FIELD(f_a_proj)] = k->f_a_proj;
		f[LAYER_FIELD(f_b_proj)] = k->f_b_proj;
		f[LAYER_FIELD(a_log)] = k->a_log;
		f[LAYER_FIELD(dt_bias)] = k->dt_bias;
		f[LAYER_FIELD(b_proj)] = k->b_proj;
		f[LAYER_FIELD(g_proj)] = k->g_proj;
		f[LAYER_FIELD(o_norm)] = k->o_norm;
		f[LAYER_FIELD(o_proj)] = k->o_proj;
	} else {
		const struct k3_mla_plan *a = &p->mla;
		f[LAYER_FIELD(q_a_proj)] = a->q_a_proj;
		f[LAYER_FIELD(q_a_norm)] = a->q_a_layernorm;
		f[LAYER_FIELD(q_b_proj)] = a->q_b_proj;
		f[LAYER_FIELD(kv_a_proj)] = a->kv_a_proj_with_mqa;
		f[LAYER_FIELD(kv_a_norm)] = a->kv_a_layernorm;
		f[LAYER_FIELD(kv_b_proj)] = a->kv_b_proj;
		f[LAYER_FIELD(g_proj)] = a->g_proj;
		f[LAYER_FIELD(o_proj)] = a->o_proj;
	}
	const struct k3_mlp_plan *mlp = p->is_moe ? &p->moe.shared_experts : &p->mlp;
	f[LAYER_FIELD(mlp_gate)] = mlp->gate_proj;
	f[LAYER_FIELD(mlp_up)] = mlp->up_proj;
	f[LAYER_FIELD(mlp_down)] = mlp->down_proj;
	if (p->is_moe) {
		f[LAYER_FIELD(router)] = p->moe.gate;
		f[LAYER_FIELD(router_bias)] = p->moe.e_score_correction_bias;
		f[LAYER_FIELD(lat_down)] = p->moe.routed_expert_down_proj;
		f[LAYER_FIELD(lat_norm)] = p->moe.routed_expert_norm;
		f[LAYER_FIELD(lat_up)] = p->moe.routed_expert_up_proj;
	}
}

/* Layer p's provider weights: the mmapped tensors, or (streamed) their
 * shapes without data. */
static void build_layer(const struct k3_layer_plan *p, bool with_data,
			struct k3_prov_layer_weights *w)
{
	const struct k3_tensor *f[K3_ENGINE_LAYER_FIELDS];

	k3_engine_layer_tensors(p, f);
	for (unsigned i = 0; i < K3_ENGINE_LAYER_FIELDS; i++)
		*k3_engine_layer_field(w, i) =
			k3_engine_prov_tensor(f[i], f[i] && with_data ? f[i]->data : NULL);
}

/* The default expert source: the model's mmapped MXFP4 tensors. */
static int model_acquire(void *ctx, uint32_t layer, uint32_t expert,
			 struct k3_prov_expert *out, struct k3_err *err)
{
	const struct k3_model_plan *plan = k3_model_plan(ctx);
	if (layer >= plan->n_layers || !plan->layers[layer].is_moe ||
	    expert >= plan->layers[layer].moe.n_experts)
		return k3_err_set(err, -EINVAL, "no expert %u in layer %u", expert, layer);
	const struct k3_expert *x = &plan->layers[layer].moe.experts[expert];
	if (!x->w1.mxfp4 || !x->w2.mxfp4 || !x->w3.mxfp4)
		return k3_err_set(err, -EINVAL, "layer %u expert %u is not MXFP4 (unsupported)",
				  layer, expert);
	out->w1_packed = x->w1.packed->data;
	out->w1_scale = x->w1.scale->data;
	out->w3_packed = x->w3.packed->data;
	out->w3_scale = x->w3.scale->data;
	out->w2_packed = x->w2.packed->data;
	out->w2_scale = x->w2.scale->data;
	return 0;
}

static void model_release(void *ctx, uint32_t layer, uint32_t expert)
{
	(void)ctx;
	(void)layer;
	(void)expert;
}

/* ---------------------------------------------------------------- engine */

/* The verification buffers of every layer (records, or snapshots and inputs). */
static void verify_free(struct k3_engine *e)
{
	for (uint32_t l = 0; l < e->cfg.n_layers; l++) {
		if (e->vrec && e->vrec[l])
			e->prov->kda_record_free(e->vrec[l]);
		if (e->vsnap && e->vsnap[l])
			e->prov->kda_state_free(e->vsnap[l]);
		if (e->vh)
			free(e->vh[l]);
	}
	free(e->vrec);
	free(e->vsnap);
	free(e->vh);
	e->vrec = NULL;
	e->vsnap = NULL;
	e->vh = NULL;
	e->vcap = 0;
}

/* Whether prov sets the optional op `field` (struct_size covers it). */
#define PROV_HAS(prov, field) \
	((prov)->struct_size >= offsetof(struct k3_provider, field) + sizeof((prov)->field) && \
	 (prov)->field)

void k3_engine_free(struct k3_engine *e)
{
	if (!e)
		return;
	if (e->pm)
		e->prov->close(e->pm);
	if (e->pool)
		for (uint32_t i = 0; i <= e->n_blocks; i++)
			free(e->pool[i]);
	free(e->pool);
	free(e->cands);
	free(e->h);
	free(e->x);
	free(e->mb);
	free(e->z);
	free(e->part);
	free(e->pass_ids);
	free(e->blog);
	free(e->ids);
	free(e->w);
	free(e->spans);
	free(e->stamp);
	free(e->pids);
	free(e->pw);
	free(e->guess);
	free(e->guess_rank);
	free(e->tier_ids);
	free(e->tier_miss);
	free(e->tier_res);
	free(e->rows);
	verify_free(e);
	/* what open acquired of the spine source, after the provider let go */
	for (uint32_t l = 0; l < e->spine_opened; l++)
		e->spine.release_layer(e->spine.ctx, l);
	if (e->head_opened)
		e->spine.release_head(e->spine.ctx);
	free(e->lw);
	free(e);
}

/* The provider's weights with a spine source: the resident layers and
 * head acquired from it (once, for the engine's life), the streamed ones
 * and the embedding as shapes without data. */
static int spine_weights(struct k3_engine *e, const struct k3_model_plan *plan,
			 struct k3_err *err)
{
	const struct k3_spine_source *sp = &e->spine;
	const struct k3_tensor *hf[K3_ENGINE_HEAD_FIELDS];

	if (!e->prov_bind)
		return k3_err_set(err, -EINVAL, "provider '%s' cannot bind streamed layers"
				  " (no bind_layer, bind_head, embed_rows)", e->prov->name);
	if (sp->resident_layers > plan->n_layers || !sp->acquire_layer || !sp->release_layer ||
	    !sp->embed_rows || !sp->acquire_head || !sp->release_head || !sp->prefetch_layer ||
	    !sp->begin_pass)
		return k3_err_set(err, -EINVAL, "spine source: %u resident layers of %u, or an"
				  " operation missing", sp->resident_layers, plan->n_layers);
	for (uint32_t l = 0; l < plan->n_layers; l++) {
		if (l >= sp->resident_layers) {
			build_layer(&plan->layers[l], false, &e->lw[l]);
			continue;
		}
		int rc = sp->acquire_layer(sp->ctx, l, &e->lw[l], err);
		if (rc)
			return rc;
		e->spine_opened = l + 1;
	}
	e->weights.embed = k3_engine_prov_tensor(plan->embed_tokens, NULL);
	if (sp->head_resident) {
		int rc = sp->acquire_head(sp->ctx, &e->weights, err);
		if (rc)
			return rc;
		e->head_opened = true;
		return 0;
	}
	k3_engine_head_tensors(plan, hf);
	for (unsigned i = 0; i < K3_ENGINE_HEAD_FIELDS; i++)
		*k3_engine_head_field(&e->weights, i) = k3_engine_prov_tensor(hf[i], NULL);
	return 0;
}

int k3_engine_open(const struct k3_model *model, const struct k3_engine_opts *opts,
		   struct k3_engine **out, struct k3_err *err)
{
	struct k3_engine_opts def = { 0 };
	if (!opts)
		opts = &def;
	const struct k3_provider *prov = k3_provider_find(opts->provider ? opts->provider : "cpu", err);
	if (!prov)
		return err ? err->code : -ENOENT;
	if (opts->max_chunk > 4096)
		return k3_err_set(err, -EINVAL, "chunk of %u positions exceeds 4096", opts->max_chunk);

	struct k3_engine *e = calloc(1, sizeof(*e));
	if (!e)
		return k3_err_set(err, -ENOMEM, "out of memory");
	e->model = model;
	e->prov = prov;
	e->prov_pieces = prov->struct_size >= offsetof(struct k3_provider, routed_end) +
						sizeof(prov->routed_end) &&
			 prov->routed_begin && prov->routed_expert && prov->routed_end;
	e->prov_partial = e->prov_pieces &&
			  prov->struct_size >= offsetof(struct k3_provider, routed_partial) +
						sizeof(prov->routed_partial) &&
			  prov->routed_partial;
	e->prov_bind = prov->struct_size >= offsetof(struct k3_provider, embed_rows) +
					     sizeof(prov->embed_rows) &&
		       prov->bind_layer && prov->bind_head && prov->embed_rows;
	e->prov_verify = PROV_HAS(prov, kda_record_new) && PROV_HAS(prov, kda_record_free) &&
			 PROV_HAS(prov, kda_verify) && PROV_HAS(prov, kda_replay) && !opts->kda_snapshot;
	e->prov_export = PROV_HAS(prov, kda_state_export) && PROV_HAS(prov, mla_cache_export);
	for (uint32_t l = 0; l < K3_PROV_MAX_LAYERS; l++)
		e->tap_index[l] = -1;
	e->bound = UINT32_MAX;
	if (opts->spine) {
		e->spine = *opts->spine;
		e->has_spine = true;
	}
	e->prov_resident = e->prov_pieces &&
			   prov->struct_size >= offsetof(struct k3_provider, experts_resident) +
						 sizeof(prov->experts_resident) &&
			   prov->experts_resident;
	const struct k3_model_config *mc = k3_model_config(model);
	const struct k3_model_plan *plan = k3_model_plan(model);
	int rc = build_config(mc, &e->cfg, err);
	if (rc)
		goto fail;
	e->chunk = opts->max_chunk ? opts->max_chunk : 64;
	e->D = e->cfg.hidden;
	e->V = e->cfg.vocab;
	e->K = e->cfg.top_k;
	e->n_blocks = (e->cfg.n_layers + e->cfg.attn_res_block - 1) / e->cfg.attn_res_block;
	for (uint32_t l = 0; l < e->cfg.n_layers; l++) {
		e->moe_index[l] = -1;
		if (e->cfg.ffn_kind[l] == K3_PROV_FFN_MOE) {
			e->moe_index[l] = (int32_t)e->n_moe;
			e->moe_layers[e->n_moe++] = l;
		}
	}

	e->lw = calloc(plan->n_layers, sizeof(*e->lw));
	if (!e->lw) {
		rc = k3_err_set(err, -ENOMEM, "out of memory");
		goto fail;
	}
	e->weights = (struct k3_prov_weights){
		.struct_size = sizeof(e->weights),
		.n_layers = plan->n_layers,
		.embed = tensor(plan->embed_tokens),
		.lm_head = tensor(plan->lm_head),
		.norm = tensor(plan->norm),
		.out_res_norm = tensor(plan->output_attn_res_norm),
		.out_res_proj = tensor(plan->output_attn_res_proj),
		.layers = e->lw,
	};
	if (e->has_spine) {
		rc = spine_weights(e, plan, err);
		if (rc)
			goto fail;
	} else {
		for (uint32_t l = 0; l < plan->n_layers; l++)
			build_layer(&plan->layers[l], true, &e->lw[l]);
	}
	struct k3_prov_open_args args = {
		.struct_size = sizeof(args),
		.threads = opts->threads,
		.max_batch = e->chunk,
		.flags = (opts->reference ? K3_PROV_OPEN_REFERENCE : 0) |
			 (opts->split_all ? K3_PROV_OPEN_SPLIT_ALL : 0),
		.config = &e->cfg,
		.weights = &e->weights,
		.expert_tier_bytes = opts->vram_cache_bytes,
	};
	struct k3_prov_status st = { 0 };
	rc = prov->open(&args, &e->pm, &st);
	if (rc) {
		prov_err(e, err, rc, &st);
		goto fail;
	}
	k3_engine_set_expert_source(e, NULL);

	size_t rowb = (size_t)e->chunk * e->D * sizeof(float);
	e->pool = calloc(e->n_blocks + 1, sizeof(*e->pool));
	e->cands = calloc(e->n_blocks + 1, sizeof(*e->cands));
	e->h = malloc(rowb);
	e->x = malloc(rowb);
	e->mb = malloc(rowb);
	e->z = malloc(rowb);
	e->part = malloc(rowb);
	e->pass_ids = calloc(e->chunk, sizeof(*e->pass_ids));
	e->ids = calloc((size_t)e->chunk * (e->K ? e->K : 1), sizeof(*e->ids));
	e->w = calloc((size_t)e->chunk * (e->K ? e->K : 1), sizeof(*e->w));
	e->spans = calloc((size_t)e->chunk * (e->K ? e->K : 1), sizeof(*e->spans));
	e->stamp = calloc(e->cfg.n_experts ? e->cfg.n_experts : 1, sizeof(*e->stamp));
	e->pids = calloc((size_t)e->chunk * (e->K ? e->K : 1), sizeof(*e->pids));
	e->pw = calloc((size_t)e->chunk * (e->K ? e->K : 1), sizeof(*e->pw));
	e->guess = calloc((size_t)e->chunk * (e->K ? e->K : 1), sizeof(*e->guess));
	e->guess_rank = calloc((size_t)e->chunk * (e->K ? e->K : 1), sizeof(*e->guess_rank));
	if (e->has_spine)
		e->rows = malloc(rowb);
	e->tier_ids = calloc((size_t)e->chunk * (e->K ? e->K : 1), sizeof(*e->tier_ids));
	e->tier_miss = calloc((size_t)e->chunk * (e->K ? e->K : 1), sizeof(*e->tier_miss));
	e->tier_res = calloc((size_t)e->chunk * (e->K ? e->K : 1), sizeof(*e->tier_res));
	rc = (e->pool && e->cands && e->h && e->x && e->mb && e->z && e->part && e->pass_ids && e->ids && e->w &&
	      e->spans && e->stamp && e->pids && e->pw && e->guess && e->guess_rank &&
	      (e->rows || !e->has_spine) && e->tier_ids && e->tier_miss && e->tier_res) ? 0 : -ENOMEM;
	for (uint32_t i = 0; !rc && i <= e->n_blocks; i++)
		if (!(e->pool[i] = malloc(rowb)))
			rc = -ENOMEM;
	if (rc) {
		k3_err_set(err, rc, "out of memory for a %u-position chunk", e->chunk);
		goto fail;
	}
	*out = e;
	return 0;
fail:
	k3_engine_free(e);
	return rc;
}

void k3_engine_set_expert_source(struct k3_engine *e, const struct k3_expert_source *src)
{
	if (src)
		e->src = *src;
	else
		e->src = (struct k3_expert_source){ .ctx = (void *)e->model,
			.acquire = model_acquire, .release = model_release };
}

void k3_engine_set_cancel(struct k3_engine *e, const atomic_bool *flag)
{
	e->cancel = flag;
}

int k3_engine_set_threads(struct k3_engine *e, uint32_t threads, struct k3_err *err)
{
	struct k3_prov_status st = { 0 };
	int rc = e->prov->set_threads(e->pm, threads, &st);
	return rc ? prov_err(e, err, rc, &st) : 0;
}

int k3_engine_provider_check(const char *name, struct k3_err *err)
{
	if (strcmp(name, "auto") == 0)
		return 0;
	return k3_provider_find(name, err) ? 0 : err && err->code ? err->code : -ENOENT;
}

const char *k3_engine_provider_auto(void)
{
	return k3_provider_auto();
}

const struct k3_provider *k3_engine_provider(const struct k3_engine *e, k3_prov_model **pm)
{
	*pm = e->pm;
	return e->prov;
}

uint32_t k3_engine_vocab(const struct k3_engine *e) { return e->V; }
uint32_t k3_engine_top_k(const struct k3_engine *e) { return e->K; }
uint32_t k3_engine_n_moe(const struct k3_engine *e) { return e->n_moe; }
const uint32_t *k3_engine_moe_layers(const struct k3_engine *e) { return e->moe_layers; }

/* ---------------------------------------------------------------- sequences */

void k3_engine_seq_free(struct k3_engine_seq *s)
{
	if (!s)
		return;
	if (s->e->pending == s)
		s->e->pending = NULL;
	const struct k3_provider *p = s->e->prov;
	for (uint32_t l = 0; l < s->e->cfg.n_layers; l++) {
		if (s->kda)
			p->kda_state_free(s->kda[l]);
		if (s->mla)
			p->mla_cache_free(s->mla[l]);
	}
	free(s->kda);
	free(s->mla);
	free(s);
}

int k3_engine_seq_new(struct k3_engine *e, uint32_t capacity, struct k3_engine_seq **out,
		      struct k3_err *err)
{
	struct k3_engine_seq *s = calloc(1, sizeof(*s));
	if (!s)
		return k3_err_set(err, -ENOMEM, "out of memory");
	s->e = e;
	s->kda = calloc(e->cfg.n_layers, sizeof(*s->kda));
	s->mla = calloc(e->cfg.n_layers, sizeof(*s->mla));
	if (!s->kda || !s->mla) {
		k3_engine_seq_free(s);
		return k3_err_set(err, -ENOMEM, "out of memory");
	}
	struct k3_prov_status st = { 0 };
	for (uint32_t l = 0; l < e->cfg.n_layers; l++) {
		int rc = e->cfg.attn_kind[l] == K3_PROV_ATTN_KDA
			? e->prov->kda_state_new(e->pm, l, &s->kda[l], &st)
			: e->prov->mla_cache_new(e->pm, l, capacity, &s->mla[l], &st);
		if (rc) {
			k3_engine_seq_free(s);
			return prov_err(e, err, rc, &st);
		}
	}
	*out = s;
	return 0;
}

int k3_engine_seq_clone(struct k3_engine *e, const struct k3_engine_seq *src,
			struct k3_engine_seq **out, struct k3_err *err)
{
	if (src->e != e)
		return k3_err_set(err, -EINVAL, "sequence belongs to another engine");
	if (e->pending == src)
		return k3_err_set(err, -EBUSY, "sequence has a verification pending; commit it first");
	struct k3_engine_seq *s;
	int rc = k3_engine_seq_new(e, src->len, &s, err);
	if (rc)
		return rc;
	struct k3_prov_status st = { 0 };
	for (uint32_t l = 0; !rc && l < e->cfg.n_layers; l++)
		rc = src->kda[l] ? e->prov->kda_state_copy(s->kda[l], src->kda[l], &st)
				 : e->prov->mla_cache_copy(s->mla[l], src->mla[l], &st);
	if (rc) {
		k3_engine_seq_free(s);
		return prov_err(e, err, rc, &st);
	}
	s->len = src->len;
	s->poisoned = src->poisoned;
	*out = s;
	return 0;
}

uint32_t k3_engine_seq_len(const struct k3_engine_seq *s)
{
	return s->len;
}

/* ---------------------------------------------------------------- forward */

#define PCALL(call) do { rc = (call); if (rc) return prov_err(e, err, rc, &st); } while (0)

/* A fresh mark for e->stamp: experts stamped with it were counted by the
 * current pass. */
static void stamp_next(struct k3_engine *e)
{
	e->stamp_gen++;
	if (e->stamp_gen == 0) {   /* wrapped: forget every old mark */
		memset(e->stamp, 0, e->cfg.n_experts * sizeof(*e->stamp));
		e->stamp_gen = 1;
	}
}

/* End of the group of positions starting at t0 whose distinct experts fit
 * the source (cap = max_experts; 0 = no limit): one group = the whole
 * chunk unless the cap binds. *n_distinct = the group's distinct experts. */
static uint32_t group_end(struct k3_engine *e, uint32_t t0, uint32_t n, uint32_t *n_distinct)
{
	uint32_t K = e->K, cap = e->src.max_experts, t1 = t0, distinct = 0;

	stamp_next(e);
	while (t1 < n) {
		uint32_t add = 0;
		for (uint32_t k = 0; k < K; k++) {
			uint32_t id = e->ids[(size_t)t1 * K + k];
			if (id < e->cfg.n_experts && e->stamp[id] != e->stamp_gen) {
				e->stamp[id] = e->stamp_gen;
				add++;
			}
		}
		/* A position that alone exceeds cap still goes: the source
		 * refuses it with its own clear error. */
		if (cap && t1 > t0 && distinct + add > cap)
			break;
		distinct += add;
		t1++;
	}
	*n_distinct = distinct;
	return t1;
}

/* Router lookahead (engine.h, prefetch) for MoE layer `next`: its router
 * on the current residual pool[0..nB] (with pool[nB] replaced by `last`
 * when not NULL), AttnRes-mixed and normed with that layer's weights (the
 * layers in between are not run); at most `per` guesses per position.
 * Called after each MoE layer for the next one, after the embedding for
 * the first one (whose reads then overlap the dense layers before it),
 * and by partial_lookahead. Uses e->z and e->h as scratch (both are
 * rewritten before their next use) and never touches e->ids / e->w / e->x.
 * Failures only lose the guess. */
static void lookahead(struct k3_engine *e, uint32_t next, uint32_t nB, uint32_t n,
		      const float *last, uint32_t per)
{
	const struct k3_provider *p = e->prov;
	struct k3_prov_status st = { 0 };
	uint32_t K = e->K;
	size_t ng = 0;

	if (e->src.prefetch_max && e->src.prefetch_max < per)
		per = e->src.prefetch_max;
	if (per > K)
		per = K;
	for (uint32_t j = 0; j <= nB; j++)
		e->cands[j] = e->pool[j];
	if (last)
		e->cands[nB] = last;
	if (p->attnres_mix(e->pm, K3_PROV_MIX_MLP, next, e->cands, nB + 1, n, e->z, &st) ||
	    p->ffn_norm(e->pm, next, e->z, n, e->h, &st) ||
	    p->router(e->pm, next, e->h, n, e->pids, e->pw, &st))
		return;
	/* Rank-major across positions: every position's first choice, then
	 * every second choice... each expert once. */
	stamp_next(e);
	for (uint32_t k = 0; k < per; k++)
		for (uint32_t t = 0; t < n; t++) {
			uint32_t id = e->pids[(size_t)t * K + k];
			if (id < e->cfg.n_experts && e->stamp[id] != e->stamp_gen) {
				e->stamp[id] = e->stamp_gen;
				e->guess_rank[ng] = k;
				e->guess[ng++] = id;
			}
		}
	if (ng)
		e->src.prefetch(e->src.ctx, next, e->guess, e->guess_rank, ng, n, last != NULL);
}

/* Guesses per position of the partial lookahead (ranks 0 and 1): enough
 * to keep the readers busy through the end of the layer's compute, where
 * the lookahead after the layer, on the whole residual, adds the rest.
 * Reading more of the partial guesses read more wrong ones for no gain
 * (docs/store.md, "Partial lookahead"). */
enum { PARTIAL_GUESSES = 2 };

/* The partial lookahead of MoE layer l (routed call open, its shared
 * experts in e->mb): the next MoE layer's lookahead on P + shared +
 * the routed experts computed so far. Failures only lose the guess. */
static void partial_lookahead(struct k3_engine *e, uint32_t l, uint32_t n)
{
	const struct k3_provider *p = e->prov;
	struct k3_prov_status st = { 0 };
	size_t nd = (size_t)n * e->D;

	memcpy(e->part, e->pool[e->cur_nB], nd * sizeof(float));
	if (p->add(e->pm, e->part, e->mb, nd, &st) == 0 &&
	    p->routed_partial(e->pm, l, e->w, e->part, &st) == 0)
		lookahead(e, e->next_moe, e->cur_nB, n, e->part, PARTIAL_GUESSES);
}

/* The routed experts of positions t0..t1 (one group) one by one as the
 * source hands them out, hits first and misses as their reads land
 * (request_layer done for them): each expert runs as soon as its span is
 * readable; the provider sums in route order at the end, so the result
 * does not depend on the arrival order. partial: once half of them ran
 * and the rest are still being read, the partial lookahead queues the
 * next layer's likeliest reads in that wait (whole-chunk groups only). */
static int routed_group_pieces(struct k3_engine *e, uint32_t l, uint32_t t0, uint32_t t1,
			       uint32_t distinct, bool partial, struct k3_err *err)
{
	const struct k3_provider *p = e->prov;
	struct k3_prov_status st = { 0 };
	size_t off = (size_t)t0 * e->K;
	uint32_t id, taken = 0;
	struct k3_prov_expert sp;
	int rc = p->routed_begin(e->pm, l, e->x + (size_t)t0 * e->D, t1 - t0, e->ids + off, &st);

	while (rc == 0) {
		if (partial && 2 * taken >= distinct && e->src.would_block(e->src.ctx, l)) {
			partial = false;
			partial_lookahead(e, l, t1 - t0);
		}
		int got = e->src.await_expert(e->src.ctx, l, &id, &sp, err);
		if (got < 0)
			return got;   /* the source released the request */
		if (got == 0)
			break;
		rc = p->routed_expert(e->pm, l, id, &sp, &st);
		taken++;
	}
	if (rc == 0)
		rc = p->routed_end(e->pm, l, e->w + off, e->mb + (size_t)t0 * e->D, &st);
	e->src.release_layer(e->src.ctx, l);
	return rc ? prov_err(e, err, rc, &st) : 0;
}

/* Layer-wide expert source: the first group's experts are requested
 * (request_layer, when the source has it) before the shared experts run,
 * so their reads overlap that compute; then the routed experts in
 * consecutive groups of positions that each fit the source (the whole
 * chunk unless its distinct experts exceed the cache), each group's
 * experts computed as they arrive when the source and the provider can
 * (routed_group_pieces), else once all of them are in.
 * e->ids / e->w hold the real routing. */
static int routed_layer(struct k3_engine *e, uint32_t l, uint32_t n, struct k3_err *err)
{
	const struct k3_provider *p = e->prov;
	struct k3_prov_status st = { 0 };
	uint32_t K = e->K, D = e->D;
	uint32_t distinct;
	uint32_t t0 = 0, t1 = group_end(e, 0, n, &distinct);
	bool requested = false;
	bool pieces = e->src.request_layer && e->src.await_expert && e->prov_pieces;
	int rc;

	if (e->src.request_layer) {
		rc = e->src.request_layer(e->src.ctx, l, e->ids, (size_t)t1 * K, err);
		if (rc)
			return rc;
		requested = true;
	}
	rc = p->mlp(e->pm, l, e->x, n, e->mb, &st);
	if (rc) {
		if (requested)
			e->src.release_layer(e->src.ctx, l);
		return prov_err(e, err, rc, &st);
	}
	for (;;) {
		size_t off = (size_t)t0 * K, cnt = (size_t)(t1 - t0) * K;
		if (pieces) {
			if (!requested &&
			    (rc = e->src.request_layer(e->src.ctx, l, e->ids + off, cnt, err)) != 0)
				return rc;
			bool partial = t0 == 0 && t1 == n && e->prov_partial && e->src.would_block &&
				       e->src.prefetch && e->next_moe != UINT32_MAX &&
				       !streamed(e, e->next_moe);
			rc = routed_group_pieces(e, l, t0, t1, distinct, partial, err);
			if (rc)
				return rc;
		} else {
			/* after request_layer the same ids only wait */
			rc = e->src.acquire_layer(e->src.ctx, l, e->ids + off, cnt, e->spans + off, err);
			if (rc)
				return rc;
			rc = p->routed_experts(e->pm, l, e->x + (size_t)t0 * D, t1 - t0, e->ids + off,
					       e->w + off, e->spans + off, e->mb + (size_t)t0 * D, &st);
			e->src.release_layer(e->src.ctx, l);
			if (rc)
				return prov_err(e, err, rc, &st);
		}
		requested = false;
		t0 = t1;
		if (t0 >= n)
			return 0;
		t1 = group_end(e, t0, n, &distinct);
	}
}

/* Computes the misses tier_miss[0..nm) of a tiered routed call from
 * spans of the source: handed out as they arrive (after request_layer),
 * all at once (acquire_layer) or one by one (acquire). */
static int tiered_misses(struct k3_engine *e, uint32_t l, size_t nm, bool requested,
			 struct k3_err *err)
{
	const struct k3_provider *p = e->prov;
	struct k3_prov_status st = { 0 };
	struct k3_prov_expert sp;
	int rc = 0;

	if (requested && e->src.await_expert) {
		uint32_t id;
		for (;;) {
			int got = e->src.await_expert(e->src.ctx, l, &id, &sp, err);
			if (got < 0)
				return got;   /* the source released the request */
			if (got == 0)
				break;
			if ((rc = p->routed_expert(e->pm, l, id, &sp, &st)) != 0)
				break;
		}
		e->src.release_layer(e->src.ctx, l);
	} else if (e->src.acquire_layer) {
		rc = e->src.acquire_layer(e->src.ctx, l, e->tier_miss, nm, e->spans, err);
		if (rc)
			return rc;
		for (size_t i = 0; i < nm && rc == 0; i++)
			rc = p->routed_expert(e->pm, l, e->tier_miss[i], &e->spans[i], &st);
		e->src.release_layer(e->src.ctx, l);
	} else {
		for (size_t i = 0; i < nm && rc == 0; i++) {
			rc = e->src.acquire(e->src.ctx, l, e->tier_miss[i], &sp, err);
			if (rc)
				return rc;
			rc = p->routed_expert(e->pm, l, e->tier_miss[i], &sp, &st);
			e->src.release(e->src.ctx, l, e->tier_miss[i]);
		}
	}
	return rc ? prov_err(e, err, rc, &st) : 0;
}

/* The routed path of MoE layer l with a provider that holds experts on its
 * device (experts_resident, docs/providers.md): the source reads only the
 * experts the provider lacks, their reads start before the shared experts
 * run, and the resident ones are computed (NULL span) while the misses are
 * read. Returns 1, having done nothing but the residency query, when the
 * misses exceed what one acquire of the source may hold (the caller then
 * takes every span from the source). */
static int routed_tiered(struct k3_engine *e, uint32_t l, uint32_t n, struct k3_err *err)
{
	const struct k3_provider *p = e->prov;
	struct k3_prov_status st = { 0 };
	size_t nd = 0, nm = 0;
	bool requested = false;
	int rc;

	stamp_next(e);
	for (size_t i = 0; i < (size_t)n * e->K; i++) {
		uint32_t id = e->ids[i];
		if (id < e->cfg.n_experts && e->stamp[id] != e->stamp_gen) {
			e->stamp[id] = e->stamp_gen;
			e->tier_ids[nd++] = id;
		}
	}
	PCALL(p->experts_resident(e->pm, l, e->tier_ids, nd, e->tier_res, &st));
	for (size_t i = 0; i < nd; i++)
		if (!e->tier_res[i])
			e->tier_miss[nm++] = e->tier_ids[i];
	if (e->src.acquire_layer && e->src.max_experts && nm > e->src.max_experts)
		return 1;
	if (nm && e->src.request_layer) {
		rc = e->src.request_layer(e->src.ctx, l, e->tier_miss, nm, err);
		if (rc)
			return rc;
		requested = true;
	}
	rc = p->mlp(e->pm, l, e->x, n, e->mb, &st);
	if (rc == 0)
		rc = p->routed_begin(e->pm, l, e->x, n, e->ids, &st);
	for (size_t i = 0; i < nd && rc == 0; i++)
		if (e->tier_res[i])
			rc = p->routed_expert(e->pm, l, e->tier_ids[i], NULL, &st);
	if (rc) {
		if (requested)
			e->src.release_layer(e->src.ctx, l);
		return prov_err(e, err, rc, &st);
	}
	if (nm && (rc = tiered_misses(e, l, nm, requested, err)) != 0)
		return rc;
	PCALL(p->routed_end(e->pm, l, e->w, e->mb, &st));
	return 0;
}

/* The routed path of MoE layer l for n positions: router, expert spans
 * from the source, shared experts, routed experts, into e->mb. */
static int moe_layer(struct k3_engine *e, uint32_t l, uint32_t n, const struct pass_part *pp,
		     uint32_t np, struct k3_err *err)
{
	const struct k3_provider *p = e->prov;
	struct k3_prov_status st = { 0 };
	uint32_t K = e->K, mi = (uint32_t)e->moe_index[l];
	int rc;

	PCALL(p->router(e->pm, l, e->x, n, e->ids, e->w, &st));
	if (e->prov_resident) {
		rc = routed_tiered(e, l, n, err);
		if (rc < 0)
			return rc;
		if (rc == 0)
			goto routes;
	}
	if (e->src.acquire_layer) {
		rc = routed_layer(e, l, n, err);
		if (rc)
			return rc;
		goto routes;
	}
	size_t got = 0;
	for (; got < (size_t)n * K; got++) {
		rc = e->src.acquire(e->src.ctx, l, e->ids[got], &e->spans[got], err);
		if (rc)
			break;
	}
	if (!rc) {
		rc = p->mlp(e->pm, l, e->x, n, e->mb, &st);
		if (!rc)
			rc = p->routed_experts(e->pm, l, e->x, n, e->ids, e->w, e->spans, e->mb, &st);
		if (rc)
			prov_err(e, err, rc, &st);
	}
	for (size_t i = 0; i < got; i++)
		e->src.release(e->src.ctx, l, e->ids[i]);
	if (rc)
		return rc;
routes:
	for (uint32_t i = 0; i < np; i++) {
		const struct k3_engine_out *out = pp[i].out;
		if (!out || (!out->route_ids && !out->route_weights))
			continue;
		for (uint32_t t = 0; t < pp[i].n; t++) {
			size_t dst = ((size_t)(pp[i].pos0 + t) * e->n_moe + mi) * K;
			size_t src = (size_t)(pp[i].row0 + t) * K;
			if (out->route_ids)
				memcpy(out->route_ids + dst, e->ids + src, K * sizeof(uint32_t));
			if (out->route_weights)
				memcpy(out->route_weights + dst, e->w + src, K * sizeof(float));
		}
	}
	return 0;
}

/* ---- the streamed spine (engine.h, struct k3_spine_source) ---- */

static bool head_streamed(const struct k3_engine *e)
{
	return e->has_spine && !e->spine.head_resident;
}

/* Unbinds and releases the streamed layer bound now, if any. */
static void spine_unbind(struct k3_engine *e)
{
	struct k3_prov_status st = { 0 };

	if (e->bound == UINT32_MAX)
		return;
	(void)e->prov->bind_layer(e->pm, e->bound, NULL, &st);   /* unbinding cannot fail */
	e->spine.release_layer(e->spine.ctx, e->bound);
	e->bound = UINT32_MAX;
}

/* Makes layer l readable for the provider: acquires and binds it when it
 * streams (one streamed layer is bound at a time), nothing otherwise. */
static int spine_bind(struct k3_engine *e, uint32_t l, struct k3_err *err)
{
	struct k3_prov_status st = { 0 };
	struct k3_prov_layer_weights w;
	int rc;

	if (!streamed(e, l) || e->bound == l)
		return 0;
	spine_unbind(e);
	memset(&w, 0, sizeof(w));
	rc = e->spine.acquire_layer(e->spine.ctx, l, &w, err);
	if (rc)
		return rc;
	rc = e->prov->bind_layer(e->pm, l, &w, &st);
	if (rc) {
		e->spine.release_layer(e->spine.ctx, l);
		return prov_err(e, err, rc, &st);
	}
	e->bound = l;
	return 0;
}

static void spine_unbind_head(struct k3_engine *e)
{
	struct k3_prov_status st = { 0 };

	if (!e->head_bound)
		return;
	(void)e->prov->bind_head(e->pm, NULL, &st);
	e->spine.release_head(e->spine.ctx);
	e->head_bound = false;
}

static int spine_bind_head(struct k3_engine *e, struct k3_err *err)
{
	struct k3_prov_status st = { 0 };
	struct k3_prov_weights w;
	int rc;

	if (!head_streamed(e) || e->head_bound)
		return 0;
	memset(&w, 0, sizeof(w));
	w.struct_size = sizeof(w);
	w.n_layers = e->cfg.n_layers;
	w.layers = e->lw;
	rc = e->spine.acquire_head(e->spine.ctx, &w, err);
	if (rc)
		return rc;
	rc = e->prov->bind_head(e->pm, &w, &st);
	if (rc) {
		e->spine.release_head(e->spine.ctx);
		return prov_err(e, err, rc, &st);
	}
	e->head_bound = true;
	return 0;
}

/* pool[0] := the embedding of the chunk's tokens: from the mmapped table,
 * or (spine source) from its rows gathered by the source. */
static int embed_chunk(struct k3_engine *e, const int32_t *ids, uint32_t n, struct k3_err *err)
{
	const struct k3_provider *p = e->prov;
	struct k3_prov_status st = { 0 };
	int rc;

	if (!e->has_spine)
		PCALL(p->embed(e->pm, ids, n, e->pool[0], &st));
	else if ((rc = e->spine.embed_rows(e->spine.ctx, ids, n, e->rows, err)) != 0)
		return rc;
	else
		PCALL(p->embed_rows(e->pm, e->rows, n, e->pool[0], &st));
	return 0;
}

/* The verification pass's KDA layer l without the provider's verify op:
 * the state before the pass is kept (kda_state_copy) with the layer's
 * inputs, then the real state advances over all n positions; commit puts
 * the snapshot back and reruns the accepted prefix (k3_engine_commit). */
static int verify_kda_snapshot(struct k3_engine *e, struct k3_engine_seq *s, uint32_t l,
			       const float *hin, uint32_t n, float *P, uint32_t flags,
			       struct k3_prov_status *st)
{
	int rc = e->prov->kda_state_copy(e->vsnap[l], s->kda[l], st);
	if (rc)
		return rc;
	e->v_layers = l + 1;         /* from here on, l's snapshot is the one to restore */
	memcpy(e->vh[l], hin, (size_t)n * e->D * sizeof(float));
	return e->prov->kda(e->pm, l, hin, n, s->kda[l], P, flags, st);
}

/* Target-row capture after layer l (k3_engine_set_taps): the residual
 * stream as a plain residual model would carry it, B[0] + ... + B[nB-1]
 * + P (the embedding, the finished AttnRes blocks and the running sum;
 * vLLM's "prefix_sum + hidden_states", docs/text-and-draft.md §4.4), summed
 * in that order by the provider into taps[pos0 + t][tap][D]. */
static int capture_tap(struct k3_engine *e, uint32_t l, uint32_t nB, const struct pass_part *pp,
		       struct k3_prov_status *st)
{
	uint32_t D = e->D, ti = (uint32_t)e->tap_index[l];

	for (uint32_t t = 0; t < pp->n; t++) {
		float *dst = pp->taps + ((size_t)(pp->pos0 + t) * e->n_taps + ti) * D;
		size_t row = (size_t)(pp->row0 + t) * D;
		memcpy(dst, e->pool[0] + row, D * sizeof(float));
		for (uint32_t j = 1; j <= nB; j++) {
			int rc = e->prov->add(e->pm, dst, e->pool[j] + row, D, st);
			if (rc)
				return rc;
		}
	}
	return 0;
}

/* Whether part pp wants logits from this pass. */
static bool part_logits(const struct pass_part *pp)
{
	const struct k3_engine_out *out = pp->out;

	return out && out->logits && (out->logits_mode == K3_ENGINE_LOGITS_ALL ||
				      (out->logits_mode == K3_ENGINE_LOGITS_LAST && pp->last));
}

/* Output AttnRes, final norm and lm_head (spec §10) for every part that
 * wants logits: ALL parts straight into their buffers; the last rows of
 * the LAST parts gathered into e->z and run as one product (the head read
 * once per pass), then copied out (one part: straight into its buffer). */
static int pass_logits(struct k3_engine *e, uint32_t nB, const struct pass_part *pp, uint32_t np,
		       struct k3_err *err)
{
	const struct k3_provider *p = e->prov;
	struct k3_prov_status st = { 0 };
	uint32_t D = e->D, V = e->V, m = 0, only = 0;
	int rc;

	for (uint32_t i = 0; i < np; i++) {
		if (!part_logits(&pp[i]) || pp[i].out->logits_mode != K3_ENGINE_LOGITS_ALL)
			continue;
		for (uint32_t j = 0; j <= nB; j++)
			e->cands[j] = e->pool[j] + (size_t)pp[i].row0 * D;
		PCALL(p->attnres_mix(e->pm, K3_PROV_MIX_OUTPUT, 0, e->cands, nB + 1, pp[i].n, e->z, &st));
		PCALL(p->logits(e->pm, e->z, pp[i].n, pp[i].out->logits + (size_t)pp[i].pos0 * V, &st));
	}
	for (uint32_t i = 0; i < np; i++) {
		if (!part_logits(&pp[i]) || pp[i].out->logits_mode != K3_ENGINE_LOGITS_LAST)
			continue;
		for (uint32_t j = 0; j <= nB; j++)
			e->cands[j] = e->pool[j] + (size_t)(pp[i].row0 + pp[i].n - 1) * D;
		PCALL(p->attnres_mix(e->pm, K3_PROV_MIX_OUTPUT, 0, e->cands, nB + 1, 1,
				     e->z + (size_t)m * D, &st));
		only = i;
		m++;
	}
	if (m == 1)
		PCALL(p->logits(e->pm, e->z, 1, pp[only].out->logits, &st));
	if (m <= 1)
		return 0;
	PCALL(p->logits(e->pm, e->z, m, e->blog, &st));
	m = 0;
	for (uint32_t i = 0; i < np; i++)
		if (part_logits(&pp[i]) && pp[i].out->logits_mode == K3_ENGINE_LOGITS_LAST)
			memcpy(pp[i].out->logits, e->blog + (size_t)m++ * V, V * sizeof(float));
	return 0;
}

/* The attention sub-layer l of every part, each over its own rows and its
 * own state: P := a or P + a (flags). verify = a verification pass (one
 * part). */
static int pass_attention(struct k3_engine *e, uint32_t l, const float *hin, float *P,
			  uint32_t flags, const struct pass_part *pp, uint32_t np, bool verify,
			  struct k3_err *err)
{
	const struct k3_provider *p = e->prov;
	struct k3_prov_status st = { 0 };
	int rc;

	for (uint32_t i = 0; i < np; i++) {
		struct k3_engine_seq *s = pp[i].s;
		size_t off = (size_t)pp[i].row0 * e->D;
		uint32_t n = pp[i].n;

		if (e->cfg.attn_kind[l] == K3_PROV_ATTN_KDA) {
			if (verify && e->prov_verify)
				PCALL(p->kda_verify(e->pm, l, hin + off, n, s->kda[l], e->vrec[l],
						    P + off, flags, &st));
			else if (verify)
				PCALL(verify_kda_snapshot(e, s, l, hin + off, n, P + off, flags, &st));
			else
				PCALL(p->kda(e->pm, l, hin + off, n, s->kda[l], P + off, flags, &st));
		} else {
			PCALL(p->mla(e->pm, l, hin + off, n, s->mla[l], P + off, flags, &st));
		}
	}
	return 0;
}

/*
 * One pass of n rows: the parts' rows end to end (ids[n]), each part one
 * sequence's next positions (struct pass_part). Everything but attention
 * runs over all n rows at once: a streamed layer is bound once, each
 * routed expert acquired once for the union of the rows (the kernels are
 * row-invariant, so a row's result does not depend on its neighbours).
 * verify = a verification pass (one part; KDA states are not advanced,
 * see k3_engine_verify). With a spine source, each streamed layer is
 * bound right before its ops and released right after them (the next
 * one, when the router lookahead needs its weights, right after that),
 * the next one's read having been started when this one started
 * (run_chunk releases what is still bound when a layer fails).
 */
static int run_chunk_layers(struct k3_engine *e, const int32_t *ids, uint32_t n,
			    const struct pass_part *pp, uint32_t np, bool verify,
			    struct k3_err *err)
{
	const struct k3_provider *p = e->prov;
	struct k3_prov_status st = { 0 };
	uint32_t S = e->cfg.attn_res_block, nB = 0, L = e->cfg.n_layers;
	size_t nd = (size_t)n * e->D;
	bool logits = false;
	int rc;

	for (uint32_t i = 0; i < np; i++)
		logits |= part_logits(&pp[i]);
	if (e->has_spine)
		e->spine.begin_pass(e->spine.ctx, logits);
	rc = embed_chunk(e, ids, n, err);
	if (rc)
		return rc;
	/* A streamed first MoE layer is not readable yet: no guess for it. */
	if (e->src.prefetch && e->n_moe && !streamed(e, e->moe_layers[0]))
		lookahead(e, e->moe_layers[0], 0, n, NULL, e->K);
	for (uint32_t l = 0; l < L; l++) {
		const float *hin = e->pool[0];
		/* Cancellation is honoured between layers: a K3 layer step is the
		 * longest the caller waits (the sequences are poisoned after this). */
		if (e->cancel && atomic_load(e->cancel))
			return k3_err_set(err, -ECANCELED, "cancelled before layer %u", l);
		if (streamed(e, l + 1))
			e->spine.prefetch_layer(e->spine.ctx, l + 1);
		else if (l + 1 == L && logits && head_streamed(e))
			e->spine.prefetch_layer(e->spine.ctx, L);
		if ((rc = spine_bind(e, l, err)) != 0)
			return rc;
		/* 1) attention input: AR over B and P, or the embedding at l = 0 */
		if (nB > 0) {
			for (uint32_t j = 0; j <= nB; j++)
				e->cands[j] = e->pool[j];
			PCALL(p->attnres_mix(e->pm, K3_PROV_MIX_ATTN, l, e->cands, nB + 1, n, e->h, &st));
			hin = e->h;
		}
		/* 2) block start: snapshot P (it becomes B[nB]) and restart P */
		uint32_t flags = K3_PROV_OUT_ACCUMULATE;
		if (l % S == 0) {
			nB++;
			flags = 0;
		}
		float *P = e->pool[nB];
		/* 3) attention sub-layer, per sequence */
		if ((rc = pass_attention(e, l, hin, P, flags, pp, np, verify, err)) != 0)
			return rc;
		/* 4) FFN input: AR over the new B and P */
		for (uint32_t j = 0; j <= nB; j++)
			e->cands[j] = e->pool[j];
		PCALL(p->attnres_mix(e->pm, K3_PROV_MIX_MLP, l, e->cands, nB + 1, n, e->h, &st));
		PCALL(p->ffn_norm(e->pm, l, e->h, n, e->x, &st));
		if (e->cfg.ffn_kind[l] == K3_PROV_FFN_MOE) {
			e->cur_nB = nB;
			e->next_moe = (uint32_t)e->moe_index[l] + 1 < e->n_moe ?
				      e->moe_layers[e->moe_index[l] + 1] : UINT32_MAX;
			rc = moe_layer(e, l, n, pp, np, err);
			if (rc)
				return rc;
		} else {
			PCALL(p->mlp(e->pm, l, e->x, n, e->mb, &st));
		}
		PCALL(p->add(e->pm, P, e->mb, nd, &st));
		for (uint32_t i = 0; i < np && e->tap_index[l] >= 0; i++)
			if (pp[i].taps)
				PCALL(capture_tap(e, l, nB, &pp[i], &st));
		if (streamed(e, l))
			spine_unbind(e);
		if (e->src.prefetch && e->cfg.ffn_kind[l] == K3_PROV_FFN_MOE &&
		    e->next_moe != UINT32_MAX) {
			/* The lookahead reads the next MoE layer's weights: bound
			 * now when it is the next layer anyway, skipped when a
			 * streamed one lies further ahead. */
			if (e->next_moe == l + 1 && (rc = spine_bind(e, l + 1, err)) != 0)
				return rc;
			if (!streamed(e, e->next_moe) || e->bound == e->next_moe)
				lookahead(e, e->next_moe, nB, n, NULL, e->K);
		}
	}
	if (!logits)
		return 0;
	if ((rc = spine_bind_head(e, err)) != 0)
		return rc;
	return pass_logits(e, nB, pp, np, err);
}

static int run_chunk(struct k3_engine *e, const int32_t *ids, uint32_t n,
		     const struct pass_part *pp, uint32_t np, bool verify, struct k3_err *err)
{
	int rc = run_chunk_layers(e, ids, n, pp, np, verify, err);

	spine_unbind(e);
	spine_unbind_head(e);
	return rc;
}

/* What forward and verify check before they touch s. */
static int check_call(struct k3_engine *e, const struct k3_engine_seq *s, const int32_t *ids,
		      uint32_t T, struct k3_err *err)
{
	if (s->e != e)
		return k3_err_set(err, -EINVAL, "sequence belongs to another engine");
	if (s->poisoned)
		return k3_err_set(err, -EINVAL, "sequence failed earlier; start a new one");
	if (e->pending == s)
		return k3_err_set(err, -EBUSY, "sequence has a verification pending; commit it first");
	if (T == 0)
		return k3_err_set(err, -EINVAL, "forward of zero tokens");
	if ((uint64_t)s->len + T > UINT32_MAX / 2)
		return k3_err_set(err, -E2BIG, "sequence too long");
	for (uint32_t t = 0; t < T; t++)
		if (ids[t] < 0 || (uint32_t)ids[t] >= e->V)
			return k3_err_set(err, -EINVAL, "token id %d at position %u not in 0..%u",
					  ids[t], t, e->V - 1);
	return 0;
}

int k3_engine_forward(struct k3_engine *e, struct k3_engine_seq *s,
		      const int32_t *ids, uint32_t T, const struct k3_engine_out *out,
		      struct k3_err *err)
{
	int rc0 = check_call(e, s, ids, T, err);
	if (rc0)
		return rc0;
	for (uint32_t done = 0; done < T;) {
		uint32_t n = T - done < e->chunk ? T - done : e->chunk;
		struct pass_part pp = { s, 0, n, done, done + n == T, out, e->tap_out };
		int rc = run_chunk(e, ids + done, n, &pp, 1, false, err);
		if (rc) {
			s->poisoned = true;
			return rc;
		}
		done += n;
		s->len += n;
	}
	return 0;
}

int k3_engine_forward_batch(struct k3_engine *e, const struct k3_engine_part *parts,
			    uint32_t n_parts, struct k3_err *err)
{
	struct pass_part pp[K3_ENGINE_MAX_PARTS];
	uint32_t n = 0, n_last = 0;

	if (n_parts == 0 || n_parts > K3_ENGINE_MAX_PARTS)
		return k3_err_set(err, -EINVAL, "a batched pass holds 1..%u parts, not %u",
				  (unsigned)K3_ENGINE_MAX_PARTS, n_parts);
	for (uint32_t i = 0; i < n_parts; i++) {
		const struct k3_engine_part *q = &parts[i];
		int rc = check_call(e, q->seq, q->ids, q->n, err);
		if (rc)
			return rc;
		for (uint32_t k = 0; k < i; k++)
			if (parts[k].seq == q->seq)
				return k3_err_set(err, -EINVAL, "one sequence in parts %u and %u", k, i);
		if (q->n > e->chunk - n)
			return k3_err_set(err, -E2BIG, "a batched pass of more than %u positions "
					  "(the engine's pass)", e->chunk);
		pp[i] = (struct pass_part){ q->seq, n, q->n, 0, true, q->out, q->taps };
		memcpy(e->pass_ids + n, q->ids, q->n * sizeof(*q->ids));
		n += q->n;
		n_last += part_logits(&pp[i]) && q->out->logits_mode == K3_ENGINE_LOGITS_LAST;
	}
	if (n_last > 1 && n_last > e->blog_rows) {
		float *b = realloc(e->blog, (size_t)n_last * e->V * sizeof(float));
		if (!b)
			return k3_err_set(err, -ENOMEM, "out of memory for %u rows of logits", n_last);
		e->blog = b;
		e->blog_rows = n_last;
	}
	int rc = run_chunk(e, e->pass_ids, n, pp, n_parts, false, err);
	for (uint32_t i = 0; i < n_parts; i++) {
		if (rc)
			parts[i].seq->poisoned = true;
		else
			parts[i].seq->len += parts[i].n;
	}
	return rc;
}

static uint64_t max_u64(uint64_t a, uint64_t b)
{
	return a > b ? a : b;
}

uint64_t k3_engine_scratch_bytes(const struct k3_model_config *mc, uint32_t T)
{
	uint64_t D = mc->hidden_size, K = mc->num_experts_per_token ? mc->num_experts_per_token : 1;
	uint64_t S = mc->attn_res_block_size ? mc->attn_res_block_size : 1;
	uint64_t blocks = (mc->num_hidden_layers + S - 1) / S;
	uint64_t H = mc->num_attention_heads, qhd = mc->qk_nope_head_dim + mc->qk_rope_head_dim;
	/* the cpu provider's widest operand (cpu_open) */
	uint64_t wide = D;
	uint64_t w[] = { (uint64_t)mc->kda_num_heads * mc->kda_head_dim, H * qhd,
			 H * mc->v_head_dim, H * (mc->qk_nope_head_dim + mc->v_head_dim),
			 mc->intermediate_size, mc->shared_width, mc->q_lora_rank,
			 (uint64_t)mc->kv_lora_rank + mc->qk_rope_head_dim,
			 mc->routed_expert_hidden_size, mc->moe_intermediate_size, mc->num_experts };
	for (size_t i = 0; i < sizeof(w) / sizeof(w[0]); i++)
		wide = max_u64(wide, w[i]);
	uint64_t ew = max_u64(max_u64(mc->routed_expert_hidden_size, mc->moe_intermediate_size), 1);
	/* engine: the AttnRes pool, h, x, mb, z, part and the embedding rows;
	 * ids, weights, spans and the lookahead's ids, weights, guesses, ranks */
	uint64_t engine = (blocks + 1 + 6) * D * 4 + K * (4 + 4 + sizeof(struct k3_prov_expert) + 16);
	/* provider: sx, the eight wide rows s[], and per routed slot its four
	 * expert rows, its row index, three jobs and a flag (cpu_open) */
	uint64_t prov = D * 4 + 8 * wide * 4 + K * (4 * ew * 4 + 4 + 3 * 64 + 1);
	return (engine + prov) * T;
}

uint32_t k3_engine_chunk_for(const struct k3_model_config *mc, uint64_t scratch_bytes,
			     uint32_t lo, uint32_t hi)
{
	uint64_t per = k3_engine_scratch_bytes(mc, 1), t = per ? scratch_bytes / per : hi;

	return t < lo ? lo : t > hi ? hi : (uint32_t)t;
}

/* ---------------------------------------------------------------- verify / commit */

/* Verification buffers for T positions: the provider's KDA records, or
 * (without them) a state snapshot and an input buffer per KDA layer.
 * Allocated on the first pass that needs them, then kept. */
static int verify_reserve(struct k3_engine *e, uint32_t T, struct k3_err *err)
{
	const struct k3_provider *p = e->prov;
	struct k3_prov_status st = { 0 };
	uint32_t L = e->cfg.n_layers;
	int rc = 0;

	if (T <= e->vcap)
		return 0;
	if (e->vrec) {             /* records only grow: make new ones */
		for (uint32_t l = 0; l < L; l++) {
			p->kda_record_free(e->vrec[l]);
			e->vrec[l] = NULL;
		}
	}
	if (e->vh)
		for (uint32_t l = 0; l < L; l++) {
			free(e->vh[l]);
			e->vh[l] = NULL;
		}
	e->vcap = 0;
	if (e->prov_verify) {
		if (!e->vrec && !(e->vrec = calloc(L, sizeof(*e->vrec))))
			return k3_err_set(err, -ENOMEM, "out of memory");
		for (uint32_t l = 0; !rc && l < L; l++)
			if (e->cfg.attn_kind[l] == K3_PROV_ATTN_KDA)
				rc = p->kda_record_new(e->pm, l, T, &e->vrec[l], &st);
	} else {
		if ((!e->vsnap && !(e->vsnap = calloc(L, sizeof(*e->vsnap)))) ||
		    (!e->vh && !(e->vh = calloc(L, sizeof(*e->vh)))))
			return k3_err_set(err, -ENOMEM, "out of memory");
		for (uint32_t l = 0; !rc && l < L; l++) {
			if (e->cfg.attn_kind[l] != K3_PROV_ATTN_KDA)
				continue;
			if (!e->vsnap[l])
				rc = p->kda_state_new(e->pm, l, &e->vsnap[l], &st);
			if (!rc && !(e->vh[l] = malloc((size_t)T * e->D * sizeof(float))))
				rc = k3_err_set(err, -ENOMEM, "out of memory for a %u-position verification", T);
		}
	}
	if (rc)
		return err && err->code ? rc : prov_err(e, err, rc, &st);
	e->vcap = T;
	return 0;
}

/* Puts s back where the pending pass found it: MLA caches cut to s->len,
 * and without the provider's verify op the KDA snapshots of the first
 * `layers` layers restored. */
static int verify_discard(struct k3_engine *e, struct k3_engine_seq *s, uint32_t layers,
			  struct k3_err *err)
{
	struct k3_prov_status st = { 0 };

	for (uint32_t l = 0; l < e->cfg.n_layers; l++) {
		if (s->mla[l]) {
			e->prov->mla_cache_truncate(s->mla[l], s->len);
		} else if (!e->prov_verify && l < layers) {
			int rc = e->prov->kda_state_copy(s->kda[l], e->vsnap[l], &st);
			if (rc)
				return prov_err(e, err, rc, &st);
		}
	}
	return 0;
}

int k3_engine_verify(struct k3_engine *e, struct k3_engine_seq *s, const int32_t *ids,
		     uint32_t T, const struct k3_engine_out *out, struct k3_err *err)
{
	int rc = check_call(e, s, ids, T, err);
	if (rc)
		return rc;
	if (e->pending)
		return k3_err_set(err, -EBUSY, "another sequence has a verification pending");
	if (T > e->chunk)
		return k3_err_set(err, -EINVAL, "verification of %u positions exceeds the engine's "
				  "%u-position pass", T, e->chunk);
	rc = verify_reserve(e, T, err);
	if (rc)
		return rc;
	e->v_layers = 0;
	struct pass_part pp = { s, 0, T, 0, true, out, e->tap_out };
	rc = run_chunk(e, ids, T, &pp, 1, true, err);
	if (rc) {
		/* Nothing was published: undo the provisional rows (and, on the
		 * snapshot path, the states advanced so far); s stays usable. */
		struct k3_err e2 = { 0 };
		if (verify_discard(e, s, e->v_layers, &e2))
			s->poisoned = true;
		return rc;
	}
	e->pending = s;
	e->pending_T = T;
	return 0;
}

int k3_engine_commit(struct k3_engine *e, struct k3_engine_seq *s, uint32_t m,
		     struct k3_err *err)
{
	const struct k3_provider *p = e->prov;
	struct k3_prov_status st = { 0 };
	int rc = 0;

	if (e->pending != s || s->e != e)
		return k3_err_set(err, -EINVAL, "no verification pending on this sequence");
	if (m > e->pending_T)
		return k3_err_set(err, -EINVAL, "commit of %u positions; the verification ran %u",
				  m, e->pending_T);
	e->pending = NULL;
	for (uint32_t l = 0; !rc && l < e->cfg.n_layers; l++) {
		if (s->mla[l]) {
			p->mla_cache_truncate(s->mla[l], s->len + m);
		} else if (e->prov_verify) {
			rc = p->kda_replay(e->pm, l, s->kda[l], e->vrec[l], m, &st);
		} else if (m < e->pending_T) {
			/* Snapshot path: back to the state before the pass, then
			 * the accepted prefix again through the same op (a
			 * streamed layer's weights are read again for it). */
			rc = p->kda_state_copy(s->kda[l], e->vsnap[l], &st);
			if (!rc && m) {
				int brc = spine_bind(e, l, err);
				if (brc) {
					s->poisoned = true;
					return brc;
				}
				rc = p->kda(e->pm, l, e->vh[l], m, s->kda[l], e->z, 0, &st);
			}
		}
	}
	spine_unbind(e);
	if (rc) {
		s->poisoned = true;
		return prov_err(e, err, rc, &st);
	}
	s->len += m;
	return 0;
}

bool k3_engine_verify_pending(const struct k3_engine *e, const struct k3_engine_seq *s)
{
	return e->pending == s;
}

size_t k3_engine_verify_record_bytes(const struct k3_engine *e, uint32_t T)
{
	const struct k3_prov_config *c = &e->cfg;
	uint32_t n_kda = 0;

	for (uint32_t l = 0; l < c->n_layers; l++)
		n_kda += c->attn_kind[l] == K3_PROV_ATTN_KDA;
	size_t P = (size_t)c->kda_heads * c->kda_head_dim;
	if (e->prov_verify)
		return (size_t)T * n_kda * (4 * P + c->kda_heads) * sizeof(float);
	size_t state = (3 * (size_t)(c->conv_kernel - 1) * P + (size_t)c->kda_heads *
			c->kda_head_dim * c->kda_head_dim) * sizeof(float);
	return n_kda * (state + (size_t)T * e->D * sizeof(float));
}

int k3_engine_set_taps(struct k3_engine *e, const uint32_t *layers, uint32_t n,
		       struct k3_err *err)
{
	if (n > K3_ENGINE_MAX_TAPS)
		return k3_err_set(err, -EINVAL, "%u tap layers; at most %d", n, K3_ENGINE_MAX_TAPS);
	for (uint32_t i = 0; i < n; i++) {
		if (layers[i] >= e->cfg.n_layers)
			return k3_err_set(err, -EINVAL, "tap layer %u: the model has %u layers",
					  layers[i], e->cfg.n_layers);
		if (i && layers[i] <= layers[i - 1])
			return k3_err_set(err, -EINVAL, "tap layers must ascend (%u after %u)",
					  layers[i], layers[i - 1]);
	}
	for (uint32_t l = 0; l < K3_PROV_MAX_LAYERS; l++)
		e->tap_index[l] = -1;
	for (uint32_t i = 0; i < n; i++)
		e->tap_index[layers[i]] = (int32_t)i;
	e->n_taps = n;
	return 0;
}

void k3_engine_set_tap_out(struct k3_engine *e, float *dst)
{
	e->tap_out = dst;
}

uint32_t k3_engine_n_taps(const struct k3_engine *e) { return e->n_taps; }
uint32_t k3_engine_hidden(const struct k3_engine *e) { return e->D; }
uint32_t k3_engine_n_layers(const struct k3_engine *e) { return e->cfg.n_layers; }
uint32_t k3_engine_max_chunk(const struct k3_engine *e) { return e->chunk; }
const struct k3_model *k3_engine_model(const struct k3_engine *e) { return e->model; }

int k3_engine_seq_export(struct k3_engine *e, const struct k3_engine_seq *s, uint32_t layer,
			 void *dst, size_t cap, size_t *n, struct k3_err *err)
{
	struct k3_prov_status st = { 0 };
	int rc;

	if (!e->prov_export)
		return k3_err_set(err, -ENOTSUP, "provider '%s' cannot export states", e->prov->name);
	if (layer >= e->cfg.n_layers || s->e != e)
		return k3_err_set(err, -EINVAL, "layer %u out of range", layer);
	rc = s->kda[layer] ? e->prov->kda_state_export(s->kda[layer], dst, cap, n, &st)
			   : e->prov->mla_cache_export(s->mla[layer], dst, cap, n, &st);
	return rc ? prov_err(e, err, rc, &st) : 0;
}

uint32_t k3_engine_argmax(const float *logits, uint32_t n)
{
	uint32_t best = 0;
	for (uint32_t i = 1; i < n; i++)
		if (logits[i] > logits[best])
			best = i;
	return best;
}


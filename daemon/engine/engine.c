/*
 * engine.c - the K3 layer program over a provider (see engine.h).
 *
 * Residual stream bookkeeping (spec §4.3): `pool` holds n_blocks + 1
 * buffers of [chunk][D]. pool[0..nB-1] are the block snapshots B, pool[nB]
 * is the running sum P; a block start bumps nB, which both snapshots the
 * old P and starts a fresh one, with no copy. AttnRes candidates are
 * therefore always the contiguous prefix pool[0..nB].
 */
#include "engine/engine_internal.h"

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/carve.h"
#include "model/model.h"
#include "provider_registry.h"

/* The model's I8 tensors go to the provider as they are mapped: both
 * headers must describe one layout (q, zero gap to 64 bytes, scales). */
_Static_assert(K3_MODEL_I8_SCALE_OFFSET(3, 5) == K3_PROV_I8_SCALE_OFFSET(3, 5) &&
	       K3_MODEL_I8_SCALE_OFFSET(7168, 12288) == K3_PROV_I8_SCALE_OFFSET(7168, 12288) &&
	       K3_MODEL_I8_BYTES(96, 7171) == K3_PROV_I8_BYTES(96, 7171),
	       "model.h and k3_provider.h disagree on the I8 layout");

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

/* The chunk scratch, every buffer the engine sizes at open for its
 * lifetime: rows of [chunk][D] floats, [chunk][K] routing arrays, the
 * pool's pointers and rows. One carved block (base/carve.h): calloc'd, so
 * the rows of a long chunk stay untouched pages until a pass writes them,
 * as separate mallocs were; e->scratch owns it all. */
static int alloc_scratch(struct k3_engine *e)
{
	size_t row = (size_t)e->chunk * e->D;   /* floats of one [chunk][D] row block */
	size_t nk = (size_t)e->chunk * (e->K ? e->K : 1);
	float *pool_rows = NULL, *rows = NULL;
	struct k3_carve k = { 0 };
	while (k3_carve_next(&k)) {
		K3_CARVE(&k, pool_rows, (e->n_blocks + 1) * row);
		K3_CARVE(&k, e->pool, e->n_blocks + 1);
		K3_CARVE(&k, e->cands, e->n_blocks + 1);
		K3_CARVE(&k, e->h, row);
		K3_CARVE(&k, e->x, row);
		K3_CARVE(&k, e->mb, row);
		K3_CARVE(&k, e->z, row);
		K3_CARVE(&k, e->part, row);
		/* embeddings come from the mapped table without a spine loader */
		K3_CARVE(&k, rows, e->has_spine ? row : 0);
		K3_CARVE(&k, e->pass_ids, e->chunk);
		K3_CARVE(&k, e->ids, nk);
		K3_CARVE(&k, e->w, nk);
		K3_CARVE(&k, e->spans, nk);
		K3_CARVE(&k, e->stamp, e->cfg.n_experts ? e->cfg.n_experts : 1);
		K3_CARVE(&k, e->pids, nk);
		K3_CARVE(&k, e->pw, nk);
		K3_CARVE(&k, e->guess, nk);
		K3_CARVE(&k, e->guess_rank, nk);
		K3_CARVE(&k, e->tier_ids, nk);
		K3_CARVE(&k, e->tier_miss, nk);
		K3_CARVE(&k, e->tier_res, nk);
	}
	if (!(e->scratch = k.block))
		return -ENOMEM;
	for (uint32_t i = 0; i <= e->n_blocks; i++)
		e->pool[i] = pool_rows + (size_t)i * row;
	e->rows = e->has_spine ? rows : NULL;
	return 0;
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
	free(e->scratch);
	free(e->blog);
	engine_verify_free(e);
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

	rc = alloc_scratch(e);
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


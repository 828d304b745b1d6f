/*
 * draft_dspark.c - the DSpark draft: loader and forward (see
 * draft_dspark.h; the math is docs/text-and-draft.md §4.4-4.6).
 *
 * Per draft layer the cache holds one row per context position: the
 * kv_lora normalized latent and the qk_rope key lane after RoPE (the same
 * absorbed MLA form as K3's, docs/model.md §6.5). A proposal writes its
 * block's rows after the context rows, attends over all of them (the block
 * non-causally), and drops them again: only rows the target accepted
 * become context (accept()). The forward runs on the calling thread over
 * the kernels; it proposes, it is not batch-invariant, and it need not be.
 */
#include "draft/draft_dspark.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/carve.h"
#include "base/file.h"
#include "base/path.h"
#include "k3_kernels.h"
#include "model/model.h"

enum { DSPARK_MAX_LAYERS = 64, DSPARK_MAX_BLOCK = 32 };

/* ---------------------------------------------------------------- config */

/* The field `key` of o as an integer in [lo, hi]. */
static int cfg_u32(json_t *o, const char *key, uint32_t lo, uint32_t hi, uint32_t *out,
		   struct k3_err *err)
{
	json_t *v = json_object_get(o, key);
	if (!v)
		return k3_err_set(err, -EINVAL, "config.json: '%s' is missing", key);
	if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
		return k3_err_set(err, -EINVAL, "config.json: '%s' must be an integer in [%u, %u]",
				  key, lo, hi);
	*out = (uint32_t)json_integer_value(v);
	return 0;
}

static int cfg_num(json_t *o, const char *key, double lo, double hi, double *out,
		   struct k3_err *err)
{
	json_t *v = json_object_get(o, key);
	if (!v)
		return k3_err_set(err, -EINVAL, "config.json: '%s' is missing", key);
	if (!json_is_number(v) || !(json_number_value(v) >= lo && json_number_value(v) <= hi))
		return k3_err_set(err, -EINVAL, "config.json: '%s' must be a number in [%g, %g]",
				  key, lo, hi);
	*out = json_number_value(v);
	return 0;
}

/* An optional boolean (absent: dflt). */
static int cfg_bool(json_t *o, const char *key, bool dflt, bool *out, struct k3_err *err)
{
	json_t *v = json_object_get(o, key);
	if (!v) {
		*out = dflt;
		return 0;
	}
	if (!json_is_boolean(v))
		return k3_err_set(err, -EINVAL, "config.json: '%s' must be true or false", key);
	*out = json_is_true(v);
	return 0;
}

/* RoPE: rope_parameters (the pinned revision's key) or rope_scaling. */
static int cfg_rope(json_t *o, struct k3_dspark_config *c, struct k3_err *err)
{
	int r = cfg_num(o, "rope_theta", 1.0, 1e12, &c->rope_theta, err);
	json_t *rp = json_object_get(o, "rope_parameters");
	const char *name = "rope_parameters";
	if (r)
		return r;
	if (!rp || json_is_null(rp)) {
		rp = json_object_get(o, "rope_scaling");
		name = "rope_scaling";
	}
	if (!rp || json_is_null(rp))
		return 0;            /* plain RoPE */
	if (!json_is_object(rp))
		return k3_err_set(err, -EINVAL, "config.json: '%s' must be an object", name);
	json_t *t = json_object_get(rp, "rope_type");
	if (!t)
		t = json_object_get(rp, "type");
	if (!json_is_string(t))
		return k3_err_set(err, -EINVAL, "config.json: '%s' has no rope_type", name);
	if (strcmp(json_string_value(t), "default") == 0)
		return 0;
	if (strcmp(json_string_value(t), "yarn") != 0)
		return k3_err_set(err, -EINVAL, "config.json: %s.rope_type '%s' is not supported "
				  "(yarn or default)", name, json_string_value(t));
	c->yarn = true;
	double orig;
	if ((r = cfg_num(rp, "factor", 1.0, 1e6, &c->yarn_factor, err)) ||
	    (r = cfg_num(rp, "original_max_position_embeddings", 1, 1e12, &orig, err)) ||
	    (r = cfg_num(rp, "beta_fast", 0, 1e6, &c->beta_fast, err)) ||
	    (r = cfg_num(rp, "beta_slow", 0, 1e6, &c->beta_slow, err)) ||
	    (r = cfg_num(rp, "mscale", 0, 1e6, &c->mscale, err)) ||
	    (r = cfg_num(rp, "mscale_all_dim", 0, 1e6, &c->mscale_all_dim, err)))
		return k3_err_prefix(err, "%s", name);
	c->yarn_orig_max = orig;
	return 0;
}

/* Flags of a K3 MLA that this forward does not implement: each must be
 * false or absent, and `why` ends the refusal. */
static const struct {
	const char *key, *why;
} refused_true[] = {
	{ "mla_use_nope", "is not a DSpark draft (its attention uses RoPE)" },
	{ "mla_use_output_gate", "is not supported (the DSpark MLA has no output gate)" },
};

int k3_dspark_config_parse(const char *text, size_t len, struct k3_dspark_config *c,
			   struct k3_err *err)
{
	json_error_t jerr;
	json_t *o = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
	double eps, maxpos;
	bool b;
	int r = 0;

	memset(c, 0, sizeof(*c));
	if (!o || !json_is_object(o)) {
		json_decref(o);
		return k3_err_set(err, -EINVAL, "config.json: %s", o ? "not a JSON object" : jerr.text);
	}
	json_t *mt = json_object_get(o, "model_type");
	if (!json_is_string(mt) || strcmp(json_string_value(mt), "k3_dspark") != 0) {
		r = k3_err_set(err, -EINVAL, "config.json: model_type %s%s%s is not \"k3_dspark\" "
			       "(a DSpark draft of Kimi K3, docs/text-and-draft.md §4)",
			       json_is_string(mt) ? "\"" : "", json_is_string(mt) ? json_string_value(mt) :
			       "(missing)", json_is_string(mt) ? "\"" : "");
		goto out;
	}
	if ((r = cfg_u32(o, "hidden_size", 1, 65536, &c->hidden, err)) ||
	    (r = cfg_u32(o, "intermediate_size", 1, 1u << 20, &c->inter, err)) ||
	    (r = cfg_u32(o, "num_hidden_layers", 1, DSPARK_MAX_LAYERS, &c->layers, err)) ||
	    (r = cfg_u32(o, "num_attention_heads", 1, 1024, &c->heads, err)) ||
	    (r = cfg_u32(o, "q_lora_rank", 1, 65536, &c->q_lora, err)) ||
	    (r = cfg_u32(o, "kv_lora_rank", 1, 65536, &c->kv_lora, err)) ||
	    (r = cfg_u32(o, "qk_nope_head_dim", 1, 4096, &c->nope, err)) ||
	    (r = cfg_u32(o, "qk_rope_head_dim", 2, 4096, &c->rope, err)) ||
	    (r = cfg_u32(o, "v_head_dim", 1, 4096, &c->v_head, err)) ||
	    (r = cfg_u32(o, "vocab_size", 2, 1u << 24, &c->vocab, err)) ||
	    (r = cfg_num(o, "rms_norm_eps", 1e-12, 1.0, &eps, err)) ||
	    (r = cfg_num(o, "max_position_embeddings", 1, 1e12, &maxpos, err)) ||
	    (r = cfg_u32(o, "num_target_layers", 1, K3_ENGINE_MAX_TAPS, &c->n_taps, err)) ||
	    (r = cfg_u32(o, "target_hidden_size", 1, 65536, &c->target_hidden, err)) ||
	    (r = cfg_u32(o, "target_num_hidden_layers", 1, 4096, &c->target_layers, err)) ||
	    (r = cfg_u32(o, "mask_token_id", 0, UINT32_MAX - 1, &c->mask_id, err)) ||
	    (r = cfg_u32(o, "markov_rank", 1, 65536, &c->markov_rank, err)) ||
	    (r = cfg_rope(o, c, err)))
		goto out;
	c->rms_eps = (float)eps;
	c->max_pos = (uint64_t)maxpos;
	if (c->rope % 2) {
		r = k3_err_set(err, -EINVAL, "config.json: qk_rope_head_dim %u must be even (RoPE pairs)",
			       c->rope);
		goto out;
	}
	/* what this forward implements; anything else is refused by name */
	json_t *kv = json_object_get(o, "num_key_value_heads");
	if (kv && (!json_is_integer(kv) || json_integer_value(kv) != c->heads)) {
		r = k3_err_set(err, -EINVAL, "config.json: num_key_value_heads must equal "
			       "num_attention_heads %u (MLA has no shared heads)", c->heads);
		goto out;
	}
	for (size_t i = 0; i < sizeof(refused_true) / sizeof(refused_true[0]); i++) {
		if ((r = cfg_bool(o, refused_true[i].key, false, &b, err)))
			goto out;
		if (b) {
			r = k3_err_set(err, -EINVAL, "config.json: %s true %s", refused_true[i].key,
				       refused_true[i].why);
			goto out;
		}
	}
	if ((r = cfg_bool(o, "tie_word_embeddings", false, &b, err)))
		goto out;
	json_t *act = json_object_get(o, "hidden_act");
	if (act && (!json_is_string(act) || strcmp(json_string_value(act), "silu") != 0)) {
		r = k3_err_set(err, -EINVAL, "config.json: hidden_act must be \"silu\" (or absent)");
		goto out;
	}
	json_t *mh = json_object_get(o, "markov_head_type");
	if (mh && (!json_is_string(mh) || strcmp(json_string_value(mh), "vanilla") != 0)) {
		r = k3_err_set(err, -EINVAL, "config.json: markov_head_type must be \"vanilla\"");
		goto out;
	}
	uint32_t dv = c->vocab;
	if (json_object_get(o, "draft_vocab_size") &&
	    ((r = cfg_u32(o, "draft_vocab_size", 1, 1u << 24, &dv, err)) || dv != c->vocab)) {
		if (!r)
			r = k3_err_set(err, -EINVAL, "config.json: draft_vocab_size %u differs from "
				       "vocab_size %u (a reduced draft vocabulary is not supported)", dv,
				       c->vocab);
		goto out;
	}
	c->block = 7;
	if (json_object_get(o, "block_size") &&
	    (r = cfg_u32(o, "block_size", 1, DSPARK_MAX_BLOCK, &c->block, err)))
		goto out;
	if (c->mask_id >= c->vocab) {
		r = k3_err_set(err, -EINVAL, "config.json: mask_token_id %u is outside the vocabulary "
			       "(%u ids)", c->mask_id, c->vocab);
		goto out;
	}
	json_t *ids = json_object_get(o, "target_layer_ids");
	if (!json_is_array(ids) || json_array_size(ids) != c->n_taps) {
		r = k3_err_set(err, -EINVAL, "config.json: target_layer_ids must be an array of "
			       "num_target_layers (%u) layer indices", c->n_taps);
		goto out;
	}
	for (uint32_t i = 0; i < c->n_taps; i++) {
		json_t *v = json_array_get(ids, i);
		if (!json_is_integer(v) || json_integer_value(v) < 0 ||
		    json_integer_value(v) >= c->target_layers ||
		    (i && json_integer_value(v) <= c->taps[i - 1])) {
			r = k3_err_set(err, -EINVAL, "config.json: target_layer_ids[%u] must be a layer "
				       "index below target_num_hidden_layers %u, above the one before", i,
				       c->target_layers);
			goto out;
		}
		c->taps[i] = (uint32_t)json_integer_value(v);
	}
out:
	json_decref(o);
	return r;
}

/* ---------------------------------------------------------------- tensors */

struct dsl_layer {
	struct k3_kern_mat qa, qb, kva, kvb, o, gate, up, down;
	float *in_norm, *post_norm, *qa_norm, *kva_norm;
};

struct dspark {
	struct k3_draft base;
	struct k3_dspark_config c;
	struct k3_model *ck;         /* the draft's checkpoint (its tensors) */
	const struct k3_tensor *embed;   /* the TARGET's embed_tokens [V][D] */
	struct k3_kern_mat lm_head;      /* the TARGET's lm_head */
	struct k3_kern_mat ctx_proj, m1, m2;
	float *ctx_norm, *final_norm;
	struct dsl_layer *L;
	float *inv_freq;             /* [rope / 2] */
	float rope_mscale, scale;    /* cos/sin factor; softmax scale */
	uint32_t D, row;             /* draft hidden; cache row = kv_lora + rope */
	/* context rows: positions first .. first + n_ctx - 1 */
	uint32_t first, n_ctx, cap;
	float **cache;               /* [layers][cap + block][row] */
	/* scratch: one block (alloc_scratch) holding these, inv_freq and the
	 * norm weights; prob and cx grow apart */
	void *scratch;
	float *x, *h, *qa, *Q, *kv, *att, *y, *g, *u, *qcat, *cbar, *prob;
	float *logits, *bias, *w1row;
	float *cx;                   /* [cx_cap][D] context rows being added */
	uint32_t cx_cap;
	char desc[160];
};

static int bad_tensor(struct k3_err *err, const char *name, const char *what)
{
	return k3_err_set(err, -EINVAL, "model.safetensors: tensor '%s' %s", name, what);
}

/* A BF16 matrix [rows][cols] of the checkpoint. */
static int get_mat(const struct k3_model *m, const char *name, uint64_t rows, uint64_t cols,
		   struct k3_kern_mat *out, struct k3_err *err)
{
	const struct k3_tensor *t = k3_model_tensor(m, name);
	char want[96];
	if (!t)
		return bad_tensor(err, name, "is missing");
	snprintf(want, sizeof(want), "must be BF16 [%llu, %llu]", (unsigned long long)rows,
		 (unsigned long long)cols);
	if (t->dtype != K3_DTYPE_BF16 || t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols)
		return bad_tensor(err, name, want);
	if ((uintptr_t)t->data % 2)
		return bad_tensor(err, name, "is not 2-byte aligned in its file");
	*out = (struct k3_kern_mat){ .dtype = K3_KERN_DT_BF16, .rows = rows, .cols = cols,
				     .data = t->data };
	return 0;
}

/* A norm weight [n] (BF16 or F32) as an fp32 copy into out[0..n) (a
 * part of the scratch block, alloc_scratch). */
static int get_vec(const struct k3_model *m, const char *name, uint32_t n, float *out,
		   struct k3_err *err)
{
	const struct k3_tensor *t = k3_model_tensor(m, name);
	char want[64];
	if (!t)
		return bad_tensor(err, name, "is missing");
	snprintf(want, sizeof(want), "must be BF16 or F32 [%u]", n);
	if ((t->dtype != K3_DTYPE_BF16 && t->dtype != K3_DTYPE_F32) || t->ndim != 1 || t->shape[0] != n)
		return bad_tensor(err, name, want);
	return k3_tensor_read_f32(t, 0, n, out);
}

/* Tensors a DSpark checkpoint carries that this forward does not read. */
static bool skipped(const char *name)
{
	static const char *const skip[] = {
		"embed_tokens.weight",           /* a copy of K3's: the target's is used */
		"lm_head.weight",                /* (none in Inferact's): the target's is used */
		"confidence_head.proj.weight",   /* training only */
		"confidence_head.proj.bias",
	};
	for (size_t i = 0; i < sizeof(skip) / sizeof(skip[0]); i++)
		if (strcmp(name, skip[i]) == 0)
			return true;
	return false;
}

/* Whether name is one of the tensors the forward reads. */
static bool expected(const struct k3_dspark_config *c, const char *name)
{
	static const char *const top[] = { "context_proj.weight", "context_norm.weight",
		"final_norm.weight", "markov_head.markov_w1.weight", "markov_head.markov_w2.weight" };
	static const char *const per[] = { "input_layernorm.weight", "post_attention_layernorm.weight",
		"self_attn.q_a_proj.weight", "self_attn.q_a_layernorm.weight", "self_attn.q_b_proj.weight",
		"self_attn.kv_a_proj_with_mqa.weight", "self_attn.kv_a_layernorm.weight",
		"self_attn.kv_b_proj.weight", "self_attn.o_proj.weight", "mlp.gate_proj.weight",
		"mlp.up_proj.weight", "mlp.down_proj.weight" };
	unsigned l;
	int off = 0;
	for (size_t i = 0; i < sizeof(top) / sizeof(top[0]); i++)
		if (strcmp(name, top[i]) == 0)
			return true;
	if (sscanf(name, "layers.%u.%n", &l, &off) != 1 || off == 0 || l >= c->layers)
		return false;
	char canon[64];
	snprintf(canon, sizeof(canon), "layers.%u.", l);
	if (strncmp(name, canon, strlen(canon)) != 0)
		return false;            /* "layers.01." and the like */
	for (size_t i = 0; i < sizeof(per) / sizeof(per[0]); i++)
		if (strcmp(name + off, per[i]) == 0)
			return true;
	return false;
}

static int load_tensors(struct dspark *d, struct k3_err *err)
{
	const struct k3_dspark_config *c = &d->c;
	const struct k3_model *m = d->ck;
	size_t n = 0;
	const struct k3_tensor *all = k3_model_tensors(m, &n);
	uint64_t H = c->heads, qh = (uint64_t)c->nope + c->rope, D = c->hidden;
	char name[128];
	int r;

	for (size_t i = 0; i < n; i++)
		if (!expected(c, all[i].name) && !skipped(all[i].name))
			return bad_tensor(err, all[i].name, "is not part of the DSpark format "
					  "(docs/text-and-draft.md §4.3)");
	if ((r = get_mat(m, "context_proj.weight", D, (uint64_t)c->n_taps * c->target_hidden,
			 &d->ctx_proj, err)) ||
	    (r = get_vec(m, "context_norm.weight", c->hidden, d->ctx_norm, err)) ||
	    (r = get_vec(m, "final_norm.weight", c->hidden, d->final_norm, err)) ||
	    (r = get_mat(m, "markov_head.markov_w1.weight", c->vocab, c->markov_rank, &d->m1, err)) ||
	    (r = get_mat(m, "markov_head.markov_w2.weight", c->vocab, c->markov_rank, &d->m2, err)))
		return r;
	for (uint32_t l = 0; l < c->layers; l++) {
		struct dsl_layer *L = &d->L[l];
#define T(suffix) (snprintf(name, sizeof(name), "layers.%u." suffix, l), name)
		if ((r = get_vec(m, T("input_layernorm.weight"), c->hidden, L->in_norm, err)) ||
		    (r = get_vec(m, T("post_attention_layernorm.weight"), c->hidden, L->post_norm, err)) ||
		    (r = get_mat(m, T("self_attn.q_a_proj.weight"), c->q_lora, D, &L->qa, err)) ||
		    (r = get_vec(m, T("self_attn.q_a_layernorm.weight"), c->q_lora, L->qa_norm, err)) ||
		    (r = get_mat(m, T("self_attn.q_b_proj.weight"), H * qh, c->q_lora, &L->qb, err)) ||
		    (r = get_mat(m, T("self_attn.kv_a_proj_with_mqa.weight"), (uint64_t)c->kv_lora + c->rope,
				 D, &L->kva, err)) ||
		    (r = get_vec(m, T("self_attn.kv_a_layernorm.weight"), c->kv_lora, L->kva_norm, err)) ||
		    (r = get_mat(m, T("self_attn.kv_b_proj.weight"), H * ((uint64_t)c->nope + c->v_head),
				 c->kv_lora, &L->kvb, err)) ||
		    (r = get_mat(m, T("self_attn.o_proj.weight"), D, H * c->v_head, &L->o, err)) ||
		    (r = get_mat(m, T("mlp.gate_proj.weight"), c->inter, D, &L->gate, err)) ||
		    (r = get_mat(m, T("mlp.up_proj.weight"), c->inter, D, &L->up, err)) ||
		    (r = get_mat(m, T("mlp.down_proj.weight"), D, c->inter, &L->down, err)))
			return r;
#undef T
	}
	return 0;
}

/* The target's side: shared embedding and lm_head, taps, sizes. */
static int fit_target(struct dspark *d, struct k3_engine *e, struct k3_err *err)
{
	const struct k3_dspark_config *c = &d->c;
	const struct k3_model_plan *plan = k3_model_plan(k3_engine_model(e));
	uint32_t TD = k3_engine_hidden(e), TL = k3_engine_n_layers(e), TV = k3_engine_vocab(e);

	if (c->target_hidden != TD || c->target_layers != TL)
		return k3_err_set(err, -EINVAL, "config.json: the draft was made for a target with "
				  "hidden size %u and %u layers; this model has %u and %u",
				  c->target_hidden, c->target_layers, TD, TL);
	if (c->vocab != TV)
		return k3_err_set(err, -EINVAL, "config.json: vocab_size %u differs from the model's %u",
				  c->vocab, TV);
	if (c->hidden != TD)
		return k3_err_set(err, -EINVAL, "config.json: hidden_size %u differs from the model's "
				  "%u, so the model's embedding and lm_head cannot be shared", c->hidden, TD);
	if (!plan->embed_tokens || !plan->lm_head || plan->embed_tokens->dtype != K3_DTYPE_BF16 ||
	    plan->lm_head->dtype != K3_DTYPE_BF16 || (uintptr_t)plan->lm_head->data % 2)
		return k3_err_set(err, -EINVAL, "the model's embedding or lm_head is not an aligned "
				  "BF16 [vocab, hidden] matrix");
	d->embed = plan->embed_tokens;
	d->lm_head = (struct k3_kern_mat){ .dtype = K3_KERN_DT_BF16, .rows = TV, .cols = TD,
					   .data = plan->lm_head->data };
	d->base.n_taps = c->n_taps;
	memcpy(d->base.tap_layers, c->taps, c->n_taps * sizeof(uint32_t));
	d->base.max_block = c->block;
	return 0;
}

/* DeepSeek YaRN (vLLM's DeepseekScalingRotaryEmbedding): per pair i the
 * frequency blends base^(-2i/d) (extrapolated) and that over factor
 * (interpolated) with a linear ramp between the correction dims of
 * beta_fast and beta_slow; cos/sin are scaled by mscale(mscale) /
 * mscale(mscale_all_dim) and the softmax by mscale(mscale_all_dim)^2. */
static double yarn_mscale(double scale, double m)
{
	return scale <= 1 ? 1.0 : 0.1 * m * log(scale) + 1.0;
}

static double yarn_dim(double rot, double dim, double base, double max_pos)
{
	return dim * log(max_pos / (rot * 2 * M_PI)) / (2 * log(base));
}

static void rope_init(struct dspark *d)
{
	const struct k3_dspark_config *c = &d->c;
	uint32_t half = c->rope / 2;
	double dim = c->rope;

	d->rope_mscale = 1.0f;
	d->scale = (float)(1.0 / sqrt((double)c->nope + c->rope));
	double low = 0, high = 0;
	if (c->yarn) {
		low = floor(yarn_dim(c->beta_fast, dim, c->rope_theta, c->yarn_orig_max));
		high = ceil(yarn_dim(c->beta_slow, dim, c->rope_theta, c->yarn_orig_max));
		if (low < 0)
			low = 0;
		if (high > dim - 1)
			high = dim - 1;
		if (low == high)
			high += 0.001;
		d->rope_mscale = (float)(yarn_mscale(c->yarn_factor, c->mscale) /
					 yarn_mscale(c->yarn_factor, c->mscale_all_dim));
		double ms = yarn_mscale(c->yarn_factor, c->mscale_all_dim);
		d->scale = (float)(d->scale * ms * ms);
	}
	for (uint32_t i = 0; i < half; i++) {
		double extra = 1.0 / pow(c->rope_theta, 2.0 * i / dim);
		double f = extra;
		if (c->yarn) {
			double ramp = (i - low) / (high - low);
			ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
			double keep = 1.0 - ramp;    /* 1: extrapolate (high frequencies) */
			f = extra / c->yarn_factor * (1.0 - keep) + extra * keep;
		}
		d->inv_freq[i] = (float)f;
	}
}

/* RoPE on interleaved pairs (x[2i], x[2i+1]) at position pos, in place. */
static void rope_apply(const struct dspark *d, float *x, uint32_t pos)
{
	for (uint32_t i = 0; i < d->c.rope / 2; i++) {
		float a = (float)pos * d->inv_freq[i];
		float cs = cosf(a) * d->rope_mscale, sn = sinf(a) * d->rope_mscale;
		float x0 = x[2 * i], x1 = x[2 * i + 1];
		x[2 * i] = x0 * cs - x1 * sn;
		x[2 * i + 1] = x0 * sn + x1 * cs;
	}
}

/* ---------------------------------------------------------------- forward */

static void mm(const struct k3_kern_mat *w, uint32_t T, const float *x, size_t ldx, float *y,
	       size_t ldy)
{
	k3_kern_matmul(NULL, w, 0, w->rows, T, x, ldx, y, ldy);
}

/* A cache row at row index `at` of layer l from kv = [latent | key lane]. */
static void cache_row(struct dspark *d, uint32_t l, uint32_t at, const float *kv, uint32_t pos)
{
	float *dst = d->cache[l] + (size_t)at * d->row;
	k3_kern_rmsnorm(d->c.kv_lora, kv, d->L[l].kva_norm, d->c.rms_eps, dst);
	memcpy(dst + d->c.kv_lora, kv + d->c.kv_lora, d->c.rope * sizeof(float));
	rope_apply(d, dst + d->c.kv_lora, pos);
}

static int reserve(struct dspark *d, uint32_t need, struct k3_err *err)
{
	if (need <= d->cap)
		return 0;
	uint64_t cap = d->cap ? d->cap : 64;
	while (cap < need)
		cap *= 2;
	if (cap > (1u << 24))
		return k3_err_set(err, -E2BIG, "DSpark draft: context of %u positions too long", need);
	for (uint32_t l = 0; l < d->c.layers; l++) {
		float *p = realloc(d->cache[l], (cap + d->c.block) * d->row * sizeof(float));
		if (!p)
			return k3_err_set(err, -ENOMEM, "DSpark draft: out of memory for %u rows", need);
		d->cache[l] = p;
	}
	float *p = realloc(d->prob, (cap + d->c.block) * sizeof(float));
	if (!p)
		return k3_err_set(err, -ENOMEM, "DSpark draft: out of memory for %u rows", need);
	d->prob = p;
	d->cap = (uint32_t)cap;
	return 0;
}

/* accept(): target rows -> context rows (§4.5: ctx = context_norm(
 * context_proj(concat taps)); per layer kv_a(ctx) without input_layernorm). */
static int dspark_accept(struct k3_draft *base, uint32_t pos0, const uint32_t *ids, uint32_t n,
			 const float *taps, struct k3_err *err)
{
	struct dspark *d = (struct dspark *)base;
	const struct k3_dspark_config *c = &d->c;
	(void)ids;
	if (!taps)
		return 0;
	if (d->n_ctx == 0 || pos0 < d->first || pos0 > d->first + d->n_ctx) {
		d->first = pos0;     /* a gap (a reused conversation): start over here */
		d->n_ctx = 0;
	} else {
		d->n_ctx = pos0 - d->first;
	}
	int r = reserve(d, d->n_ctx + n, err);
	if (r)
		return r;
	if (n > d->cx_cap) {
		float *p = realloc(d->cx, (size_t)n * (d->D + c->kv_lora + c->rope) * sizeof(float));
		if (!p)
			return k3_err_set(err, -ENOMEM, "DSpark draft: out of memory");
		d->cx = p;
		d->cx_cap = n;
	}
	float *kv = d->cx + (size_t)n * d->D;
	mm(&d->ctx_proj, n, taps, (size_t)c->n_taps * c->target_hidden, d->cx, d->D);
	for (uint32_t t = 0; t < n; t++)
		k3_kern_rmsnorm(d->D, d->cx + (size_t)t * d->D, d->ctx_norm, c->rms_eps,
				d->cx + (size_t)t * d->D);
	for (uint32_t l = 0; l < c->layers; l++) {
		mm(&d->L[l].kva, n, d->cx, d->D, kv, d->row);
		for (uint32_t t = 0; t < n; t++)
			cache_row(d, l, d->n_ctx + t, kv + (size_t)t * d->row, pos0 + t);
	}
	d->n_ctx += n;
	return 0;
}

/* Attention of block query k over the context rows and the block rows of
 * layer l (absorbed MLA, §6.5 of docs/model.md with RoPE lanes). */
static void attend(struct dspark *d, uint32_t l, uint32_t B, uint32_t k)
{
	const struct k3_dspark_config *c = &d->c;
	const struct dsl_layer *L = &d->L[l];
	uint32_t qh = c->nope + c->rope, rows = d->n_ctx + B;
	const uint16_t *kvb = L->kvb.data;

	for (uint32_t hh = 0; hh < c->heads; hh++) {
		const float *q = d->Q + ((size_t)k * c->heads + hh) * qh;
		struct k3_kern_mat wuk = { .dtype = K3_KERN_DT_BF16, .rows = c->nope, .cols = c->kv_lora,
					   .data = kvb + (size_t)hh * (c->nope + c->v_head) * c->kv_lora };
		k3_kern_matmul_t(NULL, &wuk, 1, q, c->nope, d->qcat, c->kv_lora);
		memcpy(d->qcat + c->kv_lora, q + c->nope, c->rope * sizeof(float));
		k3_kern_mla_attend(rows, d->row, c->kv_lora, d->cache[l], d->row, d->qcat, d->scale,
				   d->cbar, d->prob);
		struct k3_kern_mat wuv = { .dtype = K3_KERN_DT_BF16, .rows = c->v_head, .cols = c->kv_lora,
					   .data = kvb + ((size_t)hh * (c->nope + c->v_head) + c->nope) *
						   c->kv_lora };
		mm(&wuv, 1, d->cbar, c->kv_lora,
		   d->att + (size_t)k * c->heads * c->v_head + (size_t)hh * c->v_head, c->v_head);
	}
}

/* One draft layer over the B block rows in d->x. */
static void layer(struct dspark *d, uint32_t l, uint32_t B, uint32_t p0)
{
	const struct k3_dspark_config *c = &d->c;
	const struct dsl_layer *L = &d->L[l];
	uint32_t D = d->D, qh = c->nope + c->rope;
	size_t nq = (size_t)c->heads * qh;

	for (uint32_t k = 0; k < B; k++)
		k3_kern_rmsnorm(D, d->x + (size_t)k * D, L->in_norm, c->rms_eps, d->h + (size_t)k * D);
	mm(&L->qa, B, d->h, D, d->qa, c->q_lora);
	for (uint32_t k = 0; k < B; k++)
		k3_kern_rmsnorm(c->q_lora, d->qa + (size_t)k * c->q_lora, L->qa_norm, c->rms_eps,
				d->qa + (size_t)k * c->q_lora);
	mm(&L->qb, B, d->qa, c->q_lora, d->Q, nq);
	mm(&L->kva, B, d->h, D, d->kv, d->row);
	for (uint32_t k = 0; k < B; k++) {
		for (uint32_t hh = 0; hh < c->heads; hh++)
			rope_apply(d, d->Q + (size_t)k * nq + (size_t)hh * qh + c->nope, p0 + k);
		/* the block's own rows, after the context (dropped afterwards) */
		cache_row(d, l, d->n_ctx + k, d->kv + (size_t)k * d->row, p0 + k);
	}
	for (uint32_t k = 0; k < B; k++)
		attend(d, l, B, k);
	mm(&L->o, B, d->att, (size_t)c->heads * c->v_head, d->y, D);
	k3_kern_add((size_t)B * D, d->x, d->y, d->x);
	for (uint32_t k = 0; k < B; k++)
		k3_kern_rmsnorm(D, d->x + (size_t)k * D, L->post_norm, c->rms_eps, d->h + (size_t)k * D);
	mm(&L->gate, B, d->h, D, d->g, c->inter);
	mm(&L->up, B, d->h, D, d->u, c->inter);
	k3_kern_silu((size_t)B * c->inter, d->g, d->g);
	k3_kern_mul((size_t)B * c->inter, d->g, d->u, d->g);
	mm(&L->down, B, d->g, c->inter, d->y, D);
	k3_kern_add((size_t)B * D, d->x, d->y, d->x);
}

static uint32_t argmax_sum(const float *a, const float *b, uint32_t n)
{
	uint32_t best = 0;
	float bv = a[0] + b[0];
	for (uint32_t i = 1; i < n; i++) {
		float v = a[i] + b[i];
		if (v > bv) {
			bv = v;
			best = i;
		}
	}
	return best;
}

static int dspark_propose(struct k3_draft *base, const uint32_t *ctx, size_t n, uint32_t max,
			  uint32_t *out, struct k3_err *err)
{
	struct dspark *d = (struct dspark *)base;
	const struct k3_dspark_config *c = &d->c;
	uint32_t B = c->block, D = d->D, r = max < B ? max : B;
	uint32_t a = ctx[n - 1], p0 = (uint32_t)(n - 1);

	if (a >= c->vocab)
		return k3_err_set(err, -EINVAL, "DSpark draft: anchor id %u outside the vocabulary", a);
	/* context = the rows below p0 (normally all of them: the run accepts
	 * exactly the positions before the anchor) */
	if (d->first + d->n_ctx > p0)
		d->n_ctx = p0 > d->first ? p0 - d->first : 0;
	int rc;
	/* 1) [a, M, ..., M] embedded with the target's embedding */
	for (uint32_t k = 0; k < B; k++)
		if ((rc = k3_tensor_read_f32(d->embed, (uint64_t)(k ? c->mask_id : a) * D, D,
					     d->x + (size_t)k * D)) < 0)
			return k3_err_set(err, rc, "DSpark draft: cannot read the embedding");
	/* 2) the layers; 3) final norm and the target's lm_head on r rows */
	for (uint32_t l = 0; l < c->layers; l++)
		layer(d, l, B, p0);
	for (uint32_t k = 0; k < r; k++)
		k3_kern_rmsnorm(D, d->x + (size_t)k * D, d->final_norm, c->rms_eps, d->h + (size_t)k * D);
	mm(&d->lm_head, r, d->h, D, d->logits, c->vocab);
	/* 4) the Markov pass: bias = W2 W1[prev], d_k = argmax(z_k + bias) */
	uint32_t prev = a;
	const uint16_t *w1 = d->m1.data;
	for (uint32_t k = 0; k < r; k++) {
		k3_kern_bf16_to_f32(c->markov_rank, w1 + (size_t)prev * c->markov_rank, d->w1row);
		mm(&d->m2, 1, d->w1row, c->markov_rank, d->bias, c->vocab);
		prev = argmax_sum(d->logits + (size_t)k * c->vocab, d->bias, c->vocab);
		out[k] = prev;
	}
	return (int)r;
}

static void dspark_reset(struct k3_draft *base)
{
	struct dspark *d = (struct dspark *)base;
	d->n_ctx = 0;
	d->first = 0;
}

static void dspark_free(struct k3_draft *base)
{
	struct dspark *d = (struct dspark *)base;
	if (!d)
		return;
	for (uint32_t l = 0; d->cache && l < d->c.layers; l++)
		free(d->cache[l]);
	free(d->cache);
	free(d->L);
	free(d->scratch);
	free(d->prob);
	free(d->cx);
	k3_model_free(d->ck);
	free(d);
}

static const struct k3_draft_ops dspark_ops = {
	.name = "dspark",
	.propose = dspark_propose,
	.accept = dspark_accept,
	.reset = dspark_reset,
	.free = dspark_free,
};

/* The buffers of the draft's lifetime, one carved block (base/carve.h):
 * the forward's scratch and every norm weight (get_vec fills them). prob
 * and cx grow with the context, apart. */
static int alloc_scratch(struct dspark *d, struct k3_err *err)
{
	const struct k3_dspark_config *c = &d->c;
	size_t B = c->block, D = d->D;
	d->L = calloc(c->layers, sizeof(*d->L));
	d->cache = calloc(c->layers, sizeof(*d->cache));
	if (!d->L || !d->cache)
		return k3_err_set(err, -ENOMEM, "DSpark draft: out of memory");
	struct k3_carve k = { 0 };
	while (k3_carve_next(&k)) {
		K3_CARVE(&k, d->x, B * D);
		K3_CARVE(&k, d->h, B * D);
		K3_CARVE(&k, d->qa, B * c->q_lora);
		K3_CARVE(&k, d->Q, B * c->heads * ((size_t)c->nope + c->rope));
		K3_CARVE(&k, d->kv, B * d->row);
		K3_CARVE(&k, d->att, B * c->heads * c->v_head);
		K3_CARVE(&k, d->y, B * D);
		K3_CARVE(&k, d->g, B * c->inter);
		K3_CARVE(&k, d->u, B * c->inter);
		K3_CARVE(&k, d->qcat, d->row);
		K3_CARVE(&k, d->cbar, c->kv_lora);
		K3_CARVE(&k, d->logits, B * c->vocab);
		K3_CARVE(&k, d->bias, c->vocab);
		K3_CARVE(&k, d->w1row, c->markov_rank);
		K3_CARVE(&k, d->inv_freq, c->rope / 2);
		K3_CARVE(&k, d->ctx_norm, D);
		K3_CARVE(&k, d->final_norm, D);
		for (uint32_t l = 0; l < c->layers; l++) {
			K3_CARVE(&k, d->L[l].in_norm, D);
			K3_CARVE(&k, d->L[l].post_norm, D);
			K3_CARVE(&k, d->L[l].qa_norm, c->q_lora);
			K3_CARVE(&k, d->L[l].kva_norm, c->kv_lora);
		}
	}
	if (!(d->scratch = k.block))
		return k3_err_set(err, -ENOMEM, "DSpark draft: out of memory");
	return 0;
}

int k3_draft_dspark_open(const char *dir, struct k3_engine *e, struct k3_draft **out,
			 struct k3_err *err)
{
	struct dspark *d = calloc(1, sizeof(*d));
	char *path = k3_path_join(dir, "config.json"), *text = NULL;
	size_t len;
	int r;

	if (!d || !path) {
		free(d);
		free(path);
		return k3_err_set(err, -ENOMEM, "out of memory");
	}
	d->base.ops = &dspark_ops;
	r = k3_file_read(path, 1u << 20, 0, &text, &len, err);
	free(path);
	if (!r)
		r = k3_dspark_config_parse(text, len, &d->c, err);
	free(text);
	/* the fit to the target first: a draft for another model fails on
	 * that, not on the shapes it implies */
	if (!r)
		r = fit_target(d, e, err);
	if (!r)
		r = k3_model_open_tensors(dir, &d->ck, err);
	if (!r) {
		d->D = d->c.hidden;
		d->row = d->c.kv_lora + d->c.rope;
		r = alloc_scratch(d, err);
	}
	if (!r)
		r = load_tensors(d, err);
	if (!r)
		r = reserve(d, 64, err);
	if (r) {
		dspark_free(&d->base);
		return r;
	}
	rope_init(d);
	int o = snprintf(d->desc, sizeof(d->desc), "%u layers, %u heads, block %u, taps", d->c.layers,
			 d->c.heads, d->c.block);
	for (uint32_t i = 0; i < d->c.n_taps && o > 0 && (size_t)o < sizeof(d->desc); i++)
		o += snprintf(d->desc + o, sizeof(d->desc) - (size_t)o, "%s%u", i ? "," : " ",
			      d->c.taps[i]);
	if (o > 0 && (size_t)o < sizeof(d->desc))
		snprintf(d->desc + o, sizeof(d->desc) - (size_t)o, d->c.yarn ? ", YaRN x%g" : ", RoPE",
			 d->c.yarn_factor);
	*out = &d->base;
	return 0;
}

const char *k3_draft_dspark_describe(const struct k3_draft *base)
{
	return ((const struct dspark *)base)->desc;
}

void k3_draft_dspark_context(const struct k3_draft *base, uint32_t *first, uint32_t *n)
{
	const struct dspark *d = (const struct dspark *)base;
	*first = d->first;
	*n = d->n_ctx;
}

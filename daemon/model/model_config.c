/*
 * model_config.c - config.json -> struct k3_model_config (docs/model.md §1).
 *
 * Every field is read by value with its JSON type checked: a boolean must be
 * true/false (never "present means true"), integers must be integers in a
 * bounded range, and null means the class default of §1.2. The first problem
 * found is reported with the field's full path and what was expected.
 */
#include "model/model.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

/* Upper bound of any single dimension: keeps every product of two or three
 * dimensions far inside uint64_t. */
#define DIM_MAX (1u << 24)

struct cfgctx {
	const char *prefix;      /* "text_config." or "" */
	struct k3_err *err;
};

static int bad(struct cfgctx *c, const char *field, const char *fmt, const char *got)
{
	return k3_err_set(c->err, -EINVAL, "config.json: %s%s: %s%s%s%s", c->prefix, field, fmt,
			  got ? ", got '" : "", got ? got : "", got ? "'" : "");
}

/* NULL-safe: a caller may describe a value it looked up and did not find. */
static const char *json_kind(const json_t *v)
{
	if (!v)
		return "nothing";
	switch (json_typeof(v)) {
	case JSON_OBJECT: return "object";
	case JSON_ARRAY: return "array";
	case JSON_STRING: return "string";
	case JSON_INTEGER: return "integer";
	case JSON_REAL: return "number";
	case JSON_TRUE: return "true";
	case JSON_FALSE: return "false";
	case JSON_NULL: return "null";
	}
	return "?";
}

/* key's value in o; NULL when it is absent or null (the class default). */
static json_t *value_of(json_t *o, const char *key)
{
	json_t *v = json_object_get(o, key);

	return v && !json_is_null(v) ? v : NULL;
}

/* Reads a number, with integer an integer, in [min, max]. Absent or null
 * -> *out = dflt and *present false (when required, that is an error). */
static int get_value(struct cfgctx *c, json_t *o, const char *key, bool integer, bool required,
		     double dflt, double min, double max, double *out, bool *present)
{
	json_t *v = value_of(o, key);
	const char *what = integer ? "an integer" : "a number";
	char want[96], got[40];

	if (present)
		*present = false;
	if (!v) {
		if (required) {
			snprintf(want, sizeof(want), "required field is missing or null (expected %s)", what);
			return bad(c, key, want, NULL);
		}
		*out = dflt;
		return 0;
	}
	if (integer ? !json_is_integer(v) : !json_is_number(v)) {
		snprintf(want, sizeof(want), "expected %s", what);
		return bad(c, key, want, json_kind(v));
	}
	double x = json_number_value(v);
	if (!isfinite(x) || x < min || x > max) {
		if (integer) {
			snprintf(want, sizeof(want), "expected an integer in [%u, %u]", (unsigned)min,
				 (unsigned)max);
			snprintf(got, sizeof(got), "%lld", (long long)json_integer_value(v));
		} else {
			snprintf(want, sizeof(want), "expected a number in [%g, %g]", min, max);
			snprintf(got, sizeof(got), "%g", x);
		}
		return bad(c, key, want, got);
	}
	*out = x;
	if (present)
		*present = true;
	return 0;
}

/* get_value for an unsigned integer (exact in a double: at most 2^32). */
static int get_u32(struct cfgctx *c, json_t *o, const char *key, bool required,
		   uint32_t dflt, uint32_t min, uint32_t max, uint32_t *out, bool *present)
{
	double x = 0;
	int r = get_value(c, o, key, true, required, dflt, min, max, &x, present);

	if (!r)
		*out = (uint32_t)x;
	return r;
}

static int get_num(struct cfgctx *c, json_t *o, const char *key, bool required,
		   double dflt, double min, double max, double *out, bool *present)
{
	return get_value(c, o, key, false, required, dflt, min, max, out, present);
}

/* Booleans by value (§1.2: presence-based parsing is a known bug). */
static int get_bool(struct cfgctx *c, json_t *o, const char *key, bool dflt, bool *out)
{
	json_t *v = value_of(o, key);

	if (v && !json_is_boolean(v))
		return bad(c, key, "expected true or false", json_kind(v));
	*out = v ? json_is_true(v) : dflt;
	return 0;
}

static int get_str(struct cfgctx *c, json_t *o, const char *key, const char *dflt,
		   const char **out)
{
	json_t *v = value_of(o, key);

	if (v && !json_is_string(v))
		return bad(c, key, "expected a string", json_kind(v));
	*out = v ? json_string_value(v) : dflt;
	return 0;
}

/* A string that must be w0 (-> v0) or w1 (-> v1); absent or null: dflt. */
static int get_choice(struct cfgctx *c, json_t *o, const char *key, const char *dflt,
		      const char *w0, int v0, const char *w1, int v1, int *out)
{
	const char *s = NULL;
	char want[96];
	int r = get_str(c, o, key, dflt, &s);

	if (r)
		return r;
	if (strcmp(s, w0) == 0 || strcmp(s, w1) == 0) {
		*out = strcmp(s, w0) == 0 ? v0 : v1;
		return 0;
	}
	snprintf(want, sizeof(want), "expected '%s' or '%s'", w0, w1);
	return bad(c, key, want, s);
}

/* A token id: integer, null, or (HF allows it for eos) a list whose first
 * element is used. Text config first, then the top level. */
static int get_token(struct cfgctx *c, json_t *text, json_t *top, const char *key, int64_t *out)
{
	json_t *v = json_object_get(text, key);

	if ((!v || json_is_null(v)) && top)
		v = json_object_get(top, key);
	*out = -1;
	if (!v || json_is_null(v))
		return 0;
	if (json_is_array(v) && json_array_size(v) > 0)
		v = json_array_get(v, 0);
	if (!json_is_integer(v) || json_integer_value(v) < 0 ||
	    json_integer_value(v) > (json_int_t)DIM_MAX)
		return bad(c, key, "expected a non-negative token id", json_kind(v));
	*out = (int64_t)json_integer_value(v);
	return 0;
}

#define TRY(x) do { int r_ = (x); if (r_) return r_; } while (0)

static int parse_kda(struct cfgctx *c, json_t *lac, struct k3_model_config *k)
{
	struct cfgctx sub = { "text_config.linear_attn_config.", c->err };
	bool set;
	double d;

	if (!c->prefix[0])
		sub.prefix = "linear_attn_config.";
	if (!json_is_object(lac))
		return bad(c, "linear_attn_config", "expected an object or null", json_kind(lac));
	k->has_kda = true;
	json_t *kl = json_object_get(lac, "kda_layers");
	if (!kl || !json_is_array(kl))
		return bad(&sub, "kda_layers", "required 1-based list of layer numbers is missing",
			   kl ? json_kind(kl) : NULL);
	if (json_array_size(kl) > k->num_hidden_layers)
		return bad(&sub, "kda_layers", "more entries than num_hidden_layers", NULL);
	size_t i;
	json_t *e;
	json_array_foreach(kl, i, e) {
		char got[32];
		if (!json_is_integer(e))
			return bad(&sub, "kda_layers", "expected integers (1-based layer numbers)", json_kind(e));
		json_int_t n = json_integer_value(e);
		snprintf(got, sizeof(got), "%lld", (long long)n);
		if (n < 1 || n > (json_int_t)k->num_hidden_layers)
			return bad(&sub, "kda_layers", "entry out of range [1, num_hidden_layers] (the list is 1-based)", got);
		if (k->is_kda[n - 1])
			return bad(&sub, "kda_layers", "duplicate entry", got);
		k->is_kda[n - 1] = true;
		k->kda_layers_1based[k->n_kda_layers_listed++] = (uint32_t)n;
	}
	/* full_attn_layers is required by the config class but never used for
	 * dispatch (§1.3); when present it must be a list. */
	json_t *fl = json_object_get(lac, "full_attn_layers");
	if (fl && !json_is_array(fl) && !json_is_null(fl))
		return bad(&sub, "full_attn_layers", "expected a list", json_kind(fl));
	TRY(get_u32(&sub, lac, "num_heads", true, 0, 1, 65536, &k->kda_num_heads, NULL));
	TRY(get_u32(&sub, lac, "head_dim", true, 0, 1, 65536, &k->kda_head_dim, NULL));
	TRY(get_u32(&sub, lac, "short_conv_kernel_size", false, 4, 1, 64,
		    &k->short_conv_kernel_size, NULL));
	TRY(get_num(&sub, lac, "gate_lower_bound", false, 0.0, -1e6, 0.0, &d, &set));
	k->gate_lower_bound_set = set;
	k->gate_lower_bound = (float)d;
	TRY(get_bool(&sub, lac, "use_full_rank_gate", false, &k->use_full_rank_gate));
	return 0;
}

static int parse_text(struct cfgctx *c, json_t *t, json_t *top, struct k3_model_config *k)
{
	const char *s = NULL;
	int word;
	double d;
	bool set;

	TRY(get_u32(c, t, "vocab_size", true, 0, 1, DIM_MAX, &k->vocab_size, NULL));
	TRY(get_u32(c, t, "hidden_size", true, 0, 1, 1u << 20, &k->hidden_size, NULL));
	TRY(get_u32(c, t, "num_hidden_layers", true, 0, 1, K3_MODEL_MAX_LAYERS,
		    &k->num_hidden_layers, NULL));
	TRY(get_u32(c, t, "intermediate_size", false, 11008, 1, 1u << 20, &k->intermediate_size, NULL));

	TRY(get_choice(c, t, "hidden_act", "silu", "situ", K3_ACT_SITU, "silu", K3_ACT_SILU, &word));
	k->hidden_act = (enum k3_hidden_act)word;
	TRY(get_num(c, t, "activation_situ_beta", false, 1.0, 1e-6, 1e6, &d, NULL));
	k->situ_beta = (float)d;
	TRY(get_num(c, t, "activation_situ_linear_beta", false, 0.0, 1e-6, 1e6, &d, &set));
	k->situ_linear_beta_set = set;
	k->situ_linear_beta = (float)d;
	TRY(get_num(c, t, "rms_norm_eps", false, 1e-6, 1e-30, 1.0, &d, NULL));
	if (!(d > 0))
		return bad(c, "rms_norm_eps", "expected a positive number", NULL);
	k->rms_norm_eps = (float)d;
	bool tie_top = false;
	if (top)
		TRY(get_bool(&(struct cfgctx){ "", c->err }, top, "tie_word_embeddings", false, &tie_top));
	TRY(get_bool(c, t, "tie_word_embeddings", tie_top, &k->tie_word_embeddings));
	TRY(get_u32(c, t, "attn_res_block_size", false, 0, 1, K3_MODEL_MAX_LAYERS,
		    &k->attn_res_block_size, NULL));

	/* MLA */
	TRY(get_u32(c, t, "num_attention_heads", false, 32, 1, 65536, &k->num_attention_heads, NULL));
	TRY(get_u32(c, t, "num_key_value_heads", false, k->num_attention_heads, 1, 65536,
		    &k->num_key_value_heads, NULL));
	TRY(get_u32(c, t, "q_lora_rank", false, 0, 1, 1u << 20, &k->q_lora_rank, NULL));
	TRY(get_u32(c, t, "kv_lora_rank", false, 0, 1, 1u << 20, &k->kv_lora_rank, NULL));
	TRY(get_u32(c, t, "qk_nope_head_dim", false, 0, 1, 65536, &k->qk_nope_head_dim, NULL));
	TRY(get_u32(c, t, "qk_rope_head_dim", false, 0, 0, 65536, &k->qk_rope_head_dim, NULL));
	TRY(get_u32(c, t, "v_head_dim", false, 0, 1, 65536, &k->v_head_dim, NULL));
	TRY(get_bool(c, t, "mla_use_nope", false, &k->mla_use_nope));
	TRY(get_bool(c, t, "mla_use_output_gate", false, &k->mla_use_output_gate));
	TRY(get_num(c, t, "rope_theta", false, 10000.0, 0.0, 1e300, &k->rope_theta, NULL));
	uint32_t mpe;
	TRY(get_u32(c, t, "max_position_embeddings", false, 4096, 1, 0xffffffffu, &mpe, NULL));
	k->max_position_embeddings = mpe;

	/* MoE */
	bool have_moe;
	TRY(get_u32(c, t, "num_experts", false, 0, 1, K3_MODEL_MAX_EXPERTS, &k->num_experts, &have_moe));
	TRY(get_u32(c, t, "num_experts_per_token", have_moe, 0, 1, K3_MODEL_MAX_EXPERTS,
		    &k->num_experts_per_token, NULL));
	TRY(get_u32(c, t, "num_shared_experts", false, 0, 0, 64, &k->num_shared_experts, NULL));
	TRY(get_u32(c, t, "moe_intermediate_size", have_moe, 0, 1, 1u << 20,
		    &k->moe_intermediate_size, NULL));
	TRY(get_bool(c, t, "moe_renormalize", true, &k->moe_renormalize));
	TRY(get_choice(c, t, "moe_router_activation_func", "sigmoid", "sigmoid", K3_ROUTER_SIGMOID,
		       "softmax", K3_ROUTER_SOFTMAX, &word));
	k->moe_router_activation_func = (enum k3_router_act)word;
	TRY(get_num(c, t, "routed_scaling_factor", false, 1.0, 0.0, 1e6, &d, NULL));
	k->routed_scaling_factor = (float)d;
	TRY(get_u32(c, t, "first_k_dense_replace", false, 0, 0, K3_MODEL_MAX_LAYERS,
		    &k->first_k_dense_replace, NULL));
	TRY(get_u32(c, t, "moe_layer_freq", false, 1, 1, K3_MODEL_MAX_LAYERS, &k->moe_layer_freq, NULL));
	TRY(get_bool(c, t, "use_grouped_topk", true, &k->use_grouped_topk));
	TRY(get_u32(c, t, "num_expert_group", false, 1, 1, K3_MODEL_MAX_EXPERTS, &k->num_expert_group, NULL));
	TRY(get_u32(c, t, "topk_group", false, 1, 1, K3_MODEL_MAX_EXPERTS, &k->topk_group, NULL));
	TRY(get_str(c, t, "topk_method", "noaux_tc", &s));
	if (strcmp(s, "noaux_tc") != 0)
		return bad(c, "topk_method", "expected 'noaux_tc' (the only method the HF gate implements)", s);
	TRY(get_u32(c, t, "routed_expert_hidden_size", false, 0, 1, 1u << 20,
		    &k->routed_expert_hidden_size, NULL));
	TRY(get_bool(c, t, "latent_moe_use_norm", false, &k->latent_moe_use_norm));
	TRY(get_u32(c, t, "num_nextn_predict_layers", false, 0, 0, 64, &k->num_nextn_predict_layers, NULL));

	/* special tokens */
	TRY(get_token(c, t, top, "bos_token_id", &k->bos_token_id));
	TRY(get_token(c, t, top, "eos_token_id", &k->eos_token_id));
	TRY(get_token(c, t, top, "pad_token_id", &k->pad_token_id));
	TRY(get_token(c, t, top, "media_placeholder_token_id", &k->media_placeholder_token_id));

	json_t *q = json_object_get(t, "quantization_config");
	if ((!q || json_is_null(q)) && top)
		q = json_object_get(top, "quantization_config");
	if (q && json_is_object(q)) {
		json_t *f = json_object_get(q, "format");
		k->quant_mxfp4 = f && json_is_string(f) &&
				 strcmp(json_string_value(f), "mxfp4-pack-quantized") == 0;
	}

	json_t *lac = json_object_get(t, "linear_attn_config");
	if (lac && !json_is_null(lac))
		TRY(parse_kda(c, lac, k));
	return 0;
}

/* Derived typing (§1.3) and cross-field consistency. */
static int derive(struct cfgctx *c, struct k3_model_config *k)
{
	char got[64];
	uint32_t L = k->num_hidden_layers;

	for (uint32_t l = 0; l < L; l++) {
		k->is_moe[l] = k->num_experts && l >= k->first_k_dense_replace &&
			       l % k->moe_layer_freq == 0;
		k->is_block_start[l] = k->attn_res_block_size && l % k->attn_res_block_size == 0;
		if (k->is_kda[l])
			k->n_kda++;
		else
			k->n_mla++;
		if (k->is_moe[l])
			k->n_moe++;
		else
			k->n_dense++;
	}
	if (k->attn_res_block_size)
		k->n_attn_res_blocks = (L + k->attn_res_block_size - 1) / k->attn_res_block_size;

	if (k->n_mla) {
		/* The code raises when an MLA layer exists without MLA fields. */
		static const char *req[] = { "kv_lora_rank", "qk_nope_head_dim", "v_head_dim" };
		uint32_t vals[] = { k->kv_lora_rank, k->qk_nope_head_dim, k->v_head_dim };
		for (size_t i = 0; i < 3; i++)
			if (!vals[i])
				return bad(c, req[i], "required when any layer is MLA (not in kda_layers)", NULL);
		if (!k->mla_use_nope)
			return bad(c, "mla_use_nope", "expected true (K3 MLA has no rotary embedding; RoPE MLA is not supported)", "false");
		if (k->num_key_value_heads != k->num_attention_heads) {
			snprintf(got, sizeof(got), "%u", k->num_key_value_heads);
			return bad(c, "num_key_value_heads", "expected num_attention_heads (MLA has no GQA)", got);
		}
	}
	if (k->n_dense && k->intermediate_size == 0)
		return bad(c, "intermediate_size", "required for dense layers", NULL);
	if (k->num_experts) {
		if (k->num_experts_per_token > k->num_experts) {
			snprintf(got, sizeof(got), "%u", k->num_experts_per_token);
			return bad(c, "num_experts_per_token", "expected at most num_experts", got);
		}
		if (k->topk_group > k->num_expert_group) {
			snprintf(got, sizeof(got), "%u", k->topk_group);
			return bad(c, "topk_group", "expected at most num_expert_group", got);
		}
		if (k->num_experts % k->num_expert_group) {
			snprintf(got, sizeof(got), "%u", k->num_expert_group);
			return bad(c, "num_expert_group", "expected a divisor of num_experts", got);
		}
		if (k->latent_moe_use_norm && !k->routed_expert_hidden_size)
			return bad(c, "latent_moe_use_norm", "true requires routed_expert_hidden_size", "true");
	}
	if (k->tie_word_embeddings && k->attn_res_block_size) {
		/* K3 keeps lm_head separate; a tied K3-style model is untested. */
		return bad(c, "tie_word_embeddings", "expected false (K3 stores a separate lm_head)", "true");
	}

	k->kda_width = k->kda_num_heads * k->kda_head_dim;
	k->mla_q_head_dim = k->qk_nope_head_dim + k->qk_rope_head_dim;
	k->mla_kv_a_width = k->kv_lora_rank + k->qk_rope_head_dim;
	k->mla_attn_width = k->num_attention_heads * k->v_head_dim;
	k->expert_in = k->routed_expert_hidden_size ? k->routed_expert_hidden_size : k->hidden_size;
	k->shared_width = k->moe_intermediate_size * k->num_shared_experts;
	if (k->kda_width > (1u << 24) || (uint64_t)k->num_attention_heads * k->mla_q_head_dim > (1u << 24) ||
	    (uint64_t)k->num_attention_heads * (k->qk_nope_head_dim + k->v_head_dim) > (1u << 24))
		return bad(c, "num_attention_heads", "heads x head dims exceed 2^24 (unsupported size)", NULL);
	return 0;
}

int k3_model_config_parse(const char *json, size_t len,
			  struct k3_model_config *out, struct k3_err *err)
{
	json_error_t je;
	json_t *root, *text, *top = NULL;
	struct cfgctx c = { "", err };
	int r;

	memset(out, 0, sizeof(*out));
	if (len > K3_MODEL_CONFIG_MAX)
		return k3_err_set(err, -EINVAL, "config.json: %zu bytes exceeds the %u byte limit",
				  len, K3_MODEL_CONFIG_MAX);
	root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &je);
	if (!root)
		return k3_err_set(err, -EINVAL, "config.json: invalid JSON at line %d column %d: %s",
				  je.line, je.column, je.text);
	if (!json_is_object(root)) {
		r = k3_err_set(err, -EINVAL, "config.json: expected a JSON object at the top level");
		goto out;
	}
	json_t *mt = json_object_get(root, "model_type");
	if (!mt || !json_is_string(mt)) {
		r = bad(&c, "model_type", "required string is missing (expected 'kimi_k3' or 'kimi_linear')",
			mt ? json_kind(mt) : NULL);
		goto out;
	}
	const char *type = json_string_value(mt);
	if (strcmp(type, "kimi_k3") == 0) {
		top = root;
		text = json_object_get(root, "text_config");
		if (!text || !json_is_object(text)) {
			r = bad(&c, "text_config", "required object is missing (model_type 'kimi_k3' keeps every text setting there)",
				text ? json_kind(text) : NULL);
			goto out;
		}
		c.prefix = "text_config.";
		json_t *tmt = json_object_get(text, "model_type");
		if (tmt && !(json_is_string(tmt) && strcmp(json_string_value(tmt), "kimi_linear") == 0)) {
			r = bad(&c, "model_type", "expected 'kimi_linear'",
				json_is_string(tmt) ? json_string_value(tmt) : json_kind(tmt));
			goto out;
		}
		out->has_language_model_prefix = true;
	} else if (strcmp(type, "kimi_linear") == 0) {
		text = root;
	} else {
		r = bad(&c, "model_type", "unsupported model type (expected 'kimi_k3' or 'kimi_linear')", type);
		goto out;
	}
	snprintf(out->model_type, sizeof(out->model_type), "%s", type);
	r = parse_text(&c, text, top, out);
	if (!r)
		r = derive(&c, out);
out:
	json_decref(root);
	return r;
}

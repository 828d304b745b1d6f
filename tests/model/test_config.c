/*
 * test_config.c - config.json parsing (docs/model.md §1): the real K3
 * text_config gives the §1.3 layer typing (24 MLA layers incl. 91 and 92,
 * layer 0 dense, AttnRes starts every 12), booleans are read by value, null
 * means the class default, a bare kimi_linear config parses, and each bad
 * value names its field.
 */
#include <errno.h>
#include <jansson.h>

#include "t.h"
#include "model/model.h"

/* The K3 text_config of §1.2 as a JSON object. */
static json_t *k3_text(void)
{
	json_t *kda = json_array(), *full = json_array();

	for (int l1 = 1; l1 <= 93; l1++)
		json_array_append_new((l1 % 4 == 0 || l1 == 93) ? full : kda, json_integer(l1));
	return json_pack(
		"{s:s,s:i,s:i,s:i,s:i,s:s,s:f,s:f,s:f,s:b,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,"
		"s:b,s:b,s:f,s:i,s:i,s:i,s:i,s:i,s:b,s:s,s:f,s:i,s:i,s:b,s:i,s:i,s:s,s:i,s:b,s:i,"
		"s:{s:o,s:o,s:i,s:i,s:i,s:f,s:b},s:i,s:i,s:i}",
		"model_type", "kimi_linear", "vocab_size", 163840, "hidden_size", 7168,
		"num_hidden_layers", 93, "intermediate_size", 33792, "hidden_act", "situ",
		"activation_situ_beta", 4.0, "activation_situ_linear_beta", 25.0, "rms_norm_eps", 1e-5,
		"tie_word_embeddings", 0, "attn_res_block_size", 12, "num_attention_heads", 96,
		"num_key_value_heads", 96, "q_lora_rank", 1536, "kv_lora_rank", 512,
		"qk_nope_head_dim", 128, "qk_rope_head_dim", 64, "v_head_dim", 128,
		"mla_use_nope", 1, "mla_use_output_gate", 1, "rope_theta", 10000.0,
		"max_position_embeddings", 1048576, "num_experts", 896, "num_experts_per_token", 16,
		"num_shared_experts", 2, "moe_intermediate_size", 3072, "moe_renormalize", 1,
		"moe_router_activation_func", "sigmoid", "routed_scaling_factor", 1.0,
		"first_k_dense_replace", 1, "moe_layer_freq", 1, "use_grouped_topk", 1,
		"num_expert_group", 1, "topk_group", 1, "topk_method", "noaux_tc",
		"routed_expert_hidden_size", 3584, "latent_moe_use_norm", 1,
		"num_nextn_predict_layers", 0,
		"linear_attn_config", "kda_layers", kda, "full_attn_layers", full, "num_heads", 96,
		"head_dim", 128, "short_conv_kernel_size", 4, "gate_lower_bound", -5.0,
		"use_full_rank_gate", 1,
		"bos_token_id", 163584, "eos_token_id", 163586, "pad_token_id", 163839);
}

static int parse(json_t *root, struct k3_model_config *c, struct k3_err *err)
{
	char *s = json_dumps(root, JSON_COMPACT);
	int r = k3_model_config_parse(s, strlen(s), c, err);

	free(s);
	return r;
}

static json_t *wrap(json_t *text)
{
	return json_pack("{s:s,s:o,s:i,s:{s:i}}", "model_type", "kimi_k3", "text_config", text,
			 "media_placeholder_token_id", 163605, "vision_config", "vt_hidden_size", 1024);
}

/* Sets text_config[field] := v, parses, and checks the message. */
static void expect_bad(const char *field, json_t *v, const char *n1)
{
	static struct k3_model_config c;
	struct k3_err err = { 0 };
	json_t *t = k3_text();

	json_object_set_new(t, field, v);
	json_t *root = wrap(t);
	T_EQ_INT(parse(root, &c, &err), -EINVAL);
	if (!T_OK(strstr(err.msg, n1) != NULL))
		printf("     message: %s\n", err.msg);
	json_decref(root);
}

int main(void)
{
	static struct k3_model_config c;
	struct k3_err err = { 0 };
	json_t *root = wrap(k3_text());

	T_EQ_INT(parse(root, &c, &err), 0);
	if (err.msg[0])
		printf("     %s\n", err.msg);
	json_decref(root);
	T_EQ_STR(c.model_type, "kimi_k3");
	T_OK(c.has_language_model_prefix);
	T_EQ_INT(c.n_kda, 69);
	T_EQ_INT(c.n_mla, 24);
	T_OK(!c.is_kda[91] && !c.is_kda[92] && !c.is_kda[3] && c.is_kda[0] && c.is_kda[90]);
	T_EQ_INT(c.n_moe, 92);
	T_OK(!c.is_moe[0] && c.is_moe[1] && c.is_moe[92]);
	T_EQ_INT(c.n_attn_res_blocks, 8);
	for (uint32_t l = 0; l < 93; l++)
		T_EQ_INT(c.is_block_start[l], l % 12 == 0);
	T_EQ_INT(c.kda_width, 12288);
	T_EQ_INT(c.mla_q_head_dim, 192);
	T_EQ_INT(c.mla_kv_a_width, 576);
	T_EQ_INT(c.mla_attn_width, 12288);
	T_EQ_INT(c.expert_in, 3584);
	T_EQ_INT(c.shared_width, 6144);
	T_NEAR(c.situ_beta, 4.0, 0);
	T_NEAR(c.rms_norm_eps, 1e-5, 1e-12);
	T_EQ_INT(c.media_placeholder_token_id, 163605);   /* from the top level */
	T_EQ_INT(c.eos_token_id, 163586);
	T_OK(c.gate_lower_bound_set && c.use_full_rank_gate && c.latent_moe_use_norm);

	/* booleans by value: false stays false although the key is present */
	json_t *t = k3_text();
	json_object_set_new(t, "moe_renormalize", json_false());
	json_object_set_new(t, "mla_use_output_gate", json_false());
	json_object_set_new(json_object_get(t, "linear_attn_config"), "use_full_rank_gate", json_false());
	/* null -> class default (§1.2) */
	json_object_set_new(t, "activation_situ_linear_beta", json_null());
	json_object_set_new(json_object_get(t, "linear_attn_config"), "gate_lower_bound", json_null());
	json_object_set_new(t, "num_key_value_heads", json_null());
	root = wrap(t);
	T_EQ_INT(parse(root, &c, &err), 0);
	json_decref(root);
	T_OK(!c.moe_renormalize && !c.mla_use_output_gate && !c.use_full_rank_gate);
	T_OK(!c.situ_linear_beta_set && !c.gate_lower_bound_set);
	T_EQ_INT(c.num_key_value_heads, 96);

	/* a bare kimi_linear text config: no prefix, same typing */
	t = k3_text();
	T_EQ_INT(parse(t, &c, &err), 0);
	json_decref(t);
	T_EQ_STR(c.model_type, "kimi_linear");
	T_OK(!c.has_language_model_prefix);
	T_EQ_INT(c.n_mla, 24);
	T_EQ_INT(c.media_placeholder_token_id, -1);

	/* refusals, each naming its field */
	expect_bad("mla_use_nope", json_false(), "text_config.mla_use_nope: expected true");
	expect_bad("moe_renormalize", json_integer(1), "text_config.moe_renormalize: expected true or false");
	expect_bad("hidden_size", json_string("7168"), "text_config.hidden_size: expected an integer");
	expect_bad("num_hidden_layers", json_integer(1000), "num_hidden_layers: expected an integer in [1, 256]");
	expect_bad("num_experts_per_token", json_integer(900), "num_experts_per_token");
	expect_bad("hidden_act", json_string("gelu"), "text_config.hidden_act: expected 'situ' or 'silu', got 'gelu'");
	expect_bad("moe_router_activation_func", json_string("relu"), "moe_router_activation_func");
	expect_bad("num_key_value_heads", json_integer(8), "num_key_value_heads: expected num_attention_heads");
	expect_bad("vocab_size", json_null(), "text_config.vocab_size: required");
	expect_bad("kv_lora_rank", json_null(), "kv_lora_rank: required when any layer is MLA");
	expect_bad("rms_norm_eps", json_real(-1.0), "rms_norm_eps");
	expect_bad("topk_method", json_string("greedy"), "topk_method");
	expect_bad("linear_attn_config", json_pack("{s:[i,i],s:i,s:i}", "kda_layers", 0, 5, "num_heads", 96,
						   "head_dim", 128),
		   "kda_layers: entry out of range [1, num_hidden_layers] (the list is 1-based), got '0'");
	expect_bad("linear_attn_config", json_pack("{s:[i,i],s:i,s:i}", "kda_layers", 5, 5, "num_heads", 96,
						   "head_dim", 128), "kda_layers: duplicate entry");
	expect_bad("linear_attn_config", json_pack("{s:[i],s:i}", "kda_layers", 5, "num_heads", 96),
		   "linear_attn_config.head_dim: required");

	/* top level problems */
	root = json_pack("{s:s}", "model_type", "deepseek_v3");
	T_EQ_INT(parse(root, &c, &err), -EINVAL);
	T_OK(strstr(err.msg, "model_type: unsupported model type") && strstr(err.msg, "'deepseek_v3'"));
	json_decref(root);
	root = json_pack("{s:s}", "model_type", "kimi_k3");
	T_EQ_INT(parse(root, &c, &err), -EINVAL);
	T_OK(strstr(err.msg, "text_config") != NULL);
	json_decref(root);
	t = k3_text();
	json_object_set_new(t, "model_type", json_string("llama"));
	root = wrap(t);
	T_EQ_INT(parse(root, &c, &err), -EINVAL);
	T_OK(strstr(err.msg, "text_config.model_type: expected 'kimi_linear'") != NULL);
	json_decref(root);
	T_EQ_INT(k3_model_config_parse("{\"model_type\": \"kimi_k3\",", 24, &c, &err), -EINVAL);
	T_OK(strstr(err.msg, "invalid JSON") != NULL);
	T_EQ_INT(k3_model_config_parse("{\"a\":1,\"a\":2}", 13, &c, &err), -EINVAL);
	return t_done();
}

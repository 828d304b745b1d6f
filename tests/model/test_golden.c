/*
 * test_golden.c - every checkpoint in ../shared/golden/forward/<case>/model
 * (written by an independent tool) opens, and every tensor's dtype, shape
 * and SHA-256 match <case>/tensors.json; the config and plan agree with the
 * README's table.
 */
#include <dirent.h>
#include <jansson.h>
#include <openssl/evp.h>

#include "t.h"
#include "model/model.h"

static void sha256_hex(const void *p, size_t n, char out[65])
{
	unsigned char md[32];
	unsigned int len = 0;

	EVP_Digest(p, n, md, &len, EVP_sha256(), NULL);
	for (int i = 0; i < 32; i++)
		snprintf(out + 2 * i, 3, "%02x", md[i]);
}

static void check_case(const char *name, uint32_t hidden, uint32_t layers, uint32_t experts,
		       uint32_t topk, uint32_t block, const uint32_t *mla, size_t n_mla)
{
	char rel[256];
	struct k3_model *m = NULL;
	struct k3_err err = { 0 };

	snprintf(rel, sizeof(rel), "golden/forward/%s/model", name);
	int r = k3_model_open(t_shared_path(rel), &m, &err);
	T_EQ_INT(r, 0);
	if (r) {
		printf("     %s: %s\n", name, err.msg);
		return;
	}
	const struct k3_model_config *c = k3_model_config(m);
	T_EQ_INT(c->hidden_size, hidden);
	T_EQ_INT(c->num_hidden_layers, layers);
	T_EQ_INT(c->num_experts, experts);
	T_EQ_INT(c->num_experts_per_token, topk);
	T_EQ_INT(c->attn_res_block_size, block);
	T_EQ_INT(c->num_shared_experts, 2);
	T_EQ_INT(c->hidden_act, K3_ACT_SITU);
	T_OK(c->has_language_model_prefix);
	T_OK(c->latent_moe_use_norm && c->mla_use_output_gate && c->use_full_rank_gate);
	T_NEAR(c->gate_lower_bound, -5.0, 0);
	T_NEAR(c->situ_linear_beta, 25.0, 0);
	T_EQ_INT(c->n_mla, n_mla);
	for (size_t i = 0; i < n_mla; i++)
		T_OK(!c->is_kda[mla[i] - 1]);
	T_EQ_INT(c->n_kda, layers - n_mla);
	T_OK(!c->is_moe[0]);
	for (uint32_t l = 1; l < layers; l++)
		T_OK(c->is_moe[l]);
	T_EQ_INT(c->bos_token_id, c->vocab_size - 8);

	/* tensors.json: same set, same dtype/shape, same bytes */
	snprintf(rel, sizeof(rel), "golden/forward/%s/tensors.json", name);
	json_error_t je;
	json_t *tj = json_load_file(t_shared_path(rel), 0, &je);
	T_OK(tj != NULL);
	size_t n;
	const struct k3_tensor *all = k3_model_tensors(m, &n);
	T_EQ_U64(n, json_object_size(tj));
	const char *key;
	json_t *v;
	size_t matched = 0;
	json_object_foreach(tj, key, v) {
		const struct k3_tensor *t = k3_model_tensor(m, key);
		if (!T_OK(t != NULL)) {
			printf("     missing %s\n", key);
			continue;
		}
		T_EQ_STR(k3_dtype_name(t->dtype), json_string_value(json_object_get(v, "dtype")));
		json_t *sh = json_object_get(v, "shape");
		T_EQ_INT(t->ndim, json_array_size(sh));
		for (size_t i = 0; i < json_array_size(sh) && i < t->ndim; i++)
			T_EQ_U64(t->shape[i], json_integer_value(json_array_get(sh, i)));
		char hex[65];
		sha256_hex(t->data, (size_t)t->nbytes, hex);
		if (strcmp(hex, json_string_value(json_object_get(v, "sha256"))) == 0)
			matched++;
		else
			T_EQ_STR(hex, json_string_value(json_object_get(v, "sha256")));
	}
	T_EQ_U64(matched, n);
	json_decref(tj);
	(void)all;

	/* plan: every role of every layer is present */
	const struct k3_model_plan *p = k3_model_plan(m);
	T_OK(p->embed_tokens && p->lm_head && p->norm && p->output_attn_res_norm &&
	     p->output_attn_res_proj);
	T_EQ_INT(p->n_layers, layers);
	for (uint32_t l = 0; l < p->n_layers; l++) {
		const struct k3_layer_plan *y = &p->layers[l];
		T_OK(y->input_layernorm && y->mlp_res_proj && y->self_attention_res_norm);
		if (y->is_kda)
			T_OK(y->kda.q_proj && y->kda.a_log && y->kda.g_proj && y->kda.o_proj &&
			     y->kda.q_conv1d && y->kda.dt_bias && !y->kda.g_a_proj);
		else
			T_OK(y->mla.q_a_proj && y->mla.kv_b_proj && y->mla.g_proj && !y->mla.q_proj);
		if (y->is_moe) {
			T_OK(y->moe.gate && y->moe.routed_expert_norm && y->moe.shared_experts.down_proj);
			T_EQ_INT(y->moe.n_experts, experts);
			for (uint32_t e = 0; e < y->moe.n_experts; e++) {
				const struct k3_expert *x = &y->moe.experts[e];
				T_OK(x->w1.mxfp4 && x->w2.mxfp4 && x->w3.mxfp4);
				T_OK(x->span_one_shard && x->span_contiguous);
				uint64_t want = 3 * ((uint64_t)c->moe_intermediate_size * c->expert_in / 2 +
						     (uint64_t)c->moe_intermediate_size * c->expert_in / 32);
				T_EQ_U64(x->span_bytes, want);
			}
		} else {
			T_OK(y->mlp.gate_proj && y->mlp.up_proj && y->mlp.down_proj);
		}
	}
	/* the A_log rule: at least num_heads entries, stored padded */
	T_OK(p->layers[0].kda.a_log->nelem >= c->kda_num_heads);
	/* file offsets let the store pread exactly the mapped bytes */
	const struct k3_tensor *t = p->layers[1].moe.experts[0].w2.scale;
	FILE *f = fopen(k3_model_shard_path(m, t->shard), "rb");
	unsigned char buf[4096];
	T_OK(f && t->nbytes <= sizeof(buf));
	if (f) {
		fseek(f, (long)t->file_offset, SEEK_SET);
		T_EQ_U64(fread(buf, 1, (size_t)t->nbytes, f), t->nbytes);
		T_EQ_MEM(buf, t->data, (size_t)t->nbytes);
		fclose(f);
	}
	k3_model_free(m);
}

int main(void)
{
	static const uint32_t mla_a[] = { 4, 8 };
	static const uint32_t mla_b[] = { 4, 8, 12, 13 };

	check_case("k3tiny_a", 96, 8, 16, 4, 3, mla_a, 2);
	check_case("k3tiny_b", 128, 13, 32, 6, 4, mla_b, 4);
	return t_done();
}

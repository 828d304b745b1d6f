/*
 * test_draft_dspark.c - the DSpark draft format (docs/text-and-draft.md §4):
 *   - the synthetic draft `k3ctl demo-model --draft` writes (k3_demo_write_draft)
 *     loads against its target; its taps, block and RoPE come from its
 *     config;
 *   - proposals are deterministic, in the vocabulary, a whole block, and
 *     depend on the context rows accepted from the target;
 *   - in the draft/verify/commit loop (block of 7 checked 8 wide) the ids
 *     equal plain decoding, and only committed rows become context;
 *   - corrupt drafts are refused with a precise message: each edit of the
 *     config or of the tensor table below, one at a time, and the message
 *     names what is wrong.
 */
#include <errno.h>
#include <unistd.h>

#include "t.h"

#include "demo/demo.h"
#include "draft/draft_dspark.h"
#include "draft/draft_run.h"
#include "engine/engine.h"
#include "model/model.h"

static char root[64];

static bool sh(const char *fmt, const char *a, const char *b)
{
	char cmd[1024];
	snprintf(cmd, sizeof(cmd), fmt, a, b);
	return system(cmd) == 0;
}

/* Replaces the first `from` in file path by `to` (byte edit). */
static bool edit_file(const char *path, const char *from, const char *to)
{
	size_t n;
	unsigned char *b = t_read_file(path, &n);
	if (!b)
		return false;
	char *at = strstr((char *)b, from);
	if (!at && memmem(b, n, from, strlen(from)))
		at = memmem(b, n, from, strlen(from));
	if (!at) {
		free(b);
		printf("     '%s' not found in %s\n", from, path);
		return false;
	}
	FILE *f = fopen(path, "wb");
	size_t off = (size_t)(at - (char *)b), fl = strlen(from);
	bool ok = f && fwrite(b, 1, off, f) == off && fwrite(to, 1, strlen(to), f) == strlen(to) &&
		  fwrite(b + off + fl, 1, n - off - fl, f) == n - off - fl;
	if (f)
		ok = fclose(f) == 0 && ok;
	free(b);
	return ok;
}

/* A fresh copy of the good draft in ROOT/bad; bad := its directory and
 * path := its `file`. */
static bool fresh_copy(const char *file, char *bad, size_t nb, char *path, size_t np)
{
	char good[128];
	snprintf(good, sizeof(good), "%s/draft", root);
	snprintf(bad, nb, "%s/bad", root);
	snprintf(path, np, "%s/%s", bad, file);
	return T_OK(sh("rm -rf '%s'%s", bad, "") && sh("cp -r '%s' '%s'", good, bad));
}

/* Copies the good draft to DIR/bad, applies one edit to `file`, opens it
 * and checks the error names `want`. */
static void refused(struct k3_engine *e, const char *file, const char *from, const char *to,
		    int code, const char *want)
{
	char bad[128], path[256];
	struct k3_err err = { 0 };
	struct k3_draft *d = NULL;

	if (!fresh_copy(file, bad, sizeof(bad), path, sizeof(path)))
		return;
	if (!T_OK(edit_file(path, from, to)))
		return;
	int rc = k3_draft_dspark_open(bad, e, &d, &err);
	T_EQ_INT(rc, code);
	if (!T_OK(strstr(err.msg, want) != NULL))
		printf("     edit '%s' -> '%s': message '%s' lacks '%s'\n", from, to, err.msg, want);
	k3_draft_free(d);
}

static void corrupt_cases(struct k3_engine *e)
{
	/* one edit each: the file, what is replaced and by what, and what the
	 * message must say (config.json, then the tensor table through
	 * same-length edits of the safetensors header) */
	static const struct { const char *file, *from, *to, *want; } cases[] = {
		{ "config.json", "\"k3_dspark\"", "\"deepseek_v2\"",
		  "model_type \"deepseek_v2\" is not \"k3_dspark\"" },
		{ "config.json", "\"rms_norm_eps\"", "\"rms_norm_epz\"", "'rms_norm_eps' is missing" },
		{ "config.json", "\"yarn\"", "\"ntk\"", "rope_parameters.rope_type 'ntk' is not supported" },
		{ "config.json", "\"beta_fast\"", "\"beta_fist\"",
		  "rope_parameters: config.json: 'beta_fast' is missing" },
		{ "config.json", "\"target_num_hidden_layers\": 9", "\"target_num_hidden_layers\": 93",
		  "made for a target with hidden size 128 and 93 layers; this model has 128 and 9" },
		{ "config.json", "\"target_layer_ids\": [\n    0", "\"target_layer_ids\": [\n    3",
		  "target_layer_ids[1] must be a layer index below target_num_hidden_layers 9, above the one before" },
		{ "config.json", "\"mla_use_nope\": false", "\"mla_use_nope\": true",
		  "mla_use_nope true is not a DSpark draft" },
		{ "config.json", "\"mask_token_id\": 2301", "\"mask_token_id\": 9999",
		  "mask_token_id 9999 is outside the vocabulary (2304 ids)" },
		{ "config.json", "\"qk_rope_head_dim\": 16", "\"qk_rope_head_dim\": 15",
		  "qk_rope_head_dim 15 must be even" },
		{ "config.json", "\"draft_vocab_size\": 2304", "\"draft_vocab_size\": 1000",
		  "draft_vocab_size 1000 differs from vocab_size 2304" },
		{ "config.json", "\"num_hidden_layers\": 2", "\"num_hidden_layers\": 3",
		  "tensor 'layers.2.input_layernorm.weight' is missing" },
		{ "model.safetensors", "\"final_norm.weight\"", "\"final_norX.weight\"",
		  "tensor 'final_norX.weight' is not part of the DSpark format" },
		{ "model.safetensors", "\"layers.1.mlp.up_proj.weight\"", "\"layers.1.mlp.up_prox.weight\"",
		  "tensor 'layers.1.mlp.up_prox.weight' is not part of the DSpark format" },
		{ "model.safetensors", "\"layers.0.self_attn.kv_b_proj.weight\":{\"dtype\":\"BF16\"",
		  "\"layers.0.self_attn.kv_b_proj.weight\":{\"dtype\":\"F16\" ",
		  "tensor 'layers.0.self_attn.kv_b_proj.weight' must be BF16 [128, 32]" },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		refused(e, cases[i].file, cases[i].from, cases[i].to, -EINVAL, cases[i].want);
	/* truncated shard: the safetensors reader says so */
	char path[256], bad[128];
	struct k3_err err = { 0 };
	struct k3_draft *d = NULL;
	if (fresh_copy("model.safetensors", bad, sizeof(bad), path, sizeof(path)) &&
	    T_OK(truncate(path, 4096) == 0)) {
		T_EQ_INT(k3_draft_dspark_open(bad, e, &d, &err), -EINVAL);
		T_OK(strstr(err.msg, "model.safetensors") != NULL);
		printf("  truncated: %s\n", err.msg);
	}
	/* no draft at all */
	T_EQ_INT(k3_draft_dspark_open(root, e, &d, &err), -ENOENT);
}

int main(void)
{
	struct k3_err err = { 0 };
	struct k3_demo_opts o = { .preset = K3_DEMO_NANO, .seed = 5 };
	struct k3_model *model = NULL;
	struct k3_engine *e = NULL;
	struct k3_draft *d = NULL;
	char tdir[128], ddir[128];

	snprintf(root, sizeof(root), "/tmp/k3_dspark_XXXXXX");
	if (!mkdtemp(root))
		return t_skip("no temporary directory");
	snprintf(tdir, sizeof(tdir), "%s/target", root);
	snprintf(ddir, sizeof(ddir), "%s/draft", root);
	if (!T_OK(k3_demo_write(tdir, &o, &err) == 0) || !T_OK(k3_model_open(tdir, &model, &err) == 0) ||
	    !T_OK(k3_demo_write_draft(ddir, model, o.seed, &err) == 0)) {
		printf("     %s\n", err.msg);
		return t_done();
	}
	struct k3_engine_opts eo = { .threads = 1, .max_chunk = 16 };
	if (!T_OK(k3_engine_open(model, &eo, &e, &err) == 0) ||
	    !T_OK(k3_draft_dspark_open(ddir, e, &d, &err) == 0)) {
		printf("     %s\n", err.msg);
		return t_done();
	}
	T_EQ_STR(k3_draft_dspark_describe(d), "2 layers, 4 heads, block 7, taps 0,2,4,6,8, YaRN x32");
	T_EQ_INT(d->n_taps, 5);
	T_EQ_INT(d->max_block, 7);
	/* the draft's embed_tokens is a byte copy of the target's */
	struct k3_model *dm = NULL;
	if (T_OK(k3_model_open_tensors(ddir, &dm, &err) == 0)) {
		const struct k3_tensor *a = k3_model_tensor(dm, "embed_tokens.weight");
		const struct k3_tensor *b = k3_model_plan(model)->embed_tokens;
		T_OK(a && b && a->nbytes == b->nbytes && memcmp(a->data, b->data, a->nbytes) == 0);
		k3_model_free(dm);
	}

	/* proposals: a block, in the vocabulary, deterministic, and a function
	 * of the accepted context rows */
	uint32_t V = k3_engine_vocab(e), ctx[12], p1[7], p2[7], p3[7];
	for (int i = 0; i < 12; i++)
		ctx[i] = (uint32_t)(i * 97 + 5) % V;
	T_EQ_INT(k3_draft_propose(d, ctx, 12, 7, p1, &err), 7);
	T_EQ_INT(k3_draft_propose(d, ctx, 12, 7, p2, &err), 7);
	T_EQ_MEM(p1, p2, sizeof(p1));
	T_EQ_INT(k3_draft_propose(d, ctx, 12, 3, p3, &err), 3);
	T_EQ_MEM(p1, p3, 3 * sizeof(uint32_t));     /* fewer rows, same Markov chain */
	for (int i = 0; i < 7; i++)
		T_OK(p1[i] < V);
	/* rows from a real target pass change the proposal */
	struct k3_draft_run *r = NULL;
	struct k3_draft_run_opts ro = { .draft = d, .fixed_width = 7 };
	struct k3_engine_seq *s = NULL;
	float *logits = malloc(V * sizeof(float));
	struct k3_engine_out out = { K3_ENGINE_LOGITS_LAST, logits, NULL, NULL };
	T_OK(k3_draft_run_new(e, &ro, &r, &err) == 0);
	T_OK(k3_engine_seq_new(e, 16, &s, &err) == 0);
	k3_draft_reset(d);
	T_OK(k3_draft_run_prefill(r, s, (const int32_t *)ctx, 11, &out, &err) == 0);
	T_EQ_INT(k3_draft_propose(d, ctx, 12, 7, p2, &err), 7);
	T_OK(memcmp(p1, p2, sizeof(p1)) != 0);
	T_EQ_INT(k3_draft_propose(d, ctx, 12, 7, p3, &err), 7);
	T_EQ_MEM(p2, p3, sizeof(p2));               /* a proposal leaves no context behind */

	/* in the loop: block of 7 checked 8 wide; the ids of plain decoding */
	uint32_t ids[64] = { 0 }, ref[64] = { 0 };
	uint32_t tok = k3_engine_argmax(logits, V);
	memcpy(ids, ctx, 11 * sizeof(uint32_t));
	uint32_t n = 11, passes = 0, widest = 0;
	while (n < 40) {
		struct k3_draft_pass p;
		ids[n++] = tok;
		if (!T_OK(k3_draft_run_pass(r, s, ids, n, 63 - n, &p, &err) == 0))
			break;
		passes++;
		widest = p.n_drafts > widest ? p.n_drafts : widest;
		for (uint32_t i = 0; i < p.accepted; i++)
			ids[n++] = p.drafts[i];
		T_OK(k3_draft_run_commit(r, s, p.accepted + 1, &err) == 0);
		/* the context is exactly the committed positions 0..len-1 */
		uint32_t cf, cn;
		k3_draft_dspark_context(d, &cf, &cn);
		T_OK(cf == 0 && cn == k3_engine_seq_len(s));
		tok = p.next[p.accepted];
	}
	T_EQ_INT(widest, 7);
	T_EQ_INT(k3_engine_seq_len(s), n);
	/* plain decoding of the same prompt */
	struct k3_engine_seq *s2 = NULL;
	T_OK(k3_engine_seq_new(e, 16, &s2, &err) == 0);
	memcpy(ref, ctx, 11 * sizeof(uint32_t));
	T_OK(k3_engine_forward(e, s2, (const int32_t *)ctx, 11, &out, &err) == 0);
	for (uint32_t i = 11; i < n; i++) {
		ref[i] = k3_engine_argmax(logits, V);
		T_OK(k3_engine_forward(e, s2, (const int32_t *)&ref[i], 1, &out, &err) == 0);
	}
	T_EQ_MEM(ids, ref, n * sizeof(uint32_t));
	printf("dspark loop: %u ids in %u passes, %llu of %llu proposals accepted\n", n - 11, passes,
	       (unsigned long long)k3_draft_run_stats(r)->accepted,
	       (unsigned long long)k3_draft_run_stats(r)->proposed);
	k3_engine_seq_free(s2);
	k3_engine_seq_free(s);
	k3_draft_run_free(r);
	free(logits);

	corrupt_cases(e);
	k3_draft_free(d);
	k3_engine_free(e);
	k3_model_free(model);
	sh("rm -rf '%s'%s", root, "");
	return t_done();
}

/*
 * cmd_demo_model.c - `k3ctl demo-model --out DIR [--preset
 * nano|small|bench|k3-sparse|trained] [--seed N] [overrides] [--draft DIR]`:
 * writes a synthetic K3 checkpoint in the exact Hugging Face layout (see
 * daemon/demo/demo.h and docs/formats.md), and with --draft a matching
 * DSpark-format draft (docs/draft.md); k3-sparse is the release's layout at
 * full size as sparse files (docs/plan.md). `--preset trained` instead
 * installs the trained demo checkpoint embedded in k3ctl (demo_trained.h,
 * tools/train_demo/): fixed bytes, no options but --draft.
 */
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "base/parse.h"
#include "demo_trained.h"
#include "k3ctl.h"
#include "demo/demo.h"
#include "draft/draft_dspark.h"
#include "engine/engine.h"
#include "model/model.h"

static const struct {
	const char *flag;
	size_t off;
} dims[] = {
#define D_(f, m) { f, offsetof(struct k3_demo_opts, m) }
	D_("--layers", layers), D_("--hidden", hidden), D_("--vocab", vocab),
	D_("--intermediate", intermediate), D_("--experts", experts), D_("--top-k", top_k),
	D_("--moe-intermediate", moe_intermediate), D_("--latent", latent),
	D_("--shared-experts", shared_experts), D_("--kda-heads", kda_heads),
	D_("--kda-head-dim", kda_head_dim), D_("--mla-heads", mla_heads), D_("--q-lora", q_lora),
	D_("--kv-lora", kv_lora), D_("--nope", nope), D_("--rope", rope), D_("--v-head", v_head),
	D_("--attn-res-block", attn_res_block), D_("--shards", shards),
#undef D_
};

/* --draft DIR: the matching DSpark-format draft, then the proof that
 * k3d's loader accepts it for this model. */
static int write_draft(const char *dir, const struct k3_model *m, uint64_t seed)
{
	struct k3_err err = { 0, "" };
	struct k3_engine_opts eo = { .threads = 1, .max_chunk = 8 };
	struct k3_engine *e = NULL;
	struct k3_draft *d = NULL;

	if (k3_demo_write_draft(dir, m, seed, &err))
		return k3ctl_fail(K3CTL_EXIT_ERROR, "demo-model --draft: %s", err.msg);
	if (k3_engine_open(m, &eo, &e, &err) || k3_draft_dspark_open(dir, e, &d, &err)) {
		k3_engine_free(e);
		return k3ctl_fail(K3CTL_EXIT_ERROR, "demo-model --draft: the written draft does not "
				  "load: %s", err.msg);
	}
	if (k3ctl_g.json)
		printf("{\"draft\":\"%s\",\"format\":\"dspark\",\"summary\":\"%s\"}\n", dir,
		       k3_draft_dspark_describe(d));
	else
		printf("wrote %s: DSpark-format draft, %s\n", dir, k3_draft_dspark_describe(d));
	k3_draft_free(d);
	k3_engine_free(e);
	return K3CTL_EXIT_OK;
}

static void usage(void)
{
	fprintf(stderr,
		"usage: k3ctl demo-model --out DIR [--preset nano|small|bench|k3-sparse|trained] [--seed N]\n"
		"       [--layers N] [--hidden N] [--vocab N] [--intermediate N] [--experts N]\n"
		"       [--top-k N] [--moe-intermediate N] [--latent N] [--shared-experts N]\n"
		"       [--kda-heads N] [--kda-head-dim N] [--mla-heads N] [--q-lora N]\n"
		"       [--kv-lora N] [--nope N] [--rope N] [--v-head N] [--attn-res-block N]\n"
		"       [--shards N] [--draft DIR]\n"
		"       (--preset trained installs the shipped trained checkpoint; it takes no other option\n"
		"       but --draft)\n"
		"  --draft DIR  also write a synthetic DSpark-format draft for this model\n");
}

int k3ctl_cmd_demo_model(int argc, char **argv)
{
	struct k3_demo_opts o = { .preset = K3_DEMO_NANO, .seed = 1 };
	const char *out = NULL, *draft = NULL;
	struct k3_err err = { 0, "" };
	uint64_t v;
	bool trained = false, other = false;

	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
			usage();
			return K3CTL_EXIT_OK;
		}
		if (i + 1 >= argc)
			return k3ctl_usage("demo-model", "'%s' needs a value (or is unknown)", a);
		const char *val = argv[++i];
		if (strcmp(a, "--out") == 0) {
			out = val;
		} else if (strcmp(a, "--draft") == 0) {
			draft = val;
		} else if (strcmp(a, "--preset") == 0) {
			trained = strcmp(val, "trained") == 0;
			if (!trained && k3_demo_preset_parse(val, &o.preset))
				return k3ctl_usage("demo-model", "--preset '%s': expected nano, small, bench, "
						   "k3-sparse or trained", val);
		} else if (strcmp(a, "--seed") == 0) {
			other = true;
			if (k3_parse_u64(val, 0, UINT64_MAX, &o.seed, &err))
				return k3ctl_usage("demo-model", "--seed: %s", err.msg);
		} else {
			size_t k;
			for (k = 0; k < sizeof(dims) / sizeof(dims[0]); k++)
				if (strcmp(a, dims[k].flag) == 0)
					break;
			if (k == sizeof(dims) / sizeof(dims[0]))
				return k3ctl_usage("demo-model", "unknown option '%s'", a);
			if (k3_parse_u64(val, 1, 1u << 24, &v, &err))
				return k3ctl_usage("demo-model", "%s: %s", a, err.msg);
			*(uint32_t *)((char *)&o + dims[k].off) = (uint32_t)v;
			other = true;
		}
	}
	if (!out)
		return k3ctl_usage("demo-model", "--out DIR is required");
	if (trained && other)
		return k3ctl_usage("demo-model", "--preset trained is a fixed checkpoint: it takes no --seed or dimension option");

	struct k3_demo_dims d = { 0 };
	if (!trained && k3_demo_resolve(&o, &d, &err))
		return k3ctl_usage("demo-model", "%s", err.msg);
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	unsigned long long written;
	if (trained ? k3ctl_trained_install(out, &written, &err) : k3_demo_write(out, &o, &err))
		return k3ctl_fail(K3CTL_EXIT_ERROR, "demo-model: %s", err.msg);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	/* prove the result loads exactly as a real checkpoint would */
	struct k3_model *m;
	if (k3_model_open(out, &m, &err))
		return k3ctl_fail(K3CTL_EXIT_ERROR, "demo-model: the written checkpoint does not load: %s", err.msg);
	const struct k3_model_config *c = k3_model_config(m);
	size_t n;
	const struct k3_tensor *t = k3_model_tensors(m, &n);
	uint64_t bytes = 0;
	for (size_t i = 0; i < n; i++)
		bytes += t[i].nbytes;
	double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
	/* What the shards cost on disk (k3-sparse: the headers; the rest are holes). */
	bool sparse = !trained && d.sparse;
	uint64_t apparent = 0, disk = 0;
	for (uint32_t i = 0; i < k3_model_shard_count(m); i++) {
		struct stat st;
		if (stat(k3_model_shard_path(m, i), &st) == 0) {
			apparent += (uint64_t)st.st_size;
			disk += (uint64_t)st.st_blocks * 512;
		}
	}
	if (k3ctl_g.json)
		printf("{\"out\":\"%s\",\"trained\":%s,\"tensors\":%zu,\"bytes\":%llu,\"shards\":%u,\"layers\":%u,"
		       "\"seconds\":%.3f,\"apparent_bytes\":%llu,\"disk_bytes\":%llu,\"sparse\":%s}\n", out,
		       trained ? "true" : "false", n, (unsigned long long)bytes, k3_model_shard_count(m),
		       c->num_hidden_layers, s, (unsigned long long)apparent, (unsigned long long)disk,
		       sparse ? "true" : "false");
	else if (sparse)
		printf("wrote %s: Kimi K3's layout, %u layers, %u experts/layer (top-%u), %zu tensors, "
		       "%.3f TB apparent in %u shards, %.1f MB on disk (%.2f s)\n%s\n", out,
		       c->num_hidden_layers, c->num_experts, c->num_experts_per_token, n,
		       (double)apparent / 1e12, k3_model_shard_count(m), (double)disk / 1e6, s,
		       K3_DEMO_SPARSE_NOTE);
	else
		printf("wrote %s%s: %u layers, hidden %u, %u experts/layer (top-%u), vocab %u, %zu tensors, %.1f MB in %u shards (%.2f s)\n",
		       out, trained ? " (the trained demo model, every file SHA-256 checked)" : "",
		       c->num_hidden_layers, c->hidden_size, c->num_experts, c->num_experts_per_token,
		       c->vocab_size, n, (double)bytes / 1e6, k3_model_shard_count(m), s);
	int rc = draft ? write_draft(draft, m, o.seed) : K3CTL_EXIT_OK;
	k3_model_free(m);
	return rc;
}

/*
 * cmd_inspect.c - `k3ctl inspect DIR [--ram SIZE] [--json]`: layers by
 * type, experts per layer, bytes by role (embedding, spine per layer,
 * experts per layer, per-expert span), totals, and what fits in a RAM
 * budget (default: min(physical RAM, the cgroup's memory.max)). Reads
 * headers only; works offline, no daemon needed.
 */
#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/parse.h"
#include "json_fields.h"
#include "k3ctl.h"
#include "model/inspect.h"
#include "model/model.h"

static uint64_t default_ram(void)
{
	long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
	uint64_t ram = pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : 0;
	FILE *f = fopen("/sys/fs/cgroup/memory.max", "r");
	char line[64];

	if (f) {
		uint64_t lim;
		if (fgets(line, sizeof(line), f)) {
			line[strcspn(line, "\n")] = '\0';
			if (k3_parse_u64(line, 1, UINT64_MAX, &lim, NULL) == 0 && lim < ram)
				ram = lim;
		}
		fclose(f);
	}
	return ram;
}

/* What the per-expert span is made of, for the largest expert (the one
 * the span names): MXFP4 packed values, their E8M0 scales, and weights
 * in any other dtype (a BF16 expert). Three bare numbers for one expert
 * (inspect's span, plan's slot, k3d's slot) puzzled readers. */
struct expert_parts {
	uint64_t packed, scales, other;
};

static void expert_parts(const struct k3_model_plan *p, uint64_t span, struct expert_parts *x)
{
	memset(x, 0, sizeof(*x));
	for (uint32_t l = 0; l < p->n_layers; l++) {
		if (!p->layers[l].is_moe)
			continue;
		for (uint32_t e = 0; e < p->layers[l].moe.n_experts; e++) {
			const struct k3_expert *ex = &p->layers[l].moe.experts[e];
			const struct k3_expert_proj *w[3] = { &ex->w1, &ex->w2, &ex->w3 };
			if (ex->payload_bytes != span)
				continue;
			for (int i = 0; i < 3; i++) {
				x->packed += w[i]->packed ? w[i]->packed->nbytes : 0;
				x->scales += w[i]->scale ? w[i]->scale->nbytes : 0;
				x->other += w[i]->weight ? w[i]->weight->nbytes : 0;
			}
			return;
		}
	}
}

static void human(char *buf, size_t n, uint64_t b)
{
	if (b >= (1ull << 30))
		snprintf(buf, n, "%.2f GiB", (double)b / (double)(1ull << 30));
	else if (b >= (1ull << 20))
		snprintf(buf, n, "%.2f MiB", (double)b / (double)(1ull << 20));
	else
		snprintf(buf, n, "%.1f KiB", (double)b / 1024.0);
}

int k3ctl_cmd_inspect(int argc, char **argv)
{
	const char *dir = NULL;
	uint64_t ram = 0;
	struct k3_err err = { 0, "" };

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--ram") == 0 && i + 1 < argc) {
			if (k3_parse_size(argv[++i], &ram, &err))
				return k3ctl_usage("inspect", "--ram: %s", err.msg);
		} else if (argv[i][0] == '-' || dir) {
			return k3ctl_usage("inspect", "usage: k3ctl inspect DIR [--ram SIZE] [--json]");
		} else {
			dir = argv[i];
		}
	}
	if (!dir)
		return k3ctl_usage("inspect", "usage: k3ctl inspect DIR [--ram SIZE] [--json]");
	if (!ram)
		ram = default_ram();

	struct k3_model *m;
	if (k3_model_open(dir, &m, &err))
		return k3ctl_fail(K3CTL_EXIT_ERROR, "inspect: %s", err.msg);
	const struct k3_model_config *c = k3_model_config(m);
	const struct k3_model_plan *p = k3_model_plan(m);
	static struct k3_model_bytes b;
	struct k3_model_fit fit;
	k3_model_bytes(m, &b);
	k3_model_fit(&b, ram, &fit);

	if (k3ctl_g.json) {
		json_t *layers = json_array();
		for (uint32_t l = 0; l < p->n_layers; l++) {
			const struct k3_layer_bytes *y = &b.layer[l];
			json_array_append_new(layers, json_pack(
				"{s:i,s:s,s:s,s:b,s:I,s:I,s:I,s:I,s:I,s:i,s:I}", "layer", (int)l,
				"attention", p->layers[l].is_kda ? "kda" : "mla",
				"ffn", p->layers[l].is_moe ? "moe" : "dense",
				"block_start", p->layers[l].is_block_start,
				"attn_bytes", (json_int_t)y->attn, "norm_bytes", (json_int_t)y->norms,
				"mlp_bytes", (json_int_t)y->mlp, "moe_spine_bytes", (json_int_t)y->moe_spine,
				"expert_bytes", (json_int_t)y->experts, "experts", (int)y->n_experts,
				"expert_span_bytes", (json_int_t)y->expert_span));
		}
		json_t *o = json_pack(
			"{s:s,s:s,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,"
			"s:{s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I},"
			"s:{s:I,s:b,s:I,s:I,s:f},s:o}",
			"dir", k3_model_dir(m), "model_type", c->model_type,
			"layers", (int)c->num_hidden_layers, "kda_layers", (int)c->n_kda,
			"mla_layers", (int)c->n_mla, "moe_layers", (int)c->n_moe,
			"dense_layers", (int)c->n_dense, "experts_per_layer", (int)c->num_experts,
			"experts_per_token", (int)c->num_experts_per_token, "hidden_size", (int)c->hidden_size,
			"vocab_size", (int)c->vocab_size,
			"bytes", "total", (json_int_t)b.total, "embedding", (json_int_t)b.embed,
			"lm_head", (json_int_t)b.lm_head, "final", (json_int_t)b.final,
			"spine", (json_int_t)b.spine, "experts", (json_int_t)b.experts,
			"expert_span", (json_int_t)b.expert_span, "other", (json_int_t)b.other,
			"fit", "ram", (json_int_t)fit.ram, "spine_fits", fit.spine_fits,
			"expert_slots", (json_int_t)fit.expert_slots, "expert_pool", (json_int_t)fit.expert_pool,
			"pool_fraction", fit.pool_fraction,
			"per_layer", layers);
		k3ctl_json_puts(o, JSON_INDENT(2), NULL);
		k3_model_free(m);
		return K3CTL_EXIT_OK;
	}

	char h1[32], h2[32], h3[32];
	printf("%s: %s, %u layers (%u KDA, %u MLA; %u dense, %u MoE), hidden %u, vocab %u\n",
	       k3_model_dir(m), c->model_type, c->num_hidden_layers, c->n_kda, c->n_mla, c->n_dense,
	       c->n_moe, c->hidden_size, c->vocab_size);
	printf("experts: %u per MoE layer, top-%u, %u shared; expert width %u in %u\n",
	       c->num_experts, c->num_experts_per_token, c->num_shared_experts,
	       c->moe_intermediate_size, c->expert_in);
	printf("\n%5s %-4s %-5s %12s %12s %8s %12s %14s\n", "layer", "attn", "ffn", "spine B",
	       "attn B", "experts", "span B", "experts B");
	for (uint32_t l = 0; l < p->n_layers; l++) {
		const struct k3_layer_bytes *y = &b.layer[l];
		printf("%5u %-4s %-5s %12llu %12llu %8u %12llu %14llu%s\n", l,
		       p->layers[l].is_kda ? "KDA" : "MLA", p->layers[l].is_moe ? "MoE" : "dense",
		       (unsigned long long)(y->attn + y->norms + y->mlp + y->moe_spine),
		       (unsigned long long)y->attn, y->n_experts, (unsigned long long)y->expert_span,
		       (unsigned long long)y->experts, p->layers[l].is_block_start ? "  <- AttnRes block" : "");
	}
	human(h1, sizeof(h1), b.embed);
	human(h2, sizeof(h2), b.lm_head);
	human(h3, sizeof(h3), b.final);
	printf("\nembedding %s, lm_head %s, final norms %s\n", h1, h2, h3);
	human(h1, sizeof(h1), b.spine);
	human(h2, sizeof(h2), b.experts);
	human(h3, sizeof(h3), b.total);
	printf("spine %s (%llu B), experts %s (%llu B), total %s (%llu B)\n", h1,
	       (unsigned long long)b.spine, h2, (unsigned long long)b.experts, h3,
	       (unsigned long long)b.total);
	if (b.expert_span) {
		struct expert_parts x;
		expert_parts(p, b.expert_span, &x);
		printf("per-expert span: %llu bytes (one expert's weights as stored: %llu bytes of "
		       "MXFP4 values + %llu of E8M0 scales", (unsigned long long)b.expert_span,
		       (unsigned long long)x.packed, (unsigned long long)x.scales);
		if (x.other)
			printf(" + %llu in other dtypes", (unsigned long long)x.other);
		printf("; a RAM cache slot holds it in whole 4 KiB pages)\n");
	} else {
		printf("per-expert span: 0 bytes (no routed experts)\n");
	}
	if (b.other) {
		human(h1, sizeof(h1), b.other);
		printf("not used by the text model (vision, MTP, ...): %s\n", h1);
	}
	human(h1, sizeof(h1), ram);
	if (fit.spine_fits)
		printf("RAM %s: spine fits; %llu of %llu experts fit beside it (%.1f%% of the pool)\n", h1,
		       (unsigned long long)fit.expert_slots, (unsigned long long)fit.expert_pool,
		       100.0 * fit.pool_fraction);
	else
		printf("RAM %s: the spine alone does not fit\n", h1);
	k3_model_free(m);
	return K3CTL_EXIT_OK;
}

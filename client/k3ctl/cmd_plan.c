/*
 * cmd_plan.c - `k3ctl plan --model DIR [--ram SIZE] [--context N]
 * [--spine-resident auto|all|N|none] [--expert-cache-gb auto|G]
 * [--spine bf16|int8] [--disk-gbps G] [--json]`: the memory planner's
 * split of a RAM size (default: this machine's min(RAM, cgroup limit))
 * between the resident spine, the spine ring, the expert cache, the
 * sequence state, scratch and headroom, and the bytes a cold token reads,
 * from config.json alone: a directory holding only the release's
 * config.json is enough to plan before downloading 1.5 TB (docs/plan.md).
 * The same planner k3d runs at start (daemon/store/store_plan.h); k3d
 * plans with the checkpoint's measured bytes, which equal these for the
 * release's dtypes.
 */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/parse.h"
#include "json_fields.h"
#include "k3ctl.h"
#include "model/model.h"
#include "store/store_budget.h"
#include "store/store_plan.h"

static void usage(void)
{
	fputs("usage: k3ctl plan --model DIR [--ram SIZE] [--context N] [--parallel auto|N]\n"
	      "       [--spine-resident auto|all|N|none]\n"
	      "       [--expert-cache-gb auto|G] [--spine bf16|int8] [--disk-gbps G] [--json]\n",
	      stdout);
}

static double gb(uint64_t b)
{
	return (double)b / 1e9;
}

/* plan_json's members from "headroom_bytes" on, in output order. */
#define F(key, member, t) K3CTL_JSON_FIELD(key, struct k3_store_plan_out, member, K3CTL_JSON_##t)
static const struct k3ctl_json_field plan_fields[] = {
	F("headroom_bytes", headroom_bytes, U64),
	F("state_bytes", state_bytes, U64),
	F("kda_state_bytes", kda_state_bytes, U64),
	F("mla_cache_bytes", mla_cache_bytes, U64),
	F("context_tokens", context_tokens, U32),
	F("sequences", sequences, U32),
	F("scratch_bytes", scratch_bytes, U64),
	F("resident_layers", resident_layers, U32),
	F("head_resident", head_resident, BOOL),
	F("embed_resident", embed_resident, BOOL),
	F("spine_resident_bytes", spine_resident_bytes, U64),
	F("ring_arenas", ring_arenas, U32),
	F("arena_bytes", arena_bytes, U64),
	F("spine_ring_bytes", spine_ring_bytes, U64),
	F("spine_total_bytes", spine_total_bytes, U64),
	F("expert_cache_bytes", expert_cache_bytes, U64),
	F("expert_slots", expert_slots, U32),
	F("slot_bytes", slot_bytes, U64),
	F("expert_pool", expert_pool, U64),
	F("expert_floor_bytes", expert_floor_bytes, U64),
	F("unused_bytes", unused_bytes, U64),
	F("floor_bytes", floor_bytes, U64),
	F("cold_spine_bytes_per_token", cold_spine_bytes_per_pass, U64),
	F("cold_expert_bytes_per_token", cold_expert_bytes_per_token, U64),
	F("uniform_expert_bytes_per_token", uniform_expert_bytes_per_token, U64),
};
#undef F

static json_t *plan_json(const char *dir, const struct k3_model_config *c,
			 const struct k3_store_plan_out *p, double disk)
{
	json_t *o = json_object();
	json_t *layers = json_array();

	for (uint32_t l = 0; l < p->n_layers; l++)
		json_array_append_new(layers, json_integer((json_int_t)p->layer_spine_bytes[l]));
	json_object_set_new(o, "model", json_string(dir));
	json_object_set_new(o, "layers", json_integer(c->num_hidden_layers));
	json_object_set_new(o, "limit_bytes", json_integer((json_int_t)p->limit_bytes));
	json_object_set_new(o, "limited_by", json_string(p->limited_by));
	k3ctl_json_set_fields(o, p, plan_fields, sizeof(plan_fields) / sizeof(plan_fields[0]));
	json_object_set_new(o, "disk_gbps", json_real(disk));
	json_object_set_new(o, "cold_read_s_per_token",
			    json_real(gb(p->cold_spine_bytes_per_pass + p->cold_expert_bytes_per_token) / disk));
	json_object_set_new(o, "int8_estimate", json_boolean(p->int8_estimate));
	json_object_set_new(o, "layer_spine_bytes", layers);
	json_object_set_new(o, "embed_bytes", json_integer((json_int_t)p->embed_bytes));
	json_object_set_new(o, "head_bytes", json_integer((json_int_t)p->head_bytes));
	return o;
}

/* "layers 0..39 (40 of 93)" / "no layer" / "every layer". */
static void prefix_text(char *buf, size_t n, uint32_t R, uint32_t L)
{
	if (R == 0)
		snprintf(buf, n, "no layer");
	else if (R == L)
		snprintf(buf, n, "every layer (%u)", L);
	else
		snprintf(buf, n, "layers 0..%u (%u of %u)", R - 1, R, L);
}

static void plan_print(const char *dir, const struct k3_model_config *c,
		       const struct k3_store_plan_out *p, double disk)
{
	char pre[64];
	uint64_t cold = p->cold_spine_bytes_per_pass + p->cold_expert_bytes_per_token;

	printf("%s: %u layers (%u KDA, %u MLA; %u dense, %u MoE), %u experts per MoE layer, "
	       "top-%u; bytes from config.json (the release's dtypes%s)\n", dir, c->num_hidden_layers,
	       c->n_kda, c->n_mla, c->n_dense, c->n_moe, c->num_experts, c->num_experts_per_token,
	       p->int8_estimate ? "; int8 spine matrices estimated, not weight-exact" : "");
	printf("limit      %9.3f GB  %s (%.1f GiB)\n", gb(p->limit_bytes), p->limited_by,
	       (double)p->limit_bytes / (double)(1ull << 30));
	printf("  headroom %9.3f GB  a tenth of the limit, at least %s\n", gb(p->headroom_bytes),
	       strcmp(p->limited_by, "--memory-limit") == 0 ? "32 MiB" : "2 GiB");
	printf("  state    %9.3f GB  KDA %.3f GB (%u layers) + MLA cache %.3f GB (%u layers, %u "
	       "tokens), %u sequence%s\n", gb(p->state_bytes), gb(p->kda_state_bytes), c->n_kda,
	       gb(p->mla_cache_bytes), c->n_mla, p->context_tokens, p->sequences,
	       p->sequences == 1 ? "" : "s");
	printf("  scratch  %9.3f GB  one pass of 64 positions\n", gb(p->scratch_bytes));
	prefix_text(pre, sizeof(pre), p->resident_layers, p->n_layers);
	printf("  spine    %9.3f GB  resident: %s, %s, %s (of %.3f GB)\n",
	       gb(p->spine_resident_bytes), pre,
	       p->head_resident ? "the head (lm_head + final norms)" : "the head streamed",
	       p->embed_resident ? "the embedding" : "the embedding gathered row by row",
	       gb(p->spine_total_bytes));
	if (p->ring_arenas)
		printf("  ring     %9.3f GB  %u arenas x %.3f GB (the largest streamed item): layer "
		       "L+1 is read while L computes\n", gb(p->spine_ring_bytes), p->ring_arenas,
		       gb(p->arena_bytes));
	else
		printf("  ring     %9.3f GB  nothing streams\n", 0.0);
	if (c->n_moe)
		printf("  experts  %9.3f GB  %u slots of %" PRIu64 " bytes (an expert's %" PRIu64
		       " bytes of MXFP4 values and scales, in whole 4 KiB pages) = %.2f%% of the %"
		       PRIu64 " experts (floor %" PRIu64 " slots)\n", gb(p->expert_cache_bytes),
		       p->expert_slots, p->slot_bytes, k3_store_plan_expert_bytes(c),
		       p->expert_pool ? 100.0 * p->expert_slots / (double)p->expert_pool : 0,
		       p->expert_pool, p->slot_bytes ? p->expert_floor_bytes / p->slot_bytes : 0);
	printf("  unused   %9.3f GB\n", gb(p->unused_bytes));
	printf("floor      %9.3f GB  the smallest limit one pass fits in (its headroom, state, "
	       "scratch, one MoE layer's experts, the cheaper of all spine resident or all "
	       "streamed)\n", gb(p->floor_bytes));
	char spine[96];
	if (p->cold_spine_bytes_per_pass)
		snprintf(spine, sizeof(spine), "the streamed layers%s%s",
			 p->head_resident ? "" : " and the head",
			 p->embed_resident ? "" : ", one embedding row");
	else
		snprintf(spine, sizeof(spine), "all resident");
	printf("a cold token (nothing cached) reads %.3f GB: spine %.3f GB (%s), experts %.3f GB "
	       "(%u x %u experts); %.2f s at %.1f GB/s\n", gb(cold), gb(p->cold_spine_bytes_per_pass),
	       spine, gb(p->cold_expert_bytes_per_token), c->n_moe, c->num_experts_per_token,
	       gb(cold) / disk, disk);
	if (c->n_moe)
		printf("with this cache and uniform routing a token reads %.3f GB of experts (hit rate "
		       "%.2f%%): %.3f GB in all, %.2f s at %.1f GB/s\n",
		       gb(p->uniform_expert_bytes_per_token),
		       p->expert_pool ? 100.0 * p->expert_slots / (double)p->expert_pool : 0,
		       gb(p->cold_spine_bytes_per_pass + p->uniform_expert_bytes_per_token),
		       gb(p->cold_spine_bytes_per_pass + p->uniform_expert_bytes_per_token) / disk, disk);
}

static const struct k3ctl_args_spec plan_args = {
	.cmd = "plan", .help = usage, .need = "%s needs a value (see --help)",
};

int k3ctl_cmd_plan(int argc, char **argv)
{
	const char *dir = NULL;
	struct k3_store_plan_in in = { .spine_resident = K3_STORE_PLAN_RESIDENT_DEFAULT };
	struct k3_err err = { 0, "" };
	double disk = 7.0;
	uint64_t v;
	int rc = 0;

	struct k3ctl_args args = { .spec = &plan_args, .argc = argc, .argv = argv, .rc = &rc,
				   .err = &err };
	while (k3ctl_args_next(&args)) {
		const char *a = args.opt, *val = args.val;
		if (!strcmp(a, "--model")) {
			dir = val;
		} else if (!strcmp(a, "--ram")) {
			rc = k3_parse_size(val, &in.ram_bytes, &err);
			if (!rc && !in.ram_bytes)
				rc = k3_err_set(&err, -EINVAL, "a size above 0 (64G, 512M)");
			in.cgroup_bytes = UINT64_MAX;   /* plan for a machine of that size */
		} else if (!strcmp(a, "--context")) {
			if (!(rc = k3_parse_u64(val, 1, 1u << 24, &v, &err)))
				in.context_tokens = (uint32_t)v;
		} else if (!strcmp(a, "--parallel")) {
			/* k3d --parallel: sequence states (auto as k3d: the most,
			 * up to 4, that the limit holds) */
			if (strcmp(val, "auto") && !(rc = k3_parse_u64(val, 1, 16, &v, &err)))
				in.sequences = (uint32_t)v;
		} else if (!strcmp(a, "--spine-resident")) {
			rc = k3_store_plan_parse_resident(val, &in.spine_resident, &err);
		} else if (!strcmp(a, "--expert-cache-gb")) {
			rc = k3_store_budget_parse_gb(val, &in.expert_cache_bytes, &err);
		} else if (!strcmp(a, "--spine")) {
			if (!strcmp(val, "int8"))
				in.spine_int8 = true;
			else if (strcmp(val, "bf16"))
				rc = k3_err_set(&err, -EINVAL, "expected bf16 or int8, not '%s'", val);
		} else if (!strcmp(a, "--disk-gbps")) {
			rc = k3_parse_double(val, 0.001, 1e4, &disk, &err);
		} else {
			return k3ctl_usage("plan", "unknown option '%s' (see --help)", a);
		}
	}
	if (args.stop)
		return args.code;
	if (!dir)
		return k3ctl_usage("plan", "--model DIR is required (a directory with config.json)");

	struct k3_model_config c;
	if (k3_model_config_load(dir, &c, &err))
		return k3ctl_fail(K3CTL_EXIT_ERROR, "plan: %s", err.msg);
	in.cfg = &c;
	struct k3_store_plan_out *p = malloc(sizeof(*p));
	if (!p)
		return k3ctl_fail(K3CTL_EXIT_ERROR, "plan: out of memory");
	bool seats_auto = in.sequences == 0;
	int code = K3CTL_EXIT_OK;
	for (in.sequences = seats_auto ? 4 : in.sequences;; in.sequences--) {
		rc = k3_store_plan_compute(&in, p, &err);
		if (rc == 0 || !seats_auto || in.sequences == 1)
			break;
	}
	if (rc) {
		code = k3ctl_fail(K3CTL_EXIT_ERROR, "plan: %s", err.msg);
	} else if (k3ctl_g.json) {
		k3ctl_json_puts(plan_json(dir, &c, p, disk), JSON_COMPACT | JSON_PRESERVE_ORDER, "{}");
	} else {
		plan_print(dir, &c, p, disk);
	}
	free(p);
	return code;
}

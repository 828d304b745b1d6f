/*
 * cmd_forward.c - `k3ctl forward --model DIR --ids 1,2,3 [--steps N]
 * [--json] [--threads N] [--chunk N] [--reference] [--provider NAME]`:
 * runs the K3 forward pass offline (no daemon) on token ids and prints the
 * last-position logits, the greedy continuation and the routes. --json
 * uses the field names of ../shared/golden/forward (last_logits,
 * greedy.tokens, greedy.decode_routes, routes[].layer/positions/experts/
 * weights) so a run can be diffed against a reference directly.
 */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/parse.h"
#include "engine/engine.h"
#include "k3ctl.h"
#include "model/model.h"
#include "store/store_int8.h"
#include "k3_proto.h"

enum { FWD_MAX_IDS = 65536, FWD_MAX_STEPS = 4096 };

static void usage(void)
{
	fprintf(stderr,
		"usage: k3ctl forward --model DIR --ids ID[,ID...] [--steps N] [--json]\n"
		"       [--threads N] [--chunk N] [--reference] [--provider NAME]\n"
		"       [--spine bf16|int8] [--spine-int8-dir DIR]\n");
}

static int parse_ids(const char *s, int32_t **out, uint32_t *n, struct k3_err *err)
{
	size_t len = strlen(s), cap = 1;
	for (size_t i = 0; i < len; i++)
		cap += s[i] == ',';
	if (cap > FWD_MAX_IDS)
		return k3_err_set(err, -E2BIG, "more than %d ids", FWD_MAX_IDS);
	int32_t *ids = calloc(cap, sizeof(*ids));
	char *copy = strdup(s);
	if (!ids || !copy) {
		free(ids);
		free(copy);
		return k3_err_set(err, -ENOMEM, "out of memory");
	}
	uint32_t k = 0;
	char *save = NULL;
	int rc = 0;
	for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		uint64_t v;
		rc = k3_parse_u64(tok, 0, INT32_MAX, &v, err);
		if (rc)
			break;
		ids[k++] = (int32_t)v;
	}
	free(copy);
	if (!rc && k == 0)
		rc = k3_err_set(err, -EINVAL, "no ids in '%s'", s);
	if (rc) {
		free(ids);
		return rc;
	}
	*out = ids;
	*n = k;
	return 0;
}

/* routes[] entries for positions [0, npos) of a [npos][n_moe][K] block,
 * numbered from pos0. */
static json_t *routes_json(const struct k3_engine *e, const uint32_t *ids, const float *w,
			   uint32_t npos, uint32_t pos0)
{
	uint32_t nm = k3_engine_n_moe(e), K = k3_engine_top_k(e);
	const uint32_t *ml = k3_engine_moe_layers(e);
	json_t *arr = json_array();
	for (uint32_t i = 0; i < nm; i++) {
		json_t *r = json_object(), *pos = json_array(), *ex = json_array(), *we = json_array();
		for (uint32_t t = 0; t < npos; t++) {
			json_t *a = json_array(), *b = json_array();
			size_t off = ((size_t)t * nm + i) * K;
			for (uint32_t k = 0; k < K; k++) {
				json_array_append_new(a, json_integer(ids[off + k]));
				json_array_append_new(b, json_real(w[off + k]));
			}
			json_array_append_new(pos, json_integer(pos0 + t));
			json_array_append_new(ex, a);
			json_array_append_new(we, b);
		}
		json_object_set_new(r, "layer", json_integer(ml[i]));
		json_object_set_new(r, "positions", pos);
		json_object_set_new(r, "experts", ex);
		json_object_set_new(r, "weights", we);
		json_array_append_new(arr, r);
	}
	return arr;
}

static void print_text(const struct k3_engine *e, const float *logits, const uint32_t *rid,
		       const float *rw, uint32_t T, const uint32_t *greedy, uint32_t steps)
{
	uint32_t V = k3_engine_vocab(e), nm = k3_engine_n_moe(e), K = k3_engine_top_k(e);
	const uint32_t *ml = k3_engine_moe_layers(e);
	uint32_t top[10], ntop = V < 10 ? V : 10;
	for (uint32_t j = 0; j < ntop; j++) {
		uint32_t best = UINT32_MAX;
		for (uint32_t v = 0; v < V; v++) {
			bool used = false;
			for (uint32_t i = 0; i < j; i++)
				used |= top[i] == v;
			if (!used && (best == UINT32_MAX || logits[v] > logits[best]))
				best = v;
		}
		top[j] = best;
	}
	printf("last position %u, top logits:\n", T - 1);
	for (uint32_t j = 0; j < ntop; j++)
		printf("  %6u  %.6f\n", top[j], logits[top[j]]);
	if (steps) {
		printf("greedy:");
		for (uint32_t i = 0; i < steps; i++)
			printf(" %u", greedy[i]);
		printf("\n");
	}
	printf("routes at the last position (layer: expert:weight ...):\n");
	for (uint32_t i = 0; i < nm; i++) {
		size_t off = ((size_t)(T - 1) * nm + i) * K;
		printf("  %3u:", ml[i]);
		for (uint32_t k = 0; k < K; k++)
			printf(" %u:%.4f", rid[off + k], rw[off + k]);
		printf("\n");
	}
}

static const char *const forward_flags[] = { "--json", "--reference", NULL };
static const struct k3ctl_args_spec forward_args = {
	.cmd = "forward", .flags = forward_flags, .help = usage,
	.need = "'%s' needs a value (or is unknown)",
};

int k3ctl_cmd_forward(int argc, char **argv)
{
	const char *dir = NULL, *ids_s = NULL, *provider = NULL, *int8_dir = NULL;
	bool int8 = false;
	uint64_t steps = 0, threads = 0, chunk = 0;
	bool json = k3ctl_g.json, reference = false;
	struct k3_err err = { 0, "" };
	int rc = 0;

	const struct k3ctl_arg_str strs[] = {
		{ "--model", &dir }, { "--ids", &ids_s }, { "--provider", &provider },
		{ "--spine-int8-dir", &int8_dir },
	};
	struct k3ctl_args args = { .spec = &forward_args, .argc = argc, .argv = argv,
				   .strs = strs, .n_strs = sizeof(strs) / sizeof(strs[0]),
				   .rc = &rc, .err = &err };
	while (k3ctl_args_next(&args)) {
		const char *a = args.opt, *val = args.val;
		if (!strcmp(a, "--json")) {
			json = true;
		} else if (!strcmp(a, "--reference")) {
			reference = true;
		} else if (!strcmp(a, "--spine")) {
			if (strcmp(val, "bf16") && strcmp(val, "int8"))
				return k3ctl_usage("forward", "--spine: '%s' is not bf16 or int8", val);
			int8 = !strcmp(val, "int8");
		} else if (!strcmp(a, "--steps")) {
			rc = k3_parse_u64(val, 0, FWD_MAX_STEPS, &steps, &err);
		} else if (!strcmp(a, "--threads")) {
			rc = k3_parse_u64(val, 1, 256, &threads, &err);
		} else if (!strcmp(a, "--chunk")) {
			rc = k3_parse_u64(val, 1, 4096, &chunk, &err);
		} else {
			return k3ctl_usage("forward", "unknown option '%s'", a);
		}
	}
	if (args.stop)
		return args.code;
	if (!dir || !ids_s) {
		usage();
		return k3ctl_usage("forward", "--model DIR and --ids LIST are required");
	}
	int32_t *ids = NULL;
	uint32_t T = 0;
	if (parse_ids(ids_s, &ids, &T, &err))
		return k3ctl_usage("forward", "--ids: %s", err.msg);

	int code = K3CTL_EXIT_ERROR;
	struct k3_model *model = NULL;
	struct k3_engine *e = NULL;
	struct k3_engine_seq *s = NULL;
	float *logits = NULL, *rw = NULL, *dl = NULL, *dw = NULL;
	uint32_t *rid = NULL, *did = NULL, *greedy = NULL;
	json_t *droutes = NULL;

	if (int8_dir && !int8) {
		code = k3ctl_usage("forward", "--spine-int8-dir needs --spine int8");
		goto out;
	}
	if (int8 ? k3_store_int8_open_model(dir, int8_dir, 0, &model, &err)
		 : k3_model_open(dir, &model, &err)) {
		k3ctl_fail(K3CTL_EXIT_ERROR, "%s", err.msg);
		goto out;
	}
	if (int8 && !json)
		printf("spine: %s\n", K3_PROTO_SPINE_INT8_LABEL);
	struct k3_engine_opts o = { .provider = provider, .threads = (uint32_t)threads,
				    .max_chunk = (uint32_t)chunk, .reference = reference };
	if (k3_engine_open(model, &o, &e, &err) ||
	    k3_engine_seq_new(e, T + (uint32_t)steps, &s, &err)) {
		k3ctl_fail(K3CTL_EXIT_ERROR, "%s", err.msg);
		goto out;
	}
	uint32_t V = k3_engine_vocab(e), per = k3_engine_n_moe(e) * k3_engine_top_k(e);
	for (uint32_t t = 0; t < T; t++)
		if ((uint32_t)ids[t] >= V) {
			code = k3ctl_usage("forward", "--ids: id %d is not below the vocabulary size %u",
					   ids[t], V);
			goto out;
		}
	logits = calloc(V, sizeof(float));
	dl = calloc(V, sizeof(float));
	rid = calloc((size_t)T * per, sizeof(uint32_t));
	rw = calloc((size_t)T * per, sizeof(float));
	did = calloc(per ? per : 1, sizeof(uint32_t));
	dw = calloc(per ? per : 1, sizeof(float));
	greedy = calloc(steps ? steps : 1, sizeof(uint32_t));
	if (!logits || !dl || !rid || !rw || !did || !dw || !greedy) {
		k3ctl_fail(K3CTL_EXIT_ERROR, "out of memory");
		goto out;
	}
	struct k3_engine_out eo = { K3_ENGINE_LOGITS_LAST, logits, rid, rw };
	if (k3_engine_forward(e, s, ids, T, &eo, &err)) {
		k3ctl_fail(K3CTL_EXIT_ERROR, "forward: %s", err.msg);
		goto out;
	}
	/* greedy: token i comes from the logits before it; the last one is
	 * not fed back (as in the goldens: steps tokens, steps-1 decodes) */
	droutes = json_array();
	memcpy(dl, logits, V * sizeof(float));
	for (uint32_t i = 0; i < steps; i++) {
		greedy[i] = k3_engine_argmax(dl, V);
		if (i + 1 == steps)
			break;
		int32_t tok = (int32_t)greedy[i];
		struct k3_engine_out d1 = { K3_ENGINE_LOGITS_LAST, dl, did, dw };
		if (k3_engine_forward(e, s, &tok, 1, &d1, &err)) {
			k3ctl_fail(K3CTL_EXIT_ERROR, "decode step %u: %s", i, err.msg);
			goto out;
		}
		json_t *r = routes_json(e, did, dw, 1, T + i);
		json_array_append_new(droutes, r);
	}

	if (!json) {
		print_text(e, logits, rid, rw, T, greedy, (uint32_t)steps);
		code = K3CTL_EXIT_OK;
		goto out;
	}
	/* decode routes: merge the per-step entries into one per layer */
	json_t *dr = routes_json(e, did, dw, 0, T);
	for (size_t i = 0; i < json_array_size(droutes); i++) {
		json_t *step = json_array_get(droutes, i);
		for (size_t l = 0; l < json_array_size(step); l++) {
			json_t *src = json_array_get(step, l), *dst = json_array_get(dr, l);
			static const char *const f[] = { "positions", "experts", "weights" };
			for (int k = 0; k < 3; k++)
				json_array_extend(json_object_get(dst, f[k]), json_object_get(src, f[k]));
		}
	}
	json_t *root = json_object(), *jp = json_array(), *jl = json_array(), *jg = json_array();
	for (uint32_t t = 0; t < T; t++)
		json_array_append_new(jp, json_integer(ids[t]));
	for (uint32_t v = 0; v < V; v++)
		json_array_append_new(jl, json_real(logits[v]));
	for (uint32_t i = 0; i < steps; i++)
		json_array_append_new(jg, json_integer(greedy[i]));
	json_t *g = json_object();
	json_object_set_new(g, "steps", json_integer((json_int_t)steps));
	json_object_set_new(g, "tokens", jg);
	json_object_set_new(g, "decode_routes", dr);
	json_object_set_new(root, "prompt", jp);
	json_object_set_new(root, "num_positions", json_integer(T));
	json_object_set_new(root, "last_logits", jl);
	json_object_set_new(root, "routes", routes_json(e, rid, rw, T, 0));
	json_object_set_new(root, "greedy", g);
	json_object_set_new(root, "spine", json_string(int8 ? "int8" : "bf16"));
	json_object_set_new(root, "weight_exact", json_boolean(!int8));
	/* 9 significant digits round-trip an fp32 exactly */
	if (json_dumpf(root, stdout, JSON_COMPACT | JSON_REAL_PRECISION(9)) == 0) {
		fputc('\n', stdout);
		code = K3CTL_EXIT_OK;
	}
	json_decref(root);
out:
	json_decref(droutes);
	free(ids);
	free(logits);
	free(dl);
	free(rid);
	free(rw);
	free(did);
	free(dw);
	free(greedy);
	k3_engine_seq_free(s);
	k3_engine_free(e);
	k3_model_free(model);
	return code;
}

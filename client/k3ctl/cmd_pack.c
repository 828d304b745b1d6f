/* cmd_pack.c - `k3ctl pack --model DIR [--out DIR] [--verify] [--spine
 * bf16|int8] [--spine-int8-dir DIR] [--layers LIST | --hot-experts N
 * --trace FILE]`: writes one expert pack per MoE layer and the spine pack
 * (store_pack.h) of the chosen spine: spine.k3pack (BF16, the
 * checkpoint's) or spine-int8.k3pack (the int8 spine overlay's spine,
 * store_int8.h, whose sources are the shards and the overlay's files; the
 * other spine's pack is left as it is); keeps packs that are already up to
 * date, compares a pack whose sources changed (and with --verify every
 * pack) span by span with them, and rewrites the stale ones. With --layers
 * or --hot-experts it writes a copy for another drive (k3d --expert-dir):
 * only those layers' packs, or packs holding the N experts a router trace
 * used most, and no spine pack. A shard that k3ctl setup verified gets its
 * SHA-256 recorded in the packs; and the per-expert SHA-256 table
 * (setup_experts.h) is written beside the shards, for mirrors whose
 * streaming installs verify each expert before use. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/parse.h"
#include "k3ctl.h"
#include "model/model.h"
#include "setup/setup_experts.h"
#include "setup/setup_inventory.h"
#include "setup/setup_publish.h"
#include "setup/setup_remote.h"
#include "setup/setup_state.h"
#include "store/store_int8.h"
#include "store/store_model.h"
#include "store/store_trace.h"

/* The per-expert table, in the model directory when it is writable, else
 * beside the packs. */
static int write_expert_table(const struct k3_model *m, const char *packdir, struct k3_err *err)
{
	const char *dirs[2] = { k3_model_dir(m), packdir };
	size_t n = 0;
	int rc = -EACCES;

	for (int i = 0; i < 2 && rc; i++) {
		int dfd;
		if (i == 0 && access(dirs[0], W_OK) != 0)
			continue;
		if ((rc = k3_setup_dir_open(dirs[i], false, &dfd, err)) != 0)
			continue;
		rc = k3_setup_expert_table_write(m, dfd, K3_SETUP_EXPERT_TABLE_NAME, &n, err);
		close(dfd);
		if (rc == 0 && !k3ctl_g.json)
			printf("%s/%s: SHA-256 of each of %zu routed experts\n", dirs[i],
			       K3_SETUP_EXPERT_TABLE_NAME, n);
	}
	return rc;
}

/* Sources k3ctl setup verified: their SHA-256 goes into the packs. */
static void record_verified(const struct k3_model *m, struct k3_store_pack_ident *id, size_t n)
{
	for (size_t i = 0; i < n; i++)
		id[i].has_sha256 = k3_setup_verified_sha256(k3_model_dir(m), id[i].name, id[i].sha256) == 0;
}

static void count(const struct k3_store_pack_result *res, uint32_t *written, uint32_t *kept,
		  uint32_t *reverified, uint64_t *bytes, uint64_t *verified)
{
	*written += res->written;
	*kept += !res->written;
	*reverified += res->reverified;
	*bytes += res->payload_bytes;
	*verified += res->verified_bytes;
}

/* One pack's line after its name: what happened, its size and why. */
static void report(const struct k3_store_pack_result *res, const char *what)
{
	printf("%s %zu %s, %" PRIu64 " bytes%s%s%s%s\n",
	       res->written ? (res->replaced ? "rewrote" : "wrote") : "kept",
	       res->n_spans, what, res->file_bytes,
	       res->verified_bytes ? (res->written ? ", every span verified"
				      : ", every span compared with the shards") : "",
	       res->why[0] ? (res->written ? " (replaced: " : " (re-verified: ") : "",
	       res->why, res->why[0] ? ")" : "");
}

/* --layers LIST: "all", or layer numbers and ranges "a-b" separated by
 * commas, each a MoE layer of the model; marks want[layer]. */
static int parse_layers(const char *list, const struct k3_model_plan *plan, bool *want)
{
	char buf[1024];

	if (strcmp(list, "all") == 0) {
		for (uint32_t l = 0; l < plan->n_layers; l++)
			want[l] = plan->layers[l].is_moe;
		return 0;
	}
	if (strlen(list) >= sizeof(buf))
		return k3ctl_fail(K3CTL_EXIT_USAGE, "--layers: too long");
	snprintf(buf, sizeof(buf), "%s", list);
	for (char *p = buf, *next; p; p = next) {
		next = strchr(p, ',');
		if (next)
			*next++ = '\0';
		char *dash = strchr(p, '-');
		uint64_t a, b;
		struct k3_err err = { 0, "" };
		if (dash)
			*dash = '\0';
		if (k3_parse_u64(p, 0, plan->n_layers - 1, &a, &err) < 0 ||
		    k3_parse_u64(dash ? dash + 1 : p, a, plan->n_layers - 1, &b, &err) < 0)
			return k3ctl_fail(K3CTL_EXIT_USAGE, "--layers '%s': %s (layers 0..%u)", list,
					  err.msg, plan->n_layers - 1);
		for (uint64_t l = a; l <= b; l++) {
			if (!plan->layers[l].is_moe)
				return k3ctl_fail(K3CTL_EXIT_USAGE, "--layers '%s': layer %llu has no"
						  " routed experts", list, (unsigned long long)l);
			want[l] = true;
		}
	}
	return 0;
}

/* --hot-experts N --trace FILE: keep[l][e] for the N (layer, expert) pairs
 * the trace routed to most (store_trace.h's ranking); want[l] for their
 * layers. keep is [n_layers][max experts of a layer]. */
static int hot_experts(const char *trace, uint64_t n, const struct k3_model_plan *plan,
		       uint32_t width, bool *want, uint8_t *keep)
{
	struct k3_store_trace_rank *rk = NULL;
	struct k3_err err = { 0, "" };
	size_t n_rk = 0;
	uint64_t records = 0, kept = 0;

	if (k3_store_trace_rank(trace, &rk, &n_rk, &records, &err) < 0)
		return k3ctl_fail(K3CTL_EXIT_ERROR, "--trace: %s", err.msg);
	for (size_t i = 0; i < n_rk && kept < n; i++) {
		uint32_t l = rk[i].layer, e = rk[i].expert;
		if (l >= plan->n_layers || !plan->layers[l].is_moe || e >= plan->layers[l].moe.n_experts) {
			free(rk);
			return k3ctl_fail(K3CTL_EXIT_ERROR, "--trace '%s' routes to expert (%u, %u),"
					  " which this model does not have: a trace of another model?",
					  trace, l, e);
		}
		keep[(size_t)l * width + e] = 1;
		want[l] = true;
		kept++;
	}
	free(rk);
	if (!k3ctl_g.json)
		printf("hot experts: %llu of %zu used in %llu trace records\n",
		       (unsigned long long)kept, n_rk, (unsigned long long)records);
	return kept ? 0 : k3ctl_fail(K3CTL_EXIT_ERROR, "--trace '%s' routes to no expert", trace);
}

#define PACK_USAGE "usage: k3ctl pack --model DIR [--out DIR] [--verify]" \
	" [--spine bf16|int8] [--spine-int8-dir DIR] [--layers LIST | --hot-experts N --trace FILE]"

/* A value missing is an argument out of place, as any other. */
static const char *const pack_flags[] = { "--verify", NULL };
static const struct k3ctl_args_spec pack_args = {
	.cmd = "pack", .flags = pack_flags, .need = PACK_USAGE " (unexpected '%s')",
};

int k3ctl_cmd_pack(int argc, char **argv)
{
	const char *model_dir = NULL, *out_dir = NULL, *layers = NULL, *trace = NULL;
	const char *int8_dir = NULL;
	uint64_t hot = 0;
	bool *want = NULL;
	uint8_t *keep = NULL;
	uint32_t width = 0;
	unsigned flags = 0;
	bool int8 = false;
	struct k3_model *m = NULL;
	struct k3_store_pack_ident *id = NULL;
	struct k3_err err = { 0, "" };
	char packdir[4096], path[4096];
	uint32_t written = 0, kept = 0, reverified = 0;
	uint64_t bytes = 0, verified = 0, spine_bytes = 0;
	size_t n_id = 0;
	int rc, code = K3CTL_EXIT_ERROR;

	const struct k3ctl_arg_str strs[] = {
		{ "--model", &model_dir }, { "--out", &out_dir }, { "--layers", &layers },
		{ "--trace", &trace }, { "--spine-int8-dir", &int8_dir },
	};
	struct k3ctl_args args = { .spec = &pack_args, .argc = argc, .argv = argv, .strs = strs,
				   .n_strs = sizeof(strs) / sizeof(strs[0]) };
	while (k3ctl_args_next(&args)) {
		const char *a = args.opt, *v = args.val;
		if (strcmp(a, "--verify") == 0) {
			flags |= K3_STORE_PACK_VERIFY;
		} else if (strcmp(a, "--hot-experts") == 0) {
			if (k3_parse_u64(v, 1, UINT32_MAX, &hot, &err) < 0)
				return k3ctl_usage("pack", "--hot-experts: %s", err.msg);
		} else if (strcmp(a, "--spine") == 0) {
			if (strcmp(v, "bf16") && strcmp(v, "int8"))
				return k3ctl_usage("pack", "--spine: '%s' is not bf16 or int8", v);
			int8 = strcmp(v, "int8") == 0;
		} else {
			return k3ctl_usage("pack", PACK_USAGE " (unexpected '%s')", a);
		}
	}
	if (args.stop)
		return args.code;
	if (!model_dir)
		return k3ctl_usage("pack", "--model DIR is required");
	if (int8_dir && !int8)
		return k3ctl_usage("pack", "--spine-int8-dir needs --spine int8");
	if ((hot != 0) != (trace != NULL) || (hot && layers))
		return k3ctl_usage("pack", "--hot-experts N and --trace FILE go together, and not with"
				   " --layers");
	if ((layers || hot) && !out_dir)
		return k3ctl_usage("pack", "--layers and --hot-experts write a copy for another drive:"
				   " name it with --out DIR");
	{
		/* a streaming install's shards hold holes where experts have not
		 * arrived: a pack of them would be wrong */
		bool stream = false;
		uint64_t absent = 0;
		if (k3_setup_stream_status(model_dir, &stream, &absent, &err) == 0 && stream && absent)
			return k3ctl_fail(K3CTL_EXIT_ERROR, "%s is a streaming install and %" PRIu64
					  " routed experts are not on disk yet: fetch them with 'k3ctl"
					  " fetch-weights --model %s' before packing", model_dir, absent,
					  model_dir);
	}
	/* the int8 spine as k3d --spine int8 runs it: the overlay checked
	 * against the shards (a stale one is refused, saying what to run) */
	rc = int8 ? k3_store_int8_open_model(model_dir, int8_dir, 0, &m, &err)
		  : k3_model_open(model_dir, &m, &err);
	if (rc)
		return k3ctl_fail(K3CTL_EXIT_ERROR, "%s", err.msg);
	const struct k3_model_plan *plan = k3_model_plan(m);
	for (uint32_t l = 0; l < plan->n_layers; l++)
		if (plan->layers[l].is_moe && plan->layers[l].moe.n_experts > width)
			width = plan->layers[l].moe.n_experts;
	want = calloc(plan->n_layers ? plan->n_layers : 1, sizeof(*want));
	keep = calloc((size_t)plan->n_layers * (width ? width : 1), 1);
	if (!want || !keep) {
		k3ctl_fail(K3CTL_EXIT_ERROR, "out of memory");
		goto out;
	}
	if ((layers && parse_layers(layers, plan, want) != 0) ||
	    (hot && hot_experts(trace, hot, plan, width, want, keep) != 0)) {
		code = K3CTL_EXIT_USAGE;
		goto out;
	}
	if (out_dir) {
		snprintf(packdir, sizeof(packdir), "%s", out_dir);
	} else {
		struct stat st;
		/* A model directory marked read-only (no write bit at all) is
		 * left alone even when running as root, who could write anyway. */
		if (stat(k3_model_dir(m), &st) == 0 && (st.st_mode & 0222) == 0) {
			k3ctl_fail(K3CTL_EXIT_ERROR, "'%s' is read-only (mode %04o); choose where the"
				   " packs go with --out DIR", k3_model_dir(m),
				   (unsigned)(st.st_mode & 07777));
			goto out;
		}
		snprintf(packdir, sizeof(packdir), "%s/%s", k3_model_dir(m), K3_STORE_PACK_SUBDIR);
	}
	if (mkdir(packdir, 0755) != 0 && errno != EEXIST) {
		k3ctl_fail(K3CTL_EXIT_ERROR, "cannot create '%s': %s", packdir, strerror(errno));
		goto out;
	}
	rc = k3_store_model_idents(m, &id, &n_id, &err);
	if (rc) {
		k3ctl_fail(K3CTL_EXIT_ERROR, "%s", err.msg);
		goto out;
	}
	record_verified(m, id, n_id);
	for (uint32_t l = 0; l < plan->n_layers; l++) {
		struct k3_store_pack_result res;
		struct k3_store_source *src;

		if (!plan->layers[l].is_moe || ((layers || hot) && !want[l]))
			continue;
		src = k3_store_source_new(K3_STORE_DIRECT_AUTO);
		if (!src) {
			k3ctl_fail(K3CTL_EXIT_ERROR, "out of memory");
			goto out;
		}
		rc = k3_store_source_add_model_some(src, m, l, hot ? keep + (size_t)l * width : NULL,
						    &err);
		if (rc == 0)
			rc = k3_store_pack_path(path, sizeof(path), packdir, l);
		if (rc == 0)
			rc = k3_store_pack_write(path, src, id, n_id, flags, &res, &err);
		k3_store_source_free(src);
		if (rc) {
			k3ctl_fail(K3CTL_EXIT_ERROR, "layer %" PRIu32 ": %s", l, err.msg);
			goto out;
		}
		count(&res, &written, &kept, &reverified, &bytes, &verified);
		if (!k3ctl_g.json) {
			printf("layer %3" PRIu32 ": ", l);
			report(&res, "experts");
		}
	}
	/* The spine: one span per layer, the embedding, the head; its
	 * sources are the files the spine lies in (the int8 spine: the
	 * shards, then the overlay's shards). Not for a copy of experts on
	 * another drive. */
	if (!layers && !hot) {
		struct k3_store_pack_result res;
		struct k3_store_pack_ident *sid = NULL;
		size_t n_sid = 0;
		rc = k3_store_spine_pack_path(path, sizeof(path), packdir, m);
		if (rc == 0)
			rc = k3_store_spine_idents(m, &sid, &n_sid, &err);
		if (rc == 0) {
			record_verified(m, sid, n_sid);
			rc = k3_store_spine_pack_write(m, path, sid, n_sid, flags, &res, &err);
		}
		free(sid);
		if (rc) {
			k3ctl_fail(K3CTL_EXIT_ERROR, "spine%s: %s", int8 ? " (int8)" : "", err.msg);
			goto out;
		}
		count(&res, &written, &kept, &reverified, &bytes, &verified);
		spine_bytes = res.payload_bytes;
		if (!k3ctl_g.json) {
			printf(int8 ? "spine int8: " : "spine    : ");
			report(&res, int8 ? "spans (layers, embedding, head; int8 spine, not"
				     " weight-exact)" : "spans (layers, embedding, head)");
		}
	}
	if (k3ctl_g.json)
		printf("{\"ok\":true,\"dir\":\"%s\",\"spine\":\"%s\",\"written\":%" PRIu32
		       ",\"kept\":%" PRIu32 ",\"reverified\":%" PRIu32 ",\"payload_bytes\":%" PRIu64
		       ",\"spine_bytes\":%" PRIu64 ",\"verified_bytes\":%" PRIu64 "}\n",
		       packdir, int8 ? "int8" : "bf16", written, kept, reverified, bytes,
		       spine_bytes, verified);
	else
		printf("%s: %" PRIu32 " packs written, %" PRIu32 " kept, %" PRIu64
		       " expert bytes, %" PRIu64 " spine bytes, %" PRIu64 " bytes verified\n",
		       packdir, written, kept, bytes - spine_bytes, spine_bytes, verified);
	if (!k3ctl_g.json && reverified)
		printf("%" PRIu32 " kept packs were re-verified against changed shards (their"
		       " source records now name the files as they are)\n", reverified);
	if (write_expert_table(m, packdir, &err) != 0) {
		k3ctl_fail(K3CTL_EXIT_ERROR, "the per-expert SHA-256 table: %s", err.msg);
		goto out;
	}
	code = K3CTL_EXIT_OK;
out:
	free(id);
	free(want);
	free(keep);
	k3_model_free(m);
	return code;
}

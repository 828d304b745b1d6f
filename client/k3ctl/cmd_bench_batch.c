/*
 * cmd_bench_batch.c - k3ctl bench --parallel LIST (issue 21): what several
 * sequences in one pass buy a disk-bound engine. For each N of the list
 * (interleaved over --reps rounds: 1,2,4,1,2,4,...) it prefills N
 * sequences of different prompts, then decodes --max-new ids of every one
 * of them in lockstep, one k3_engine_forward_batch of N single positions
 * per step (k3d's seats in their steady state), and reports the aggregate
 * decode tokens/s, per-sequence tokens/s and the bytes read (experts and
 * spine) per generated token, medians over the rounds; then the ratios
 * against N = 1. Every sequence's ids are checked against its solo run
 * (k3_engine_forward one position at a time): OK or MISMATCH.
 *
 * The setup is k3ctl bench's (cmd_bench.c): the memory plan for this
 * machine (with N sequence states), the expert store with its cache, the
 * spine loader when the plan streams, --io-rate's emulated drive.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/parse.h"
#include "bench.h"
#include "demo_trained.h"
#include "engine/engine.h"
#include "k3ctl.h"
#include "model/model.h"
#include "store/store.h"
#include "store/store_budget.h"
#include "store/store_drives.h"
#include "store/store_engine.h"
#include "store/store_model.h"
#include "store/store_plan.h"
#include "store/store_spine.h"
#include "text/text_tok.h"

enum { BB_MAX_N = 16, BB_MAX_LIST = 8, BB_MAX_REPS = 31, BB_MAX_NEW = 4096, BB_MAX_PROMPT = 4096 };

static int bb_cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static double bb_median(double *v, unsigned n)
{
	qsort(v, n, sizeof(*v), bb_cmp);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* "1,2,4" -> list (each 1..BB_MAX_N, at most BB_MAX_LIST). */
static int bb_parse_list(const char *s, uint32_t *list, unsigned *n, struct k3_err *err)
{
	char buf[128];
	char *save = NULL;

	if (strlen(s) >= sizeof(buf))
		return k3_err_set(err, -EINVAL, "too long");
	strcpy(buf, s);
	*n = 0;
	for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		uint64_t v;
		int rc = k3_parse_u64(t, 1, BB_MAX_N, &v, err);
		if (rc)
			return rc;
		if (*n == BB_MAX_LIST)
			return k3_err_set(err, -EINVAL, "at most %d values", BB_MAX_LIST);
		list[(*n)++] = (uint32_t)v;
	}
	return *n ? 0 : k3_err_set(err, -EINVAL, "a list like 1,2,4");
}

struct bb_run {
	double agg_tps[BB_MAX_REPS], seq_tps[BB_MAX_REPS], bpt[BB_MAX_REPS], xbpt[BB_MAX_REPS],
	       sbpt[BB_MAX_REPS];
	unsigned n;
	bool mismatch;
};

static void bb_settle(struct k3_store *store, struct k3_store_spine *spine)
{
	k3_store_prefetch_cancel(store, UINT32_MAX);
	k3_store_drain(store);
	if (spine)
		k3_store_spine_drain(spine);
	k3_store_idle(store);
}

static const char *const batch_flags[] = { "--no-packs", NULL };
static const struct k3ctl_args_spec batch_args = {
	.cmd = "bench", .flags = batch_flags, .need = "%s needs a value (see --help)",
};

int k3ctl_bench_batch(int argc, char **argv)
{
	const char *model_dir = NULL, *preset = NULL;
	uint64_t max_new = 32, prompt_len = 32, threads = 0, io_threads = 0, cache_bytes = 0, seed = 1,
		 reps = 3, prefill_chunk = 0;
	enum k3_store_direct direct = K3_STORE_DIRECT_AUTO;
	int32_t spine_resident = K3_STORE_PLAN_RESIDENT_DEFAULT;
	struct k3_store_drive_opts dopts;
	uint32_t list[BB_MAX_LIST] = { 1, 2, 4 };
	unsigned n_list = 3;
	bool no_packs = false;
	struct k3_err err = { 0, "" };
	int rc = 0, code = K3CTL_EXIT_ERROR;

	k3_store_drive_opts_init(&dopts);
	struct k3ctl_args args = { .spec = &batch_args, .argc = argc, .argv = argv, .rc = &rc,
				   .err = &err };
	while (k3ctl_args_next(&args)) {
		const char *a = args.opt, *val = args.val;
		if (!strcmp(a, "--no-packs"))
			no_packs = true;
		else if (!strcmp(a, "--parallel"))
			rc = bb_parse_list(val, list, &n_list, &err);
		else if (!strcmp(a, "--model"))
			model_dir = val;
		else if (!strcmp(a, "--preset")) {
			if (strcmp(val, "trained"))
				return k3ctl_usage("bench", "--preset '%s': only trained", val);
			preset = val;
		} else if (!strcmp(a, "--max-new"))
			rc = k3_parse_u64(val, 1, BB_MAX_NEW, &max_new, &err);
		else if (!strcmp(a, "--prompt-len"))
			rc = k3_parse_u64(val, 4, BB_MAX_PROMPT, &prompt_len, &err);
		else if (!strcmp(a, "--reps"))
			rc = k3_parse_u64(val, 1, BB_MAX_REPS, &reps, &err);
		else if (!strcmp(a, "--threads"))
			rc = k3_parse_u64(val, 1, 256, &threads, &err);
		else if (!strcmp(a, "--io-threads"))
			rc = k3_parse_u64(val, 1, K3_STORE_MAX_IO_THREADS, &io_threads, &err);
		else if (!strcmp(a, "--seed"))
			rc = k3_parse_u64(val, 1, UINT64_MAX, &seed, &err);
		else if (!strcmp(a, "--expert-cache-gb"))
			rc = k3_store_budget_parse_gb(val, &cache_bytes, &err);
		else if (!strcmp(a, "--direct"))
			rc = k3_store_direct_parse(val, &direct, &err);
		else if (!strcmp(a, "--spine-resident"))
			rc = k3_store_plan_parse_resident(val, &spine_resident, &err);
		else if (!strcmp(a, "--io-rate"))
			rc = k3_store_drive_parse_rate(val, &dopts, &err);
		else if (!strcmp(a, "--io-latency"))
			rc = k3_store_drive_parse_latency(val, &dopts, &err);
		else if (!strcmp(a, "--prefill-chunk"))
			rc = k3_parse_u64(val, 1, 4096, &prefill_chunk, &err);
		else
			return k3ctl_usage("bench", "--parallel: option '%s' is not taken here (see "
					   "--help)", a);
	}
	if (args.stop)
		return args.code;
	if (!!model_dir + !!preset != 1)
		return k3ctl_usage("bench", "one of --model DIR and --preset trained is required");
	uint32_t nmax = 1;
	for (unsigned i = 0; i < n_list; i++)
		nmax = list[i] > nmax ? list[i] : nmax;

	struct k3ctl_bench_setup bs;
	struct k3_engine_seq *seqs[BB_MAX_N] = { 0 };
	struct k3_store_open_report rep = { 0 };
	struct k3_store_plan_out plan;
	int32_t *prompts[BB_MAX_N] = { 0 };
	uint32_t plen[BB_MAX_N] = { 0 };
	uint32_t *ref[BB_MAX_N] = { 0 }, *got[BB_MAX_N] = { 0 };
	float *logits[BB_MAX_N] = { 0 };
	struct bb_run *runs = calloc(n_list, sizeof(*runs));

	rc = k3ctl_bench_model_open(&bs, model_dir, preset ? "batch" : NULL, no_packs, &err);
	if (!rc && !runs)
		rc = k3_err_set(&err, -ENOMEM, "out of memory");
	if (rc)
		goto fail;
	if (preset) {
		model_dir = bs.tmpdir;
		if (prompt_len > bs.text_ids.n)
			prompt_len = bs.text_ids.n;
	}
	const struct k3_model_config *mc = k3_model_config(bs.model);
	const char *packs = bs.have_packs ? bs.packdir : NULL;
	if ((rc = k3_store_source_open_model(bs.model, packs, direct, &bs.src, &rep, &err)))
		goto fail;
	uint64_t slot = k3_store_source_slot_bytes(bs.src);
	uint64_t pool = (uint64_t)k3_store_source_count(bs.src) * slot;
	/* the plan k3d would make with nmax seats */
	struct k3_store_plan_in pi = {
		.spine_resident = spine_resident, .expert_cache_bytes = cache_bytes,
		.context_tokens = (uint32_t)(prompt_len + max_new + 1), .sequences = nmax,
		.slot_bytes = slot, .max_chunk = (uint32_t)prefill_chunk,
	};
	bool streams;
	if ((rc = k3_store_plan_model(bs.model, &pi, &plan, &streams, &err)))
		goto fail;
	struct k3_store_config cfg = {
		.cache_bytes = plan.expert_cache_bytes, .io_threads = (unsigned)io_threads,
		.prefetch_slots = -1, .prefetch_auto = true, .check_scales = true, .prefault = true,
		.min_slots = mc->num_experts_per_token * nmax,
	};
	if ((rc = k3_store_drive_opts_apply(&dopts, k3_store_source_drive_count(bs.src), &cfg, &err)) ||
	    (rc = k3_store_new(bs.src, &cfg, &bs.store, &err)))
		goto fail;
	struct k3_store_info info;
	k3_store_info_get(bs.store, &info);
	double io_rate = 0;
	for (uint32_t d = 0; d < info.n_drives; d++)
		io_rate += (double)info.drive[d].emulated_rate / 1e9;
	if ((rc = k3ctl_bench_engine_open(&bs, &plan, streams, direct, (uint32_t)threads,
					  (uint32_t)prefill_chunk, mc->num_experts_per_token, &err)))
		goto fail;

	const uint32_t V = k3_engine_vocab(bs.e);
	uint64_t rng = seed * 0x9E3779B97F4A7C15ull;
	for (uint32_t k = 0; k < nmax; k++) {
		/* different lengths, different ids: the trained text from a
		 * later start, or seeded random ids */
		uint32_t len = (uint32_t)prompt_len > 4 + 2 * k ? (uint32_t)prompt_len - 2 * k : 4;
		prompts[k] = calloc(len, sizeof(int32_t));
		ref[k] = calloc(max_new, sizeof(uint32_t));
		got[k] = calloc(max_new, sizeof(uint32_t));
		logits[k] = calloc(V, sizeof(float));
		if (!prompts[k] || !ref[k] || !got[k] || !logits[k]) {
			rc = k3_err_set(&err, -ENOMEM, "out of memory");
			goto fail;
		}
		plen[k] = len;
		for (uint32_t i = 0; i < len; i++) {
			rng = rng * 6364136223846793005ull + 1442695040888963407ull;
			prompts[k][i] = preset ? (int32_t)bs.text_ids.v[(i + k) % bs.text_ids.n]
					       : (int32_t)((rng >> 33) % V);
		}
	}
	printf("model %s: %u MoE layers x %u experts, top-%u; expert pool %.3f GB, cache %u slots = "
	       "%.3f GB (%.1f%% of the pool); spine %s; emulated drive %s%.3f GB/s\n",
	       preset ? "trained (--preset trained)" : model_dir, mc->n_moe, mc->num_experts,
	       mc->num_experts_per_token, (double)pool / 1e9, info.n_slots,
	       (double)info.n_slots * (double)info.slot_bytes / 1e9,
	       100.0 * (double)info.n_slots * (double)info.slot_bytes / (double)pool,
	       bs.spine ? "streamed" : "mapped", io_rate > 0 ? "" : "off: ", io_rate);
	if (bs.spine)
		printf("spine: %u of %u layers resident, %.3f GB streamed per pass\n",
		       bs.sinfo.resident_layers, bs.sinfo.n_layers,
		       (double)bs.sinfo.streamed_bytes_per_pass / 1e9);
	printf("%u sequences of %u..%u prompt ids, %llu ids each; %llu rounds, N interleaved\n", nmax,
	       plen[nmax - 1], plen[0], (unsigned long long)max_new, (unsigned long long)reps);
	fflush(stdout);

	/* the solo references: one position per forward call */
	for (uint32_t k = 0; k < nmax; k++) {
		struct k3_engine_out out = { K3_ENGINE_LOGITS_LAST, logits[k], NULL, NULL };
		struct k3_engine_seq *sq = NULL;
		if ((rc = k3_engine_seq_new(bs.e, plen[k] + (uint32_t)max_new + 1, &sq, &err)))
			goto fail;
		rc = k3_engine_forward(bs.e, sq, prompts[k], plen[k], &out, &err);
		for (uint32_t g = 0; !rc && g < max_new; g++) {
			int32_t tok = (int32_t)k3_engine_argmax(logits[k], V);
			ref[k][g] = (uint32_t)tok;
			if (g + 1 < max_new)
				rc = k3_engine_forward(bs.e, sq, &tok, 1, &out, &err);
		}
		k3_engine_seq_free(sq);
		if (rc)
			goto fail;
	}
	for (uint64_t round = 0; round < reps; round++) {
		for (unsigned li = 0; li < n_list; li++) {
			const uint32_t N = list[li];
			struct k3_engine_part parts[BB_MAX_N];
			struct k3_engine_out outs[BB_MAX_N];
			int32_t tok[BB_MAX_N];
			for (uint32_t k = 0; k < N; k++) {
				outs[k] = (struct k3_engine_out){ K3_ENGINE_LOGITS_LAST, logits[k], NULL, NULL };
				if ((rc = k3_engine_seq_new(bs.e, plen[k] + (uint32_t)max_new + 1, &seqs[k], &err)) ||
				    (rc = k3_engine_forward(bs.e, seqs[k], prompts[k], plen[k], &outs[k], &err)))
					goto fail;
				got[k][0] = k3_engine_argmax(logits[k], V);
			}
			bb_settle(bs.store, bs.spine);
			struct k3_store_stats x0, x1, xd;
			struct k3_store_spine_stats s0 = { 0 }, s1 = { 0 }, sd = { 0 };
			k3_store_stats_get(bs.store, &x0);
			if (bs.spine)
				k3_store_spine_stats_get(bs.spine, &s0);
			double t0 = k3ctl_bench_now_s();
			for (uint32_t g = 1; g < max_new; g++) {
				for (uint32_t k = 0; k < N; k++) {
					tok[k] = (int32_t)got[k][g - 1];
					parts[k] = (struct k3_engine_part){ seqs[k], &tok[k], 1, &outs[k], NULL };
				}
				if ((rc = k3_engine_forward_batch(bs.e, parts, N, &err)))
					goto fail;
				for (uint32_t k = 0; k < N; k++)
					got[k][g] = k3_engine_argmax(logits[k], V);
			}
			bb_settle(bs.store, bs.spine);
			double wall = k3ctl_bench_now_s() - t0;
			k3_store_stats_get(bs.store, &x1);
			k3_store_stats_sub(&x1, &x0, &xd);
			if (bs.spine) {
				k3_store_spine_stats_get(bs.spine, &s1);
				k3_store_spine_stats_sub(&s1, &s0, &sd);
			}
			struct bb_run *r = &runs[li];
			const double toks = (double)N * (double)(max_new - 1);
			r->agg_tps[r->n] = wall > 0 ? toks / wall : 0;
			r->seq_tps[r->n] = wall > 0 ? (double)(max_new - 1) / wall : 0;
			r->xbpt[r->n] = (double)xd.bytes_read / toks;
			r->sbpt[r->n] = (double)sd.bytes_read / toks;
			r->bpt[r->n] = r->xbpt[r->n] + r->sbpt[r->n];
			r->n++;
			for (uint32_t k = 0; k < N; k++) {
				r->mismatch |= memcmp(got[k], ref[k], max_new * sizeof(uint32_t)) != 0;
				k3_engine_seq_free(seqs[k]);
				seqs[k] = NULL;
			}
		}
	}
	double base = 0;
	for (unsigned li = 0; li < n_list; li++) {
		struct bb_run *r = &runs[li];
		double agg = bb_median(r->agg_tps, r->n), per = bb_median(r->seq_tps, r->n);
		double bpt = bb_median(r->bpt, r->n), x = bb_median(r->xbpt, r->n), sp = bb_median(r->sbpt, r->n);
		if (list[li] == 1)
			base = agg;
		printf("N=%u: aggregate %.2f tok/s, per sequence %.2f tok/s, %.3f MB read per generated "
		       "token (experts %.3f, spine %.3f), ids vs solo: %s\n", list[li], agg, per, bpt / 1e6,
		       x / 1e6, sp / 1e6, r->mismatch ? "MISMATCH" : "OK");
	}
	for (unsigned li = 0; li < n_list && base > 0; li++)
		if (list[li] != 1)
			printf("ratio N=%u/N=1: %.2f x aggregate\n", list[li],
			       bb_median(runs[li].agg_tps, runs[li].n) / base);
	code = K3CTL_EXIT_OK;
	for (unsigned li = 0; li < n_list; li++)
		if (runs[li].mismatch)
			code = K3CTL_EXIT_ERROR;
	rc = 0;
fail:
	if (rc)
		fprintf(stderr, "k3ctl bench: %s\n", err.msg);
	for (uint32_t k = 0; k < BB_MAX_N; k++) {
		k3_engine_seq_free(seqs[k]);
		free(prompts[k]);
		free(ref[k]);
		free(got[k]);
		free(logits[k]);
	}
	free(runs);
	k3ctl_bench_setup_close(&bs);
	return code;
}

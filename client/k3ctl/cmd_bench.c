/*
 * cmd_bench.c - `k3ctl bench --model DIR [--max-new N] [--prompt-len N]
 * [--expert-cache-gb auto|G] [--prefetch N|off] [--io-threads N]
 * [--threads N] [--no-packs] [--disk-mib M] [--seed N]`: offline (no
 * daemon) greedy generation through the expert store, measured against the
 * disk it reads from (issue 7, "Benchmarks"; docs/store.md).
 *
 * Prints tokens/s, expert bytes read per token, demand hit rate, prefetch
 * figures, and the disk's random-read bandwidth for whole expert spans
 * (O_DIRECT where the file system allows it, as many reads in flight as
 * the store has reader threads) measured in the same run, before and after
 * the generation; the larger of the two is used, so the ratios are
 * conservative:
 *
 *   cold-read ratio  = (prefill bytes read / prefill I/O wait) / disk bandwidth
 *                      (the prompt's experts are all cold and are issued
 *                      together, sorted by offset)
 *   decode vs floor  = decode time per token /
 *                      max(bytes read per token / disk bandwidth,
 *                          compute time per token)
 */
#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/parse.h"
#include "engine/engine.h"
#include "k3ctl.h"
#include "model/model.h"
#include "store/store.h"
#include "store/store_budget.h"
#include "store/store_engine.h"
#include "store/store_model.h"

enum { BENCH_MAX_NEW = 4096, BENCH_MAX_PROMPT = 4096 };

static void usage(void)
{
	fprintf(stderr,
		"usage: k3ctl bench --model DIR [--max-new N] [--prompt-len N]\n"
		"       [--expert-cache-gb auto|G] [--prefetch N|off] [--io-threads N]\n"
		"       [--threads N] [--no-packs] [--disk-mib M] [--seed N]\n");
}

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* ---- disk bandwidth: whole expert spans, random order, N in flight ---- */

struct disk_job {
	const struct k3_store_source *src;
	const size_t *order;
	size_t n;
	atomic_size_t next;
	atomic_uint_least64_t bytes;
	atomic_int error;
	uint64_t slot_bytes;
};

static void *disk_worker(void *arg)
{
	struct disk_job *j = arg;
	uint8_t *buf = NULL;

	if (posix_memalign((void **)&buf, K3_STORE_ALIGN, j->slot_bytes) != 0) {
		atomic_store(&j->error, -ENOMEM);
		return NULL;
	}
	for (;;) {
		size_t i = atomic_fetch_add(&j->next, 1);
		struct k3_store_plan plan;
		if (i >= j->n)
			break;
		k3_store_source_plan(j->src, j->order[i], &plan);
		for (unsigned r = 0; r < plan.n_reads; r++) {
			int64_t got = k3_store_source_pread(j->src, &plan.read[r], buf);
			if (got < 0) {
				atomic_store(&j->error, (int)got);
				free(buf);
				return NULL;
			}
			atomic_fetch_add(&j->bytes, (uint64_t)got);
		}
	}
	free(buf);
	return NULL;
}

/* Reads up to max_bytes of randomly chosen experts (each whole, its planned
 * reads) with `threads` reads in flight. Returns GB/s, or a negative errno. */
static double disk_bandwidth(const struct k3_store_source *src, unsigned threads,
			     uint64_t max_bytes, uint64_t *seed, uint64_t *bytes_out)
{
	size_t n = k3_store_source_count(src);
	uint64_t slot = k3_store_source_slot_bytes(src);
	size_t *order = malloc(n * sizeof(*order));
	pthread_t th[K3_STORE_MAX_IO_THREADS];
	unsigned started = 0;

	if (!order || !slot)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++)
		order[i] = i;
	for (size_t i = n; i > 1; i--) {   /* Fisher-Yates, xorshift */
		*seed ^= *seed << 13;
		*seed ^= *seed >> 7;
		*seed ^= *seed << 17;
		size_t k = (size_t)(*seed % i), t = order[i - 1];
		order[i - 1] = order[k];
		order[k] = t;
	}
	size_t take = (size_t)(max_bytes / slot);
	struct disk_job j = { .src = src, .order = order, .n = take < n ? take : n,
			      .slot_bytes = slot };
	if (j.n == 0)
		j.n = 1;
	atomic_init(&j.next, 0);
	atomic_init(&j.bytes, 0);
	atomic_init(&j.error, 0);
	double t0 = now_s();
	for (unsigned t = 0; t < threads; t++)
		if (pthread_create(&th[t], NULL, disk_worker, &j) == 0)
			started++;
	for (unsigned t = 0; t < started; t++)
		pthread_join(th[t], NULL);
	double dt = now_s() - t0;
	free(order);
	if (atomic_load(&j.error))
		return atomic_load(&j.error);
	*bytes_out = atomic_load(&j.bytes);
	return dt > 0 ? (double)*bytes_out / dt / 1e9 : 0;
}

struct phase {
	double wall_s;
	struct k3_store_stats st;
};

static void phase_print(const char *name, const struct phase *p, uint32_t tokens)
{
	const struct k3_store_stats *s = &p->st;
	uint64_t acc = s->demand_hits + s->demand_misses;
	printf("%-8s %4u tokens in %8.3f s = %8.2f tokens/s; %.0f expert bytes/token (%.2f MB); "
	       "hits %.1f%% of %llu; io wait %.3f s, compute %.3f s\n",
	       name, tokens, p->wall_s, p->wall_s > 0 ? tokens / p->wall_s : 0,
	       tokens ? (double)s->bytes_read / tokens : 0,
	       tokens ? (double)s->bytes_read / tokens / 1e6 : 0,
	       acc ? 100.0 * (double)s->demand_hits / (double)acc : 0, (unsigned long long)acc,
	       (double)s->io_wait_ns * 1e-9, p->wall_s - (double)s->io_wait_ns * 1e-9);
	printf("         prefetch: %llu issued (%.2f MB), %llu used later (%.1f%% of issued), "
	       "%llu late (same step, counted as misses), %llu cancelled, %.2f MB wasted\n",
	       (unsigned long long)s->prefetch_issued, (double)s->prefetch_issued_bytes / 1e6,
	       (unsigned long long)s->prefetch_used,
	       s->prefetch_issued ? 100.0 * (double)s->prefetch_used / (double)s->prefetch_issued : 0,
	       (unsigned long long)s->prefetch_late, (unsigned long long)s->prefetch_cancelled,
	       (double)s->prefetch_wasted_bytes / 1e6);
}

static json_t *phase_json(const struct phase *p, uint32_t tokens)
{
	const struct k3_store_stats *s = &p->st;
	return json_pack("{s:i, s:f, s:f, s:f, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f}",
			 "tokens", (json_int_t)tokens, "wall_s", p->wall_s,
			 "tokens_per_s", p->wall_s > 0 ? tokens / p->wall_s : 0.0,
			 "bytes_per_token", tokens ? (double)s->bytes_read / tokens : 0.0,
			 "bytes_read", (json_int_t)s->bytes_read,
			 "demand_hits", (json_int_t)s->demand_hits,
			 "demand_misses", (json_int_t)s->demand_misses,
			 "prefetch_issued", (json_int_t)s->prefetch_issued,
			 "prefetch_issued_bytes", (json_int_t)s->prefetch_issued_bytes,
			 "prefetch_used", (json_int_t)s->prefetch_used,
			 "prefetch_late", (json_int_t)s->prefetch_late,
			 "prefetch_cancelled", (json_int_t)s->prefetch_cancelled,
			 "prefetch_wasted_bytes", (json_int_t)s->prefetch_wasted_bytes,
			 "io_wait_s", (double)s->io_wait_ns * 1e-9);
}

int k3ctl_cmd_bench(int argc, char **argv)
{
	const char *model_dir = NULL;
	uint64_t max_new = 32, prompt_len = 32, threads = 0, io_threads = 0, disk_mib = 512;
	uint64_t cache_bytes = 0, prefetch = UINT64_MAX, seed = 1;   /* MAX: half the top-k */
	bool no_packs = false;
	struct k3_err err = { 0 };

	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
			usage();
			return K3CTL_EXIT_OK;
		}
		if (!strcmp(a, "--no-packs")) {
			no_packs = true;
			continue;
		}
		if (i + 1 >= argc)
			return k3ctl_usage("bench", "%s needs a value (see --help)", a);
		const char *val = argv[++i];
		int rc = 0;
		if (!strcmp(a, "--model"))
			model_dir = val;
		else if (!strcmp(a, "--max-new"))
			rc = k3_parse_u64(val, 1, BENCH_MAX_NEW, &max_new, &err);
		else if (!strcmp(a, "--prompt-len"))
			rc = k3_parse_u64(val, 1, BENCH_MAX_PROMPT, &prompt_len, &err);
		else if (!strcmp(a, "--threads"))
			rc = k3_parse_u64(val, 1, 256, &threads, &err);
		else if (!strcmp(a, "--io-threads"))
			rc = k3_parse_u64(val, 1, K3_STORE_MAX_IO_THREADS, &io_threads, &err);
		else if (!strcmp(a, "--disk-mib"))
			rc = k3_parse_u64(val, 1, 1 << 20, &disk_mib, &err);
		else if (!strcmp(a, "--seed"))
			rc = k3_parse_u64(val, 1, UINT64_MAX, &seed, &err);
		else if (!strcmp(a, "--expert-cache-gb"))
			rc = k3_store_budget_parse_gb(val, &cache_bytes, &err);
		else if (!strcmp(a, "--prefetch"))
			rc = !strcmp(val, "off") ? (prefetch = 0, 0) : k3_parse_u64(val, 0, 64, &prefetch, &err);
		else
			return k3ctl_usage("bench", "unknown option '%s' (see --help)", a);
		if (rc)
			return k3ctl_usage("bench", "%s: %s", a, err.msg);
	}
	if (!model_dir)
		return k3ctl_usage("bench", "--model DIR is required");

	struct k3_model *model = NULL;
	struct k3_engine *e = NULL;
	struct k3_engine_seq *seq = NULL;
	struct k3_store_source *src = NULL;
	struct k3_store *store = NULL;
	struct k3_store_engine_src ectx;
	bool ectx_init = false;
	struct k3_store_open_report rep = { 0 };
	int32_t *ids = NULL;
	uint32_t *gen_ids = NULL;
	float *logits = NULL;
	int code = K3CTL_EXIT_ERROR, rc;
	char packdir[4096];

	rc = k3_model_open(model_dir, &model, &err);
	if (rc)
		goto fail;
	const struct k3_model_config *mc = k3_model_config(model);
	if (!mc->n_moe) {
		k3_err_set(&err, -EINVAL, "the model has no MoE layers: nothing to stream");
		goto fail;
	}
	snprintf(packdir, sizeof(packdir), "%s/%s", model_dir, K3_STORE_PACK_SUBDIR);
	bool have_packs = !no_packs && access(packdir, F_OK) == 0;
	if ((rc = k3_store_source_open_model(model, have_packs ? packdir : NULL, K3_STORE_DIRECT_AUTO,
					     &src, &rep, &err)))
		goto fail;
	uint64_t slot = k3_store_source_slot_bytes(src);
	uint64_t pool = (uint64_t)k3_store_source_count(src) * slot;
	size_t n_t = 0;
	const struct k3_tensor *t = k3_model_tensors(model, &n_t);
	uint64_t weights = 0;
	for (size_t i = 0; i < n_t; i++)
		weights += t[i].nbytes;
	struct k3_store_budget_in bi = {
		.spine_bytes = weights > pool ? weights - pool : 0,
		.state_bytes = (uint64_t)512 << 20,
		.slot_bytes = slot, .floor_slots = mc->num_experts_per_token,
		.requested_bytes = cache_bytes,
	};
	if (prefetch == UINT64_MAX)
		prefetch = mc->num_experts_per_token / 2 ? mc->num_experts_per_token / 2 : 1;
	struct k3_store_budget_out b;
	if ((rc = k3_store_budget(&bi, &b, &err)))
		goto fail;
	uint64_t cache = b.cache_bytes < pool ? b.cache_bytes : pool;
	if (cache < b.floor_bytes)
		cache = b.floor_bytes;
	struct k3_store_config cfg = {
		.cache_bytes = cache, .io_threads = (unsigned)io_threads,
		.prefetch_slots = prefetch ? -1 : 0, .check_scales = true, .prefault = true,
	};
	if ((rc = k3_store_new(src, &cfg, &store, &err)))
		goto fail;
	struct k3_store_info info;
	k3_store_info_get(store, &info);

	struct k3_engine_opts eo = { .threads = (uint32_t)threads };
	if ((rc = k3_engine_open(model, &eo, &e, &err)))
		goto fail;
	struct k3_expert_source es;
	k3_store_engine_src_init(&ectx, store, &es);
	ectx_init = true;
	k3_store_engine_src_set_prefetch(&ectx, (uint32_t)prefetch, &es);
	k3_engine_set_expert_source(e, &es);

	uint32_t V = k3_engine_vocab(e);
	ids = calloc(prompt_len, sizeof(*ids));
	logits = calloc(V, sizeof(*logits));
	gen_ids = calloc(max_new, sizeof(*gen_ids));
	if (!ids || !logits || !gen_ids) {
		rc = k3_err_set(&err, -ENOMEM, "out of memory");
		goto fail;
	}
	uint64_t rng = seed * 0x9E3779B97F4A7C15ull;
	for (uint64_t i = 0; i < prompt_len; i++) {
		rng = rng * 6364136223846793005ull + 1442695040888963407ull;
		ids[i] = (int32_t)((rng >> 33) % V);
	}

	FILE *hdr = k3ctl_g.json ? stderr : stdout;   /* --json: stdout is one JSON object */
	fprintf(hdr, "model %s: %u MoE layers x %u experts, top-%u; %zu experts of %llu bytes = %.3f GB\n",
	       model_dir, mc->n_moe, mc->num_experts, mc->num_experts_per_token,
	       k3_store_source_count(src), (unsigned long long)slot, (double)pool / 1e9);
	fprintf(hdr, "experts from %s; %u files O_DIRECT, %u buffered; cache %u slots = %.3f GB "
	       "(%.1f%% of the experts; floor %.3f GB); %u I/O threads; prefetch %u per position\n",
	       rep.layers_packed ? (rep.layers_shards ? "packs and shards" : "packs") : "shards",
	       info.files_direct, info.files_buffered, info.n_slots,
	       (double)info.n_slots * (double)info.slot_bytes / 1e9,
	       100.0 * (double)info.n_slots * (double)info.slot_bytes / (double)pool,
	       (double)b.floor_bytes / 1e9, info.io_threads,
	       (unsigned)prefetch);
	fflush(hdr);

	uint64_t dseed = seed ^ 0xD1B54A32D192ED03ull, dbytes0 = 0, dbytes1 = 0;
	double bw0 = disk_bandwidth(src, info.io_threads, disk_mib << 20, &dseed, &dbytes0);
	if (bw0 < 0) {
		rc = k3_err_set(&err, (int)bw0, "disk read failed: %s", strerror((int)-bw0));
		goto fail;
	}

	struct k3_store_stats s0, s1, s2;
	struct phase pre, dec;
	if ((rc = k3_engine_seq_new(e, (uint32_t)(prompt_len + max_new + 1), &seq, &err)))
		goto fail;
	k3_store_stats_get(store, &s0);
	double t0 = now_s();
	struct k3_engine_out out = { K3_ENGINE_LOGITS_LAST, logits, NULL, NULL };
	if ((rc = k3_engine_forward(e, seq, ids, (uint32_t)prompt_len, &out, &err)))
		goto fail;
	k3_store_prefetch_cancel(store, UINT32_MAX);
	k3_store_drain(store);
	double t1 = now_s();
	k3_store_stats_get(store, &s1);
	uint32_t gen = 0;
	for (; gen < max_new; gen++) {
		int32_t tok = (int32_t)k3_engine_argmax(logits, V);
		gen_ids[gen] = (uint32_t)tok;
		if ((rc = k3_engine_forward(e, seq, &tok, 1, &out, &err)))
			goto fail;
	}
	k3_store_prefetch_cancel(store, UINT32_MAX);
	k3_store_drain(store);
	double t2 = now_s();
	k3_store_stats_get(store, &s2);
	pre.wall_s = t1 - t0;
	k3_store_stats_sub(&s1, &s0, &pre.st);
	dec.wall_s = t2 - t1;
	k3_store_stats_sub(&s2, &s1, &dec.st);

	double bw1 = disk_bandwidth(src, info.io_threads, disk_mib << 20, &dseed, &dbytes1);
	if (bw1 < 0) {
		rc = k3_err_set(&err, (int)bw1, "disk read failed: %s", strerror((int)-bw1));
		goto fail;
	}
	double bw = bw0 > bw1 ? bw0 : bw1;   /* conservative: the faster disk */

	double pre_wait = (double)pre.st.io_wait_ns * 1e-9;
	double cold_rate = pre_wait > 0 ? (double)pre.st.bytes_read / pre_wait / 1e9 : 0;
	double dec_wait = (double)dec.st.io_wait_ns * 1e-9;
	double per_tok = dec.wall_s / (double)max_new;
	double compute_tok = (dec.wall_s - dec_wait) / (double)max_new;
	double bytes_tok = (double)dec.st.bytes_read / (double)max_new;
	double read_tok = bw > 0 ? bytes_tok / (bw * 1e9) : 0;
	double floor_tok = read_tok > compute_tok ? read_tok : compute_tok;
	uint64_t dacc = dec.st.demand_hits + dec.st.demand_misses;

	if (k3ctl_g.json) {
		json_t *o = json_pack("{s:s, s:I, s:I, s:I, s:i, s:o, s:o, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f}",
				      "model", model_dir, "expert_bytes", (json_int_t)slot,
				      "pool_bytes", (json_int_t)pool,
				      "cache_bytes", (json_int_t)((uint64_t)info.n_slots * info.slot_bytes),
				      "io_threads", (int)info.io_threads,
				      "prefill", phase_json(&pre, (uint32_t)prompt_len),
				      "decode", phase_json(&dec, (uint32_t)max_new),
				      "disk_gbps_before", bw0, "disk_gbps_after", bw1,
				      "cold_read_gbps", cold_rate,
				      "cold_read_ratio", bw > 0 ? cold_rate / bw : 0.0,
				      "decode_s_per_token", per_tok,
				      "compute_s_per_token", compute_tok,
				      "floor_s_per_token", floor_tok,
				      "decode_vs_floor", floor_tok > 0 ? per_tok / floor_tok : 0.0);
		json_t *g = json_array();
		for (uint32_t i = 0; i < gen; i++)
			json_array_append_new(g, json_integer(gen_ids[i]));
		json_object_set_new(o, "greedy", g);
		char *txt = json_dumps(o, JSON_COMPACT);
		if (txt)
			puts(txt);
		free(txt);
		json_decref(o);
	} else {
		phase_print("prefill", &pre, (uint32_t)prompt_len);
		phase_print("decode", &dec, (uint32_t)max_new);
		printf("greedy ids:");
		for (uint32_t i = 0; i < gen && i < 8; i++)
			printf(" %u", gen_ids[i]);
		printf("%s\n", gen > 8 ? " ..." : "");
		printf("disk: %.3f GB/s before, %.3f GB/s after (random whole-expert reads, %u in flight, "
		       "%.0f MB each); using %.3f GB/s\n", bw0, bw1, info.io_threads,
		       (double)dbytes0 / 1e6, bw);
		printf("cold reads (prefill, all misses issued together): %.3f GB/s = %.2f x disk "
		       "(target >= 0.90)\n", cold_rate, bw > 0 ? cold_rate / bw : 0);
		struct k3_store_stats all;
		k3_store_stats_sub(&s2, &s0, &all);
		printf("decode: %.2f tokens/s, %.2f MB read/token, hit rate %.1f%% (%.1f%% of accesses "
		       "served by an earlier step's prefetch); prefetch precision over the run %.1f%% "
		       "(used later / issued)\n", dec.wall_s > 0 ? max_new / dec.wall_s : 0, bytes_tok / 1e6,
		       dacc ? 100.0 * (double)dec.st.demand_hits / (double)dacc : 0,
		       dacc ? 100.0 * (double)dec.st.prefetch_used / (double)dacc : 0,
		       all.prefetch_issued ? 100.0 * (double)all.prefetch_used /
						(double)all.prefetch_issued : 0);
		printf("decode time/token %.4f s vs floor max(read %.4f s, compute %.4f s) = %.4f s: "
		       "%.2f x floor (target <= 1.2)\n", per_tok, read_tok, compute_tok, floor_tok,
		       floor_tok > 0 ? per_tok / floor_tok : 0);
	}
	code = K3CTL_EXIT_OK;
	rc = 0;
fail:
	if (rc)
		fprintf(stderr, "k3ctl bench: %s\n", err.msg);
	free(ids);
	free(gen_ids);
	free(logits);
	k3_engine_seq_free(seq);
	k3_engine_free(e);
	if (ectx_init)
		k3_store_engine_src_release(&ectx);
	k3_store_free(store);
	k3_store_source_free(src);
	k3_model_free(model);
	return code;
}

/*
 * bench_store_policy.c - eviction policies (LRU vs frequency-aware) replayed
 * on router traces through the real store code in dry-run mode (no memory,
 * no reads: the counters are exact, the timing irrelevant).
 *
 *   bench_store_policy [--requests N]  the trained demo model's routing (default)
 *   bench_store_policy TRACE.jsonl     a recorded --router-trace file
 *   bench_store_policy --synthetic     synthetic traces (below), K3's shape
 *
 * The default trace comes from the trained demo model (tools/train_demo/):
 * tools/train_demo/trace.sh runs N (default 40) held-out requests of its
 * corpus through this build's k3d with --router-trace into a temporary
 * file, which is replayed and removed. That is the routing realism the
 * policies are judged on: a trained router, balanced by K3's own rule, on
 * text (32 experts, top-4: 7 MoE layers; the README's routing table says
 * how far it is from K3's). The synthetic traces keep K3's shape (896
 * experts, top-16) with invented locality; a real K3 trace is a FILE.
 *
 * Synthetic traces, 8 MoE layers x 896 experts, top-16, 1024 tokens in
 * requests of 128 (seeded, reproducible):
 *   uniform  every expert equally likely: no policy can beat cache/size
 *   zipf     fixed per-layer popularity ~ 1/rank^0.8 (rank a random
 *            permutation per layer)
 *   topic    zipf 0.8 popularity, and each request boosts a random 64
 *            experts per layer x8 (context-dependent routing)
 *   sticky   zipf 0.8, and each of the previous token's experts in a layer
 *            is routed again with probability 1/2 (token-to-token reuse)
 * For each, caches of 10%, 25% and 50% of all experts. Printed: the miss
 * rate over the whole trace and after warm-up (last 75% of tokens).
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/parse.h"
#include "store/store.h"
#include "store/store_trace.h"

enum { LAYERS = 8, EXPERTS = 896, TOPK = 16, TOKENS = 1024, REQ = 128, HOT = 64 };

struct trace {
	uint32_t n;            /* records */
	uint32_t *layer;
	uint32_t *k;
	uint32_t (*ids)[K3_STORE_TRACE_MAX_K];
	uint32_t per_token;    /* records per token (layers) */
	uint32_t max_layer, max_expert;
	uint32_t max_k;        /* the most ids of one record: the store's floor in slots */
};

static uint64_t rng;
static double urand(void)
{
	rng ^= rng >> 12;
	rng ^= rng << 25;
	rng ^= rng >> 27;
	return (double)((rng * 0x2545F4914F6CDD1Dull) >> 11) * 0x1p-53;
}

static int trace_alloc(struct trace *t, uint32_t n)
{
	t->layer = malloc(n * sizeof(*t->layer));
	t->k = malloc(n * sizeof(*t->k));
	t->ids = malloc(n * sizeof(*t->ids));
	return t->layer && t->k && t->ids ? 0 : -ENOMEM;
}

/* kind: 0 uniform, 1 zipf, 2 topic, 3 sticky */
static int synth(struct trace *t, int kind, uint64_t seed)
{
	static double base[LAYERS][EXPERTS], w[EXPERTS], cum[EXPERTS];
	static uint32_t boost[LAYERS][HOT];

	rng = seed;
	memset(t, 0, sizeof(*t));
	if (trace_alloc(t, TOKENS * LAYERS))
		return -ENOMEM;
	t->per_token = LAYERS;
	t->max_layer = LAYERS;
	t->max_expert = EXPERTS - 1;
	for (int l = 0; l < LAYERS; l++) {
		uint32_t perm[EXPERTS];
		for (uint32_t e = 0; e < EXPERTS; e++)
			perm[e] = e;
		for (uint32_t e = EXPERTS - 1; e > 0; e--) {
			uint32_t j = (uint32_t)(urand() * (e + 1)), x = perm[e];
			perm[e] = perm[j];
			perm[j] = x;
		}
		for (uint32_t r = 0; r < EXPERTS; r++)
			base[l][perm[r]] = kind == 0 ? 1.0 : pow((double)(r + 1), -0.8);
	}
	for (uint32_t tok = 0; tok < TOKENS; tok++) {
		if (kind == 2 && tok % REQ == 0)
			for (int l = 0; l < LAYERS; l++)
				for (int h = 0; h < HOT; h++)
					boost[l][h] = (uint32_t)(urand() * EXPERTS);
		for (uint32_t l = 0; l < LAYERS; l++) {
			uint32_t rec = t->n++;
			bool taken[EXPERTS] = { false };
			memcpy(w, base[l], sizeof(w));
			if (kind == 2)
				for (int h = 0; h < HOT; h++)
					w[boost[l][h]] = base[l][boost[l][h]] * 8.0;
			double s = 0;
			for (uint32_t e = 0; e < EXPERTS; e++)
				cum[e] = (s += w[e]);
			t->layer[rec] = l + 1;
			t->k[rec] = TOPK;
			t->max_k = TOPK;
			uint32_t k0 = 0;
			if (kind == 3 && tok > 0) {
				/* Sticky: each of the previous token's experts is
				 * kept with probability 1/2 (token-to-token reuse). */
				const uint32_t *prev = t->ids[rec - LAYERS];
				for (uint32_t k = 0; k < TOPK; k++)
					if (urand() < 0.5) {
						taken[prev[k]] = true;
						t->ids[rec][k0++] = prev[k];
					}
			}
			for (uint32_t k = k0; k < TOPK;) {
				double x = urand() * s;
				uint32_t lo = 0, hi = EXPERTS - 1;
				while (lo < hi) {
					uint32_t mid = (lo + hi) / 2;
					if (cum[mid] <= x)
						lo = mid + 1;
					else
						hi = mid;
				}
				if (!taken[lo]) {
					taken[lo] = true;
					t->ids[rec][k++] = lo;
				}
			}
		}
	}
	t->max_layer = LAYERS + 1;
	return 0;
}

static int load(struct trace *t, const char *path)
{
	FILE *f = fopen(path, "r");
	char line[K3_STORE_TRACE_LINE_MAX + 2];
	struct k3_store_trace_rec rec;
	struct k3_err err = { 0 };
	uint32_t cap = 0;
	uint64_t first_pos = UINT64_MAX;

	memset(t, 0, sizeof(*t));
	if (!f)
		return -errno;
	while (fgets(line, sizeof(line), f)) {
		if (k3_store_trace_parse(line, strlen(line), &rec, &err) != 0) {
			fprintf(stderr, "%s: %s\n", path, err.msg);
			fclose(f);
			return -EINVAL;
		}
		if (t->n == cap) {
			cap = cap ? cap * 2 : 4096;
			t->layer = realloc(t->layer, cap * sizeof(*t->layer));
			t->k = realloc(t->k, cap * sizeof(*t->k));
			t->ids = realloc(t->ids, cap * sizeof(*t->ids));
			if (!t->layer || !t->k || !t->ids)
				return -ENOMEM;
		}
		if (first_pos == UINT64_MAX)
			first_pos = rec.position;
		if (rec.position == first_pos)
			t->per_token++;
		t->layer[t->n] = rec.layer;
		t->k[t->n] = rec.k;
		if (rec.k > t->max_k)
			t->max_k = rec.k;
		memcpy(t->ids[t->n], rec.ids, sizeof(rec.ids));
		if (rec.layer + 1 > t->max_layer)
			t->max_layer = rec.layer + 1;
		for (uint32_t i = 0; i < rec.k; i++)
			if (rec.ids[i] > t->max_expert)
				t->max_expert = rec.ids[i];
		t->n++;
	}
	fclose(f);
	return t->n ? 0 : -EINVAL;
}

/* Records the trained model's trace into out: tools/train_demo/trace.sh
 * with this build's k3d and k3ctl (K3_BUILD), its report on stderr.
 * Returns 0 or -EIO (the script failed; its messages are on stderr). */
static int record_trained(const char *out, const char *requests)
{
	static const char script[] = K3_BENCH_SOURCE_ROOT "/tools/train_demo/trace.sh";
	fflush(stdout);
	pid_t pid = fork();
	if (pid < 0)
		return -errno;
	if (pid == 0) {
		dup2(2, 1);   /* stdout is the table's */
		setenv("K3_BUILD", K3_BENCH_BUILD_ROOT, 1);
		execl(script, script, out, requests, (char *)NULL);
		fprintf(stderr, "%s: %s\n", script, strerror(errno));
		_exit(127);
	}
	int st = 0;
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			return -errno;
	return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -EIO;
}

static int usage_error(const char *msg)
{
	fprintf(stderr, "bench_store_policy: %s (usage: bench_store_policy [--requests N | "
		"TRACE.jsonl | --synthetic])\n", msg);
	return 2;
}

/* Replays t through a dry-run store; returns miss rates. */
static void replay(const struct trace *t, const struct k3_store_source *src, uint64_t slots,
		   enum k3_store_policy pol, double *all, double *warm)
{
	struct k3_store_config cfg = { .cache_bytes = slots * k3_store_source_slot_bytes(src),
				       .policy = pol, .prefetch_slots = 0, .dry_run = true };
	struct k3_store *s = NULL;
	struct k3_store_view v[K3_STORE_TRACE_MAX_K];
	struct k3_store_stats a, b;
	struct k3_err err = { 0 };
	uint32_t warm_from = t->n / 4;

	if (k3_store_new(src, &cfg, &s, &err) != 0) {
		fprintf(stderr, "%s\n", err.msg);
		exit(1);
	}
	memset(&a, 0, sizeof(a));
	for (uint32_t r = 0; r < t->n; r++) {
		if (r == warm_from)
			k3_store_stats_get(s, &a);
		k3_store_step_begin(s);
		if (k3_store_acquire(s, t->layer[r], t->ids[r], t->k[r], v, &err) != 0) {
			fprintf(stderr, "record %" PRIu32 ": %s\n", r, err.msg);
			exit(1);
		}
		k3_store_release(s, v, t->k[r]);
	}
	k3_store_stats_get(s, &b);
	k3_store_free(s);
	*all = (double)b.demand_misses / (double)(b.demand_hits + b.demand_misses);
	*warm = (double)(b.demand_misses - a.demand_misses) /
		(double)(b.demand_hits + b.demand_misses - a.demand_hits - a.demand_misses);
}

int main(int argc, char **argv)
{
	const char *tmp = getenv("TMPDIR");
	char path[4096];
	static const char *const kinds[] = { "uniform", "zipf", "topic", "sticky" };
	const char *trace_path = NULL, *requests = "40";
	char trained[4096] = "";
	bool synthetic = false, requests_set = false;

	for (int i = 1; i < argc; i++) {
		uint64_t n;
		struct k3_err perr = { 0 };
		if (!strcmp(argv[i], "--synthetic"))
			synthetic = true;
		else if (!strcmp(argv[i], "--requests")) {
			if (i + 1 >= argc)
				return usage_error("--requests needs a value");
			if (k3_parse_u64(argv[++i], 1, 10000, &n, &perr))
				return usage_error(perr.msg);
			requests = argv[i];
			requests_set = true;
		} else if (argv[i][0] == '-' || trace_path)
			return usage_error("unexpected argument");
		else
			trace_path = argv[i];
	}
	if (synthetic + !!trace_path + requests_set > 1)
		return usage_error("--synthetic, --requests and TRACE.jsonl exclude each other");
	if (!synthetic && !trace_path) {
		snprintf(trained, sizeof(trained), "%s/k3-trained-trace.XXXXXX", tmp ? tmp : "/tmp");
		int tfd = mkstemp(trained);
		if (tfd < 0) {
			perror("temp trace");
			return 1;
		}
		close(tfd);
		int rc = record_trained(trained, requests);
		if (rc) {
			fprintf(stderr, "bench_store_policy: recording the trained model's trace failed "
				"(%s)\n", strerror(-rc));
			unlink(trained);
			return 1;
		}
		trace_path = trained;
	}
	int n_traces = trace_path ? 1 : 4;

	/* A one-page file: every expert is 6 one-byte extents of it. */
	snprintf(path, sizeof(path), "%s/k3-policy.XXXXXX", tmp ? tmp : "/tmp");
	int fd = mkstemp(path);
	if (fd < 0 || ftruncate(fd, 4096) != 0) {
		perror("temp file");
		return 1;
	}
	close(fd);
	printf("%-8s %6s %8s %12s %12s %12s %12s\n", "trace", "cache", "slots", "LRU all",
	       "FREQ all", "LRU warm", "FREQ warm");
	for (int k = 0; k < n_traces; k++) {
		struct trace t;
		struct k3_err err = { 0 };
		struct k3_store_source *src = k3_store_source_new(K3_STORE_DIRECT_OFF);
		uint32_t file;
		int rc = trace_path ? load(&t, trace_path) : synth(&t, k, 0x1234 + (uint64_t)k);
		if (rc) {
			fprintf(stderr, "trace: %s\n", strerror(-rc));
			if (trained[0])
				unlink(trained);
			return 1;
		}
		if (k3_store_source_add_file(src, path, &file, &err) != 0)
			return 1;
		/* Every (layer, expert) the trace may name. */
		uint64_t total = 0;
		for (uint32_t l = 0; l < t.max_layer; l++)
			for (uint32_t e = 0; e <= t.max_expert; e++) {
				struct k3_store_expert x = { .layer = l, .expert = e };
				for (int a = 0; a < K3_STORE_ARRAYS; a++)
					x.ext[a] = (struct k3_store_extent){ .file = file,
						.offset = (uint64_t)a, .length = 1 };
				if (k3_store_source_add_expert(src, &x, &err) != 0) {
					fprintf(stderr, "%s\n", err.msg);
					return 1;
				}
			}
		/* Experts in MoE layers only (the synthetic layer 0 is dense). */
		total = (uint64_t)(trace_path ? t.max_layer : LAYERS) * (t.max_expert + 1);
		static const int pct[3] = { 10, 25, 50 };
		for (int c = 0; c < 3; c++) {
			uint64_t slots = total * (uint64_t)pct[c] / 100;
			double lru_all, lru_warm, freq_all, freq_warm;
			if (slots < t.max_k)
				slots = t.max_k;   /* a step's experts must fit */
			replay(&t, src, slots, K3_STORE_POLICY_LRU, &lru_all, &lru_warm);
			replay(&t, src, slots, K3_STORE_POLICY_FREQ, &freq_all, &freq_warm);
			printf("%-8s %5d%% %8" PRIu64 " %11.2f%% %11.2f%% %11.2f%% %11.2f%%\n",
			       trained[0] ? "trained" : trace_path ? "file" : kinds[k], pct[c], slots,
			       100 * lru_all, 100 * freq_all, 100 * lru_warm, 100 * freq_warm);
			fflush(stdout);
		}
		k3_store_source_free(src);
		free(t.layer);
		free(t.k);
		free(t.ids);
	}
	printf("(miss rates: lower is better; bytes read per token = miss rate x experts"
	       " per token x expert bytes)\n");
	unlink(path);
	if (trained[0])
		unlink(trained);
	return 0;
}

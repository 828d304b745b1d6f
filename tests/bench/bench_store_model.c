/*
 * bench_store_model.c - cold expert reads through the store from a real
 * checkpoint directory, from its shards and from its packs, alternating.
 *
 *   bench_store_model MODEL_DIR PACK_DIR [ROUNDS]
 *
 * Make one with real K3 expert shapes and a pool larger than the cache:
 *   k3ctl demo-model --out D --preset bench --experts 32
 *   k3ctl pack --model D
 *   bench_store_model D D/k3-packs
 * Each pass reads every expert of every MoE layer once, in random steps of
 * 16 (a K3 token's layer), through a 24-slot cache (so every read is a
 * miss), 2 I/O threads. Prints GB/s per pass and the medians.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "base/parse.h"
#include "model/model.h"
#include "store/store.h"
#include "store/store_model.h"

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t rng = 88172645463325252ull;
static uint32_t rnd(uint32_t n)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (uint32_t)(rng % n);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double pass(const struct k3_model *m, const struct k3_store_source *src)
{
	const struct k3_model_plan *plan = k3_model_plan(m);
	struct k3_store_config cfg = { .cache_bytes = 24 * k3_store_source_slot_bytes(src),
				       .prefetch_slots = 0 };
	struct k3_store *s = NULL;
	struct k3_store_view v[16];
	struct k3_store_stats st;
	struct k3_err err = { 0 };
	uint32_t ids[K3_MODEL_MAX_EXPERTS];
	double t0;

	if (k3_store_new(src, &cfg, &s, &err) != 0) {
		fprintf(stderr, "%s\n", err.msg);
		exit(1);
	}
	t0 = now_s();
	for (uint32_t l = 0; l < plan->n_layers; l++) {
		uint32_t n = plan->layers[l].moe.n_experts;
		if (!plan->layers[l].is_moe)
			continue;
		for (uint32_t e = 0; e < n; e++)
			ids[e] = e;
		for (uint32_t e = n - 1; e > 0; e--) {
			uint32_t j = rnd(e + 1), t = ids[e];
			ids[e] = ids[j];
			ids[j] = t;
		}
		for (uint32_t i = 0; i < n; i += 16) {
			uint32_t k = n - i < 16 ? n - i : 16;
			k3_store_step_begin(s);
			if (k3_store_acquire(s, l, ids + i, k, v, &err) != 0) {
				fprintf(stderr, "%s\n", err.msg);
				exit(1);
			}
			k3_store_release(s, v, k);
		}
	}
	double dt = now_s() - t0;
	k3_store_stats_get(s, &st);
	k3_store_free(s);
	return (double)st.bytes_read / dt / 1e9;
}

int main(int argc, char **argv)
{
	struct k3_model *m = NULL;
	struct k3_store_source *shards = NULL, *packs = NULL;
	struct k3_store_open_report rep;
	struct k3_err err = { 0 };
	uint64_t rounds = 3;
	double a[99], b[99];

	if (argc < 3 || (argc > 3 && k3_parse_u64(argv[3], 1, 99, &rounds, &err) != 0)) {
		fprintf(stderr, "usage: bench_store_model MODEL_DIR PACK_DIR [ROUNDS]\n");
		return 2;
	}
	if (k3_model_open(argv[1], &m, &err) != 0 ||
	    k3_store_source_open_model(m, NULL, K3_STORE_DIRECT_AUTO, &shards, NULL, &err) != 0 ||
	    k3_store_source_open_model(m, argv[2], K3_STORE_DIRECT_AUTO, &packs, &rep, &err) != 0) {
		fprintf(stderr, "%s\n", err.msg);
		return 1;
	}
	printf("# %zu experts of %" PRIu64 "-byte slots; packs for %" PRIu32 " of %" PRIu32
	       " MoE layers; O_DIRECT shards %s, packs %s\n", k3_store_source_count(shards),
	       k3_store_source_slot_bytes(packs), rep.layers_packed,
	       rep.layers_packed + rep.layers_shards,
	       k3_store_source_file_direct(shards, 0) ? "yes" : "no",
	       k3_store_source_file_direct(packs, (uint32_t)k3_store_source_file_count(packs) - 1)
		       ? "yes" : "no");
	for (uint64_t r = 0; r < rounds; r++) {
		if (r % 2) {
			b[r] = pass(m, packs);
			a[r] = pass(m, shards);
		} else {
			a[r] = pass(m, shards);
			b[r] = pass(m, packs);
		}
		printf("# round %" PRIu64 ": shards %.3f GB/s, packs %.3f GB/s\n", r, a[r], b[r]);
		fflush(stdout);
	}
	qsort(a, rounds, sizeof(double), cmp_double);
	qsort(b, rounds, sizeof(double), cmp_double);
	printf("median: shards %.3f GB/s, packs %.3f GB/s (store, 2 I/O threads, cold)\n",
	       a[rounds / 2], b[rounds / 2]);
	k3_store_source_free(shards);
	k3_store_source_free(packs);
	k3_model_free(m);
	return 0;
}

/*
 * bench_vram.c - the VRAM expert tier's upload rate against the device's
 * pinned host-to-device copy rate, measured in the same run (issue 22
 * target: >= 80 %). A program, not a test: it prints, never asserts.
 *
 *   bench_vram [--experts N] [--runs N] [--copy-threads N]
 *
 * Experts have K3's shapes (w1/w3 3072 x 3584, w2 3584 x 3072 MXFP4:
 * 17,547,264 bytes of arrays, 17.55 MB in a slot) and random bytes, in
 * ordinary (pageable) host memory as the store's RAM cache holds them.
 * Each run uploads all N as misses of a fresh layer through the tier
 * (copy into a pinned staging buffer, upload, double buffered), then
 * waits for the last; "pinned" is one k3_cuda_upload of the same bytes
 * from a pinned buffer, the physical limit. Medians of the runs.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/parse.h"
#include "bench_util.h"
#include "k3_cuda.h"
#include "kern_pool.h"
#include "vram/vram.h"
#include "vram/vram_cuda.h"

enum { INTER = 3072, LATENT = 3584 };

int main(int argc, char **argv)
{
	uint64_t n_exp = 32, runs = 7, copy_threads = 8;
	for (int i = 1; i + 1 < argc; i += 2) {
		uint64_t *dst = !strcmp(argv[i], "--experts") ? &n_exp
			      : !strcmp(argv[i], "--runs") ? &runs
			      : !strcmp(argv[i], "--copy-threads") ? &copy_threads : NULL;
		if (!dst || k3_parse_u64(argv[i + 1], 1, 1024, dst, NULL)) {
			fprintf(stderr, "usage: bench_vram [--experts N] [--runs N] [--copy-threads N]\n");
			return 2;
		}
	}
	if (runs > 64)
		runs = 64;
	struct k3_cuda_status cs = { 0 };
	int ndev = 0;
	if (k3_cuda_device_count(&ndev, &cs) || ndev == 0) {
		printf("bench_vram: no CUDA device\n");
		return 77;
	}
	struct k3_cuda_dev *up = NULL, *cmp = NULL;
	if (k3_cuda_open(0, &up, &cs) || k3_cuda_open(0, &cmp, &cs)) {
		fprintf(stderr, "bench_vram: %s\n", cs.msg);
		return 1;
	}
	struct k3_cuda_info info;
	k3_cuda_query(up, &info, &cs);
	uint64_t ab[K3_VRAM_ARRAYS], off[K3_VRAM_ARRAYS];
	uint64_t n = (uint64_t)INTER * LATENT;
	for (int a = 0; a < K3_VRAM_ARRAYS; a++)
		ab[a] = a % 2 == 0 ? n / 2 : n / 32;
	uint64_t slot = k3_vram_layout(ab, off);
	size_t host_bytes = (size_t)n_exp * slot;
	uint8_t *host = malloc(host_bytes);
	if (!host)
		return 1;
	k3_bench_fill_random(host, host_bytes);

	/* the limit: pinned -> device, the same bytes per run */
	void *pin = NULL, *dbuf = NULL;
	if (k3_cuda_host_alloc(up, slot * 4, &pin, &cs) || k3_cuda_alloc(up, slot * 4, &dbuf, &cs)) {
		fprintf(stderr, "bench_vram: %s\n", cs.msg);
		return 1;
	}
	memcpy(pin, host, slot * 4);
	double tp[64], tt[64];
	for (uint64_t r = 0; r < runs; r++) {
		double t0 = k3_bench_now();
		for (uint64_t e = 0; e < n_exp; e += 4)
			k3_cuda_upload(up, dbuf, pin, slot * 4, &cs);
		k3_cuda_sync(up, &cs);
		tp[r] = k3_bench_now() - t0;
	}
	double pinned = (double)((n_exp + 3) / 4 * 4) * slot / k3_bench_median(tp, (int)runs) / 1e9;

	struct k3_err err = { 0 };
	struct k3_kern_pool *pool = copy_threads > 1 ? k3_kern_pool_new((int)copy_threads, &err) : NULL;
	struct k3_vram_cuda vc = { up, cmp };
	struct k3_vram_dev dev;
	k3_vram_cuda_dev(&vc, &dev);
	struct k3_vram_config cfg = { .budget_bytes = (n_exp + K3_VRAM_TRANSIENT) * slot,
				      .n_layers = (uint32_t)runs, .n_experts = (uint32_t)n_exp,
				      .copy_pool = pool };
	memcpy(cfg.array_bytes, ab, sizeof(ab));
	struct k3_vram *v = NULL;
	if (k3_vram_new(&dev, &cfg, &v, &err)) {
		fprintf(stderr, "bench_vram: %s\n", err.msg);
		return 1;
	}
	for (uint64_t r = 0; r < runs; r++) {
		/* a fresh layer each run: every expert a miss (the last run's
		 * are evicted, which costs nothing on the device) */
		uint8_t res[1024];
		uint32_t ids[1024];
		for (uint32_t e = 0; e < n_exp; e++)
			ids[e] = e;
		k3_vram_plan(v, (uint32_t)r, ids, n_exp, res, &err);
		double t0 = k3_bench_now();
		for (uint32_t e = 0; e < n_exp; e++) {
			const uint8_t *b = host + (size_t)e * slot;
			struct k3_prov_expert sp = { b + off[0], b + off[1], b + off[2],
						     b + off[3], b + off[4], b + off[5] };
			int s;
			if (k3_vram_load(v, (uint32_t)r, e, &sp, &s, &err)) {
				fprintf(stderr, "bench_vram: %s\n", err.msg);
				return 1;
			}
		}
		k3_vram_drain(v, &err);
		tt[r] = k3_bench_now() - t0;
	}
	double tier = (double)n_exp * slot / k3_bench_median(tt, (int)runs) / 1e9;
	printf("device %s, %.1f GB free of %.1f; %llu experts of %.2f MB from pageable RAM, "
	       "%llu copy threads, %llu runs (medians)\n", info.name, info.mem_free / 1e9,
	       info.mem_total / 1e9, (unsigned long long)n_exp, slot / 1e6,
	       (unsigned long long)copy_threads, (unsigned long long)runs);
	printf("pinned H2D %.1f GB/s | tier upload (staging + H2D) %.1f GB/s | ratio %.0f%% "
	       "(target >= 80%%)\n", pinned, tier, 100.0 * tier / pinned);
	k3_vram_free(v);
	k3_kern_pool_free(pool);
	k3_cuda_free(up, dbuf);
	k3_cuda_host_free(up, pin);
	k3_cuda_close(cmp);
	k3_cuda_close(up);
	free(host);
	return 0;
}

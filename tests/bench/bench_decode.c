/*
 * bench_decode.c - decode and prefill speed of the engine on a checkpoint
 * (printed, never pass/fail):
 *
 *   bench_decode --model DIR [--threads 1,2] [--decode N] [--prefill N]
 *                [--provider NAME] [--vram-cache-gb N|off]
 *
 * For each thread count: memory bandwidth by a streaming read of a
 * random-filled buffer with that many threads (never constant-filled:
 * identical pages get merged on these machines), the weight bytes one
 * decode token touches (every non-expert tensor except the embedding, one
 * embedding row, top_k experts per MoE layer), median decode tokens/s, the
 * bandwidth floor (bandwidth / bytes per token) and their ratio, the share
 * of a decode token the engine thread spent on a CPU (median CPU time x
 * median tok/s: well below 100% means other tenants took the core and the
 * ratio understates the code), and median prefill tokens/s for one chunk.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/parse.h"
#include "bench_util.h"
#include "engine/engine.h"
#include "model/model.h"

static uint64_t bytes_per_token(const struct k3_model *m, uint32_t top_k)
{
	const struct k3_model_plan *plan = k3_model_plan(m);
	const struct k3_model_config *c = k3_model_config(m);
	size_t n;
	const struct k3_tensor *t = k3_model_tensors(m, &n);
	uint64_t b = 0;
	for (size_t i = 0; i < n; i++) {
		if (strstr(t[i].name, ".experts.") || &t[i] == plan->embed_tokens)
			continue;
		b += t[i].nbytes;
	}
	b += plan->embed_tokens->nbytes / c->vocab_size;
	for (uint32_t l = 0; l < plan->n_layers; l++)
		if (plan->layers[l].is_moe)
			b += (uint64_t)top_k * plan->layers[l].moe.experts[0].payload_bytes;
	return b;
}

/* CPU seconds of the calling thread: with the decode wall time, shows how
 * much of a token the engine thread was descheduled on a shared host. */
static double thread_cpu(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int parse_list(const char *s, uint32_t *out, int max)
{
	int n = 0;
	char buf[128];
	snprintf(buf, sizeof(buf), "%s", s);
	char *save = NULL;
	for (char *tok = strtok_r(buf, ",", &save); tok && n < max; tok = strtok_r(NULL, ",", &save)) {
		uint64_t v;
		if (k3_parse_u64(tok, 1, 64, &v, NULL))
			return -1;
		out[n++] = (uint32_t)v;
	}
	return n;
}

int main(int argc, char **argv)
{
	const char *dir = NULL;
	uint32_t threads[8] = { 1, 2 };
	int n_threads = 2;
	uint64_t n_decode = 32, n_prefill = 64;
	const char *provider = "cpu";
	uint64_t vram = 0;   /* auto */
	for (int i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--model"))
			dir = argv[i + 1];
		else if (!strcmp(argv[i], "--threads"))
			n_threads = parse_list(argv[i + 1], threads, 8);
		else if (!strcmp(argv[i], "--decode"))
			k3_parse_u64(argv[i + 1], 4, 4096, &n_decode, NULL);
		else if (!strcmp(argv[i], "--prefill"))
			k3_parse_u64(argv[i + 1], 1, 4096, &n_prefill, NULL);
		else if (!strcmp(argv[i], "--provider"))
			provider = argv[i + 1];
		else if (!strcmp(argv[i], "--vram-cache-gb")) {
			double gb = 0;
			if (!strcmp(argv[i + 1], "off"))
				vram = UINT64_MAX;
			else if (k3_parse_double(argv[i + 1], 0.001, 1e6, &gb, NULL) == 0)
				vram = (uint64_t)(gb * 1e9);
		}
	}
	if (!dir || n_threads <= 0) {
		fprintf(stderr, "usage: bench_decode --model DIR [--threads 1,2] [--decode N] [--prefill N]\n"
			"                    [--provider NAME] [--vram-cache-gb N|off]\n");
		return 2;
	}
	struct k3_err err = { 0 };
	struct k3_model *m = NULL;
	if (k3_model_open(dir, &m, &err)) {
		fprintf(stderr, "bench_decode: %s\n", err.msg);
		return 1;
	}
	/* 512 MiB of xorshift data: far beyond any cache, no mergeable pages */
	size_t nbw = (size_t)512 << 20;
	void *buf = malloc(nbw);
	if (!buf)
		return 1;
	k3_bench_fill_random(buf, nbw);
	/* touch the weights once so page faults do not count */
	size_t nt;
	const struct k3_tensor *ts = k3_model_tensors(m, &nt);
	volatile uint8_t sink = 0;
	for (size_t i = 0; i < nt; i++)
		for (uint64_t o = 0; o < ts[i].nbytes; o += 4096)
			sink ^= ((const uint8_t *)ts[i].data)[o];

	const struct k3_model_config *c = k3_model_config(m);
	printf("model %s: %u layers, hidden %u, %u experts top-%u, vocab %u\n", dir,
	       c->num_hidden_layers, c->hidden_size, c->num_experts, c->num_experts_per_token,
	       c->vocab_size);
	for (int ti = 0; ti < n_threads; ti++) {
		uint32_t th = threads[ti];
		struct k3_engine *e = NULL;
		struct k3_engine_seq *s = NULL;
		struct k3_engine_opts o = { .threads = th, .max_chunk = (uint32_t)n_prefill,
					    .provider = provider, .vram_cache_bytes = vram };
		if (k3_engine_open(m, &o, &e, &err) ||
		    k3_engine_seq_new(e, (uint32_t)(n_prefill + n_decode + 16), &s, &err)) {
			fprintf(stderr, "bench_decode: %s\n", err.msg);
			return 1;
		}
		uint32_t V = k3_engine_vocab(e);
		float *logits = malloc((size_t)V * sizeof(float));
		int32_t *ids = malloc((size_t)n_prefill * sizeof(int32_t));
		for (uint64_t i = 0; i < n_prefill; i++)
			ids[i] = (int32_t)((i * 7919 + 13) % V);
		struct k3_engine_out out = { K3_ENGINE_LOGITS_LAST, logits, NULL, NULL };

		/* prefill: one chunk of n_prefill positions, fresh sequence each rep */
		double pt[5];
		for (int r = 0; r < 5; r++) {
			struct k3_engine_seq *ps = NULL;
			k3_engine_seq_new(e, (uint32_t)n_prefill, &ps, &err);
			double t0 = k3_bench_now();
			if (k3_engine_forward(e, ps, ids, (uint32_t)n_prefill, &out, &err))
				fprintf(stderr, "bench_decode: %s\n", err.msg);
			pt[r] = k3_bench_now() - t0;
			k3_engine_seq_free(ps);
		}
		/* decode: 16-token prompt, 2 warm-up steps, then n_decode timed steps */
		k3_engine_forward(e, s, ids, n_prefill < 16 ? (uint32_t)n_prefill : 16, &out, &err);
		double *dt = malloc((size_t)n_decode * sizeof(double));
		double *ct = malloc((size_t)n_decode * sizeof(double));
		/* bandwidth right before and right after the timed decode: the
		 * machine is shared, so the floor uses the larger (conservative) */
		double rt[5];
		for (int r = 0; r < 5; r++)
			rt[r] = k3_bench_read_pass(buf, nbw, th);
		double bw0 = (double)nbw / k3_bench_median(rt, 5) / 1e9;
		for (uint64_t i = 0; i < n_decode + 2; i++) {
			int32_t tok = (int32_t)k3_engine_argmax(logits, V);
			double t0 = k3_bench_now(), c0 = thread_cpu();
			if (k3_engine_forward(e, s, &tok, 1, &out, &err))
				fprintf(stderr, "bench_decode: %s\n", err.msg);
			if (i >= 2) {
				dt[i - 2] = k3_bench_now() - t0;
				ct[i - 2] = thread_cpu() - c0;
			}
		}
		for (int r = 0; r < 5; r++)
			rt[r] = k3_bench_read_pass(buf, nbw, th);
		double bw1 = (double)nbw / k3_bench_median(rt, 5) / 1e9, bw = bw0 > bw1 ? bw0 : bw1;
		uint64_t bpt = bytes_per_token(m, k3_engine_top_k(e));
		double dec = 1.0 / k3_bench_median(dt, (int)n_decode);
		double floor_tps = bw * 1e9 / (double)bpt;
		printf("%s threads %u: bandwidth %.1f GB/s (%.1f before, %.1f after) | decode %.1f tok/s, %.1f MB/token -> "
		       "floor %.1f tok/s, ratio %.0f%% (%.1f GB/s of weights) | engine thread on CPU %.0f%% "
		       "(%.1f tok per CPU-s) | prefill %llu: %.1f tok/s\n",
		       provider, th, bw, bw0, bw1, dec, (double)bpt / 1e6, floor_tps, 100.0 * dec / floor_tps,
		       dec * (double)bpt / 1e9, 100.0 * k3_bench_median(ct, (int)n_decode) * dec,
		       1.0 / k3_bench_median(ct, (int)n_decode),
		       (unsigned long long)n_prefill, (double)n_prefill / k3_bench_median(pt, 5));
		fflush(stdout);
		free(dt);
		free(ct);
		free(ids);
		free(logits);
		k3_engine_seq_free(s);
		k3_engine_free(e);
	}
	free(buf);
	k3_model_free(m);
	return (int)sink * 0;
}

/*
 * bench_spine.c - spine streaming against its physical limit, measured in
 * the same run (issue 17 targets; docs/spine.md):
 *
 *   1. spine read bandwidth: one pass of the spine loader (store_spine.h)
 *      with no layer resident and no compute (acquire, release, in pass
 *      order) against raw O_DIRECT preads of the same spans of the spine
 *      pack, in the same 8 MiB pieces with as many readers, sampled in
 *      alternating order; the ratio loader / raw per pair, median (target
 *      >= 0.90);
 *   2. decode: tokens/s with every layer resident through the loader
 *      against the mapped spine (the engine without a spine source, i.e.
 *      the code path of the build before spine streaming), interleaved
 *      runs, medians (target: no slower); and, for the record, decode with
 *      nothing resident (bytes of spine read per token, tok/s).
 *
 * usage: bench_spine MODEL_DIR [--rounds N] [--decode N] [--threads N] [--io-threads N]
 * MODEL_DIR needs MODEL_DIR/k3-packs/spine.k3pack (k3ctl pack). Random
 * weights only (k3ctl demo-model): identical pages would be merged.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "bench_util.h"
#include "engine/engine.h"
#include "model/model.h"
#include "store/store_model.h"
#include "store/store_pack.h"
#include "store/store_spine.h"

enum { MAX_ROUNDS = 64, PROMPT = 8 };
#define PIECE ((uint64_t)8 << 20)

/* ---- raw O_DIRECT reads of the pack's layer and head spans ---- */

struct raw {
	int fd;
	const struct k3_store_pack_layout *lo;
	uint64_t *off, *len;     /* the pieces */
	size_t n;
	atomic_size_t next;
	atomic_uint_fast64_t bytes;
	atomic_uint who;
	void *bufs[16];          /* one per reader, made once */
};

#define RAW_BUF (PIECE + ((uint64_t)2 << 20))

static void *raw_reader(void *arg)
{
	struct raw *r = arg;
	void *buf = r->bufs[atomic_fetch_add(&r->who, 1)];

	for (size_t i; (i = atomic_fetch_add(&r->next, 1)) < r->n;) {
		uint64_t a = r->off[i] & ~(uint64_t)4095, b = (r->off[i] + r->len[i] + 4095) & ~(uint64_t)4095;
		ssize_t got = pread(r->fd, buf, (size_t)(b - a), (off_t)a);
		if (got > 0)
			atomic_fetch_add(&r->bytes, (uint64_t)got);
	}
	return NULL;
}

/* One pass over every layer span and the head span, cut like the loader
 * cuts them; returns GB/s. */
static double raw_pass(struct raw *r, unsigned threads)
{
	pthread_t t[16];
	double t0 = k3_bench_now();

	atomic_store(&r->next, 0);
	atomic_store(&r->bytes, 0);
	atomic_store(&r->who, 0);
	for (unsigned i = 0; i < threads; i++)
		pthread_create(&t[i], NULL, raw_reader, r);
	for (unsigned i = 0; i < threads; i++)
		pthread_join(t[i], NULL);
	return (double)atomic_load(&r->bytes) / (k3_bench_now() - t0) / 1e9;
}

static int raw_open(struct raw *r, const char *path, const struct k3_store_pack_layout *lo,
		    unsigned threads)
{
	size_t cap = 0;

	memset(r, 0, sizeof(*r));
	r->fd = open(path, O_RDONLY | O_DIRECT);
	if (r->fd < 0) {
		fprintf(stderr, "bench_spine: %s: O_DIRECT open failed: %s\n", path, strerror(errno));
		return -1;
	}
	for (size_t i = 0; i < lo->n_spans; i++)
		cap += lo->spans[i].length / PIECE + 2;
	/* on huge pages like the loader's arenas: the best O_DIRECT this disk
	 * gives (4 KiB pages cost the pinning of 512x more pages), faulted in
	 * before any timing */
	for (unsigned t = 0; t < threads; t++) {
		if (posix_memalign(&r->bufs[t], 2u << 20, RAW_BUF))
			return -1;
		(void)madvise(r->bufs[t], RAW_BUF, MADV_HUGEPAGE);
		memset(r->bufs[t], 0, RAW_BUF);
	}
	r->off = calloc(cap, sizeof(*r->off));
	r->len = calloc(cap, sizeof(*r->len));
	for (size_t i = 0; i < lo->n_spans; i++) {
		const struct k3_store_pack_span *sp = &lo->spans[i];
		if (sp->kind == K3_STORE_SPAN_EMBED)
			continue;   /* the loader reads rows of it, not the span */
		for (uint64_t o = 0; o < sp->length; o += PIECE) {
			r->off[r->n] = sp->offset + o;
			r->len[r->n++] = sp->length - o < PIECE ? sp->length - o : PIECE;
		}
	}
	return 0;
}

/* ---- the loader, no compute ---- */

/* One pass: every layer and the head acquired and released in order;
 * returns GB/s of what the loader read. */
static double loader_pass(struct k3_store_spine *sp, uint32_t n_layers)
{
	struct k3_spine_source ss;
	struct k3_store_spine_stats a, b;
	struct k3_prov_layer_weights w;
	struct k3_prov_weights hw;
	struct k3_err err = { 0 };

	k3_store_spine_source(sp, &ss);
	k3_store_spine_drain(sp);
	k3_store_spine_stats_get(sp, &a);
	double t0 = k3_bench_now();
	ss.begin_pass(ss.ctx, true);
	for (uint32_t l = 0; l < n_layers; l++) {
		ss.prefetch_layer(ss.ctx, l + 1);
		if (ss.acquire_layer(ss.ctx, l, &w, &err)) {
			fprintf(stderr, "bench_spine: %s\n", err.msg);
			return 0;
		}
		ss.release_layer(ss.ctx, l);
	}
	if (ss.acquire_head(ss.ctx, &hw, &err) == 0)
		ss.release_head(ss.ctx);
	double dt = k3_bench_now() - t0;
	/* what was read ahead into the next pass belongs to it */
	k3_store_spine_stats_get(sp, &b);
	return (double)(b.bytes_read - a.bytes_read) / dt / 1e9;
}

/* ---- decode ---- */

struct decode {
	double tps;
	uint64_t spine_bytes;    /* per token */
};

/* PROMPT tokens, then n decode steps; tok/s of the decode. */
static int decode_run(const struct k3_model *m, const struct k3_spine_source *ss,
		      struct k3_store_spine *sp, uint32_t threads, uint32_t n, struct decode *out)
{
	struct k3_engine_opts o = { .threads = threads, .spine = ss };
	struct k3_engine *e = NULL;
	struct k3_engine_seq *s = NULL;
	struct k3_err err = { 0 };
	struct k3_store_spine_stats a = { 0 }, b = { 0 };
	int32_t ids[PROMPT];
	float *logits;
	int rc;

	if ((rc = k3_engine_open(m, &o, &e, &err)) || (rc = k3_engine_seq_new(e, PROMPT + n, &s, &err))) {
		fprintf(stderr, "bench_spine: %s\n", err.msg);
		k3_engine_free(e);
		return rc;
	}
	uint32_t V = k3_engine_vocab(e);
	logits = malloc((size_t)V * sizeof(float));
	for (int i = 0; i < PROMPT; i++)
		ids[i] = (int32_t)(k3_bench_rand() % V);
	struct k3_engine_out lo = { K3_ENGINE_LOGITS_LAST, logits, NULL, NULL };
	rc = k3_engine_forward(e, s, ids, PROMPT, &lo, &err);
	if (sp)
		k3_store_spine_stats_get(sp, &a);
	double t0 = k3_bench_now();
	for (uint32_t i = 0; rc == 0 && i < n; i++) {
		int32_t tok = (int32_t)k3_engine_argmax(logits, V);
		rc = k3_engine_forward(e, s, &tok, 1, &lo, &err);
	}
	double dt = k3_bench_now() - t0;
	if (sp)
		k3_store_spine_stats_get(sp, &b);
	if (rc)
		fprintf(stderr, "bench_spine: %s\n", err.msg);
	out->tps = n / dt;
	out->spine_bytes = (b.bytes_read - a.bytes_read) / n;
	free(logits);
	k3_engine_seq_free(s);
	k3_engine_free(e);
	return rc;
}

/* Prints "what: A a0 a1 ...; B b0 b1 ..." and returns the median of the
 * pairs' ratios b / a. */
static double pairs(const char *what, const char *na, const double *a, const char *nb,
		    const double *b, int n)
{
	double r[MAX_ROUNDS];

	printf("%s: %s", what, na);
	for (int i = 0; i < n; i++)
		printf(" %.3f", a[i]);
	printf("; %s", nb);
	for (int i = 0; i < n; i++) {
		printf(" %.3f", b[i]);
		r[i] = a[i] > 0 ? b[i] / a[i] : 0;
	}
	printf("\n");
	return k3_bench_median(r, n);
}

/* Runs f(ctx, 0) and f(ctx, 1) once per round, the order alternating. */
static void interleave(unsigned rounds, void (*f)(void *ctx, int which, unsigned round), void *ctx)
{
	for (unsigned i = 0; i < rounds; i++) {
		f(ctx, i % 2, i);
		f(ctx, !(i % 2), i);
	}
}

struct read_round {
	struct raw *raw;
	struct k3_store_spine *sp;
	uint32_t L;
	unsigned io_threads;
	double *rawv, *ldv;
};

static void read_one(void *vctx, int which, unsigned i)
{
	struct read_round *c = vctx;
	if (which == 0)
		c->rawv[i] = raw_pass(c->raw, c->io_threads);
	else
		c->ldv[i] = loader_pass(c->sp, c->L);
}

struct decode_round {
	const struct k3_model *m;
	const struct k3_spine_source *ss;
	struct k3_store_spine *sp;
	unsigned threads, n;
	double *mapped, *resident;
};

static void decode_one(void *vctx, int which, unsigned i)
{
	struct decode_round *c = vctx;
	struct decode d = { 0 };
	decode_run(c->m, which ? c->ss : NULL, which ? c->sp : NULL, c->threads, c->n, &d);
	(which ? c->resident : c->mapped)[i] = d.tps;
}

int main(int argc, char **argv)
{
	unsigned rounds = 5, io_threads = 2, threads = 1, n_decode = 8;
	const char *dir = NULL;
	char pack[4200];
	struct k3_err err = { 0 };

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
			rounds = (unsigned)atoi(argv[++i]);
		else if (!strcmp(argv[i], "--decode") && i + 1 < argc)
			n_decode = (unsigned)atoi(argv[++i]);
		else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
			threads = (unsigned)atoi(argv[++i]);
		else if (!strcmp(argv[i], "--io-threads") && i + 1 < argc)
			io_threads = (unsigned)atoi(argv[++i]);
		else if (argv[i][0] != '-' && !dir)
			dir = argv[i];
		else
			dir = NULL, i = argc;
	}
	if (!dir || rounds < 1 || rounds > MAX_ROUNDS || io_threads < 1 || io_threads > 16 ||
	    threads < 1 || n_decode < 1) {
		fprintf(stderr, "usage: bench_spine MODEL_DIR [--rounds 1..%d] [--decode N]"
			" [--threads N] [--io-threads 1..16]\n", MAX_ROUNDS);
		return 2;
	}
	snprintf(pack, sizeof(pack), "%s/k3-packs/spine.k3pack", dir);
	struct k3_model *m = NULL;
	struct k3_store_pack *pk = NULL;
	if (k3_model_open(dir, &m, &err) || k3_store_pack_open(pack, NULL, 0, 0, &pk, &err)) {
		fprintf(stderr, "bench_spine: %s (run k3ctl pack --model DIR first)\n", err.msg);
		return 1;
	}
	uint32_t L = k3_model_plan(m)->n_layers;
	double la[3] = { 0 };
	FILE *f = fopen("/proc/loadavg", "r");
	if (f) {
		if (fscanf(f, "%lf %lf %lf", &la[0], &la[1], &la[2]) != 3)
			la[0] = -1;
		fclose(f);
	}
	printf("bench_spine %s: %u layers; load average %.2f %.2f %.2f; %u rounds, %u readers,"
	       " %u compute threads\n", dir, L, la[0], la[1], la[2], rounds, io_threads, threads);

	/* 1. read bandwidth */
	struct raw raw;
	struct k3_store_spine *sp = NULL;
	struct k3_store_spine_config none = { .resident_layers = 0, .io_threads = io_threads,
					      .direct = K3_STORE_DIRECT_ON };
	struct k3_store_spine_report rep;
	if (raw_open(&raw, pack, k3_store_pack_layout(pk), io_threads) ||
	    k3_store_spine_new(m, pack, &none, &sp, &rep, &err)) {
		fprintf(stderr, "bench_spine: %s\n", err.msg);
		return 1;
	}
	struct k3_store_spine_info info;
	k3_store_spine_info_get(sp, &info);
	printf("spine pack %s (%s); %.3f GB streamed per pass through %u arenas of %.3f GB\n",
	       rep.from_pack ? "used" : "rejected", rep.from_pack ? pack : rep.rejection,
	       (double)info.streamed_bytes_per_pass / 1e9, info.ring_arenas,
	       (double)info.arena_bytes / 1e9);
	double rawv[MAX_ROUNDS], ldv[MAX_ROUNDS];
	loader_pass(sp, L);   /* warm-up: arenas faulted in, files opened */
	struct read_round rr_ctx = { &raw, sp, L, io_threads, rawv, ldv };
	interleave(rounds, read_one, &rr_ctx);
	double rr = pairs("spine reads GB/s", "raw O_DIRECT", rawv, "loader", ldv, (int)rounds);
	printf("  -> loader / raw per pair: median %.3f (target >= 0.90); medians raw %.3f, loader"
	       " %.3f GB/s\n", rr, k3_bench_median(rawv, (int)rounds), k3_bench_median(ldv, (int)rounds));
	k3_store_spine_free(sp);
	close(raw.fd);
	for (unsigned t = 0; t < io_threads; t++)
		free(raw.bufs[t]);
	free(raw.off);
	free(raw.len);

	/* 2. decode: all resident through the loader vs the mapped spine */
	struct k3_store_spine_config all = { .resident_layers = L, .head_resident = true,
					     .io_threads = io_threads };
	struct k3_store_spine *spa = NULL;
	struct k3_spine_source ssa, ssn;
	if (k3_store_spine_new(m, pack, &all, &spa, NULL, &err)) {
		fprintf(stderr, "bench_spine: %s\n", err.msg);
		return 1;
	}
	k3_store_spine_source(spa, &ssa);
	double mapped[MAX_ROUNDS], resident[MAX_ROUNDS];
	struct decode d;
	struct decode_round dr_ctx = { m, &ssa, spa, threads, n_decode, mapped, resident };
	interleave(rounds, decode_one, &dr_ctx);
	double dr = pairs("decode tok/s", "mapped", mapped, "all resident (loader)", resident,
			  (int)rounds);
	printf("  -> resident / mapped per pair: median %.3f (target >= 1: no slower)\n", dr);
	k3_store_spine_free(spa);

	/* for the record: nothing resident */
	struct k3_store_spine_config nr = { .resident_layers = 0, .io_threads = io_threads };
	if (k3_store_spine_new(m, pack, &nr, &sp, NULL, &err) == 0) {
		k3_store_spine_source(sp, &ssn);
		decode_run(m, &ssn, sp, threads, n_decode, &d);
		printf("decode with nothing resident: %.2f tok/s, %.1f MB of spine read per token\n",
		       d.tps, (double)d.spine_bytes / 1e6);
		k3_store_spine_free(sp);
	}
	k3_store_pack_free(pk);
	k3_model_free(m);
	return 0;
}

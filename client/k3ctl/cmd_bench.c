/*
 * cmd_bench.c - `k3ctl bench (--model DIR | --preset trained) [--max-new N] [--prompt-len N]
 * [--expert-cache-gb auto|G] [--prefetch auto|N|off] [--prefetch-gate P]
 * [--direct auto|on|off] [--io-threads N] [--threads N] [--no-packs]
 * [--disk-mib M] [--disk-samples N] [--seed N] [--spine-resident auto|all|N|none]
 * [--io-rate GBPS] [--io-latency MS]`: offline (no daemon) greedy generation
 * through the expert store (and with --spine-resident the spine loader,
 * store_spine.h), measured against the disk it reads from (issue 7,
 * "Benchmarks"; docs/store.md), and with --io-rate against an emulated
 * drive of that bandwidth (store_io.h; docs/plan.md).
 *
 * Which model: --model DIR is any checkpoint; for bandwidth figures it is
 * one with K3's real expert shapes (`k3ctl demo-model --preset bench`),
 * whose random weights route nearly uniformly. --preset trained runs on
 * the trained demo model (tools/train_demo/, installed into a private
 * temporary directory and removed after) with a prompt of its training
 * text instead of random ids, so the prompt and the decode route as a
 * trained router does on text: the choice where routing realism matters
 * (hit rate, prefetch precision, the lookahead by rank at a given
 * --expert-cache-gb). Its experts are tiny (kilobytes), so its bytes and
 * disk ratios say nothing about K3's.
 *
 * Prints tokens/s, expert bytes read per token (and the wasted part) and,
 * when the spine streams, spine bytes per token apart, demand hit rate,
 * prefetch figures, the lookahead's precision by rank, and two ratios
 * against the disk measured in the same run (the floor counts the spine's
 * bytes with the experts').
 *
 * The disk is noisy when shared, so it is sampled several times interleaved
 * with the work: before the prompt, after it, at evenly spaced points of the
 * decode (between tokens, outside the timed part) and after. Each sample is
 * a pair, in alternating order:
 *
 *   disk  = raw preads of whole expert spans with O_DIRECT (a source of
 *           its own, opened O_DIRECT where the file system allows it), as
 *           many in flight as the store has reader threads, in the pattern
 *           of cold decode steps: groups of top-k random experts of one
 *           random layer, each sorted by offset, back to back
 *   cold  = the same kind of steps (other random experts, none resident)
 *           acquired through a probe store (its own 2 x top-k slot cache,
 *           same reader threads and read mode as the measured store): the
 *           store's own cold read path, one acquire per step
 *
 * (The same access pattern on both sides matters on a virtual disk whose
 * host caches and reads ahead: a layer's experts sorted by offset are
 * near each other, and were measured up to 2.5 x faster there than fully
 * random spans. On NVMe the two are about the same.)
 *
 * and the report gives the median and spread of each, then
 *
 *   cold-read ratio  = median of the per-sample ratios cold / disk
 *                      (each pair was measured back to back)
 *   decode vs floor  = decode time per token /
 *                      max(bytes read per token / median disk bandwidth,
 *                          compute time per token)
 *                      (and the same against the slowest and fastest disk
 *                      sample, so the reader sees how much the disk's noise
 *                      moves it)
 *
 * With --io-rate R (and --io-latency) the store's readers run through the
 * emulated drive, so over page-cached files (--direct off, the model read
 * once before) the decode is I/O-bound at a known bandwidth, and the
 * report adds
 *
 *   decode vs emulated floor = decode time per token /
 *                              max(bytes read per token / R, compute time)
 *
 * next to the real-disk figures (the yardstick and the probe store read
 * without the emulation: they measure the real disk).
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

enum { BENCH_MAX_NEW = 4096, BENCH_MAX_PROMPT = 4096, BENCH_MAX_SAMPLES = 64, SHOW_RANKS = 8 };

/* The --preset trained prompt: sentence forms of the model's training
 * corpus (tools/train_demo/data.py), so the prompt's routing is the
 * router's on text it knows; its first --prompt-len ids are used. */
static const char trained_prompt[] =
	"The capital of France is Paris. The capital of England is London. "
	"The capital of Japan is Tokyo. The capital of Italy is Rome. "
	"The capital of Spain is Madrid. The capital of Egypt is Cairo. The capital of";

static void usage(void)
{
	fprintf(stderr,
		"usage: k3ctl bench (--model DIR | --preset trained) [--max-new N] [--prompt-len N]\n"
		"       [--expert-cache-gb auto|G] [--prefetch auto|N|off] [--prefetch-gate P]\n"
		"       [--direct auto|on|off] [--io-threads N] [--threads N] [--no-packs]\n"
		"       [--disk-mib M] [--disk-samples N] [--seed N] [--spine-resident auto|all|N|none]\n"
		"       [--expert-dir DIR]... [--io-rate GBPS[,..]] [--io-latency MS[,..]]\n"
		"       [--io-stall MS:F[,..]] [--hedge auto|off|F] [--prefill-chunk N]\n"
		"       (--preset trained: the trained demo model and a prompt of its training text,\n"
		"       where routing realism matters; its experts are tiny: no bandwidth figures)\n"
		"   or: k3ctl bench --compare-spine --model DIR (--text FILE | --prompt S | --ids LIST)\n"
		"       [--positions N] [--spine-int8-dir DIR] [--int8 CLASSES] [--per-class]\n");
}

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static uint64_t xorshift(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

struct spread {
	double median, min, max;
};

static struct spread spread_of(const double *v, int n)
{
	double s[BENCH_MAX_SAMPLES];
	struct spread r = { 0, 0, 0 };

	if (n <= 0)
		return r;
	memcpy(s, v, (size_t)n * sizeof(*s));
	qsort(s, (size_t)n, sizeof(*s), cmp_double);
	r.min = s[0];
	r.max = s[n - 1];
	r.median = n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
	return r;
}

/* ---- cold reads through a probe store ---- */

struct layer_range {
	uint32_t layer;
	size_t first, n;      /* indices into by_layer */
};

struct probe {
	struct k3_store *store;
	const struct k3_store_source *src;
	size_t *by_layer;     /* source indices sorted by (layer, expert) */
	struct layer_range *layers;
	size_t n_layers;
	uint32_t top_k;
};

static int probe_open(struct probe *p, const struct k3_store_source *src, uint32_t top_k,
		      unsigned io_threads, struct k3_err *err)
{
	size_t n = k3_store_source_count(src);
	uint64_t slot = k3_store_source_slot_bytes(src);

	memset(p, 0, sizeof(*p));
	p->src = src;
	p->top_k = top_k;
	p->by_layer = malloc(n * sizeof(*p->by_layer));
	p->layers = calloc(n, sizeof(*p->layers));
	if (!p->by_layer || !p->layers)
		return k3_err_set(err, -ENOMEM, "out of memory");
	for (size_t i = 0; i < n; i++)
		p->by_layer[i] = i;
	qsort_r(p->by_layer, n, sizeof(*p->by_layer), k3_store_source_cmp_index, (void *)src);
	for (size_t i = 0; i < n; i++) {
		uint32_t l = k3_store_source_expert(src, p->by_layer[i])->layer;
		if (p->n_layers == 0 || p->layers[p->n_layers - 1].layer != l)
			p->layers[p->n_layers++] = (struct layer_range){ l, i, 0 };
		p->layers[p->n_layers - 1].n++;
	}
	struct k3_store_config cfg = {
		.cache_bytes = 2ull * top_k * slot, .io_threads = io_threads,
		.prefetch_slots = 0, .check_scales = false, .prefault = true,
	};
	return k3_store_new(src, &cfg, &p->store, err);
}

static void probe_close(struct probe *p)
{
	k3_store_free(p->store);
	free(p->by_layer);
	free(p->layers);
}

/* Steps of top_k distinct random experts of one random layer, each expert
 * not resident in the probe store (every one a cold miss), until max_bytes
 * were read. Returns GB/s (bytes read / wall time of the acquires), or a
 * negative errno. */
static double cold_bandwidth(struct probe *p, uint64_t max_bytes, uint64_t *seed,
			     uint64_t *bytes_out, struct k3_err *err)
{
	struct k3_store_stats a, b;
	struct k3_store_view views[64];
	uint32_t ids[64];
	double wall = 0;
	uint32_t k = p->top_k < 64 ? p->top_k : 64;

	k3_store_stats_get(p->store, &a);
	for (int guard = 0; guard < 100000; guard++) {
		k3_store_stats_get(p->store, &b);
		if (b.bytes_read - a.bytes_read >= max_bytes)
			break;
		const struct layer_range *lr = &p->layers[xorshift(seed) % p->n_layers];
		uint32_t n = 0;
		for (int tries = 0; n < k && n < lr->n && tries < 1000; tries++) {
			size_t idx = p->by_layer[lr->first + xorshift(seed) % lr->n];
			uint32_t e = k3_store_source_expert(p->src, idx)->expert;
			bool dup = k3_store_resident(p->store, lr->layer, e);
			for (uint32_t m = 0; m < n && !dup; m++)
				dup = ids[m] == e;
			if (!dup)
				ids[n++] = e;
		}
		if (n == 0)
			continue;
		k3_store_step_begin(p->store);
		double t0 = now_s();
		int rc = k3_store_acquire(p->store, lr->layer, ids, n, views, err);
		wall += now_s() - t0;
		if (rc)
			return rc;
		k3_store_release(p->store, views, n);
	}
	k3_store_stats_get(p->store, &b);
	*bytes_out = b.bytes_read - a.bytes_read;
	return wall > 0 ? (double)*bytes_out / wall / 1e9 : 0;
}

/* ---- the disk yardstick: raw O_DIRECT reads in the same pattern ---- */

/* One read of the yardstick: copy `copy` of expert `idx`. */
struct disk_read {
	size_t idx;
	unsigned copy;
};

struct disk_job {
	const struct k3_store_source *src;
	const struct disk_read *order;
	size_t n;
	atomic_size_t next;
	atomic_uint_least64_t bytes;
	atomic_int error;
	uint8_t *buf[K3_STORE_MAX_IO_THREADS];
	atomic_uint thread_no;
};

static void *disk_worker(void *arg)
{
	struct disk_job *j = arg;
	uint8_t *buf = j->buf[atomic_fetch_add(&j->thread_no, 1)];

	for (;;) {
		size_t i = atomic_fetch_add(&j->next, 1);
		struct k3_store_plan plan;
		if (i >= j->n)
			break;
		k3_store_source_plan_copy(j->src, j->order[i].idx, j->order[i].copy, &plan);
		for (unsigned r = 0; r < plan.n_reads; r++) {
			int64_t got = k3_store_source_pread(j->src, &plan.read[r], buf);
			if (got < 0) {
				atomic_store(&j->error, (int)got);
				return NULL;
			}
			atomic_fetch_add(&j->bytes, (uint64_t)got);
		}
	}
	return NULL;
}

static int cmp_offset(const void *a, const void *b, void *ctx)
{
	const struct k3_store_source *src = ctx;
	const struct disk_read *ra = a, *rb = b;
	struct k3_store_plan x, y;
	k3_store_source_plan_copy(src, ra->idx, ra->copy, &x);
	k3_store_source_plan_copy(src, rb->idx, rb->copy, &y);
	if (x.read[0].file != y.read[0].file)
		return x.read[0].file < y.read[0].file ? -1 : 1;
	return x.read[0].offset < y.read[0].offset ? -1 : x.read[0].offset > y.read[0].offset;
}

/* The copy of expert idx on `drive`, or -1 when that drive has none. */
static int copy_on(const struct k3_store_source *src, size_t idx, uint32_t drive)
{
	unsigned n = k3_store_source_copies(src, idx);

	for (unsigned c = 0; c < n; c++)
		if (k3_store_source_copy_drive(src, idx, c) == drive)
			return (int)c;
	return -1;
}

/* Raw reads of dsrc (opened O_DIRECT where the file system allows it) from
 * one drive (its copies; k3d --expert-dir, docs/drives.md), in the
 * pattern of cold decode steps: groups of top_k distinct random experts
 * of one random layer, each group sorted by file offset,
 * the groups back to back with `threads` reads in flight (no step barrier:
 * this is what the disk can do; the store's step-by-step acquires are
 * measured against it). bufs: `threads` prefaulted slot-sized buffers.
 * Returns GB/s or a negative errno (-ENOENT: the drive holds no expert). */
static double disk_bandwidth(const struct probe *p, const struct k3_store_source *dsrc,
			     uint32_t drive, unsigned threads, uint8_t **bufs, uint64_t max_bytes,
			     uint64_t *seed, uint64_t *bytes_out)
{
	uint64_t slot = k3_store_source_slot_bytes(dsrc);
	size_t cap = (size_t)(max_bytes / slot) + p->top_k + 1, n = 0;
	struct disk_read *order = malloc(cap * sizeof(*order));
	pthread_t th[K3_STORE_MAX_IO_THREADS];
	unsigned started = 0;
	size_t rounds = 0;

	if (!order)
		return -ENOMEM;
	while ((uint64_t)n * slot < max_bytes) {
		const struct layer_range *lr = &p->layers[xorshift(seed) % p->n_layers];
		size_t g0 = n;
		for (int tries = 0; n - g0 < p->top_k && n - g0 < lr->n && tries < 1000; tries++) {
			/* same (layer, expert) -> index in both sources: same model, same order */
			size_t idx = p->by_layer[lr->first + xorshift(seed) % lr->n];
			int c = copy_on(dsrc, idx, drive);
			bool dup = c < 0;
			for (size_t m = g0; m < n && !dup; m++)
				dup = order[m].idx == idx;
			if (!dup && n < cap)
				order[n++] = (struct disk_read){ idx, (unsigned)c };
		}
		qsort_r(order + g0, n - g0, sizeof(*order), cmp_offset, (void *)dsrc);
		if ((n == g0 && drive == 0) || n >= cap || ++rounds > 64 * cap)
			break;
	}
	if (n == 0) {
		free(order);
		return -ENOENT;
	}
	struct disk_job j = { .src = dsrc, .order = order, .n = n };
	for (unsigned t = 0; t < threads; t++)
		j.buf[t] = bufs[t];
	atomic_init(&j.next, 0);
	atomic_init(&j.bytes, 0);
	atomic_init(&j.error, 0);
	atomic_init(&j.thread_no, 0);
	double t0 = now_s();
	for (unsigned t = 0; t < threads; t++)
		if (pthread_create(&th[t], NULL, disk_worker, &j) == 0)
			started++;
	for (unsigned t = 0; t < started; t++)
		pthread_join(th[t], NULL);
	double dt = now_s() - t0;
	free(order);
	if (started == 0)
		return -EAGAIN;
	if (atomic_load(&j.error))
		return atomic_load(&j.error);
	*bytes_out = atomic_load(&j.bytes);
	return dt > 0 ? (double)*bytes_out / dt / 1e9 : 0;
}

/* ---- the report ---- */

struct phase {
	double wall_s;
	struct k3_store_stats st;
	struct k3_store_spine_stats sp;   /* zero when the spine is mapped */
};

/* Counters of the store and the spine loader (NULL: mapped) after their
 * reads in flight landed. */
static void snapshot(struct k3_store *store, struct k3_store_spine *spine,
		     struct k3_store_stats *st, struct k3_store_spine_stats *sp)
{
	memset(sp, 0, sizeof(*sp));
	k3_store_stats_get(store, st);
	if (spine) {
		k3_store_spine_drain(spine);
		k3_store_spine_stats_get(spine, sp);
	}
}

static void phase_print(const char *name, const struct phase *p, uint32_t tokens)
{
	const struct k3_store_stats *s = &p->st;
	uint64_t acc = s->demand_hits + s->demand_misses;
	printf("%-8s %4u tokens in %8.3f s = %8.2f tokens/s; %.0f expert bytes/token (%.2f MB, of "
	       "which %.2f MB wasted prefetch); hits %.1f%% of %llu; io wait %.3f s, compute %.3f s\n",
	       name, tokens, p->wall_s, p->wall_s > 0 ? tokens / p->wall_s : 0,
	       tokens ? (double)s->bytes_read / tokens : 0,
	       tokens ? (double)s->bytes_read / tokens / 1e6 : 0,
	       tokens ? (double)s->prefetch_wasted_bytes / tokens / 1e6 : 0,
	       acc ? 100.0 * (double)s->demand_hits / (double)acc : 0, (unsigned long long)acc,
	       (double)(s->io_wait_ns + p->sp.io_wait_ns) * 1e-9,
	       p->wall_s - (double)(s->io_wait_ns + p->sp.io_wait_ns) * 1e-9);
	if (p->sp.bytes_read)
		printf("         spine: %.0f bytes/token (%.2f MB; %llu layers read, %llu embedding"
		       " rows), %.3f s of the io wait\n", tokens ? (double)p->sp.bytes_read / tokens : 0,
		       tokens ? (double)p->sp.bytes_read / tokens / 1e6 : 0,
		       (unsigned long long)p->sp.loads, (unsigned long long)p->sp.rows_read,
		       (double)p->sp.io_wait_ns * 1e-9);
	printf("         prefetch: %llu issued (%.2f MB), %llu used later (%.1f%% of issued), "
	       "%llu late (same step, counted as misses), %llu cancelled unread, %llu stopped "
	       "part-way, %llu not read (gate), %.2f MB wasted\n",
	       (unsigned long long)s->prefetch_issued, (double)s->prefetch_issued_bytes / 1e6,
	       (unsigned long long)s->prefetch_used,
	       s->prefetch_issued ? 100.0 * (double)s->prefetch_used / (double)s->prefetch_issued : 0,
	       (unsigned long long)s->prefetch_late, (unsigned long long)s->prefetch_cancelled,
	       (unsigned long long)s->prefetch_aborted, (unsigned long long)s->prefetch_skipped,
	       (double)s->prefetch_wasted_bytes / 1e6);
}

static json_t *phase_json(const struct phase *p, uint32_t tokens)
{
	const struct k3_store_stats *s = &p->st;
	json_t *o = json_pack("{s:i, s:f, s:f, s:f, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f}",
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
	json_object_set_new(o, "prefetch_aborted", json_integer((json_int_t)s->prefetch_aborted));
	json_object_set_new(o, "prefetch_skipped", json_integer((json_int_t)s->prefetch_skipped));
	json_object_set_new(o, "guesses_scored", json_integer((json_int_t)s->guesses_scored));
	json_object_set_new(o, "guesses_right", json_integer((json_int_t)s->guesses_right));
	json_object_set_new(o, "spine_bytes_per_token",
			    json_real(tokens ? (double)p->sp.bytes_read / tokens : 0.0));
	json_object_set_new(o, "spine_bytes_read", json_integer((json_int_t)p->sp.bytes_read));
	json_object_set_new(o, "spine_loads", json_integer((json_int_t)p->sp.loads));
	json_object_set_new(o, "spine_io_wait_s", json_real((double)p->sp.io_wait_ns * 1e-9));
	return o;
}

static json_t *spread_json(struct spread s)
{
	return json_pack("{s:f, s:f, s:f}", "median", s.median, "min", s.min, "max", s.max);
}

static json_t *array_json(const double *v, int n)
{
	json_t *a = json_array();
	for (int i = 0; i < n; i++)
		json_array_append_new(a, json_real(v[i]));
	return a;
}

struct samples {
	int n;
	double disk[BENCH_MAX_SAMPLES], cold[BENCH_MAX_SAMPLES], ratio[BENCH_MAX_SAMPLES];
	const char *where[BENCH_MAX_SAMPLES];
	uint64_t disk_bytes, cold_bytes;
};

/* One disk + cold-read pair, the order alternating from sample to sample. */
static int take_sample(struct samples *sm, const char *where, const struct k3_store_source *dsrc,
		       unsigned threads, uint8_t **bufs, struct probe *p, uint64_t max_bytes,
		       uint64_t *seed, struct k3_err *err)
{
	double d = 0, c = 0;
	int i = sm->n;

	if (i >= BENCH_MAX_SAMPLES)
		return 0;
	for (int pass = 0; pass < 2; pass++) {
		if ((pass == 0) == (i % 2 == 0)) {
			d = disk_bandwidth(p, dsrc, 0, threads, bufs, max_bytes, seed, &sm->disk_bytes);
			if (d < 0)
				return k3_err_set(err, (int)d, "disk read failed: %s", strerror((int)-d));
		} else {
			c = cold_bandwidth(p, max_bytes, seed, &sm->cold_bytes, err);
			if (c < 0)
				return (int)c;
		}
	}
	sm->disk[i] = d;
	sm->cold[i] = c;
	sm->ratio[i] = d > 0 ? c / d : 0;
	sm->where[i] = where;
	sm->n++;
	return 0;
}

/* Several drives: where each drive's bytes went over the whole run (they
 * add up: bytes = demand + prefetch used + prefetch wasted), its hedges,
 * its measured and emulated rates, its raw yardstick (drive 0: the median
 * sample; others: one sample after the run; 0: it holds no expert). */
static json_t *drives_json(const struct k3_store_stats *st, const struct k3_store_info *in,
			   uint32_t n, const double *disk, const uint32_t *held)
{
	json_t *a = json_array();

	for (uint32_t d = 0; d < n; d++)
		json_array_append_new(a, json_pack("{s:I,s:I,s:I,s:I,s:I,s:I,s:f,s:f,s:f,s:I,s:I}",
			"bytes_read", (json_int_t)st->drive_bytes_read[d],
			"demand_bytes", (json_int_t)st->drive_demand_bytes[d],
			"prefetch_used_bytes", (json_int_t)st->drive_prefetch_used_bytes[d],
			"prefetch_wasted_bytes", (json_int_t)st->drive_prefetch_wasted_bytes[d],
			"hedges", (json_int_t)st->drive_hedges[d],
			"hedges_won", (json_int_t)st->drive_hedges_won[d],
			"disk_gbps", disk[d] > 0 ? disk[d] : 0.0,
			"measured_gbps", (double)in->drive[d].rate_bytes_per_s / 1e9,
			"emulated_gbps", (double)in->drive[d].emulated_rate / 1e9,
			"p95_ns", (json_int_t)in->drive[d].p95_ns,
			"experts", (json_int_t)(d ? held[d] : in->drive_experts[0])));
	return a;
}

static void drives_print(const struct k3_store_stats *st, const struct k3_store_info *in,
			 uint32_t n, const double *disk, const uint32_t *held)
{
	printf("expert bytes read, whole run: %.2f MB = demand %.2f + prefetch used %.2f + wasted "
	       "%.2f MB; %llu reads hedged (%llu won by the other copy)\n",
	       (double)st->bytes_read / 1e6, (double)st->demand_bytes / 1e6,
	       (double)st->prefetch_used_bytes / 1e6, (double)st->prefetch_wasted_bytes / 1e6,
	       (unsigned long long)st->hedges, (unsigned long long)st->hedges_won);
	for (uint32_t d = 0; d < n && n > 1; d++) {
		char emu[48] = "";
		if (in->drive[d].emulated_rate)
			snprintf(emu, sizeof(emu), ", emulated at %.2f GB/s",
				 (double)in->drive[d].emulated_rate / 1e9);
		printf("  drive %u: %u experts; %.2f MB (demand %.2f, prefetch used %.2f, wasted %.2f),"
		       " %llu hedged (%llu won elsewhere); measured %.2f GB/s, p95 %.1f ms; raw disk"
		       " %.3f GB/s%s\n", d, d ? held[d] : in->drive_experts[0],
		       (double)st->drive_bytes_read[d] / 1e6, (double)st->drive_demand_bytes[d] / 1e6,
		       (double)st->drive_prefetch_used_bytes[d] / 1e6,
		       (double)st->drive_prefetch_wasted_bytes[d] / 1e6,
		       (unsigned long long)st->drive_hedges[d], (unsigned long long)st->drive_hedges_won[d],
		       (double)in->drive[d].rate_bytes_per_s / 1e9, (double)in->drive[d].p95_ns / 1e6,
		       disk[d] > 0 ? disk[d] : 0.0, emu);
	}
}

int k3ctl_cmd_bench(int argc, char **argv)
{
	const char *model_dir = NULL, *preset = NULL;
	uint64_t max_new = 32, prompt_len = 32, threads = 0, io_threads = 0, disk_mib = 256;
	bool disk_mib_set = false;
	uint64_t cache_bytes = 0, seed = 1, n_samples = 5;
	int64_t prefetch = -1;   /* -1 = auto */
	double gate = 0;
	enum k3_store_direct direct = K3_STORE_DIRECT_AUTO;
	bool no_packs = false;
	int32_t spine_resident = K3_STORE_PLAN_RESIDENT_DEFAULT;
	/* several drives (docs/drives.md), as k3d takes them */
	const char *dirs[K3_STORE_MAX_DRIVES - 1];
	unsigned n_dirs = 0;
	struct k3_store_drive_opts dopts;
	uint64_t prefill_chunk = 0;    /* 0: the engine's default */
	struct k3_err err = { 0 };

	k3_store_drive_opts_init(&dopts);

	/* the int8 spine against the bf16 one: its own report (cmd_bench_spine.c) */
	for (int i = 1; i < argc; i++)
		if (!strcmp(argv[i], "--compare-spine"))
			return k3ctl_bench_compare_spine(argc, argv);
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
		uint64_t v = 0;
		int rc = 0;
		if (!strcmp(a, "--model"))
			model_dir = val;
		else if (!strcmp(a, "--preset")) {
			if (strcmp(val, "trained"))
				return k3ctl_usage("bench", "--preset '%s': only trained (for another demo "
						   "model: k3ctl demo-model --out DIR --preset P, then "
						   "--model DIR)", val);
			preset = val;
		} else if (!strcmp(a, "--max-new"))
			rc = k3_parse_u64(val, 1, BENCH_MAX_NEW, &max_new, &err);
		else if (!strcmp(a, "--prompt-len"))
			rc = k3_parse_u64(val, 1, BENCH_MAX_PROMPT, &prompt_len, &err);
		else if (!strcmp(a, "--threads"))
			rc = k3_parse_u64(val, 1, 256, &threads, &err);
		else if (!strcmp(a, "--io-threads"))
			rc = k3_parse_u64(val, 1, K3_STORE_MAX_IO_THREADS, &io_threads, &err);
		else if (!strcmp(a, "--disk-mib")) {
			rc = k3_parse_u64(val, 1, 1 << 20, &disk_mib, &err);
			disk_mib_set = true;
		}
		else if (!strcmp(a, "--disk-samples"))
			rc = k3_parse_u64(val, 2, BENCH_MAX_SAMPLES, &n_samples, &err);
		else if (!strcmp(a, "--seed"))
			rc = k3_parse_u64(val, 1, UINT64_MAX, &seed, &err);
		else if (!strcmp(a, "--expert-cache-gb"))
			rc = k3_store_budget_parse_gb(val, &cache_bytes, &err);
		else if (!strcmp(a, "--direct"))
			rc = k3_store_direct_parse(val, &direct, &err);
		else if (!strcmp(a, "--spine-resident"))
			rc = k3_store_plan_parse_resident(val, &spine_resident, &err);
		else if (!strcmp(a, "--expert-dir")) {
			if (n_dirs == K3_STORE_MAX_DRIVES - 1)
				return k3ctl_usage("bench", "--expert-dir: at most %d",
						   K3_STORE_MAX_DRIVES - 1);
			dirs[n_dirs++] = val;
		} else if (!strcmp(a, "--io-rate"))
			rc = k3_store_drive_parse_rate(val, &dopts, &err);
		else if (!strcmp(a, "--io-latency"))
			rc = k3_store_drive_parse_latency(val, &dopts, &err);
		else if (!strcmp(a, "--io-stall"))
			rc = k3_store_drive_parse_stall(val, &dopts, &err);
		else if (!strcmp(a, "--hedge"))
			rc = k3_store_drive_parse_hedge(val, &dopts, &err);
		else if (!strcmp(a, "--prefill-chunk"))
			rc = k3_parse_u64(val, 1, 4096, &prefill_chunk, &err);
		else if (!strcmp(a, "--prefetch-gate"))
			rc = k3_parse_double(val, 0.001, 1, &gate, &err);
		else if (!strcmp(a, "--prefetch")) {
			if (!strcmp(val, "off"))
				prefetch = 0;
			else if (!strcmp(val, "auto"))
				prefetch = -1;
			else if (!(rc = k3_parse_u64(val, 1, 64, &v, &err)))
				prefetch = (int64_t)v;
		} else
			return k3ctl_usage("bench", "unknown option '%s' (see --help)", a);
		if (rc)
			return k3ctl_usage("bench", "%s: %s", a, err.msg);
	}
	if (!!model_dir + !!preset != 1)
		return k3ctl_usage("bench", "one of --model DIR and --preset trained is required");
	if (gate > 0 && prefetch >= 0)
		return k3ctl_usage("bench", "--prefetch-gate applies to --prefetch auto only");

	struct k3_model *model = NULL;
	struct k3_engine *e = NULL;
	struct k3_engine_seq *seq = NULL;
	struct k3_store_source *src = NULL, *dsrc = NULL;
	struct k3_store *store = NULL;
	struct k3_store_spine *spine = NULL;
	struct probe probe = { 0 };
	bool probe_init = false;
	struct k3_store_engine_src ectx;
	bool ectx_init = false;
	struct k3_store_open_report rep = { 0 };
	struct k3_store_plan_out *plan = NULL;
	int32_t *ids = NULL;
	uint32_t *gen_ids = NULL;
	float *logits = NULL;
	struct samples *sm = calloc(1, sizeof(*sm));
	uint8_t *dbufs[K3_STORE_MAX_IO_THREADS] = { 0 };
	int code = K3CTL_EXIT_ERROR, rc;
	char packdir[4096], tmpdir[2048] = "";   /* tmpdir: leaves packdir room for its suffix */
	struct k3_tok_ids text_ids = { 0 };

	if (!sm) {
		rc = k3_err_set(&err, -ENOMEM, "out of memory");
		goto fail;
	}
	if (preset) {
		const char *t = getenv("TMPDIR");
		unsigned long long written = 0;
		if ((size_t)snprintf(tmpdir, sizeof(tmpdir), "%s/k3-bench-trained.XXXXXX",
				     t && *t ? t : "/tmp") >= sizeof(tmpdir)) {
			rc = k3_err_set(&err, -ENAMETOOLONG, "TMPDIR is too long (%zu bytes at most)",
					sizeof(tmpdir) - 25);
			tmpdir[0] = 0;
			goto fail;
		}
		if (!mkdtemp(tmpdir)) {
			rc = k3_err_set(&err, -errno, "%s: %s", tmpdir, strerror(errno));
			tmpdir[0] = 0;
			goto fail;
		}
		model_dir = tmpdir;
		if ((rc = k3ctl_trained_install(tmpdir, &written, &err)))
			goto fail;
		struct k3_tok *tok = NULL;
		rc = k3_tok_load_dir(tmpdir, &tok, &err);
		if (!rc)
			rc = k3_tok_encode(tok, trained_prompt, sizeof(trained_prompt) - 1, false,
					   &text_ids, &err);
		k3_tok_free(tok);
		if (rc)
			goto fail;
		if (prompt_len > text_ids.n)
			prompt_len = text_ids.n;
	}
	rc = k3_model_open(model_dir, &model, &err);
	if (rc)
		goto fail;
	const struct k3_model_config *mc = k3_model_config(model);
	if (!mc->n_moe) {
		rc = k3_err_set(&err, -EINVAL, "the model has no MoE layers: nothing to stream");
		goto fail;
	}
	snprintf(packdir, sizeof(packdir), "%s/%s", model_dir, K3_STORE_PACK_SUBDIR);
	bool have_packs = !no_packs && access(packdir, F_OK) == 0;
	if ((rc = k3_store_source_open_model(model, have_packs ? packdir : NULL, direct, &src, &rep,
					     &err))) {
		if (rc == -EMEDIUMTYPE)
			k3_err_prefix(&err, "--direct on");
		goto fail;
	}
	/* The disk yardstick reads the same files with O_DIRECT where it
	 * works, whatever --direct the store was given. */
	if ((rc = k3_store_source_open_model(model, have_packs ? packdir : NULL, K3_STORE_DIRECT_AUTO,
					     &dsrc, NULL, &err)))
		goto fail;
	/* each --expert-dir: copies on the next drive, for the store and the
	 * yardstick alike */
	uint32_t home_experts[K3_STORE_MAX_DRIVES] = { 0 };
	for (unsigned i = 0; i < n_dirs; i++) {
		struct k3_store_home_report hr, dhr;
		if ((rc = k3_store_source_add_home(src, model, dirs[i], i + 1, &hr, &err)) ||
		    (rc = k3_store_source_add_home(dsrc, model, dirs[i], i + 1, &dhr, &err))) {
			k3_err_prefix(&err, "--expert-dir '%s'", dirs[i]);
			goto fail;
		}
		if (hr.layers == 0) {
			rc = k3_err_set(&err, -ENOENT, "--expert-dir '%s' holds no valid expert pack of"
					" this model (%s)", dirs[i], hr.packs_rejected ? hr.first_rejection
					: "no experts-L*.k3pack");
			goto fail;
		}
		home_experts[i + 1] = hr.experts;
	}
	uint64_t slot = k3_store_source_slot_bytes(src);
	uint64_t pool = (uint64_t)k3_store_source_count(src) * slot;
	/* The memory plan k3d would make for this machine: the spine mapped
	 * when it fits, else (or with --spine-resident) the plan's resident
	 * set through the spine loader; the expert cache what it leaves, or
	 * --expert-cache-gb. */
	plan = malloc(sizeof(*plan));
	if (!plan) {
		rc = k3_err_set(&err, -ENOMEM, "out of memory");
		goto fail;
	}
	struct k3_store_plan_in pi = {
		.spine_resident = spine_resident, .expert_cache_bytes = cache_bytes,
		.context_tokens = (uint32_t)(prompt_len + max_new + 1), .slot_bytes = slot,
		.max_chunk = (uint32_t)prefill_chunk,
	};
	bool streams;
	if ((rc = k3_store_plan_model(model, &pi, plan, &streams, &err)))
		goto fail;
	bool pf_auto = prefetch < 0;
	uint32_t per_position = pf_auto ? mc->num_experts_per_token : (uint32_t)prefetch;
	struct k3_store_config cfg = {
		.cache_bytes = plan->expert_cache_bytes, .io_threads = (unsigned)io_threads,
		.prefetch_slots = per_position ? -1 : 0, .prefetch_auto = pf_auto,
		.prefetch_min_precision = gate, .check_scales = true, .prefault = true,
		.min_slots = mc->num_experts_per_token,
	};
	uint32_t n_drives = k3_store_source_drive_count(src);
	if ((rc = k3_store_drive_opts_apply(&dopts, n_drives, &cfg, &err)) ||
	    (rc = k3_store_new(src, &cfg, &store, &err)))
		goto fail;
	struct k3_store_info info;
	k3_store_info_get(store, &info);
	/* the emulated drives' bandwidth in all (the floor reads at it) */
	double io_rate = 0, io_latency_ms = (double)info.drive[0].emulated_latency_ns / 1e6;
	for (uint32_t d = 0; d < info.n_drives; d++)
		io_rate += (double)info.drive[d].emulated_rate / 1e9;
	probe_init = true;
	if ((rc = probe_open(&probe, src, mc->num_experts_per_token, info.io_threads, &err)))
		goto fail;
	for (unsigned i = 0; i < info.io_threads; i++) {
		if (posix_memalign((void **)&dbufs[i], K3_STORE_ALIGN, slot) != 0) {
			rc = k3_err_set(&err, -ENOMEM, "out of memory");
			goto fail;
		}
		memset(dbufs[i], 0, slot);   /* prefault: no page faults inside the timing */
	}
	uint32_t d_buffered = 0;
	for (uint32_t f = 0; f < k3_store_source_file_count(dsrc); f++)
		d_buffered += !k3_store_source_file_direct(dsrc, f);

	struct k3_engine_opts eo = { .threads = (uint32_t)threads,
				     .max_chunk = (uint32_t)prefill_chunk };
	struct k3_spine_source ss;
	struct k3_store_spine_info sinfo = { 0 };
	struct k3_store_spine_report srep = { 0 };
	if (streams) {
		struct k3_store_spine_config scfg = {
			.resident_layers = plan->resident_layers, .head_resident = plan->head_resident,
			.ring_arenas = plan->ring_arenas, .direct = direct,
			.io = k3_store_reader_pool(store), .max_rows = (uint32_t)prefill_chunk,
		};
		char spath[4200];
		snprintf(spath, sizeof(spath), "%s/spine.k3pack", packdir);
		if ((rc = k3_store_spine_new(model, have_packs ? spath : NULL, &scfg, &spine, &srep,
					     &err)))
			goto fail;
		k3_store_spine_source(spine, &ss);
		k3_store_spine_info_get(spine, &sinfo);
		eo.spine = &ss;
	}
	if ((rc = k3_engine_open(model, &eo, &e, &err)))
		goto fail;
	struct k3_expert_source es;
	k3_store_engine_src_init(&ectx, store, &es);
	ectx_init = true;
	k3_store_engine_src_set_prefetch(&ectx, per_position, &es);
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
		ids[i] = preset ? (int32_t)text_ids.v[i] : (int32_t)((rng >> 33) % V);
	}

	char pfs[64];
	if (pf_auto)
		snprintf(pfs, sizeof(pfs), "auto (gate: precision >= %.2f)",
			 gate > 0 ? gate : K3_STORE_PREFETCH_MIN_PRECISION);
	else if (per_position)
		snprintf(pfs, sizeof(pfs), "%u per position", per_position);
	else
		snprintf(pfs, sizeof(pfs), "off");
	FILE *hdr = k3ctl_g.json ? stderr : stdout;   /* --json: stdout is one JSON object */
	fprintf(hdr, "model %s: %u MoE layers x %u experts, top-%u; %zu experts in cache slots of %llu "
		"bytes (the largest expert read, O_DIRECT alignment included) = %.3f GB\n",
	       preset ? "trained (k3ctl bench --preset trained)" : model_dir, mc->n_moe,
	       mc->num_experts, mc->num_experts_per_token,
	       k3_store_source_count(src), (unsigned long long)slot, (double)pool / 1e9);
	fprintf(hdr, "prompt: %llu ids of %s\n", (unsigned long long)prompt_len,
		preset ? "the model's training text (routing as on text)"
		       : "seeded random ids (--seed)");
	fprintf(hdr, "experts from %s; store reads: %u files O_DIRECT, %u buffered (--direct %s); "
	       "cache %u slots = %.3f GB (%.1f%% of the experts; floor %.3f GB); %u I/O threads; "
	       "prefetch %s\n",
	       rep.layers_packed ? (rep.layers_shards ? "packs and shards" : "packs") : "shards",
	       info.files_direct, info.files_buffered, k3_store_direct_name(direct), info.n_slots,
	       (double)info.n_slots * (double)info.slot_bytes / 1e9,
	       100.0 * (double)info.n_slots * (double)info.slot_bytes / (double)pool,
	       (double)plan->expert_floor_bytes / 1e9, info.io_threads, pfs);
	if (rep.packs_rejected)
		fprintf(hdr, "note: %u packs rejected, those layers read from the shards; first: %s\n",
			rep.packs_rejected, rep.first_rejection);
	if (spine)
		fprintf(hdr, "spine: %u layers resident, %u streamed%s from %s (%.3f GB per pass)"
			" through %u arenas of %.3f GB%s%s\n", sinfo.resident_layers,
			sinfo.n_layers - sinfo.resident_layers, sinfo.head_resident ? "" : " and the head",
			srep.from_pack ? "the spine pack" : "the shards",
			(double)sinfo.streamed_bytes_per_pass / 1e9, sinfo.ring_arenas,
			(double)sinfo.arena_bytes / 1e9, srep.pack_rejected ? "; pack rejected: " : "",
			srep.pack_rejected ? srep.rejection : "");
	if (info.files_buffered)
		fprintf(hdr, "note: buffered store reads may be served from the page cache; bytes "
			"counted are bytes asked of the kernel\n");
	if (io_rate > 0 || io_latency_ms > 0)
		fprintf(hdr, "emulated drive: store reads limited to %.3f GB/s in all, %.3f ms per "
			"request%s\n", io_rate, io_latency_ms, info.files_direct ? " (O_DIRECT reads: "
			"the real disk also limits them; --direct off over page-cached files isolates "
			"the emulation)" : "");
	if (n_drives > 1)
		fprintf(hdr, "drives: %u (the model directory's and %u --expert-dir); hedging %s\n",
			n_drives, n_dirs, info.hedge_buffers ? "on" : dopts.hedge_factor == 0 ? "off"
			: "off: the cache cannot spare a hedge buffer beyond a token's experts");
	if (d_buffered)
		fprintf(hdr, "note: the disk yardstick could not use O_DIRECT on %u files: its figure "
			"may include the page cache\n", d_buffered);
	fflush(hdr);

	/* Sample points: before, after the prompt, evenly inside the decode,
	 * after. */
	uint32_t mid = (uint32_t)n_samples > 3 ? (uint32_t)n_samples - 3 : 0;
	if (n_samples == 2)
		mid = 0;
	uint64_t dseed = seed ^ 0xD1B54A32D192ED03ull, dmax = disk_mib << 20;
	/* A sample sized for K3 (256 MiB) against a tiny demo pool takes a
	 * minute of expert-sized reads and says nothing about K3: by default a
	 * sample reads at most the pool once (at least 16 MiB). */
	if (!disk_mib_set && dmax > pool) {
		dmax = pool > (16u << 20) ? pool : (16u << 20);
		fprintf(hdr, "note: disk samples of %.1f MiB (the %.1f MiB expert pool once, at least "
			"16 MiB; --disk-mib sets it); a pool this small is mostly in the host's caches, "
			"so the disk figures are indicative only\n", (double)dmax / (1 << 20),
			(double)pool / (1 << 20));
	}
	if ((rc = take_sample(sm, "before", dsrc, info.io_threads, dbufs, &probe, dmax, &dseed, &err)))
		goto fail;

	struct k3_store_stats s0, s1, s2;
	struct k3_store_spine_stats p0, p1, p2;
	struct phase pre, dec;
	if ((rc = k3_engine_seq_new(e, (uint32_t)(prompt_len + max_new + 1), &seq, &err)))
		goto fail;
	snapshot(store, spine, &s0, &p0);
	k3_store_epoch_begin(store);   /* the prefill's distinct experts */
	double t0 = now_s();
	struct k3_engine_out out = { K3_ENGINE_LOGITS_LAST, logits, NULL, NULL };
	if ((rc = k3_engine_forward(e, seq, ids, (uint32_t)prompt_len, &out, &err)))
		goto fail;
	k3_store_prefetch_cancel(store, UINT32_MAX);
	k3_store_drain(store);
	if (spine)
		k3_store_spine_drain(spine);
	pre.wall_s = now_s() - t0;
	k3_store_idle(store);
	snapshot(store, spine, &s1, &p1);
	if (n_samples > 2 &&
	    (rc = take_sample(sm, "after the prompt", dsrc, info.io_threads, dbufs, &probe, dmax, &dseed, &err)))
		goto fail;
	uint32_t gen = 0, next_mid = 1;
	dec.wall_s = 0;
	for (; gen < max_new; gen++) {
		if (next_mid <= mid && gen == (uint32_t)(max_new * next_mid / (mid + 1))) {
			/* Between tokens, outside the timed part. */
			k3_store_drain(store);
			k3_store_idle(store);
			if ((rc = take_sample(sm, "during the decode", dsrc, info.io_threads, dbufs, &probe,
					      dmax, &dseed, &err)))
				goto fail;
			next_mid++;
		}
		int32_t tok = (int32_t)k3_engine_argmax(logits, V);
		gen_ids[gen] = (uint32_t)tok;
		double tt = now_s();
		if ((rc = k3_engine_forward(e, seq, &tok, 1, &out, &err)))
			goto fail;
		dec.wall_s += now_s() - tt;
	}
	double tt = now_s();
	k3_store_prefetch_cancel(store, UINT32_MAX);
	k3_store_drain(store);
	if (spine)
		k3_store_spine_drain(spine);
	dec.wall_s += now_s() - tt;
	k3_store_idle(store);   /* unused guesses settle as wasted: the bytes add up */
	snapshot(store, spine, &s2, &p2);
	k3_store_stats_sub(&s1, &s0, &pre.st);
	k3_store_stats_sub(&s2, &s1, &dec.st);
	k3_store_spine_stats_sub(&p1, &p0, &pre.sp);
	k3_store_spine_stats_sub(&p2, &p1, &dec.sp);
	if ((rc = take_sample(sm, "after", dsrc, info.io_threads, dbufs, &probe, dmax, &dseed, &err)))
		goto fail;

	/* each further drive's yardstick, once, after the run */
	double drive_disk[K3_STORE_MAX_DRIVES] = { 0 };
	for (uint32_t d = 1; d < n_drives; d++) {
		uint64_t db = 0;
		drive_disk[d] = disk_bandwidth(&probe, dsrc, d, info.io_threads, dbufs, dmax, &dseed, &db);
		if (drive_disk[d] < 0 && drive_disk[d] != -ENOENT) {
			rc = k3_err_set(&err, (int)drive_disk[d], "drive %u: disk read failed: %s", d,
					strerror((int)-drive_disk[d]));
			goto fail;
		}
	}
	struct spread disk = spread_of(sm->disk, sm->n), cold = spread_of(sm->cold, sm->n);
	drive_disk[0] = disk.median;
	struct spread ratio = spread_of(sm->ratio, sm->n);
	double bw = disk.median;
	double dec_wait = (double)(dec.st.io_wait_ns + dec.sp.io_wait_ns) * 1e-9;
	double per_tok = dec.wall_s / (double)max_new;
	double compute_tok = (dec.wall_s - dec_wait) / (double)max_new;
	if (compute_tok < 0)
		compute_tok = 0;
	/* the floor reads the streamed spine's bytes too */
	double bytes_tok = (double)(dec.st.bytes_read + dec.sp.bytes_read) / (double)max_new;
	double read_tok = bw > 0 ? bytes_tok / (bw * 1e9) : 0;
	double floor_tok = read_tok > compute_tok ? read_tok : compute_tok;
	/* The same floor against the slowest and the fastest disk sample. */
	double r_slow = disk.min > 0 ? bytes_tok / (disk.min * 1e9) : 0;
	double r_fast = disk.max > 0 ? bytes_tok / (disk.max * 1e9) : 0;
	double f_slow = r_slow > compute_tok ? r_slow : compute_tok;
	double f_fast = r_fast > compute_tok ? r_fast : compute_tok;
	/* The emulated drive's floor: its bandwidth, not the disk's. */
	double emu_read = io_rate > 0 ? bytes_tok / (io_rate * 1e9) : 0;
	double emu_floor = emu_read > compute_tok ? emu_read : compute_tok;
	uint64_t dacc = dec.st.demand_hits + dec.st.demand_misses;
	uint64_t scored[K3_STORE_GUESS_KINDS][K3_STORE_GUESS_RANKS];
	uint64_t right[K3_STORE_GUESS_KINDS][K3_STORE_GUESS_RANKS];
	static const char *const kind_key[K3_STORE_GUESS_KINDS] = {
		"lookahead_by_rank", "partial_lookahead_by_rank" };
	static const char *const kind_name[K3_STORE_GUESS_KINDS] = {
		"after the layer", "partial" };
	for (int g = 0; g < K3_STORE_GUESS_KINDS; g++)
		k3_store_guess_table(store, (enum k3_store_guess_kind)g, scored[g], right[g]);
	struct k3_store_stats all;
	k3_store_stats_sub(&s2, &s0, &all);
	struct k3_store_info info_end;
	k3_store_info_get(store, &info_end);

	if (k3ctl_g.json) {
		json_t *o = json_pack("{s:s, s:I, s:I, s:I, s:i, s:s, s:s, s:o, s:o}",
				      "model", preset ? "trained" : model_dir, "expert_bytes", (json_int_t)slot,
				      "pool_bytes", (json_int_t)pool,
				      "cache_bytes", (json_int_t)((uint64_t)info.n_slots * info.slot_bytes),
				      "io_threads", (int)info.io_threads,
				      "direct", k3_store_direct_name(direct), "prefetch", pfs,
				      "prefill", phase_json(&pre, (uint32_t)prompt_len),
				      "decode", phase_json(&dec, (uint32_t)max_new));
		json_object_set_new(o, "disk_gbps", spread_json(disk));
		json_object_set_new(o, "disk_gbps_samples", array_json(sm->disk, sm->n));
		json_object_set_new(o, "cold_read_gbps", spread_json(cold));
		json_object_set_new(o, "cold_read_gbps_samples", array_json(sm->cold, sm->n));
		json_object_set_new(o, "cold_read_ratio", spread_json(ratio));
		json_object_set_new(o, "decode_s_per_token", json_real(per_tok));
		json_object_set_new(o, "compute_s_per_token", json_real(compute_tok));
		json_object_set_new(o, "floor_s_per_token", json_real(floor_tok));
		json_object_set_new(o, "decode_vs_floor", json_real(floor_tok > 0 ? per_tok / floor_tok : 0));
		json_object_set_new(o, "decode_vs_floor_range",
				    json_pack("{s:f, s:f}", "slowest_disk", f_slow > 0 ? per_tok / f_slow : 0,
					      "fastest_disk", f_fast > 0 ? per_tok / f_fast : 0));
		if (io_rate > 0 || io_latency_ms > 0) {
			json_object_set_new(o, "io_rate_gbps", json_real(io_rate));
			json_object_set_new(o, "io_latency_ms", json_real(io_latency_ms));
			json_object_set_new(o, "emulated_wait_s",
					    json_real((double)dec.st.emulated_wait_ns * 1e-9));
			json_object_set_new(o, "emulated_floor_s_per_token", json_real(emu_floor));
			json_object_set_new(o, "decode_vs_emulated_floor",
					    json_real(emu_floor > 0 ? per_tok / emu_floor : 0));
		}
		json_object_set_new(o, "prefetch_unused_resident_bytes",
				    json_integer((json_int_t)info_end.prefetch_unused_bytes));
		json_object_set_new(o, "prefetch_precision",
				    json_real(all.prefetch_issued ? (double)all.prefetch_used /
								    (double)all.prefetch_issued : 0));
		for (int g = 0; g < K3_STORE_GUESS_KINDS; g++) {
			json_t *gr = json_array();
			for (int r = 0; r < K3_STORE_GUESS_RANKS && r < (int)mc->num_experts_per_token;
			     r++)
				json_array_append_new(gr, json_pack("{s:I, s:I}",
					"scored", (json_int_t)scored[g][r], "right", (json_int_t)right[g][r]));
			json_object_set_new(o, kind_key[g], gr);
		}
		json_t *g = json_array();
		for (uint32_t i = 0; i < gen; i++)
			json_array_append_new(g, json_integer(gen_ids[i]));
		json_object_set_new(o, "greedy", g);
		json_object_set_new(o, "prefill_distinct_experts",
				    json_integer((json_int_t)pre.st.distinct_experts));
		json_object_set_new(o, "prefill_bytes_per_distinct_span", json_real(
			pre.st.distinct_experts ? (double)pre.st.bytes_read /
			((double)pre.st.distinct_experts * (double)slot) : 0));
		json_object_set_new(o, "hedge_buffers", json_integer(info.hedge_buffers));
		json_object_set_new(o, "drives", drives_json(&all, &info_end, n_drives, drive_disk,
							    home_experts));
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
		printf("disk, %d samples (before, after the prompt, %u during the decode, after), each "
		       "%.0f MB of whole-expert reads with %s, %u in flight, in cold-step order (top-k "
		       "random experts of a layer, sorted by offset):\n"
		       "  disk GB/s:       ", sm->n, mid, (double)sm->disk_bytes / 1e6,
		       d_buffered ? "buffered reads" : "O_DIRECT", info.io_threads);
		for (int i = 0; i < sm->n; i++)
			printf(" %.3f", sm->disk[i]);
		printf("  -> median %.3f, min %.3f, max %.3f (spread %.0f%% of the median)\n",
		       disk.median, disk.min, disk.max,
		       disk.median > 0 ? 100 * (disk.max - disk.min) / disk.median : 0);
		printf("  cold store GB/s: ");
		for (int i = 0; i < sm->n; i++)
			printf(" %.3f", sm->cold[i]);
		printf("  -> median %.3f, min %.3f, max %.3f\n", cold.median, cold.min, cold.max);
		printf("cold expert reads / disk (per sample pair): median %.2f x (%.2f .. %.2f) "
		       "(target >= 0.90)\n", ratio.median, ratio.min, ratio.max);
		printf("decode: %.2f tokens/s, %.2f MB read/token (%.2f MB of it wasted prefetch%s), hit "
		       "rate %.1f%% (%.1f%% of accesses served by an earlier step's prefetch); prefetch "
		       "precision %.1f%% (used later / issued, whole run), %.2f MB wasted in all (+ %.2f MB "
		       "read ahead, unused and still resident at the end)\n",
		       dec.wall_s > 0 ? max_new / dec.wall_s : 0, bytes_tok / 1e6,
		       (double)dec.st.prefetch_wasted_bytes / (double)max_new / 1e6,
		       dec.sp.bytes_read ? ", spine included" : "",
		       dacc ? 100.0 * (double)dec.st.demand_hits / (double)dacc : 0,
		       dacc ? 100.0 * (double)dec.st.prefetch_used / (double)dacc : 0,
		       all.prefetch_issued ? 100.0 * (double)all.prefetch_used /
						(double)all.prefetch_issued : 0,
		       (double)all.prefetch_wasted_bytes / 1e6,
		       (double)info_end.prefetch_unused_bytes / 1e6);
		printf("lookahead precision by rank (guesses not resident when made, read or not):");
		for (int g = 0; g < K3_STORE_GUESS_KINDS; g++) {
			printf("%s %s:", g ? ";" : "", kind_name[g]);
			for (int r = 0; r < SHOW_RANKS && r < (int)mc->num_experts_per_token; r++)
				printf(" r%d %.0f%% of %llu", r, scored[g][r] ? 100.0 *
				       (double)right[g][r] / (double)scored[g][r] : 0,
				       (unsigned long long)scored[g][r]);
		}
		printf("\n");
		printf("prefill: %u positions per pass, %.2f MB of experts read for %llu distinct experts:"
		       " %.3f x one read of each\n", prefill_chunk ? (unsigned)prefill_chunk : 64u,
		       (double)pre.st.bytes_read / 1e6, (unsigned long long)pre.st.distinct_experts,
		       pre.st.distinct_experts ? (double)pre.st.bytes_read /
		       ((double)pre.st.distinct_experts * (double)slot) : 0);
		drives_print(&all, &info_end, n_drives, drive_disk, home_experts);
		printf("decode time/token %.4f s vs floor max(read %.4f s at the median disk, compute "
		       "%.4f s) = %.4f s: %.2f x floor (%.2f x .. %.2f x against the slowest .. fastest "
		       "disk sample) (target <= 1.2)\n", per_tok, read_tok, compute_tok, floor_tok,
		       floor_tok > 0 ? per_tok / floor_tok : 0, f_slow > 0 ? per_tok / f_slow : 0,
		       f_fast > 0 ? per_tok / f_fast : 0);
		if (io_rate > 0 || io_latency_ms > 0)
			printf("emulated drive %.3f GB/s + %.3f ms per request (readers slept %.3f s of the "
			       "decode for it): decode time/token %.4f s vs floor max(read %.4f s at %.3f "
			       "GB/s, compute %.4f s) = %.4f s: %.2f x floor\n", io_rate, io_latency_ms,
			       (double)dec.st.emulated_wait_ns * 1e-9, per_tok, emu_read, io_rate,
			       compute_tok, emu_floor, emu_floor > 0 ? per_tok / emu_floor : 0);
	}
	code = K3CTL_EXIT_OK;
	rc = 0;
fail:
	if (rc)
		fprintf(stderr, "k3ctl bench: %s\n", err.msg);
	free(plan);
	free(ids);
	free(gen_ids);
	free(logits);
	free(sm);
	for (unsigned i = 0; i < K3_STORE_MAX_IO_THREADS; i++)
		free(dbufs[i]);
	k3_engine_seq_free(seq);
	k3_engine_free(e);
	if (ectx_init)
		k3_store_engine_src_release(&ectx);
	if (probe_init)
		probe_close(&probe);
	k3_store_spine_free(spine);   /* before the pool it borrows */
	k3_store_free(store);
	k3_store_source_free(src);
	k3_store_source_free(dsrc);
	k3_model_free(model);
	k3_tok_ids_release(&text_ids);
	if (tmpdir[0])
		k3ctl_trained_remove(tmpdir);
	return code;
}

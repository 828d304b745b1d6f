/*
 * cmd_bench_disk.c - k3ctl bench's two measures of the disk (the method:
 * cmd_bench.c's head comment): the raw O_DIRECT yardstick in the pattern
 * of cold decode steps, and the same steps acquired through a probe store
 * (the store's own cold read path), taken in pairs.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "store/store_plan.h"

double k3ctl_bench_now_s(void)
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

struct k3ctl_bench_spread k3ctl_bench_spread_of(const double *v, int n)
{
	double s[BENCH_MAX_SAMPLES];
	struct k3ctl_bench_spread r = { 0, 0, 0 };

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

int k3ctl_bench_probe_open(struct k3ctl_bench_probe *p, const struct k3_store_source *src,
			   uint32_t top_k, unsigned io_threads, struct k3_err *err)
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
			p->layers[p->n_layers++] = (struct k3ctl_bench_layer_range){ l, i, 0 };
		p->layers[p->n_layers - 1].n++;
	}
	struct k3_store_config cfg = {
		.cache_bytes = 2ull * top_k * slot, .io_threads = io_threads,
		.prefetch_slots = 0, .check_scales = false, .prefault = true,
	};
	return k3_store_new(src, &cfg, &p->store, err);
}

void k3ctl_bench_probe_close(struct k3ctl_bench_probe *p)
{
	k3_store_free(p->store);
	free(p->by_layer);
	free(p->layers);
}

/* Steps of top_k distinct random experts of one random layer, each expert
 * not resident in the probe store (every one a cold miss), until max_bytes
 * were read. Returns GB/s (bytes read / wall time of the acquires), or a
 * negative errno. */
static double cold_bandwidth(struct k3ctl_bench_probe *p, uint64_t max_bytes, uint64_t *seed,
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
		const struct k3ctl_bench_layer_range *lr = &p->layers[xorshift(seed) % p->n_layers];
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
		double t0 = k3ctl_bench_now_s();
		int rc = k3_store_acquire(p->store, lr->layer, ids, n, views, err);
		wall += k3ctl_bench_now_s() - t0;
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
 * one drive (its copies; k3d --expert-dir, docs/drives.md), in the pattern of cold decode steps: groups of top_k distinct
 * random experts of one random layer, each group sorted by file offset,
 * the groups back to back with `threads` reads in flight (no step barrier:
 * this is what the disk can do; the store's step-by-step acquires are
 * measured against it). bufs: `threads` prefaulted slot-sized buffers.
 * Returns GB/s or a negative errno (-ENOENT: the drive holds no expert). */
double k3ctl_bench_disk_bandwidth(const struct k3ctl_bench_probe *p,
				  const struct k3_store_source *dsrc, uint32_t drive,
				  unsigned threads, uint8_t **bufs, uint64_t max_bytes,
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
		const struct k3ctl_bench_layer_range *lr = &p->layers[xorshift(seed) % p->n_layers];
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
	double t0 = k3ctl_bench_now_s();
	for (unsigned t = 0; t < threads; t++)
		if (pthread_create(&th[t], NULL, disk_worker, &j) == 0)
			started++;
	for (unsigned t = 0; t < started; t++)
		pthread_join(th[t], NULL);
	double dt = k3ctl_bench_now_s() - t0;
	free(order);
	if (started == 0)
		return -EAGAIN;
	if (atomic_load(&j.error))
		return atomic_load(&j.error);
	*bytes_out = atomic_load(&j.bytes);
	return dt > 0 ? (double)*bytes_out / dt / 1e9 : 0;
}

/* One disk + cold-read pair, the order alternating from sample to sample. */
int k3ctl_bench_take_sample(struct k3ctl_bench_samples *sm, const char *where,
			    const struct k3_store_source *dsrc, unsigned threads, uint8_t **bufs,
			    struct k3ctl_bench_probe *p, uint64_t max_bytes, uint64_t *seed,
			    struct k3_err *err)
{
	double d = 0, c = 0;
	int i = sm->n;

	if (i >= BENCH_MAX_SAMPLES)
		return 0;
	for (int pass = 0; pass < 2; pass++) {
		if ((pass == 0) == (i % 2 == 0)) {
			d = k3ctl_bench_disk_bandwidth(p, dsrc, 0, threads, bufs, max_bytes, seed,
						       &sm->disk_bytes);
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

/* The emulated drive (store_io.h, --io-rate / --io-latency): the limiter
 * is engaged (a read of N bytes at R bytes/s never completes before N / R:
 * a lower bound, which no load on the machine can break; upper bounds are
 * for the benchmarks), its bandwidth is shared by all readers and classes,
 * pieces and whole reads are paced alike, latency is per request, it is
 * off at 0, and byte counters stay exact: the store reads the same bytes
 * with and without it. */
#include "t.h"

#include <errno.h>
#include <time.h>

#include "store/store.h"
#include "store/store_io.h"
#include "fixture.h"

#define MIB ((uint64_t)1 << 20)

/* A drive that costs nothing: the emulation alone sets the time. */
static int64_t instant_read(void *ctx, const struct k3_store_read *rd, uint8_t *dst)
{
	(void)ctx;
	memset(dst + rd->slot_offset, 0x5a, (size_t)rd->length);
	return (int64_t)rd->length;
}

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

struct tjob {
	struct k3_store_io_job job;
	struct k3_store_read rd[8];
	uint8_t *buf;
	bool done;
	uint64_t bytes;
};

static void job_done(struct k3_store_io_job *job, int rc, uint64_t bytes, bool stopped)
{
	struct tjob *t = job->owner;
	T_EQ_INT(rc, 0);
	T_OK(!stopped);
	t->bytes = bytes;
	t->done = true;
}

static const struct k3_store_io_ops ops = { NULL, NULL, job_done };

/* n reads of `len` bytes each, back to back in one buffer. */
static void job_init(struct tjob *t, unsigned n, uint64_t len, uint64_t piece)
{
	memset(t, 0, sizeof(*t));
	t->buf = aligned_alloc(K3_STORE_ALIGN, n * len);
	for (unsigned i = 0; i < n; i++)
		t->rd[i] = (struct k3_store_read){ .file = 0, .offset = i * len, .length = len,
						   .slot_offset = i * len };
	t->job = (struct k3_store_io_job){ .read = instant_read, .rd = t->rd, .n_rd = n,
					   .dst = t->buf, .piece_bytes = piece, .ops = &ops, .owner = t };
}

/* Runs the jobs (each to its class) through a pool with this drive and
 * returns the wall time from the first submit to the last done. */
static double run(unsigned threads, uint64_t rate, uint64_t latency_ns, struct tjob *jobs,
		  const enum k3_store_io_class *cls, int n, struct k3_store_io_stats *st)
{
	struct k3_store_io_config cfg = { .threads = threads, .rate_bytes_per_s = rate,
					  .latency_ns = latency_ns };
	struct k3_store_io *io;
	struct k3_err err = { 0 };

	T_EQ_INT(k3_store_io_new(&cfg, &io, &err), 0);
	k3_store_io_lock(io);
	double t0 = now_s();
	for (int i = 0; i < n; i++)
		k3_store_io_submit(io, &jobs[i].job, cls[i]);
	for (;;) {
		bool all = true;
		for (int i = 0; i < n; i++)
			all &= jobs[i].done;
		if (all)
			break;
		k3_store_io_wait(io);
	}
	double dt = now_s() - t0;
	k3_store_io_stats_get(io, st);
	k3_store_io_unlock(io);
	k3_store_io_free(io);
	return dt;
}

static void pool_cases(void)
{
	struct tjob j[2];
	struct k3_store_io_stats st;
	const enum k3_store_io_class demand[2] = { K3_STORE_IO_DEMAND, K3_STORE_IO_DEMAND };
	const enum k3_store_io_class mixed[2] = { K3_STORE_IO_DEMAND, K3_STORE_IO_PREFETCH };
	const uint64_t rate = 100000000;   /* 100 MB/s */

	/* Off: no wait at all, and the exact bytes. */
	job_init(&j[0], 4, 2 * MIB, 0);
	run(1, 0, 0, j, demand, 1, &st);
	T_EQ_U64(st.bytes[K3_STORE_IO_DEMAND], 8 * MIB);
	T_EQ_U64(st.emulated_wait_ns, 0);
	free(j[0].buf);

	/* One job of 8 MiB in 4 reads at 100 MB/s: at least 83.9 ms. */
	job_init(&j[0], 4, 2 * MIB, 0);
	double dt = run(1, rate, 0, j, demand, 1, &st);
	T_OK(dt >= (double)(8 * MIB) / (double)rate);
	T_EQ_U64(j[0].bytes, 8 * MIB);
	T_EQ_U64(st.bytes[K3_STORE_IO_DEMAND], 8 * MIB);
	T_OK(st.emulated_wait_ns > 0 && (double)st.emulated_wait_ns * 1e-9 <= dt);
	printf("# 8 MiB at 100 MB/s: %.1f ms (floor %.1f ms)\n", dt * 1e3, 8.0 * MIB / rate * 1e3);
	free(j[0].buf);

	/* Two readers, a demand and a prefetch job of 4 MiB each (the guess in
	 * 1 MiB pieces): one drive for both, so together at least 8 MiB / R. */
	job_init(&j[0], 2, 2 * MIB, 0);
	job_init(&j[1], 1, 4 * MIB, MIB);
	dt = run(2, rate, 0, j, mixed, 2, &st);
	T_OK(dt >= (double)(8 * MIB) / (double)rate);
	T_EQ_U64(st.bytes[K3_STORE_IO_DEMAND], 4 * MIB);
	T_EQ_U64(st.bytes[K3_STORE_IO_PREFETCH], 4 * MIB);
	printf("# 2 x 4 MiB on 2 readers at 100 MB/s: %.1f ms (floor %.1f ms)\n", dt * 1e3,
	       8.0 * MIB / rate * 1e3);
	free(j[0].buf);
	free(j[1].buf);

	/* Latency alone: 5 requests of one reader, 20 ms each, at least 100 ms;
	 * the 4 MiB guess in 1 MiB pieces is 4 requests. */
	job_init(&j[0], 5, 4096, 0);
	dt = run(1, 0, 20000000, j, demand, 1, &st);
	T_OK(dt >= 0.100);
	T_EQ_U64(st.bytes[K3_STORE_IO_DEMAND], 5 * 4096);
	free(j[0].buf);
	job_init(&j[0], 1, 4 * MIB, MIB);
	const enum k3_store_io_class pf[1] = { K3_STORE_IO_PREFETCH };
	dt = run(1, 0, 20000000, j, pf, 1, &st);
	T_OK(dt >= 0.080);
	free(j[0].buf);
}

/* The store over the fixture: the same acquires read exactly the same
 * bytes with the drive as without, and no sooner than bytes / rate. */
static void store_case(void)
{
	struct fixture fx;
	struct k3_err err = { 0 };
	uint64_t bytes[2] = { 0, 0 };

	if (fx_init(&fx) != 0) {
		printf("# skip: no fixture\n");
		return;
	}
	struct k3_store_source *src = fx_source(&fx, K3_STORE_DIRECT_OFF, &err);
	T_OK(src != NULL);
	for (int pass = 0; src && pass < 2; pass++) {
		const uint64_t rate = 2000000;   /* 2 MB/s: the fixture's experts are ~10 KB */
		struct k3_store_config cfg = {
			.cache_bytes = FX_EXPERTS * k3_store_source_slot_bytes(src), .io_threads = 2,
			.prefetch_slots = 0, .io_rate_bytes_per_s = pass ? rate : 0,
		};
		struct k3_store *s;
		struct k3_store_view v[FX_EXPERTS];
		struct k3_store_stats st;
		uint32_t ids[FX_EXPERTS];
		T_EQ_INT(k3_store_new(src, &cfg, &s, &err), 0);
		double t0 = now_s();
		for (uint32_t layer = 1; layer <= FX_LAYERS; layer++) {
			for (uint32_t e = 0; e < FX_EXPERTS; e++)
				ids[e] = e * 3;
			k3_store_step_begin(s);
			T_EQ_INT(k3_store_acquire(s, layer, ids, FX_EXPERTS, v, &err), 0);
			k3_store_release(s, v, FX_EXPERTS);
		}
		double dt = now_s() - t0;
		k3_store_stats_get(s, &st);
		bytes[pass] = st.bytes_read;
		if (pass) {
			T_OK(dt >= (double)st.bytes_read / (double)rate);
			T_OK(st.emulated_wait_ns > 0);
			printf("# store: %llu bytes at 2 MB/s in %.1f ms (floor %.1f ms)\n",
			       (unsigned long long)st.bytes_read, dt * 1e3,
			       (double)st.bytes_read / rate * 1e3);
		} else {
			T_EQ_U64(st.emulated_wait_ns, 0);
		}
		k3_store_free(s);
	}
	T_OK(bytes[0] > 0);
	T_EQ_U64(bytes[1], bytes[0]);
	k3_store_source_free(src);
	fx_release(&fx);
}

int main(void)
{
	pool_cases();
	store_case();
	return t_done();
}

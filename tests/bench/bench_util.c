/* bench_util.c - shared benchmark helpers (see bench_util.h). */
#include "bench_util.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

double k3_bench_now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

double k3_bench_cpu_now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

double k3_bench_median(double *v, int n)
{
	if (n <= 0)
		return 0;
	qsort(v, (size_t)n, sizeof(*v), cmp_d);
	return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static uint64_t rng_state = 0x243F6A8885A308D3ull;

uint64_t k3_bench_rand(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return rng_state;
}

void k3_bench_fill_random(void *p, size_t bytes)
{
	uint64_t *q = p;
	size_t n = bytes / 8;

	for (size_t i = 0; i < n; i++)
		q[i] = k3_bench_rand();
	for (size_t i = n * 8; i < bytes; i++)
		((uint8_t *)p)[i] = (uint8_t)k3_bench_rand();
}

enum { STREAMS = 4, BLOCK = 16384, MAX_THREADS = 256 };

/* XOR of every 16-byte word, four streams BLOCK bytes apart side by side. */
static uint64_t stream_read(const uint8_t *p, size_t bytes)
{
	const size_t sb = STREAMS * BLOCK;
#if defined(__SSE2__)
	__m128i a[STREAMS], r;

	for (int k = 0; k < STREAMS; k++)
		a[k] = _mm_setzero_si128();
	for (size_t base = 0; base + sb <= bytes; base += sb)
		for (size_t i = 0; i < BLOCK; i += 32)
			for (int k = 0; k < STREAMS; k++) {
				const uint8_t *q = p + base + (size_t)k * BLOCK + i;

				a[k] = _mm_xor_si128(a[k], _mm_xor_si128(_mm_loadu_si128((const __m128i *)q),
									 _mm_loadu_si128((const __m128i *)(q + 16))));
			}
	r = _mm_xor_si128(_mm_xor_si128(a[0], a[1]), _mm_xor_si128(a[2], a[3]));
	return (uint64_t)_mm_cvtsi128_si64(r) ^ (uint64_t)_mm_cvtsi128_si64(_mm_unpackhi_epi64(r, r));
#else
	uint64_t a[STREAMS] = { 0 };

	for (size_t base = 0; base + sb <= bytes; base += sb)
		for (size_t i = 0; i < BLOCK; i += 8)
			for (int k = 0; k < STREAMS; k++) {
				uint64_t v;

				memcpy(&v, p + base + (size_t)k * BLOCK + i, 8);
				a[k] ^= v;
			}
	return a[0] ^ a[1] ^ a[2] ^ a[3];
#endif
}

struct read_job {
	const uint8_t *p;
	size_t bytes;
	uint64_t sum;
};

static void *read_main(void *arg)
{
	struct read_job *j = arg;

	j->sum = stream_read(j->p, j->bytes);
	return NULL;
}

static volatile uint64_t sink;

double k3_bench_read_pass(const void *buf, size_t bytes, unsigned threads)
{
	pthread_t th[MAX_THREADS];
	bool made[MAX_THREADS] = { false };
	struct read_job jobs[MAX_THREADS];
	size_t per;
	double t0;

	if (threads < 1)
		threads = 1;
	if (threads > MAX_THREADS)
		threads = MAX_THREADS;
	per = bytes / threads / (STREAMS * BLOCK) * (STREAMS * BLOCK);
	t0 = k3_bench_now();
	for (unsigned i = 0; i < threads; i++) {
		jobs[i] = (struct read_job){ (const uint8_t *)buf + per * i, per, 0 };
		if (i > 0)
			made[i] = pthread_create(&th[i], NULL, read_main, &jobs[i]) == 0;
	}
	read_main(&jobs[0]);
	for (unsigned i = 1; i < threads; i++) {
		if (made[i])
			pthread_join(th[i], NULL);
		else
			read_main(&jobs[i]);   /* no thread: read it here, still measured */
	}
	for (unsigned i = 0; i < threads; i++)
		sink ^= jobs[i].sum;
	return k3_bench_now() - t0;
}

double k3_bench_mem_bw(size_t bytes, unsigned threads, int runs)
{
	double t[64];
	size_t per = bytes / (threads ? threads : 1) / (STREAMS * BLOCK) * (STREAMS * BLOCK);
	void *buf = malloc(bytes);

	if (!buf || per == 0 || runs < 1) {
		free(buf);
		return 0;
	}
	if (runs > 64)
		runs = 64;
	k3_bench_fill_random(buf, bytes);
	k3_bench_read_pass(buf, bytes, threads);   /* fault the pages in */
	for (int r = 0; r < runs; r++)
		t[r] = k3_bench_read_pass(buf, bytes, threads);
	free(buf);
	return (double)per * (threads ? threads : 1) / k3_bench_median(t, runs) / 1e9;
}

/* kern_test_util.h - seeded random data for the kernel tests. */
#ifndef K3_KERN_TEST_UTIL_H
#define K3_KERN_TEST_UTIL_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint64_t kt_state = 0x9E3779B97F4A7C15ull;

static inline uint64_t kt_next(void)
{
	uint64_t x = kt_state;

	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	kt_state = x;
	return x * 0x2545F4914F6CDD1Dull;
}

/* uniform in [-1, 1) */
static inline float kt_unif(void)
{
	return (float)((double)(kt_next() >> 11) * 0x1.0p-52 - 1.0);
}

static inline void kt_fill(float *x, size_t n)
{
	for (size_t i = 0; i < n; i++)
		x[i] = kt_unif();
}

static inline void kt_fill_bf16(uint16_t *w, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		float f = kt_unif() * 0.25f;
		uint32_t u;

		memcpy(&u, &f, sizeof(u));
		w[i] = (uint16_t)(u >> 16);
	}
}

static inline void kt_fill_bytes(uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)kt_next();
}

/* E8M0 scales around 2^-4 (121..127), as real checkpoints have */
static inline void kt_fill_scales(uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(121 + kt_next() % 7);
}

static inline void *kt_alloc(size_t bytes)
{
	void *p = malloc(bytes ? bytes : 1);

	if (!p)
		abort();
	return p;
}

#endif

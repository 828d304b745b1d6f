/*
 * bench_util.h - what every benchmark shares: clocks, medians, random data
 * and the memory-bandwidth yardstick the ratios are quoted against.
 *
 * Random data only: these machines merge identical pages, and a constant
 * buffer once "read" at 449 GB/s here. The yardstick reads a random-filled
 * buffer with four interleaved streams per thread (like a GEMV walking four
 * weight rows), which is the best a plain read reaches on this hardware.
 */
#ifndef K3_BENCH_UTIL_H
#define K3_BENCH_UTIL_H

#include <stddef.h>
#include <stdint.h>

/* Monotonic wall clock and this thread's CPU time, in seconds. */
double k3_bench_now(void);
double k3_bench_cpu_now(void);

/* Median of v[0..n) (sorts v in place). */
double k3_bench_median(double *v, int n);

/* Deterministic xorshift64 stream (one per process). */
uint64_t k3_bench_rand(void);
void k3_bench_fill_random(void *p, size_t bytes);

/* One streaming read of buf[0..bytes) split over `threads` threads; returns
 * seconds. bytes should be a multiple of threads * 64 KiB (the rest is not
 * read). Callers interleave it with their own runs on a noisy machine. */
double k3_bench_read_pass(const void *buf, size_t bytes, unsigned threads);

/* Median GB/s (1e9 bytes/s) of `runs` read passes over a fresh random
 * buffer of `bytes` (rounded down to whole 64 KiB blocks per thread). */
double k3_bench_mem_bw(size_t bytes, unsigned threads, int runs);

#endif

/*
 * bench_cuda.c - MXFP4 (and BF16) products on the GPU at K3 shapes, next
 * to the device's own limits measured in the same run: a device-to-device
 * copy and a pinned host-to-device copy. A program, not a test: timings
 * never decide pass/fail. Exits 77 without a device (tests/device/run.sh
 * runs it; docs/kernels.md).
 *
 *   bench_cuda [--runs N] [--set-mib M] [--copy-mib M] [--tokens 1,4,16,64]
 *
 * Yardsticks (median of N runs, random data):
 *   copy GB/s  cudaMemcpy device -> device of --copy-mib MiB, counted as
 *              read + write bytes (2 x size / time, as NVIDIA's
 *              bandwidthTest does): the memory's practical rate;
 *   H2D GB/s   pinned host -> device of the same size (what a VRAM expert
 *              tier fills at).
 * Products: GB/s of weight bytes read per second (MXFP4: 0.5 + 1/32 bytes
 * per weight with scales; BF16: 2), over a set of random matrices of at
 * least --set-mib MiB (default 2048, far above the 50-60 MiB L2), so each
 * product streams from HBM; "ratio" = product GB/s / copy GB/s.
 *   launch 1   one matrix per launch (launch overhead included);
 *   launch 16  16 matrices per k3_cuda_mxfp4_matmul_many launch: the w1
 *              (or w2) products of one decode step's 16 experts.
 * Shapes: expert w1/w3 3072x3584 and w2 3584x3072 (rows x cols as
 * stored); BF16 7168x12288 (an o_proj) for comparison.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "k3_cuda.h"

static struct k3_cuda_dev *dev;
static struct k3_cuda_status st;

#define CHECK(call) do {                                                      \
	if ((call) != 0) {                                                        \
		fprintf(stderr, "bench_cuda: %s: %s\n", #call, st.msg);               \
		exit(1);                                                              \
	}                                                                         \
} while (0)

static void *dalloc(size_t bytes)
{
	void *p;

	CHECK(k3_cuda_alloc(dev, bytes, &p, &st));
	return p;
}

/* random bytes into device memory, through a pinned staging buffer */
static void fill_device(void *d, size_t bytes, void *stage, size_t stage_bytes)
{
	for (size_t off = 0; off < bytes; off += stage_bytes) {
		size_t n = bytes - off < stage_bytes ? bytes - off : stage_bytes;

		k3_bench_fill_random(stage, n);
		CHECK(k3_cuda_upload(dev, (uint8_t *)d + off, stage, n, &st));
		CHECK(k3_cuda_sync(dev, &st));
	}
}

static int parse_list(char *s, long *v, int max)
{
	int n = 0;

	for (char *tok = strtok(s, ","); tok && n < max; tok = strtok(NULL, ",")) {
		char *end;
		long x = strtol(tok, &end, 10);

		if (*end || x < 1 || x > K3_CUDA_T_MAX)
			return -1;
		v[n++] = x;
	}
	return n;
}

int main(int argc, char **argv)
{
	long runs = 9, set_mib = 2048, copy_mib = 1024, tokens[8] = { 1, 4, 16, 64 };
	int n_tok = 4, n = 0;
	struct k3_cuda_info info;
	double tc[64], th[64], copy_gbs, h2d_gbs;
	size_t copy_bytes, stage_bytes = (size_t)64 << 20;
	void *a, *b, *pinned, *stage;
	float *dx, *dy;
	static const uint32_t shapes[2][2] = { { 3072, 3584 }, { 3584, 3072 } };

	for (int i = 1; i < argc; i++) {
		char *end = NULL;

		if (strcmp(argv[i], "--runs") == 0 && i + 1 < argc) {
			runs = strtol(argv[++i], &end, 10);
			if (*end || runs < 1 || runs > 63)
				goto usage;
		} else if (strcmp(argv[i], "--set-mib") == 0 && i + 1 < argc) {
			set_mib = strtol(argv[++i], &end, 10);
			if (*end || set_mib < 16 || set_mib > 65536)
				goto usage;
		} else if (strcmp(argv[i], "--copy-mib") == 0 && i + 1 < argc) {
			copy_mib = strtol(argv[++i], &end, 10);
			if (*end || copy_mib < 16 || copy_mib > 65536)
				goto usage;
		} else if (strcmp(argv[i], "--tokens") == 0 && i + 1 < argc) {
			n_tok = parse_list(argv[++i], tokens, 8);
			if (n_tok < 1)
				goto usage;
		} else {
			goto usage;
		}
	}
	if (k3_cuda_device_count(&n, &st) != 0 || n == 0) {
		printf("bench_cuda: no CUDA device or driver, skipped\n");
		return 77;
	}
	CHECK(k3_cuda_open(0, &dev, &st));
	CHECK(k3_cuda_query(dev, &info, &st));
	printf("device %s, sm_%d%d, %d SMs, %zu MiB; runs %ld (median), weight set >= %ld MiB\n",
		info.name, info.cc_major, info.cc_minor, info.sm_count, info.mem_total >> 20,
		runs, set_mib);

	/* yardsticks */
	copy_bytes = (size_t)copy_mib << 20;
	a = dalloc(copy_bytes);
	b = dalloc(copy_bytes);
	CHECK(k3_cuda_host_alloc(dev, copy_bytes, &pinned, &st));
	stage = pinned;
	k3_bench_fill_random(pinned, copy_bytes);
	fill_device(a, copy_bytes, stage, stage_bytes);
	CHECK(k3_cuda_copy(dev, b, a, copy_bytes, &st));   /* warm-up */
	CHECK(k3_cuda_upload(dev, b, pinned, copy_bytes, &st));
	CHECK(k3_cuda_sync(dev, &st));
	for (int r = 0; r < runs; r++) {
		double t0 = k3_bench_now();

		CHECK(k3_cuda_copy(dev, b, a, copy_bytes, &st));
		CHECK(k3_cuda_sync(dev, &st));
		tc[r] = k3_bench_now() - t0;
		t0 = k3_bench_now();
		CHECK(k3_cuda_upload(dev, b, pinned, copy_bytes, &st));
		CHECK(k3_cuda_sync(dev, &st));
		th[r] = k3_bench_now() - t0;
	}
	copy_gbs = 2.0 * (double)copy_bytes / k3_bench_median(tc, (int)runs) / 1e9;
	h2d_gbs = (double)copy_bytes / k3_bench_median(th, (int)runs) / 1e9;
	printf("copy device->device %ld MiB: %.1f GB/s (read + write); pinned host->device: "
		"%.1f GB/s\n", copy_mib, copy_gbs, h2d_gbs);
	k3_cuda_free(dev, b);

	/* x for up to 64 positions of the widest shape; y for 16 jobs of it */
	dx = dalloc((size_t)K3_CUDA_T_MAX * 12288 * 4);
	dy = dalloc((size_t)16 * K3_CUDA_T_MAX * 12288 * 4);
	{
		float *hx = malloc((size_t)K3_CUDA_T_MAX * 12288 * 4);

		if (!hx)
			return 1;
		for (size_t i = 0; i < (size_t)K3_CUDA_T_MAX * 12288; i++)
			hx[i] = (float)((double)(k3_bench_rand() >> 11) * 0x1.0p-53 - 0.5);
		CHECK(k3_cuda_upload(dev, dx, hx, (size_t)K3_CUDA_T_MAX * 12288 * 4, &st));
		CHECK(k3_cuda_sync(dev, &st));
		free(hx);
	}

	printf("%-6s %-11s %3s %6s %9s %6s\n", "dtype", "rows x cols", "T", "launch",
		"GB/s", "ratio");
	for (int s = 0; s < 2; s++) {
		uint32_t R = shapes[s][0], C = shapes[s][1];
		size_t pb = (size_t)R * C / 2, sb = (size_t)R * C / 32, per = pb + sb;
		size_t copies = (((size_t)set_mib << 20) + per - 1) / per;
		struct k3_cuda_mxfp4 *m = calloc(copies, sizeof(*m));
		uint8_t *mem = dalloc(copies * per), *scales;

		if (!m)
			return 1;
		/* packed arrays first (16-byte aligned rows), then the scales */
		fill_device(mem, copies * pb, stage, stage_bytes);
		scales = mem + copies * pb;
		{
			uint8_t *hs = malloc(copies * sb);

			if (!hs)
				return 1;
			for (size_t i = 0; i < copies * sb; i++)
				hs[i] = (uint8_t)(120 + k3_bench_rand() % 8);
			CHECK(k3_cuda_upload(dev, scales, hs, copies * sb, &st));
			CHECK(k3_cuda_sync(dev, &st));
			free(hs);
		}
		for (size_t k = 0; k < copies; k++)
			m[k] = (struct k3_cuda_mxfp4){ mem + k * pb, scales + k * sb, R, C };
		for (int ti = 0; ti < n_tok; ti++) {
			uint32_t T = (uint32_t)tokens[ti];

			for (int batch = 1; batch <= 16; batch += 15) {
				double t[64], gbs;
				size_t launches = copies / (size_t)batch;

				for (int r = -1; r < runs; r++) {   /* r = -1: warm-up */
					double t0 = k3_bench_now();

					for (size_t L = 0; L < launches; L++) {
						struct k3_cuda_mxfp4_job jobs[16];

						/* each job its own T x R outputs (no overlap) */
						for (int j = 0; j < batch; j++)
							jobs[j] = (struct k3_cuda_mxfp4_job){
								.w = &m[L * (size_t)batch + (size_t)j], .T = T,
								.x = dx, .ldx = C, .y = dy + (size_t)j * T * R,
								.ldy = R };
						CHECK(k3_cuda_mxfp4_matmul_many(dev, (size_t)batch, jobs, &st));
					}
					CHECK(k3_cuda_sync(dev, &st));
					if (r >= 0)
						t[r] = (k3_bench_now() - t0) / (double)(launches * (size_t)batch);
				}
				gbs = (double)per / k3_bench_median(t, (int)runs) / 1e9;
				printf("%-6s %5ux%-5u %3u %6d %9.1f %5.0f%%\n", "mxfp4", R, C, T, batch,
					gbs, 100.0 * gbs / copy_gbs);
				fflush(stdout);
			}
		}
		k3_cuda_free(dev, mem);
		free(m);
	}

	/* BF16 for comparison: one o_proj-sized matrix set, T = 1 */
	{
		const uint32_t R = 7168, C = 12288;
		size_t per = (size_t)R * C * 2, copies = (((size_t)set_mib << 20) + per - 1) / per;
		uint8_t *mem = dalloc(copies * per);
		double t[64], gbs;

		fill_device(mem, copies * per, stage, stage_bytes);
		for (int r = -1; r < runs; r++) {
			double t0 = k3_bench_now();

			for (size_t k = 0; k < copies; k++) {
				struct k3_cuda_bf16 w = { (const uint16_t *)(mem + k * per), R, C, 0 };

				CHECK(k3_cuda_bf16_matmul(dev, &w, 1, dx, C, dy, R, &st));
			}
			CHECK(k3_cuda_sync(dev, &st));
			if (r >= 0)
				t[r] = (k3_bench_now() - t0) / (double)copies;
		}
		gbs = (double)per / k3_bench_median(t, (int)runs) / 1e9;
		printf("%-6s %5ux%-5u %3u %6d %9.1f %5.0f%%\n", "bf16", R, C, 1, 1, gbs,
			100.0 * gbs / copy_gbs);
		k3_cuda_free(dev, mem);
	}
	k3_cuda_free(dev, a);
	k3_cuda_free(dev, dx);
	k3_cuda_free(dev, dy);
	k3_cuda_host_free(dev, pinned);
	dev = k3_cuda_close(dev);
	return 0;
usage:
	fprintf(stderr, "usage: bench_cuda [--runs N] [--set-mib M] [--copy-mib M] "
		"[--tokens 1,4,16,64]\n");
	return 2;
}

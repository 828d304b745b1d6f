/*
 * bench_gemv.c - GEMV throughput (GB/s of weight bytes) for BF16, MXFP4
 * and the int8 spine's I8 (1 byte per weight + one fp32 scale per row) at
 * the real K3 shapes, next to the memory bandwidth measured in the same
 * run, printed as a ratio. A program, not a test: timings never decide
 * pass/fail.
 *
 * Shapes are rows x cols as the matrices are stored (W[rows][cols], y = W x,
 * rows = output features): 7168x12288 (KDA/MLA o_proj: 12288 -> 7168),
 * 12288x7168 (q/k/v/g projections), 3072x3584 (expert w1/w3 in the
 * latent), 3584x3072 (expert w2).
 *
 * Memory bandwidth: a streaming read (XOR of 16-byte words, four
 * block-interleaved streams per thread, split over the same pool) over a random-filled buffer of
 * --bw-mib MiB (default 1024, far above the 32 MiB L3). Weights are random
 * too (identical pages get merged on these machines), and every shape is
 * replicated until the copies total >= --set-mib MiB (default 512) so each
 * GEMV streams from DRAM rather than from the L3.
 *
 *   bench_gemv [--runs N] [--threads 1,2] [--tokens T] [--bw-mib M] [--set-mib M]
 *              [--shape RxC]... [--dtype bf16|mxfp4|i8|both|all] [--isa ref|avx2|avx512|neon]
 *              [--batch N]
 *
 * (--dtype: both = bf16 and mxfp4, all = the three.)
 *
 * --batch N (default 1, at most 16) hands N matrices to one
 * k3_kern_matmul_many call, as the engine does with the gate and up
 * products of a step's experts: one pool dispatch and join per N
 * products instead of one per product (small products at 2 threads on a
 * loaded host otherwise pay mostly for the join).
 *
 * --isa sets the K3_KERNELS ceiling for this run (the ISA is fixed at the
 * first kernel call) and exits 1 if that ISA is not the one chosen (not
 * built, or the CPU lacks it), so AVX2 and AVX-512 can be compared on one
 * machine, each against its own same-run bandwidth.
 *
 * --shape RxC (repeatable, up to 8) replaces the four K3 shapes, e.g. the
 * mid comparison model's 1024x1024 projections or its 512x512 latent
 * experts, to see how small products fare against the same yardstick.
 *
 * --tokens T (default 1) multiplies T positions per call (a prefill chunk):
 * the GB/s column still counts weight bytes streamed per call, so T > 1
 * shows how far the products are from being compute-bound.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/parse.h"
#include "bench_util.h"
#include "k3_kernels.h"

/* Random bf16 weights of modest magnitude: sign, exponent 2^-8..2^-1. */
static void fill_bf16(uint16_t *w, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		uint64_t r = k3_bench_rand();

		w[i] = (uint16_t)(((r & 1) << 15) | ((119 + (r >> 1) % 8) << 7) | ((r >> 8) & 0x7F));
	}
}

/* One pass over the weight set: `batch` matrices per call (each its own
 * y rows), the last call taking what is left. */
static void run_set(struct k3_kern_pool *pool, const struct k3_kern_mat *m,
	size_t copies, size_t batch, size_t rows, size_t ntok, const float *x,
	size_t cols, float *y)
{
	struct k3_kern_matmul_job jobs[16];

	for (size_t k = 0; k < copies; k += batch) {
		size_t n = copies - k < batch ? copies - k : batch;

		if (n == 1) {
			k3_kern_matmul(pool, &m[k], 0, rows, ntok, x, cols, y, rows);
			continue;
		}
		for (size_t j = 0; j < n; j++)
			jobs[j] = (struct k3_kern_matmul_job){ .w = &m[k + j], .row_begin = 0,
				.row_end = rows, .T = ntok, .x = x, .ldx = cols,
				.y = y + j * ntok * rows, .ldy = rows };
		k3_kern_matmul_many(pool, n, jobs);
	}
}

static int parse_uint(const char *s, long lo, long hi, long *out)
{
	uint64_t v;

	if (k3_parse_u64(s, (uint64_t)lo, (uint64_t)hi, &v, NULL) != 0)
		return -1;
	*out = (long)v;
	return 0;
}

/* "RxC": both parts strict decimal (k3_parse_u64: no sign, no blanks, no
 * wrap-around of "-1"), rows 1..65536, cols a multiple of 32 (one MXFP4
 * group) in 32..65536. */
static int parse_shape(const char *s, size_t *rows, size_t *cols)
{
	const char *xp = strchr(s, 'x');
	char rbuf[16];
	long r, c;

	if (!xp || (size_t)(xp - s) >= sizeof(rbuf))
		return -1;
	memcpy(rbuf, s, (size_t)(xp - s));
	rbuf[xp - s] = '\0';
	if (parse_uint(rbuf, 1, 65536, &r) != 0 || parse_uint(xp + 1, 32, 65536, &c) != 0 ||
	    c % 32 != 0)
		return -1;
	*rows = (size_t)r;
	*cols = (size_t)c;
	return 0;
}

int main(int argc, char **argv)
{
	size_t shapes[8][2] = {
		{ 7168, 12288 }, { 12288, 7168 }, { 3072, 3584 }, { 3584, 3072 },
	};
	int n_shapes = 4, user_shapes = 0, dt_first = 0, dt_last = 1;
	size_t max_dim = 12288;
	long runs = 7, bw_mib = 1024, set_mib = 512;
	size_t ntok = 1, batch = 1;
	const char *isa = NULL;
	int threads[8] = { 1, 2 }, n_threads = 2;
	struct k3_kern_pool *pools[8];
	void *bwbuf;
	float *x, *y;
	size_t bw_bytes;

	for (int i = 1; i < argc; i++) {
		long v;

		if (strcmp(argv[i], "--runs") == 0 && i + 1 < argc &&
		    parse_uint(argv[i + 1], 1, 63, &v) == 0) {
			runs = v;
			i++;
		} else if (strcmp(argv[i], "--bw-mib") == 0 && i + 1 < argc &&
		    parse_uint(argv[i + 1], 64, 65536, &v) == 0) {
			bw_mib = v;
			i++;
		} else if (strcmp(argv[i], "--tokens") == 0 && i + 1 < argc &&
		    parse_uint(argv[i + 1], 1, 64, &v) == 0) {
			ntok = (size_t)v;
			i++;
		} else if (strcmp(argv[i], "--set-mib") == 0 && i + 1 < argc &&
		    parse_uint(argv[i + 1], 1, 65536, &v) == 0) {
			set_mib = v;
			i++;
		} else if (strcmp(argv[i], "--shape") == 0 && i + 1 < argc) {
			if (user_shapes == 8) {
				fprintf(stderr, "bench_gemv: too many --shape (at most 8)\n");
				return 2;
			}
			if (parse_shape(argv[++i], &shapes[user_shapes][0],
			    &shapes[user_shapes][1]) != 0) {
				fprintf(stderr, "bench_gemv: bad shape '%s' (want RxC, "
					"rows 1..65536, cols a multiple of 32 up to 65536)\n", argv[i]);
				return 2;
			}
			n_shapes = ++user_shapes;
		} else if (strcmp(argv[i], "--dtype") == 0 && i + 1 < argc) {
			i++;
			if (strcmp(argv[i], "bf16") == 0) {
				dt_first = dt_last = 0;
			} else if (strcmp(argv[i], "mxfp4") == 0) {
				dt_first = dt_last = 1;
			} else if (strcmp(argv[i], "i8") == 0) {
				dt_first = dt_last = 2;
			} else if (strcmp(argv[i], "all") == 0) {
				dt_last = 2;
			} else if (strcmp(argv[i], "both") != 0) {
				fprintf(stderr, "bench_gemv: bad dtype '%s' (bf16, mxfp4, i8, both "
					"or all)\n", argv[i]);
				return 2;
			}
		} else if (strcmp(argv[i], "--batch") == 0 && i + 1 < argc &&
		    parse_uint(argv[i + 1], 1, 16, &v) == 0) {
			batch = (size_t)v;
			i++;
		} else if (strcmp(argv[i], "--isa") == 0 && i + 1 < argc) {
			i++;
			if (strcmp(argv[i], "ref") != 0 && strcmp(argv[i], "avx2") != 0 &&
			    strcmp(argv[i], "avx512") != 0 && strcmp(argv[i], "neon") != 0) {
				fprintf(stderr, "bench_gemv: bad isa '%s' (ref, avx2, avx512 or neon)\n",
					argv[i]);
				return 2;
			}
			isa = argv[i];
		} else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
			char *s = argv[++i], *tok, *save = NULL;

			n_threads = 0;
			for (tok = strtok_r(s, ",", &save); tok && n_threads < 8;
			     tok = strtok_r(NULL, ",", &save)) {
				if (parse_uint(tok, 1, 256, &v) != 0) {
					fprintf(stderr, "bench_gemv: bad thread count '%s'\n", tok);
					return 2;
				}
				threads[n_threads++] = (int)v;
			}
		} else {
			fprintf(stderr, "usage: bench_gemv [--runs N] [--threads 1,2] [--tokens T] "
				"[--bw-mib M] [--set-mib M] [--shape RxC]... [--dtype bf16|mxfp4|i8|both|all] "
				"[--isa NAME] [--batch N]\n");
			return 2;
		}
	}
	if (isa) {
		/* before the first kernel call, which fixes the ISA */
		setenv("K3_KERNELS", isa, 1);
		if (strcmp(k3_kern_isa_name(k3_kern_active_isa()), isa) != 0) {
			fprintf(stderr, "bench_gemv: isa '%s' is not available here (chose '%s')\n",
				isa, k3_kern_isa_name(k3_kern_active_isa()));
			return 1;
		}
	}
	printf("isa %s, runs %ld (median), bandwidth buffer %ld MiB, weight set >= %ld MiB, "
		"%zu token(s) per product, %zu product(s) per call\n",
		k3_kern_isa_name(k3_kern_active_isa()), runs, bw_mib, set_mib, ntok, batch);
	for (int i = 0; i < n_threads; i++) {
		pools[i] = k3_kern_pool_new(threads[i], NULL);
		if (!pools[i]) {
			fprintf(stderr, "bench_gemv: cannot start %d threads\n", threads[i]);
			return 1;
		}
	}
	for (int s = 0; s < n_shapes; s++)
		for (int d = 0; d < 2; d++)
			if (shapes[s][d] > max_dim)
				max_dim = shapes[s][d];
	bw_bytes = (size_t)bw_mib << 20;
	bwbuf = aligned_alloc(64, bw_bytes);
	x = malloc(ntok * max_dim * sizeof(float));
	y = malloc(batch * ntok * max_dim * sizeof(float));
	if (!bwbuf || !x || !y)
		return 1;
	k3_bench_fill_random(bwbuf, bw_bytes);
	/* random bits as floats may be NaN/Inf: harmless for a read benchmark,
	 * but keep x finite for the GEMV */
	for (size_t i = 0; i < ntok * max_dim; i++)
		x[i] = (float)((double)(k3_bench_rand() >> 11) * 0x1.0p-53 - 0.5);

	printf("%-6s %-12s %3s %9s %9s %6s\n", "dtype", "rows x cols", "thr",
		"GEMV GB/s", "mem GB/s", "ratio");
	for (int dt = dt_first; dt <= dt_last; dt++) {
		enum k3_kern_dtype dtype = dt == 0 ? K3_KERN_DT_BF16 : dt == 1 ? K3_KERN_DT_MXFP4
			: K3_KERN_DT_I8;
		static const char *const dt_name[3] = { "bf16", "mxfp4", "i8" };

		for (int s = 0; s < n_shapes; s++) {
			size_t rows = shapes[s][0], cols = shapes[s][1];
			size_t wbytes = dtype == K3_KERN_DT_BF16 ? rows * cols * 2 :
				dtype == K3_KERN_DT_I8 ? rows * cols : rows * cols / 2;
			size_t sbytes = dtype == K3_KERN_DT_BF16 ? 0 : dtype == K3_KERN_DT_I8 ?
				rows * 4 : rows * cols / 32;
			size_t per = wbytes + sbytes;
			size_t copies = (((size_t)set_mib << 20) + per - 1) / per;
			struct k3_kern_mat *m = calloc(copies, sizeof(*m));
			uint8_t *store = malloc(copies * per);

			if (!m || !store) {
				fprintf(stderr, "bench_gemv: no memory for %zu x %zu bytes of %zux%zu "
					"weights\n", copies, per, rows, cols);
				return 1;
			}
			for (size_t k = 0; k < copies; k++) {
				uint8_t *base = store + k * per;

				m[k] = (struct k3_kern_mat){ .dtype = dtype, .rows = rows,
					.cols = cols, .data = base };
				if (dtype == K3_KERN_DT_BF16) {
					fill_bf16((uint16_t *)base, rows * cols);
				} else if (dtype == K3_KERN_DT_I8) {
					/* random q; scales like a BF16 matrix's (cols % 32 == 0,
					 * so they start 4-byte aligned) */
					k3_bench_fill_random(base, wbytes);
					m[k].row_scales = (const float *)(base + wbytes);
					for (size_t i = 0; i < rows; i++)
						((float *)(base + wbytes))[i] = 0.001f +
							(float)(k3_bench_rand() % 1024) * 1e-6f;
				} else {
					k3_bench_fill_random(base, wbytes);
					m[k].scales = base + wbytes;
					for (size_t i = 0; i < sbytes; i++)
						base[wbytes + i] = (uint8_t)(120 + k3_bench_rand() % 8);
				}
			}
			for (int ti = 0; ti < n_threads; ti++) {
				double t[64], tb[64], gbs, bw;
				int nt = k3_kern_pool_threads(pools[ti]);

				/* warm-up pass (page faults, pool wake-up) */
				run_set(pools[ti], m, copies, batch, rows, ntok, x, cols, y);
				/* GEMV and bandwidth runs alternate, so both see the same
				 * load from the other tenants of this machine */
				for (int r = 0; r < runs; r++) {
					double t0 = k3_bench_now();

					run_set(pools[ti], m, copies, batch, rows, ntok, x, cols, y);
					t[r] = (k3_bench_now() - t0) / (double)copies;
					tb[r] = k3_bench_read_pass(bwbuf, bw_bytes, (unsigned)nt);
				}
				gbs = (double)per / k3_bench_median(t, (int)runs) / 1e9;
				bw = (double)bw_bytes / k3_bench_median(tb, (int)runs) / 1e9;
				printf("%-6s %5zux%-6zu %3d %9.2f %9.2f %5.0f%%\n",
					dt_name[dt], rows, cols,
					threads[ti], gbs, bw, 100.0 * gbs / bw);
				fflush(stdout);
			}
			free(m);
			free(store);
		}
	}
	for (int i = 0; i < n_threads; i++)
		k3_kern_pool_free(pools[i]);
	free(bwbuf);
	free(x);
	free(y);
	return 0;
}

/*
 * x86_rows.h - internal: the parts of the AVX2 and AVX-512 row drivers that
 * do not depend on the lane width: the walk over row tiles and token
 * groups, the walk over a tile's rows that picks each block's row kernel,
 * and dot/sumsq as a 1 x 1 block of rows_f32. Each ISA file only chooses
 * the blocking (struct x86_walk).
 *
 * Included by x86_avx2.c and x86_avx512.c after their row kernels, which
 * it calls by name (each file's own, compiled with its -m flags):
 *   rows_f32, rows_bf16 (nr, nt, cols, wr, xt, out, ldo, prefetch step)
 *   rows_mxfp4 (nr, nt, cols, pr, sr, xt, out, ldo, permuted x)
 *   rows_mxfp4_pair (nr, nt, cols, pr, sr, xt, out, ldo), only where the
 *   includer defines X86_ROWS_HAVE_PAIR (AVX2)
 *   x86_perm (pair, cols, x, xp): x permuted for the MXFP4 kernels.
 * Which kernel a block goes to depends on the matrix alone, never on the
 * rows or tokens in the block, so batch invariance holds as in each file.
 */
#ifndef K3_X86_ROWS_H
#define K3_X86_ROWS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kern_ops.h"

/* Rows are walked in tiles of ROW_TILE; inside a tile, tokens in groups of
 * up to 4, so a group's permuted x is made once per tile and reused by the
 * tile's rows. Loop order never changes an element's arithmetic. */
enum { ROW_TILE = 256 };
/* Dense rows of at most this many bytes are taken one row per call at
 * T = 1 (one linear stream, the next row prefetched) instead of four
 * interleaved: measured on Zen 3 with bench_gemv --shape, 1 and 2 threads,
 * BF16 1024x1024 / 8192x1024 / 1024x512 went from 60-66 % to 78-91 % of
 * the memory bandwidth, while rows of 4 KiB and more (every K3 matrix)
 * stay faster four at a time (84-113 % vs 67-80 %). AVX-512 carries the
 * AVX2 measurement over. */
enum { DENSE_SHORT_ROW = 2048 };

/*
 * Rows [r, r_end) of W for the nt (1..4) token rows xt: y_t (y row of the
 * group's first token, ldy apart) gets row r at column r - r0. At nt = 1,
 * nr1 rows go to one kernel call while they fit; otherwise one row per
 * call. perm: MXFP4 with xt permuted for rows_mxfp4; pair: the pair-of-
 * groups layout (false unless X86_ROWS_HAVE_PAIR).
 */
static inline __attribute__((always_inline)) void x86_rows_walk(
	const struct k3_kern_mat *w, size_t r0, size_t r, size_t r_end,
	size_t nr1, size_t nt, const float *const *xt, float *y_t, size_t ldy,
	bool perm, bool pair)
{
	const size_t cols = w->cols, ld = w->ld ? w->ld : w->cols;
	const enum k3_kern_dtype dt = w->dtype;

	while (r < r_end) {
		/* one token: nr1 rows at once; more: 1 row x nt tokens */
		size_t nr = (nt == 1 && r + nr1 <= r_end) ? nr1 : 1;
		float *out = y_t + (r - r0);

		if (dt == K3_KERN_DT_MXFP4) {
			const uint8_t *pr[4] = { 0 }, *sr[4] = { 0 };

			for (size_t i = 0; i < nr; i++) {
				pr[i] = (const uint8_t *)w->data + (r + i) * (cols / 2);
				sr[i] = w->scales + (r + i) * (cols / 32);
			}
			if (pair) {
#if defined(X86_ROWS_HAVE_PAIR)
				K3_KERN_BLOCK(rows_mxfp4_pair, nr, nt, cols, pr, sr, xt, out, ldy);
#endif
			} else if (perm) {
				K3_KERN_BLOCK(rows_mxfp4, nr, nt, cols, pr, sr, xt, out, ldy, true);
			} else {
				K3_KERN_BLOCK(rows_mxfp4, nr, nt, cols, pr, sr, xt, out, ldy, false);
			}
		} else if (dt == K3_KERN_DT_BF16) {
			const uint16_t *wr[4] = { 0 };

			for (size_t i = 0; i < nr; i++)
				wr[i] = (const uint16_t *)w->data + (r + i) * ld;
			K3_KERN_BLOCK(rows_bf16, nr, nt, cols, wr, xt, out, ldy, nr * ld);
		} else {
			const float *wr[4] = { 0 };

			for (size_t i = 0; i < nr; i++)
				wr[i] = (const float *)w->data + (r + i) * ld;
			K3_KERN_BLOCK(rows_f32, nr, nt, cols, wr, xt, out, ldy, nr * ld);
		}
		r += nr;
	}
}

/* How an ISA's driver walks its product (x86_matmul_walk). */
struct x86_walk {
	size_t nr1;      /* rows per kernel call at T = 1 */
	size_t max_nt;   /* tokens per group, 1..4 */
	/* false: the kernels read x rows as they are; true: each token of a
	 * group is permuted (x86_perm) into slot k of xperm, perm_stride
	 * floats apart, once per group and reused by every tile */
	bool perm;
	float *xperm;
	size_t perm_stride;
	bool pair;       /* AVX2's pair-of-groups MXFP4 kernels */
};

/*
 * matmul_rows (kern_ops.h) over row tiles of ROW_TILE and token groups of
 * up to wk->max_nt: a group's x is permuted once (perm_tok remembers which
 * token a slot holds) and every tile's rows are walked with it. With
 * X86_ROWS_HAVE_PAIR, a single token on the pair path goes to the
 * includer's mx64_rows_t1 (when MX64_ROWS is 1) instead of the block walk.
 */
static inline __attribute__((always_inline)) void x86_matmul_walk(
	const struct k3_kern_mat *w, size_t r0, size_t r1, size_t T,
	const float *x, size_t ldx, float *y, size_t ldy,
	const struct x86_walk *wk)
{
	size_t perm_tok[4] = { SIZE_MAX, SIZE_MAX, SIZE_MAX, SIZE_MAX };

	for (size_t tile = r0; tile < r1; tile += ROW_TILE) {
		size_t tile_end = r1 - tile > ROW_TILE ? tile + ROW_TILE : r1;

		for (size_t t = 0; t < T; ) {
			size_t nt = T - t >= wk->max_nt ? wk->max_nt : T - t;
			const float *xt[4] = { 0 };

			for (size_t k = 0; k < nt; k++) {
				xt[k] = x + (t + k) * ldx;
				if (wk->perm) {
					if (perm_tok[k] != t + k) {
						x86_perm(wk->pair, w->cols, xt[k],
							wk->xperm + k * wk->perm_stride);
						perm_tok[k] = t + k;
					}
					xt[k] = wk->xperm + k * wk->perm_stride;
				}
			}
#if defined(X86_ROWS_HAVE_PAIR)
			if (wk->pair && nt == 1 && MX64_ROWS == 1) {
				mx64_rows_t1(w->cols, w->data, w->scales, tile, tile_end, xt[0],
					y + t * ldy + (tile - r0));
				t += nt;
				continue;
			}
#endif
			x86_rows_walk(w, r0, tile, tile_end, wk->nr1, nt, xt, y + t * ldy,
				ldy, wk->perm, wk->pair);
			t += nt;
		}
	}
}

/* dot and sumsq: the F32 row kernel as a 1 x 1 block, so they reduce in
 * the matmul's order. */
static float x86_dot(size_t n, const float *a, const float *b)
{
	const float *wr[1] = { a }, *xt[1] = { b };
	float out;

	rows_f32(1, 1, n, wr, xt, &out, 1, 0);
	return out;
}

static float x86_sumsq(size_t n, const float *x)
{
	return x86_dot(n, x, x);
}

#endif

/*
 * kern_i8_rows.h - the row walk of the int8 x fp32 product, shared by the
 * ISA files (x86_avx2_i8.c, x86_avx512_i8.c, arm_neon_i8.c). Not a
 * header of its own: each of those files defines its inline row kernel
 *
 *   rows_i8(nr, nt, cols, wr, sc, xt, out, ldo, pf)
 *
 * (nr rows x nt tokens, wr[i] = q rows, sc = their scales, xt[t] = x
 * rows, out[t * ldo + i], pf = software prefetch distance in bytes, 0 =
 * none) and K3_I8_ROWS_NAME, then includes this file, which defines the
 * table's matmul_rows under that name. The walk never changes an
 * element's arithmetic, only which block computes it: rows in tiles of
 * I8_ROW_TILE, inside a tile tokens in groups of up to 4 (so a group's x
 * rows are reused from cache by every row of the tile); at T = 1 four rows
 * per call (independent chains, four streams), one for rows of at most
 * I8_SHORT_ROW bytes (one linear stream, measured better for short BF16
 * rows, docs/kernels.md "Short rows"); for T > 1 one row x up to 4 tokens.
 */
#ifndef K3_I8_ROWS_NAME
#error "define K3_I8_ROWS_NAME (and rows_i8) before including kern_i8_rows.h"
#endif

enum { I8_ROW_TILE = 256, I8_SHORT_ROW = 2048 };

static void K3_I8_ROWS_NAME(const struct k3_kern_mat *w, size_t r0, size_t r1,
	size_t T, const float *x, size_t ldx, float *y, size_t ldy)
{
	size_t cols = w->cols, ld = w->ld ? w->ld : w->cols;
	size_t nr1 = ld <= I8_SHORT_ROW ? 1 : 4;

	for (size_t tile = r0; tile < r1; tile += I8_ROW_TILE) {
		size_t tile_end = r1 - tile > I8_ROW_TILE ? tile + I8_ROW_TILE : r1;

		for (size_t t = 0; t < T; ) {
			size_t nt = T - t >= 4 ? 4 : T - t;
			const float *xt[4] = { 0 };

			for (size_t k = 0; k < nt; k++)
				xt[k] = x + (t + k) * ldx;
			for (size_t r = tile; r < tile_end; ) {
				size_t nr = (nt == 1 && r + nr1 <= tile_end) ? nr1 : 1;
				const int8_t *wr[4] = { 0 };
				const float *sc = w->row_scales + r;
				float *out = y + t * ldy + (r - r0);
				size_t pf = nr * ld;   /* the next row block, same column */

				for (size_t i = 0; i < nr; i++)
					wr[i] = (const int8_t *)w->data + (r + i) * ld;
				/* block shapes are compile-time constants of rows_i8 */
				switch (nr * 8 + nt) {
				case 4 * 8 + 1: rows_i8(4, 1, cols, wr, sc, xt, out, ldy, pf); break;
				case 1 * 8 + 4: rows_i8(1, 4, cols, wr, sc, xt, out, ldy, pf); break;
				case 1 * 8 + 3: rows_i8(1, 3, cols, wr, sc, xt, out, ldy, pf); break;
				case 1 * 8 + 2: rows_i8(1, 2, cols, wr, sc, xt, out, ldy, pf); break;
				default: rows_i8(1, 1, cols, wr, sc, xt, out, ldy, pf); break;
				}
				r += nr;
			}
			t += nt;
		}
	}
}

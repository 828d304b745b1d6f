/*
 * x86_avx2_i8.c - the int8 x fp32 product on AVX2 + FMA (built with the
 * k3kern_avx2 library's -mavx2 -mfma; chosen with the AVX2 ISA).
 *
 * Fixed reduction order of y[r][t] = scale[r] * (q[r] . x[t]):
 *   two 8-lane accumulators over 16-column steps: acc0 += cols 16i..16i+7,
 *   acc1 += cols 16i+8..16i+15, each q converted exactly to fp32
 *   (vpmovsxbd + vcvtdq2ps) and FMA'd with x; a remaining 8-block goes to
 *   acc0, a final partial block (zero-padded) to acc1; then (acc0 + acc1)
 *   is folded 8 -> 4 -> 2 -> 1 and multiplied by the row's scale.
 * The main loop is unrolled to 32 columns (one software prefetch per 32
 * bytes of a row); the unrolled steps keep the 16-column order exactly.
 * One inline row kernel (rows_i8 of x86_vec.h) serves every rows x tokens
 * block (4 rows x 1 token at T = 1, 1 row x up to 4 tokens for T > 1; the
 * row walk of kern_i8_rows.h), so an element's bits do not depend on T,
 * the row range or the thread split.
 */
#include "kern_i8.h"
#define X86_VEC_BITS 256
#include "x86_vec.h"   /* rows_i8 */

#define K3_I8_ROWS_NAME avx2_i8_rows
#include "kern_i8_rows.h"

const struct k3_kern_i8_ops k3_kern_i8_avx2 = {
	.isa = K3_KERN_ISA_AVX2,
	.matmul_rows = avx2_i8_rows,
};

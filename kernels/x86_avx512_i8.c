/*
 * x86_avx512_i8.c - the int8 x fp32 product on AVX-512 F/BW/VL (built with
 * the k3kern_avx512 library's flags; chosen with the AVX-512 ISA).
 *
 * Fixed reduction order of y[r][t] = scale[r] * (q[r] . x[t]):
 *   two 16-lane accumulators over 32-column steps: acc0 += cols
 *   32i..32i+15, acc1 += cols 32i+16..32i+31, each q converted exactly to
 *   fp32 (vpmovsxbd + vcvtdq2ps) and FMA'd with x; a remaining 16-block
 *   goes to acc0, a final partial block (masked loads, zeros) to acc1;
 *   then s = acc0 + acc1 is folded 16 -> 8 (low half + high half), 8 -> 4
 *   -> 2 -> 1 as on AVX2, and multiplied by the row's scale.
 * The main loop is unrolled to 64 columns (one software prefetch per 64
 * bytes of a row, a cache line) and keeps the 32-column order exactly. One
 * inline row kernel (rows_i8 of x86_vec.h) serves every rows x tokens
 * block (4 rows x 1 token at T = 1, 1 row x up to 4 tokens for T > 1; the
 * row walk of kern_i8_rows.h): an element's bits do not depend on T, the
 * row range or the thread split.
 */
#include "kern_i8.h"
#define X86_VEC_BITS 512
#include "x86_vec.h"   /* rows_i8 */

#define K3_I8_ROWS_NAME avx512_i8_rows
#include "kern_i8_rows.h"

const struct k3_kern_i8_ops k3_kern_i8_avx512 = {
	.isa = K3_KERN_ISA_AVX512,
	.matmul_rows = avx512_i8_rows,
};

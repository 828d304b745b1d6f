/*
 * kern_i8.h - internal: the per-ISA int8 x fp32 product (K3_KERN_DT_I8,
 * the int8 spine) behind k3_kern_matmul and k3_kern_matmul_many.
 *
 * Kept apart from struct k3_kern_ops so the int8 kernels live in their own
 * files (ref_i8.c, x86_avx2_i8.c, x86_avx512_i8.c, arm_neon_i8.c) and the
 * per-ISA BF16/MXFP4 files stay untouched. Each file defines one
 * `const struct k3_kern_i8_ops k3_kern_i8_<isa>` and depends only on
 * libc/libm, like the other ISA files. The dispatch picks the table of the
 * process's ISA (k3_kern_active_isa), so one process never mixes orders.
 *
 * matmul_rows has the contract of k3_kern_ops.matmul_rows for an I8
 * matrix: y[t * ldy + (r - r0)] = row_scales[r] * sum_c q[r][c] x[t*ldx + c]
 * for r in [r0, r1), t < T, each element a function of row r, x row t and
 * cols only (never of r0, r1, T: batch invariance). The reduction order of
 * each ISA is documented at the top of its file and in docs/kernels.md.
 */
#ifndef K3_KERN_I8_H
#define K3_KERN_I8_H

#include "k3_kernels.h"

/* The row function of a table (the signature of k3_kern_ops.matmul_rows). */
typedef void (*k3_kern_rows_fn)(const struct k3_kern_mat *w, size_t r0, size_t r1,
	size_t T, const float *x, size_t ldx, float *y, size_t ldy);

struct k3_kern_i8_ops {
	enum k3_kern_isa isa;
	k3_kern_rows_fn matmul_rows;
};

extern const struct k3_kern_i8_ops k3_kern_i8_ref;
#if defined(K3_KERN_HAVE_AVX2)
extern const struct k3_kern_i8_ops k3_kern_i8_avx2;
#endif
#if defined(K3_KERN_HAVE_AVX512)
extern const struct k3_kern_i8_ops k3_kern_i8_avx512;
#endif
#if defined(K3_KERN_HAVE_NEON)
extern const struct k3_kern_i8_ops k3_kern_i8_neon;
#endif

/* The int8 table of an ISA (NULL when not built in or not runnable here),
 * and the one of the ISA chosen for this process. */
const struct k3_kern_i8_ops *k3_kern_i8_for(enum k3_kern_isa isa);
const struct k3_kern_i8_ops *k3_kern_i8_active(void);

#endif

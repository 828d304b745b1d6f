/*
 * kern_ops.h - internal: the per-ISA function table behind k3_kernels.h.
 *
 * Each ISA file (ref_*.c, x86_avx2.c, x86_avx512.c, arm_neon.c) defines one
 * `const struct k3_kern_ops k3_kern_ops_<isa>` and nothing else public
 * (x86_avx2_elem.c: `k3_kern_elem_avx2`, kern_elem.c: `k3_kern_elem_ref`), and
 * depends only on libc/libm, so the per-ISA static libraries can be linked
 * in any order after the common one. Tests use k3_kern_ops_for() to run
 * two ISAs side by side in one process; production code goes through the
 * public k3_kern_* functions, which use the one table chosen at start.
 */
#ifndef K3_KERN_OPS_H
#define K3_KERN_OPS_H

#include "k3_kernels.h"

/*
 * matmul_rows: y[t * ldy + (r - r0)] = sum_c W[r][c] x[t * ldx + c] for
 * r in [r0, r1), t < T. Contract: the value of each y element depends only
 * on W row r, x row t and cols: never on r0, r1, T (batch invariance).
 *
 * matmul_t_cols: y[t * ldy + c] = sum_{r < rows} W[r][c] x[t * ldx + r]
 * for c in [c0, c1): r ascending, each element independent of c0, c1, T.
 *
 * The slots are listed once here: X(P, slot, return type, parameters). The struct is made from this list and every ISA table
 * from K3_KERN_OPS_INIT, so a slot added here is a compile error in any
 * ISA file that lacks its P_slot function, never a NULL entry.
 */
#define K3_KERN_OPS_SLOTS(X, P)                                               \
	X(P, matmul_rows, void, (const struct k3_kern_mat *w, size_t r0,          \
		size_t r1, size_t T, const float *x, size_t ldx, float *y,            \
		size_t ldy))                                                          \
	X(P, matmul_t_cols, void, (const struct k3_kern_mat *w, size_t c0,        \
		size_t c1, size_t T, const float *x, size_t ldx, float *y,            \
		size_t ldy))                                                          \
	X(P, dot, float, (size_t n, const float *a, const float *b))              \
	X(P, sumsq, float, (size_t n, const float *x))                            \
	X(P, axpy, void, (size_t n, float a, const float *x, float *y))           \
	X(P, kda_step, void, (size_t dk, size_t dv, float *S, const float *q,     \
		const float *k, const float *v, const float *alpha, float beta,       \
		float *o, float *scratch))

/* A struct field, and a designated initializer naming function P_slot
 * (used by both slot lists). */
#define K3_KERN_SLOT_FIELD_(P, slot, ret, params) ret (*slot) params;
#define K3_KERN_SLOT_INIT_(P, slot, ret, params) .slot = P##_##slot,

struct k3_kern_ops {
	enum k3_kern_isa isa;
	K3_KERN_OPS_SLOTS(K3_KERN_SLOT_FIELD_, _)
};

/* The table of an ISA whose functions are named P_matmul_rows, P_dot, ... */
#define K3_KERN_OPS_INIT(ISA, P)                                              \
	K3_KERN_OPS_SLOTS(K3_KERN_SLOT_INIT_, P) .isa = (ISA)

/*
 * The block shapes of the ISA row kernels: FN(NR, NT, ...) with NR rows x
 * NT tokens as compile-time constants (so each kernel's rows x tokens loops
 * unroll into registers) and the remaining arguments passed through. The
 * drivers ask for 4x1, 2x1, 1x4, 1x3, 1x2 or 1x1; every shape calls the same
 * row kernel, so the block an element falls in never changes its bits.
 */
#define K3_KERN_BLOCK(FN, NR, NT, ...) do {                                   \
	switch ((NR) * 8 + (NT)) {                                                \
	case 4 * 8 + 1: FN(4, 1, __VA_ARGS__); break;                             \
	case 2 * 8 + 1: FN(2, 1, __VA_ARGS__); break;                             \
	case 1 * 8 + 4: FN(1, 4, __VA_ARGS__); break;                             \
	case 1 * 8 + 3: FN(1, 3, __VA_ARGS__); break;                             \
	case 1 * 8 + 2: FN(1, 2, __VA_ARGS__); break;                             \
	default: FN(1, 1, __VA_ARGS__); break;                                    \
	}                                                                         \
} while (0)

extern const struct k3_kern_ops k3_kern_ops_ref;
#if defined(K3_KERN_HAVE_AVX2)
extern const struct k3_kern_ops k3_kern_ops_avx2;
#endif
#if defined(K3_KERN_HAVE_AVX512)
extern const struct k3_kern_ops k3_kern_ops_avx512;
#endif
#if defined(K3_KERN_HAVE_NEON)
extern const struct k3_kern_ops k3_kern_ops_neon;
#endif

/*
 * Elementwise transcendentals, per ISA (separate from k3_kern_ops so the
 * matmul files stay untouched by them). Every entry: n elements, any n,
 * in place allowed, each output element a function of its own inputs only
 * (never of n, the index or the thread), so results are batch invariant.
 *   exp_shift  y = exp(x - shift)
 *   sigmoid    y = 1 / (1 + exp(-x))
 *   silu       y = x * sigmoid(x)
 *   tanh       y = tanh(x)
 *   situ_glu   k3_kern_situ_glu (§7.1)
 *   kda_decay  k3_kern_kda_decay (§5.3.4)
 *   matmul_t_cols  NULL, or a transposed product with the contract of
 *              k3_kern_ops.matmul_t_cols that k3_kern_matmul_t prefers
 *              (AVX2: streams W in storage order; bit-identical results)
 * ref: libm expf/tanhf (the oracle). avx2: polynomial kernels of
 * x86_avx2_elem.c, within the ulp bounds of docs/kernels.md. AVX-512 uses
 * the AVX2 table; NEON the ref table.
 */
#define K3_KERN_ELEM_SLOTS(X, P)                                              \
	X(P, exp_shift, void, (size_t n, const float *x, float shift, float *y))  \
	X(P, sigmoid, void, (size_t n, const float *x, float *y))                 \
	X(P, silu, void, (size_t n, const float *x, float *y))                    \
	X(P, tanh, void, (size_t n, const float *x, float *y))                    \
	X(P, situ_glu, void, (size_t n, const float *g, const float *u,           \
		float beta1, float beta2, float *act))                                \
	X(P, kda_decay, void, (size_t n, const float *f, const float *dt_bias,    \
		float A, float lower_bound, float *alpha))

struct k3_kern_elem_ops {
	enum k3_kern_isa isa;
	K3_KERN_ELEM_SLOTS(K3_KERN_SLOT_FIELD_, _)
	void (*matmul_t_cols)(const struct k3_kern_mat *w, size_t c0, size_t c1,
		size_t T, const float *x, size_t ldx, float *y, size_t ldy);
};

/* The six elementwise slots of an ISA's table (functions P_exp_shift, ...);
 * matmul_t_cols, optional, is written beside it where an ISA has one. */
#define K3_KERN_ELEM_INIT(ISA, P)                                             \
	K3_KERN_ELEM_SLOTS(K3_KERN_SLOT_INIT_, P) .isa = (ISA)

extern const struct k3_kern_elem_ops k3_kern_elem_ref;
#if defined(K3_KERN_HAVE_AVX2)
extern const struct k3_kern_elem_ops k3_kern_elem_avx2;
#endif

/* The elementwise table for an ISA (NULL when the ISA is not runnable),
 * and the one of the ISA chosen for this process. */
const struct k3_kern_elem_ops *k3_kern_elem_for(enum k3_kern_isa isa);
const struct k3_kern_elem_ops *k3_kern_elem_active(void);

/* The table for an ISA, or NULL when not built in or not runnable here. */
const struct k3_kern_ops *k3_kern_ops_for(enum k3_kern_isa isa);

/* The table chosen for this process (see k3_kernels.h). */
const struct k3_kern_ops *k3_kern_ops_active(void);

#endif

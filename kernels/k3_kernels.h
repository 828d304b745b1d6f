/*
 * k3_kernels.h - compute kernels for the K3 text forward pass (docs/model.md).
 *
 * Everything here is fp32 arithmetic over caller-owned buffers: no
 * allocation, no logging, no global state except the ISA choice, which is
 * made once per process (first call) from cpuid and the environment:
 *
 *   K3_KERNELS=ref      scalar reference path (the oracle)
 *   K3_KERNELS=avx2     AVX2+FMA (fails over to ref if the CPU lacks it)
 *   K3_KERNELS=avx512   AVX-512 F/BW/VL/DQ (fails over to the best lower ISA)
 *   K3_KERNELS=neon     aarch64 NEON
 *   unset / "auto"      the best the CPU supports
 *   anything else       ref (a typo must not silently pick a fast path;
 *                       callers should log k3_kern_active_isa())
 *
 * BATCH INVARIANCE (issue 8 item 5). Every output element is computed by
 * one thread with a reduction order that depends only on the ISA chosen and
 * on the length of that reduction, never on T (positions per call), the row
 * range, the thread count or the pool split. So y[t][r] of a matmul is
 * bit-identical whether position t is alone (T = 1), inside a prefill chunk
 * or inside a verification batch. The scalar and SIMD paths round
 * differently (different but fixed summation trees); they agree within the
 * tolerances named in tests/kernels. Do not mix paths in one process.
 *
 * Shapes are in elements unless a name says bytes. Matrices are row-major
 * as stored in safetensors: W[rows][cols], y = W x, rows = output features,
 * cols = input features (docs/model.md §3.2). The "[rb]" bf16 roundings of
 * the reference (§11) are not applied here; the caller decides (see
 * k3_kern_round_bf16).
 */
#ifndef K3_KERNELS_H
#define K3_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kern_pool.h"

/* ------------------------------------------------------------------ */
/* ISA dispatch                                                        */

enum k3_kern_isa {
	K3_KERN_ISA_REF = 0,     /* portable scalar C */
	K3_KERN_ISA_AVX2 = 1,    /* x86-64 AVX2 + FMA */
	K3_KERN_ISA_AVX512 = 2,  /* x86-64 AVX-512 F + BW + VL + DQ */
	K3_KERN_ISA_NEON = 3,    /* aarch64 Advanced SIMD */
	K3_KERN_ISA_COUNT
};

/* The ISA every k3_kern_* call in this process uses (fixed at first use). */
enum k3_kern_isa k3_kern_active_isa(void);

/* "ref", "avx2", "avx512", "neon"; "?" for out-of-range values. */
const char *k3_kern_isa_name(enum k3_kern_isa isa);

/* True when this build contains the ISA and the CPU can run it. */
bool k3_kern_isa_available(enum k3_kern_isa isa);

/* ------------------------------------------------------------------ */
/* bf16                                                                */

/* bf16 -> fp32 (exact: the bf16 bits are the top half of the fp32). */
void k3_kern_bf16_to_f32(size_t n, const uint16_t *src, float *dst);

/* fp32 -> bf16, round to nearest even; NaN stays NaN (quiet). */
void k3_kern_f32_to_bf16(size_t n, const float *src, uint16_t *dst);

/* x[i] := float(bf16(x[i])): the reference's "[rb]" (§11), in place. */
void k3_kern_round_bf16(size_t n, float *x);

/* One value of the above. */
float k3_kern_bf16_round1(float x);

/* ------------------------------------------------------------------ */
/* Matrix products                                                     */

enum k3_kern_dtype {
	K3_KERN_DT_F32 = 0,    /* float  w[rows][ld]                         */
	K3_KERN_DT_BF16 = 1,   /* uint16 w[rows][ld] (bf16 bits)            */
	K3_KERN_DT_MXFP4 = 2,  /* uint8 packed[rows][cols/2] + uint8 scales[rows][cols/32] (§9) */
	K3_KERN_DT_I8 = 3,     /* int8 q[rows][ld] + float row_scales[rows] (int8 spine) */
};

/*
 * A read-only view of a weight matrix W[rows][cols] (storage owned by the
 * caller, typically the mmap'd checkpoint).
 *   F32/BF16: `data` points at element [0][0]; row r starts at r * ld
 *             elements (ld = 0 means ld = cols). `scales` unused.
 *   MXFP4:    `data` = weight_packed (rows x cols/2 bytes; low nibble =
 *             even column, high nibble = odd column), `scales` =
 *             weight_scale (rows x cols/32 bytes, E8M0: 2^(s-127)); ld must
 *             be 0 (rows are dense); cols % 32 == 0. Code values are the
 *             E2M1 table {0,.5,1,1.5,2,3,4,6}, bit 3 = sign (§9). Decoded in
 *             registers; no fp32 copy of W is ever made.
 *   I8:       `data` = int8 q[rows][ld] (ld = 0 means cols), `row_scales` =
 *             rows fp32 values (4-byte aligned): W[r][c] = q[r][c] *
 *             row_scales[r], the row-wise int8 spine (docs/formats.md,
 *             "int8 spine overlay"; not the checkpoint's weights).
 *             y[r] = row_scales[r] * (sum_c q[r][c] x[c]): the scale
 *             multiplies the finished sum (docs/kernels.md, "int8").
 *             `scales` unused. Not accepted by k3_kern_matmul_t.
 */
/* E2M1 code (0..15) -> value (§9), the one definition of the MXFP4 value
 * table: every ISA's decoder here, the cpu provider's reference and the
 * checkpoint reader's oracle (daemon/model/mxfp4.c) instantiate it with
 * `static const float t[16] = K3_KERN_E2M1_VALUES;`. Codes 8..15 are the
 * negatives of 0..7 (bit 3 = sign; code 8 is -0.0). */
#define K3_KERN_E2M1_VALUES \
	{ 0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, \
	  -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f }

struct k3_kern_mat {
	enum k3_kern_dtype dtype;
	size_t rows, cols;
	size_t ld;
	const void *data;
	const uint8_t *scales;
	const float *row_scales;     /* I8 only */
};

/*
 * Y = W X over rows [row_begin, row_end) for T positions:
 *
 *   y[t * ldy + (r - row_begin)] = sum_c W[r][c] * x[t * ldx + c]
 *
 * for t < T, row_begin <= r < row_end, c < cols (§3.2, fp32 accumulation).
 * T = 1 is a GEMV; T > 1 streams W once for all positions. Rows are split
 * across the pool's threads (pool NULL = calling thread only); each y
 * element is one thread's fixed-order reduction (batch invariant, see top).
 * x and y must not overlap. ldx >= cols, ldy >= row_end - row_begin (when
 * T > 1). Returns 0, or -EINVAL for a bad shape (nothing written).
 */
int k3_kern_matmul(struct k3_kern_pool *pool, const struct k3_kern_mat *w,
	size_t row_begin, size_t row_end, size_t T,
	const float *x, size_t ldx, float *y, size_t ldy);

/* One product of a batch (k3_kern_matmul_many): the arguments of
 * k3_kern_matmul as a struct. */
struct k3_kern_matmul_job {
	const struct k3_kern_mat *w;
	size_t row_begin, row_end, T;
	const float *x;
	size_t ldx;
	float *y;
	size_t ldy;
};

enum { K3_KERN_MATMUL_MANY_MAX = 128 };

/*
 * Runs n_jobs independent products as ONE parallel-for over the union of
 * their rows (e.g. the q/k/v/g projections of one input, or gate and up of
 * every selected expert), so a decode step pays one pool dispatch instead
 * of one per matrix and small matrices still use every thread. Each job's
 * y is exactly what k3_kern_matmul would write for it (same row kernel,
 * batch invariant). Outputs must not overlap each other or any input.
 * n_jobs <= K3_KERN_MATMUL_MANY_MAX. Returns 0, or -EINVAL if any job is
 * malformed (nothing written).
 */
int k3_kern_matmul_many(struct k3_kern_pool *pool, size_t n_jobs,
	const struct k3_kern_matmul_job *jobs);

/*
 * Transposed product over the whole matrix (F32 or BF16 only):
 *
 *   y[t * ldy + c] = sum_{r < rows} W[r][c] * x[t * ldx + r]
 *
 * summed in r order 0..rows-1 (an axpy over rows), for c < cols, t < T.
 * Used for MLA weight absorption qa_h = WUK_h^T qn_h (§6.5) without a
 * transposed copy of W: pass a view of WUK_h (rows 128, cols 512, ld 512).
 * Returns 0 or -EINVAL (MXFP4 or bad shape).
 */
int k3_kern_matmul_t(struct k3_kern_pool *pool, const struct k3_kern_mat *w,
	size_t T, const float *x, size_t ldx, float *y, size_t ldy);

/*
 * Row-wise int8 quantization of a BF16 matrix w[rows][ld] (the int8 spine,
 * docs/formats.md "int8 spine overlay"), per row r over its cols values:
 *
 *   amax = max_c |w[r][c]|,  scale[r] = amax / 127   (fp32 division)
 *   q[r][c] = clamp(round_half_even(w[r][c] / scale[r]), -127, 127)
 *
 * (fp32 division; a row of zeros gets scale 0 and q 0). The rounding is
 * done by hand, so the bytes do not depend on the FPU's rounding mode.
 * q is dense [rows][cols], scales [rows]. Returns 0, or -EINVAL when a
 * weight is NaN or infinite (*bad_row, may be NULL, gets its row; q and
 * scales are then partly written). Scalar, the same on every ISA.
 */
int k3_kern_quantize_i8_bf16(size_t rows, size_t cols, size_t ld, const uint16_t *w,
	int8_t *q, float *scales, size_t *bad_row);

/* ------------------------------------------------------------------ */
/* Vector ops (n elements; fixed reduction order per ISA)              */

/* sum_i a[i] * b[i] */
float k3_kern_dot(size_t n, const float *a, const float *b);

/* sum_i x[i]^2 */
float k3_kern_sumsq(size_t n, const float *x);

/* y[i] += a * x[i] */
void k3_kern_axpy(size_t n, float a, const float *x, float *y);

/* y[i] = a * x[i] (in place allowed) */
void k3_kern_scale(size_t n, float a, const float *x, float *y);

/* y[i] = a[i] + b[i] (in place allowed) */
void k3_kern_add(size_t n, const float *a, const float *b, float *y);

/* y[i] = a[i] * b[i] (in place allowed) */
void k3_kern_mul(size_t n, const float *a, const float *b, float *y);

/*
 * RMSNorm (§3.1, KimiRMSNorm; fp32 contract, plain weight, no "1 + w"):
 *   r = 1 / sqrt( (1/n) sum_i x[i]^2 + eps ),  y[i] = w[i] * (x[i] * r)
 * w NULL means all ones. In place (y == x) allowed. eps: 1e-5 for the
 * layer/AttnRes/routed-expert/final norms, 1e-6 for MLA q_a/kv_a norms.
 */
void k3_kern_rmsnorm(size_t n, const float *x, const float *w, float eps,
	float *y);

/*
 * Gated RMSNorm of one KDA head (§5.6, FusedRMSNormGated, sigmoid):
 *   r = 1/sqrt((1/n) sum o^2 + eps),  y[j] = o[j] * r * w[j] * sigmoid(g[j])
 * In place (y == o) allowed.
 */
void k3_kern_rmsnorm_gated(size_t n, const float *o, const float *w,
	const float *g, float eps, float *y);

/*
 * L2 normalization with scale (§5.3, q/k of a KDA head):
 *   y[i] = x[i] / sqrt( sum_i x[i]^2 + eps ) * scale
 * (sum, not mean; eps 1e-6; scale 1/sqrt(128) for q, 1 for k). In place ok.
 */
void k3_kern_l2norm(size_t n, const float *x, float eps, float scale, float *y);

/* Elementwise activations, in place allowed: sigmoid(x) = 1/(1+e^-x);
 * silu(x) = x*sigmoid(x); softplus(x) = log(1+e^x) (x > 20 returns x).
 * ref ISA: libm expf/tanhf. AVX2/AVX-512: 8-lane polynomial exp/tanh
 * (x86_avx2_elem.c), within the ulp bounds measured in docs/kernels.md
 * and asserted by tests/kernels/test_kern_elem.c. Either way an element's
 * value depends only on its input (batch invariant). softplus is libm on
 * every ISA (not on a hot path). The same holds for softmax, SiTU-GLU,
 * the gated RMSNorm, the KDA conv and decay below. */
void k3_kern_sigmoid(size_t n, const float *x, float *y);
void k3_kern_silu(size_t n, const float *x, float *y);
void k3_kern_softplus(size_t n, const float *x, float *y);

/* Softmax in place (§3.3): subtract max, exp, divide by the sum
 * (summed in index order). n >= 1. */
void k3_kern_softmax(size_t n, float *x);

/*
 * SiTU-GLU (§7.1), gate g = W1/gate_proj output, up u = W3/up_proj output:
 *   act[i] = beta1 * tanh(g/beta1) * sigmoid(g) * up'(u),
 *   up'(u) = beta2 * tanh(u/beta2), or u when beta2 <= 0 (config null).
 * K3: beta1 = 4, beta2 = 25. beta1 <= 0 means 1 (config null). act may
 * alias g or u.
 */
void k3_kern_situ_glu(size_t n, const float *g, const float *u, float beta1,
	float beta2, float *act);

/* ------------------------------------------------------------------ */
/* Attention Residuals (§4.2)                                          */

enum { K3_KERN_ATTNRES_MAX_CAND = 32 };

/* u[d] = nw[d] * pw[d]: the fp32 score vector of one AR operator, formed
 * once at load time from the bf16 weights upcast to fp32. */
void k3_kern_attnres_score_vec(size_t D, const float *nw, const float *pw,
	float *u);

/*
 * out = AR(cand[0..n_cand-1]; u):
 *   r_j = 1/sqrt((1/D) sum_d c_j[d]^2 + eps), s_j = r_j * (c_j . u),
 *   p = softmax(s), out[d] = sum_j p_j c_j[d] (j ascending).
 * Candidate order: B[0..n-1] then P (§4.3). 1 <= n_cand <=
 * K3_KERN_ATTNRES_MAX_CAND; out must not alias a candidate. Returns 0 or
 * -EINVAL.
 */
int k3_kern_attnres(size_t D, size_t n_cand, const float *const *cand,
	const float *u, float eps, float *out);

/* ------------------------------------------------------------------ */
/* KDA (§5)                                                            */

/*
 * One token of the short causal depthwise conv + SiLU (§5.2) over C
 * channels: hist[3][C] holds the last three RAW projections (row 0 oldest),
 * w[C][4] the conv weight as stored ([C,1,4]; tap 3 = current token):
 *   y[c] = silu( w[c][0] h0[c] + w[c][1] h1[c] + w[c][2] h2[c] + w[c][3] x[c] )
 * then hist shifts (h0 := h1, h1 := h2, h2 := x). Zero hist at sequence
 * start. y must not alias x or hist.
 */
void k3_kern_kda_conv_silu(size_t C, const float *w, float *hist,
	const float *x, float *y);

/*
 * Per-channel decay of one KDA head (§5.3.4):
 *   alpha[i] = exp( lower_bound * sigmoid( A * (f[i] + dt_bias[i]) ) )
 * A = exp(A_log[h]) (computed by the caller once per head), lower_bound =
 * -5 for K3.
 */
void k3_kern_kda_decay(size_t n, const float *f, const float *dt_bias,
	float A, float lower_bound, float *alpha);

/*
 * One token of the delta-rule recurrence for one head (§5.4), state
 * S[dk][dv] row-major (row i = key channel), fp32, updated in place:
 *   S[i][:] *= alpha[i];  pred = S^T k;  u = beta (v - pred);
 *   S += k u^T;  o = S^T q.
 * q, k already normalized (q scaled); sums over i run in ascending i.
 * scratch: 2*dv floats (pred and u). o must not alias inputs.
 */
void k3_kern_kda_step(size_t dk, size_t dv, float *S, const float *q,
	const float *k, const float *v, const float *alpha, float beta,
	float *o, float *scratch);

/* ------------------------------------------------------------------ */
/* MLA attention, absorbed form (§6.5), one head and one query          */

/*
 * kv: n_ctx cached rows, row s at kv + s * ld_kv holding d floats
 * ([c(s) (512) | kr(s) (64)] for K3, d = 576); q: d floats
 * ([qa_h | qr_h]). Computes
 *   score(s) = scale * (q . kv_s)   (one dot over d, fixed order)
 *   p = softmax(score);  out[j] = sum_s p(s) kv_s[j]  for j < d_out
 * (s ascending; d_out = 512 gives cbar_h). scale = 1/sqrt(192).
 * scratch: n_ctx floats (receives p). n_ctx >= 1.
 */
void k3_kern_mla_attend(size_t n_ctx, size_t d, size_t d_out,
	const float *kv, size_t ld_kv, const float *q, float scale,
	float *out, float *scratch);

/* ------------------------------------------------------------------ */
/* Router (§8.1)                                                       */

/*
 * From router logits (n_exp, fp32): s = sigmoid(logit); select the k
 * largest s + bias (bias NULL = none) with ties to the lower expert index,
 * written to idx[0..k-1] in descending order of s + bias; weights w_k =
 * s[idx_k] / (sum s[idx] + 1e-20) when renorm, else s[idx_k]; then
 * w_k *= scaling. scores_out (n_exp, may be NULL) receives s. k <= n_exp,
 * k <= 64. Returns 0 or -EINVAL.
 */
int k3_kern_router_topk(size_t n_exp, const float *logits, const float *bias,
	size_t k, bool renorm, float scaling, int32_t *idx, float *w,
	float *scores_out);

#endif

/*
 * cpu_ops.h - the cpu provider's per-position math (internal to
 * providers/cpu). Every function here is the scalar reference of one op of
 * docs/model.md ("spec §n"): plain fp32 loops with one fixed reduction
 * order (sequential over the reduced index), so a result never depends on
 * the batch it was computed in or on the thread that computed it. The fast
 * paths (cpu_provider.c and the sub-layer files cpu_kda.c, cpu_mla.c,
 * cpu_moe.c) are checked against these in tests/engine.
 */
#ifndef K3_CPU_OPS_H
#define K3_CPU_OPS_H

#include <stddef.h>
#include <stdint.h>

static inline float k3_cpu_bf16(uint16_t b)
{
	union { uint32_t u; float f; } v = { .u = (uint32_t)b << 16 };
	return v.f;
}

/* y[r] = sum_c W[r][c] x[c] for r < rows; W bf16 (dtype 2), f32 (1) or
 * row-wise int8 (K3_PROV_DTYPE_I8: q[rows][cols], then the fp32 row scales
 * at K3_PROV_I8_SCALE_OFFSET), row-major [rows][cols] (spec §3.2). */
void k3_cpu_ref_linear(const void *w, uint32_t dtype, uint32_t rows, uint32_t cols,
		       const float *x, float *y);

/* y = W x with W MXFP4 (spec §9): packed [rows][cols/2], scale [rows][cols/32];
 * cols % 32 == 0. */
void k3_cpu_ref_mxfp4_linear(const uint8_t *packed, const uint8_t *scale,
			     uint32_t rows, uint32_t cols, const float *x, float *y);

/* Dequantized value of column c of one MXFP4 row (spec §9). */
float k3_cpu_mxfp4_value(const uint8_t *packed_row, const uint8_t *scale_row, uint32_t c);

/* y[i] = w[i] * x[i] / sqrt(mean(x^2) + eps) (spec §3.1); y may alias x. */
void k3_cpu_ref_rmsnorm(const float *x, const float *w, uint32_t n, float eps, float *y);

/* SiTU-GLU of one gate/up pair (spec §7.1); beta2 == 0 leaves up uncapped. */
float k3_cpu_situ(float g, float u, float beta1, float beta2);

float k3_cpu_sigmoid(float z);

/* AttnRes mix of one position (spec §4.2): out[D] from n candidate rows
 * cands[j] (each D floats) and the folded score vector u = nw * pw. */
void k3_cpu_ref_attnres(const float *const *cands, uint32_t n, uint32_t D,
			const float *u, float eps, float *out);

/* Short causal conv + SiLU of one position for P channels (spec §5.2):
 * win holds the previous K-1 raw inputs, oldest first ([K-1][P]); w is
 * [P][K] with tap K-1 = current. Shifts x into win. */
void k3_cpu_ref_conv_step(float *win, const float *w, uint32_t P, uint32_t K,
			  const float *x, float *y);

/* One KDA head step (spec §5.3-5.4): q, k post-conv (normalized here), v,
 * alpha[dk] decay factors, beta; S [dk][dv] (row = key channel) updated in
 * place; o[dv] the read-out. */
void k3_cpu_ref_kda_head(float *S, uint32_t dk, uint32_t dv, const float *q,
			 const float *k, const float *v, const float *alpha,
			 float beta, float *o);

/* Top-k of biased scores with lowest-index tie break (spec §8.1): ids[k] in
 * selection order, weights[k] the renormalized (+1e-20), scaled unbiased
 * scores. s[n] are the sigmoid scores, bias[n] the correction bias. */
void k3_cpu_ref_topk(const float *s, const float *bias, uint32_t n, uint32_t k,
		     int renormalize, float scale, uint32_t *ids, float *weights);

#endif

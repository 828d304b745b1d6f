/*
 * kern_elem.c - elementwise and row ops of k3_kernels.h. Their reductions
 * (dot, sum of squares, axpy) go through the ISA table and their
 * transcendentals (exp, sigmoid, SiLU, tanh) through the elementwise table
 * (kern_ops.h: libm in the ref ISA, defined here; polynomial kernels for
 * AVX2), so each result is fixed per ISA and independent of batch size.
 * The router's sigmoid stays libm on every ISA: 64-384 calls per layer
 * cost nothing, and route selection is the most tie-sensitive output.
 */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "kern_ops.h"

void k3_kern_bf16_to_f32(size_t n, const uint16_t *src, float *dst)
{
	for (size_t i = 0; i < n; i++) {
		uint32_t u = (uint32_t)src[i] << 16;

		memcpy(&dst[i], &u, sizeof(u));
	}
}

static uint16_t f32_bf16(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	if ((u & 0x7fffffffu) > 0x7f800000u)          /* NaN: keep it quiet */
		return (uint16_t)((u >> 16) | 0x0040u);
	u += 0x7fffu + ((u >> 16) & 1u);              /* round to nearest even */
	return (uint16_t)(u >> 16);
}

void k3_kern_f32_to_bf16(size_t n, const float *src, uint16_t *dst)
{
	for (size_t i = 0; i < n; i++)
		dst[i] = f32_bf16(src[i]);
}

float k3_kern_bf16_round1(float x)
{
	uint32_t u = (uint32_t)f32_bf16(x) << 16;
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

void k3_kern_round_bf16(size_t n, float *x)
{
	for (size_t i = 0; i < n; i++)
		x[i] = k3_kern_bf16_round1(x[i]);
}

void k3_kern_scale(size_t n, float a, const float *x, float *y)
{
	for (size_t i = 0; i < n; i++)
		y[i] = a * x[i];
}

void k3_kern_add(size_t n, const float *a, const float *b, float *y)
{
	for (size_t i = 0; i < n; i++)
		y[i] = a[i] + b[i];
}

void k3_kern_mul(size_t n, const float *a, const float *b, float *y)
{
	for (size_t i = 0; i < n; i++)
		y[i] = a[i] * b[i];
}

static float sigmoid1(float x)
{
	return 1.0f / (1.0f + expf(-x));
}

void k3_kern_rmsnorm(size_t n, const float *x, const float *w, float eps,
	float *y)
{
	float ms = k3_kern_sumsq(n, x) / (float)n;
	float r = 1.0f / sqrtf(ms + eps);

	for (size_t i = 0; i < n; i++)
		y[i] = w ? w[i] * (x[i] * r) : x[i] * r;
}

void k3_kern_rmsnorm_gated(size_t n, const float *o, const float *w,
	const float *g, float eps, float *y)
{
	const struct k3_kern_elem_ops *el = k3_kern_elem_active();
	float ms = k3_kern_sumsq(n, o) / (float)n;
	float r = 1.0f / sqrtf(ms + eps);
	float sg[64];

	for (size_t j0 = 0; j0 < n; j0 += 64) {
		size_t m = n - j0 < 64 ? n - j0 : 64;

		el->sigmoid(m, g + j0, sg);
		for (size_t j = 0; j < m; j++)
			y[j0 + j] = o[j0 + j] * r * w[j0 + j] * sg[j];
	}
}

void k3_kern_l2norm(size_t n, const float *x, float eps, float scale, float *y)
{
	float inv = 1.0f / sqrtf(k3_kern_sumsq(n, x) + eps);

	for (size_t i = 0; i < n; i++)
		y[i] = x[i] * inv * scale;
}

/* ---- the ref elementwise table: libm, the oracle ---- */

static void ref_exp_shift(size_t n, const float *x, float shift, float *y)
{
	for (size_t i = 0; i < n; i++)
		y[i] = expf(x[i] - shift);
}

static void ref_sigmoid(size_t n, const float *x, float *y)
{
	for (size_t i = 0; i < n; i++)
		y[i] = sigmoid1(x[i]);
}

static void ref_silu(size_t n, const float *x, float *y)
{
	for (size_t i = 0; i < n; i++)
		y[i] = x[i] * sigmoid1(x[i]);
}

static void ref_tanh(size_t n, const float *x, float *y)
{
	for (size_t i = 0; i < n; i++)
		y[i] = tanhf(x[i]);
}

static void ref_situ_glu(size_t n, const float *g, const float *u, float beta1,
	float beta2, float *act)
{
	if (beta1 <= 0.0f)
		beta1 = 1.0f;
	for (size_t i = 0; i < n; i++) {
		float gi = g[i], ui = u[i];
		float a = beta1 * tanhf(gi / beta1) * sigmoid1(gi);
		float up = beta2 > 0.0f ? beta2 * tanhf(ui / beta2) : ui;

		act[i] = a * up;
	}
}

static void ref_kda_decay(size_t n, const float *f, const float *dt_bias,
	float A, float lower_bound, float *alpha)
{
	for (size_t i = 0; i < n; i++)
		alpha[i] = expf(lower_bound * sigmoid1(A * (f[i] + dt_bias[i])));
}

const struct k3_kern_elem_ops k3_kern_elem_ref = { K3_KERN_ELEM_INIT(K3_KERN_ISA_REF, ref) };

void k3_kern_sigmoid(size_t n, const float *x, float *y)
{
	k3_kern_elem_active()->sigmoid(n, x, y);
}

void k3_kern_silu(size_t n, const float *x, float *y)
{
	k3_kern_elem_active()->silu(n, x, y);
}

void k3_kern_softplus(size_t n, const float *x, float *y)
{
	for (size_t i = 0; i < n; i++)
		y[i] = x[i] > 20.0f ? x[i] : log1pf(expf(x[i]));
}

void k3_kern_softmax(size_t n, float *x)
{
	float mx = x[0], sum = 0.0f, inv;

	for (size_t i = 1; i < n; i++)
		if (x[i] > mx)
			mx = x[i];
	k3_kern_elem_active()->exp_shift(n, x, mx, x);
	for (size_t i = 0; i < n; i++)
		sum += x[i];
	inv = 1.0f / sum;
	for (size_t i = 0; i < n; i++)
		x[i] *= inv;
}

void k3_kern_situ_glu(size_t n, const float *g, const float *u, float beta1,
	float beta2, float *act)
{
	k3_kern_elem_active()->situ_glu(n, g, u, beta1, beta2, act);
}

void k3_kern_attnres_score_vec(size_t D, const float *nw, const float *pw,
	float *u)
{
	k3_kern_mul(D, nw, pw, u);
}

int k3_kern_attnres(size_t D, size_t n_cand, const float *const *cand,
	const float *u, float eps, float *out)
{
	float p[K3_KERN_ATTNRES_MAX_CAND];

	if (n_cand == 0 || n_cand > K3_KERN_ATTNRES_MAX_CAND || D == 0)
		return -EINVAL;
	for (size_t j = 0; j < n_cand; j++) {
		float r = 1.0f / sqrtf(k3_kern_sumsq(D, cand[j]) / (float)D + eps);

		p[j] = r * k3_kern_dot(D, cand[j], u);
	}
	k3_kern_softmax(n_cand, p);
	k3_kern_scale(D, p[0], cand[0], out);
	for (size_t j = 1; j < n_cand; j++)
		k3_kern_axpy(D, p[j], cand[j], out);
	return 0;
}

void k3_kern_kda_conv_silu(size_t C, const float *w, float *hist,
	const float *x, float *y)
{
	float *h0 = hist, *h1 = hist + C, *h2 = hist + 2 * C;

	for (size_t c = 0; c < C; c++) {
		const float *wc = w + 4 * c;
		float s = wc[0] * h0[c] + wc[1] * h1[c] + wc[2] * h2[c] + wc[3] * x[c];

		y[c] = s;
		h0[c] = h1[c];
		h1[c] = h2[c];
		h2[c] = x[c];
	}
	k3_kern_elem_active()->silu(C, y, y);
}

void k3_kern_kda_decay(size_t n, const float *f, const float *dt_bias,
	float A, float lower_bound, float *alpha)
{
	k3_kern_elem_active()->kda_decay(n, f, dt_bias, A, lower_bound, alpha);
}

void k3_kern_mla_attend(size_t n_ctx, size_t d, size_t d_out,
	const float *kv, size_t ld_kv, const float *q, float scale,
	float *out, float *scratch)
{
	for (size_t s = 0; s < n_ctx; s++)
		scratch[s] = scale * k3_kern_dot(d, q, kv + s * ld_kv);
	k3_kern_softmax(n_ctx, scratch);
	k3_kern_scale(d_out, scratch[0], kv, out);
	for (size_t s = 1; s < n_ctx; s++)
		k3_kern_axpy(d_out, scratch[s], kv + s * ld_kv, out);
}

int k3_kern_router_topk(size_t n_exp, const float *logits, const float *bias,
	size_t k, bool renorm, float scaling, int32_t *idx, float *w,
	float *scores_out)
{
	float key[64];
	float sum = 0.0f;

	if (k == 0 || k > 64 || k > n_exp || n_exp > INT32_MAX)
		return -EINVAL;
	/* Insertion into a sorted top-k list: strict '>' keeps the earlier
	 * (lower) index ahead on ties, since experts arrive in index order. */
	size_t have = 0;
	for (size_t e = 0; e < n_exp; e++) {
		float s = sigmoid1(logits[e]);
		float kk = bias ? s + bias[e] : s;
		size_t pos;

		if (scores_out)
			scores_out[e] = s;
		if (have == k && !(kk > key[k - 1]))
			continue;
		pos = have < k ? have++ : k - 1;
		while (pos > 0 && kk > key[pos - 1]) {
			key[pos] = key[pos - 1];
			idx[pos] = idx[pos - 1];
			pos--;
		}
		key[pos] = kk;
		idx[pos] = (int32_t)e;
	}
	for (size_t i = 0; i < k; i++) {
		w[i] = sigmoid1(logits[idx[i]]);
		sum += w[i];
	}
	for (size_t i = 0; i < k; i++) {
		if (renorm)
			w[i] /= sum + 1e-20f;
		w[i] *= scaling;
	}
	return 0;
}

/*
 * cpu_ref.c - scalar reference math of the cpu provider (see cpu_ops.h).
 * Deliberately plain: one accumulator, sequential order, no SIMD. These
 * loops are the oracle the fast paths are tested against, so reductions
 * accumulate in double ("fp32 or better", spec §0.2): the oracle should be
 * closer to the exact result than the code it checks, and a long
 * sequential fp32 sum is not (on the goldens it lands near 1e-4 relative
 * L2, the fast path's blocked sums near 4e-5).
 */
#include "cpu/cpu_ops.h"
#include "k3_provider.h"

#include <math.h>
#include <string.h>

#include "k3_kernels.h"

void k3_cpu_ref_linear(const void *w, uint32_t dtype, uint32_t rows, uint32_t cols,
		       const float *x, float *y)
{
	for (uint32_t r = 0; r < rows; r++) {
		double acc = 0.0;
		if (dtype == K3_PROV_DTYPE_I8) {
			/* value = q * scale[r] (the int8 spine), summed in double */
			const int8_t *row = (const int8_t *)w + (size_t)r * cols;
			float s;
			memcpy(&s, (const char *)w + K3_PROV_I8_SCALE_OFFSET(rows, cols) + 4 * (size_t)r,
			       sizeof(s));
			for (uint32_t c = 0; c < cols; c++)
				acc += (double)row[c] * x[c];
			acc *= s;
		} else if (dtype == 2) {
			const uint16_t *row = (const uint16_t *)w + (size_t)r * cols;
			for (uint32_t c = 0; c < cols; c++)
				acc += (double)k3_cpu_bf16(row[c]) * x[c];
		} else {
			const float *row = (const float *)w + (size_t)r * cols;
			for (uint32_t c = 0; c < cols; c++)
				acc += (double)row[c] * x[c];
		}
		y[r] = (float)acc;
	}
}

static const float e2m1[16] = K3_KERN_E2M1_VALUES;

float k3_cpu_mxfp4_value(const uint8_t *packed_row, const uint8_t *scale_row, uint32_t c)
{
	uint8_t byte = packed_row[c >> 1];
	uint8_t code = (c & 1) ? (uint8_t)(byte >> 4) : (uint8_t)(byte & 0x0F);
	/* ldexpf keeps s = 0 (2^-127, subnormal) exact, unlike the s<<23 trick. */
	return e2m1[code] * ldexpf(1.0f, (int)scale_row[c >> 5] - 127);
}

void k3_cpu_ref_mxfp4_linear(const uint8_t *packed, const uint8_t *scale,
			     uint32_t rows, uint32_t cols, const float *x, float *y)
{
	for (uint32_t r = 0; r < rows; r++) {
		const uint8_t *pr = packed + (size_t)r * (cols / 2);
		const uint8_t *sr = scale + (size_t)r * (cols / 32);
		double acc = 0.0;
		for (uint32_t c = 0; c < cols; c++)
			acc += (double)k3_cpu_mxfp4_value(pr, sr, c) * x[c];
		y[r] = (float)acc;
	}
}

void k3_cpu_ref_rmsnorm(const float *x, const float *w, uint32_t n, float eps, float *y)
{
	double ss = 0.0;
	for (uint32_t i = 0; i < n; i++)
		ss += (double)x[i] * x[i];
	float r = (float)(1.0 / sqrt(ss / n + eps));
	for (uint32_t i = 0; i < n; i++)
		y[i] = w[i] * (x[i] * r);
}

float k3_cpu_sigmoid(float z)
{
	return 1.0f / (1.0f + expf(-z));
}

float k3_cpu_situ(float g, float u, float beta1, float beta2)
{
	float a = beta1 * tanhf(g / beta1) * k3_cpu_sigmoid(g);
	float up = beta2 > 0.0f ? beta2 * tanhf(u / beta2) : u;
	return a * up;
}

void k3_cpu_ref_attnres(const float *const *cands, uint32_t n, uint32_t D,
			const float *u, float eps, float *out)
{
	float s[64];   /* n <= 64 is checked by the provider at open */
	float mx = -INFINITY;

	for (uint32_t j = 0; j < n; j++) {
		const float *c = cands[j];
		double ss = 0.0;
		for (uint32_t d = 0; d < D; d++)
			ss += (double)c[d] * c[d];
		double r = 1.0 / sqrt(ss / D + eps);
		double acc = 0.0;
		for (uint32_t d = 0; d < D; d++)
			acc += (c[d] * r) * u[d];
		s[j] = (float)acc;
		if (s[j] > mx)
			mx = s[j];
	}
	float sum = 0.0f;
	for (uint32_t j = 0; j < n; j++) {
		s[j] = expf(s[j] - mx);
		sum += s[j];
	}
	for (uint32_t j = 0; j < n; j++)
		s[j] /= sum;
	for (uint32_t d = 0; d < D; d++) {
		double acc = 0.0;
		for (uint32_t j = 0; j < n; j++)
			acc += (double)s[j] * cands[j][d];
		out[d] = (float)acc;
	}
}

static float silu(float z)
{
	return z * k3_cpu_sigmoid(z);
}

void k3_cpu_ref_conv_step(float *win, const float *w, uint32_t P, uint32_t K,
			  const float *x, float *y)
{
	for (uint32_t c = 0; c < P; c++) {
		double acc = 0.0;
		for (uint32_t j = 0; j + 1 < K; j++)
			acc += (double)w[(size_t)c * K + j] * win[(size_t)j * P + c];
		acc += (double)w[(size_t)c * K + K - 1] * x[c];
		y[c] = silu((float)acc);
		for (uint32_t j = 0; j + 2 < K; j++)
			win[(size_t)j * P + c] = win[(size_t)(j + 1) * P + c];
		if (K > 1)
			win[(size_t)(K - 2) * P + c] = x[c];
	}
}

void k3_cpu_ref_kda_head(float *S, uint32_t dk, uint32_t dv, const float *q,
			 const float *k, const float *v, const float *alpha,
			 float beta, float *o)
{
	double qn = 0.0, kn = 0.0;
	for (uint32_t i = 0; i < dk; i++) {
		qn += (double)q[i] * q[i];
		kn += (double)k[i] * k[i];
	}
	float qs = (float)(1.0 / sqrt(qn + 1e-6) / sqrt((double)dk));
	float ks = (float)(1.0 / sqrt(kn + 1e-6));

	/* decay, then predict with the decayed state */
	for (uint32_t i = 0; i < dk; i++)
		for (uint32_t j = 0; j < dv; j++)
			S[(size_t)i * dv + j] *= alpha[i];
	for (uint32_t j = 0; j < dv; j++) {
		double pred = 0.0;
		for (uint32_t i = 0; i < dk; i++)
			pred += (double)(k[i] * ks) * S[(size_t)i * dv + j];
		o[j] = beta * (v[j] - (float)pred);   /* o holds u until the read */
	}
	for (uint32_t i = 0; i < dk; i++)
		for (uint32_t j = 0; j < dv; j++)
			S[(size_t)i * dv + j] += (k[i] * ks) * o[j];
	for (uint32_t j = 0; j < dv; j++) {
		double acc = 0.0;
		for (uint32_t i = 0; i < dk; i++)
			acc += (double)(q[i] * qs) * S[(size_t)i * dv + j];
		o[j] = (float)acc;
	}
}

void k3_cpu_ref_topk(const float *s, const float *bias, uint32_t n, uint32_t k,
		     int renormalize, float scale, uint32_t *ids, float *weights)
{
	/* k passes of a strict-greater scan: the first maximum wins, so ties
	 * go to the lowest id. k and n are small (16 of 896). */
	uint64_t taken[(1024 + 63) / 64];   /* n <= 1024 is checked at open */
	memset(taken, 0, sizeof(taken));
	float sum = 0.0f;
	for (uint32_t j = 0; j < k; j++) {
		uint32_t best = UINT32_MAX;
		float bv = 0.0f;
		for (uint32_t e = 0; e < n; e++) {
			if (taken[e >> 6] >> (e & 63) & 1)
				continue;
			float v = s[e] + bias[e];
			if (best == UINT32_MAX || v > bv) {
				best = e;
				bv = v;
			}
		}
		taken[best >> 6] |= 1ull << (best & 63);
		ids[j] = best;
		weights[j] = s[best];
		sum += s[best];
	}
	for (uint32_t j = 0; j < k; j++) {
		if (renormalize && k > 1)
			weights[j] /= sum + 1e-20f;
		weights[j] *= scale;
	}
}

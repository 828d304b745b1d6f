/*
 * x86_chain.h - internal: the x86 ops whose every output element is one
 * FMA chain in a fixed order (transposed product, axpy, KDA step), shared
 * by the AVX2 and AVX-512 ISA files (with x86_fold.h, the horizontal sums
 * their row kernels end with). Included by each, so it compiles with
 * that file's -m flags; the lane width never changes an element's bits
 * (vfmadd and fmaf round once each, and an element's chain does not depend
 * on its neighbours), so both tables give the same results here.
 *
 * Orders: matmul_t_cols y[t][c] = fma chain over r ascending from +0;
 * axpy y[i] = fma(a, x[i], y[i]); KDA step (k3_kern_kda_step) pred and o
 * as fma chains over i ascending, S rows scaled then updated in place.
 * Column tails use fmaf, so a column's value does not depend on where a
 * thread's column range starts.
 *
 * Functions are static: each including file gets its own copy, compiled
 * for its ISA.
 */
#ifndef K3_X86_CHAIN_H
#define K3_X86_CHAIN_H

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "kern_ops.h"
#include "x86_fold.h"

/* 8 bf16 -> 8 fp32 (exact: the bf16 bits are the top half). */
static inline __attribute__((always_inline)) __m256 chain_bf16x8(const uint16_t *p)
{
	__m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));

	return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

static void x86_matmul_t_cols(const struct k3_kern_mat *w, size_t c0,
	size_t c1, size_t T, const float *x, size_t ldx, float *y, size_t ldy)
{
	size_t ld = w->ld ? w->ld : w->cols;
	bool bf = w->dtype == K3_KERN_DT_BF16;

	for (size_t t = 0; t < T; t++) {
		const float *xt = x + t * ldx;
		float *yt = y + t * ldy;
		size_t c = c0;

		for (; c + 32 <= c1; c += 32) {
			__m256 a[4] = { _mm256_setzero_ps(), _mm256_setzero_ps(),
				_mm256_setzero_ps(), _mm256_setzero_ps() };

			for (size_t r = 0; r < w->rows; r++) {
				__m256 xr = _mm256_set1_ps(xt[r]);

				for (int k = 0; k < 4; k++) {
					__m256 wv = bf ? chain_bf16x8((const uint16_t *)w->data + r * ld + c + 8 * k)
						: _mm256_loadu_ps((const float *)w->data + r * ld + c + 8 * k);

					a[k] = _mm256_fmadd_ps(wv, xr, a[k]);
				}
			}
			for (int k = 0; k < 4; k++)
				_mm256_storeu_ps(yt + c + 8 * k, a[k]);
		}
		for (; c < c1; c++) {
			float acc = 0.0f;

			for (size_t r = 0; r < w->rows; r++) {
				float wv;

				if (bf) {
					uint32_t u = (uint32_t)((const uint16_t *)w->data)[r * ld + c] << 16;

					memcpy(&wv, &u, sizeof(wv));
				} else {
					wv = ((const float *)w->data)[r * ld + c];
				}
				acc = fmaf(wv, xt[r], acc);
			}
			yt[c] = acc;
		}
	}
}

static void x86_axpy(size_t n, float a, const float *x, float *y)
{
	__m256 av = _mm256_set1_ps(a);
	size_t i = 0;

	for (; i + 8 <= n; i += 8)
		_mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i),
			_mm256_loadu_ps(y + i)));
	for (; i < n; i++)
		y[i] = fmaf(a, x[i], y[i]);
}

static void x86_kda_step(size_t dk, size_t dv, float *S, const float *q,
	const float *k, const float *v, const float *alpha, float beta,
	float *o, float *scratch)
{
	float *pred = scratch, *u = scratch + dv;
	size_t j;

	for (j = 0; j < dv; j++)
		pred[j] = 0.0f;
	for (size_t i = 0; i < dk; i++) {
		float *Si = S + i * dv;
		__m256 al = _mm256_set1_ps(alpha[i]), kv = _mm256_set1_ps(k[i]);

		for (j = 0; j + 8 <= dv; j += 8) {
			__m256 s = _mm256_mul_ps(_mm256_loadu_ps(Si + j), al);

			_mm256_storeu_ps(Si + j, s);
			_mm256_storeu_ps(pred + j, _mm256_fmadd_ps(kv, s,
				_mm256_loadu_ps(pred + j)));
		}
		for (; j < dv; j++) {
			Si[j] *= alpha[i];
			pred[j] = fmaf(k[i], Si[j], pred[j]);
		}
	}
	for (j = 0; j < dv; j++) {
		u[j] = beta * (v[j] - pred[j]);
		o[j] = 0.0f;
	}
	for (size_t i = 0; i < dk; i++) {
		float *Si = S + i * dv;
		__m256 kv = _mm256_set1_ps(k[i]), qv = _mm256_set1_ps(q[i]);

		for (j = 0; j + 8 <= dv; j += 8) {
			__m256 s = _mm256_fmadd_ps(kv, _mm256_loadu_ps(u + j),
				_mm256_loadu_ps(Si + j));

			_mm256_storeu_ps(Si + j, s);
			_mm256_storeu_ps(o + j, _mm256_fmadd_ps(qv, s, _mm256_loadu_ps(o + j)));
		}
		for (; j < dv; j++) {
			Si[j] = fmaf(k[i], u[j], Si[j]);
			o[j] = fmaf(q[i], Si[j], o[j]);
		}
	}
}

#endif

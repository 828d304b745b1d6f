/*
 * kern_chain.h - internal: the ops whose every output element is one FMA
 * chain in a fixed order (transposed product, axpy, KDA step), written
 * once for the SIMD ISA files. Not a header of its own: the includer
 * (x86_chain.h for AVX2 and AVX-512, arm_neon.c) first defines
 *
 *   kc_t, KC_LANES             a float vector and its lane count
 *   kc_zero(), kc_set1(s)      all lanes +0 / s
 *   kc_load(p), kc_store(p, v) unaligned KC_LANES floats
 *   kc_load_bf16(p)            KC_LANES bf16 -> fp32 (exact)
 *   kc_mul(a, b)               a * b
 *   kc_fma(a, b, c)            a * b + c, rounded once
 *   KC_PREFIX                  the functions are KC_PREFIX_matmul_t_cols,
 *                              KC_PREFIX_axpy, KC_PREFIX_kda_step
 *
 * (so x86_matmul_t_cols, x86_axpy, x86_kda_step of x86_chain.h and
 * neon_matmul_t_cols, neon_axpy, neon_kda_step of arm_neon.c are defined
 * below).
 *
 * The lane width never changes an element's bits (a fused multiply-add
 * rounds once, like the fmaf of the tails, and an element's chain does not
 * depend on its neighbours), so every ISA that includes this file gives
 * the same results here.
 *
 * Orders: matmul_t_cols y[t][c] = fma chain over r ascending from +0;
 * axpy y[i] = fma(a, x[i], y[i]); KDA step (k3_kern_kda_step) pred and o
 * as fma chains over i ascending, S rows scaled then updated in place.
 * Column tails use fmaf, so a column's value does not depend on where a
 * thread's column range starts. Builtins only (fmaf, memcpy), so
 * arm_neon.c stays freestanding.
 */
#ifndef KC_PREFIX
#error "define the kc_* vocabulary and KC_PREFIX before including kern_chain.h"
#endif

#include "kern_ops.h"

#define KC_CAT2_(a, b) a##_##b
#define KC_CAT_(a, b) KC_CAT2_(a, b)
#define KC_FN(slot) KC_CAT_(KC_PREFIX, slot)

static inline float kc_bf16_f32(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;

	__builtin_memcpy(&f, &u, sizeof(f));
	return f;
}

static void KC_FN(matmul_t_cols)(const struct k3_kern_mat *w, size_t c0,
	size_t c1, size_t T, const float *x, size_t ldx, float *y, size_t ldy)
{
	size_t ld = w->ld ? w->ld : w->cols;
	bool bf = w->dtype == K3_KERN_DT_BF16;

	for (size_t t = 0; t < T; t++) {
		const float *xt = x + t * ldx;
		float *yt = y + t * ldy;
		size_t c = c0;

		for (; c + 4 * KC_LANES <= c1; c += 4 * KC_LANES) {
			kc_t a[4] = { kc_zero(), kc_zero(), kc_zero(), kc_zero() };

			for (size_t r = 0; r < w->rows; r++) {
				kc_t xr = kc_set1(xt[r]);

				for (int k = 0; k < 4; k++) {
					size_t at = r * ld + c + KC_LANES * k;
					kc_t wv = bf ? kc_load_bf16((const uint16_t *)w->data + at)
						: kc_load((const float *)w->data + at);

					a[k] = kc_fma(wv, xr, a[k]);
				}
			}
			for (int k = 0; k < 4; k++)
				kc_store(yt + c + KC_LANES * k, a[k]);
		}
		for (; c < c1; c++) {
			float acc = 0.0f;

			for (size_t r = 0; r < w->rows; r++) {
				float wv = bf ? kc_bf16_f32(((const uint16_t *)w->data)[r * ld + c])
					: ((const float *)w->data)[r * ld + c];

				acc = __builtin_fmaf(wv, xt[r], acc);
			}
			yt[c] = acc;
		}
	}
}

static void KC_FN(axpy)(size_t n, float a, const float *x, float *y)
{
	kc_t av = kc_set1(a);
	size_t i = 0;

	for (; i + KC_LANES <= n; i += KC_LANES)
		kc_store(y + i, kc_fma(av, kc_load(x + i), kc_load(y + i)));
	for (; i < n; i++)
		y[i] = __builtin_fmaf(a, x[i], y[i]);
}

static void KC_FN(kda_step)(size_t dk, size_t dv, float *S, const float *q,
	const float *k, const float *v, const float *alpha, float beta,
	float *o, float *scratch)
{
	float *pred = scratch, *u = scratch + dv;
	size_t j;

	for (j = 0; j < dv; j++)
		pred[j] = 0.0f;
	for (size_t i = 0; i < dk; i++) {
		float *Si = S + i * dv;
		kc_t al = kc_set1(alpha[i]), kv = kc_set1(k[i]);

		for (j = 0; j + KC_LANES <= dv; j += KC_LANES) {
			kc_t s = kc_mul(kc_load(Si + j), al);

			kc_store(Si + j, s);
			kc_store(pred + j, kc_fma(kv, s, kc_load(pred + j)));
		}
		for (; j < dv; j++) {
			Si[j] *= alpha[i];
			pred[j] = __builtin_fmaf(k[i], Si[j], pred[j]);
		}
	}
	for (j = 0; j < dv; j++) {
		u[j] = beta * (v[j] - pred[j]);
		o[j] = 0.0f;
	}
	for (size_t i = 0; i < dk; i++) {
		float *Si = S + i * dv;
		kc_t kv = kc_set1(k[i]), qv = kc_set1(q[i]);

		for (j = 0; j + KC_LANES <= dv; j += KC_LANES) {
			kc_t s = kc_fma(kv, kc_load(u + j), kc_load(Si + j));

			kc_store(Si + j, s);
			kc_store(o + j, kc_fma(qv, s, kc_load(o + j)));
		}
		for (; j < dv; j++) {
			Si[j] = __builtin_fmaf(k[i], u[j], Si[j]);
			o[j] = __builtin_fmaf(q[i], Si[j], o[j]);
		}
	}
}

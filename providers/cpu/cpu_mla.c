/*
 * cpu_mla.c - the cpu provider's MLA sub-layer (spec §6): the latent KV
 * cache (normalized kv latents and rope keys, one row per token; growing
 * it also grows the provider-wide score rows), and absorbed multi-query
 * attention over it: absorbed queries per head, scores and softmax over
 * the cached rows, WUV per head, the output gate and o_proj. The reference
 * path attends head by head in double; the fast path reads each cached
 * row once for all heads.
 */
#include "cpu/cpu_internal.h"

#include "base/array.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

struct k3_prov_mla_cache {
	k3_prov_model *m;
	uint32_t layer, len, cap, row;   /* row = kv_lora + qk_rope */
	float *rows;             /* [cap][row] */
	float *score;            /* [cap] */
};

/* ---------------------------------------------------------------- cache */

static int mla_reserve(k3_prov_mla_cache *c, uint32_t need, struct k3_prov_status *st)
{
	if (need <= c->cap)
		return 0;
	/* caps double from 16, so they stay powers of two and this is the
	 * limit on the grown cap too */
	if (need > (1u << 24))
		return cpu_fail(st, -E2BIG, "MLA cache of %u tokens exceeds the limit of %u", need, 1u << 24);
	size_t cap = c->cap, score_cap = c->cap;
	if (k3_array_reserve(&c->rows, &cap, need, (size_t)c->row * sizeof(float), 16) ||
	    k3_array_reserve(&c->score, &score_cap, need, sizeof(float), 16))
		return cpu_fail(st, -ENOMEM, "out of memory for an MLA cache of %u tokens", need);
	c->cap = (uint32_t)cap;
	/* the provider-wide score rows must hold the longest cache */
	k3_prov_model *m = c->m;
	if (m->mla_s_cap < cap) {
		float *ms = realloc(m->mla_s, (size_t)cpu_umax(m->cfg.mla_heads, 1) * cap * sizeof(float));
		if (!ms)
			return cpu_fail(st, -ENOMEM, "out of memory for MLA scores of %u tokens", need);
		m->mla_s = ms;
		m->mla_s_cap = (uint32_t)cap;
	}
	return 0;
}

void cpu_mla_cache_free(k3_prov_mla_cache *c)
{
	if (!c)
		return;
	free(c->rows);
	free(c->score);
	free(c);
}

int cpu_mla_cache_new(k3_prov_model *m, uint32_t layer, uint32_t capacity,
		      k3_prov_mla_cache **out, struct k3_prov_status *st)
{
	if (layer >= m->cfg.n_layers || m->cfg.attn_kind[layer] != K3_PROV_ATTN_MLA)
		return cpu_fail(st, -EINVAL, "layer %u is not an MLA layer", layer);
	k3_prov_mla_cache *c = calloc(1, sizeof(*c));
	if (!c)
		return cpu_fail(st, -ENOMEM, "out of memory");
	c->m = m;
	c->layer = layer;
	c->row = m->cfg.kv_lora + m->cfg.qk_rope;
	int rc = mla_reserve(c, capacity ? capacity : 16, st);
	if (rc) {
		cpu_mla_cache_free(c);
		return rc;
	}
	*out = c;
	return 0;
}

uint32_t cpu_mla_cache_len(const k3_prov_mla_cache *c)
{
	return c->len;
}

void cpu_mla_cache_truncate(k3_prov_mla_cache *c, uint32_t n)
{
	if (n < c->len)
		c->len = n;
}

int cpu_mla_cache_copy(k3_prov_mla_cache *dst, const k3_prov_mla_cache *src,
		       struct k3_prov_status *st)
{
	if (dst->m != src->m || dst->layer != src->layer)
		return cpu_fail(st, -EINVAL, "MLA cache copy across layers %u -> %u", src->layer, dst->layer);
	int rc = mla_reserve(dst, src->len, st);
	if (rc)
		return rc;
	memcpy(dst->rows, src->rows, (size_t)src->len * src->row * sizeof(float));
	dst->len = src->len;
	return 0;
}

int cpu_mla_cache_export(const k3_prov_mla_cache *c, void *dst, size_t cap, size_t *n,
			 struct k3_prov_status *st)
{
	return cpu_export_bytes(dst, cap, n, c->rows, (size_t)c->len * c->row * sizeof(float), NULL, 0, st);
}

/* ---------------------------------------------------------------- attention */

/* Reference attention of one head (spec §6.5): cbar = sum_s softmax_s(
 * scale * (qa . c(s) + qr . kr(s))) c(s) over the n cached rows, q = [qa | qr].
 * The fast path does all heads at once (cpu_mla). */
static void mla_attend_ref(const k3_prov_model *m, const k3_prov_mla_cache *cache, uint32_t n,
			   const float *q, float scale, float *cbar)
{
	uint32_t kvl = m->cfg.kv_lora, row = cache->row;
	float mx = -INFINITY;
	for (uint32_t sidx = 0; sidx < n; sidx++) {
		const float *cr = cache->rows + (size_t)sidx * row;
		double a = 0.0;
		for (uint32_t cc = 0; cc < row; cc++)
			a += (double)q[cc] * cr[cc];
		float sc = (float)(a * scale);
		cache->score[sidx] = sc;
		if (sc > mx)
			mx = sc;
	}
	double sum = 0.0;
	for (uint32_t sidx = 0; sidx < n; sidx++) {
		cache->score[sidx] = expf(cache->score[sidx] - mx);
		sum += cache->score[sidx];
	}
	for (uint32_t sidx = 0; sidx < n; sidx++)
		cache->score[sidx] = (float)(cache->score[sidx] / sum);
	for (uint32_t cc = 0; cc < kvl; cc++) {
		double acc = 0.0;
		for (uint32_t sidx = 0; sidx < n; sidx++)
			acc += (double)cache->score[sidx] * cache->rows[(size_t)sidx * row + cc];
		cbar[cc] = (float)acc;
	}
}

/* Absorbed queries of heads [begin, end) for one position (spec §6.5):
 * q[h] = [WUK_h^T qn_h | qr_h], WUK_h^T summed over d ascending. */
struct mla_q_job {
	const k3_prov_model *m;
	const struct cpu_layer *L;
	const float *Q;          /* this position's [H][nope + rope] */
	float *qall;             /* [H][kv_lora + rope] */
};

static void mla_q_task(void *arg, size_t begin, size_t end)
{
	const struct mla_q_job *j = arg;
	const struct k3_prov_config *c = &j->m->cfg;
	uint32_t kvl = c->kv_lora, nope = c->qk_nope, vh = c->v_head, rope = c->qk_rope;
	uint32_t qhd = nope + rope, row = kvl + rope;
	size_t esz = j->L->kvb.dtype == K3_PROV_DTYPE_BF16 ? 2 : 4;
	for (size_t hh = begin; hh < end; hh++) {
		const float *qn = j->Q + hh * qhd, *qr = qn + nope;
		const char *wuk = (const char *)j->L->kvb.data + hh * (nope + vh) * kvl * esz;
		float *qcat = j->qall + hh * row;
		if (j->m->reference) {
			for (uint32_t cc = 0; cc < kvl; cc++) {
				double acc = 0.0;
				for (uint32_t d = 0; d < nope; d++) {
					const char *wr = wuk + ((size_t)d * kvl + cc) * esz;
					float wv = esz == 2 ? k3_cpu_bf16(*(const uint16_t *)wr)
							    : *(const float *)wr;
					acc += (double)qn[d] * wv;
				}
				qcat[cc] = (float)acc;
			}
		} else {
			struct k3_kern_mat wm = {
				.dtype = esz == 2 ? K3_KERN_DT_BF16 : K3_KERN_DT_F32,
				.rows = nope, .cols = kvl, .ld = kvl, .data = wuk,
			};
			k3_kern_matmul_t(NULL, &wm, 1, qn, nope, qcat, kvl);
		}
		memcpy(qcat + kvl, qr, rope * sizeof(float));
	}
}

int cpu_mla(k3_prov_model *m, uint32_t layer, const float *h, uint32_t T,
	    k3_prov_mla_cache *cache, float *out, uint32_t flags,
	    struct k3_prov_status *st)
{
	int rc = cpu_check_attn(m, layer, T, K3_PROV_ATTN_MLA, cache->m, cache->layer, "MLA cache",
				st);
	if (rc)
		return rc;
	rc = mla_reserve(cache, cache->len + T, st);
	if (rc)
		return rc;

	const struct k3_prov_config *c = &m->cfg;
	const struct cpu_layer *L = &m->layers[layer];
	uint32_t D = c->hidden, H = c->mla_heads, kvl = c->kv_lora, rope = c->qk_rope;
	uint32_t nope = c->qk_nope, vh = c->v_head, qhd = m->qhd, row = cache->row;
	size_t W = m->wide;
	float *x = m->sx, *cq = m->s[0], *Q = m->s[1], *ckv = m->s[2];
	float *gz = m->s[3], *att = m->s[4];
	float scale = 1.0f / sqrtf((float)qhd);
	size_t esz = L->kvb.dtype == K3_PROV_DTYPE_BF16 ? 2 : 4;

	cpu_norm_rows(m, h, L->input_norm, T, D, c->rms_eps, x, D, D);
	const struct k3_cpu_job proj[3] = {
		JOB(&L->qa, x, D, T, cq, W), JOB(&L->kva, x, D, T, ckv, W),
		JOB(&L->g, x, D, T, gz, W),
	};
	k3_cpu_linear_multi(&m->ctx, proj, 3);
	cpu_norm_rows(m, cq, L->qa_norm, T, c->q_lora, c->mla_norm_eps, cq, W, W);
	k3_cpu_linear(&m->ctx, &L->qb, cq, W, T, Q, W);

	uint32_t len0 = cache->len;
	for (uint32_t t = 0; t < T; t++) {
		float *dst = cache->rows + (size_t)(len0 + t) * row;
		cpu_rmsnorm(m, ckv + t * W, L->kva_norm, kvl, c->mla_norm_eps, dst);
		memcpy(dst + kvl, ckv + t * W + kvl, rope * sizeof(float));
	}
	cache->len = len0 + T;

	float *qall = m->mla_q, *call = m->mla_cbar;
	for (uint32_t t = 0; t < T; t++) {
		uint32_t n = len0 + t + 1;      /* causal: positions 0..len0+t */
		/* 1) absorbed queries qall[h] = [WUK_h^T qn_h | qr_h] (spec §6.5);
		 * heads are independent, so they split across threads */
		struct mla_q_job qj = { m, L, Q + t * W, qall };
		size_t wuk_bytes = (size_t)H * nope * kvl * esz;
		if (!m->reference && (m->ctx.split_all || wuk_bytes >= K3_CPU_PARALLEL_MIN_BYTES))
			k3_kern_pool_for(m->ctx.pool, H, 1, mla_q_task, &qj);
		else
			mla_q_task(&qj, 0, H);
		/* 2) attention over the n cached rows: cbar_h = sum_s p_h(s) c(s) */
		if (m->reference) {
			for (uint32_t hh = 0; hh < H; hh++)
				mla_attend_ref(m, cache, n, qall + (size_t)hh * row, scale,
					   call + (size_t)hh * kvl);
		} else {
			/* All heads share the one latent cache (MLA absorbed is
			 * multi-query), so each cached row is read once for all
			 * heads: scores[h][s] = c(s) . q_h as a product with the
			 * cache as the matrix, then cbar = P C by the transposed
			 * product. Per (h, s) the reduction order is fixed, so a
			 * position's result does not depend on the batch. */
			struct k3_cpu_mat cm = { .data = cache->rows, .dtype = K3_PROV_DTYPE_F32,
						 .rows = n, .cols = row };
			float *sc = m->mla_s;
			k3_cpu_linear(&m->ctx, &cm, qall, row, H, sc, n);
			for (uint32_t hh = 0; hh < H; hh++) {
				k3_kern_scale(n, scale, sc + (size_t)hh * n, sc + (size_t)hh * n);
				k3_kern_softmax(n, sc + (size_t)hh * n);
			}
			struct k3_kern_mat cv = { .dtype = K3_KERN_DT_F32, .rows = n, .cols = kvl,
						  .ld = row, .data = cache->rows };
			size_t bytes = (size_t)n * kvl * sizeof(float);
			k3_kern_matmul_t(m->ctx.split_all || bytes >= K3_CPU_PARALLEL_MIN_BYTES
					 ? m->ctx.pool : NULL, &cv, H, sc, n, call, kvl);
		}
		/* 3) o_h = WUV_h cbar_h (all heads as one parallel region), times
		 * the output gate (spec §6.3) */
		for (uint32_t hh = 0; hh < H; hh++) {
			m->mla_wuv[hh] = (struct k3_cpu_mat){
				.data = (const char *)L->kvb.data +
					((size_t)hh * (nope + vh) + nope) * kvl * esz,
				.dtype = L->kvb.dtype, .rows = vh, .cols = kvl,
			};
			m->mla_jobs[hh] = JOB(&m->mla_wuv[hh], call + (size_t)hh * kvl, kvl, 1,
					      att + t * W + (size_t)hh * vh, vh);
		}
		k3_cpu_linear_multi(&m->ctx, m->mla_jobs, H);
		if (m->reference) {
			for (uint32_t hh = 0; hh < H; hh++) {
				float *ot = att + t * W + (size_t)hh * vh;
				const float *gt = gz + t * W + (size_t)hh * vh;
				for (uint32_t j = 0; j < vh; j++)
					ot[j] *= k3_cpu_sigmoid(gt[j]);
			}
		} else {
			k3_kern_sigmoid((size_t)H * vh, gz + t * W, m->tmp);
			k3_kern_mul((size_t)H * vh, att + t * W, m->tmp, att + t * W);
		}
	}
	float *y = m->s[0];
	k3_cpu_linear(&m->ctx, &L->o, att, W, T, y, W);
	for (uint32_t t = 0; t < T; t++)
		cpu_store(out + (size_t)t * D, y + t * W, D, flags);
	return 0;
}

/*
 * cpu_moe.c - the cpu provider's FFN sub-layer (spec §7-8): the
 * post-attention norm, the router (sigmoid scores, biased top-k), the
 * routed MXFP4 experts in the latent space (down projection, per-expert
 * W1/W3, SiTU, W2, the weighted sum in route order, norm and up
 * projection), either in one call or expert by expert as the engine's
 * expert source delivers them (routed_begin / expert / partial / end),
 * and the dense or shared-expert MLP.
 */
#include "cpu/cpu_internal.h"

#include <errno.h>
#include <stdbool.h>
#include <string.h>

int cpu_ffn_norm(k3_prov_model *m, uint32_t layer, const float *h2, uint32_t T,
		 float *x, struct k3_prov_status *st)
{
	int rc = cpu_check_layer(m, layer, 0, 0, st);
	if (rc)
		return rc;
	uint32_t D = m->cfg.hidden;
	cpu_norm_rows(m, h2, m->layers[layer].post_norm, T, D, m->cfg.rms_eps, x, D, D);
	return 0;
}

int cpu_router(k3_prov_model *m, uint32_t layer, const float *x, uint32_t T,
	       uint32_t *ids, float *weights, struct k3_prov_status *st)
{
	int rc = cpu_check_T(m, T, st);
	if (!rc)
		rc = cpu_check_layer(m, layer, 0, K3_PROV_FFN_MOE, st);
	if (rc)
		return rc;
	const struct cpu_layer *L = &m->layers[layer];
	const struct k3_prov_config *c = &m->cfg;
	size_t W = m->wide;
	uint32_t K = c->top_k;
	/* not s[0..2]: the lookahead runs the router inside a routed call */
	float *lg = m->s[3];
	k3_cpu_linear(&m->ctx, &L->router, x, c->hidden, T, lg, W);
	for (uint32_t t = 0; t < T; t++) {
		float *s = lg + t * W;
		uint32_t *it = ids + (size_t)t * K;
		float *wt = weights + (size_t)t * K;
		if (m->reference) {
			for (uint32_t e = 0; e < c->n_experts; e++)
				s[e] = k3_cpu_sigmoid(s[e]);
			k3_cpu_ref_topk(s, L->rbias, c->n_experts, K, (int)c->moe_renormalize,
					c->routed_scale, it, wt);
		} else {
			int32_t idx[64];
			/* HF renormalizes only when top_k > 1 (spec §8.1) */
			rc = k3_kern_router_topk(c->n_experts, s, L->rbias, K,
						 c->moe_renormalize && K > 1, c->routed_scale,
						 idx, wt, NULL);
			if (rc)
				return cpu_fail(st, rc, "layer %u: router top-%u failed", layer, K);
			for (uint32_t j = 0; j < K; j++)
				it[j] = (uint32_t)idx[j];
		}
	}
	return 0;
}

/* Validates ids and spans of a routed call's slots; spans may be NULL
 * (routed_begin: they come later). */
static int routed_check(k3_prov_model *m, uint32_t layer, uint32_t T, const uint32_t *ids,
			const struct k3_prov_expert *experts, struct k3_prov_status *st)
{
	int rc = cpu_check_T(m, T, st);
	if (!rc)
		rc = cpu_check_layer(m, layer, 0, K3_PROV_FFN_MOE, st);
	if (rc)
		return rc;
	size_t TK = (size_t)T * m->cfg.top_k;
	for (size_t i = 0; i < TK; i++) {
		const struct k3_prov_expert *e = experts ? &experts[i] : NULL;
		if (ids[i] >= m->cfg.n_experts ||
		    (e && (!e->w1_packed || !e->w1_scale || !e->w2_packed || !e->w2_scale ||
			   !e->w3_packed || !e->w3_scale)))
			return cpu_fail(st, -EINVAL, "layer %u: expert slot %zu (id %u) has no span",
					layer, i, ids[i]);
	}
	return 0;
}

/* The n slots rows[first..first+n) of one expert (inputs gathered in gx):
 * W1/W3, SiTU, W2 into Y rows first..first+n. Batch invariant, so a
 * slot's output does not depend on its companions or on which call
 * computed it. */
static void expert_rows(k3_prov_model *m, const struct k3_prov_expert *sp, uint32_t first,
			uint32_t n)
{
	const struct k3_prov_config *c = &m->cfg;
	uint32_t lat = c->latent, I = c->moe_inter;
	float *gx = m->ex, *g = m->eg, *u = m->eu, *Y = m->ey;
	struct k3_cpu_job jobs[3];

	jobs[0] = MXJOB(sp->w1_packed, sp->w1_scale, I, lat, gx + (size_t)first * lat, lat, n,
			g + (size_t)first * I, I);
	jobs[1] = MXJOB(sp->w3_packed, sp->w3_scale, I, lat, gx + (size_t)first * lat, lat, n,
			u + (size_t)first * I, I);
	jobs[2] = MXJOB(sp->w2_packed, sp->w2_scale, lat, I, g + (size_t)first * I, I, n,
			Y + (size_t)first * lat, lat);
	k3_cpu_linear_multi(&m->ctx, jobs, 2);
	for (uint32_t r = first; r < first + n; r++)
		cpu_situ_rows(m, g + (size_t)r * I, u + (size_t)r * I, I);
	k3_cpu_linear_multi(&m->ctx, jobs + 2, 1);
}

/* Gathers the not yet computed slots of expert e (z = Wdown x rows) into
 * gx rows from m->r_rows on; returns how many. */
static uint32_t gather_expert(k3_prov_model *m, const uint32_t *ids, size_t TK, uint32_t e,
			      const float *z)
{
	uint32_t lat = m->cfg.latent, K = m->cfg.top_k, rows = m->r_rows, n = 0;
	size_t W = m->wide;

	for (size_t j = 0; j < TK; j++) {
		if (m->edone[j] || ids[j] != e)
			continue;
		m->edone[j] = 1;
		m->eslot[j] = rows + n;
		memcpy(m->ex + (size_t)(rows + n) * lat, z + (j / K) * W, lat * sizeof(float));
		n++;
	}
	return n;
}

/* The end of a routed call: out[T][D] += Wup(RMSNorm(sum_k w[t][k] *
 * Y[row_of[t][k]])), the sum in route order k = 0..K-1; with `partial`,
 * over the slots computed so far only (edone), for routed_partial. Uses
 * s[1] and s[2]: s[0] holds the routed call's down projection. */
static void routed_sum(k3_prov_model *m, const struct cpu_layer *L, uint32_t T,
		       const float *weights, float *out, bool partial)
{
	const struct k3_prov_config *c = &m->cfg;
	uint32_t D = c->hidden, lat = c->latent, K = c->top_k;
	size_t W = m->wide;
	float *ysum = m->s[1], *Y = m->ey;
	const uint32_t *row_of = m->eslot;

	for (uint32_t t = 0; t < T; t++) {
		float *ys = ysum + t * W;
		bool first = true;
		for (uint32_t k = 0; k < K; k++) {
			if (partial && !m->edone[(size_t)t * K + k])
				continue;
			const float *y = Y + (size_t)row_of[(size_t)t * K + k] * lat;
			float wk = weights[(size_t)t * K + k];
			if (first)
				for (uint32_t i = 0; i < lat; i++)
					ys[i] = wk * y[i];
			else
				for (uint32_t i = 0; i < lat; i++)
					ys[i] += wk * y[i];
			first = false;
		}
		if (first)   /* partial, nothing computed yet: RMSNorm(0) = 0 */
			memset(ys, 0, lat * sizeof(float));
		cpu_rmsnorm(m, ys, L->lnorm, lat, c->rms_eps, ys);
	}
	float *r = m->s[2];
	k3_cpu_linear(&m->ctx, &L->lup, ysum, W, T, r, W);
	for (uint32_t t = 0; t < T; t++)
		cpu_store(out + (size_t)t * D, r + t * W, D, K3_PROV_OUT_ACCUMULATE);
}

int cpu_routed_experts(k3_prov_model *m, uint32_t layer, const float *x, uint32_t T,
		       const uint32_t *ids, const float *weights,
		       const struct k3_prov_expert *experts, float *out,
		       struct k3_prov_status *st)
{
	int rc = routed_check(m, layer, T, ids, experts, st);
	if (rc)
		return rc;
	const struct cpu_layer *L = &m->layers[layer];
	const struct k3_prov_config *c = &m->cfg;
	uint32_t D = c->hidden, lat = c->latent, I = c->moe_inter, K = c->top_k;
	size_t W = m->wide, TK = (size_t)T * K;
	float *z = m->s[0];
	k3_cpu_linear(&m->ctx, &L->ldown, x, D, T, z, W);

	/* Group the T*K slots by expert so each expert's weights stream once
	 * per call: gather the inputs of its slots (group order), run all
	 * experts' W1/W3 as one parallel region, SiTU, then all W2. The
	 * matmuls are batch invariant, so a slot's output does not depend on
	 * its companions. row_of[slot] = the slot's row in the gathered order. */
	float *gx = m->ex, *g = m->eg, *u = m->eu, *Y = m->ey;
	struct k3_cpu_job *jobs = m->ejobs;
	uint32_t ng = 0, rows = 0;
	m->r_open = false;
	m->r_rows = 0;
	memset(m->edone, 0, TK);
	for (size_t i = 0; i < TK; i++) {
		if (m->edone[i])
			continue;
		uint32_t first = rows;
		m->r_rows = rows;
		rows += gather_expert(m, ids, TK, ids[i], z);
		const struct k3_prov_expert *sp = &experts[i];
		uint32_t n = rows - first;
		jobs[2 * ng] = MXJOB(sp->w1_packed, sp->w1_scale, I, lat, gx + (size_t)first * lat,
				     lat, n, g + (size_t)first * I, I);
		jobs[2 * ng + 1] = MXJOB(sp->w3_packed, sp->w3_scale, I, lat, gx + (size_t)first * lat,
					 lat, n, u + (size_t)first * I, I);
		/* the W2 job of this group, kept past the W1/W3 pairs */
		jobs[2 * TK + ng] = MXJOB(sp->w2_packed, sp->w2_scale, lat, I, g + (size_t)first * I,
					  I, n, Y + (size_t)first * lat, lat);
		ng++;
	}
	k3_cpu_linear_multi(&m->ctx, jobs, 2 * ng);
	for (uint32_t r = 0; r < rows; r++)
		cpu_situ_rows(m, g + (size_t)r * I, u + (size_t)r * I, I);
	k3_cpu_linear_multi(&m->ctx, jobs + 2 * TK, ng);
	routed_sum(m, L, T, weights, out, false);
	return 0;
}

int cpu_routed_begin(k3_prov_model *m, uint32_t layer, const float *x, uint32_t T,
		     const uint32_t *ids, struct k3_prov_status *st)
{
	int rc = routed_check(m, layer, T, ids, NULL, st);
	if (rc)
		return rc;
	const struct cpu_layer *L = &m->layers[layer];
	k3_cpu_linear(&m->ctx, &L->ldown, x, m->cfg.hidden, T, m->s[0], m->wide);
	memset(m->edone, 0, (size_t)T * m->cfg.top_k);
	m->r_ids = ids;
	m->r_layer = layer;
	m->r_T = T;
	m->r_rows = 0;
	m->r_open = true;
	return 0;
}

int cpu_routed_expert(k3_prov_model *m, uint32_t layer, uint32_t expert,
		      const struct k3_prov_expert *sp, struct k3_prov_status *st)
{
	if (!m->r_open || layer != m->r_layer)
		return cpu_fail(st, -EINVAL, "layer %u: routed_expert outside routed_begin..end", layer);
	if (!sp->w1_packed || !sp->w1_scale || !sp->w2_packed || !sp->w2_scale ||
	    !sp->w3_packed || !sp->w3_scale)
		return cpu_fail(st, -EINVAL, "layer %u: expert %u has no span", layer, expert);
	uint32_t first = m->r_rows;
	uint32_t n = gather_expert(m, m->r_ids, (size_t)m->r_T * m->cfg.top_k, expert, m->s[0]);
	if (n == 0)
		return cpu_fail(st, -EINVAL, "layer %u: expert %u has no slot left in this call",
				layer, expert);
	m->r_rows += n;
	expert_rows(m, sp, first, n);
	return 0;
}

int cpu_routed_end(k3_prov_model *m, uint32_t layer, const float *weights, float *out,
		   struct k3_prov_status *st)
{
	if (!m->r_open || layer != m->r_layer)
		return cpu_fail(st, -EINVAL, "layer %u: routed_end without routed_begin", layer);
	m->r_open = false;
	if (!m->layers[layer].bound)
		return cpu_fail(st, -EINVAL, "layer %u was unbound inside its routed call", layer);
	size_t TK = (size_t)m->r_T * m->cfg.top_k;
	for (size_t j = 0; j < TK; j++)
		if (!m->edone[j])
			return cpu_fail(st, -EINVAL, "layer %u: expert %u (slot %zu) was not computed",
					layer, m->r_ids[j], j);
	routed_sum(m, &m->layers[layer], m->r_T, weights, out, false);
	return 0;
}

int cpu_routed_partial(k3_prov_model *m, uint32_t layer, const float *weights,
		       float *out, struct k3_prov_status *st)
{
	if (!m->r_open || layer != m->r_layer)
		return cpu_fail(st, -EINVAL, "layer %u: routed_partial outside routed_begin..end",
				layer);
	routed_sum(m, &m->layers[layer], m->r_T, weights, out, true);
	return 0;
}

int cpu_mlp(k3_prov_model *m, uint32_t layer, const float *x, uint32_t T,
	    float *out, struct k3_prov_status *st)
{
	int rc = cpu_check_T(m, T, st);
	if (!rc)
		rc = cpu_check_layer(m, layer, 0, 0, st);
	if (rc)
		return rc;
	const struct cpu_layer *L = &m->layers[layer];
	uint32_t D = m->cfg.hidden, I = L->mg.rows;
	size_t W = m->wide;
	float *g = m->s[0], *u = m->s[1], *y = m->s[2];
	const struct k3_cpu_job gu[2] = { JOB(&L->mg, x, D, T, g, W), JOB(&L->mu, x, D, T, u, W) };
	k3_cpu_linear_multi(&m->ctx, gu, 2);
	for (uint32_t t = 0; t < T; t++)
		cpu_situ_rows(m, g + t * W, u + t * W, I);
	k3_cpu_linear(&m->ctx, &L->md, g, W, T, y, W);
	for (uint32_t t = 0; t < T; t++)
		memcpy(out + (size_t)t * D, y + t * W, D * sizeof(float));
	return 0;
}

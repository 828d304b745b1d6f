/*
 * engine_moe.c - a MoE layer of the pass (engine.h): the router over the
 * pass's rows, the routed experts for the union of their ids (grouped to
 * fit a RAM cache, split by residency with a VRAM tier), the shared
 * expert, the routes copied into each part's outputs, and the router
 * lookahead that lets the store read the next layer's experts early.
 */
#include "engine/engine_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* A fresh mark for e->stamp: experts stamped with it were counted by the
 * current pass. */
static void stamp_next(struct k3_engine *e)
{
	e->stamp_gen++;
	if (e->stamp_gen == 0) {   /* wrapped: forget every old mark */
		memset(e->stamp, 0, e->cfg.n_experts * sizeof(*e->stamp));
		e->stamp_gen = 1;
	}
}

/* End of the group of positions starting at t0 whose distinct experts fit
 * the source (cap = max_experts; 0 = no limit): one group = the whole
 * chunk unless the cap binds. *n_distinct = the group's distinct experts. */
static uint32_t group_end(struct k3_engine *e, uint32_t t0, uint32_t n, uint32_t *n_distinct)
{
	uint32_t K = e->K, cap = e->src.max_experts, t1 = t0, distinct = 0;

	stamp_next(e);
	while (t1 < n) {
		uint32_t add = 0;
		for (uint32_t k = 0; k < K; k++) {
			uint32_t id = e->ids[(size_t)t1 * K + k];
			if (id < e->cfg.n_experts && e->stamp[id] != e->stamp_gen) {
				e->stamp[id] = e->stamp_gen;
				add++;
			}
		}
		/* A position that alone exceeds cap still goes: the source
		 * refuses it with its own clear error. */
		if (cap && t1 > t0 && distinct + add > cap)
			break;
		distinct += add;
		t1++;
	}
	*n_distinct = distinct;
	return t1;
}

/* Router engine_lookahead (engine.h, prefetch) for MoE layer `next`: its router
 * on the current residual pool[0..nB] (with pool[nB] replaced by `last`
 * when not NULL), AttnRes-mixed and normed with that layer's weights (the
 * layers in between are not run); at most `per` guesses per position.
 * Called after each MoE layer for the next one, after the embedding for
 * the first one (whose reads then overlap the dense layers before it),
 * and by partial_lookahead. Uses e->z and e->h as scratch (both are
 * rewritten before their next use) and never touches e->ids / e->w / e->x.
 * Failures only lose the guess. */
void engine_lookahead(struct k3_engine *e, uint32_t next, uint32_t nB, uint32_t n,
		      const float *last, uint32_t per)
{
	const struct k3_provider *p = e->prov;
	struct k3_prov_status st = { 0 };
	uint32_t K = e->K;
	size_t ng = 0;

	if (e->src.prefetch_max && e->src.prefetch_max < per)
		per = e->src.prefetch_max;
	if (per > K)
		per = K;
	for (uint32_t j = 0; j <= nB; j++)
		e->cands[j] = e->pool[j];
	if (last)
		e->cands[nB] = last;
	if (p->attnres_mix(e->pm, K3_PROV_MIX_MLP, next, e->cands, nB + 1, n, e->z, &st) ||
	    p->ffn_norm(e->pm, next, e->z, n, e->h, &st) ||
	    p->router(e->pm, next, e->h, n, e->pids, e->pw, &st))
		return;
	/* Rank-major across positions: every position's first choice, then
	 * every second choice... each expert once. */
	stamp_next(e);
	for (uint32_t k = 0; k < per; k++)
		for (uint32_t t = 0; t < n; t++) {
			uint32_t id = e->pids[(size_t)t * K + k];
			if (id < e->cfg.n_experts && e->stamp[id] != e->stamp_gen) {
				e->stamp[id] = e->stamp_gen;
				e->guess_rank[ng] = k;
				e->guess[ng++] = id;
			}
		}
	if (ng)
		e->src.prefetch(e->src.ctx, next, e->guess, e->guess_rank, ng, n, last != NULL);
}

/* Guesses per position of the partial engine_lookahead (ranks 0 and 1): enough
 * to keep the readers busy through the end of the layer's compute, where
 * the lookahead after the layer, on the whole residual, adds the rest.
 * Reading more of the partial guesses read more wrong ones for no gain
 * (docs/store.md, "Prefetch": the partial lookahead). */
enum { PARTIAL_GUESSES = 2 };

/* The partial lookahead of MoE layer l (routed call open, its shared
 * experts in e->mb): the next MoE layer's lookahead on P + shared +
 * the routed experts computed so far. Failures only lose the guess. */
static void partial_lookahead(struct k3_engine *e, uint32_t l, uint32_t n)
{
	const struct k3_provider *p = e->prov;
	struct k3_prov_status st = { 0 };
	size_t nd = (size_t)n * e->D;

	memcpy(e->part, e->pool[e->cur_nB], nd * sizeof(float));
	if (p->add(e->pm, e->part, e->mb, nd, &st) == 0 &&
	    p->routed_partial(e->pm, l, e->w, e->part, &st) == 0)
		engine_lookahead(e, e->next_moe, e->cur_nB, n, e->part, PARTIAL_GUESSES);
}

/* The routed experts of positions t0..t1 (one group) one by one as the
 * source hands them out, hits first and misses as their reads land
 * (request_layer done for them): each expert runs as soon as its span is
 * readable; the provider sums in route order at the end, so the result
 * does not depend on the arrival order. partial: once half of them ran
 * and the rest are still being read, the partial lookahead queues the
 * next layer's likeliest reads in that wait (whole-chunk groups only). */
static int routed_group_pieces(struct k3_engine *e, uint32_t l, uint32_t t0, uint32_t t1,
			       uint32_t distinct, bool partial, struct k3_err *err)
{
	const struct k3_provider *p = e->prov;
	struct k3_prov_status st = { 0 };
	size_t off = (size_t)t0 * e->K;
	uint32_t id, taken = 0;
	struct k3_prov_expert sp;
	int rc = p->routed_begin(e->pm, l, e->x + (size_t)t0 * e->D, t1 - t0, e->ids + off, &st);

	while (rc == 0) {
		if (partial && 2 * taken >= distinct && e->src.would_block(e->src.ctx, l)) {
			partial = false;
			partial_lookahead(e, l, t1 - t0);
		}
		int got = e->src.await_expert(e->src.ctx, l, &id, &sp, err);
		if (got < 0)
			return got;   /* the source released the request */
		if (got == 0)
			break;
		rc = p->routed_expert(e->pm, l, id, &sp, &st);
		taken++;
	}
	if (rc == 0)
		rc = p->routed_end(e->pm, l, e->w + off, e->mb + (size_t)t0 * e->D, &st);
	e->src.release_layer(e->src.ctx, l);
	return rc ? prov_err(e, err, rc, &st) : 0;
}

/* Layer-wide expert source: the first group's experts are requested
 * (request_layer, when the source has it) before the shared experts run,
 * so their reads overlap that compute; then the routed experts in
 * consecutive groups of positions that each fit the source (the whole
 * chunk unless its distinct experts exceed the cache), each group's
 * experts computed as they arrive when the source and the provider can
 * (routed_group_pieces), else once all of them are in.
 * e->ids / e->w hold the real routing. */
static int routed_layer(struct k3_engine *e, uint32_t l, uint32_t n, struct k3_err *err)
{
	const struct k3_provider *p = e->prov;
	struct k3_prov_status st = { 0 };
	uint32_t K = e->K, D = e->D;
	uint32_t distinct;
	uint32_t t0 = 0, t1 = group_end(e, 0, n, &distinct);
	bool requested = false;
	bool pieces = e->src.request_layer && e->src.await_expert && e->prov_pieces;
	int rc;

	if (e->src.request_layer) {
		rc = e->src.request_layer(e->src.ctx, l, e->ids, (size_t)t1 * K, err);
		if (rc)
			return rc;
		requested = true;
	}
	rc = p->mlp(e->pm, l, e->x, n, e->mb, &st);
	if (rc) {
		if (requested)
			e->src.release_layer(e->src.ctx, l);
		return prov_err(e, err, rc, &st);
	}
	for (;;) {
		size_t off = (size_t)t0 * K, cnt = (size_t)(t1 - t0) * K;
		if (pieces) {
			if (!requested &&
			    (rc = e->src.request_layer(e->src.ctx, l, e->ids + off, cnt, err)) != 0)
				return rc;
			bool partial = t0 == 0 && t1 == n && e->prov_partial && e->src.would_block &&
				       e->src.prefetch && e->next_moe != UINT32_MAX &&
				       !streamed(e, e->next_moe);
			rc = routed_group_pieces(e, l, t0, t1, distinct, partial, err);
			if (rc)
				return rc;
		} else {
			/* after request_layer the same ids only wait */
			rc = e->src.acquire_layer(e->src.ctx, l, e->ids + off, cnt, e->spans + off, err);
			if (rc)
				return rc;
			rc = p->routed_experts(e->pm, l, e->x + (size_t)t0 * D, t1 - t0, e->ids + off,
					       e->w + off, e->spans + off, e->mb + (size_t)t0 * D, &st);
			e->src.release_layer(e->src.ctx, l);
			if (rc)
				return prov_err(e, err, rc, &st);
		}
		requested = false;
		t0 = t1;
		if (t0 >= n)
			return 0;
		t1 = group_end(e, t0, n, &distinct);
	}
}

/* Computes the misses tier_miss[0..nm) of a tiered routed call from
 * spans of the source: handed out as they arrive (after request_layer),
 * all at once (acquire_layer) or one by one (acquire). */
static int tiered_misses(struct k3_engine *e, uint32_t l, size_t nm, bool requested,
			 struct k3_err *err)
{
	const struct k3_provider *p = e->prov;
	struct k3_prov_status st = { 0 };
	struct k3_prov_expert sp;
	int rc = 0;

	if (requested && e->src.await_expert) {
		uint32_t id;
		for (;;) {
			int got = e->src.await_expert(e->src.ctx, l, &id, &sp, err);
			if (got < 0)
				return got;   /* the source released the request */
			if (got == 0)
				break;
			if ((rc = p->routed_expert(e->pm, l, id, &sp, &st)) != 0)
				break;
		}
		e->src.release_layer(e->src.ctx, l);
	} else if (e->src.acquire_layer) {
		rc = e->src.acquire_layer(e->src.ctx, l, e->tier_miss, nm, e->spans, err);
		if (rc)
			return rc;
		for (size_t i = 0; i < nm && rc == 0; i++)
			rc = p->routed_expert(e->pm, l, e->tier_miss[i], &e->spans[i], &st);
		e->src.release_layer(e->src.ctx, l);
	} else {
		for (size_t i = 0; i < nm && rc == 0; i++) {
			rc = e->src.acquire(e->src.ctx, l, e->tier_miss[i], &sp, err);
			if (rc)
				return rc;
			rc = p->routed_expert(e->pm, l, e->tier_miss[i], &sp, &st);
			e->src.release(e->src.ctx, l, e->tier_miss[i]);
		}
	}
	return rc ? prov_err(e, err, rc, &st) : 0;
}

/* The routed path of MoE layer l with a provider that holds experts on its
 * device (experts_resident, docs/providers.md): the source reads only the
 * experts the provider lacks, their reads start before the shared experts
 * run, and the resident ones are computed (NULL span) while the misses are
 * read. Returns 1, having done nothing but the residency query, when the
 * misses exceed what one acquire of the source may hold (the caller then
 * takes every span from the source). */
static int routed_tiered(struct k3_engine *e, uint32_t l, uint32_t n, struct k3_err *err)
{
	const struct k3_provider *p = e->prov;
	struct k3_prov_status st = { 0 };
	size_t nd = 0, nm = 0;
	bool requested = false;
	int rc;

	stamp_next(e);
	for (size_t i = 0; i < (size_t)n * e->K; i++) {
		uint32_t id = e->ids[i];
		if (id < e->cfg.n_experts && e->stamp[id] != e->stamp_gen) {
			e->stamp[id] = e->stamp_gen;
			e->tier_ids[nd++] = id;
		}
	}
	PCALL(p->experts_resident(e->pm, l, e->tier_ids, nd, e->tier_res, &st));
	for (size_t i = 0; i < nd; i++)
		if (!e->tier_res[i])
			e->tier_miss[nm++] = e->tier_ids[i];
	if (e->src.acquire_layer && e->src.max_experts && nm > e->src.max_experts)
		return 1;
	if (nm && e->src.request_layer) {
		rc = e->src.request_layer(e->src.ctx, l, e->tier_miss, nm, err);
		if (rc)
			return rc;
		requested = true;
	}
	rc = p->mlp(e->pm, l, e->x, n, e->mb, &st);
	if (rc == 0)
		rc = p->routed_begin(e->pm, l, e->x, n, e->ids, &st);
	for (size_t i = 0; i < nd && rc == 0; i++)
		if (e->tier_res[i])
			rc = p->routed_expert(e->pm, l, e->tier_ids[i], NULL, &st);
	if (rc) {
		if (requested)
			e->src.release_layer(e->src.ctx, l);
		return prov_err(e, err, rc, &st);
	}
	if (nm && (rc = tiered_misses(e, l, nm, requested, err)) != 0)
		return rc;
	PCALL(p->routed_end(e->pm, l, e->w, e->mb, &st));
	return 0;
}

/* The routed path of MoE layer l for n positions: router, expert spans
 * from the source, shared experts, routed experts, into e->mb. */
int engine_moe_layer(struct k3_engine *e, uint32_t l, uint32_t n, const struct pass_part *pp,
		     uint32_t np, struct k3_err *err)
{
	const struct k3_provider *p = e->prov;
	struct k3_prov_status st = { 0 };
	uint32_t K = e->K, mi = (uint32_t)e->moe_index[l];
	int rc;

	PCALL(p->router(e->pm, l, e->x, n, e->ids, e->w, &st));
	if (e->prov_resident) {
		rc = routed_tiered(e, l, n, err);
		if (rc < 0)
			return rc;
		if (rc == 0)
			goto routes;
	}
	if (e->src.acquire_layer) {
		rc = routed_layer(e, l, n, err);
		if (rc)
			return rc;
		goto routes;
	}
	size_t got = 0;
	for (; got < (size_t)n * K; got++) {
		rc = e->src.acquire(e->src.ctx, l, e->ids[got], &e->spans[got], err);
		if (rc)
			break;
	}
	if (!rc) {
		rc = p->mlp(e->pm, l, e->x, n, e->mb, &st);
		if (!rc)
			rc = p->routed_experts(e->pm, l, e->x, n, e->ids, e->w, e->spans, e->mb, &st);
		if (rc)
			prov_err(e, err, rc, &st);
	}
	for (size_t i = 0; i < got; i++)
		e->src.release(e->src.ctx, l, e->ids[i]);
	if (rc)
		return rc;
routes:
	for (uint32_t i = 0; i < np; i++) {
		const struct k3_engine_out *out = pp[i].out;
		if (!out || (!out->route_ids && !out->route_weights))
			continue;
		for (uint32_t t = 0; t < pp[i].n; t++) {
			size_t dst = ((size_t)(pp[i].pos0 + t) * e->n_moe + mi) * K;
			size_t src = (size_t)(pp[i].row0 + t) * K;
			if (out->route_ids)
				memcpy(out->route_ids + dst, e->ids + src, K * sizeof(uint32_t));
			if (out->route_weights)
				memcpy(out->route_weights + dst, e->w + src, K * sizeof(float));
		}
	}
	return 0;
}

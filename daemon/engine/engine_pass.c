/*
 * engine_pass.c - one pass of the layer program (engine.h): the spine's
 * streamed layers bound and released around their ops, the embedding,
 * attention per sequence over its own rows, the FFN over every row, the
 * taps and logits per part; k3_engine_forward (chunks of one sequence)
 * and k3_engine_forward_batch (parts of several sequences in one pass),
 * and the scratch a pass costs.
 */
#include "engine/engine_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* ---- the streamed spine (engine.h, struct k3_spine_source) ---- */

static bool head_streamed(const struct k3_engine *e)
{
	return e->has_spine && !e->spine.head_resident;
}

/* Unbinds and releases the streamed layer bound now, if any. */
void engine_spine_unbind(struct k3_engine *e)
{
	struct k3_prov_status st = { 0 };

	if (e->bound == UINT32_MAX)
		return;
	(void)e->prov->bind_layer(e->pm, e->bound, NULL, &st);   /* unbinding cannot fail */
	e->spine.release_layer(e->spine.ctx, e->bound);
	e->bound = UINT32_MAX;
}

/* Makes layer l readable for the provider: acquires and binds it when it
 * streams (one streamed layer is bound at a time), nothing otherwise. */
int engine_spine_bind(struct k3_engine *e, uint32_t l, struct k3_err *err)
{
	struct k3_prov_status st = { 0 };
	struct k3_prov_layer_weights w;
	int rc;

	if (!streamed(e, l) || e->bound == l)
		return 0;
	engine_spine_unbind(e);
	memset(&w, 0, sizeof(w));
	rc = e->spine.acquire_layer(e->spine.ctx, l, &w, err);
	if (rc)
		return rc;
	rc = e->prov->bind_layer(e->pm, l, &w, &st);
	if (rc) {
		e->spine.release_layer(e->spine.ctx, l);
		return prov_err(e, err, rc, &st);
	}
	e->bound = l;
	return 0;
}

static void spine_unbind_head(struct k3_engine *e)
{
	struct k3_prov_status st = { 0 };

	if (!e->head_bound)
		return;
	(void)e->prov->bind_head(e->pm, NULL, &st);
	e->spine.release_head(e->spine.ctx);
	e->head_bound = false;
}

static int spine_bind_head(struct k3_engine *e, struct k3_err *err)
{
	struct k3_prov_status st = { 0 };
	struct k3_prov_weights w;
	int rc;

	if (!head_streamed(e) || e->head_bound)
		return 0;
	memset(&w, 0, sizeof(w));
	w.struct_size = sizeof(w);
	w.n_layers = e->cfg.n_layers;
	w.layers = e->lw;
	rc = e->spine.acquire_head(e->spine.ctx, &w, err);
	if (rc)
		return rc;
	rc = e->prov->bind_head(e->pm, &w, &st);
	if (rc) {
		e->spine.release_head(e->spine.ctx);
		return prov_err(e, err, rc, &st);
	}
	e->head_bound = true;
	return 0;
}

/* pool[0] := the embedding of the chunk's tokens: from the mmapped table,
 * or (spine source) from its rows gathered by the source. */
static int embed_chunk(struct k3_engine *e, const int32_t *ids, uint32_t n, struct k3_err *err)
{
	const struct k3_provider *p = e->prov;
	struct k3_prov_status st = { 0 };
	int rc;

	if (!e->has_spine)
		PCALL(p->embed(e->pm, ids, n, e->pool[0], &st));
	else if ((rc = e->spine.embed_rows(e->spine.ctx, ids, n, e->rows, err)) != 0)
		return rc;
	else
		PCALL(p->embed_rows(e->pm, e->rows, n, e->pool[0], &st));
	return 0;
}

/* Target-row capture after layer l (k3_engine_set_taps): the residual
 * stream as a plain residual model would carry it, B[0] + ... + B[nB-1]
 * + P (the embedding, the finished AttnRes blocks and the running sum;
 * vLLM's "prefix_sum + hidden_states", docs/text-and-draft.md §4.4), summed
 * in that order by the provider into taps[pos0 + t][tap][D]. */
static int capture_tap(struct k3_engine *e, uint32_t l, uint32_t nB, const struct pass_part *pp,
		       struct k3_prov_status *st)
{
	uint32_t D = e->D, ti = (uint32_t)e->tap_index[l];

	for (uint32_t t = 0; t < pp->n; t++) {
		float *dst = pp->taps + ((size_t)(pp->pos0 + t) * e->n_taps + ti) * D;
		size_t row = (size_t)(pp->row0 + t) * D;
		memcpy(dst, e->pool[0] + row, D * sizeof(float));
		for (uint32_t j = 1; j <= nB; j++) {
			int rc = e->prov->add(e->pm, dst, e->pool[j] + row, D, st);
			if (rc)
				return rc;
		}
	}
	return 0;
}

/* Whether part pp wants logits from this pass. */
static bool part_logits(const struct pass_part *pp)
{
	const struct k3_engine_out *out = pp->out;

	return out && out->logits && (out->logits_mode == K3_ENGINE_LOGITS_ALL ||
				      (out->logits_mode == K3_ENGINE_LOGITS_LAST && pp->last));
}

/* Output AttnRes, final norm and lm_head (spec §10) for every part that
 * wants logits: ALL parts straight into their buffers; the last rows of
 * the LAST parts gathered into e->z and run as one product (the head read
 * once per pass), then copied out (one part: straight into its buffer). */
static int pass_logits(struct k3_engine *e, uint32_t nB, const struct pass_part *pp, uint32_t np,
		       struct k3_err *err)
{
	const struct k3_provider *p = e->prov;
	struct k3_prov_status st = { 0 };
	uint32_t D = e->D, V = e->V, m = 0, only = 0;
	int rc;

	for (uint32_t i = 0; i < np; i++) {
		if (!part_logits(&pp[i]) || pp[i].out->logits_mode != K3_ENGINE_LOGITS_ALL)
			continue;
		for (uint32_t j = 0; j <= nB; j++)
			e->cands[j] = e->pool[j] + (size_t)pp[i].row0 * D;
		PCALL(p->attnres_mix(e->pm, K3_PROV_MIX_OUTPUT, 0, e->cands, nB + 1, pp[i].n, e->z, &st));
		PCALL(p->logits(e->pm, e->z, pp[i].n, pp[i].out->logits + (size_t)pp[i].pos0 * V, &st));
	}
	for (uint32_t i = 0; i < np; i++) {
		if (!part_logits(&pp[i]) || pp[i].out->logits_mode != K3_ENGINE_LOGITS_LAST)
			continue;
		for (uint32_t j = 0; j <= nB; j++)
			e->cands[j] = e->pool[j] + (size_t)(pp[i].row0 + pp[i].n - 1) * D;
		PCALL(p->attnres_mix(e->pm, K3_PROV_MIX_OUTPUT, 0, e->cands, nB + 1, 1,
				     e->z + (size_t)m * D, &st));
		only = i;
		m++;
	}
	if (m == 1)
		PCALL(p->logits(e->pm, e->z, 1, pp[only].out->logits, &st));
	if (m <= 1)
		return 0;
	PCALL(p->logits(e->pm, e->z, m, e->blog, &st));
	m = 0;
	for (uint32_t i = 0; i < np; i++)
		if (part_logits(&pp[i]) && pp[i].out->logits_mode == K3_ENGINE_LOGITS_LAST)
			memcpy(pp[i].out->logits, e->blog + (size_t)m++ * V, V * sizeof(float));
	return 0;
}

/* The attention sub-layer l of every part, each over its own rows and its
 * own state: P := a or P + a (flags). verify = a verification pass (one
 * part). */
static int pass_attention(struct k3_engine *e, uint32_t l, const float *hin, float *P,
			  uint32_t flags, const struct pass_part *pp, uint32_t np, bool verify,
			  struct k3_err *err)
{
	const struct k3_provider *p = e->prov;
	struct k3_prov_status st = { 0 };
	int rc;

	for (uint32_t i = 0; i < np; i++) {
		struct k3_engine_seq *s = pp[i].s;
		size_t off = (size_t)pp[i].row0 * e->D;
		uint32_t n = pp[i].n;

		if (e->cfg.attn_kind[l] == K3_PROV_ATTN_KDA) {
			if (verify && e->prov_verify)
				PCALL(p->kda_verify(e->pm, l, hin + off, n, s->kda[l], e->vrec[l],
						    P + off, flags, &st));
			else if (verify)
				PCALL(engine_verify_kda_snapshot(e, s, l, hin + off, n, P + off, flags, &st));
			else
				PCALL(p->kda(e->pm, l, hin + off, n, s->kda[l], P + off, flags, &st));
		} else {
			PCALL(p->mla(e->pm, l, hin + off, n, s->mla[l], P + off, flags, &st));
		}
	}
	return 0;
}

/*
 * One pass of n rows: the parts' rows end to end (ids[n]), each part one
 * sequence's next positions (struct pass_part). Everything but attention
 * runs over all n rows at once: a streamed layer is bound once, each
 * routed expert acquired once for the union of the rows (the kernels are
 * row-invariant, so a row's result does not depend on its neighbours).
 * verify = a verification pass (one part; KDA states are not advanced,
 * see k3_engine_verify). With a spine source, each streamed layer is
 * bound right before its ops and released right after them (the next
 * one, when the router lookahead needs its weights, right after that),
 * the next one's read having been started when this one started
 * (run_chunk releases what is still bound when a layer fails).
 */
static int run_chunk_layers(struct k3_engine *e, const int32_t *ids, uint32_t n,
			    const struct pass_part *pp, uint32_t np, bool verify,
			    struct k3_err *err)
{
	const struct k3_provider *p = e->prov;
	struct k3_prov_status st = { 0 };
	uint32_t S = e->cfg.attn_res_block, nB = 0, L = e->cfg.n_layers;
	size_t nd = (size_t)n * e->D;
	bool logits = false;
	int rc;

	for (uint32_t i = 0; i < np; i++)
		logits |= part_logits(&pp[i]);
	if (e->has_spine)
		e->spine.begin_pass(e->spine.ctx, logits);
	rc = embed_chunk(e, ids, n, err);
	if (rc)
		return rc;
	/* A streamed first MoE layer is not readable yet: no guess for it. */
	if (e->src.prefetch && e->n_moe && !streamed(e, e->moe_layers[0]))
		engine_lookahead(e, e->moe_layers[0], 0, n, NULL, e->K);
	for (uint32_t l = 0; l < L; l++) {
		const float *hin = e->pool[0];
		/* Cancellation is honoured between layers: a K3 layer step is the
		 * longest the caller waits (the sequences are poisoned after this). */
		if (e->cancel && atomic_load(e->cancel))
			return k3_err_set(err, -ECANCELED, "cancelled before layer %u", l);
		if (streamed(e, l + 1))
			e->spine.prefetch_layer(e->spine.ctx, l + 1);
		else if (l + 1 == L && logits && head_streamed(e))
			e->spine.prefetch_layer(e->spine.ctx, L);
		if ((rc = engine_spine_bind(e, l, err)) != 0)
			return rc;
		/* 1) attention input: AR over B and P, or the embedding at l = 0 */
		if (nB > 0) {
			for (uint32_t j = 0; j <= nB; j++)
				e->cands[j] = e->pool[j];
			PCALL(p->attnres_mix(e->pm, K3_PROV_MIX_ATTN, l, e->cands, nB + 1, n, e->h, &st));
			hin = e->h;
		}
		/* 2) block start: snapshot P (it becomes B[nB]) and restart P */
		uint32_t flags = K3_PROV_OUT_ACCUMULATE;
		if (l % S == 0) {
			nB++;
			flags = 0;
		}
		float *P = e->pool[nB];
		/* 3) attention sub-layer, per sequence */
		if ((rc = pass_attention(e, l, hin, P, flags, pp, np, verify, err)) != 0)
			return rc;
		/* 4) FFN input: AR over the new B and P */
		for (uint32_t j = 0; j <= nB; j++)
			e->cands[j] = e->pool[j];
		PCALL(p->attnres_mix(e->pm, K3_PROV_MIX_MLP, l, e->cands, nB + 1, n, e->h, &st));
		PCALL(p->ffn_norm(e->pm, l, e->h, n, e->x, &st));
		if (e->cfg.ffn_kind[l] == K3_PROV_FFN_MOE) {
			e->cur_nB = nB;
			e->next_moe = (uint32_t)e->moe_index[l] + 1 < e->n_moe ?
				      e->moe_layers[e->moe_index[l] + 1] : UINT32_MAX;
			rc = engine_moe_layer(e, l, n, pp, np, err);
			if (rc)
				return rc;
		} else {
			PCALL(p->mlp(e->pm, l, e->x, n, e->mb, &st));
		}
		PCALL(p->add(e->pm, P, e->mb, nd, &st));
		for (uint32_t i = 0; i < np && e->tap_index[l] >= 0; i++)
			if (pp[i].taps)
				PCALL(capture_tap(e, l, nB, &pp[i], &st));
		if (streamed(e, l))
			engine_spine_unbind(e);
		if (e->src.prefetch && e->cfg.ffn_kind[l] == K3_PROV_FFN_MOE &&
		    e->next_moe != UINT32_MAX) {
			/* The lookahead reads the next MoE layer's weights: bound
			 * now when it is the next layer anyway, skipped when a
			 * streamed one lies further ahead. */
			if (e->next_moe == l + 1 && (rc = engine_spine_bind(e, l + 1, err)) != 0)
				return rc;
			if (!streamed(e, e->next_moe) || e->bound == e->next_moe)
				engine_lookahead(e, e->next_moe, nB, n, NULL, e->K);
		}
	}
	if (!logits)
		return 0;
	if ((rc = spine_bind_head(e, err)) != 0)
		return rc;
	return pass_logits(e, nB, pp, np, err);
}

int engine_run_chunk(struct k3_engine *e, const int32_t *ids, uint32_t n,
		     const struct pass_part *pp, uint32_t np, bool verify, struct k3_err *err)
{
	int rc = run_chunk_layers(e, ids, n, pp, np, verify, err);

	engine_spine_unbind(e);
	spine_unbind_head(e);
	return rc;
}

/* What forward and verify check before they touch s. */
int engine_check_call(struct k3_engine *e, const struct k3_engine_seq *s, const int32_t *ids,
		      uint32_t T, struct k3_err *err)
{
	if (s->e != e)
		return k3_err_set(err, -EINVAL, "sequence belongs to another engine");
	if (s->poisoned)
		return k3_err_set(err, -EINVAL, "sequence failed earlier; start a new one");
	if (e->pending == s)
		return k3_err_set(err, -EBUSY, "sequence has a verification pending; commit it first");
	if (T == 0)
		return k3_err_set(err, -EINVAL, "forward of zero tokens");
	if ((uint64_t)s->len + T > UINT32_MAX / 2)
		return k3_err_set(err, -E2BIG, "sequence too long");
	for (uint32_t t = 0; t < T; t++)
		if (ids[t] < 0 || (uint32_t)ids[t] >= e->V)
			return k3_err_set(err, -EINVAL, "token id %d at position %u not in 0..%u",
					  ids[t], t, e->V - 1);
	return 0;
}

int k3_engine_forward(struct k3_engine *e, struct k3_engine_seq *s,
		      const int32_t *ids, uint32_t T, const struct k3_engine_out *out,
		      struct k3_err *err)
{
	int rc0 = engine_check_call(e, s, ids, T, err);
	if (rc0)
		return rc0;
	for (uint32_t done = 0; done < T;) {
		uint32_t n = T - done < e->chunk ? T - done : e->chunk;
		struct pass_part pp = { s, 0, n, done, done + n == T, out, e->tap_out };
		int rc = engine_run_chunk(e, ids + done, n, &pp, 1, false, err);
		if (rc) {
			s->poisoned = true;
			return rc;
		}
		done += n;
		s->len += n;
	}
	return 0;
}

int k3_engine_forward_batch(struct k3_engine *e, const struct k3_engine_part *parts,
			    uint32_t n_parts, struct k3_err *err)
{
	struct pass_part pp[K3_ENGINE_MAX_PARTS];
	uint32_t n = 0, n_last = 0;

	if (n_parts == 0 || n_parts > K3_ENGINE_MAX_PARTS)
		return k3_err_set(err, -EINVAL, "a batched pass holds 1..%u parts, not %u",
				  (unsigned)K3_ENGINE_MAX_PARTS, n_parts);
	for (uint32_t i = 0; i < n_parts; i++) {
		const struct k3_engine_part *q = &parts[i];
		int rc = engine_check_call(e, q->seq, q->ids, q->n, err);
		if (rc)
			return rc;
		for (uint32_t k = 0; k < i; k++)
			if (parts[k].seq == q->seq)
				return k3_err_set(err, -EINVAL, "one sequence in parts %u and %u", k, i);
		if (q->n > e->chunk - n)
			return k3_err_set(err, -E2BIG, "a batched pass of more than %u positions "
					  "(the engine's pass)", e->chunk);
		pp[i] = (struct pass_part){ q->seq, n, q->n, 0, true, q->out, q->taps };
		memcpy(e->pass_ids + n, q->ids, q->n * sizeof(*q->ids));
		n += q->n;
		n_last += part_logits(&pp[i]) && q->out->logits_mode == K3_ENGINE_LOGITS_LAST;
	}
	if (n_last > 1 && n_last > e->blog_rows) {
		float *b = realloc(e->blog, (size_t)n_last * e->V * sizeof(float));
		if (!b)
			return k3_err_set(err, -ENOMEM, "out of memory for %u rows of logits", n_last);
		e->blog = b;
		e->blog_rows = n_last;
	}
	int rc = engine_run_chunk(e, e->pass_ids, n, pp, n_parts, false, err);
	for (uint32_t i = 0; i < n_parts; i++) {
		if (rc)
			parts[i].seq->poisoned = true;
		else
			parts[i].seq->len += parts[i].n;
	}
	return rc;
}

static uint64_t max_u64(uint64_t a, uint64_t b)
{
	return a > b ? a : b;
}

uint64_t k3_engine_scratch_bytes(const struct k3_model_config *mc, uint32_t T)
{
	uint64_t D = mc->hidden_size, K = mc->num_experts_per_token ? mc->num_experts_per_token : 1;
	uint64_t S = mc->attn_res_block_size ? mc->attn_res_block_size : 1;
	uint64_t blocks = (mc->num_hidden_layers + S - 1) / S;
	uint64_t H = mc->num_attention_heads, qhd = mc->qk_nope_head_dim + mc->qk_rope_head_dim;
	/* the cpu provider's widest operand (cpu_open) */
	uint64_t wide = D;
	uint64_t w[] = { (uint64_t)mc->kda_num_heads * mc->kda_head_dim, H * qhd,
			 H * mc->v_head_dim, H * (mc->qk_nope_head_dim + mc->v_head_dim),
			 mc->intermediate_size, mc->shared_width, mc->q_lora_rank,
			 (uint64_t)mc->kv_lora_rank + mc->qk_rope_head_dim,
			 mc->routed_expert_hidden_size, mc->moe_intermediate_size, mc->num_experts };
	for (size_t i = 0; i < sizeof(w) / sizeof(w[0]); i++)
		wide = max_u64(wide, w[i]);
	uint64_t ew = max_u64(max_u64(mc->routed_expert_hidden_size, mc->moe_intermediate_size), 1);
	/* engine: the AttnRes pool, h, x, mb, z, part and the embedding rows;
	 * ids, weights, spans and the lookahead's ids, weights, guesses, ranks */
	uint64_t engine = (blocks + 1 + 6) * D * 4 + K * (4 + 4 + sizeof(struct k3_prov_expert) + 16);
	/* provider: sx, the eight wide rows s[], and per routed slot its four
	 * expert rows, its row index, three jobs and a flag (cpu_open) */
	uint64_t prov = D * 4 + 8 * wide * 4 + K * (4 * ew * 4 + 4 + 3 * 64 + 1);
	return (engine + prov) * T;
}

uint32_t k3_engine_chunk_for(const struct k3_model_config *mc, uint64_t scratch_bytes,
			     uint32_t lo, uint32_t hi)
{
	uint64_t per = k3_engine_scratch_bytes(mc, 1), t = per ? scratch_bytes / per : hi;

	return t < lo ? lo : t > hi ? hi : (uint32_t)t;
}

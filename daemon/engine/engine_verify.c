/*
 * engine_verify.c - verify and commit (engine.h, docs/engine.md "Verify
 * and commit"): the verification pass's records or snapshots, discarding
 * a failed pass, and committing the accepted prefix by replaying it.
 */
#include "engine/engine_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* The verification buffers of every layer (records, or snapshots and inputs). */
void engine_verify_free(struct k3_engine *e)
{
	for (uint32_t l = 0; l < e->cfg.n_layers; l++) {
		if (e->vrec && e->vrec[l])
			e->prov->kda_record_free(e->vrec[l]);
		if (e->vsnap && e->vsnap[l])
			e->prov->kda_state_free(e->vsnap[l]);
		if (e->vh)
			free(e->vh[l]);
	}
	free(e->vrec);
	free(e->vsnap);
	free(e->vh);
	e->vrec = NULL;
	e->vsnap = NULL;
	e->vh = NULL;
	e->vcap = 0;
}

/* The verification pass's KDA layer l without the provider's verify op:
 * the state before the pass is kept (kda_state_copy) with the layer's
 * inputs, then the real state advances over all n positions; commit puts
 * the snapshot back and reruns the accepted prefix (k3_engine_commit). */
int engine_verify_kda_snapshot(struct k3_engine *e, struct k3_engine_seq *s, uint32_t l,
			       const float *hin, uint32_t n, float *P, uint32_t flags,
			       struct k3_prov_status *st)
{
	int rc = e->prov->kda_state_copy(e->vsnap[l], s->kda[l], st);
	if (rc)
		return rc;
	e->v_layers = l + 1;         /* from here on, l's snapshot is the one to restore */
	memcpy(e->vh[l], hin, (size_t)n * e->D * sizeof(float));
	return e->prov->kda(e->pm, l, hin, n, s->kda[l], P, flags, st);
}

/* ---------------------------------------------------------------- verify / commit */

/* Verification buffers for T positions: the provider's KDA records, or
 * (without them) a state snapshot and an input buffer per KDA layer.
 * Allocated on the first pass that needs them, then kept. */
static int verify_reserve(struct k3_engine *e, uint32_t T, struct k3_err *err)
{
	const struct k3_provider *p = e->prov;
	struct k3_prov_status st = { 0 };
	uint32_t L = e->cfg.n_layers;
	int rc = 0;

	if (T <= e->vcap)
		return 0;
	if (e->vrec) {             /* records only grow: make new ones */
		for (uint32_t l = 0; l < L; l++) {
			p->kda_record_free(e->vrec[l]);
			e->vrec[l] = NULL;
		}
	}
	if (e->vh)
		for (uint32_t l = 0; l < L; l++) {
			free(e->vh[l]);
			e->vh[l] = NULL;
		}
	e->vcap = 0;
	if (e->prov_verify) {
		if (!e->vrec && !(e->vrec = calloc(L, sizeof(*e->vrec))))
			return k3_err_set(err, -ENOMEM, "out of memory");
		for (uint32_t l = 0; !rc && l < L; l++)
			if (e->cfg.attn_kind[l] == K3_PROV_ATTN_KDA)
				rc = p->kda_record_new(e->pm, l, T, &e->vrec[l], &st);
	} else {
		if ((!e->vsnap && !(e->vsnap = calloc(L, sizeof(*e->vsnap)))) ||
		    (!e->vh && !(e->vh = calloc(L, sizeof(*e->vh)))))
			return k3_err_set(err, -ENOMEM, "out of memory");
		for (uint32_t l = 0; !rc && l < L; l++) {
			if (e->cfg.attn_kind[l] != K3_PROV_ATTN_KDA)
				continue;
			if (!e->vsnap[l])
				rc = p->kda_state_new(e->pm, l, &e->vsnap[l], &st);
			if (!rc && !(e->vh[l] = malloc((size_t)T * e->D * sizeof(float))))
				rc = k3_err_set(err, -ENOMEM, "out of memory for a %u-position verification", T);
		}
	}
	if (rc)
		return err && err->code ? rc : prov_err(e, err, rc, &st);
	e->vcap = T;
	return 0;
}

/* Puts s back where the pending pass found it: MLA caches cut to s->len,
 * and without the provider's verify op the KDA snapshots of the first
 * `layers` layers restored. */
static int verify_discard(struct k3_engine *e, struct k3_engine_seq *s, uint32_t layers,
			  struct k3_err *err)
{
	struct k3_prov_status st = { 0 };

	for (uint32_t l = 0; l < e->cfg.n_layers; l++) {
		if (s->mla[l]) {
			e->prov->mla_cache_truncate(s->mla[l], s->len);
		} else if (!e->prov_verify && l < layers) {
			int rc = e->prov->kda_state_copy(s->kda[l], e->vsnap[l], &st);
			if (rc)
				return prov_err(e, err, rc, &st);
		}
	}
	return 0;
}

int k3_engine_verify(struct k3_engine *e, struct k3_engine_seq *s, const int32_t *ids,
		     uint32_t T, const struct k3_engine_out *out, struct k3_err *err)
{
	int rc = engine_check_call(e, s, ids, T, err);
	if (rc)
		return rc;
	if (e->pending)
		return k3_err_set(err, -EBUSY, "another sequence has a verification pending");
	if (T > e->chunk)
		return k3_err_set(err, -EINVAL, "verification of %u positions exceeds the engine's "
				  "%u-position pass", T, e->chunk);
	rc = verify_reserve(e, T, err);
	if (rc)
		return rc;
	e->v_layers = 0;
	struct pass_part pp = { s, 0, T, 0, true, out, e->tap_out };
	rc = engine_run_chunk(e, ids, T, &pp, 1, true, err);
	if (rc) {
		/* Nothing was published: undo the provisional rows (and, on the
		 * snapshot path, the states advanced so far); s stays usable. */
		struct k3_err e2 = { 0 };
		if (verify_discard(e, s, e->v_layers, &e2))
			s->poisoned = true;
		return rc;
	}
	e->pending = s;
	e->pending_T = T;
	return 0;
}

int k3_engine_commit(struct k3_engine *e, struct k3_engine_seq *s, uint32_t m,
		     struct k3_err *err)
{
	const struct k3_provider *p = e->prov;
	struct k3_prov_status st = { 0 };
	int rc = 0;

	if (e->pending != s || s->e != e)
		return k3_err_set(err, -EINVAL, "no verification pending on this sequence");
	if (m > e->pending_T)
		return k3_err_set(err, -EINVAL, "commit of %u positions; the verification ran %u",
				  m, e->pending_T);
	e->pending = NULL;
	for (uint32_t l = 0; !rc && l < e->cfg.n_layers; l++) {
		if (s->mla[l]) {
			p->mla_cache_truncate(s->mla[l], s->len + m);
		} else if (e->prov_verify) {
			rc = p->kda_replay(e->pm, l, s->kda[l], e->vrec[l], m, &st);
		} else if (m < e->pending_T) {
			/* Snapshot path: back to the state before the pass, then
			 * the accepted prefix again through the same op (a
			 * streamed layer's weights are read again for it). */
			rc = p->kda_state_copy(s->kda[l], e->vsnap[l], &st);
			if (!rc && m) {
				int brc = engine_spine_bind(e, l, err);
				if (brc) {
					s->poisoned = true;
					return brc;
				}
				rc = p->kda(e->pm, l, e->vh[l], m, s->kda[l], e->z, 0, &st);
			}
		}
	}
	engine_spine_unbind(e);
	if (rc) {
		s->poisoned = true;
		return prov_err(e, err, rc, &st);
	}
	s->len += m;
	return 0;
}

bool k3_engine_verify_pending(const struct k3_engine *e, const struct k3_engine_seq *s)
{
	return e->pending == s;
}

size_t k3_engine_verify_record_bytes(const struct k3_engine *e, uint32_t T)
{
	const struct k3_prov_config *c = &e->cfg;
	uint32_t n_kda = 0;

	for (uint32_t l = 0; l < c->n_layers; l++)
		n_kda += c->attn_kind[l] == K3_PROV_ATTN_KDA;
	size_t P = (size_t)c->kda_heads * c->kda_head_dim;
	if (e->prov_verify)
		return (size_t)T * n_kda * (4 * P + c->kda_heads) * sizeof(float);
	size_t state = (3 * (size_t)(c->conv_kernel - 1) * P + (size_t)c->kda_heads *
			c->kda_head_dim * c->kda_head_dim) * sizeof(float);
	return n_kda * (state + (size_t)T * e->D * sizeof(float));
}

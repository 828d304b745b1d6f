/*
 * draft_run.c - the per-request draft, verify, commit loop (see
 * draft_run.h).
 *
 * Buffers are sized once at k3_draft_run_new for the widest pass
 * (max_width + 1 positions; a prefill chunk for the taps), so a pass
 * allocates nothing here (the draft and the engine's first verification
 * of a new width may).
 */
#include "draft/draft_run.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/carve.h"

struct k3_draft_run {
	struct k3_engine *e;
	struct k3_draft *d;
	struct k3_draft_cost own_cost, *cost;
	struct k3_draft_ctl ctl;
	uint32_t fixed, width_max, V, per, n_taps, D;
	void *block;                 /* the pass buffers below, one carved block */
	float *logits;               /* [width_max + 1][V] */
	uint32_t *route_ids;         /* [width_max + 1][per] */
	float *route_w;
	float *taps;                 /* [max(chunk, width_max + 1)][n_taps][D] */
	uint32_t *in;                /* [width_max + 1]: the anchor, then the proposals */
	uint32_t *next;              /* [width_max + 1] */
	struct k3_draft_pass last;
	bool pending;                /* a pass waits for its commit */
	bool pending_verify;         /* ... and it was a verification */
	uint32_t pos0;               /* its first position */
	double last_dt;              /* its engine time (the commit adds to it) */
	struct k3_draft_stats stats;
};

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

void k3_draft_run_free(struct k3_draft_run *r)
{
	if (!r)
		return;
	if (r->n_taps) {
		k3_engine_set_taps(r->e, NULL, 0, NULL);
		k3_engine_set_tap_out(r->e, NULL);
	}
	free(r->block);
	free(r);
}

int k3_draft_run_new(struct k3_engine *e, const struct k3_draft_run_opts *o,
		     struct k3_draft_run **out, struct k3_err *err)
{
	struct k3_draft_run *r = calloc(1, sizeof(*r));
	uint32_t chunk = k3_engine_max_chunk(e);
	int rc;

	if (!r)
		return k3_err_set(err, -ENOMEM, "out of memory");
	r->e = e;
	r->d = o->draft;
	r->cost = o->cost ? o->cost : &r->own_cost;
	k3_draft_cost_init(&r->own_cost);
	r->fixed = o->fixed_width;
	uint32_t w = o->fixed_width ? o->fixed_width : o->max_width ? o->max_width : 7;
	if (w > chunk - 1)
		w = chunk - 1;
	if (r->d && r->d->max_block && w > r->d->max_block)
		w = r->d->max_block;
	if (!r->d)
		w = 0;
	if (r->fixed > w)
		r->fixed = w;
	r->width_max = w;
	k3_draft_ctl_init(&r->ctl, w);
	r->V = k3_engine_vocab(e);
	r->per = k3_engine_n_moe(e) * k3_engine_top_k(e);
	r->D = k3_engine_hidden(e);
	r->n_taps = r->d ? r->d->n_taps : 0;
	size_t rows = (size_t)w + 1, tap_rows = chunk > rows ? chunk : rows;
	/* the pass buffers share the run's lifetime: one carved block */
	size_t n_route = rows * r->per + 1;
	struct k3_carve k = { 0 };
	while (k3_carve_next(&k)) {
		K3_CARVE(&k, r->logits, rows * r->V);
		K3_CARVE(&k, r->route_ids, n_route);
		K3_CARVE(&k, r->route_w, n_route);
		K3_CARVE(&k, r->taps, r->n_taps ? tap_rows * r->n_taps * r->D : 0);
		K3_CARVE(&k, r->in, rows);
		K3_CARVE(&k, r->next, rows);
	}
	if (!r->n_taps)
		r->taps = NULL;
	if (!(r->block = k.block)) {
		k3_draft_run_free(r);
		return k3_err_set(err, -ENOMEM, "out of memory for %zu-position draft passes", rows);
	}
	if (r->n_taps && (rc = k3_engine_set_taps(e, r->d->tap_layers, r->n_taps, err)) < 0) {
		r->n_taps = 0;
		k3_draft_run_free(r);
		return k3_err_prefix(err, "draft '%s'", r->d->ops->name);
	}
	*out = r;
	return 0;
}

/* Gives the draft rows [0..n) of the last engine call (positions pos0..),
 * timing it as draft work. */
static int draft_accept(struct k3_draft_run *r, uint32_t pos0, const uint32_t *ids, uint32_t n,
			struct k3_err *err)
{
	if (!r->d)
		return 0;
	double t0 = now_s();
	int rc = k3_draft_accept(r->d, pos0, ids, n, r->n_taps ? r->taps : NULL, err);
	r->stats.draft_s += now_s() - t0;
	return rc;
}

int k3_draft_run_prefill(struct k3_draft_run *r, struct k3_engine_seq *s, const int32_t *ids,
			 uint32_t n, const struct k3_engine_out *out, struct k3_err *err)
{
	uint32_t pos0 = k3_engine_seq_len(s);

	if (r->pending)
		return k3_err_set(err, -EBUSY, "draft run: a pass waits for its commit");
	if (n > k3_engine_max_chunk(r->e))
		return k3_err_set(err, -EINVAL, "draft run: prefill chunk of %u positions exceeds %u",
				  n, k3_engine_max_chunk(r->e));
	k3_engine_set_tap_out(r->e, r->n_taps ? r->taps : NULL);
	double t0 = now_s();
	int rc = k3_engine_forward(r->e, s, ids, n, out, err);
	double dt = now_s() - t0;
	k3_engine_set_tap_out(r->e, NULL);
	if (rc < 0)
		return rc;
	k3_draft_cost_add(r->cost, n, dt);
	return draft_accept(r, pos0, (const uint32_t *)ids, n, err);
}

int k3_draft_run_pass(struct k3_draft_run *r, struct k3_engine_seq *s, const uint32_t *ctx,
		      size_t n, uint32_t limit, struct k3_draft_pass *p, struct k3_err *err)
{
	uint32_t width = 0, got = 0;
	double t0, dt_draft = -1;
	int rc;

	if (r->pending)
		return k3_err_set(err, -EBUSY, "draft run: a pass waits for its commit");
	if (n == 0 || n != (size_t)k3_engine_seq_len(s) + 1)
		return k3_err_set(err, -EINVAL, "draft run: a context of %zu ids for a sequence of %u",
				  n, k3_engine_seq_len(s));
	if (r->d) {
		width = r->fixed ? r->fixed : k3_draft_ctl_width(&r->ctl, r->cost, limit);
		if (width > limit)
			width = limit;
	}
	r->in[0] = ctx[n - 1];
	if (width > 0) {
		t0 = now_s();
		rc = k3_draft_propose(r->d, ctx, n, width, r->in + 1, err);
		dt_draft = now_s() - t0;
		r->stats.draft_s += dt_draft;
		if (rc < 0)
			return k3_err_prefix(err, "draft '%s'", r->d->ops->name);
		got = (uint32_t)rc;
		for (uint32_t i = 0; i < got; i++)
			if (r->in[1 + i] >= r->V)
				got = i;     /* an id the target cannot run: propose less */
	}
	struct k3_engine_out out = { got ? K3_ENGINE_LOGITS_ALL : K3_ENGINE_LOGITS_LAST, r->logits,
				     r->route_ids, r->route_w };
	k3_engine_set_tap_out(r->e, r->n_taps ? r->taps : NULL);
	t0 = now_s();
	rc = got ? k3_engine_verify(r->e, s, (const int32_t *)r->in, got + 1, &out, err)
		 : k3_engine_forward(r->e, s, (const int32_t *)r->in, 1, &out, err);
	double dt = now_s() - t0;
	k3_engine_set_tap_out(r->e, NULL);
	if (rc < 0)
		return rc;
	uint32_t acc = 0;
	for (uint32_t i = 0; i <= got; i++)
		r->next[i] = k3_engine_argmax(r->logits + (size_t)i * r->V, r->V);
	while (acc < got && r->in[1 + acc] == r->next[acc])
		acc++;
	if (r->d && !r->fixed)
		k3_draft_ctl_observe(&r->ctl, got, acc, width ? dt_draft : -1);
	r->stats.passes++;
	if (got) {
		r->stats.verify_passes++;
		r->stats.proposed += got;
		r->stats.accepted += acc;
		r->stats.verify_s += dt;
	} else {
		r->stats.decode_s += dt;
		/* plain passes are only timed here; verifications also count
		 * their commit (k3_draft_run_commit) */
		k3_draft_cost_add(r->cost, 1, dt);
	}
	r->stats.switched_off = r->ctl.switched_off;
	r->last = (struct k3_draft_pass){
		.n_drafts = got, .accepted = acc, .drafts = r->in + 1, .next = r->next,
		.logits = r->logits, .route_ids = r->route_ids, .route_w = r->route_w,
	};
	r->last_dt = dt;
	r->pending = true;
	r->pending_verify = got > 0;
	r->pos0 = (uint32_t)n - 1;
	*p = r->last;
	return 0;
}

int k3_draft_run_commit(struct k3_draft_run *r, struct k3_engine_seq *s, uint32_t keep,
			struct k3_err *err)
{
	int rc = 0;

	if (!r->pending)
		return k3_err_set(err, -EINVAL, "draft run: no pass to commit");
	if (keep < 1 || keep > r->last.accepted + 1)
		return k3_err_set(err, -EINVAL, "draft run: commit of %u positions; %u may be kept",
				  keep, r->last.accepted + 1);
	r->pending = false;
	if (r->pending_verify) {
		double t0 = now_s();
		rc = k3_engine_commit(r->e, s, keep, err);
		double dt = now_s() - t0;
		r->stats.verify_s += dt;
		k3_draft_cost_add(r->cost, r->last.n_drafts + 1, r->last_dt + dt);
		if (rc < 0)
			return rc;
	}
	return draft_accept(r, r->pos0, r->in, keep, err);
}

const struct k3_draft_stats *k3_draft_run_stats(const struct k3_draft_run *r)
{
	return &r->stats;
}

const struct k3_draft_ctl *k3_draft_run_ctl(const struct k3_draft_run *r)
{
	return &r->ctl;
}

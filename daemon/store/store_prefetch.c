/*
 * store_prefetch.c - prefetch (see store_prefetch.h and store.h): guesses
 * take slots within the prefetch_slots bound and become low-priority reads
 * of the reader pool; the real routing of their layer drops, cools or
 * stops the wrong ones; one-position lookaheads are scored per (kind,
 * layer, rank), and the precision gate of "--prefetch auto" reads a rank
 * ahead only while its estimated precision passes the threshold.
 */
#include "store/store_prefetch.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "store/store_cache.h"

enum {
	GATE_PRIOR_N = 4,        /* the gate's priors weigh as 4 guesses */
	GATE_WINDOW = 512,       /* counts halve here: the estimate follows the workload */
};

int k3_store_guesses_init(struct k3_store_guesses *g, uint32_t n_layers, double min_precision)
{
	bool ok = true;

	memset(g, 0, sizeof(*g));
	g->n_layers = n_layers;
	g->min_precision = min_precision;
	for (int k = 0; k < K3_STORE_GUESS_KINDS; k++) {
		struct k3_store_guess_record *r = &g->rec[k];
		r->pend = calloc((size_t)n_layers * K3_STORE_PREFETCH_PENDING_MAX, sizeof(*r->pend));
		r->n_pend = calloc(n_layers, sizeof(*r->n_pend));
		r->gate_n = calloc((size_t)n_layers * K3_STORE_GUESS_RANKS, sizeof(*r->gate_n));
		r->gate_hit = calloc((size_t)n_layers * K3_STORE_GUESS_RANKS, sizeof(*r->gate_hit));
		ok &= r->pend && r->n_pend && r->gate_n && r->gate_hit;
	}
	return ok ? 0 : -ENOMEM;
}

void k3_store_guesses_release(struct k3_store_guesses *g)
{
	for (int k = 0; k < K3_STORE_GUESS_KINDS; k++) {
		free(g->rec[k].pend);
		free(g->rec[k].n_pend);
		free(g->rec[k].gate_n);
		free(g->rec[k].gate_hit);
	}
	memset(g, 0, sizeof(*g));
}

/* ---- dropping and cooling guesses ---- */

/* Which queued guesses cancel_layer keeps (NULL: none). */
typedef bool keep_fn(const struct k3_store *s, const struct k3_store_slot *sl, const void *arg);

/* Drops the guesses of `layer` (every layer: UINT32_MAX) still queued
 * (unread) and unpinned, except those keep(s, slot, arg) keeps; returns how
 * many were dropped (prefetch_cancelled counts them). */
static size_t cancel_layer(struct k3_store *s, uint32_t layer, keep_fn *keep, const void *arg)
{
	struct k3_store_io_job *job = k3_store_io_first(s->io, K3_STORE_IO_PREFETCH);
	size_t n = 0;

	while (job) {
		struct k3_store_io_job *next = k3_store_io_next(s->io, job);
		int32_t i = k3_store_cache_slot_of_job(s, job);
		const struct k3_store_slot *sl = &s->slots[i];
		if ((layer == UINT32_MAX || k3_store_cache_layer_of(s, sl->ex) == layer) &&
		    sl->pins == 0 && !(keep && keep(s, sl, arg))) {
			k3_store_cache_drop(s, i, false);
			n++;
		}
		job = next;
	}
	return n;
}

/* Keeps what the acquire *arg (a uint64_t generation) pinned. */
static bool keep_acquired(const struct k3_store *s, const struct k3_store_slot *sl,
			  const void *arg)
{
	(void)s;
	return sl->acq_gen == *(const uint64_t *)arg;
}

/* The guesses of a lookahead after the layer (experts[0..n) of `layer`). */
struct later_guesses {
	uint32_t layer;
	const uint32_t *experts;
	size_t n;
};

/* A lookahead after the layer supersedes the partial one's guesses of the
 * same layer whose reads have not started: those it does not repeat (among
 * every guess it offers, read or gated) are dropped unread, so the better
 * guesses go first and a guess both lookaheads doubt costs nothing. Keeps
 * every other guess. */
static bool keep_unless_superseded(const struct k3_store *s, const struct k3_store_slot *sl,
				   const void *arg)
{
	const struct later_guesses *g = arg;

	if (sl->guess_kind != K3_STORE_GUESS_PARTIAL)
		return true;
	for (size_t k = 0; k < g->n; k++)
		if (k3_store_source_find(s->src, g->layer, g->experts[k]) == sl->ex)
			return true;
	return false;
}

/* Guesses of `layer` (every layer: UINT32_MAX) still unused after its real
 * routing (or at the end of a request) are mispredictions: cold end; those
 * still being read stop at their next piece. */
static void resolve_layer(struct k3_store *s, uint32_t layer)
{
	if (!s->prefetch_outstanding)
		return;
	for (uint32_t i = 0; i < s->n_slots; i++) {
		struct k3_store_slot *sl = &s->slots[i];
		if (sl->prefetched &&
		    (layer == UINT32_MAX || k3_store_cache_layer_of(s, sl->ex) == layer)) {
			sl->missed = true;
			if (sl->state == K3_STORE_SLOT_READING && sl->pins == 0)
				k3_store_io_set_stop(s->io, &sl->job, true);
		}
	}
}

void k3_store_prefetch_routed(struct k3_store *s, uint32_t layer, uint64_t gen)
{
	cancel_layer(s, layer, keep_acquired, &gen);
	resolve_layer(s, layer);
}

/* ---- scoring and the gate ---- */

static uint32_t *gate_cell(uint32_t *table, uint32_t layer, uint32_t rank)
{
	return &table[(size_t)layer * K3_STORE_GUESS_RANKS + rank];
}

void k3_store_prefetch_score(struct k3_store *s, uint32_t layer, uint64_t gen)
{
	struct k3_store_guesses *g = &s->guesses;

	if (layer >= g->n_layers)
		return;
	for (int kind = 0; kind < K3_STORE_GUESS_KINDS; kind++) {
		struct k3_store_guess_record *rc = &g->rec[kind];
		struct k3_store_pending_guess *pg = &rc->pend[(size_t)layer * K3_STORE_PREFETCH_PENDING_MAX];
		for (uint32_t k = 0; k < rc->n_pend[layer]; k++) {
			int32_t i = s->slot_of[pg[k].ex];
			bool right = i >= 0 && s->slots[i].acq_gen == gen;
			uint32_t r = pg[k].rank;
			uint32_t *n = gate_cell(rc->gate_n, layer, r);
			uint32_t *h = gate_cell(rc->gate_hit, layer, r);
			if (*n >= GATE_WINDOW) {
				rc->rank_n[r] -= *n - (*n >> 1);
				rc->rank_hit[r] -= *h - (*h >> 1);
				*n >>= 1;
				*h >>= 1;
			}
			++*n;
			*h += right;
			rc->rank_n[r]++;
			rc->rank_hit[r] += right;
			rc->rank_scored[r]++;
			rc->rank_right[r] += right;
			s->st.guesses_scored++;
			s->st.guesses_right += right;
		}
		rc->n_pend[layer] = 0;
	}
}

/* The gate of "--prefetch auto": rank `rank` of `layer` is read ahead only
 * while its estimated precision is at least the threshold. The estimate
 * shrinks the layer's own record towards the rank's record over all layers,
 * which itself starts at 50%:
 *
 *   pooled = (right_all + 2) / (scored_all + 4)
 *   p      = (right + 4 pooled) / (scored + 4)
 *
 * so nothing is read ahead before the first guesses were scored, a model
 * with many MoE layers learns a rank in a token or two, and a layer whose
 * guesses are worse than the others' (the first MoE layer, guessed from
 * the embedding) closes on its own record within a few tokens. */
static bool gate_open(const struct k3_store *s, const struct k3_store_guess_record *rc,
		      uint32_t layer, uint32_t rank)
{
	if (!s->cfg.prefetch_auto)
		return true;
	if (layer >= s->guesses.n_layers || rank >= K3_STORE_GUESS_RANKS)
		return false;
	double pooled = ((double)rc->rank_hit[rank] + GATE_PRIOR_N * 0.5) /
			((double)rc->rank_n[rank] + GATE_PRIOR_N);
	double n = *gate_cell(rc->gate_n, layer, rank), h = *gate_cell(rc->gate_hit, layer, rank);
	return (h + GATE_PRIOR_N * pooled) / (n + GATE_PRIOR_N) >= s->guesses.min_precision;
}

/* ---- the public entry points (store.h) ---- */

size_t k3_store_prefetch_ranked(struct k3_store *s, uint32_t layer, const uint32_t *experts,
				const uint32_t *ranks, size_t n, bool score,
				enum k3_store_guess_kind kind)
{
	int32_t queued[64];
	size_t nq = 0;
	bool full = false;

	if ((unsigned)kind >= K3_STORE_GUESS_KINDS)
		return 0;
	struct k3_store_guess_record *rc = &s->guesses.rec[kind];
	uint32_t n_layers = s->guesses.n_layers;
	k3_store_io_lock(s->io);
	if (score && layer < n_layers)
		rc->n_pend[layer] = 0;   /* a newer lookahead replaces an unscored one */
	if (kind == K3_STORE_GUESS_AFTER && layer < n_layers)   /* not UINT32_MAX = every layer */
		cancel_layer(s, layer, keep_unless_superseded,
			     &(struct later_guesses){ layer, experts, n });
	if (layer >= n_layers)
		score = false;
	for (size_t k = 0; k < n; k++) {
		int64_t ex = k3_store_source_find(s->src, layer, experts[k]);
		uint32_t rank = ranks ? ranks[k] : (uint32_t)k;
		int32_t i;
		if (nq == sizeof(queued) / sizeof(queued[0]))
			full = true;
		if (full && (!score || rc->n_pend[layer] == K3_STORE_PREFETCH_PENDING_MAX))
			break;
		if (ex < 0 || s->slot_of[ex] >= 0)
			continue;   /* unknown, or resident / loading: costs nothing */
		if (score && rank < K3_STORE_GUESS_RANKS &&
		    rc->n_pend[layer] < K3_STORE_PREFETCH_PENDING_MAX)
			rc->pend[(size_t)layer * K3_STORE_PREFETCH_PENDING_MAX + rc->n_pend[layer]++] =
				(struct k3_store_pending_guess){ ex, rank };
		if (full || s->cfg.prefetch_slots == 0)
			continue;
		if (!gate_open(s, rc, layer, rank)) {
			s->st.prefetch_skipped++;
			continue;
		}
		/* "auto" turned prefetch off on every drive holding it */
		if (k3_store_cache_pick_copy(s, ex, true, NULL) < 0) {
			s->st.prefetch_skipped++;
			s->st.drive_prefetch_off_skips[k3_store_source_copy_drive(s->src, (size_t)ex, 0)]++;
			continue;
		}
		if (s->prefetch_outstanding >= (uint32_t)s->cfg.prefetch_slots) {
			full = true;
			continue;
		}
		i = k3_store_cache_find_free(s);
		if (i < 0) {
			i = k3_store_cache_victim(s, true, layer);
			if (i < 0) {
				full = true;
				continue;
			}
			k3_store_cache_drop(s, i, true);
		}
		k3_store_cache_assign(s, i, ex);
		struct k3_store_slot *sl = &s->slots[i];
		sl->demand = false;
		sl->prefetched = true;
		sl->guess_kind = (uint8_t)kind;
		sl->prefetch_step = s->step;
		sl->last_use = ++s->tick;
		s->prefetch_outstanding++;
		queued[nq++] = i;
	}
	k3_store_cache_issue(s, queued, nq);
	k3_store_io_unlock(s->io);
	return nq;
}

size_t k3_store_prefetch(struct k3_store *s, uint32_t layer, const uint32_t *experts, size_t n)
{
	return k3_store_prefetch_ranked(s, layer, experts, NULL, n, true, K3_STORE_GUESS_AFTER);
}

void k3_store_guess_table(struct k3_store *s, enum k3_store_guess_kind kind, uint64_t *scored,
			  uint64_t *right)
{
	if ((unsigned)kind >= K3_STORE_GUESS_KINDS)
		kind = K3_STORE_GUESS_AFTER;
	const struct k3_store_guess_record *rc = &s->guesses.rec[kind];
	k3_store_io_lock(s->io);
	memcpy(scored, rc->rank_scored, sizeof(rc->rank_scored));
	memcpy(right, rc->rank_right, sizeof(rc->rank_right));
	k3_store_io_unlock(s->io);
}

size_t k3_store_prefetch_cancel(struct k3_store *s, uint32_t layer)
{
	struct k3_store_guesses *g = &s->guesses;
	size_t n;

	k3_store_io_lock(s->io);
	n = cancel_layer(s, layer, NULL, NULL);
	resolve_layer(s, layer);
	for (int kind = 0; kind < K3_STORE_GUESS_KINDS; kind++) {
		if (layer == UINT32_MAX)
			memset(g->rec[kind].n_pend, 0, g->n_layers * sizeof(*g->rec[kind].n_pend));
		else if (layer < g->n_layers)
			g->rec[kind].n_pend[layer] = 0;
	}
	k3_store_io_unlock(s->io);
	return n;
}

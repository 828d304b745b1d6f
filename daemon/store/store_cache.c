/*
 * store_cache.c - the expert cache (see store_cache.h and store.h): slot
 * bookkeeping, the eviction choice, the reads that fill slots (jobs of the
 * reader pool, store_io.h, each from the copy whose drive should finish it
 * first), hedged reads, and where every byte read goes (demand, prefetch
 * used, prefetch wasted). The acquire path over it: store_acquire.c.
 */
#include "store/store_cache.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "model/mxfp4.h"

static uint64_t now_ns(void)
{
	return k3_store_io_now_ns();
}

/* ---- slot bookkeeping ---- */

uint32_t k3_store_cache_layer_of(const struct k3_store *s, int64_t ex)
{
	return k3_store_source_expert(s->src, (size_t)ex)->layer;
}

int32_t k3_store_cache_slot_of_job(const struct k3_store *s, const struct k3_store_io_job *job)
{
	const struct k3_store_slot *sl = (const struct k3_store_slot *)
		((const char *)job - offsetof(struct k3_store_slot, job));
	return (int32_t)(sl - s->slots);
}

void k3_store_cache_drop(struct k3_store *s, int32_t i, bool eviction)
{
	struct k3_store_slot *sl = &s->slots[i];

	k3_store_io_cancel(s->io, &sl->job);   /* a queued read is taken back */
	if (sl->prefetched) {
		if (sl->state == K3_STORE_SLOT_QUEUED)
			s->st.prefetch_cancelled++;
		else
			k3_store_cache_guess_fate(s, sl->drive, sl->read_bytes, false);
		sl->prefetched = false;
		s->prefetch_outstanding--;
	}
	sl->missed = false;
	if (eviction && sl->state == K3_STORE_SLOT_READY)
		s->st.evictions++;
	s->slot_of[sl->ex] = -1;
	sl->ex = -1;
	sl->state = K3_STORE_SLOT_FREE;
	sl->read_bytes = 0;
	sl->err = 0;
}

int32_t k3_store_cache_victim(const struct k3_store *s, bool for_prefetch, uint32_t layer)
{
	/* FREQ: the quarter of the cache acquired most recently is protected
	 * (token-to-token reuse); outside it the fewest decayed uses go
	 * first, then the least recent. docs/store.md has the measurements. */
	uint64_t window = s->n_slots / 4;
	int32_t best = -1, cold = -1;
	uint64_t best_key = 0, best_t = 0, cold_t = 0;

	for (uint32_t i = 0; i < s->n_slots; i++) {
		const struct k3_store_slot *sl = &s->slots[i];
		uint64_t key = 0;
		if (sl->pins || sl->loser ||
		    (sl->state != K3_STORE_SLOT_READY && sl->state != K3_STORE_SLOT_ERROR))
			continue;
		if (sl->state == K3_STORE_SLOT_ERROR)
			return (int32_t)i;
		/* a guess settled unused at the end of a request stays cold */
		if (sl->prefetched || sl->missed) {
			if (for_prefetch && !sl->missed)
				continue;
			/* missed guesses before unresolved ones, then oldest */
			uint64_t t = sl->last_use + (sl->missed ? 0 : (uint64_t)1 << 62);
			if (cold < 0 || t < cold_t) {
				cold = (int32_t)i;
				cold_t = t;
			}
			continue;
		}
		if (cold >= 0)
			continue;   /* a cold slot wins anyway; keep scanning for colder ones */
		if (for_prefetch && k3_store_cache_layer_of(s, sl->ex) == layer)
			continue;
		if (s->cfg.policy == K3_STORE_POLICY_FREQ)
			key = sl->last_use + window > s->tick ? (uint64_t)1 << 32 : s->uses[sl->ex];
		if (best < 0 || key < best_key || (key == best_key && sl->last_use < best_t)) {
			best = (int32_t)i;
			best_key = key;
			best_t = sl->last_use;
		}
	}
	return cold >= 0 ? cold : best;
}

int32_t k3_store_cache_find_free(const struct k3_store *s)
{
	for (uint32_t i = 0; i < s->n_slots; i++)
		if (s->slots[i].state == K3_STORE_SLOT_FREE)
			return (int32_t)i;
	return -1;
}

void k3_store_cache_assign(struct k3_store *s, int32_t i, int64_t ex)
{
	struct k3_store_slot *sl = &s->slots[i];

	k3_store_source_plan(s->src, (size_t)ex, &sl->plan);
	sl->ex = ex;
	sl->state = K3_STORE_SLOT_QUEUED;
	sl->pins = 0;
	sl->acq_gen = 0;
	sl->counted_step = UINT64_MAX;   /* a new occupant has not been counted */
	sl->prefetched = false;
	sl->missed = false;
	sl->err = 0;
	sl->read_bytes = 0;
	sl->fate = K3_STORE_FATE_NONE;
	sl->hedge = -1;
	s->slot_of[ex] = i;
}

void k3_store_cache_note_use(struct k3_store *s, int64_t ex)
{
	size_t n = k3_store_source_count(s->src);

	if (s->uses[ex] < UINT32_MAX)
		s->uses[ex]++;
	if (++s->uses_total >= 8ull * s->n_slots) {
		for (size_t i = 0; i < n; i++)
			s->uses[i] >>= 1;
		s->uses_total = 0;
	}
}

/* ---- where the bytes go ---- */

void k3_store_cache_guess_fate(struct k3_store *s, uint32_t d, uint64_t bytes, bool right)
{
	struct k3_store_drive_prefetch *p = &s->dpf[d];
	/* a window of about 64 expert reads; at least 16 before judging */
	double window = 64.0 * (double)s->slot_bytes, least = 16.0 * (double)s->slot_bytes;

	if (!right) {
		s->st.prefetch_wasted_bytes += bytes;
		s->st.drive_prefetch_wasted_bytes[d] += bytes;
	}
	if (right)
		p->used += (double)bytes;
	else
		p->wasted += (double)bytes;
	if (p->used + p->wasted > window) {
		p->used /= 2;
		p->wasted /= 2;
	}
	/* "auto": a drive whose guesses' bytes are right less often than the
	 * gate asks of a rank does not pay; it takes no guesses for a while,
	 * then gets a fresh record. */
	if (s->cfg.prefetch_auto && !p->off && p->used + p->wasted >= least &&
	    p->used < s->guesses.min_precision * (p->used + p->wasted)) {
		p->off = true;
		p->off_step = s->step;
	}
}

void k3_store_cache_charge(struct k3_store *s, uint32_t d, uint64_t bytes, enum k3_store_fate fate)
{
	if (fate == K3_STORE_FATE_USED) {
		s->st.prefetch_used_bytes += bytes;
		s->st.drive_prefetch_used_bytes[d] += bytes;
		k3_store_cache_guess_fate(s, d, bytes, true);
	} else {
		if (fate == K3_STORE_FATE_LATE)
			k3_store_cache_guess_fate(s, d, 0, true);
		s->st.demand_bytes += bytes;
		s->st.drive_demand_bytes[d] += bytes;
	}
}

/* Counts a read of `bytes` from drive d, issued as demand or not. */
static void count_read(struct k3_store *s, uint32_t d, bool demand, uint64_t bytes)
{
	s->st.bytes_read += bytes;
	s->st.reads++;
	s->st.drive_bytes_read[d] += bytes;
	s->st.drive_reads[d]++;
	if (!demand)
		s->st.prefetch_issued_bytes += bytes;
}

/* ---- choosing a copy ---- */

static bool drive_takes_guesses(struct k3_store *s, uint32_t d)
{
	struct k3_store_drive_prefetch *p = &s->dpf[d];

	/* a drive turned off gets a fresh record after 8 x slots steps */
	if (p->off && s->step - p->off_step >= 8ull * s->n_slots) {
		p->off = false;
		p->used = p->wasted = 0;
	}
	return !p->off;
}

int k3_store_cache_pick_copy(struct k3_store *s, int64_t ex, bool guess, const uint64_t *extra)
{
	unsigned n = k3_store_source_copies(s->src, (size_t)ex);
	uint64_t best_t = UINT64_MAX;
	int best = -1;

	for (unsigned c = 0; c < n; c++) {
		uint32_t d = k3_store_source_copy_drive(s->src, (size_t)ex, c);
		if (guess && !drive_takes_guesses(s, d))
			continue;
		if (n == 1)
			return 0;
		uint64_t t = k3_store_io_predict(s->io, d, s->slot_bytes + (extra ? extra[d] : 0));
		if (best < 0 || t < best_t) {
			best = (int)c;
			best_t = t;
		}
	}
	return best;
}

/* ---- the reads: jobs of the reader pool ---- */

static struct k3_store_slot *job_slot(struct k3_store_io_job *job)
{
	struct k3_store *s = job->owner;
	return &s->slots[k3_store_cache_slot_of_job(s, job)];
}

static void job_start(struct k3_store_io_job *job)
{
	struct k3_store *s = job->owner;
	struct k3_store_slot *sl = job_slot(job);

	sl->state = K3_STORE_SLOT_READING;
	if (job->cls != K3_STORE_IO_DEMAND)
		s->st.prefetch_issued++;
}

/* The E8M0 scale arrays may not hold the NaN byte 255 (cfg.check_scales). */
static int check_scales(const struct k3_store *s, const uint8_t *mem,
			const struct k3_store_plan *plan)
{
	static const int scales[3] = { K3_STORE_W1_SCALE, K3_STORE_W2_SCALE, K3_STORE_W3_SCALE };

	if (!s->cfg.check_scales)
		return 0;
	for (int k = 0; k < 3; k++)
		if (k3_mxfp4_check_scales(mem + plan->array_offset[scales[k]],
					  plan->array_length[scales[k]], "expert", NULL))
			return -EBADMSG;
	return 0;
}

static int job_check(struct k3_store_io_job *job)
{
	const struct k3_store_slot *sl = job_slot(job);
	return check_scales(job->owner, job->dst, &sl->job_plan);
}

static struct k3_store_hedge *hedge_of_loser(struct k3_store *s, int32_t slot)
{
	for (uint32_t h = 0; h < s->n_hedges; h++)
		if (s->hedges[h].busy && s->hedges[h].loser_slot == slot)
			return &s->hedges[h];
	return NULL;
}

/* The slot's read lost to its hedge, or its hedge lost to it: the other
 * job is stopped (running) or taken back (queued). */
static void hedge_lost(struct k3_store *s, struct k3_store_hedge *h)
{
	h->slot = -1;
	if (k3_store_io_cancel(s->io, &h->job))
		h->busy = false;   /* never started: no bytes, no callback */
	else
		k3_store_io_set_stop(s->io, &h->job, true);
}

static void job_done(struct k3_store_io_job *job, int rc, uint64_t bytes, bool stopped)
{
	struct k3_store *s = job->owner;
	int32_t i = k3_store_cache_slot_of_job(s, job);
	struct k3_store_slot *sl = &s->slots[i];
	bool demand = job->cls == K3_STORE_IO_DEMAND;

	count_read(s, job->drive, demand, bytes);
	if (sl->loser) {
		/* its hedge won long ago: these bytes lost the race */
		s->st.hedge_bytes += bytes;
		k3_store_cache_charge(s, job->drive, bytes, K3_STORE_FATE_NONE);
		struct k3_store_hedge *h = hedge_of_loser(s, i);
		if (h) {
			h->loser_slot = -1;
			h->busy = false;   /* it holds the slot's old buffer, free again */
		}
		sl->loser = false;
		return;
	}
	sl->read_bytes = bytes;
	if (stopped) {
		s->st.prefetch_aborted++;
		/* the pieces read: prefetch_wasted_bytes */
		k3_store_cache_drop(s, i, false);
		return;
	}
	if (demand || sl->fate != K3_STORE_FATE_NONE) {
		k3_store_cache_charge(s, job->drive, bytes, demand ? K3_STORE_FATE_NONE : sl->fate);
		sl->fate = K3_STORE_FATE_NONE;
	}
	if (sl->hedge >= 0) {
		struct k3_store_hedge *h = &s->hedges[sl->hedge];
		if (rc != 0) {
			sl->err = rc;   /* the hedge may still bring the bytes */
			return;
		}
		sl->hedge = -1;
		hedge_lost(s, h);
	}
	sl->err = rc;
	sl->state = rc ? K3_STORE_SLOT_ERROR : K3_STORE_SLOT_READY;
}

static const struct k3_store_io_ops job_ops = {
	.start = job_start,
	.check = job_check,
	.done = job_done,
};

static struct k3_store_hedge *hedge_of_job(struct k3_store_io_job *job)
{
	return (struct k3_store_hedge *)((char *)job - offsetof(struct k3_store_hedge, job));
}

static int hedge_check(struct k3_store_io_job *job)
{
	return check_scales(job->owner, job->dst, &hedge_of_job(job)->plan);
}

static void hedge_done(struct k3_store_io_job *job, int rc, uint64_t bytes, bool stopped)
{
	struct k3_store *s = job->owner;
	struct k3_store_hedge *h = hedge_of_job(job);

	count_read(s, h->drive, true, bytes);
	k3_store_cache_charge(s, h->drive, bytes, K3_STORE_FATE_NONE);
	if (h->slot < 0) {                /* the slot's own read won */
		s->st.hedge_bytes += bytes;
		h->busy = false;
		return;
	}
	int32_t i = h->slot;
	struct k3_store_slot *sl = &s->slots[i];
	bool primary_running = k3_store_io_running(&sl->job);
	sl->hedge = -1;
	h->slot = -1;
	if (rc != 0 || stopped) {
		s->st.hedge_bytes += bytes;
		h->busy = false;
		if (!primary_running) {       /* both failed */
			sl->state = K3_STORE_SLOT_ERROR;
			if (!sl->err)
				sl->err = rc ? rc : -EIO;
		}
		return;
	}
	/* The hedge won: the slot takes its buffer and layout; the slot's old
	 * buffer stays with the hedge until the losing read ends. */
	uint8_t *old = sl->mem;
	sl->mem = h->mem;
	h->mem = old;
	sl->plan = h->plan;
	s->st.hedges_won++;
	s->st.drive_hedges_won[sl->drive]++;
	sl->drive = h->drive;
	sl->read_bytes = bytes;
	sl->err = 0;
	sl->state = K3_STORE_SLOT_READY;
	if (primary_running) {
		sl->loser = true;
		h->loser_slot = i;
	} else {
		h->busy = false;
	}
}

static const struct k3_store_io_ops hedge_ops = {
	.check = hedge_check,
	.done = hedge_done,
};

/* Hedges slot i's running demand read with a read of another copy, when
 * there is one and a hedge buffer is free. Returns true when issued. */
static bool hedge(struct k3_store *s, int32_t i)
{
	struct k3_store_slot *sl = &s->slots[i];
	unsigned n = k3_store_source_copies(s->src, (size_t)sl->ex);
	struct k3_store_hedge *h = NULL;
	uint64_t best_t = UINT64_MAX;
	int best = -1;

	for (uint32_t k = 0; k < s->n_hedges && !h; k++)
		if (!s->hedges[k].busy)
			h = &s->hedges[k];
	if (!h)
		return false;
	for (unsigned c = 0; c < n; c++) {
		uint32_t d = k3_store_source_copy_drive(s->src, (size_t)sl->ex, c);
		uint64_t t;
		if (d == sl->drive)
			continue;
		t = k3_store_io_predict(s->io, d, s->slot_bytes);
		if (best < 0 || t < best_t) {
			best = (int)c;
			best_t = t;
		}
	}
	if (best < 0)
		return false;
	k3_store_source_plan_copy(s->src, (size_t)sl->ex, (unsigned)best, &h->plan);
	h->busy = true;
	h->slot = i;
	h->loser_slot = -1;
	h->drive = (uint8_t)k3_store_source_copy_drive(s->src, (size_t)sl->ex, (unsigned)best);
	h->job = (struct k3_store_io_job){
		.read = k3_store_io_read_source,
		.read_ctx = (void *)s->src,
		.rd = h->plan.read,
		.n_rd = h->plan.n_reads,
		.dst = h->mem,
		/* in pieces, so the loser stops early */
		.piece_bytes = s->piece_bytes,
		.drive = h->drive,
		.ops = &hedge_ops,
		.owner = s,
	};
	sl->hedge = (int8_t)(h - s->hedges);
	/* its read time no longer says anything of its drive */
	k3_store_io_untime(s->io, &sl->job);
	s->st.hedges++;
	s->st.drive_hedges[sl->drive]++;
	k3_store_io_submit(s->io, &h->job, K3_STORE_IO_DEMAND);
	return true;
}

void k3_store_cache_wait_reads(struct k3_store *s, const struct k3_store_view *views, size_t n,
			       const uint8_t *taken)
{
	uint64_t next = 0, now = now_ns();

	for (size_t k = 0; s->n_hedges && k < n; k++) {
		int32_t i = (int32_t)views[k].slot;
		struct k3_store_slot *sl = &s->slots[i];
		uint64_t t;
		if ((taken && taken[k]) || sl->state != K3_STORE_SLOT_READING || !sl->demand ||
		    sl->hedge >= 0 || sl->loser)
			continue;
		t = k3_store_io_hedge_after(s->io, &sl->job, s->hedge_factor);
		if (!t)
			continue;
		if (t > now) {
			if (!next || t < next)
				next = t;
		} else {
			hedge(s, i);
		}
	}
	k3_store_io_wait_until(s->io, next);
}

/* Dry run: the "read" completes on the spot. */
static void dry_read(struct k3_store *s, int32_t i)
{
	struct k3_store_slot *sl = &s->slots[i];
	uint64_t bytes = 0;

	for (unsigned r = 0; r < sl->plan.n_reads; r++)
		bytes += sl->plan.read[r].length;
	if (!sl->demand)
		s->st.prefetch_issued++;
	count_read(s, sl->drive, sl->demand, bytes);
	sl->read_bytes = bytes;
	if (sl->demand)
		k3_store_cache_charge(s, sl->drive, bytes, K3_STORE_FATE_NONE);
	sl->state = K3_STORE_SLOT_READY;
}

static int cmp_issue(const void *a, const void *b, void *ctx)
{
	const struct k3_store *s = ctx;
	const struct k3_store_slot *p = &s->slots[*(const int32_t *)a];
	const struct k3_store_slot *q = &s->slots[*(const int32_t *)b];
	const struct k3_store_read *x = &p->plan.read[0], *y = &q->plan.read[0];

	if (p->drive != q->drive)
		return p->drive < q->drive ? -1 : 1;
	if (x->file != y->file)
		return x->file < y->file ? -1 : 1;
	return x->offset < y->offset ? -1 : x->offset > y->offset;
}

void k3_store_cache_issue(struct k3_store *s, int32_t *slots, size_t n)
{
	uint64_t extra[K3_STORE_MAX_DRIVES] = { 0 };

	for (size_t k = 0; k < n; k++) {
		struct k3_store_slot *sl = &s->slots[slots[k]];
		int c = s->n_drives > 1 ? k3_store_cache_pick_copy(s, sl->ex, !sl->demand, extra) : 0;
		if (c < 0)
			c = k3_store_cache_pick_copy(s, sl->ex, false, extra);
		k3_store_source_plan_copy(s->src, (size_t)sl->ex, (unsigned)c, &sl->plan);
		sl->drive = (uint8_t)k3_store_source_copy_drive(s->src, (size_t)sl->ex, (unsigned)c);
		extra[sl->drive] += s->slot_bytes;
	}
	qsort_r(slots, n, sizeof(*slots), cmp_issue, s);
	for (size_t k = 0; k < n; k++) {
		struct k3_store_slot *sl = &s->slots[slots[k]];
		if (s->cfg.dry_run) {
			dry_read(s, slots[k]);
			continue;
		}
		sl->job_plan = sl->plan;
		sl->job = (struct k3_store_io_job){
			.read = s->cfg.read ? s->cfg.read : k3_store_io_read_source,
			.read_ctx = s->cfg.read ? s->cfg.read_ctx : (void *)s->src,
			.rd = sl->job_plan.read,
			.n_rd = sl->plan.n_reads,
			.dst = sl->mem,
			/* a guess is read in pieces, so a rejected one stops early */
			.piece_bytes = sl->demand ? 0 : s->piece_bytes,
			.drive = sl->drive,
			.timed = sl->demand,
			.ops = &job_ops,
			.owner = s,
		};
		k3_store_io_submit(s->io, &sl->job, sl->demand ? K3_STORE_IO_DEMAND
							       : K3_STORE_IO_PREFETCH);
	}
}

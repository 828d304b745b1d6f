/*
 * store_cache.c - the expert cache (see store_cache.h and store.h): slot
 * bookkeeping, the eviction choice, the reads that fill slots (jobs of the
 * reader pool, store_io.h, each from the copy whose drive should finish it
 * first), hedged reads, where every byte read goes (demand, prefetch used,
 * prefetch wasted), and the acquire path: a request pins what is
 * resident, lets prefetch resolve the layer's guesses, finds slots for
 * the misses and issues their reads ahead of every guess; wait hands out
 * the arrays once the reads are done (hedging a read that runs well past
 * its drive's p95); release unpins.
 */
#include "store/store_cache.h"

#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model/mxfp4.h"

static uint64_t now_ns(void)
{
	return k3_store_io_now_ns();
}

/* A slot whose read is done (ready, or failed with its error to report). */
static bool slot_readable(const struct k3_store_slot *sl)
{
	return sl->state != K3_STORE_SLOT_QUEUED && sl->state != K3_STORE_SLOT_READING;
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

/* Counts one demand acquisition for the frequency policy. Counts halve
 * every 8 x n_slots acquisitions, so popularity follows the workload. */
static void note_use(struct k3_store *s, int64_t ex)
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

/* Bytes of a finished read whose fate is known now. */
static void charge(struct k3_store *s, uint32_t d, uint64_t bytes, enum k3_store_fate fate)
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
		charge(s, job->drive, bytes, K3_STORE_FATE_NONE);
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
		charge(s, job->drive, bytes, demand ? K3_STORE_FATE_NONE : sl->fate);
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
	charge(s, h->drive, bytes, K3_STORE_FATE_NONE);
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

/* Waits (lock held) until some read completes, first hedging the demand
 * reads among views[0..n) (those not taken) that run well past their
 * drive's p95, and waking in time for the next one to pass it. */
static void wait_reads(struct k3_store *s, const struct k3_store_view *views, size_t n,
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
		charge(s, sl->drive, bytes, K3_STORE_FATE_NONE);
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

/* ---- acquire / release ---- */

/* The engine enters a store call: the time since it left the last one
 * was compute. Returns the entry time. */
static uint64_t engine_enter(struct k3_store *s)
{
	uint64_t t0 = now_ns();

	if (s->last_exit_ns && t0 > s->last_exit_ns)
		s->st.compute_ns += t0 - s->last_exit_ns;
	return t0;
}

/* The engine leaves a store call entered at t0: that time was I/O wait. */
static void engine_leave(struct k3_store *s, uint64_t t0)
{
	s->last_exit_ns = now_ns();
	s->st.io_wait_ns += s->last_exit_ns - t0;
}

static void unpin_call(struct k3_store *s, const int32_t *got, size_t n)
{
	for (size_t k = 0; k < n; k++) {
		struct k3_store_slot *sl;
		if (got[k] < 0)
			continue;
		sl = &s->slots[got[k]];
		sl->pins--;
		/* A demand read this call queued and no longer needs: drop it. */
		if (sl->pins == 0 && (sl->state == K3_STORE_SLOT_QUEUED ||
				      sl->state == K3_STORE_SLOT_ERROR))
			k3_store_cache_drop(s, got[k], false);
	}
}

/* One request's working lists: got[k] is the slot of experts[k] (-1 until
 * it has one); miss[0..n_miss) the slots whose reads it issues. */
struct request {
	uint32_t layer;
	const uint32_t *experts;
	size_t n;
	uint64_t gen;             /* this request's acquire generation */
	int32_t *got, *miss;
	size_t n_miss;
};

/* Counts the demand hit or miss of a resident slot pinned by a request: an
 * expert once per step, and a prefetch credited only when its read started
 * in an earlier step (one submitted in this same step is the demand read
 * under another name). */
static void count_resident(struct k3_store *s, struct k3_store_slot *sl)
{
	if (sl->prefetched) {
		bool later = sl->prefetch_step < s->step;
		enum k3_store_fate fate = later ? K3_STORE_FATE_USED : K3_STORE_FATE_LATE;
		sl->prefetched = false;
		s->prefetch_outstanding--;
		if (sl->state != K3_STORE_SLOT_QUEUED) {
			if (later)
				s->st.prefetch_used++;
			else
				s->st.prefetch_late++;
			/* its bytes: now if they are in, else when its read ends */
			if (sl->state == K3_STORE_SLOT_READING)
				sl->fate = (uint8_t)fate;
			else
				charge(s, sl->drive, sl->read_bytes, fate);
		}
		if (sl->state == K3_STORE_SLOT_READY && later)
			s->st.demand_hits++;
		else
			s->st.demand_misses++;
	} else if (sl->state == K3_STORE_SLOT_READY) {
		s->st.demand_hits++;
	} else {
		s->st.demand_misses++;
	}
}

/* Step 1: pins every requested expert that is resident (ready, loading or
 * queued), so that finding slots for the misses can never evict it. A
 * right guess whose read has not started becomes a demand read, issued
 * with the misses. Returns 0 or -ENOENT for an expert the source lacks. */
static int pin_resident(struct k3_store *s, struct request *rq, struct k3_err *err)
{
	for (size_t k = 0; k < rq->n; k++) {
		int64_t ex = k3_store_source_find(s->src, rq->layer, rq->experts[k]);
		int32_t i;
		struct k3_store_slot *sl;
		if (ex < 0)
			return k3_err_set(err, -ENOENT, "expert (%" PRIu32 ", %" PRIu32 ") is not in"
					  " the expert source", rq->layer, rq->experts[k]);
		if (s->seen[ex] != s->epoch) {
			s->seen[ex] = s->epoch;
			s->st.distinct_experts++;
		}
		i = s->slot_of[ex];
		if (i >= 0 && s->slots[i].state == K3_STORE_SLOT_ERROR && s->slots[i].pins == 0) {
			k3_store_cache_drop(s, i, false);   /* a failed read is retried */
			i = -1;
		}
		if (i < 0)
			continue;
		sl = &s->slots[i];
		rq->got[k] = i;
		sl->pins++;
		sl->missed = false;
		/* a rejected guess still being read: wanted after all, and
		 * demand now (it no longer pauses for other demand) */
		k3_store_io_set_stop(s->io, &sl->job, false);
		if (sl->prefetched)
			k3_store_io_promote(s->io, &sl->job);
		if (k3_store_io_queued(&sl->job) == K3_STORE_IO_PREFETCH) {
			k3_store_io_cancel(s->io, &sl->job);
			sl->demand = true;
			rq->miss[rq->n_miss++] = i;
		}
		if (sl->acq_gen == rq->gen)
			continue;   /* duplicate within this call: one count */
		sl->acq_gen = rq->gen;
		/* Again in the same step (a chunk whose positions share an
		 * expert, acquired call by call): one count per step too. */
		if (s->step > 0 && sl->counted_step == s->step)
			continue;
		sl->counted_step = s->step;
		sl->last_use = ++s->tick;
		note_use(s, ex);
		count_resident(s, sl);
	}
	return 0;
}

/* The -ENOSPC of a request whose miss experts[k] finds every unpinned slot
 * taken: the message gives the budget the pins need. */
static int no_slot(const struct k3_store *s, const struct request *rq, size_t k,
		   struct k3_err *err)
{
	uint32_t other = 0, mine = 0;

	for (uint32_t j = 0; j < s->n_slots; j++) {
		other += s->slots[j].pins > 0 && s->slots[j].acq_gen != rq->gen;
		mine += s->slots[j].pins > 0 && s->slots[j].acq_gen == rq->gen;
	}
	for (size_t m = k; m < rq->n; m++)
		mine += rq->got[m] < 0;   /* upper bound: duplicates count twice */
	return k3_err_set(err, -ENOSPC, "expert cache of %" PRIu32 " slots (%" PRIu64
			  " bytes each) cannot hold the %zu experts layer %" PRIu32
			  " needs at once while %" PRIu32 " slots are pinned by"
			  " experts in use; the budget must be at least %" PRIu64
			  " bytes", s->n_slots, s->slot_bytes, rq->n, rq->layer, other,
			  (uint64_t)(other + mine) * s->slot_bytes);
}

/* A slot for the miss experts[k]: a free one, else an unstarted guess of
 * another layer, else the policy's victim; when every unpinned slot is
 * being read, waits for one to finish. Returns the slot (FREE), or -ENOSPC
 * when every slot is pinned. */
static int32_t take_slot(struct k3_store *s, const struct request *rq, size_t k,
			 struct k3_err *err)
{
	for (;;) {
		int32_t i = k3_store_cache_find_free(s);
		if (i < 0) {
			/* an unstarted guess of another layer */
			struct k3_store_io_job *job = k3_store_io_first(s->io, K3_STORE_IO_PREFETCH);
			if (job) {
				i = k3_store_cache_slot_of_job(s, job);
				k3_store_cache_drop(s, i, false);
			}
		}
		if (i < 0) {
			i = k3_store_cache_victim(s, false, rq->layer);
			if (i >= 0)
				k3_store_cache_drop(s, i, true);
		}
		if (i >= 0)
			return i;
		/* an unpinned slot being read, or whose read lost to its hedge
		 * and still runs (evictable once that read ends) */
		bool waitable = false;
		for (uint32_t j = 0; j < s->n_slots && !waitable; j++)
			waitable = s->slots[j].pins == 0 && (s->slots[j].state == K3_STORE_SLOT_READING ||
							     s->slots[j].loser);
		if (!waitable)
			return no_slot(s, rq, k, err);
		k3_store_io_wait(s->io);   /* every unpinned slot is being read; one will finish */
	}
}

/* Step 3 (after prefetch resolved the layer): a slot for each miss, pinned
 * and counted, its read to be issued. Returns 0 or -ENOSPC. */
static int place_misses(struct k3_store *s, struct request *rq, struct k3_err *err)
{
	for (size_t k = 0; k < rq->n; k++) {
		int64_t ex = k3_store_source_find(s->src, rq->layer, rq->experts[k]);
		struct k3_store_slot *sl;
		int32_t i;
		if (rq->got[k] >= 0)
			continue;
		i = s->slot_of[ex];
		if (i >= 0) {   /* a duplicate of a miss placed above */
			rq->got[k] = i;
			s->slots[i].pins++;
			continue;
		}
		i = take_slot(s, rq, k, err);
		if (i < 0)
			return i;
		k3_store_cache_assign(s, i, ex);
		sl = &s->slots[i];
		sl->demand = true;
		sl->pins = 1;
		sl->acq_gen = rq->gen;
		sl->counted_step = s->step;
		sl->last_use = ++s->tick;
		note_use(s, ex);
		s->st.demand_misses++;
		rq->got[k] = i;
		rq->miss[rq->n_miss++] = i;
	}
	return 0;
}

int k3_store_request(struct k3_store *s, uint32_t layer, const uint32_t *experts,
		     size_t n, struct k3_store_view *views, struct k3_err *err)
{
	struct request rq = { .layer = layer, .experts = experts, .n = n };
	uint64_t t0;
	int rc;

	if (n == 0)
		return 0;
	rq.got = malloc(n * sizeof(*rq.got));
	rq.miss = malloc(n * sizeof(*rq.miss));
	if (!rq.got || !rq.miss) {
		free(rq.got);
		free(rq.miss);
		return k3_err_set(err, -ENOMEM, "out of memory");
	}
	for (size_t k = 0; k < n; k++)
		rq.got[k] = -1;

	k3_store_io_lock(s->io);
	t0 = engine_enter(s);
	rq.gen = ++s->acq_gen;
	rc = pin_resident(s, &rq, err);
	if (rc == 0) {
		/* The real routing is known: prefetch resolves the layer's guesses. */
		k3_store_prefetch_routed(s, layer, rq.gen);
		rc = place_misses(s, &rq, err);
	}
	if (rc) {
		/* Queued demand reads of this call are dropped; reads in flight
		 * finish and stay resident unpinned (evictable). */
		unpin_call(s, rq.got, n);
		s->last_exit_ns = now_ns();
	} else {
		k3_store_prefetch_score(s, layer, rq.gen);
		/* the misses, sorted by file offset, ahead of every prefetch */
		k3_store_cache_issue(s, rq.miss, rq.n_miss);
		for (size_t k = 0; k < n; k++)
			views[k] = (struct k3_store_view){ .layer = layer, .expert = experts[k],
							   .slot = (uint32_t)rq.got[k] };
		engine_leave(s, t0);
	}
	k3_store_io_unlock(s->io);
	free(rq.got);
	free(rq.miss);
	return rc;
}

/* unpin_call over the slots of views[0..n) (one request). */
static void unpin_views(struct k3_store *s, const struct k3_store_view *views, size_t n)
{
	for (size_t k = 0; k < n; k++) {
		int32_t i = (int32_t)views[k].slot;
		unpin_call(s, &i, 1);
	}
}

/* The error of a failed read of views[k]'s slot. */
static int read_error(const struct k3_store *s, const struct k3_store_view *v,
		      const struct k3_store_slot *sl, struct k3_err *err)
{
	if (sl->err == -EBADMSG)
		return k3_err_set(err, -EBADMSG, "expert (%" PRIu32 ", %" PRIu32 ") has an MXFP4"
				  " scale byte 255 (NaN): the checkpoint is damaged",
				  v->layer, v->expert);
	return k3_err_set(err, sl->err, "cannot read expert (%" PRIu32 ", %" PRIu32
			  ") from '%s': %s", v->layer, v->expert,
			  k3_store_source_file_path(s->src,
				k3_store_source_expert(s->src, (size_t)sl->ex)->ext[0].file),
			  strerror(-sl->err));
}

static void fill_view(const struct k3_store *s, struct k3_store_view *v)
{
	const struct k3_store_slot *sl = &s->slots[v->slot];

	for (int a = 0; a < K3_STORE_ARRAYS; a++) {
		v->array[a] = sl->mem ? sl->mem + sl->plan.array_offset[a] : NULL;
		v->length[a] = sl->plan.array_length[a];
	}
}

int k3_store_wait(struct k3_store *s, struct k3_store_view *views, size_t n, struct k3_err *err)
{
	uint64_t t0;
	int rc = 0;

	if (n == 0)
		return 0;
	k3_store_io_lock(s->io);
	t0 = engine_enter(s);
	for (size_t k = 0; k < n; k++) {
		struct k3_store_slot *sl = &s->slots[views[k].slot];
		while (!slot_readable(sl))
			wait_reads(s, views, n, NULL);
		if (sl->state == K3_STORE_SLOT_ERROR && rc == 0)
			rc = read_error(s, &views[k], sl, err);
	}
	if (rc) {
		unpin_views(s, views, n);
	} else {
		for (size_t k = 0; k < n; k++)
			fill_view(s, &views[k]);
	}
	engine_leave(s, t0);
	k3_store_io_unlock(s->io);
	return rc;
}

int k3_store_wait_any(struct k3_store *s, struct k3_store_view *views, size_t n,
		      uint8_t *taken, size_t *which, struct k3_err *err)
{
	uint64_t t0;
	int rc = 0;

	k3_store_io_lock(s->io);
	t0 = engine_enter(s);
	for (;;) {
		bool left = false;
		size_t k;
		for (k = 0; k < n; k++) {
			if (taken[k])
				continue;
			left = true;
			if (slot_readable(&s->slots[views[k].slot]))
				break;
		}
		if (!left) {
			rc = 0;
			break;
		}
		if (k == n) {
			wait_reads(s, views, n, taken);
			continue;
		}
		const struct k3_store_slot *sl = &s->slots[views[k].slot];
		if (sl->state == K3_STORE_SLOT_ERROR) {
			rc = read_error(s, &views[k], sl, err);
			unpin_views(s, views, n);
			break;
		}
		for (size_t j = k; j < n; j++) {
			if (!taken[j] && views[j].slot == views[k].slot) {
				fill_view(s, &views[j]);
				taken[j] = 1;
			}
		}
		*which = k;
		rc = 1;
		break;
	}
	engine_leave(s, t0);
	k3_store_io_unlock(s->io);
	return rc;
}

bool k3_store_would_block(struct k3_store *s, const struct k3_store_view *views, size_t n,
			  const uint8_t *taken)
{
	bool waiting = false, readable = false;

	k3_store_io_lock(s->io);
	for (size_t k = 0; k < n && !readable; k++) {
		if (taken[k])
			continue;
		if (slot_readable(&s->slots[views[k].slot]))
			readable = true;
		else
			waiting = true;
	}
	k3_store_io_unlock(s->io);
	return waiting && !readable;
}

void k3_store_request_abort(struct k3_store *s, const struct k3_store_view *views, size_t n)
{
	k3_store_io_lock(s->io);
	unpin_views(s, views, n);
	k3_store_io_unlock(s->io);
}

int k3_store_acquire(struct k3_store *s, uint32_t layer, const uint32_t *experts,
		     size_t n, struct k3_store_view *views, struct k3_err *err)
{
	int rc = k3_store_request(s, layer, experts, n, views, err);
	if (rc)
		return rc;
	return k3_store_wait(s, views, n, err);
}

void k3_store_release(struct k3_store *s, const struct k3_store_view *views, size_t n)
{
	k3_store_io_lock(s->io);
	for (size_t k = 0; k < n; k++) {
		struct k3_store_slot *sl = &s->slots[views[k].slot];
		if (sl->pins > 0)
			sl->pins--;
	}
	k3_store_io_unlock(s->io);
}

bool k3_store_resident(struct k3_store *s, uint32_t layer, uint32_t expert)
{
	int64_t ex = k3_store_source_find(s->src, layer, expert);
	bool r = false;

	k3_store_io_lock(s->io);
	if (ex >= 0 && s->slot_of[ex] >= 0)
		r = s->slots[s->slot_of[ex]].state == K3_STORE_SLOT_READY;
	k3_store_io_unlock(s->io);
	return r;
}

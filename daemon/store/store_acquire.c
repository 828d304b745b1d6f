/*
 * store_acquire.c - the expert cache's acquire path (see store.h and
 * store_cache.h): a request pins what is resident, lets prefetch resolve
 * the layer's guesses, finds slots for the misses and issues their reads
 * ahead of every guess; wait hands out the arrays once the reads are done
 * (hedging a read that runs well past its drive's p95, store_cache.c);
 * release unpins.
 */
#include "store/store_cache.h"

#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* ---- acquire / release ---- */

/* The engine enters a store call: the time since it left the last one
 * was compute. Returns the entry time. */
static uint64_t engine_enter(struct k3_store *s)
{
	uint64_t t0 = k3_store_io_now_ns();

	if (s->last_exit_ns && t0 > s->last_exit_ns)
		s->st.compute_ns += t0 - s->last_exit_ns;
	return t0;
}

/* The engine leaves a store call entered at t0: that time was I/O wait. */
static void engine_leave(struct k3_store *s, uint64_t t0)
{
	s->last_exit_ns = k3_store_io_now_ns();
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
				k3_store_cache_charge(s, sl->drive, sl->read_bytes, fate);
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
		k3_store_cache_note_use(s, ex);
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
		k3_store_cache_note_use(s, ex);
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
		s->last_exit_ns = k3_store_io_now_ns();
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
		while (!k3_store_slot_readable(sl))
			k3_store_cache_wait_reads(s, views, n, NULL);
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
			if (k3_store_slot_readable(&s->slots[views[k].slot]))
				break;
		}
		if (!left) {
			rc = 0;
			break;
		}
		if (k == n) {
			k3_store_cache_wait_reads(s, views, n, taken);
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
		if (k3_store_slot_readable(&s->slots[views[k].slot]))
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

/* store.c - expert cache, reader pool and prefetch (see store.h). */
#include "store/store.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model/mxfp4.h"

enum slot_state {
	SLOT_FREE = 0,
	SLOT_QUEUED,    /* waiting in a read queue */
	SLOT_READING,   /* a reader thread owns the memory */
	SLOT_READY,
	SLOT_ERROR,
};

enum { Q_NONE = 0, Q_DEMAND = 1, Q_PREFETCH = 2 };

struct slot {
	uint8_t *mem;
	int64_t ex;              /* source expert index, -1 when free */
	enum slot_state state;
	unsigned pins;
	bool demand;             /* queued as demand (else prefetch) */
	bool prefetched;         /* loaded by a prefetch not yet credited or wasted */
	bool missed;             /* prefetched, and its layer's real routing did not choose
				  * it: the cold end, evicted before anything else */
	bool abort;              /* missed while being read: its reader stops at the next
				  * piece and drops it (a claim clears it) */
	uint8_t guess_kind;      /* enum k3_store_guess_kind of its prefetch */
	uint64_t prefetch_step;  /* step the prefetch was submitted in */
	uint64_t last_use;       /* tick of the last acquire */
	uint64_t read_bytes;     /* bytes its read cost */
	uint64_t acq_gen;        /* acquire call that last pinned it */
	uint64_t counted_step;   /* step whose demand counters already include it */
	int err;                 /* read errno when SLOT_ERROR */
	int queue;               /* Q_* it sits in */
	int32_t qprev, qnext;
	uint32_t sort_file;      /* first read's (file, offset): issue order */
	uint64_t sort_off;
};

struct queue {
	int32_t head, tail;
	uint32_t len;
};

/* A lookahead guess waiting for its layer's real routing to be scored. */
struct pending_guess {
	int64_t ex;
	uint32_t rank;
};

/* One lookahead kind's guesses waiting to be scored, and the gate's record
 * of that kind: the after-layer and the partial lookahead guess with
 * different precision, and each kind's reads are gated on its own. */
struct guess_record {
	struct pending_guess *pend;    /* [n_layers][PENDING_MAX] */
	uint32_t *n_pend;              /* [n_layers] */
	uint32_t *gate_n, *gate_hit;   /* [n_layers][K3_STORE_GUESS_RANKS], windowed */
	uint64_t rank_n[K3_STORE_GUESS_RANKS], rank_hit[K3_STORE_GUESS_RANKS];   /* their sums over layers */
	uint64_t rank_scored[K3_STORE_GUESS_RANKS], rank_right[K3_STORE_GUESS_RANKS];
};

enum {
	PENDING_MAX = 64,        /* guesses scored per layer and lookahead */
	GATE_PRIOR_N = 4,        /* the gate's priors weigh as 4 guesses */
	GATE_WINDOW = 512,       /* counts halve here: the estimate follows the workload */
};

struct k3_store {
	const struct k3_store_source *src;
	struct k3_store_config cfg;
	uint64_t slot_bytes;
	uint32_t n_slots;
	struct slot *slots;
	int32_t *slot_of;        /* per source expert: slot or -1 */
	uint32_t *uses;          /* per source expert: decayed acquire count (FREQ) */
	uint64_t uses_total;     /* acquisitions since the last decay */
	pthread_mutex_t mu;
	pthread_cond_t work_cv;  /* readers wait for jobs */
	pthread_cond_t done_cv;  /* acquire/drain wait for reads */
	pthread_t threads[K3_STORE_MAX_IO_THREADS];
	unsigned n_threads;
	bool stop;
	bool hold_prefetch;
	bool hold_reads;               /* no read starts at all (tests) */
	bool hold_pieces;              /* guesses pause between pieces (tests) */
	struct queue q[3];
	uint32_t in_flight;
	uint32_t prefetch_in_flight;    /* of in_flight, prefetch reads */
	uint32_t prefetch_readers;      /* most readers prefetch reads may occupy */
	uint32_t prefetch_outstanding;  /* slots with prefetched == true */
	uint64_t piece_bytes;           /* a guess's read is cut at these (cfg or default) */
	uint64_t step, tick, acq_gen;
	uint64_t last_exit_ns;
	struct k3_store_stats st;
	/* Lookahead scoring and the precision gate, per source layer id. */
	uint32_t n_layers;             /* largest layer id + 1 */
	struct guess_record rec[K3_STORE_GUESS_KINDS];   /* by enum k3_store_guess_kind */
	double min_precision;
};

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* A slot whose read is done (ready, or failed with its error to report). */
static bool slot_readable(const struct slot *sl)
{
	return sl->state != SLOT_QUEUED && sl->state != SLOT_READING;
}

/* ---- queues (doubly linked through slot indices) ---- */

static void q_remove(struct k3_store *s, int32_t i)
{
	struct slot *sl = &s->slots[i];
	struct queue *q = &s->q[sl->queue];

	if (sl->qprev >= 0)
		s->slots[sl->qprev].qnext = sl->qnext;
	else
		q->head = sl->qnext;
	if (sl->qnext >= 0)
		s->slots[sl->qnext].qprev = sl->qprev;
	else
		q->tail = sl->qprev;
	q->len--;
	sl->queue = Q_NONE;
	sl->qprev = sl->qnext = -1;
}

static void q_push(struct k3_store *s, int which, int32_t i)
{
	struct slot *sl = &s->slots[i];
	struct queue *q = &s->q[which];

	sl->queue = which;
	sl->qnext = -1;
	sl->qprev = q->tail;
	if (q->tail >= 0)
		s->slots[q->tail].qnext = i;
	else
		q->head = i;
	q->tail = i;
	q->len++;
}

/* ---- slot bookkeeping ---- */

static uint32_t layer_of(const struct k3_store *s, int64_t ex)
{
	return k3_store_source_expert(s->src, (size_t)ex)->layer;
}

/* Returns a resident slot to FREE, settling prefetch accounting. The slot
 * must be unpinned and not being read. */
static void slot_drop(struct k3_store *s, int32_t i, bool eviction)
{
	struct slot *sl = &s->slots[i];

	if (sl->queue != Q_NONE)
		q_remove(s, i);
	if (sl->prefetched) {
		if (sl->state == SLOT_QUEUED)
			s->st.prefetch_cancelled++;
		else
			s->st.prefetch_wasted_bytes += sl->read_bytes;
		sl->prefetched = false;
		s->prefetch_outstanding--;
	}
	sl->missed = false;
	sl->abort = false;
	if (eviction && sl->state == SLOT_READY)
		s->st.evictions++;
	s->slot_of[sl->ex] = -1;
	sl->ex = -1;
	sl->state = SLOT_FREE;
	sl->read_bytes = 0;
	sl->err = 0;
}

/* The eviction choice among READY/ERROR unpinned slots; -1 if none.
 *
 * Guesses read ahead and not (yet) used are the cold end: a demand read
 * takes the oldest of them before anything a demand read brought in, so a
 * wrong guess never costs a useful expert (the guess's own read is the
 * whole price of the mistake, counted as prefetch_wasted_bytes).
 *
 * for_prefetch (a guess needs a slot): an unresolved guess is never taken
 * (a guess must not evict another guess), nor any expert of `layer`, the
 * layer being guessed (its real routing may need it: evicting it would
 * turn a hit into a read). */
static int32_t pick_victim(struct k3_store *s, bool for_prefetch, uint32_t layer)
{
	/* FREQ: the quarter of the cache acquired most recently is protected
	 * (token-to-token reuse); outside it the fewest decayed uses go
	 * first, then the least recent. docs/store.md has the measurements. */
	uint64_t window = s->n_slots / 4;
	int32_t best = -1, cold = -1;
	uint64_t best_key = 0, best_t = 0, cold_t = 0;

	for (uint32_t i = 0; i < s->n_slots; i++) {
		const struct slot *sl = &s->slots[i];
		uint64_t key = 0;
		if (sl->pins || (sl->state != SLOT_READY && sl->state != SLOT_ERROR))
			continue;
		if (sl->state == SLOT_ERROR)
			return (int32_t)i;
		if (sl->prefetched) {
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
		if (for_prefetch && layer_of(s, sl->ex) == layer)
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

static int32_t find_free(struct k3_store *s)
{
	for (uint32_t i = 0; i < s->n_slots; i++)
		if (s->slots[i].state == SLOT_FREE)
			return (int32_t)i;
	return -1;
}

static void slot_assign(struct k3_store *s, int32_t i, int64_t ex)
{
	struct slot *sl = &s->slots[i];
	struct k3_store_plan plan;

	k3_store_source_plan(s->src, (size_t)ex, &plan);
	sl->ex = ex;
	sl->state = SLOT_QUEUED;
	sl->pins = 0;
	sl->acq_gen = 0;
	sl->counted_step = UINT64_MAX;   /* a new occupant has not been counted */
	sl->prefetched = false;
	sl->missed = false;
	sl->abort = false;
	sl->err = 0;
	sl->read_bytes = 0;
	sl->sort_file = plan.read[0].file;
	sl->sort_off = plan.read[0].offset;
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

/* ---- readers ---- */

/* Pieces of one planned read of `piece` bytes (a multiple of
 * K3_STORE_ALIGN), cut at file offsets that are multiples of `piece` from
 * the read's aligned start: every piece but the first starts aligned, so
 * O_DIRECT never reads a block twice and the pieces cost exactly the bytes
 * of the whole read. */
static uint64_t read_pieces(const struct k3_store_read *rd, uint64_t piece)
{
	return (rd->offset % K3_STORE_ALIGN + rd->length + piece - 1) / piece;
}

static struct k3_store_read read_piece(const struct k3_store_read *rd, uint64_t piece,
				       uint64_t p)
{
	uint64_t a = rd->offset - rd->offset % K3_STORE_ALIGN + p * piece, b = a + piece;
	uint64_t end = rd->offset + rd->length;

	if (a < rd->offset)
		a = rd->offset;
	if (b > end)
		b = end;
	return (struct k3_store_read){ .file = rd->file, .offset = a, .length = b - a,
				       .slot_offset = rd->slot_offset + (a - rd->offset) };
}

/* Reads slot i's plan; returns 0 or a negative errno, with the device
 * bytes in *bytes. A guess (not demand) is read in pieces: between two,
 * under the lock, a guess its layer's real routing rejected meanwhile
 * (abort) stops there, so a wrong guess costs the pieces read so far
 * instead of the whole expert. Returns with s->mu held and *aborted set
 * when it stopped; without the lock otherwise. */
static int read_slot(struct k3_store *s, int32_t i, const struct k3_store_plan *plan,
		     bool demand, uint64_t *bytes, bool *aborted)
{
	struct slot *sl = &s->slots[i];
	bool first = true;

	*bytes = 0;
	*aborted = false;
	for (unsigned r = 0; r < plan->n_reads; r++) {
		uint64_t piece = demand ? UINT64_MAX : s->piece_bytes;
		uint64_t n = demand ? 1 : read_pieces(&plan->read[r], piece);
		for (uint64_t p = 0; p < n; p++) {
			struct k3_store_read rd = demand ? plan->read[r]
							 : read_piece(&plan->read[r], piece, p);
			int64_t got;
			if (!demand && !first) {
				pthread_mutex_lock(&s->mu);
				while (s->hold_pieces && !s->stop)
					pthread_cond_wait(&s->work_cv, &s->mu);
				if (sl->abort) {
					*aborted = true;
					return 0;
				}
				pthread_mutex_unlock(&s->mu);
			}
			first = false;
			got = k3_store_source_pread(s->src, &rd, sl->mem);
			if (got < 0)
				return (int)got;
			*bytes += (uint64_t)got;
		}
	}
	return 0;
}

static void *reader_main(void *arg)
{
	struct k3_store *s = arg;
	struct k3_store_plan plan;

	pthread_mutex_lock(&s->mu);
	for (;;) {
		int32_t i;
		struct slot *sl;
		bool demand, aborted;
		uint64_t bytes = 0;
		int rc = 0;

		/* Demand reads always go first, and prefetch reads never take
		 * the last free reader (prefetch_readers = readers - 1 when
		 * there are several): a demand read issued while guesses are
		 * being read starts at once instead of behind one of them. */
		while (!s->stop && (s->hold_reads || (s->q[Q_DEMAND].len == 0 &&
		       (s->q[Q_PREFETCH].len == 0 || s->hold_prefetch ||
			s->prefetch_in_flight >= s->prefetch_readers))))
			pthread_cond_wait(&s->work_cv, &s->mu);
		if (s->stop)
			break;
		i = s->q[Q_DEMAND].len ? s->q[Q_DEMAND].head : s->q[Q_PREFETCH].head;
		sl = &s->slots[i];
		q_remove(s, i);
		demand = sl->demand;
		sl->state = SLOT_READING;
		s->in_flight++;
		if (!demand) {
			s->st.prefetch_issued++;
			s->prefetch_in_flight++;
		}
		k3_store_source_plan(s->src, (size_t)sl->ex, &plan);
		pthread_mutex_unlock(&s->mu);

		rc = read_slot(s, i, &plan, demand, &bytes, &aborted);

		if (rc == 0 && !aborted && s->cfg.check_scales) {
			static const int scales[3] = { K3_STORE_W1_SCALE, K3_STORE_W2_SCALE,
						       K3_STORE_W3_SCALE };
			for (int k = 0; k < 3 && rc == 0; k++)
				if (k3_mxfp4_check_scales(sl->mem + plan.array_offset[scales[k]],
							  plan.array_length[scales[k]], "expert", NULL))
					rc = -EBADMSG;
		}

		if (!aborted)
			pthread_mutex_lock(&s->mu);
		s->in_flight--;
		if (!demand) {
			s->prefetch_in_flight--;
			if (s->q[Q_PREFETCH].len)   /* a reader may take the next guess */
				pthread_cond_signal(&s->work_cv);
		}
		s->st.bytes_read += bytes;
		s->st.reads++;
		if (demand)
			s->st.demand_bytes += bytes;
		else
			s->st.prefetch_issued_bytes += bytes;
		sl->read_bytes = bytes;
		if (aborted) {
			s->st.prefetch_aborted++;
			slot_drop(s, i, false);   /* the pieces read: prefetch_wasted_bytes */
		} else {
			sl->err = rc;
			sl->state = rc ? SLOT_ERROR : SLOT_READY;
		}
		pthread_cond_broadcast(&s->done_cv);
	}
	pthread_mutex_unlock(&s->mu);
	return NULL;
}

/* Dry run: the "read" completes on the spot. Called with mu held. */
static void dry_read(struct k3_store *s, int32_t i)
{
	struct slot *sl = &s->slots[i];
	struct k3_store_plan plan;
	uint64_t bytes = 0;

	k3_store_source_plan(s->src, (size_t)sl->ex, &plan);
	for (unsigned r = 0; r < plan.n_reads; r++)
		bytes += plan.read[r].length;
	q_remove(s, i);
	if (!sl->demand)
		s->st.prefetch_issued++;
	s->st.bytes_read += bytes;
	s->st.reads++;
	if (sl->demand)
		s->st.demand_bytes += bytes;
	else
		s->st.prefetch_issued_bytes += bytes;
	sl->read_bytes = bytes;
	sl->state = SLOT_READY;
}

/* ---- lifecycle ---- */

/* Slots, arrays and s itself: what k3_store_new allocates before it
 * starts anything (also its failure path, where the locks may not exist). */
static void free_memory(struct k3_store *s)
{
	if (s->slots)
		for (uint32_t i = 0; i < s->n_slots; i++)
			free(s->slots[i].mem);
	free(s->slots);
	free(s->slot_of);
	free(s->uses);
	for (int g = 0; g < K3_STORE_GUESS_KINDS; g++) {
		free(s->rec[g].pend);
		free(s->rec[g].n_pend);
		free(s->rec[g].gate_n);
		free(s->rec[g].gate_hit);
	}
	free(s);
}

int k3_store_new(const struct k3_store_source *src, const struct k3_store_config *cfg,
		 struct k3_store **out, struct k3_err *err)
{
	struct k3_store *s;
	size_t n_ex = k3_store_source_count(src);
	uint64_t slots;
	int rc;

	*out = NULL;
	if (n_ex == 0)
		return k3_err_set(err, -EINVAL, "the expert source is empty");
	if (cfg->io_threads > K3_STORE_MAX_IO_THREADS)
		return k3_err_set(err, -EINVAL, "%u I/O threads; at most %d", cfg->io_threads,
				  K3_STORE_MAX_IO_THREADS);
	if ((unsigned)cfg->policy >= K3_STORE_POLICY_COUNT)
		return k3_err_set(err, -EINVAL, "unknown eviction policy %d", (int)cfg->policy);
	if (!(cfg->prefetch_min_precision >= 0 && cfg->prefetch_min_precision <= 1))
		return k3_err_set(err, -EINVAL, "prefetch precision gate %g is not in [0, 1]",
				  cfg->prefetch_min_precision);
	if (cfg->prefetch_piece_bytes % K3_STORE_ALIGN)
		return k3_err_set(err, -EINVAL, "prefetch piece of %" PRIu64 " bytes is not a"
				  " multiple of %d", cfg->prefetch_piece_bytes, K3_STORE_ALIGN);
	s = calloc(1, sizeof(*s));
	if (!s)
		return k3_err_set(err, -ENOMEM, "out of memory");
	s->src = src;
	s->cfg = *cfg;
	s->slot_bytes = k3_store_source_slot_bytes(src);
	slots = cfg->cache_bytes / s->slot_bytes;
	if (slots == 0) {
		rc = k3_err_set(err, -EINVAL, "expert cache of %" PRIu64 " bytes cannot hold"
				" one %" PRIu64 "-byte expert", cfg->cache_bytes, s->slot_bytes);
		free(s);
		return rc;
	}
	if (slots > K3_STORE_MAX_EXPERTS)
		slots = K3_STORE_MAX_EXPERTS;
	if (slots > n_ex)
		slots = n_ex;   /* more slots than experts would never be used */
	s->n_slots = (uint32_t)slots;
	if (s->cfg.prefetch_slots < 0)
		s->cfg.prefetch_slots = (int)(s->n_slots / 2);
	s->n_threads = cfg->dry_run ? 0 : cfg->io_threads ? cfg->io_threads
							  : K3_STORE_DEFAULT_IO_THREADS;
	s->prefetch_readers = s->n_threads > 1 ? s->n_threads - 1 : 1;
	s->piece_bytes = cfg->prefetch_piece_bytes ? cfg->prefetch_piece_bytes
						   : K3_STORE_PREFETCH_PIECE_BYTES;
	/* No planned read (its head included) is longer than a slot: a larger
	 * piece reads the same, and the piece arithmetic must not wrap. */
	if (s->piece_bytes > s->slot_bytes)
		s->piece_bytes = (s->slot_bytes + K3_STORE_ALIGN - 1) / K3_STORE_ALIGN *
				 K3_STORE_ALIGN;
	s->min_precision = cfg->prefetch_min_precision > 0 ? cfg->prefetch_min_precision
							    : K3_STORE_PREFETCH_MIN_PRECISION;
	for (size_t i = 0; i < n_ex; i++) {
		uint32_t l = k3_store_source_expert(src, i)->layer;
		if (l + 1 > s->n_layers)
			s->n_layers = l + 1;   /* <= K3_STORE_MAX_LAYERS (store_source.h) */
	}
	s->slots = calloc(s->n_slots, sizeof(*s->slots));
	s->slot_of = malloc(n_ex * sizeof(*s->slot_of));
	s->uses = calloc(n_ex, sizeof(*s->uses));
	bool rec_ok = true;
	for (int g = 0; g < K3_STORE_GUESS_KINDS; g++) {
		struct guess_record *r = &s->rec[g];
		r->pend = calloc((size_t)s->n_layers * PENDING_MAX, sizeof(*r->pend));
		r->n_pend = calloc(s->n_layers, sizeof(*r->n_pend));
		r->gate_n = calloc((size_t)s->n_layers * K3_STORE_GUESS_RANKS, sizeof(*r->gate_n));
		r->gate_hit = calloc((size_t)s->n_layers * K3_STORE_GUESS_RANKS, sizeof(*r->gate_hit));
		rec_ok &= r->pend && r->n_pend && r->gate_n && r->gate_hit;
	}
	if (!s->slots || !s->slot_of || !s->uses || !rec_ok) {
		rc = k3_err_set(err, -ENOMEM, "out of memory");
		goto fail;
	}
	for (size_t i = 0; i < n_ex; i++)
		s->slot_of[i] = -1;
	for (int q = 0; q < 3; q++)
		s->q[q].head = s->q[q].tail = -1;
	for (uint32_t i = 0; i < s->n_slots; i++) {
		struct slot *sl = &s->slots[i];
		sl->ex = -1;
		sl->qprev = sl->qnext = -1;
		if (!cfg->dry_run) {
			void *mem;
			if (posix_memalign(&mem, K3_STORE_ALIGN, s->slot_bytes) != 0) {
				rc = k3_err_set(err, -ENOMEM, "cannot allocate slot %" PRIu32 " of %"
						PRIu32 " (%" PRIu64 " bytes each)", i, s->n_slots,
						s->slot_bytes);
				goto fail;
			}
			sl->mem = mem;
			if (cfg->prefault)
				for (uint64_t b = 0; b < s->slot_bytes; b += 4096)
					sl->mem[b] = 0;
		}
	}
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->work_cv, NULL);
	pthread_cond_init(&s->done_cv, NULL);
	for (unsigned t = 0; t < s->n_threads; t++) {
		if (pthread_create(&s->threads[t], NULL, reader_main, s) != 0) {
			s->n_threads = t;
			k3_store_free(s);
			return k3_err_set(err, -EAGAIN, "cannot start I/O thread %u", t);
		}
	}
	*out = s;
	return 0;
fail:
	free_memory(s);
	return rc;
}

void k3_store_free(struct k3_store *s)
{
	if (!s)
		return;
	pthread_mutex_lock(&s->mu);
	s->stop = true;
	pthread_cond_broadcast(&s->work_cv);
	pthread_mutex_unlock(&s->mu);
	for (unsigned t = 0; t < s->n_threads; t++)
		pthread_join(s->threads[t], NULL);
	pthread_cond_destroy(&s->done_cv);
	pthread_cond_destroy(&s->work_cv);
	pthread_mutex_destroy(&s->mu);
	free_memory(s);
}

void k3_store_step_begin(struct k3_store *s)
{
	pthread_mutex_lock(&s->mu);
	s->step++;
	s->st.steps++;
	pthread_mutex_unlock(&s->mu);
}

void k3_store_idle(struct k3_store *s)
{
	pthread_mutex_lock(&s->mu);
	s->last_exit_ns = 0;
	pthread_mutex_unlock(&s->mu);
}

/* ---- acquire / release ---- */

static int cmp_issue(const void *a, const void *b, void *ctx)
{
	const struct k3_store *s = ctx;
	const struct slot *x = &s->slots[*(const int32_t *)a], *y = &s->slots[*(const int32_t *)b];

	if (x->sort_file != y->sort_file)
		return x->sort_file < y->sort_file ? -1 : 1;
	return x->sort_off < y->sort_off ? -1 : x->sort_off > y->sort_off;
}

static void unpin_call(struct k3_store *s, const int32_t *got, size_t n)
{
	for (size_t k = 0; k < n; k++) {
		struct slot *sl;
		if (got[k] < 0)
			continue;
		sl = &s->slots[got[k]];
		sl->pins--;
		/* A demand read this call queued and no longer needs: drop it. */
		if (sl->pins == 0 && (sl->state == SLOT_QUEUED || sl->state == SLOT_ERROR))
			slot_drop(s, got[k], false);
	}
}

/* Which queued guesses cancel_layer keeps (NULL: none). */
typedef bool keep_fn(const struct k3_store *s, const struct slot *sl, const void *arg);

/* Drops the guesses of `layer` (every layer: UINT32_MAX) still queued
 * (unread) and unpinned, except those keep(s, slot, arg) keeps; returns how
 * many were dropped (prefetch_cancelled counts them). */
static size_t cancel_layer(struct k3_store *s, uint32_t layer, keep_fn *keep, const void *arg)
{
	size_t n = 0;
	int32_t i = s->q[Q_PREFETCH].head;

	while (i >= 0) {
		int32_t next = s->slots[i].qnext;
		struct slot *sl = &s->slots[i];
		if ((layer == UINT32_MAX || layer_of(s, sl->ex) == layer) && sl->pins == 0 &&
		    !(keep && keep(s, sl, arg))) {
			slot_drop(s, i, false);
			n++;
		}
		i = next;
	}
	return n;
}

/* Keeps what the acquire *arg (a uint64_t generation) pinned. */
static bool keep_acquired(const struct k3_store *s, const struct slot *sl, const void *arg)
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
static bool keep_unless_superseded(const struct k3_store *s, const struct slot *sl,
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
 * still being read stop at their next piece (abort). */
static void resolve_layer(struct k3_store *s, uint32_t layer)
{
	if (!s->prefetch_outstanding)
		return;
	for (uint32_t i = 0; i < s->n_slots; i++) {
		struct slot *sl = &s->slots[i];
		if (sl->prefetched && (layer == UINT32_MAX || layer_of(s, sl->ex) == layer)) {
			sl->missed = true;
			if (sl->state == SLOT_READING && sl->pins == 0) {
				sl->abort = true;
				pthread_cond_broadcast(&s->work_cv);   /* a held reader */
			}
		}
	}
}

static uint32_t *gate_cell(uint32_t *table, uint32_t layer, uint32_t rank)
{
	return &table[(size_t)layer * K3_STORE_GUESS_RANKS + rank];
}

/* Scores the lookahead guesses of `layer` (of both kinds) waiting since
 * their last lookahead against the real routing: the experts this acquire
 * `gen` pinned. */
static void score_layer(struct k3_store *s, uint32_t layer, uint64_t gen)
{
	if (layer >= s->n_layers)
		return;
	for (int g = 0; g < K3_STORE_GUESS_KINDS; g++) {
		struct guess_record *rc = &s->rec[g];
		struct pending_guess *pg = &rc->pend[(size_t)layer * PENDING_MAX];
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
static bool gate_open(const struct k3_store *s, const struct guess_record *rc, uint32_t layer,
		      uint32_t rank)
{
	if (!s->cfg.prefetch_auto)
		return true;
	if (layer >= s->n_layers || rank >= K3_STORE_GUESS_RANKS)
		return false;
	double pooled = ((double)rc->rank_hit[rank] + GATE_PRIOR_N * 0.5) /
			((double)rc->rank_n[rank] + GATE_PRIOR_N);
	double n = *gate_cell(rc->gate_n, layer, rank), h = *gate_cell(rc->gate_hit, layer, rank);
	return (h + GATE_PRIOR_N * pooled) / (n + GATE_PRIOR_N) >= s->min_precision;
}

int k3_store_request(struct k3_store *s, uint32_t layer, const uint32_t *experts,
		     size_t n, struct k3_store_view *views, struct k3_err *err)
{
	int32_t *got = NULL, *miss = NULL;
	size_t n_miss = 0;
	uint64_t gen, t0;
	int rc = 0;

	if (n == 0)
		return 0;
	got = malloc(n * sizeof(*got));
	miss = malloc(n * sizeof(*miss));
	if (!got || !miss) {
		free(got);
		free(miss);
		return k3_err_set(err, -ENOMEM, "out of memory");
	}
	for (size_t k = 0; k < n; k++)
		got[k] = -1;

	pthread_mutex_lock(&s->mu);
	t0 = now_ns();
	if (s->last_exit_ns && t0 > s->last_exit_ns)
		s->st.compute_ns += t0 - s->last_exit_ns;
	gen = ++s->acq_gen;

	/* Pass 1: pin what is resident (ready, loading or queued), so that
	 * allocating the misses below can never evict it. */
	for (size_t k = 0; k < n; k++) {
		int64_t ex = k3_store_source_find(s->src, layer, experts[k]);
		int32_t i;
		struct slot *sl;
		if (ex < 0) {
			rc = k3_err_set(err, -ENOENT, "expert (%" PRIu32 ", %" PRIu32 ") is not in"
					" the expert source", layer, experts[k]);
			goto fail;
		}
		i = s->slot_of[ex];
		if (i >= 0 && s->slots[i].state == SLOT_ERROR && s->slots[i].pins == 0) {
			slot_drop(s, i, false);   /* a failed read is retried */
			i = -1;
		}
		if (i < 0)
			continue;
		sl = &s->slots[i];
		got[k] = i;
		sl->pins++;
		sl->abort = false;   /* a rejected guess still being read: wanted after all */
		if (sl->state == SLOT_QUEUED && sl->queue == Q_PREFETCH) {
			/* The guess was right but its read has not started: it
			 * becomes a demand read, issued with the misses. */
			q_remove(s, i);
			sl->demand = true;
			miss[n_miss++] = i;
		}
		if (sl->acq_gen == gen)
			continue;   /* duplicate within this call: one count */
		sl->acq_gen = gen;
		/* Again in the same step (a chunk whose positions share an
		 * expert, acquired call by call): one count per step too. */
		if (s->step > 0 && sl->counted_step == s->step)
			continue;
		sl->counted_step = s->step;
		sl->last_use = ++s->tick;
		note_use(s, ex);
		if (sl->prefetched) {
			/* Credit only a prefetch whose read started before this
			 * step: one submitted in this same step is the demand
			 * read under another name. An unstarted one becomes a
			 * demand read below and earns nothing. */
			bool later = sl->prefetch_step < s->step;
			sl->prefetched = false;
			s->prefetch_outstanding--;
			if (sl->state != SLOT_QUEUED) {
				if (later)
					s->st.prefetch_used++;
				else
					s->st.prefetch_late++;
			}
			if (sl->state == SLOT_READY && later)
				s->st.demand_hits++;
			else
				s->st.demand_misses++;
		} else if (sl->state == SLOT_READY) {
			s->st.demand_hits++;
		} else {
			s->st.demand_misses++;
		}
	}

	/* The real routing is known: queued guesses for this layer that it
	 * did not choose are mispredictions (dropped unread); those read or
	 * being read go to the cold end. */
	cancel_layer(s, layer, keep_acquired, &gen);
	resolve_layer(s, layer);

	/* Pass 2: slots for the misses. */
	for (size_t k = 0; k < n; k++) {
		int64_t ex = k3_store_source_find(s->src, layer, experts[k]);
		int32_t i;
		if (got[k] >= 0)
			continue;
		i = s->slot_of[ex];
		if (i >= 0) {   /* a duplicate of a miss allocated above */
			got[k] = i;
			s->slots[i].pins++;
			continue;
		}
		for (;;) {
			i = find_free(s);
			if (i < 0)
				i = s->q[Q_PREFETCH].head;   /* an unstarted guess of another layer */
			if (i >= 0 && s->slots[i].state != SLOT_FREE)
				slot_drop(s, i, false);
			if (i < 0) {
				i = pick_victim(s, false, layer);
				if (i >= 0)
					slot_drop(s, i, true);
			}
			if (i >= 0)
				break;
			/* Every unpinned slot is being read; one will finish. */
			bool waitable = false;
			for (uint32_t j = 0; j < s->n_slots && !waitable; j++)
				waitable = s->slots[j].state == SLOT_READING && s->slots[j].pins == 0;
			if (!waitable) {
				uint32_t other = 0, mine = 0;
				for (uint32_t j = 0; j < s->n_slots; j++) {
					other += s->slots[j].pins > 0 && s->slots[j].acq_gen != gen;
					mine += s->slots[j].pins > 0 && s->slots[j].acq_gen == gen;
				}
				for (size_t m = k; m < n; m++)
					mine += got[m] < 0;   /* upper bound: duplicates count twice */
				rc = k3_err_set(err, -ENOSPC, "expert cache of %" PRIu32 " slots (%" PRIu64
						" bytes each) cannot hold the %zu experts layer %" PRIu32
						" needs at once while %" PRIu32 " slots are pinned by"
						" experts in use; the budget must be at least %" PRIu64
						" bytes", s->n_slots, s->slot_bytes, n, layer, other,
						(uint64_t)(other + mine) * s->slot_bytes);
				goto fail;
			}
			pthread_cond_wait(&s->done_cv, &s->mu);
		}
		slot_assign(s, i, ex);
		s->slots[i].demand = true;
		s->slots[i].pins = 1;
		s->slots[i].acq_gen = gen;
		s->slots[i].counted_step = s->step;
		s->slots[i].last_use = ++s->tick;
		note_use(s, ex);
		s->st.demand_misses++;
		got[k] = i;
		miss[n_miss++] = i;
	}

	score_layer(s, layer, gen);

	/* Issue the misses sorted by file offset, ahead of every prefetch. */
	qsort_r(miss, n_miss, sizeof(*miss), cmp_issue, s);
	for (size_t k = 0; k < n_miss; k++) {
		q_push(s, Q_DEMAND, miss[k]);
		if (s->cfg.dry_run)
			dry_read(s, miss[k]);
	}
	if (n_miss)
		pthread_cond_broadcast(&s->work_cv);

	for (size_t k = 0; k < n; k++) {
		views[k] = (struct k3_store_view){ .layer = layer, .expert = experts[k],
						   .slot = (uint32_t)got[k] };
	}
	s->last_exit_ns = now_ns();
	s->st.io_wait_ns += s->last_exit_ns - t0;
	pthread_mutex_unlock(&s->mu);
	free(got);
	free(miss);
	return 0;

fail:
	/* Queued demand reads of this call are dropped; reads in flight finish
	 * and stay resident unpinned (evictable). */
	unpin_call(s, got, n);
	s->last_exit_ns = now_ns();
	pthread_mutex_unlock(&s->mu);
	free(got);
	free(miss);
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

int k3_store_wait(struct k3_store *s, struct k3_store_view *views, size_t n, struct k3_err *err)
{
	uint64_t t0;
	int rc = 0;

	if (n == 0)
		return 0;
	pthread_mutex_lock(&s->mu);
	t0 = now_ns();
	if (s->last_exit_ns && t0 > s->last_exit_ns)
		s->st.compute_ns += t0 - s->last_exit_ns;
	for (size_t k = 0; k < n; k++) {
		struct slot *sl = &s->slots[views[k].slot];
		while (sl->state == SLOT_QUEUED || sl->state == SLOT_READING)
			pthread_cond_wait(&s->done_cv, &s->mu);
		if (sl->state == SLOT_ERROR && rc == 0 && sl->err == -EBADMSG)
			rc = k3_err_set(err, -EBADMSG, "expert (%" PRIu32 ", %" PRIu32 ") has an MXFP4"
					" scale byte 255 (NaN): the checkpoint is damaged",
					views[k].layer, views[k].expert);
		else if (sl->state == SLOT_ERROR && rc == 0)
			rc = k3_err_set(err, sl->err, "cannot read expert (%" PRIu32 ", %" PRIu32
					") from '%s': %s", views[k].layer, views[k].expert,
					k3_store_source_file_path(s->src,
						k3_store_source_expert(s->src, (size_t)sl->ex)->ext[0].file),
					strerror(-sl->err));
	}
	if (rc) {
		unpin_views(s, views, n);
	} else {
		for (size_t k = 0; k < n; k++) {
			const struct slot *sl = &s->slots[views[k].slot];
			struct k3_store_plan plan;
			k3_store_source_plan(s->src, (size_t)sl->ex, &plan);
			for (int a = 0; a < K3_STORE_ARRAYS; a++) {
				views[k].array[a] = sl->mem ? sl->mem + plan.array_offset[a] : NULL;
				views[k].length[a] = plan.array_length[a];
			}
		}
	}
	s->last_exit_ns = now_ns();
	s->st.io_wait_ns += s->last_exit_ns - t0;
	pthread_mutex_unlock(&s->mu);
	return rc;
}

static void fill_view(struct k3_store *s, struct k3_store_view *v)
{
	const struct slot *sl = &s->slots[v->slot];
	struct k3_store_plan plan;

	k3_store_source_plan(s->src, (size_t)sl->ex, &plan);
	for (int a = 0; a < K3_STORE_ARRAYS; a++) {
		v->array[a] = sl->mem ? sl->mem + plan.array_offset[a] : NULL;
		v->length[a] = plan.array_length[a];
	}
}

int k3_store_wait_any(struct k3_store *s, struct k3_store_view *views, size_t n,
		      uint8_t *taken, size_t *which, struct k3_err *err)
{
	uint64_t t0;
	int rc = 0;

	pthread_mutex_lock(&s->mu);
	t0 = now_ns();
	if (s->last_exit_ns && t0 > s->last_exit_ns)
		s->st.compute_ns += t0 - s->last_exit_ns;
	for (;;) {
		bool left = false;
		size_t k;
		for (k = 0; k < n; k++) {
			const struct slot *sl;
			if (taken[k])
				continue;
			left = true;
			sl = &s->slots[views[k].slot];
			if (slot_readable(sl))
				break;
		}
		if (!left) {
			rc = 0;
			break;
		}
		if (k == n) {
			pthread_cond_wait(&s->done_cv, &s->mu);
			continue;
		}
		const struct slot *sl = &s->slots[views[k].slot];
		if (sl->state == SLOT_ERROR) {
			if (sl->err == -EBADMSG)
				rc = k3_err_set(err, -EBADMSG, "expert (%" PRIu32 ", %" PRIu32 ") has an"
						" MXFP4 scale byte 255 (NaN): the checkpoint is damaged",
						views[k].layer, views[k].expert);
			else
				rc = k3_err_set(err, sl->err, "cannot read expert (%" PRIu32 ", %" PRIu32
						") from '%s': %s", views[k].layer, views[k].expert,
						k3_store_source_file_path(s->src,
							k3_store_source_expert(s->src, (size_t)sl->ex)->ext[0].file),
						strerror(-sl->err));
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
	s->last_exit_ns = now_ns();
	s->st.io_wait_ns += s->last_exit_ns - t0;
	pthread_mutex_unlock(&s->mu);
	return rc;
}

bool k3_store_would_block(struct k3_store *s, const struct k3_store_view *views, size_t n,
			  const uint8_t *taken)
{
	bool waiting = false, readable = false;

	pthread_mutex_lock(&s->mu);
	for (size_t k = 0; k < n && !readable; k++) {
		if (taken[k])
			continue;
		if (slot_readable(&s->slots[views[k].slot]))
			readable = true;
		else
			waiting = true;
	}
	pthread_mutex_unlock(&s->mu);
	return waiting && !readable;
}

void k3_store_request_abort(struct k3_store *s, const struct k3_store_view *views, size_t n)
{
	pthread_mutex_lock(&s->mu);
	unpin_views(s, views, n);
	pthread_mutex_unlock(&s->mu);
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
	pthread_mutex_lock(&s->mu);
	for (size_t k = 0; k < n; k++) {
		struct slot *sl = &s->slots[views[k].slot];
		if (sl->pins > 0)
			sl->pins--;
	}
	pthread_mutex_unlock(&s->mu);
}

/* ---- prefetch ---- */

size_t k3_store_prefetch_ranked(struct k3_store *s, uint32_t layer, const uint32_t *experts,
				const uint32_t *ranks, size_t n, bool score,
				enum k3_store_guess_kind kind)
{
	int32_t queued[64];
	size_t nq = 0;
	bool full = false;

	if ((unsigned)kind >= K3_STORE_GUESS_KINDS)
		return 0;
	struct guess_record *rc = &s->rec[kind];
	pthread_mutex_lock(&s->mu);
	if (score && layer < s->n_layers)
		rc->n_pend[layer] = 0;   /* a newer lookahead replaces an unscored one */
	if (kind == K3_STORE_GUESS_AFTER && layer < s->n_layers)   /* not UINT32_MAX = every layer */
		cancel_layer(s, layer, keep_unless_superseded,
			     &(struct later_guesses){ layer, experts, n });
	if (layer >= s->n_layers)
		score = false;
	for (size_t k = 0; k < n; k++) {
		int64_t ex = k3_store_source_find(s->src, layer, experts[k]);
		uint32_t rank = ranks ? ranks[k] : (uint32_t)k;
		int32_t i;
		if (nq == sizeof(queued) / sizeof(queued[0]))
			full = true;
		if (full && (!score || rc->n_pend[layer] == PENDING_MAX))
			break;
		if (ex < 0 || s->slot_of[ex] >= 0)
			continue;   /* unknown, or resident / loading: costs nothing */
		if (score && rank < K3_STORE_GUESS_RANKS && rc->n_pend[layer] < PENDING_MAX)
			rc->pend[(size_t)layer * PENDING_MAX + rc->n_pend[layer]++] =
				(struct pending_guess){ ex, rank };
		if (full || s->cfg.prefetch_slots == 0)
			continue;
		if (!gate_open(s, rc, layer, rank)) {
			s->st.prefetch_skipped++;
			continue;
		}
		if (s->prefetch_outstanding >= (uint32_t)s->cfg.prefetch_slots) {
			full = true;
			continue;
		}
		i = find_free(s);
		if (i < 0) {
			i = pick_victim(s, true, layer);
			if (i < 0) {
				full = true;
				continue;
			}
			slot_drop(s, i, true);
		}
		slot_assign(s, i, ex);
		s->slots[i].demand = false;
		s->slots[i].prefetched = true;
		s->slots[i].guess_kind = (uint8_t)kind;
		s->slots[i].prefetch_step = s->step;
		s->slots[i].last_use = ++s->tick;
		s->prefetch_outstanding++;
		queued[nq++] = i;
	}
	qsort_r(queued, nq, sizeof(queued[0]), cmp_issue, s);
	for (size_t k = 0; k < nq; k++) {
		q_push(s, Q_PREFETCH, queued[k]);
		if (s->cfg.dry_run)
			dry_read(s, queued[k]);
	}
	if (nq)
		pthread_cond_broadcast(&s->work_cv);
	pthread_mutex_unlock(&s->mu);
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
	pthread_mutex_lock(&s->mu);
	memcpy(scored, s->rec[kind].rank_scored, sizeof(s->rec[kind].rank_scored));
	memcpy(right, s->rec[kind].rank_right, sizeof(s->rec[kind].rank_right));
	pthread_mutex_unlock(&s->mu);
}

size_t k3_store_prefetch_cancel(struct k3_store *s, uint32_t layer)
{
	size_t n;

	pthread_mutex_lock(&s->mu);
	n = cancel_layer(s, layer, NULL, NULL);
	resolve_layer(s, layer);
	for (int g = 0; g < K3_STORE_GUESS_KINDS; g++) {
		if (layer == UINT32_MAX)
			memset(s->rec[g].n_pend, 0, s->n_layers * sizeof(*s->rec[g].n_pend));
		else if (layer < s->n_layers)
			s->rec[g].n_pend[layer] = 0;
	}
	pthread_mutex_unlock(&s->mu);
	return n;
}

/* ---- queries ---- */

void k3_store_hold_prefetch(struct k3_store *s, bool hold)
{
	pthread_mutex_lock(&s->mu);
	s->hold_prefetch = hold;
	pthread_cond_broadcast(&s->work_cv);
	pthread_cond_broadcast(&s->done_cv);
	pthread_mutex_unlock(&s->mu);
}

void k3_store_hold_reads(struct k3_store *s, bool hold)
{
	pthread_mutex_lock(&s->mu);
	s->hold_reads = hold;
	pthread_cond_broadcast(&s->work_cv);
	pthread_cond_broadcast(&s->done_cv);   /* a drain waits on held reads no more */
	pthread_mutex_unlock(&s->mu);
}

void k3_store_hold_pieces(struct k3_store *s, bool hold)
{
	pthread_mutex_lock(&s->mu);
	s->hold_pieces = hold;
	pthread_cond_broadcast(&s->work_cv);
	pthread_mutex_unlock(&s->mu);
}

void k3_store_drain(struct k3_store *s)
{
	pthread_mutex_lock(&s->mu);
	while ((!s->hold_reads && (s->q[Q_DEMAND].len ||
				   (s->q[Q_PREFETCH].len && !s->hold_prefetch))) ||
	       s->in_flight)
		pthread_cond_wait(&s->done_cv, &s->mu);
	pthread_mutex_unlock(&s->mu);
}

bool k3_store_resident(struct k3_store *s, uint32_t layer, uint32_t expert)
{
	int64_t ex = k3_store_source_find(s->src, layer, expert);
	bool r = false;

	pthread_mutex_lock(&s->mu);
	if (ex >= 0 && s->slot_of[ex] >= 0)
		r = s->slots[s->slot_of[ex]].state == SLOT_READY;
	pthread_mutex_unlock(&s->mu);
	return r;
}

void k3_store_stats_get(struct k3_store *s, struct k3_store_stats *st)
{
	pthread_mutex_lock(&s->mu);
	*st = s->st;
	pthread_mutex_unlock(&s->mu);
}

void k3_store_info_get(struct k3_store *s, struct k3_store_info *info)
{
	memset(info, 0, sizeof(*info));
	pthread_mutex_lock(&s->mu);
	info->n_slots = s->n_slots;
	info->slot_bytes = s->slot_bytes;
	info->io_threads = s->n_threads;
	for (uint32_t i = 0; i < s->n_slots; i++) {
		info->resident += s->slots[i].state != SLOT_FREE;
		info->pinned += s->slots[i].pins > 0;
		if (s->slots[i].prefetched && s->slots[i].state == SLOT_READY)
			info->prefetch_unused_bytes += s->slots[i].read_bytes;
	}
	pthread_mutex_unlock(&s->mu);
	for (uint32_t f = 0; f < k3_store_source_file_count(s->src); f++) {
		if (k3_store_source_file_direct(s->src, f))
			info->files_direct++;
		else
			info->files_buffered++;
	}
}

void k3_store_stats_sub(const struct k3_store_stats *a, const struct k3_store_stats *b,
			struct k3_store_stats *out)
{
	const uint64_t *pa = (const uint64_t *)a, *pb = (const uint64_t *)b;
	uint64_t *po = (uint64_t *)out;

	/* The struct is all uint64_t, by contract of store.h. */
	for (size_t i = 0; i < sizeof(*a) / sizeof(uint64_t); i++)
		po[i] = pa[i] - pb[i];
}

const char *k3_store_policy_name(enum k3_store_policy p)
{
	switch (p) {
	case K3_STORE_POLICY_FREQ: return "freq";
	case K3_STORE_POLICY_LRU: return "lru";
	default: return "?";
	}
}

int k3_store_policy_parse(const char *str, enum k3_store_policy *out, struct k3_err *err)
{
	for (int p = 0; p < K3_STORE_POLICY_COUNT; p++) {
		if (strcmp(str, k3_store_policy_name((enum k3_store_policy)p)) == 0) {
			*out = (enum k3_store_policy)p;
			return 0;
		}
	}
	return k3_err_set(err, -EINVAL, "eviction policy '%s' is not 'lru' or 'freq'", str);
}

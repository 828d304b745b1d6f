/* The store: identical bytes for O_DIRECT on/off and 1 vs 2 I/O threads,
 * pinning (a step needing more than the cache fails clearly and never
 * evicts a pinned expert), eviction order, prefetch cancel, honest
 * counters. */
#include "t.h"

#include <errno.h>
#include <time.h>

#include "store/store.h"
#include "store/store_engine.h"
#include "store/store_pack.h"
#include "fixture.h"

static struct fixture fx;
static uint64_t slot_bytes;
static uint64_t piece_bytes;   /* cfg.prefetch_piece_bytes of the stores mk makes */

static struct k3_store *mk(struct k3_store_source *src, uint64_t slots, unsigned threads,
			   enum k3_store_policy pol)
{
	struct k3_store_config cfg = {
		.cache_bytes = slots * k3_store_source_slot_bytes(src),
		.io_threads = threads,
		.policy = pol,
		.prefetch_slots = -1,
		.prefetch_piece_bytes = piece_bytes,
	};
	struct k3_store *s = NULL;
	struct k3_err err = { 0 };
	int rc = k3_store_new(src, &cfg, &s, &err);

	if (rc)
		printf("store_new: %s\n", err.msg);
	T_EQ_INT(rc, 0);
	slot_bytes = k3_store_source_slot_bytes(src);
	return s;
}

/* Number of views whose bytes differ from the shard bytes. */
static int view_errors(const struct k3_store_view *v, size_t n)
{
	int bad = 0;
	for (size_t k = 0; k < n; k++) {
		size_t i = fx_find(&fx, v[k].layer, v[k].expert);
		if (i == (size_t)-1)
			return 1000;
		for (int a = 0; a < K3_STORE_ARRAYS; a++)
			bad += v[k].length[a] != fx_len[a] ||
			       memcmp(v[k].array[a], fx_array(&fx, i, a), fx_len[a]) != 0;
	}
	return bad;
}

/* Acquires n experts of layer (at most 4), checks their bytes, releases. */
static void use(struct k3_store *s, uint32_t layer, const uint32_t *ids, uint32_t n)
{
	struct k3_store_view v[4];
	struct k3_err err = { 0 };

	T_EQ_INT(k3_store_acquire(s, layer, ids, n, v, &err), 0);
	T_EQ_INT(view_errors(v, n), 0);
	k3_store_release(s, v, n);
}

/* One step that uses one expert. */
static void touch(struct k3_store *s, uint32_t layer, uint32_t expert)
{
	k3_store_step_begin(s);
	use(s, layer, &expert, 1);
}

/* In a new step, after counting into *a: one prefetch of (layer, e),
 * read to the end. */
static void prefetched(struct k3_store *s, struct k3_store_stats *a, uint32_t layer, uint32_t e)
{
	k3_store_stats_get(s, a);
	k3_store_step_begin(s);
	T_EQ_U64(k3_store_prefetch(s, layer, &e, 1), 1);
	k3_store_drain(s);
}

/* Prefetches issued and used, demand hits and misses, in d. */
static void want_counts(const struct k3_store_stats *d, uint64_t issued, uint64_t used, uint64_t hits,
			uint64_t misses)
{
	T_EQ_U64(d->prefetch_issued, issued);
	T_EQ_U64(d->prefetch_used, used);
	T_EQ_U64(d->demand_hits, hits);
	T_EQ_U64(d->demand_misses, misses);
}

/* The counters since a, into d. */
static void since(struct k3_store *s, const struct k3_store_stats *a, struct k3_store_stats *d)
{
	struct k3_store_stats b;

	k3_store_stats_get(s, &b);
	k3_store_stats_sub(&b, a, d);
}

/* Every expert, layer by layer, through a store: O_DIRECT on/off, 1 or 2
 * threads, shards or pack; all must give the shard bytes. */
static void test_identical_bytes(struct k3_store_source *src, unsigned threads)
{
	struct k3_store *s = mk(src, 4, threads, K3_STORE_POLICY_LRU);
	struct k3_store_view v[FX_EXPERTS];
	uint32_t ids[FX_EXPERTS];
	struct k3_err err = { 0 };
	int bad = 0;

	if (!s)
		return;
	for (int round = 0; round < 2; round++)
		for (uint32_t l = 1; l <= FX_LAYERS; l++) {
			/* Three at a time: the cache holds four. */
			for (uint32_t e0 = 0; e0 < FX_EXPERTS; e0 += 3) {
				for (uint32_t k = 0; k < 3; k++)
					ids[k] = (e0 + k) * 3;
				k3_store_step_begin(s);
				T_EQ_INT(k3_store_acquire(s, l, ids, 3, v, &err), 0);
				bad += view_errors(v, 3);
				k3_store_release(s, v, 3);
			}
		}
	T_EQ_INT(bad, 0);
	k3_store_free(s);
}

static void test_pinning(struct k3_store_source *src)
{
	struct k3_store *s = mk(src, 4, 2, K3_STORE_POLICY_LRU);
	struct k3_store_view v[8], w[8];
	struct k3_store_info info;
	struct k3_err err = { 0 };
	uint32_t five[5] = { 0, 3, 6, 9, 12 };
	uint32_t three[3] = { 0, 3, 6 }, two[2] = { 9, 12 };

	if (!s)
		return;
	/* One step needs five experts, the cache holds four: a clear error. */
	k3_store_step_begin(s);
	T_EQ_INT(k3_store_acquire(s, 1, five, 5, v, &err), -ENOSPC);
	T_OK(strstr(err.msg, "cannot hold") != NULL);
	k3_store_info_get(s, &info);
	T_EQ_INT(info.pinned, 0);
	T_EQ_INT(info.n_slots, 4);

	/* Three pinned; two more cannot fit; the pinned three keep their bytes. */
	k3_store_step_begin(s);
	T_EQ_INT(k3_store_acquire(s, 1, three, 3, v, &err), 0);
	k3_store_step_begin(s);
	memset(&err, 0, sizeof(err));
	T_EQ_INT(k3_store_acquire(s, 2, two, 2, w, &err), -ENOSPC);
	T_OK(strstr(err.msg, "while 3 slots are pinned") != NULL);
	T_EQ_INT(view_errors(v, 3), 0);
	T_OK(k3_store_resident(s, 1, 0) && k3_store_resident(s, 1, 3) && k3_store_resident(s, 1, 6));
	k3_store_info_get(s, &info);
	T_EQ_INT(info.pinned, 3);
	/* Released, the same request succeeds. */
	k3_store_release(s, v, 3);
	T_EQ_INT(k3_store_acquire(s, 2, two, 2, w, &err), 0);
	T_EQ_INT(view_errors(w, 2), 0);
	k3_store_release(s, w, 2);

	/* Duplicates share one slot and one read. */
	struct k3_store_stats a, d;
	uint32_t dup[4] = { 15, 15, 15, 15 };
	k3_store_stats_get(s, &a);
	k3_store_step_begin(s);
	T_EQ_INT(k3_store_acquire(s, 3, dup, 4, v, &err), 0);
	T_EQ_INT(view_errors(v, 4), 0);
	T_OK(v[0].array[0] == v[3].array[0]);
	since(s, &a, &d);
	T_EQ_U64(d.reads, 1);
	T_EQ_U64(d.demand_misses, 1);
	T_EQ_U64(d.demand_hits, 0);
	k3_store_release(s, v, 4);
	k3_store_info_get(s, &info);
	T_EQ_INT(info.pinned, 0);

	/* Unknown experts are an error, not a skip. */
	uint32_t nope = 4;
	T_EQ_INT(k3_store_acquire(s, 1, &nope, 1, v, &err), -ENOENT);
	k3_store_free(s);
}

static void test_eviction(struct k3_store_source *src)
{
	struct k3_store *s = mk(src, 4, 1, K3_STORE_POLICY_LRU);
	struct k3_store_stats st;

	if (!s)
		return;
	touch(s, 1, 0);
	touch(s, 1, 3);
	touch(s, 1, 6);
	touch(s, 1, 9);
	touch(s, 1, 0);     /* hit; 3 is now the least recent */
	touch(s, 1, 12);    /* evicts 3 */
	T_OK(!k3_store_resident(s, 1, 3));
	T_OK(k3_store_resident(s, 1, 0) && k3_store_resident(s, 1, 6) &&
	     k3_store_resident(s, 1, 9) && k3_store_resident(s, 1, 12));
	touch(s, 1, 3);     /* evicts 6 */
	T_OK(!k3_store_resident(s, 1, 6));
	k3_store_stats_get(s, &st);
	T_EQ_U64(st.demand_hits, 1);
	T_EQ_U64(st.demand_misses, 6);
	T_EQ_U64(st.evictions, 2);
	T_EQ_U64(st.reads, 6);
	k3_store_free(s);

	/* Frequency-aware (4 slots: the single most recent one is protected):
	 * the least used outside that goes first, where LRU would pick the
	 * oldest. */
	s = mk(src, 4, 1, K3_STORE_POLICY_FREQ);
	if (!s)
		return;
	for (int r = 0; r < 3; r++)
		touch(s, 1, 0);
	touch(s, 1, 3);     /* used once */
	touch(s, 1, 6);
	touch(s, 1, 6);
	touch(s, 1, 9);     /* used once, but the most recent: protected */
	touch(s, 1, 12);    /* evicts 3 (LRU would evict 0) */
	T_OK(!k3_store_resident(s, 1, 3));
	T_OK(k3_store_resident(s, 1, 0) && k3_store_resident(s, 1, 6) && k3_store_resident(s, 1, 9));
	touch(s, 1, 15);    /* 12 is protected now; 9 (once) goes before 6 (twice) and 0 */
	T_OK(!k3_store_resident(s, 1, 9));
	T_OK(k3_store_resident(s, 1, 0) && k3_store_resident(s, 1, 6) && k3_store_resident(s, 1, 12));
	k3_store_free(s);
}

/* Device bytes of one read: O_DIRECT reads whole 4 KiB blocks (short only
 * at the end of a file, which no expert these tests price reaches). */
static uint64_t dev_bytes(struct k3_store_source *src, const struct k3_store_read *rd)
{
	uint64_t head = rd->offset % 4096;

	if (!k3_store_source_file_direct(src, rd->file))
		return rd->length;
	return (head + rd->length + 4095) / 4096 * 4096;
}

/* Device bytes a whole read of (layer, expert) costs. */
static uint64_t cost(struct k3_store_source *src, uint32_t layer, uint32_t expert)
{
	struct k3_store_plan plan;
	uint64_t n = 0;

	k3_store_source_plan(src, (size_t)k3_store_source_find(src, layer, expert), &plan);
	for (unsigned r = 0; r < plan.n_reads; r++)
		n += dev_bytes(src, &plan.read[r]);
	return n;
}

static void test_prefetch(struct k3_store_source *src)
{
	struct k3_store *s = mk(src, 6, 2, K3_STORE_POLICY_LRU);
	struct k3_store_stats a, b, d;
	struct k3_store_view v[4];
	struct k3_err err = { 0 };

	if (!s)
		return;
	/* Guesses 3, 6, 9 for layer 2 stay queued; the real routing picks 3
	 * and 12: 6 and 9 are cancelled unread, 3 becomes a demand read. */
	k3_store_hold_prefetch(s, true);
	k3_store_step_begin(s);
	uint32_t guess[3] = { 3, 6, 9 }, real[2] = { 3, 12 };
	T_EQ_U64(k3_store_prefetch(s, 2, guess, 3), 3);
	k3_store_stats_get(s, &a);
	k3_store_step_begin(s);
	use(s, 2, real, 2);
	since(s, &a, &d);
	T_EQ_U64(d.prefetch_cancelled, 2);
	T_EQ_U64(d.prefetch_issued, 0);
	T_EQ_U64(d.prefetch_used, 0);
	T_EQ_U64(d.bytes_read, cost(src, 2, 3) + cost(src, 2, 12));
	T_EQ_U64(d.reads, 2);
	T_EQ_U64(d.demand_misses, 2);
	T_EQ_U64(d.demand_hits, 0);
	T_OK(!k3_store_resident(s, 2, 6) && !k3_store_resident(s, 2, 9));
	/* Explicit cancel of what is queued. */
	uint32_t g2[2] = { 0, 15 };
	T_EQ_U64(k3_store_prefetch(s, 3, g2, 2), 2);
	T_EQ_U64(k3_store_prefetch_cancel(s, 3), 2);
	T_EQ_U64(k3_store_prefetch_cancel(s, 3), 0);
	k3_store_hold_prefetch(s, false);

	/* Same-step prefetch: completed before the acquire, yet a miss and no
	 * prefetch credit (the read was for this very step). */
	k3_store_stats_get(s, &a);
	k3_store_step_begin(s);
	uint32_t e = 0;
	T_EQ_U64(k3_store_prefetch(s, 1, &e, 1), 1);
	k3_store_drain(s);
	T_OK(k3_store_resident(s, 1, 0));
	use(s, 1, &e, 1);
	since(s, &a, &d);
	want_counts(&d, 1, 0, 0, 1);
	T_EQ_U64(d.prefetch_late, 1);
	T_EQ_U64(d.bytes_read, cost(src, 1, 0));

	/* Prefetch in step t, acquire in step t+1: used, and a hit. */
	e = 3;
	prefetched(s, &a, 1, e);
	k3_store_step_begin(s);
	use(s, 1, &e, 1);
	/* Prefetching what is resident does nothing. */
	T_EQ_U64(k3_store_prefetch(s, 1, &e, 1), 0);
	since(s, &a, &d);
	want_counts(&d, 1, 1, 1, 0);
	T_EQ_U64(d.bytes_read, cost(src, 1, 3));

	/* A wrong guess that was read and then evicted: wasted bytes. */
	e = 9;
	prefetched(s, &a, 1, e);
	for (uint32_t l = 2; l <= 3; l++)
		for (uint32_t x = 0; x < FX_EXPERTS; x++)
			touch(s, l, x * 3);
	T_OK(!k3_store_resident(s, 1, 9));
	since(s, &a, &d);
	T_EQ_U64(d.prefetch_issued, 1);
	T_EQ_U64(d.prefetch_used, 0);
	T_EQ_U64(d.prefetch_wasted_bytes, cost(src, 1, 9));
	T_EQ_U64(d.bytes_read, d.demand_bytes + d.prefetch_issued_bytes);
	k3_store_free(s);

	/* One slot: X (layer 2) acquired and released, a guess Y (layer 1)
	 * evicts X and waits (held), then the same step acquires Y: the guess
	 * must become a demand read (a slot's previous occupant's counts must
	 * not leak). */
	{
		struct k3_store_config c1 = { .cache_bytes = slot_bytes, .prefetch_slots = 1,
					      .io_threads = 2 };
		uint32_t x = 0, y = 3;
		T_EQ_INT(k3_store_new(src, &c1, &s, &err), 0);
		k3_store_hold_prefetch(s, true);
		k3_store_step_begin(s);
		T_EQ_INT(k3_store_acquire(s, 2, &x, 1, v, &err), 0);
		k3_store_release(s, v, 1);
		/* A guess never evicts an expert of the layer it guesses for. */
		uint32_t y1 = 6;
		T_EQ_U64(k3_store_prefetch(s, 2, &y1, 1), 0);
		T_OK(k3_store_resident(s, 2, 0));
		T_EQ_U64(k3_store_prefetch(s, 1, &y, 1), 1);
		T_OK(!k3_store_resident(s, 2, 0));
		use(s, 1, &y, 1);
		k3_store_stats_get(s, &b);
		T_EQ_U64(b.demand_misses, 2);
		T_EQ_U64(b.reads, 2);
		T_EQ_U64(b.prefetch_issued, 0);
		T_EQ_U64(b.prefetch_used + b.prefetch_late, 0);
		k3_store_free(s);
	}

	/* prefetch_slots = 0 turns prefetch off. */
	struct k3_store_config cfg = { .cache_bytes = 6 * slot_bytes, .prefetch_slots = 0 };
	T_EQ_INT(k3_store_new(src, &cfg, &s, &err), 0);
	T_EQ_U64(k3_store_prefetch(s, 1, guess, 3), 0);
	k3_store_free(s);
}

/* A guess read and not chosen by its layer's real routing is the cold end:
 * the next demand miss evicts it before any expert a demand read brought
 * in, whatever the policy says about those. */
static void test_prefetch_cold_end(struct k3_store_source *src, enum k3_store_policy pol)
{
	struct k3_store *s = mk(src, 5, 2, pol);
	struct k3_store_stats a, d;
	struct k3_store_view v[2];
	struct k3_err err = { 0 };

	if (!s)
		return;
	touch(s, 2, 0);
	touch(s, 2, 3);
	touch(s, 2, 6);
	/* Step: lookahead guesses 9 for layer 1 (read), the real routing of
	 * layer 1 picks 12: a miss into the last free slot. */
	k3_store_stats_get(s, &a);
	k3_store_step_begin(s);
	uint32_t g = 9, r = 12;
	T_EQ_U64(k3_store_prefetch(s, 1, &g, 1), 1);
	k3_store_drain(s);
	k3_store_step_begin(s);
	T_EQ_INT(k3_store_acquire(s, 1, &r, 1, v, &err), 0);
	k3_store_release(s, v, 1);
	/* The cache is full: 0, 3, 6 (demand), 9 (wrong guess), 12. A miss of
	 * layer 3 must take 9, not the least recent (LRU) or least used
	 * outside the recent window (FREQ) demand expert 0. */
	touch(s, 3, 0);
	T_OK(!k3_store_resident(s, 1, 9));
	T_OK(k3_store_resident(s, 2, 0) && k3_store_resident(s, 2, 3) && k3_store_resident(s, 2, 6) &&
	     k3_store_resident(s, 1, 12) && k3_store_resident(s, 3, 0));
	since(s, &a, &d);
	T_EQ_U64(d.prefetch_issued, 1);
	T_EQ_U64(d.prefetch_used, 0);
	T_EQ_U64(d.prefetch_wasted_bytes, cost(src, 1, 9));
	T_EQ_U64(d.guesses_scored, 1);
	T_EQ_U64(d.guesses_right, 0);
	k3_store_free(s);
}

/* --prefetch auto: guesses are scored against the real routing whether or
 * not they are read; a rank is read ahead only once its estimated precision
 * reaches the gate (one layer here, so the pooled record is the layer's:
 * pooled = (n + 2) / (n + 4), p = (n + 4 pooled) / (n + 4) after n right
 * guesses); a rank that keeps missing stays closed. */
static void test_prefetch_gate(struct k3_store_source *src)
{
	struct k3_store_config cfg = {
		.cache_bytes = 6 * k3_store_source_slot_bytes(src), .io_threads = 1,
		.prefetch_slots = -1, .prefetch_auto = true, .prefetch_min_precision = 0.75,
	};
	struct k3_store *s = NULL;
	struct k3_store_stats st;
	struct k3_store_view v[2];
	struct k3_err err = { 0 };
	uint64_t scored[K3_STORE_GUESS_RANKS], right[K3_STORE_GUESS_RANKS];
	size_t issued_at = 0;

	T_EQ_INT(k3_store_new(src, &cfg, &s, &err), 0);
	if (!s)
		return;
	/* Each round: guess (rank 0 = a, rank 1 = b) for layer 1, where the
	 * real routing picks a (rank 0 right) and never b (rank 1 wrong). The
	 * experts alternate so neither guess is resident when made. */
	for (size_t round = 0; round < 24; round++) {
		uint32_t a = round % 2 ? 0 : 3, bb = round % 2 ? 6 : 9;
		uint32_t guess[2] = { a, bb };
		uint32_t ranks[2] = { 0, 1 };
		k3_store_step_begin(s);
		/* keep them out of the cache: evict layer 1 by touching layer 2 */
		for (uint32_t x = 0; x < 6; x++)
			touch(s, 2, x * 3);
		k3_store_step_begin(s);
		size_t q = k3_store_prefetch_ranked(s, 1, guess, ranks, 2, true,
						    K3_STORE_GUESS_AFTER);
		T_OK(q <= 1);   /* rank 1 never opens */
		if (q && !issued_at)
			issued_at = round + 1;
		k3_store_drain(s);
		k3_store_step_begin(s);
		T_EQ_INT(k3_store_acquire(s, 1, &a, 1, v, &err), 0);
		k3_store_release(s, v, 1);
	}
	/* n = 1: p = 0.68; n = 2: p = 0.78 >= 0.75: round 3. */
	T_EQ_U64(issued_at, 3);
	k3_store_stats_get(s, &st);
	T_EQ_U64(st.guesses_scored, 48);
	T_EQ_U64(st.guesses_right, 24);
	T_EQ_U64(st.prefetch_issued, 24 - 2);
	T_EQ_U64(st.prefetch_used, 24 - 2);
	T_EQ_U64(st.prefetch_skipped, 2 + 24);
	T_EQ_U64(st.prefetch_wasted_bytes, 0);
	k3_store_guess_table(s, K3_STORE_GUESS_AFTER, scored, right);
	T_EQ_U64(scored[0], 24);
	T_EQ_U64(right[0], 24);
	T_EQ_U64(scored[1], 24);
	T_EQ_U64(right[1], 0);
	/* The partial lookahead's record is its own: rank 0 is open for the
	 * lookahead after a layer, closed for a partial guess until partial
	 * guesses were scored; both kinds' guesses of one layer are scored
	 * at its routing, each in its own table. */
	{
		uint32_t a = 3, r0 = 0, pb = 9;
		for (uint32_t x = 0; x < 6; x++)
			touch(s, 2, x * 3);
		k3_store_step_begin(s);
		T_EQ_U64(k3_store_prefetch_ranked(s, 1, &a, &r0, 1, true, K3_STORE_GUESS_PARTIAL), 0);
		T_EQ_U64(k3_store_prefetch_ranked(s, 1, &pb, &r0, 1, true, K3_STORE_GUESS_AFTER), 1);
		T_EQ_U64(k3_store_prefetch_ranked(s, 1, &a, &r0, 1, true, (enum k3_store_guess_kind)7), 0);
		k3_store_drain(s);
		k3_store_step_begin(s);
		T_EQ_INT(k3_store_acquire(s, 1, &a, 1, v, &err), 0);
		k3_store_release(s, v, 1);
		k3_store_guess_table(s, K3_STORE_GUESS_PARTIAL, scored, right);
		T_EQ_U64(scored[0], 1);
		T_EQ_U64(right[0], 1);
		k3_store_guess_table(s, K3_STORE_GUESS_AFTER, scored, right);
		T_EQ_U64(scored[0], 25);
		T_EQ_U64(right[0], 24);
	}
	/* Chunk guesses (score = false) are not scored. */
	uint32_t g = 12;
	k3_store_step_begin(s);
	k3_store_prefetch_ranked(s, 1, &g, NULL, 1, false, K3_STORE_GUESS_AFTER);
	k3_store_drain(s);
	k3_store_step_begin(s);
	T_EQ_INT(k3_store_acquire(s, 1, &g, 1, v, &err), 0);
	k3_store_release(s, v, 1);
	k3_store_stats_get(s, &st);
	T_EQ_U64(st.guesses_scored, 50);
	k3_store_free(s);

	/* Two layers, one rank: layer 1's guesses are always right, layer 2's
	 * always wrong. The pooled record is half right; layer 2 stays closed
	 * on its own record, layer 1 opens on its own. */
	T_EQ_INT(k3_store_new(src, &cfg, &s, &err), 0);
	if (!s)
		return;
	size_t l1 = 0, l2 = 0;
	for (size_t round = 0; round < 16; round++) {
		uint32_t a = round % 2 ? 0 : 3, x = round % 2 ? 6 : 9, y = 12;
		for (uint32_t e = 0; e < 6; e++)
			touch(s, 3, e * 3);
		k3_store_step_begin(s);
		l1 += k3_store_prefetch(s, 1, &a, 1);
		l2 += k3_store_prefetch(s, 2, &x, 1);
		k3_store_drain(s);
		k3_store_step_begin(s);
		T_EQ_INT(k3_store_acquire(s, 1, &a, 1, v, &err), 0);
		k3_store_release(s, v, 1);
		k3_store_step_begin(s);
		T_EQ_INT(k3_store_acquire(s, 2, &y, 1, v, &err), 0);
		k3_store_release(s, v, 1);
	}
	T_OK(l1 >= 10);
	T_EQ_U64(l2, 0);
	k3_store_free(s);

	/* Gate outside [0, 1] is refused. */
	cfg.prefetch_min_precision = 1.5;
	T_EQ_INT(k3_store_new(src, &cfg, &s, &err), -EINVAL);
}

/* The lookahead after a layer supersedes the partial lookahead's guesses
 * of that layer whose reads have not started: the ones it does not repeat
 * are dropped unread (prefetch_cancelled), the repeated one stays, and
 * guesses of other layers and partial guesses already read are kept. */
static void test_prefetch_supersede(struct k3_store_source *src)
{
	struct k3_store *s = mk(src, 12, 1, K3_STORE_POLICY_LRU);   /* 6 guesses may wait */
	struct k3_store_stats a, d;
	uint32_t r0[3] = { 0, 1, 2 };

	if (!s)
		return;
	uint32_t read_first = 15, partial[2] = { 3, 6 }, other = 9, after[2] = { 6, 12 };
	/* a partial guess that is read before the lookahead after the layer */
	T_EQ_U64(k3_store_prefetch_ranked(s, 1, &read_first, r0, 1, true,
					  K3_STORE_GUESS_PARTIAL), 1);
	k3_store_drain(s);
	k3_store_stats_get(s, &a);
	k3_store_hold_prefetch(s, true);
	T_EQ_U64(k3_store_prefetch_ranked(s, 1, partial, r0, 2, true, K3_STORE_GUESS_PARTIAL), 2);
	T_EQ_U64(k3_store_prefetch_ranked(s, 2, &other, r0, 1, true, K3_STORE_GUESS_PARTIAL), 1);
	/* 6 is repeated (already queued: not queued again), 12 is new */
	T_EQ_U64(k3_store_prefetch_ranked(s, 1, after, r0, 2, true, K3_STORE_GUESS_AFTER), 1);
	k3_store_hold_prefetch(s, false);
	k3_store_drain(s);
	since(s, &a, &d);
	T_EQ_U64(d.prefetch_cancelled, 1);   /* 3, unread */
	T_EQ_U64(d.prefetch_issued, 3);      /* 6, 9 of layer 2, 12 */
	T_OK(!k3_store_resident(s, 1, 3));
	T_OK(k3_store_resident(s, 1, 6) && k3_store_resident(s, 1, 12));
	T_OK(k3_store_resident(s, 2, 9));
	T_OK(k3_store_resident(s, 1, 15));   /* read before: kept */
	k3_store_free(s);
}

/* Waits (up to 10 s) until `n` prefetch reads have started. */
static bool wait_issued(struct k3_store *s, uint64_t n)
{
	struct k3_store_stats st;

	for (int i = 0; i < 10000; i++) {
		k3_store_stats_get(s, &st);
		if (st.prefetch_issued >= n)
			return true;
		nanosleep(&(struct timespec){ 0, 1000000 }, NULL);
	}
	return false;
}

/* Holds guesses between pieces, then guesses (layer, expert) and waits
 * until its read started; *a: the counters before. */
static void guess_held(struct k3_store *s, uint32_t layer, uint32_t expert,
		       struct k3_store_stats *a)
{
	k3_store_hold_pieces(s, true);
	k3_store_stats_get(s, a);
	k3_store_step_begin(s);
	T_EQ_U64(k3_store_prefetch(s, layer, &expert, 1), 1);
	T_OK(wait_issued(s, a->prefetch_issued + 1));
}

/* A step of layer `layer` needing ids[0..n): its request is made while
 * guesses are held, then the hold is lifted and the bytes are checked;
 * *d: the counters since a. */
static void step_released(struct k3_store *s, uint32_t layer, const uint32_t *ids, size_t n,
			  const struct k3_store_stats *a, struct k3_store_stats *d)
{
	struct k3_store_view v[4];
	struct k3_store_stats b;
	struct k3_err err = { 0 };

	k3_store_step_begin(s);
	T_EQ_INT(k3_store_request(s, layer, ids, n, v, &err), 0);
	k3_store_hold_pieces(s, false);
	T_EQ_INT(k3_store_wait(s, v, n, &err), 0);
	T_EQ_INT(view_errors(v, n), 0);
	k3_store_release(s, v, n);
	k3_store_stats_get(s, &b);
	k3_store_stats_sub(&b, a, d);
}

/* A guess its layer's real routing rejects while it is being read stops at
 * the next piece: it costs the bytes of the pieces read (counted in
 * prefetch_wasted_bytes), not the whole expert. A guess the routing
 * chooses while it is being read completes with the right bytes, and the
 * stopped one, wanted again, is read afresh and right. */
static void test_prefetch_abort(struct k3_store_source *src)
{
	struct k3_store *s;
	struct k3_store_stats a, d;
	struct k3_store_plan plan;
	struct k3_err err = { 0 };
	uint32_t three = 3, zero = 0, six_nine[2] = { 6, 9 }, twelve = 12, fifteen = 15;

	piece_bytes = 4096;
	s = mk(src, 6, 1, K3_STORE_POLICY_LRU);   /* one reader: demand waits for the guess */
	piece_bytes = 0;
	if (!s)
		return;
	/* The first piece of (2, 3): up to the first 4 KiB file boundary. */
	k3_store_source_plan(src, (size_t)k3_store_source_find(src, 2, 3), &plan);
	struct k3_store_read piece0 = plan.read[0];
	if (piece0.length > 4096 - piece0.offset % 4096)
		piece0.length = 4096 - piece0.offset % 4096;
	uint64_t first = dev_bytes(src, &piece0);
	T_OK(first < cost(src, 2, 3));   /* the fixture's experts span several pieces */

	/* Rejected: the one reader stops 3 after its first piece, then reads 0. */
	guess_held(s, 2, three, &a);
	step_released(s, 2, &zero, 1, &a, &d);
	T_EQ_U64(d.prefetch_issued, 1);
	T_EQ_U64(d.prefetch_aborted, 1);
	T_EQ_U64(d.prefetch_wasted_bytes, first);
	T_EQ_U64(d.bytes_read, cost(src, 2, 0) + first);
	T_OK(!k3_store_resident(s, 2, 3));

	/* Chosen while being read: it completes, right, credited as used. */
	guess_held(s, 2, six_nine[0], &a);
	step_released(s, 2, six_nine, 2, &a, &d);
	T_EQ_U64(d.prefetch_aborted, 0);
	T_EQ_U64(d.prefetch_used, 1);
	T_EQ_U64(d.prefetch_wasted_bytes, 0);
	T_EQ_U64(d.bytes_read, cost(src, 2, 6) + cost(src, 2, 9));

	/* The stopped guess, wanted now: a whole demand read, right bytes. */
	k3_store_stats_get(s, &a);
	step_released(s, 2, &three, 1, &a, &d);
	T_EQ_U64(d.bytes_read, cost(src, 2, 3));
	T_EQ_U64(d.demand_misses, 1);

	/* Rejected while being read, then chosen by a later step before its
	 * reader reached the next piece: the claim clears the mark, the read
	 * goes on and the bytes are right. (Two readers: the rejecting step's
	 * demand read must not wait behind the held guess.) */
	k3_store_free(s);
	piece_bytes = 4096;
	s = mk(src, 6, 2, K3_STORE_POLICY_LRU);
	piece_bytes = 0;
	if (!s)
		return;
	guess_held(s, 1, fifteen, &a);
	struct k3_store_view v;
	k3_store_step_begin(s);
	T_EQ_INT(k3_store_acquire(s, 1, &twelve, 1, &v, &err), 0);   /* rejects 15 */
	T_EQ_INT(view_errors(&v, 1), 0);
	k3_store_release(s, &v, 1);
	step_released(s, 1, &fifteen, 1, &a, &d);   /* wants it after all */
	T_EQ_U64(d.prefetch_aborted, 0);
	T_EQ_U64(d.prefetch_wasted_bytes, 0);
	T_EQ_U64(d.bytes_read, cost(src, 1, 12) + cost(src, 1, 15));

	/* A piece that is not a multiple of 4 KiB is refused. */
	struct k3_store_config cfg = { .cache_bytes = 6 * slot_bytes, .prefetch_piece_bytes = 5000 };
	struct k3_store *bad = NULL;
	T_EQ_INT(k3_store_new(src, &cfg, &bad, &err), -EINVAL);
	T_OK(strstr(err.msg, "multiple of 4096") != NULL);
	k3_store_free(s);
}

/* A piece larger than any read (up to the largest multiple of 4 KiB): a
 * guess is read whole, right bytes and counters (the piece arithmetic must
 * not wrap). */
static void test_prefetch_huge_piece(struct k3_store_source *src)
{
	struct k3_store *s;
	struct k3_store_stats a, d;
	struct k3_store_view v;
	struct k3_err err = { 0 };
	uint32_t three = 3;

	piece_bytes = UINT64_MAX - UINT64_MAX % 4096;
	s = mk(src, 6, 1, K3_STORE_POLICY_LRU);
	piece_bytes = 0;
	if (!s)
		return;
	k3_store_stats_get(s, &a);
	k3_store_step_begin(s);
	T_EQ_U64(k3_store_prefetch(s, 2, &three, 1), 1);
	k3_store_drain(s);
	k3_store_step_begin(s);
	T_EQ_INT(k3_store_acquire(s, 2, &three, 1, &v, &err), 0);
	T_EQ_INT(view_errors(&v, 1), 0);
	k3_store_release(s, &v, 1);
	since(s, &a, &d);
	T_EQ_U64(d.prefetch_issued_bytes, cost(src, 2, 3));
	T_EQ_U64(d.prefetch_used, 1);
	k3_store_free(s);
}

/* Random steps with prefetch under both policies and 1..3 threads: every
 * view has the right bytes, an expert pinned across a later acquire keeps
 * them, and the byte counters add up. */
static void test_random(struct k3_store_source *src, enum k3_store_policy pol, unsigned threads)
{
	struct k3_store *s = mk(src, 7, threads, pol);
	struct k3_store_view v[4], held[2];
	struct k3_store_stats st;
	struct k3_err err = { 0 };
	int bad = 0, fails = 0;

	if (!s)
		return;
	/* Two experts stay pinned through the whole run. */
	uint32_t keep[2] = { 0, 15 };
	k3_store_step_begin(s);
	T_EQ_INT(k3_store_acquire(s, 2, keep, 2, held, &err), 0);
	for (int step = 0; step < 300; step++) {
		uint32_t layer = (uint32_t)(fx_rand() % FX_LAYERS) + 1, ids[4], guess[3];
		uint32_t n = (uint32_t)(fx_rand() % 4) + 1;
		for (uint32_t k = 0; k < n; k++)
			ids[k] = (uint32_t)(fx_rand() % FX_EXPERTS) * 3;
		k3_store_step_begin(s);
		if (k3_store_acquire(s, layer, ids, n, v, &err) != 0) {
			fails++;
			continue;
		}
		bad += view_errors(v, n);
		for (int k = 0; k < 3; k++)
			guess[k] = (uint32_t)(fx_rand() % FX_EXPERTS) * 3;
		k3_store_prefetch(s, layer % FX_LAYERS + 1, guess, 3);
		if (step % 50 == 0)
			bad += view_errors(held, 2);
		k3_store_release(s, v, n);
	}
	bad += view_errors(held, 2);
	k3_store_release(s, held, 2);
	k3_store_drain(s);
	k3_store_stats_get(s, &st);
	T_EQ_INT(bad, 0);
	T_EQ_INT(fails, 0);   /* 2 pinned + 4 needed <= 7 slots: never -ENOSPC */
	T_EQ_U64(st.bytes_read, st.demand_bytes + st.prefetch_issued_bytes);
	T_OK(st.prefetch_used + st.prefetch_late <= st.prefetch_issued);
	T_OK(st.demand_hits > 0 && st.demand_misses > 0);
	T_OK(st.io_wait_ns > 0);
	k3_store_free(s);
}

/* request + wait = acquire: the misses are counted as demand (not
 * prefetch) at the request, their reads run before the wait, the bytes are
 * the shard bytes; an aborted request leaves nothing pinned. */
static void test_request(struct k3_store_source *src, unsigned threads)
{
	struct k3_store *s = mk(src, 6, threads, K3_STORE_POLICY_LRU);
	struct k3_store_stats a, d;
	struct k3_store_info info;
	struct k3_store_view v[4];
	struct k3_err err = { 0 };
	uint32_t ids[3] = { 12, 3, 12 }, other[2] = { 6, 15 };

	if (!s)
		return;
	k3_store_stats_get(s, &a);
	k3_store_step_begin(s);
	T_EQ_INT(k3_store_request(s, 2, ids, 3, v, &err), 0);
	since(s, &a, &d);
	T_EQ_U64(d.demand_misses, 2);   /* 12 twice: one count */
	T_EQ_U64(d.demand_hits, 0);
	T_EQ_U64(d.prefetch_issued, 0);
	k3_store_info_get(s, &info);
	T_EQ_INT((int)info.pinned, 2);
	T_OK(v[0].array[0] == NULL);    /* only the wait hands out the bytes */
	k3_store_drain(s);              /* the reads ran without a wait */
	T_OK(k3_store_resident(s, 2, 12) && k3_store_resident(s, 2, 3));
	T_EQ_INT(k3_store_wait(s, v, 3, &err), 0);
	T_EQ_INT(view_errors(v, 3), 0);
	k3_store_release(s, v, 3);
	since(s, &a, &d);
	T_EQ_U64(d.reads, 2);
	if (!k3_store_source_file_direct(src, 0))   /* O_DIRECT rounds to 4 KiB */
		T_EQ_U64(d.demand_bytes, cost(src, 2, 12) + cost(src, 2, 3));
	T_OK(d.demand_bytes >= cost(src, 2, 12) + cost(src, 2, 3));
	T_EQ_U64(d.bytes_read, d.demand_bytes);

	/* Abort: nothing stays pinned, a later acquire gets the right bytes. */
	k3_store_step_begin(s);
	T_EQ_INT(k3_store_request(s, 3, other, 2, v, &err), 0);
	k3_store_request_abort(s, v, 2);
	k3_store_drain(s);
	k3_store_info_get(s, &info);
	T_EQ_INT((int)info.pinned, 0);
	k3_store_step_begin(s);
	use(s, 3, other, 2);

	/* The engine adapter: request_layer then acquire_layer with the same
	 * ids only waits (one step); different ids give the request up and
	 * acquire afresh; release_layer after a request alone aborts it. */
	{
		struct k3_store_engine_src ectx;
		struct k3_expert_source es;
		struct k3_prov_expert sp[3];
		uint32_t l1[3] = { 0, 9, 0 }, l1b[2] = { 15, 6 };
		k3_store_engine_src_init(&ectx, s, &es);
		T_OK(es.request_layer != NULL);
		k3_store_stats_get(s, &a);
		T_EQ_INT(es.request_layer(es.ctx, 1, l1, 3, &err), 0);
		T_EQ_INT(es.acquire_layer(es.ctx, 1, l1, 3, sp, &err), 0);
		size_t i0 = fx_find(&fx, 1, 0), i3 = fx_find(&fx, 1, 9);
		T_OK(memcmp(sp[0].w2_scale, fx_array(&fx, i0, K3_STORE_W2_SCALE),
			    fx_len[K3_STORE_W2_SCALE]) == 0);
		T_OK(memcmp(sp[1].w3_packed, fx_array(&fx, i3, K3_STORE_W3_PACKED),
			    fx_len[K3_STORE_W3_PACKED]) == 0);
		T_OK(sp[2].w1_packed == sp[0].w1_packed);
		es.release_layer(es.ctx, 1);
		since(s, &a, &d);
		T_EQ_U64(d.steps, 1);
		T_EQ_U64(d.demand_misses, 2);

		T_EQ_INT(es.request_layer(es.ctx, 1, l1, 3, &err), 0);
		T_EQ_INT(es.acquire_layer(es.ctx, 1, l1b, 2, sp, &err), 0);
		size_t i5 = fx_find(&fx, 1, 15);
		T_OK(memcmp(sp[0].w1_packed, fx_array(&fx, i5, K3_STORE_W1_PACKED),
			    fx_len[K3_STORE_W1_PACKED]) == 0);
		es.release_layer(es.ctx, 1);
		/* await_expert: each distinct expert once (duplicates share
		 * one hand-out), the right bytes, then 0; one step. */
		uint32_t l2[4] = { 6, 15, 6, 0 }, seen = 0, id;
		int got, outs = 0;
		T_OK(es.await_expert != NULL);
		k3_store_stats_get(s, &a);
		T_EQ_INT(es.request_layer(es.ctx, 2, l2, 4, &err), 0);
		while ((got = es.await_expert(es.ctx, 2, &id, sp, &err)) == 1) {
			size_t ix = fx_find(&fx, 2, id);
			outs++;
			T_OK(ix != (size_t)-1 && memcmp(sp[0].w2_packed,
				fx_array(&fx, ix, K3_STORE_W2_PACKED), fx_len[K3_STORE_W2_PACKED]) == 0);
			seen |= 1u << (id / 3);
		}
		T_EQ_INT(got, 0);
		T_EQ_INT(outs, 3);
		T_EQ_INT((int)seen, (1 << 2) | (1 << 5) | 1);
		k3_store_info_get(s, &info);
		T_EQ_INT((int)info.pinned, 3);   /* held until release_layer */
		es.release_layer(es.ctx, 2);
		since(s, &a, &d);
		T_EQ_U64(d.steps, 1);
		T_EQ_U64(d.demand_hits + d.demand_misses, 3);

		/* would_block: true exactly while every expert not handed out
		 * yet is still queued or being read */
		uint32_t l0[2] = { 3, 12 }, l0b[2] = { 3, 3 };
		T_OK(es.would_block != NULL);
		k3_store_hold_reads(s, true);
		T_EQ_INT(es.request_layer(es.ctx, 1, l0, 2, &err), 0);
		T_OK(es.would_block(es.ctx, 1));        /* both reads held */
		k3_store_hold_reads(s, false);
		k3_store_drain(s);
		T_OK(!es.would_block(es.ctx, 1));       /* readable */
		outs = 0;
		while ((got = es.await_expert(es.ctx, 1, &id, sp, &err)) == 1)
			outs++;
		T_EQ_INT(got, 0);
		T_EQ_INT(outs, 2);
		T_OK(!es.would_block(es.ctx, 1));       /* nothing left to wait for */
		es.release_layer(es.ctx, 1);
		for (uint32_t x = 0; x < 18; x += 3)    /* a layer-1 expert not resident */
			if (!k3_store_resident(s, 1, x))
				l0b[1] = x;
		T_OK(l0b[1] != 3);
		k3_store_hold_reads(s, true);
		T_EQ_INT(es.request_layer(es.ctx, 1, l0b, 2, &err), 0);
		T_OK(!es.would_block(es.ctx, 1));       /* 3 is resident */
		T_EQ_INT(es.await_expert(es.ctx, 1, &id, sp, &err), 1);
		T_EQ_INT((int)id, 3);
		T_OK(es.would_block(es.ctx, 1));        /* the other one is held */
		T_OK(!es.would_block(es.ctx, 2));       /* not the layer requested */
		k3_store_hold_reads(s, false);
		T_EQ_INT(es.await_expert(es.ctx, 1, &id, sp, &err), 1);
		T_EQ_INT((int)id, (int)l0b[1]);
		T_EQ_INT(es.await_expert(es.ctx, 1, &id, sp, &err), 0);
		es.release_layer(es.ctx, 1);

		T_EQ_INT(es.request_layer(es.ctx, 3, other, 2, &err), 0);
		T_EQ_INT(es.request_layer(es.ctx, 3, other, 2, &err), -EBUSY);
		es.release_layer(es.ctx, 3);
		k3_store_drain(s);
		k3_store_info_get(s, &info);
		T_EQ_INT((int)info.pinned, 0);
		T_EQ_INT(ectx.last_error, 0);
		k3_store_engine_src_release(&ectx);
	}
	k3_store_free(s);
}

int main(void)
{
	struct k3_store_source *off, *on, *pk;
	struct k3_err err = { 0 };

	if (fx_init(&fx) != 0)
		return t_skip("cannot create the fixture in a temp dir");
	off = fx_source(&fx, K3_STORE_DIRECT_OFF, &err);
	on = fx_source(&fx, K3_STORE_DIRECT_AUTO, &err);
	T_OK(off && on);
	if (!off || !on)
		goto out;
	T_OK(!k3_store_source_file_direct(off, 0));
	printf("# O_DIRECT in %s: %s\n", fx.dir, k3_store_source_file_direct(on, 0) ? "yes" : "no (buffered)");

	test_identical_bytes(off, 1);
	test_identical_bytes(off, 2);
	test_identical_bytes(on, 1);
	test_identical_bytes(on, 2);

	/* Same through a pack. */
	{
		struct k3_store_pack_ident id[FX_SHARDS];
		struct k3_store_pack *pack = NULL;
		char path[400];
		snprintf(path, sizeof(path), "%s/experts.k3pack", fx.dir);
		for (int s = 0; s < FX_SHARDS; s++)
			T_EQ_INT(k3_store_pack_ident(fx.shard[s], "s", 0, &id[s], &err), 0);
		T_EQ_INT(k3_store_pack_write(path, off, id, FX_SHARDS, 0, NULL, &err), 0);
		T_EQ_INT(k3_store_pack_open(path, id, FX_SHARDS, 0, &pack, &err), 0);
		pk = k3_store_source_new(K3_STORE_DIRECT_AUTO);
		if (pack)
			T_EQ_INT(k3_store_pack_add_to_source(pack, path, pk, &err), 0);
		k3_store_pack_free(pack);
		test_identical_bytes(pk, 2);
		k3_store_source_free(pk);
	}

	test_pinning(off);
	test_pinning(on);
	test_eviction(off);
	test_prefetch(off);
	test_prefetch_cold_end(off, K3_STORE_POLICY_LRU);
	test_prefetch_cold_end(off, K3_STORE_POLICY_FREQ);
	test_prefetch_gate(off);
	test_prefetch_supersede(off);
	test_prefetch_abort(off);
	test_prefetch_abort(on);
	test_prefetch_huge_piece(off);
	test_prefetch_huge_piece(on);
	test_request(off, 1);
	test_request(on, 2);
	test_random(off, K3_STORE_POLICY_LRU, 1);
	test_random(on, K3_STORE_POLICY_FREQ, 3);
	test_random(off, K3_STORE_POLICY_FREQ, 2);
	piece_bytes = 4096;   /* guesses in many pieces: same bytes, counters add up */
	test_random(on, K3_STORE_POLICY_LRU, 2);
	test_random(off, K3_STORE_POLICY_FREQ, 3);
	piece_bytes = 0;

	/* Budget below one slot: refused with the reason. */
	{
		struct k3_store_config cfg = { .cache_bytes = 100 };
		struct k3_store *s = NULL;
		T_EQ_INT(k3_store_new(off, &cfg, &s, &err), -EINVAL);
		T_OK(strstr(err.msg, "cannot hold one") != NULL);
	}
	/* A scale byte 255 (NaN in E8M0) is caught when check_scales is on. */
	{
		const struct k3_store_extent *x = &fx.ex[0].ext[K3_STORE_W2_SCALE];
		struct k3_store_config cfg = { .cache_bytes = 4 * slot_bytes, .check_scales = true };
		struct k3_store *s = NULL;
		struct k3_store_source *src;
		struct k3_store_view v;
		uint32_t e = fx.ex[0].expert;
		fx.bytes[x->file][x->offset + 7] = 255;
		T_EQ_INT(fx_write_file(fx.shard[x->file], fx.bytes[x->file], fx.size[x->file]), 0);
		src = fx_source(&fx, K3_STORE_DIRECT_OFF, &err);
		T_EQ_INT(k3_store_new(src, &cfg, &s, &err), 0);
		T_EQ_INT(k3_store_acquire(s, fx.ex[0].layer, &e, 1, &v, &err), -EBADMSG);
		T_OK(strstr(err.msg, "scale byte 255") != NULL);
		k3_store_free(s);
		cfg.check_scales = false;
		T_EQ_INT(k3_store_new(src, &cfg, &s, &err), 0);
		T_EQ_INT(k3_store_acquire(s, fx.ex[0].layer, &e, 1, &v, &err), 0);
		T_EQ_INT(view_errors(&v, 1), 0);
		k3_store_release(s, &v, 1);
		k3_store_free(s);
		k3_store_source_free(src);
	}
out:
	k3_store_source_free(off);
	k3_store_source_free(on);
	fx_release(&fx);
	return t_done();
}

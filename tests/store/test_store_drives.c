/* Several drives (issue 19) through the expert store: copies of the
 * fixture's shards on emulated drives. Every expert read from any copy
 * lands the true bytes; reads go to the drive predicted to finish first
 * (a drive twice as fast takes more of them); a drive whose reads stall
 * is hedged from the other copy and the copy that wins hands out the
 * right bytes; bytes read = demand + prefetch used + prefetch wasted,
 * exactly, in total and per drive, once the store is idle (a guess left
 * unused counts as wasted then); "auto" turns prefetch off on a drive
 * whose guesses are all wrong and gives it a fresh record later; distinct
 * experts are counted once per epoch. */
#include "t.h"

#include <errno.h>

#include "store/store.h"
#include "store/store_cache.h"
#include "fixture.h"

/* Copies of the fixture's shards, file names copy<d>-..., added as files
 * of drive d; returns the first file index or -1. */
static int add_copy_files(struct fixture *fx, struct k3_store_source *src, uint32_t d,
			  struct k3_err *err)
{
	int first = -1;

	for (int s = 0; s < FX_SHARDS; s++) {
		char path[400];
		uint32_t f;
		snprintf(path, sizeof(path), "%s/copy%u-%d", fx->dir, d, s);
		if (fx_write_file(path, fx->bytes[s], fx->size[s]) != 0 ||
		    k3_store_source_add_file_on(src, path, d, &f, err) != 0)
			return -1;
		if (s == 0)
			first = (int)f;
	}
	return first;
}

/* Fixture expert i with its files moved to base + shard. */
static struct k3_store_expert moved(const struct fixture *fx, size_t i, int base)
{
	struct k3_store_expert e = fx->ex[i];

	for (int a = 0; a < K3_STORE_ARRAYS; a++)
		e.ext[a].file = (uint32_t)base + fx->ex[i].ext[a].file;
	return e;
}

/* A source whose experts' primaries are the shards (drive 0), with full
 * copies on drives 1..full and, on drive full + 1 when partial, copies of
 * the first layer's experts only. */
static struct k3_store_source *drives_source(struct fixture *fx, unsigned full, bool partial,
					     struct k3_err *err)
{
	struct k3_store_source *src = fx_source(fx, K3_STORE_DIRECT_AUTO, err);

	for (uint32_t d = 1; src && d <= full + partial; d++) {
		int base = add_copy_files(fx, src, d, err);
		if (base < 0)
			goto fail;
		for (size_t i = 0; i < fx->n_ex; i++) {
			if (d > full && fx->ex[i].layer != fx->ex[0].layer)
				continue;
			struct k3_store_expert e = moved(fx, i, base);
			if (k3_store_source_add_copy(src, &e, err) != 0)
				goto fail;
		}
	}
	return src;
fail:
	k3_store_source_free(src);
	return NULL;
}

static void test_copies_api(struct fixture *fx)
{
	struct k3_err err = { 0 };
	struct k3_store_source *src = drives_source(fx, 1, true, &err);

	T_OK(src != NULL);
	if (!src)
		return;
	T_EQ_INT(k3_store_source_drive_count(src), 3);
	T_EQ_INT(k3_store_source_copies(src, 0), 3);                 /* layer 1: every drive */
	T_EQ_INT(k3_store_source_copies(src, fx->n_ex - 1), 2);      /* not on the partial one */
	T_EQ_INT(k3_store_source_copy_drive(src, 0, 0), 0);
	T_EQ_INT(k3_store_source_copy_drive(src, 0, 2), 2);
	T_EQ_INT((int64_t)k3_store_source_copy_drive(src, 0, 3), (int64_t)UINT32_MAX);
	struct k3_store_plan p0, p1;
	k3_store_source_plan_copy(src, 4, 0, &p0);
	k3_store_source_plan_copy(src, 4, 1, &p1);
	T_EQ_INT(p0.n_reads, p1.n_reads);
	T_EQ_U64(p0.read[0].offset, p1.read[0].offset);
	T_OK(p0.read[0].file != p1.read[0].file);
	T_EQ_INT(k3_store_source_file_drive(src, p1.read[0].file), 1);
	/* the errors: a second copy on one drive, a missing expert, another
	 * size, extents across two drives */
	struct k3_store_expert e = moved(fx, 0, FX_SHARDS);
	T_EQ_INT(k3_store_source_add_copy(src, &e, &err), -EEXIST);
	e.layer = 99;
	T_EQ_INT(k3_store_source_add_copy(src, &e, &err), -ENOENT);
	int base = add_copy_files(fx, src, 3, &err);
	T_EQ_INT(base, 3 * FX_SHARDS);
	e = moved(fx, 0, base);
	e.ext[1].length++;
	T_EQ_INT(k3_store_source_add_copy(src, &e, &err), -EINVAL);
	e = moved(fx, 0, base);
	e.ext[2].file = 0;
	T_EQ_INT(k3_store_source_add_copy(src, &e, &err), -EINVAL);
	T_OK(strstr(err.msg, "two drives") != NULL);
	uint32_t f;
	T_EQ_INT(k3_store_source_add_file_on(src, fx->shard[0], K3_STORE_MAX_DRIVES, &f, &err),
		 -EINVAL);
	k3_store_source_free(src);
}

/* bytes_read = demand + prefetch used + prefetch wasted, in total and per
 * drive, and the per-drive sums are the totals. */
static void check_sums(const struct k3_store_stats *st, const char *what)
{
	uint64_t b = 0, dm = 0, u = 0, w = 0;

	for (int d = 0; d < K3_STORE_MAX_DRIVES; d++) {
		T_EQ_U64(st->drive_bytes_read[d], st->drive_demand_bytes[d] +
			 st->drive_prefetch_used_bytes[d] + st->drive_prefetch_wasted_bytes[d]);
		b += st->drive_bytes_read[d];
		dm += st->drive_demand_bytes[d];
		u += st->drive_prefetch_used_bytes[d];
		w += st->drive_prefetch_wasted_bytes[d];
	}
	if (!t_report(st->bytes_read == st->demand_bytes + st->prefetch_used_bytes +
		      st->prefetch_wasted_bytes, __FILE__, __LINE__, what))
		printf("     %s: read %llu, demand %llu + used %llu + wasted %llu\n", what,
		       (unsigned long long)st->bytes_read, (unsigned long long)st->demand_bytes,
		       (unsigned long long)st->prefetch_used_bytes,
		       (unsigned long long)st->prefetch_wasted_bytes);
	T_EQ_U64(b, st->bytes_read);
	T_EQ_U64(dm, st->demand_bytes);
	T_EQ_U64(u, st->prefetch_used_bytes);
	T_EQ_U64(w, st->prefetch_wasted_bytes);
}

static bool views_true(const struct fixture *fx, const struct k3_store_view *v, size_t n)
{
	bool ok = true;

	for (size_t k = 0; k < n; k++) {
		size_t i = fx_find(fx, v[k].layer, v[k].expert);
		for (int a = 0; a < K3_STORE_ARRAYS; a++)
			ok &= memcmp(v[k].array[a], fx_array(fx, i, a), fx_len[a]) == 0;
	}
	return ok;
}

struct run_cfg {
	unsigned full;
	bool partial;
	uint64_t rate[K3_STORE_MAX_DRIVES];
	double stall_fraction;          /* drive 0 */
	uint64_t stall_ns;
	double hedge;
	int prefetch_slots;             /* 0 off */
	unsigned steps;
};

/* Random layers' top-2 through a 4-slot cache with a random guess of the
 * next layer after each: every view true, the sums exact after idle. */
static struct k3_store_stats run(struct fixture *fx, const struct run_cfg *rc)
{
	struct k3_err err = { 0 };
	struct k3_store_stats st;
	struct k3_store_source *src = drives_source(fx, rc->full, rc->partial, &err);
	struct k3_store *s = NULL;
	bool all_true = true;

	memset(&st, 0, sizeof(st));
	if (!src)
		return st;
	struct k3_store_config cfg = { .cache_bytes = 4 * k3_store_source_slot_bytes(src) +
						      K3_STORE_MAX_HEDGES * k3_store_source_slot_bytes(src),
				       .io_threads = 2, .prefetch_slots = rc->prefetch_slots,
				       .hedge_factor = rc->hedge, .min_slots = 2 };
	for (int d = 0; d < K3_STORE_MAX_DRIVES; d++)
		cfg.drive[d].rate_bytes_per_s = rc->rate[d];
	cfg.drive[0].stall_fraction = rc->stall_fraction;
	cfg.drive[0].stall_ns = rc->stall_ns;
	cfg.drive[0].stall_seed = 3;
	T_EQ_INT(k3_store_new(src, &cfg, &s, &err), 0);
	if (!s) {
		k3_store_source_free(src);
		return st;
	}
	fx_rng = 0x1234567ull;
	for (unsigned t = 0; t < rc->steps; t++) {
		uint32_t layer = 1 + (uint32_t)(fx_rand() % FX_LAYERS);
		uint32_t ids[2] = { (uint32_t)(fx_rand() % FX_EXPERTS) * 3,
				    (uint32_t)(fx_rand() % FX_EXPERTS) * 3 };
		struct k3_store_view v[2];
		k3_store_step_begin(s);
		if (k3_store_acquire(s, layer, ids, 2, v, &err) != 0) {
			T_OK(!"acquire failed");
			printf("     %s\n", err.msg);
			break;
		}
		all_true &= views_true(fx, v, 2);
		k3_store_release(s, v, 2);
		uint32_t guess = (uint32_t)(fx_rand() % FX_EXPERTS) * 3;
		k3_store_prefetch_ranked(s, 1 + (uint32_t)(fx_rand() % FX_LAYERS), &guess, NULL, 1,
					 false, K3_STORE_GUESS_AFTER);
	}
	T_OK(all_true);
	k3_store_prefetch_cancel(s, UINT32_MAX);
	k3_store_drain(s);
	k3_store_idle(s);
	k3_store_stats_get(s, &st);
	check_sums(&st, "sums after idle");
	struct k3_store_info info;
	k3_store_info_get(s, &info);
	T_EQ_INT(info.n_drives, 1 + rc->full + rc->partial);
	T_EQ_INT(info.hedge_buffers, rc->hedge > 0 ? 2 * (rc->full + rc->partial) : 0);
	k3_store_free(s);
	k3_store_source_free(src);
	return st;
}

static void test_reads_and_sums(struct fixture *fx)
{
	for (int pf = 0; pf < 2; pf++) {
		struct run_cfg rc = { .full = 1, .partial = true, .prefetch_slots = pf ? -1 : 0,
				      .steps = 300, .hedge = K3_STORE_HEDGE_FACTOR };
		struct k3_store_stats st = run(fx, &rc);
		/* drives of equal (unknown) speed share the reads; the partial
		 * copy gets none: never more than two reads are outstanding */
		T_OK(st.drive_reads[0] > 0 && st.drive_reads[1] > 0);
		if (pf)
			T_OK(st.prefetch_issued > 0);
		else
			T_EQ_U64(st.prefetch_issued_bytes, 0);
	}
	/* drive 1 four times as fast (the fixture's experts are 10 KB: 2 MB/s
	 * against 8 MB/s): most reads go there */
	struct run_cfg rc = { .full = 1, .rate = { 2000000, 8000000 }, .steps = 200 };
	struct k3_store_stats st = run(fx, &rc);
	printf("rates 1:4: %llu reads on drive 0, %llu on drive 1\n",
	       (unsigned long long)st.drive_reads[0], (unsigned long long)st.drive_reads[1]);
	T_OK(st.drive_reads[1] > 2 * st.drive_reads[0]);
	T_EQ_U64(st.hedges, 0);
	/* the partial copy on the fast drive takes its layer's reads */
	struct run_cfg rp = { .full = 1, .partial = true, .rate = { 2000000, 2000000, 50000000 },
			      .steps = 100 };
	st = run(fx, &rp);
	T_OK(st.drive_reads[2] > 0);
}

/* Drive 0 stalls 30% of its reads by 100 ms: hedged from drive 1, the
 * hedges win, every view is true and the sums exact; without hedging no
 * hedge is issued. */
static void test_hedging(struct fixture *fx)
{
	struct run_cfg rc = { .full = 1, .rate = { 20000000, 20000000 }, .stall_fraction = 0.3,
			      .stall_ns = 100000000, .hedge = K3_STORE_HEDGE_FACTOR, .steps = 120 };
	struct k3_store_stats st = run(fx, &rc);
	printf("hedging: %llu hedges (%llu won, %llu on drive 0), %llu bytes lost the race\n",
	       (unsigned long long)st.hedges, (unsigned long long)st.hedges_won,
	       (unsigned long long)st.drive_hedges[0], (unsigned long long)st.hedge_bytes);
	T_OK(st.hedges > 0);
	T_OK(st.hedges_won > 0);
	T_OK(st.drive_hedges[0] > 0);
	T_OK(st.hedge_bytes > 0);
	rc.hedge = 0;
	rc.steps = 40;
	st = run(fx, &rc);
	T_EQ_U64(st.hedges, 0);
	T_EQ_U64(st.hedge_bytes, 0);
}

/* A guess read and never used: at idle it is wasted (the sums add up)
 * and stays cached; a later acquire of it is a plain hit, no prefetch
 * credit. */
static void test_idle_settles(struct fixture *fx)
{
	struct k3_err err = { 0 };
	struct k3_store_source *src = fx_source(fx, K3_STORE_DIRECT_AUTO, &err);
	struct k3_store *s = NULL;
	struct k3_store_stats st;
	struct k3_store_view v;

	if (!src)
		return;
	struct k3_store_config cfg = { .cache_bytes = 4 * k3_store_source_slot_bytes(src),
				       .prefetch_slots = -1 };
	T_EQ_INT(k3_store_new(src, &cfg, &s, &err), 0);
	if (!s) {
		k3_store_source_free(src);
		return;
	}
	uint32_t g = 3;
	k3_store_step_begin(s);
	T_EQ_INT(k3_store_prefetch(s, 2, &g, 1), 1);
	k3_store_drain(s);
	k3_store_stats_get(s, &st);
	T_EQ_U64(st.prefetch_wasted_bytes + st.prefetch_used_bytes + st.demand_bytes, 0);
	T_OK(st.bytes_read > 0);
	k3_store_idle(s);
	k3_store_stats_get(s, &st);
	check_sums(&st, "a guess settled at idle");
	T_EQ_U64(st.prefetch_wasted_bytes, st.bytes_read);
	T_OK(k3_store_resident(s, 2, 3));
	k3_store_step_begin(s);
	T_EQ_INT(k3_store_acquire(s, 2, &g, 1, &v, &err), 0);
	k3_store_release(s, &v, 1);
	k3_store_stats_get(s, &st);
	T_EQ_U64(st.demand_hits, 1);
	T_EQ_U64(st.prefetch_used, 0);
	check_sums(&st, "then a plain hit");
	k3_store_free(s);
	k3_store_source_free(src);
}

/* "auto" per drive: layer 3's experts live on drive 1 only; every guess
 * of them is wasted, so drive 1 stops taking guesses (skipped, counted)
 * while drive 0 still takes layer 1's; 8 x slots steps later it gets a
 * fresh record. */
static void test_auto_off(struct fixture *fx)
{
	struct k3_err err = { 0 };
	struct k3_store_source *src = k3_store_source_new(K3_STORE_DIRECT_AUTO);
	struct k3_store *s = NULL;
	uint32_t f;

	for (int s0 = 0; src && s0 < FX_SHARDS; s0++)
		T_EQ_INT(k3_store_source_add_file(src, fx->shard[s0], &f, &err), 0);
	int base = src ? add_copy_files(fx, src, 1, &err) : -1;
	T_OK(base >= 0);
	for (size_t i = 0; base >= 0 && i < fx->n_ex; i++) {
		struct k3_store_expert e = fx->ex[i].layer == 3 ? moved(fx, i, base) : fx->ex[i];
		T_EQ_INT(k3_store_source_add_expert(src, &e, &err), 0);
	}
	/* a gate that opens at once: only the per-drive record decides */
	/* two slots: one for the real routing, one for the guess */
	struct k3_store_config cfg = { .cache_bytes = 2 * (src ? k3_store_source_slot_bytes(src) : 0),
				       .prefetch_slots = -1,
				       .prefetch_auto = true, .prefetch_min_precision = 0.01 };
	if (base < 0 || k3_store_new(src, &cfg, &s, &err) != 0) {
		T_OK(!"store");
		k3_store_source_free(src);
		return;
	}
	struct k3_store_info info;
	struct k3_store_stats st;
	k3_store_info_get(s, &info);
	T_OK(info.drive_prefetch_on[1]);
	T_EQ_INT(info.drive_experts[0], 2 * FX_EXPERTS);
	T_EQ_INT(info.drive_experts[1], FX_EXPERTS);
	uint32_t step = 0;
	for (; step < 40; step++) {
		/* guess one of layer 3's experts, then route layer 1 only: the
		 * guess is never used, settled as wasted at idle */
		uint32_t g = (step % FX_EXPERTS) * 3, real = ((step + 1) % FX_EXPERTS) * 3;
		struct k3_store_view v;
		k3_store_step_begin(s);
		k3_store_prefetch_ranked(s, 3, &g, NULL, 1, false, K3_STORE_GUESS_AFTER);
		k3_store_drain(s);
		k3_store_step_begin(s);
		T_EQ_INT(k3_store_acquire(s, 1, &real, 1, &v, &err), 0);
		k3_store_release(s, &v, 1);
		k3_store_prefetch_cancel(s, UINT32_MAX);
		k3_store_drain(s);
		k3_store_idle(s);
		k3_store_info_get(s, &info);
		if (!info.drive_prefetch_on[1])
			break;
	}
	k3_store_stats_get(s, &st);
	printf("auto: drive 1 off after %u wrong guesses (issued %llu, wasted %llu bytes, skipped %llu)\n", step + 1,
	       (unsigned long long)st.prefetch_issued, (unsigned long long)st.prefetch_wasted_bytes,
	       (unsigned long long)st.prefetch_skipped);
	T_OK(!info.drive_prefetch_on[1]);
	T_OK(info.drive_prefetch_on[0]);
	k3_store_stats_get(s, &st);
	uint64_t skips = st.drive_prefetch_off_skips[1];
	uint32_t g = 9;
	k3_store_step_begin(s);
	T_EQ_INT(k3_store_prefetch_ranked(s, 3, &g, NULL, 1, false, K3_STORE_GUESS_AFTER), 0);
	T_EQ_INT(k3_store_prefetch_ranked(s, 2, &g, NULL, 1, false, K3_STORE_GUESS_AFTER), 1);
	k3_store_stats_get(s, &st);
	T_EQ_U64(st.drive_prefetch_off_skips[1], skips + 1);
	k3_store_drain(s);
	k3_store_idle(s);   /* the layer-2 guess settled: a prefetch slot free */
	for (uint32_t k = 0; k < 8 * info.n_slots; k++)
		k3_store_step_begin(s);
	uint32_t g2 = 0;
	while (k3_store_resident(s, 3, g2))
		g2 += 3;   /* one that costs a read */
	T_EQ_INT(k3_store_prefetch_ranked(s, 3, &g2, NULL, 1, false, K3_STORE_GUESS_AFTER), 1);
	k3_store_prefetch_cancel(s, UINT32_MAX);
	k3_store_drain(s);
	k3_store_idle(s);
	k3_store_stats_get(s, &st);
	check_sums(&st, "auto off");
	k3_store_free(s);
	k3_store_source_free(src);
}

/* distinct_experts: each (layer, expert) once per epoch, duplicates and
 * repeats in later steps not again; a new epoch counts afresh. */
static void test_distinct(struct fixture *fx)
{
	struct k3_err err = { 0 };
	struct k3_store_source *src = fx_source(fx, K3_STORE_DIRECT_AUTO, &err);
	struct k3_store *s = NULL;
	struct k3_store_stats st;
	struct k3_store_view v[4];

	if (!src)
		return;
	struct k3_store_config cfg = { .cache_bytes = 6 * k3_store_source_slot_bytes(src) };
	T_EQ_INT(k3_store_new(src, &cfg, &s, &err), 0);
	if (!s) {
		k3_store_source_free(src);
		return;
	}
	uint32_t a[4] = { 0, 3, 3, 6 }, b[2] = { 6, 9 };
	k3_store_epoch_begin(s);
	k3_store_step_begin(s);
	T_EQ_INT(k3_store_acquire(s, 1, a, 4, v, &err), 0);
	k3_store_release(s, v, 4);
	k3_store_step_begin(s);
	T_EQ_INT(k3_store_acquire(s, 1, b, 2, v, &err), 0);
	k3_store_release(s, v, 2);
	k3_store_step_begin(s);
	T_EQ_INT(k3_store_acquire(s, 2, b, 2, v, &err), 0);
	k3_store_release(s, v, 2);
	k3_store_stats_get(s, &st);
	T_EQ_U64(st.distinct_experts, 6);     /* (1,0) (1,3) (1,6) (1,9) (2,6) (2,9) */
	k3_store_epoch_begin(s);
	k3_store_step_begin(s);
	T_EQ_INT(k3_store_acquire(s, 1, a, 4, v, &err), 0);
	k3_store_release(s, v, 4);
	k3_store_stats_get(s, &st);
	T_EQ_U64(st.distinct_experts, 9);
	k3_store_free(s);
	k3_store_source_free(src);
}

int main(void)
{
	struct fixture fx;

	if (fx_init(&fx) != 0) {
		printf("skip: no fixture\n");
		return 77;
	}
	test_copies_api(&fx);
	test_reads_and_sums(&fx);
	test_hedging(&fx);
	test_idle_settles(&fx);
	test_auto_off(&fx);
	test_distinct(&fx);
	fx_release(&fx);
	return t_done();
}

/*
 * store.c - the store's lifecycle and queries (see store.h): creating a
 * store (slots, the prefetch records, the reader pool it reads through),
 * steps, holds, drain, counters and gauges. The acquire path is in
 * store_cache.c, prefetch in store_prefetch.c, the readers in store_io.c.
 */
#include "store/store.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "base/carve.h"
#include "store/store_cache.h"
#include "store/store_io.h"
#include "store/store_prefetch.h"

_Static_assert((int)K3_STORE_MAX_IO_THREADS == (int)K3_STORE_IO_MAX_THREADS,
	       "store.h and store_io.h disagree on the reader limit");

/* Checks what the config may get wrong. Returns 0 or -EINVAL. */
static int check_config(const struct k3_store_config *cfg, struct k3_err *err)
{
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
	if (!(cfg->hedge_factor >= 0) || cfg->hedge_buffers > K3_STORE_MAX_HEDGES)
		return k3_err_set(err, -EINVAL, "hedge factor %g (>= 0) or %u hedge buffers (at"
				  " most %d)", cfg->hedge_factor, cfg->hedge_buffers,
				  K3_STORE_MAX_HEDGES);
	return 0;
}

/* The slots' memory (none in dry_run), prefaulted when asked. */
static int alloc_slots(struct k3_store *s, struct k3_err *err)
{
	for (uint32_t h = 0; h < s->n_hedges; h++) {
		void *mem;
		if (posix_memalign(&mem, K3_STORE_ALIGN, s->slot_bytes) != 0)
			return k3_err_set(err, -ENOMEM, "cannot allocate a hedge buffer of %" PRIu64
					  " bytes", s->slot_bytes);
		s->hedges[h].mem = mem;
		s->hedges[h].slot = s->hedges[h].loser_slot = -1;
	}
	for (uint32_t i = 0; i < s->n_slots; i++) {
		struct k3_store_slot *sl = &s->slots[i];
		void *mem;
		sl->ex = -1;
		sl->hedge = -1;
		if (s->cfg.dry_run)
			continue;
		if (posix_memalign(&mem, K3_STORE_ALIGN, s->slot_bytes) != 0)
			return k3_err_set(err, -ENOMEM, "cannot allocate slot %" PRIu32 " of %"
					  PRIu32 " (%" PRIu64 " bytes each)", i, s->n_slots,
					  s->slot_bytes);
		sl->mem = mem;
		if (s->cfg.prefault)
			for (uint64_t b = 0; b < s->slot_bytes; b += 4096)
				sl->mem[b] = 0;
	}
	return 0;
}

int k3_store_new(const struct k3_store_source *src, const struct k3_store_config *cfg,
		 struct k3_store **out, struct k3_err *err)
{
	struct k3_store *s;
	size_t n_ex = k3_store_source_count(src);
	uint32_t n_layers = 0;
	uint64_t slots;
	int rc;

	*out = NULL;
	if (n_ex == 0)
		return k3_err_set(err, -EINVAL, "the expert source is empty");
	rc = check_config(cfg, err);
	if (rc)
		return rc;
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
	s->n_drives = k3_store_source_drive_count(src);
	/* Hedge buffers out of the budget, while min_slots slots stay. */
	if (cfg->hedge_factor > 0 && s->n_drives > 1 && !cfg->dry_run) {
		uint64_t h = cfg->hedge_buffers ? cfg->hedge_buffers : 2 * (s->n_drives - 1);
		uint64_t least = cfg->min_slots ? cfg->min_slots : 1;
		if (h > K3_STORE_MAX_HEDGES)
			h = K3_STORE_MAX_HEDGES;
		if (slots >= least + h) {
			s->n_hedges = (uint32_t)h;
			s->hedge_factor = cfg->hedge_factor;
			slots -= h;
		}
	}
	if (slots > n_ex)
		slots = n_ex;   /* more slots than experts would never be used */
	s->n_slots = (uint32_t)slots;
	if (s->cfg.prefetch_slots < 0)
		s->cfg.prefetch_slots = (int)(s->n_slots / 2);
	s->piece_bytes = cfg->prefetch_piece_bytes ? cfg->prefetch_piece_bytes
						   : K3_STORE_PREFETCH_PIECE_BYTES;
	/* No planned read (its head included) is longer than a slot: a larger
	 * piece reads the same, and the piece arithmetic must not wrap. */
	if (s->piece_bytes > s->slot_bytes)
		s->piece_bytes = (s->slot_bytes + K3_STORE_ALIGN - 1) / K3_STORE_ALIGN *
				 K3_STORE_ALIGN;
	for (size_t i = 0; i < n_ex; i++) {
		uint32_t l = k3_store_source_expert(src, i)->layer;
		if (l + 1 > n_layers)
			n_layers = l + 1;   /* <= K3_STORE_MAX_LAYERS (store_source.h) */
	}
	struct k3_carve k = { 0 };
	while (k3_carve_next(&k)) {
		K3_CARVE(&k, s->slots, s->n_slots);
		K3_CARVE(&k, s->slot_of, n_ex);
		K3_CARVE(&k, s->uses, n_ex);
		K3_CARVE(&k, s->seen, n_ex);
	}
	s->arrays = k.block;
	s->epoch = 1;
	rc = k3_store_guesses_init(&s->guesses, n_layers,
				   cfg->prefetch_min_precision > 0 ? cfg->prefetch_min_precision
								   : K3_STORE_PREFETCH_MIN_PRECISION);
	if (!s->arrays || rc) {
		rc = k3_err_set(err, -ENOMEM, "out of memory");
		goto fail;
	}
	for (size_t i = 0; i < n_ex; i++)
		s->slot_of[i] = -1;
	rc = alloc_slots(s, err);
	if (rc)
		goto fail;
	/* Readers: prefetch reads never take the last free one (a demand read
	 * issued while guesses are being read starts at once instead of
	 * behind one of them); with one reader, it may prefetch. */
	unsigned threads = cfg->dry_run ? 0 : cfg->io_threads ? cfg->io_threads
							  : K3_STORE_DEFAULT_IO_THREADS;
	struct k3_store_io_config io_cfg = { .threads = threads, .n_drives = s->n_drives,
					     .rate_bytes_per_s = cfg->io_rate_bytes_per_s,
					     .latency_ns = cfg->io_latency_ns };
	memcpy(io_cfg.drive, cfg->drive, sizeof(io_cfg.drive));
	for (uint32_t d = 0; cfg->dry_run && d < s->n_drives; d++)
		io_cfg.drive[d].threads = 0;
	io_cfg.class_readers[K3_STORE_IO_PREFETCH] = threads > 1 ? threads - 1 : 1;
	rc = k3_store_io_new(&io_cfg, &s->io, err);
	if (rc)
		goto fail;
	*out = s;
	return 0;
fail:
	k3_store_free(s);
	return rc;
}

void k3_store_free(struct k3_store *s)
{
	if (!s)
		return;
	k3_store_io_free(s->io);   /* first: the readers write into the slots */
	for (uint32_t i = 0; s->slots && i < s->n_slots; i++)
		free(s->slots[i].mem);
	for (uint32_t h = 0; h < s->n_hedges; h++)
		free(s->hedges[h].mem);
	free(s->arrays);
	k3_store_guesses_release(&s->guesses);
	free(s);
}

void k3_store_step_begin(struct k3_store *s)
{
	k3_store_io_lock(s->io);
	s->step++;
	s->st.steps++;
	k3_store_io_unlock(s->io);
}

void k3_store_idle(struct k3_store *s)
{
	k3_store_io_lock(s->io);
	s->last_exit_ns = 0;
	/* Guesses read and not used by the request that read them are its
	 * waste: they stay cached, at the cold end, and a later hit on one is
	 * a plain hit. Queued ones are dropped unread. */
	for (uint32_t i = 0; i < s->n_slots; i++) {
		struct k3_store_slot *sl = &s->slots[i];
		if (!sl->prefetched || sl->pins || sl->state == K3_STORE_SLOT_READING)
			continue;
		if (sl->state == K3_STORE_SLOT_QUEUED) {
			k3_store_cache_drop(s, (int32_t)i, false);
			continue;
		}
		k3_store_cache_guess_fate(s, sl->drive, sl->read_bytes, false);
		sl->prefetched = false;
		sl->missed = true;
		s->prefetch_outstanding--;
	}
	k3_store_io_unlock(s->io);
}

void k3_store_epoch_begin(struct k3_store *s)
{
	k3_store_io_lock(s->io);
	if (++s->epoch == 0) {   /* wrapped: forget every old mark */
		memset(s->seen, 0, k3_store_source_count(s->src) * sizeof(*s->seen));
		s->epoch = 1;
	}
	k3_store_io_unlock(s->io);
}

void k3_store_hold_prefetch(struct k3_store *s, bool hold)
{
	k3_store_io_lock(s->io);
	k3_store_io_hold_class(s->io, K3_STORE_IO_PREFETCH, hold);
	k3_store_io_unlock(s->io);
}

void k3_store_hold_reads(struct k3_store *s, bool hold)
{
	k3_store_io_lock(s->io);
	k3_store_io_hold_all(s->io, hold);
	k3_store_io_unlock(s->io);
}

void k3_store_hold_pieces(struct k3_store *s, bool hold)
{
	k3_store_io_lock(s->io);
	k3_store_io_hold_pieces(s->io, hold);
	k3_store_io_unlock(s->io);
}

void k3_store_drain(struct k3_store *s)
{
	k3_store_io_lock(s->io);
	k3_store_io_drain(s->io);
	k3_store_io_unlock(s->io);
}

struct k3_store_io *k3_store_reader_pool(struct k3_store *s)
{
	return s->io;
}

void k3_store_stats_get(struct k3_store *s, struct k3_store_stats *st)
{
	struct k3_store_io_stats ios;

	k3_store_io_lock(s->io);
	*st = s->st;
	k3_store_io_stats_get(s->io, &ios);
	st->emulated_wait_ns = ios.emulated_wait_ns;
	k3_store_io_unlock(s->io);
}

void k3_store_info_get(struct k3_store *s, struct k3_store_info *info)
{
	memset(info, 0, sizeof(*info));
	k3_store_io_lock(s->io);
	info->n_slots = s->n_slots;
	info->slot_bytes = s->slot_bytes;
	info->io_threads = k3_store_io_threads(s->io);
	info->n_drives = s->n_drives;
	info->hedge_buffers = s->n_hedges;
	for (uint32_t d = 0; d < s->n_drives; d++) {
		info->drive_prefetch_on[d] = !s->dpf[d].off;
		k3_store_io_drive_info_get(s->io, d, &info->drive[d]);
	}
	for (uint32_t i = 0; i < s->n_slots; i++) {
		const struct k3_store_slot *sl = &s->slots[i];
		info->resident += sl->state != K3_STORE_SLOT_FREE;
		info->pinned += sl->pins > 0;
		if (sl->prefetched && sl->state == K3_STORE_SLOT_READY)
			info->prefetch_unused_bytes += sl->read_bytes;
	}
	k3_store_io_unlock(s->io);
	for (size_t i = 0; i < k3_store_source_count(s->src); i++)
		for (unsigned c = 0, n = k3_store_source_copies(s->src, i); c < n; c++)
			info->drive_experts[k3_store_source_copy_drive(s->src, i, c)]++;
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

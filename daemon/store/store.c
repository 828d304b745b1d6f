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

#include "store/store_cache.h"
#include "store/store_io.h"
#include "store/store_prefetch.h"

_Static_assert((int)K3_STORE_MAX_IO_THREADS == (int)K3_STORE_IO_MAX_THREADS,
	       "store.h and store_io.h disagree on the reader limit");

/* Slots, arrays and s itself: what k3_store_new allocates before it
 * starts the readers (also its failure path). */
static void free_memory(struct k3_store *s)
{
	if (s->slots)
		for (uint32_t i = 0; i < s->n_slots; i++)
			free(s->slots[i].mem);
	free(s->slots);
	free(s->slot_of);
	free(s->uses);
	k3_store_guesses_release(&s->guesses);
	free(s);
}

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
	return 0;
}

/* The slots' memory (none in dry_run), prefaulted when asked. */
static int alloc_slots(struct k3_store *s, struct k3_err *err)
{
	for (uint32_t i = 0; i < s->n_slots; i++) {
		struct k3_store_slot *sl = &s->slots[i];
		void *mem;
		sl->ex = -1;
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
	s->slots = calloc(s->n_slots, sizeof(*s->slots));
	s->slot_of = malloc(n_ex * sizeof(*s->slot_of));
	s->uses = calloc(n_ex, sizeof(*s->uses));
	rc = k3_store_guesses_init(&s->guesses, n_layers,
				   cfg->prefetch_min_precision > 0 ? cfg->prefetch_min_precision
								   : K3_STORE_PREFETCH_MIN_PRECISION);
	if (!s->slots || !s->slot_of || !s->uses || rc) {
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
	struct k3_store_io_config io_cfg = { .threads = threads,
					     .rate_bytes_per_s = cfg->io_rate_bytes_per_s,
					     .latency_ns = cfg->io_latency_ns };
	io_cfg.class_readers[K3_STORE_IO_PREFETCH] = threads > 1 ? threads - 1 : 1;
	rc = k3_store_io_new(&io_cfg, &s->io, err);
	if (rc)
		goto fail;
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
	k3_store_io_free(s->io);
	free_memory(s);
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
	for (uint32_t i = 0; i < s->n_slots; i++) {
		const struct k3_store_slot *sl = &s->slots[i];
		info->resident += sl->state != K3_STORE_SLOT_FREE;
		info->pinned += sl->pins > 0;
		if (sl->prefetched && sl->state == K3_STORE_SLOT_READY)
			info->prefetch_unused_bytes += sl->read_bytes;
	}
	k3_store_io_unlock(s->io);
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

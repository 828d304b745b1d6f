/*
 * store_spine.c - the spine loader (see store_spine.h): the ring of arenas
 * and its read-ahead (the arena given up is the one whose unit is needed
 * furthest in the future of the cyclic pass order), reads cut into jobs
 * for the reader pool, the embedding's rows, the engine's spine source
 * over all of it, and the queries. Sizes, planning the units from the
 * spine pack or the shards, creation and free: store_spine_new.c.
 */
#include "store/store_spine.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "store/store.h"
#include "store/store_spine_internal.h"

static uint64_t now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

const char *k3_store_spine_unit_name(const struct k3_store_spine *sp, uint32_t pos, char *buf,
				     size_t size)
{
	if (pos < sp->n_layers)
		snprintf(buf, size, "layer %" PRIu32, pos);
	else
		snprintf(buf, size, pos == sp->n_layers ? "the head" : "the embedding");
	return buf;
}

/* ---- loads (the pool's lock held) ---- */

static uint32_t n_positions(const struct k3_store_spine *sp)
{
	return sp->n_layers + 1;   /* the layers, then the head: one pass */
}

/* How far ahead of the cursor position pos is needed: 1 = next, n_positions
 * = the cursor's own unit (just used: needed again only next pass). */
static uint32_t dist(const struct k3_store_spine *sp, uint32_t pos)
{
	uint32_t n = n_positions(sp);
	return (pos + n - sp->cursor - 1) % n + 1;
}

/* The arena's load is over: ready, failed, or (abandoned) empty again. */
static void finish_load(struct spine_arena *a)
{
	struct k3_store_spine *sp = a->sp;

	if (a->abandoned) {
		sp->st.wasted_bytes += a->load_bytes;
		sp->units[a->unit].arena = -1;
		a->unit = -1;
		a->state = A_EMPTY;
		a->abandoned = false;
		return;
	}
	a->state = a->rc ? A_FAILED : A_READY;
	if (!a->rc)
		sp->st.loads++;
}

static void unit_job_done(struct k3_store_io_job *job, int rc, uint64_t bytes, bool stopped)
{
	struct spine_arena *a = job->owner;

	(void)stopped;   /* spine jobs are never stopped */
	a->sp->st.bytes_read += bytes;
	a->sp->st.reads++;
	a->load_bytes += bytes;
	if (rc && !a->rc)
		a->rc = rc;
	if (--a->pending == 0)
		finish_load(a);
}

static void row_job_done(struct k3_store_io_job *job, int rc, uint64_t bytes, bool stopped)
{
	struct k3_store_spine *sp = job->owner;

	(void)stopped;
	sp->st.bytes_read += bytes;
	sp->st.demand_bytes += bytes;
	sp->st.reads++;
	sp->st.rows_read++;
	if (rc && !sp->rows_rc)
		sp->rows_rc = rc;
	sp->rows_pending--;
}

static const struct k3_store_io_ops unit_ops = { .done = unit_job_done };
static const struct k3_store_io_ops row_ops = { .done = row_job_done };

/* Queues the reads of unit u into arena a (empty), as chunk jobs. */
void k3_store_spine_start_load(struct k3_store_spine *sp, struct spine_arena *a, uint32_t u)
{
	struct spine_unit *un = &sp->units[u];
	uint64_t chunk = sp->cfg.chunk_bytes;
	uint32_t j = 0;

	a->unit = (int)u;
	a->state = A_LOADING;
	a->rc = 0;
	a->used = a->abandoned = false;
	a->load_bytes = 0;
	un->arena = (int)(a - sp->arenas);
	for (unsigned r = 0; r < un->n_rd; r++) {
		const struct k3_store_read *rd = &un->rd[r];
		uint64_t base = rd->offset - rd->offset % K3_STORE_ALIGN, end = rd->offset + rd->length;
		for (uint32_t p = 0, n = k3_store_spine_read_jobs(rd, chunk); p < n; p++) {
			uint64_t lo = base + p * chunk, hi = lo + chunk;
			if (lo < rd->offset)
				lo = rd->offset;
			if (hi > end)
				hi = end;
			a->jrd[j] = (struct k3_store_read){ .file = rd->file, .offset = lo,
							    .length = hi - lo,
							    .slot_offset = rd->slot_offset + (lo - rd->offset) };
			a->jobs[j] = (struct k3_store_io_job){ .read = k3_store_io_read_source,
							       .read_ctx = sp->src, .rd = &a->jrd[j],
							       .n_rd = 1, .dst = a->mem, .ops = &unit_ops,
							       .owner = a };
			j++;
		}
	}
	a->n_jobs = a->pending = j;
	for (uint32_t k = 0; k < j; k++)
		k3_store_io_submit(sp->io, &a->jobs[k], K3_STORE_IO_SPINE);
}

/* Gives up a loading arena: its queued jobs are taken back, the running
 * ones finish (then it is empty). */
void k3_store_spine_abandon(struct k3_store_spine *sp, struct spine_arena *a)
{
	if (a->state != A_LOADING)
		return;
	a->abandoned = true;
	for (uint32_t k = 0; k < a->n_jobs; k++)
		if (k3_store_io_cancel(sp->io, &a->jobs[k]))
			a->pending--;
	if (a->pending == 0)
		finish_load(a);
}

/* Empties a ready or failed ring arena; a unit read ahead and never used
 * was waste. */
static void evict(struct k3_store_spine *sp, struct spine_arena *a)
{
	if (a->unit < 0)
		return;
	if (a->state == A_READY && !a->used)
		sp->st.wasted_bytes += a->load_bytes;
	sp->units[a->unit].arena = -1;
	a->unit = -1;
	a->state = A_EMPTY;
}

/* The ring arena to load a unit of distance `need` into: an empty one, or
 * the ready (or failed) one not in use whose unit is needed furthest
 * ahead, and later than `need`; -1 when none. */
static int victim(const struct k3_store_spine *sp, uint32_t need)
{
	uint32_t best_d = need;
	int best = -1;

	for (uint32_t i = 0; i < sp->n_ring; i++) {
		const struct spine_arena *a = &sp->arenas[i];
		if (a->in_use || a->state == A_LOADING)
			continue;
		if (a->state == A_EMPTY)
			return (int)i;
		uint32_t d = dist(sp, sp->units[a->unit].pos);
		if (d > best_d) {
			best_d = d;
			best = (int)i;
		}
	}
	return best;
}

/* Read-ahead: the streamed units after the cursor, in pass order, go into
 * arenas holding units needed later (the head only in a pass that wants
 * it), until no such arena is left. */
static void fill(struct k3_store_spine *sp)
{
	uint32_t n = n_positions(sp);

	for (uint32_t k = 1; k < n; k++) {
		uint32_t pos = (sp->cursor + k) % n;
		const struct spine_unit *u = &sp->units[pos];
		if (!u->streamed || u->arena >= 0 || (pos == sp->n_layers && !sp->head_wanted))
			continue;
		int v = victim(sp, k);
		if (v < 0)
			return;
		evict(sp, &sp->arenas[v]);
		k3_store_spine_start_load(sp, &sp->arenas[v], pos);
	}
}

/* Waits until arena a is no longer loading, the time counted as I/O wait. */
void k3_store_spine_wait_arena(struct k3_store_spine *sp, struct spine_arena *a)
{
	if (a->state != A_LOADING)
		return;
	uint64_t t0 = now_ns();
	while (a->state == A_LOADING)
		k3_store_io_wait(sp->io);
	sp->st.io_wait_ns += now_ns() - t0;
}

int k3_store_spine_read_error(struct k3_store_spine *sp, uint32_t pos, int rc, struct k3_err *err)
{
	char name[32];
	const struct spine_unit *u = &sp->units[pos];
	return k3_err_set(err, rc, "cannot read %s of the spine from '%s': %s",
			  k3_store_spine_unit_name(sp, pos, name, sizeof(name)),
			  k3_store_source_file_path(sp->src, u->n_rd ? u->rd[0].file : 0),
			  strerror(-rc));
}

/* Makes the streamed unit at pos readable and marks it in use (lock
 * held). */
static int acquire_unit(struct k3_store_spine *sp, uint32_t pos, struct k3_err *err)
{
	struct spine_unit *u = &sp->units[pos];
	uint32_t n = n_positions(sp);

	if (pos == sp->n_layers)
		sp->head_wanted = true;
	sp->cursor = (pos + n - 1) % n;   /* pos is next */
	fill(sp);
	if (u->arena < 0) {
		/* Every arena holds something needed sooner (the engine asked
		 * out of pass order, e.g. after an error): take the furthest. */
		int v = victim(sp, 0);
		if (v < 0) {
			uint32_t best_d = 0;
			for (uint32_t i = 0; i < sp->n_ring; i++) {
				struct spine_arena *a = &sp->arenas[i];
				if (!a->in_use && a->state == A_LOADING &&
				    dist(sp, sp->units[a->unit].pos) > best_d) {
					best_d = dist(sp, sp->units[a->unit].pos);
					v = (int)i;
				}
			}
			if (v < 0)
				return k3_err_set(err, -EBUSY, "spine: every ring arena is in use");
			k3_store_spine_abandon(sp, &sp->arenas[v]);
			while (sp->arenas[v].state == A_LOADING)
				k3_store_io_wait(sp->io);
		}
		evict(sp, &sp->arenas[v]);
		k3_store_spine_start_load(sp, &sp->arenas[v], pos);
	}
	struct spine_arena *a = &sp->arenas[u->arena];
	k3_store_spine_wait_arena(sp, a);
	if (a->state == A_FAILED) {
		int rc = a->rc;
		evict(sp, a);
		return k3_store_spine_read_error(sp, pos, rc, err);
	}
	if (!a->used)
		sp->st.demand_bytes += a->load_bytes;
	a->in_use = a->used = true;
	sp->cursor = pos;
	fill(sp);
	return 0;
}

static void release_unit(struct k3_store_spine *sp, uint32_t pos)
{
	struct spine_unit *u = &sp->units[pos];

	if (u->arena < 0)
		return;
	sp->arenas[u->arena].in_use = false;
	if (pos == sp->n_layers)
		sp->head_wanted = false;
	fill(sp);
}

/* ---- the engine's spine source ---- */

static void unit_tensors(const struct spine_unit *u, const uint8_t *mem,
			 struct k3_prov_tensor *const *out)
{
	for (unsigned i = 0; i < u->n_fields; i++) {
		*out[i] = u->tmpl[i];
		if (out[i]->dtype != K3_PROV_DTYPE_NONE)
			out[i]->data = mem + u->off[i];
	}
}

static int acquire(struct k3_store_spine *sp, uint32_t pos, struct k3_prov_tensor *const *out,
		   struct k3_err *err)
{
	struct spine_unit *u = &sp->units[pos];
	int rc = 0;

	k3_store_io_lock(sp->io);
	if (!u->resident)
		rc = acquire_unit(sp, pos, err);
	if (rc == 0)
		unit_tensors(u, sp->arenas[u->arena].mem, out);
	k3_store_io_unlock(sp->io);
	return rc;
}

static int src_acquire_layer(void *ctx, uint32_t layer, struct k3_prov_layer_weights *w,
			     struct k3_err *err)
{
	struct k3_store_spine *sp = ctx;
	struct k3_prov_tensor *out[K3_ENGINE_LAYER_FIELDS];

	if (layer >= sp->n_layers)
		return k3_err_set(err, -EINVAL, "spine: no layer %" PRIu32, layer);
	for (unsigned i = 0; i < K3_ENGINE_LAYER_FIELDS; i++)
		out[i] = k3_engine_layer_field(w, i);
	return acquire(sp, layer, out, err);
}

static int src_acquire_head(void *ctx, struct k3_prov_weights *w, struct k3_err *err)
{
	struct k3_store_spine *sp = ctx;
	struct k3_prov_tensor *out[K3_ENGINE_HEAD_FIELDS];

	for (unsigned i = 0; i < K3_ENGINE_HEAD_FIELDS; i++)
		out[i] = k3_engine_head_field(w, i);
	return acquire(sp, sp->n_layers, out, err);
}

static void src_release(struct k3_store_spine *sp, uint32_t pos)
{
	if (sp->units[pos].resident)
		return;
	k3_store_io_lock(sp->io);
	release_unit(sp, pos);
	k3_store_io_unlock(sp->io);
}

static void src_release_layer(void *ctx, uint32_t layer)
{
	struct k3_store_spine *sp = ctx;
	if (layer < sp->n_layers)
		src_release(sp, layer);
}

static void src_release_head(void *ctx)
{
	struct k3_store_spine *sp = ctx;
	src_release(sp, sp->n_layers);
}

static void src_prefetch_layer(void *ctx, uint32_t layer)
{
	struct k3_store_spine *sp = ctx;

	if (layer > sp->n_layers || !sp->units[layer].streamed)
		return;
	k3_store_io_lock(sp->io);
	if (layer == sp->n_layers)
		sp->head_wanted = true;
	fill(sp);
	k3_store_io_unlock(sp->io);
}

static void src_begin_pass(void *ctx, bool logits)
{
	struct k3_store_spine *sp = ctx;

	k3_store_io_lock(sp->io);
	sp->cursor = sp->n_layers;   /* the last pass is over: layer 0 comes next */
	sp->head_wanted = logits && sp->units[sp->n_layers].streamed;
	fill(sp);
	k3_store_io_unlock(sp->io);
}

/* Rows of ids[0..T) (T <= max_rows) as demand reads into the row scratch,
 * then into rows. */
static int read_rows(struct k3_store_spine *sp, const int32_t *ids, uint32_t T, uint8_t *rows,
		     struct k3_err *err)
{
	int rc;

	k3_store_io_lock(sp->io);
	sp->rows_rc = 0;
	sp->rows_pending = T;
	for (uint32_t t = 0; t < T; t++) {
		uint64_t off = sp->embed_offset + (uint64_t)ids[t] * sp->row_bytes;
		sp->row_rd[t] = (struct k3_store_read){ .file = sp->embed_file, .offset = off,
							.length = sp->row_bytes,
							.slot_offset = off % K3_STORE_ALIGN };
		sp->row_jobs[t] = (struct k3_store_io_job){ .read = k3_store_io_read_source,
			.read_ctx = sp->src, .rd = &sp->row_rd[t], .n_rd = 1,
			.dst = sp->row_mem + (size_t)t * sp->row_stride, .ops = &row_ops,
			.owner = sp };
		k3_store_io_submit(sp->io, &sp->row_jobs[t], K3_STORE_IO_DEMAND);
	}
	uint64_t t0 = now_ns();
	while (sp->rows_pending)
		k3_store_io_wait(sp->io);
	sp->st.io_wait_ns += now_ns() - t0;
	rc = sp->rows_rc;
	k3_store_io_unlock(sp->io);
	if (rc)
		return k3_store_spine_read_error(sp, sp->n_layers + 1, rc, err);
	for (uint32_t t = 0; t < T; t++)
		memcpy(rows + (size_t)t * sp->row_bytes,
		       sp->row_mem + (size_t)t * sp->row_stride + sp->row_rd[t].slot_offset,
		       sp->row_bytes);
	return 0;
}

static int src_embed_rows(void *ctx, const int32_t *ids, uint32_t T, void *rows,
			  struct k3_err *err)
{
	struct k3_store_spine *sp = ctx;
	const struct spine_unit *e = &sp->units[sp->n_layers + 1];
	uint8_t *out = rows;

	for (uint32_t t = 0; t < T; t++)
		if (ids[t] < 0 || (uint32_t)ids[t] >= sp->vocab)
			return k3_err_set(err, -EINVAL, "token id %" PRId32 " not in 0..%" PRIu32,
					  ids[t], sp->vocab - 1);
	if (e->resident) {
		const uint8_t *table = sp->arenas[e->arena].mem + e->off[0];
		for (uint32_t t = 0; t < T; t++)
			memcpy(out + (size_t)t * sp->row_bytes,
			       table + (uint64_t)ids[t] * sp->row_bytes, sp->row_bytes);
		return 0;
	}
	for (uint32_t t0 = 0; t0 < T; t0 += sp->cfg.max_rows) {
		uint32_t n = T - t0 < sp->cfg.max_rows ? T - t0 : sp->cfg.max_rows;
		int rc = read_rows(sp, ids + t0, n, out + (size_t)t0 * sp->row_bytes, err);
		if (rc)
			return rc;
	}
	return 0;
}

void k3_store_spine_source(struct k3_store_spine *sp, struct k3_spine_source *out)
{
	*out = (struct k3_spine_source){
		.ctx = sp,
		.resident_layers = sp->cfg.resident_layers,
		.head_resident = sp->cfg.head_resident,
		.begin_pass = src_begin_pass,
		.prefetch_layer = src_prefetch_layer,
		.acquire_layer = src_acquire_layer,
		.release_layer = src_release_layer,
		.embed_rows = src_embed_rows,
		.acquire_head = src_acquire_head,
		.release_head = src_release_head,
	};
}
/* ---- queries ---- */

void k3_store_spine_drain(struct k3_store_spine *sp)
{
	k3_store_io_lock(sp->io);
	for (uint32_t i = 0; i < sp->n_arenas; i++)
		k3_store_spine_wait_arena(sp, &sp->arenas[i]);
	/* What was read ahead into the next pass is this request's, and the
	 * next pass will use it: demand now, so the sums add up per request. */
	for (uint32_t i = 0; i < sp->n_ring; i++) {
		struct spine_arena *a = &sp->arenas[i];
		if (a->unit >= 0 && a->state == A_READY && !a->used) {
			sp->st.demand_bytes += a->load_bytes;
			a->used = true;
		}
	}
	k3_store_io_unlock(sp->io);
}

void k3_store_spine_stats_get(struct k3_store_spine *sp, struct k3_store_spine_stats *st)
{
	k3_store_io_lock(sp->io);
	*st = sp->st;
	k3_store_io_unlock(sp->io);
}

void k3_store_spine_stats_sub(const struct k3_store_spine_stats *a,
			      const struct k3_store_spine_stats *b,
			      struct k3_store_spine_stats *out)
{
	const uint64_t *pa = (const uint64_t *)a, *pb = (const uint64_t *)b;
	uint64_t *po = (uint64_t *)out;

	/* The struct is all uint64_t, by contract of store_spine.h. */
	for (size_t i = 0; i < sizeof(*a) / sizeof(uint64_t); i++)
		po[i] = pa[i] - pb[i];
}

void k3_store_spine_info_get(struct k3_store_spine *sp, struct k3_store_spine_info *info)
{
	memset(info, 0, sizeof(*info));
	info->n_layers = sp->n_layers;
	info->resident_layers = sp->cfg.resident_layers;
	info->ring_arenas = sp->n_ring;
	info->head_resident = sp->cfg.head_resident;
	info->embed_resident = sp->cfg.embed_resident;
	info->from_pack = sp->from_pack;
	info->arena_bytes = sp->arena_bytes;
	info->resident_bytes = sp->resident_bytes;
	info->startup_bytes = sp->startup_bytes;
	info->memory_bytes = sp->resident_bytes + sp->n_ring * sp->arena_bytes +
			     (sp->row_mem ? sp->cfg.max_rows * sp->row_stride : 0);
	for (uint32_t u = 0; u <= sp->n_layers; u++)
		if (sp->units[u].streamed)
			info->streamed_bytes_per_pass += sp->units[u].bytes;
}

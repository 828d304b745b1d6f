/*
 * store_spine_new.c - the spine loader's creation (see store_spine.h and
 * store_spine.c): its sizes from the model alone, the units planned from
 * the spine pack (checked against the model's spine) or the shards, the
 * ring and the resident buffers, the resident units read at start, free.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "store/store.h"
#include "store/store_model.h"
#include "store/store_pack.h"
#include "store/store_spine_internal.h"

enum { DEFAULT_ROWS = 64, MAX_ROWS = 4096 };
#define HUGE_PAGE ((uint64_t)2 << 20)

static uint64_t align_up(uint64_t v, uint64_t a)
{
	return (v + a - 1) / a * a;
}

/* ---- sizes (the model alone) ---- */

/* Bytes of unit span i of in: the larger of the pack layout (arrays on
 * 64-byte boundaries) and the shards' (k3_store_plan_extents). */
static uint64_t span_bytes(const struct k3_store_spine_input *in, size_t i)
{
	const struct k3_store_pack_span *sp = &in->spans[i];
	struct k3_store_read rd[K3_ENGINE_LAYER_FIELDS];
	uint64_t off[K3_ENGINE_LAYER_FIELDS], pack = 0, shards;
	unsigned order[K3_ENGINE_LAYER_FIELDS], n_rd;

	for (uint32_t j = sp->first; j < sp->first + sp->count; j++)
		pack = align_up(pack, K3_STORE_PACK_ARRAY_ALIGN) + in->extents[j].length;
	shards = k3_store_plan_extents(in->extents + sp->first, sp->count, order, rd, &n_rd, off);
	pack = align_up(pack, K3_STORE_ALIGN);
	return pack > shards ? pack : shards;
}

int k3_store_spine_sizes(const struct k3_model *m, struct k3_store_spine_sizes *out,
			 struct k3_err *err)
{
	struct k3_store_spine_input in;
	int rc = k3_store_spine_input_new(m, &in, err);

	memset(out, 0, sizeof(*out));
	if (rc)
		return rc;
	out->n_layers = k3_model_plan(m)->n_layers;
	for (uint32_t l = 0; l < out->n_layers; l++)
		out->layer[l] = span_bytes(&in, l);
	out->embed = span_bytes(&in, out->n_layers);
	out->head = span_bytes(&in, out->n_layers + 1);
	out->embed_row = in.extents[in.spans[out->n_layers].first].length /
			 k3_model_config(m)->vocab_size;
	for (size_t j = 0; j < in.in.n_arrays; j++)
		out->spine_bytes += in.extents[j].length;
	k3_store_spine_input_release(&in);
	return 0;
}

static uint32_t ring_size(uint32_t asked, bool layers_stream, bool head_streams)
{
	if (layers_stream)
		return asked ? asked : K3_STORE_SPINE_RING_MIN;
	return head_streams ? (asked ? asked : 1) : 0;
}

uint64_t k3_store_spine_memory(const struct k3_store_spine_sizes *z,
			       const struct k3_store_spine_config *cfg)
{
	uint64_t resident = 0, widest = 0;
	uint32_t R = cfg->resident_layers < z->n_layers ? cfg->resident_layers : z->n_layers;

	for (uint32_t l = 0; l < z->n_layers; l++) {
		if (l < R)
			resident += z->layer[l];
		else if (z->layer[l] > widest)
			widest = z->layer[l];
	}
	if (cfg->head_resident)
		resident += z->head;
	else if (z->head > widest)
		widest = z->head;
	uint32_t rows = cfg->max_rows ? cfg->max_rows : DEFAULT_ROWS;
	if (cfg->embed_resident)
		resident += z->embed;
	else
		resident += rows * align_up(z->embed_row + K3_STORE_ALIGN - 1, K3_STORE_ALIGN);
	return resident + ring_size(cfg->ring_arenas, R < z->n_layers, !cfg->head_resident) * widest;
}
/* ---- creation ---- */

/* Unit index of spine-input span i: layers keep their index, the
 * embedding (span n_layers) is unit n_layers + 1, the head (span
 * n_layers + 1) unit n_layers. */
static uint32_t unit_of_span(uint32_t n_layers, size_t i)
{
	return i < n_layers ? (uint32_t)i : i == n_layers ? n_layers + 1 : n_layers;
}

/* The pack's messages name `k3ctl pack --model DIR`, which writes the
 * BF16 spine's pack; for the int8 spine each such command gets the option
 * that writes its pack. Copies msg into buf (truncating). */
static void copy_rejection(char *buf, size_t size, const char *msg, bool int8)
{
	static const char cmd[] = "k3ctl pack --model DIR";
	size_t o = 0;

	while (*msg && o + 1 < size) {
		if (int8 && strncmp(msg, cmd, sizeof(cmd) - 1) == 0) {
			int n = snprintf(buf + o, size - o, "%s --spine int8", cmd);
			o = n < 0 || (size_t)n >= size - o ? size - 1 : o + (size_t)n;
			msg += sizeof(cmd) - 1;
		} else
			buf[o++] = *msg++;
	}
	buf[o] = '\0';
}

/* The pack at path, if it is valid for m (store_pack.h's start-up check)
 * and holds exactly in's tensors; NULL otherwise, the reason in rep. */
static struct k3_store_pack *open_pack(const struct k3_model *m, const char *path,
				       const struct k3_store_spine_input *in,
				       struct k3_store_spine_report *rep)
{
	struct k3_store_pack_ident *id = NULL;
	struct k3_store_pack *pack = NULL;
	struct k3_err perr = { 0 };
	size_t n_id = 0;
	/* the int8 spine's pack names the overlay's shards after the model's */
	int rc = k3_store_spine_idents(m, &id, &n_id, &perr);

	if (rc == 0)
		rc = k3_store_pack_open(path, id, n_id, 0, &pack, &perr);
	free(id);
	if (rc == -ENOENT)
		return NULL;
	if (rc == 0 && k3_store_pack_kind(pack) != K3_STORE_PACK_SPINE)
		rc = k3_err_set(&perr, -ESTALE, "'%s' is not a spine pack", path);
	const struct k3_store_pack_layout *lo = rc == 0 ? k3_store_pack_layout(pack) : NULL;
	if (rc == 0 && (lo->n_spans != in->in.n_spans || lo->n_arrays != in->in.n_arrays))
		rc = k3_err_set(&perr, -ESTALE, "'%s' holds %zu spans and %zu tensors, the model's"
				" spine %zu and %zu (run k3ctl pack --model DIR)", path, lo->n_spans,
				lo->n_arrays, in->in.n_spans, in->in.n_arrays);
	for (size_t i = 0; rc == 0 && i < lo->n_spans; i++) {
		const struct k3_store_pack_span *a = &lo->spans[i], *b = &in->spans[i];
		if (a->kind != b->kind || a->layer != b->layer || a->count != b->count)
			rc = k3_err_set(&perr, -ESTALE, "'%s': span %zu does not match the model's"
					" spine (run k3ctl pack --model DIR)", path, i);
	}
	for (size_t j = 0; rc == 0 && j < lo->n_arrays; j++) {
		const struct k3_store_pack_tensor *a = &lo->tensors[j], *b = &in->tensors[j];
		if (strcmp(a->name, b->name) || a->dtype != b->dtype || a->ndim != b->ndim ||
		    memcmp(a->shape, b->shape, sizeof(a->shape)) ||
		    lo->arrays[j].length != in->extents[j].length)
			rc = k3_err_set(&perr, -ESTALE, "'%s': tensor '%s' does not match the"
					" model's '%s' (name, dtype, shape or length; run k3ctl pack"
					" --model DIR)", path, a->name, b->name);
	}
	if (rc == 0)
		return pack;
	k3_store_pack_free(pack);
	rep->pack_rejected = true;
	struct k3_model_int8_info i8;
	k3_model_int8_info_get(m, &i8);
	copy_rejection(rep->rejection, sizeof(rep->rejection), perr.msg, i8.on);
	return NULL;
}

/* Every read of u must lie inside a file the loader opened: the model's
 * plan and the pack's directory were checked against their own files, this
 * checks that those are the files in sp->src (a tensor whose shard number
 * the source lacks would otherwise be read through no descriptor). */
static int check_reads(const struct k3_store_spine *sp, const struct spine_unit *u,
		       struct k3_err *err)
{
	for (unsigned r = 0; r < u->n_rd; r++) {
		const struct k3_store_read *rd = &u->rd[r];
		struct stat st;
		char name[32];

		if (k3_store_source_file_stat(sp->src, rd->file, &st) == 0 &&
		    rd->offset <= (uint64_t)st.st_size &&
		    rd->length <= (uint64_t)st.st_size - rd->offset)
			continue;
		return k3_err_set(err, -EINVAL, "spine loader: %s needs %" PRIu64 " bytes at %"
				  PRIu64 " of file %" PRIu32 ", which the %zu files it opened do"
				  " not hold", k3_store_spine_unit_name(sp, u->pos, name, sizeof(name)), rd->length,
				  rd->offset, rd->file, k3_store_source_file_count(sp->src));
	}
	return 0;
}

/* Plans every unit from the pack (one read per span) or the shards (the
 * span's tensors' extents, k3_store_plan_extents). */
static int plan_units(struct k3_store_spine *sp, const struct k3_store_spine_input *in,
		      const struct k3_store_pack *pack, struct k3_err *err)
{
	const struct k3_store_pack_layout *lo = pack ? k3_store_pack_layout(pack) : NULL;
	uint32_t n = sp->n_layers;

	for (size_t i = 0; i < in->in.n_spans; i++) {
		const struct k3_store_pack_span *s = &in->spans[i];
		struct spine_unit *u = &sp->units[unit_of_span(n, i)];
		unsigned order[K3_ENGINE_LAYER_FIELDS];
		uint64_t off[K3_ENGINE_LAYER_FIELDS];

		u->pos = unit_of_span(n, i);
		u->arena = -1;
		u->n_fields = u->pos < n ? K3_ENGINE_LAYER_FIELDS
			    : u->pos == n ? K3_ENGINE_HEAD_FIELDS : 1;
		if (s->count > K3_ENGINE_LAYER_FIELDS)
			return k3_err_set(err, -EINVAL, "spine span %zu has %" PRIu32 " tensors", i,
					  s->count);
		u->rd = calloc(s->count, sizeof(*u->rd));
		if (!u->rd)
			return k3_err_set(err, -ENOMEM, "out of memory");
		if (lo) {
			const struct k3_store_pack_span *ps = &lo->spans[i];
			u->rd[0] = (struct k3_store_read){ .file = 0, .offset = ps->offset,
							   .length = ps->length };
			u->n_rd = 1;
			u->bytes = align_up(ps->length, K3_STORE_ALIGN);
			for (uint32_t k = 0; k < s->count; k++)
				off[k] = lo->arrays[ps->first + k].offset;
		} else {
			u->bytes = k3_store_plan_extents(in->extents + s->first, s->count, order, u->rd,
							 &u->n_rd, off);
		}
		for (uint32_t k = 0; k < s->count; k++) {
			uint32_t j = s->first + k, f = in->field[j];
			const struct k3_store_pack_tensor *pt = lo ? &lo->tensors[j] : &in->tensors[j];
			u->tmpl[f] = (struct k3_prov_tensor){ .dtype = pt->dtype, .ndim = pt->ndim };
			memcpy(u->tmpl[f].shape, pt->shape, sizeof(pt->shape));
			u->off[f] = off[k];
		}
		int rc = check_reads(sp, u, err);
		if (rc)
			return rc;
		for (unsigned r = 0; r < u->n_rd; r++)
			u->n_jobs += k3_store_spine_read_jobs(&u->rd[r], sp->cfg.chunk_bytes);
		if (u->pos == n + 1) {   /* the embedding's rows */
			const struct k3_tensor *t = in->tensor[s->first];
			sp->row_bytes = t->nbytes / sp->vocab;
			sp->embed_file = lo ? 0 : t->shard;
			sp->embed_offset = lo ? lo->spans[i].offset + lo->arrays[lo->spans[i].first].offset
					      : t->file_offset;
		}
	}
	return 0;
}

static int alloc_arena(struct k3_store_spine *sp, struct spine_arena *a, uint64_t bytes,
		       uint32_t jobs, struct k3_err *err)
{
	void *mem = NULL;

	a->sp = sp;
	a->unit = -1;
	a->bytes = bytes;
	a->cap_jobs = jobs;
	/* Layers are megabytes that the products stream through: on huge
	 * pages (where the system grants them) the TLB misses of 4 KiB pages
	 * go away; a failed madvise only loses that. */
	bool huge = bytes >= HUGE_PAGE;
	if (posix_memalign(&mem, huge ? HUGE_PAGE : K3_STORE_ALIGN, bytes ? bytes : K3_STORE_ALIGN))
		mem = NULL;
	if (mem && huge)
		(void)madvise(mem, bytes, MADV_HUGEPAGE);
	a->mem = mem;
	a->jobs = calloc(jobs ? jobs : 1, sizeof(*a->jobs));
	a->jrd = calloc(jobs ? jobs : 1, sizeof(*a->jrd));
	if (!a->mem || !a->jobs || !a->jrd)
		return k3_err_set(err, -ENOMEM, "out of memory for a spine buffer of %" PRIu64
				  " bytes", bytes);
	return 0;
}

/* The ring (sized for the largest streamed unit), one buffer per resident
 * unit, the row scratch. */
static int alloc_memory(struct k3_store_spine *sp, struct k3_err *err)
{
	uint32_t n = sp->n_layers, n_res = 0, jobs = 0;
	bool layers_stream = false;

	for (uint32_t u = 0; u < n + 2; u++) {
		struct spine_unit *un = &sp->units[u];
		un->resident = u < n ? u < sp->cfg.resident_layers
			     : u == n ? sp->cfg.head_resident : sp->cfg.embed_resident;
		un->streamed = u <= n && !un->resident;
		n_res += un->resident;
		layers_stream |= u < n && un->streamed;
		if (un->streamed) {
			if (un->bytes > sp->arena_bytes)
				sp->arena_bytes = un->bytes;
			if (un->n_jobs > jobs)
				jobs = un->n_jobs;
		}
	}
	sp->n_ring = ring_size(sp->cfg.ring_arenas, layers_stream, sp->units[n].streamed);
	if (layers_stream && sp->n_ring < K3_STORE_SPINE_RING_MIN)
		return k3_err_set(err, -EINVAL, "a ring of %" PRIu32 " arenas: streaming layers"
				  " needs at least %d", sp->n_ring, K3_STORE_SPINE_RING_MIN);
	sp->n_arenas = sp->n_ring + n_res;
	sp->arenas = calloc(sp->n_arenas ? sp->n_arenas : 1, sizeof(*sp->arenas));
	if (!sp->arenas)
		return k3_err_set(err, -ENOMEM, "out of memory");
	for (uint32_t i = 0; i < sp->n_ring; i++) {
		int rc = alloc_arena(sp, &sp->arenas[i], sp->arena_bytes, jobs, err);
		if (rc)
			return rc;
	}
	uint32_t k = sp->n_ring;
	for (uint32_t u = 0; u < n + 2; u++) {
		struct spine_unit *un = &sp->units[u];
		if (!un->resident)
			continue;
		int rc = alloc_arena(sp, &sp->arenas[k], un->bytes, un->n_jobs, err);
		if (rc)
			return rc;
		sp->resident_bytes += un->bytes;
		un->arena = (int)k++;
	}
	if (!sp->units[n + 1].resident) {
		void *mem = NULL;
		sp->row_stride = align_up(sp->row_bytes + K3_STORE_ALIGN - 1, K3_STORE_ALIGN);
		if (posix_memalign(&mem, K3_STORE_ALIGN, sp->cfg.max_rows * sp->row_stride))
			mem = NULL;
		sp->row_mem = mem;
		sp->row_jobs = calloc(sp->cfg.max_rows, sizeof(*sp->row_jobs));
		sp->row_rd = calloc(sp->cfg.max_rows, sizeof(*sp->row_rd));
		if (!sp->row_mem || !sp->row_jobs || !sp->row_rd)
			return k3_err_set(err, -ENOMEM, "out of memory for the embedding rows");
	}
	return 0;
}

/* Reads every resident unit (all at once, through the pool) and waits. */
static int load_resident(struct k3_store_spine *sp, struct k3_err *err)
{
	int rc = 0;

	k3_store_io_lock(sp->io);
	for (uint32_t i = sp->n_ring; i < sp->n_arenas; i++) {
		struct spine_arena *a = &sp->arenas[i];
		for (uint32_t u = 0; u < sp->n_layers + 2; u++)
			if (sp->units[u].arena == (int)i)
				k3_store_spine_start_load(sp, a, u);
	}
	for (uint32_t i = sp->n_ring; i < sp->n_arenas; i++) {
		struct spine_arena *a = &sp->arenas[i];
		k3_store_spine_wait_arena(sp, a);
		if (a->state == A_FAILED && rc == 0)
			rc = k3_store_spine_read_error(sp, sp->units[a->unit].pos, a->rc, err);
		a->in_use = a->used = true;
	}
	/* Creation is no request's work: its reads go to startup_bytes. */
	sp->startup_bytes = sp->st.bytes_read;
	memset(&sp->st, 0, sizeof(sp->st));
	k3_store_io_unlock(sp->io);
	return rc;
}

int k3_store_spine_new(const struct k3_model *m, const char *pack_path,
		       const struct k3_store_spine_config *cfg, struct k3_store_spine **out,
		       struct k3_store_spine_report *rep, struct k3_err *err)
{
	struct k3_store_spine_report r0;
	struct k3_store_spine_input in;
	struct k3_store_pack *pack = NULL;
	struct k3_store_spine *sp;
	uint32_t file;
	int rc;

	*out = NULL;
	if (!rep)
		rep = &r0;
	memset(rep, 0, sizeof(*rep));
	uint32_t n = k3_model_plan(m)->n_layers;
	if (cfg->resident_layers > n || cfg->chunk_bytes % K3_STORE_ALIGN ||
	    cfg->max_rows > MAX_ROWS || cfg->io_threads > K3_STORE_IO_MAX_THREADS)
		return k3_err_set(err, -EINVAL, "spine loader: %" PRIu32 " resident layers of %"
				  PRIu32 ", chunk %" PRIu64 " bytes (a multiple of %d), %" PRIu32
				  " rows (at most %d), %u readers (at most %d)",
				  cfg->resident_layers, n, cfg->chunk_bytes, K3_STORE_ALIGN,
				  cfg->max_rows, MAX_ROWS, cfg->io_threads, K3_STORE_IO_MAX_THREADS);
	rc = k3_store_spine_input_new(m, &in, err);
	if (rc)
		return rc;
	sp = calloc(1, sizeof(*sp));
	if (!sp) {
		k3_store_spine_input_release(&in);
		return k3_err_set(err, -ENOMEM, "out of memory");
	}
	sp->model = m;
	sp->cfg = *cfg;
	if (!sp->cfg.chunk_bytes)
		sp->cfg.chunk_bytes = K3_STORE_SPINE_CHUNK_BYTES;
	if (!sp->cfg.max_rows)
		sp->cfg.max_rows = DEFAULT_ROWS;
	sp->n_layers = n;
	sp->vocab = k3_model_config(m)->vocab_size;
	sp->cursor = n;   /* as after a pass: layer 0 is next */
	sp->units = calloc(n + 2, sizeof(*sp->units));
	sp->src = k3_store_source_new(cfg->direct);
	if (!sp->units || !sp->src) {
		rc = k3_err_set(err, -ENOMEM, "out of memory");
		goto fail;
	}
	if (pack_path)
		pack = open_pack(m, pack_path, &in, rep);
	rc = pack ? k3_store_source_add_file(sp->src, pack_path, &file, err)
		  : k3_store_source_add_spine(sp->src, m, err);
	if (rc)
		goto fail;
	sp->from_pack = rep->from_pack = pack != NULL;
	for (uint32_t f = 0; f < k3_store_source_file_count(sp->src); f++) {
		if (k3_store_source_file_direct(sp->src, f))
			rep->files_direct++;
		else
			rep->files_buffered++;
	}
	rc = plan_units(sp, &in, pack, err);
	if (rc == 0)
		rc = alloc_memory(sp, err);
	if (rc)
		goto fail;
	if (cfg->io) {
		sp->io = cfg->io;
	} else {
		struct k3_store_io_config io_cfg = {
			.threads = cfg->io_threads ? cfg->io_threads : K3_STORE_DEFAULT_IO_THREADS };
		rc = k3_store_io_new(&io_cfg, &sp->io, err);
		if (rc)
			goto fail;
		sp->own_io = true;
	}
	rc = load_resident(sp, err);
	if (rc)
		goto fail;
	k3_store_pack_free(pack);
	k3_store_spine_input_release(&in);
	*out = sp;
	return 0;
fail:
	k3_store_pack_free(pack);
	k3_store_spine_input_release(&in);
	k3_store_spine_free(sp);
	return rc;
}

void k3_store_spine_free(struct k3_store_spine *sp)
{
	if (!sp)
		return;
	if (sp->io) {
		k3_store_io_lock(sp->io);
		for (uint32_t i = 0; i < sp->n_arenas; i++)
			k3_store_spine_abandon(sp, &sp->arenas[i]);
		for (uint32_t i = 0; i < sp->n_arenas; i++)
			while (sp->arenas[i].state == A_LOADING)
				k3_store_io_wait(sp->io);
		while (sp->rows_pending)
			k3_store_io_wait(sp->io);
		k3_store_io_unlock(sp->io);
		if (sp->own_io)
			k3_store_io_free(sp->io);
	}
	for (uint32_t i = 0; sp->arenas && i < sp->n_arenas; i++) {
		free(sp->arenas[i].mem);
		free(sp->arenas[i].jobs);
		free(sp->arenas[i].jrd);
	}
	free(sp->arenas);
	for (uint32_t u = 0; sp->units && u < sp->n_layers + 2; u++)
		free(sp->units[u].rd);
	free(sp->units);
	free(sp->row_mem);
	free(sp->row_jobs);
	free(sp->row_rd);
	k3_store_source_free(sp->src);
	free(sp);
}

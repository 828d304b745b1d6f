/* store_model.c - expert sources and packs from an opened model (see store_model.h). */
#include "store/store_model.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Identities of shard numbers 0..n-1 of m (k3_model_shard_path). */
static int idents_of(const struct k3_model *m, uint32_t ns, struct k3_store_pack_ident **out,
		     size_t *n, struct k3_err *err)
{
	struct k3_store_pack_ident *id = calloc(ns ? ns : 1, sizeof(*id));
	int rc;

	*out = NULL;
	*n = 0;
	if (!id)
		return k3_err_set(err, -ENOMEM, "out of memory");
	for (uint32_t i = 0; i < ns; i++) {
		const char *path = k3_model_shard_path(m, i);
		const char *slash = strrchr(path, '/');
		rc = k3_store_pack_ident(path, slash ? slash + 1 : path, 0, &id[i], err);
		if (rc) {
			free(id);
			return rc;
		}
	}
	*out = id;
	*n = ns;
	return 0;
}

int k3_store_model_idents(const struct k3_model *m, struct k3_store_pack_ident **out,
			  size_t *n, struct k3_err *err)
{
	return idents_of(m, k3_model_shard_count(m), out, n, err);
}

uint32_t k3_store_spine_file_count(const struct k3_model *m)
{
	struct k3_model_int8_info i8;

	k3_model_int8_info_get(m, &i8);
	return k3_model_shard_count(m) + (i8.on ? i8.shards : 0);
}

int k3_store_spine_idents(const struct k3_model *m, struct k3_store_pack_ident **out,
			  size_t *n, struct k3_err *err)
{
	return idents_of(m, k3_store_spine_file_count(m), out, n, err);
}

static int add_tensor(struct k3_store_extent *x, const struct k3_tensor *t, uint32_t base)
{
	if (!t)
		return -ENOTSUP;
	x->file = base + t->shard;
	x->offset = t->file_offset;
	x->length = t->nbytes;
	return 0;
}

/* Adds the experts of one layer (those keep[e] marks; NULL: every one);
 * shard i is file base + i of src. */
static int add_layer(struct k3_store_source *src, const struct k3_layer_plan *lp,
		     uint32_t base, const uint8_t *keep, struct k3_err *err)
{
	for (uint32_t e = 0; e < lp->moe.n_experts; e++) {
		const struct k3_expert *x = &lp->moe.experts[e];
		struct k3_store_expert se = { .layer = lp->index, .expert = e };
		int rc;

		if (keep && !keep[e])
			continue;
		if (!x->w1.mxfp4 || !x->w2.mxfp4 || !x->w3.mxfp4 ||
		    add_tensor(&se.ext[K3_STORE_W1_PACKED], x->w1.packed, base) ||
		    add_tensor(&se.ext[K3_STORE_W1_SCALE], x->w1.scale, base) ||
		    add_tensor(&se.ext[K3_STORE_W2_PACKED], x->w2.packed, base) ||
		    add_tensor(&se.ext[K3_STORE_W2_SCALE], x->w2.scale, base) ||
		    add_tensor(&se.ext[K3_STORE_W3_PACKED], x->w3.packed, base) ||
		    add_tensor(&se.ext[K3_STORE_W3_SCALE], x->w3.scale, base))
			return k3_err_set(err, -ENOTSUP, "expert (%" PRIu32 ", %" PRIu32 ") is not"
					  " MXFP4; the store streams only MXFP4 experts",
					  lp->index, e);
		rc = k3_store_source_add_expert(src, &se, err);
		if (rc)
			return rc;
	}
	return 0;
}

/* Adds shard numbers 0..n-1 of m to src. */
static int add_files(struct k3_store_source *src, const struct k3_model *m, uint32_t n,
		     struct k3_err *err)
{
	for (uint32_t i = 0; i < n; i++) {
		uint32_t f;
		int rc = k3_store_source_add_file(src, k3_model_shard_path(m, i), &f, err);
		if (rc)
			return rc;
	}
	return 0;
}

int k3_store_source_add_shards(struct k3_store_source *src, const struct k3_model *m,
			       struct k3_err *err)
{
	return add_files(src, m, k3_model_shard_count(m), err);
}

int k3_store_source_add_spine(struct k3_store_source *src, const struct k3_model *m,
			      struct k3_err *err)
{
	return add_files(src, m, k3_store_spine_file_count(m), err);
}

int k3_store_source_add_model(struct k3_store_source *src, const struct k3_model *m,
			      uint32_t layer, struct k3_err *err)
{
	return k3_store_source_add_model_some(src, m, layer, NULL, err);
}

int k3_store_source_add_model_some(struct k3_store_source *src, const struct k3_model *m,
				   uint32_t layer, const uint8_t *keep, struct k3_err *err)
{
	const struct k3_model_plan *plan = k3_model_plan(m);
	int rc;

	if (k3_store_source_file_count(src) != 0)
		return k3_err_set(err, -EINVAL, "the expert source must be empty");
	rc = k3_store_source_add_shards(src, m, err);
	for (uint32_t l = 0; rc == 0 && l < plan->n_layers; l++)
		if (plan->layers[l].is_moe && (layer == UINT32_MAX || layer == l))
			rc = add_layer(src, &plan->layers[l], 0, layer == l ? keep : NULL, err);
	return rc;
}

int k3_store_pack_path(char *buf, size_t size, const char *pack_dir, uint32_t layer)
{
	int n = snprintf(buf, size, "%s/experts-L%03" PRIu32 ".k3pack", pack_dir, layer);
	return n < 0 || (size_t)n >= size ? -ENAMETOOLONG : 0;
}

/* A pack must hold exactly this layer's experts with the model's sizes;
 * a copy on another drive (subset) any of them, in order. */
static int pack_fits_layer(const struct k3_store_pack *pack, const struct k3_layer_plan *lp,
			   const char *path, bool subset, struct k3_err *err)
{
	uint64_t len[K3_STORE_ARRAYS];
	uint32_t layer, expert;
	size_t n = k3_store_pack_expert_count(pack);

	if (subset ? n == 0 || n > lp->moe.n_experts : n != lp->moe.n_experts)
		return k3_err_set(err, -ESTALE, "'%s' holds %zu experts, layer %" PRIu32 " has %"
				  PRIu32, path, n, lp->index, lp->moe.n_experts);
	for (uint32_t i = 0; i < n; i++) {
		k3_store_pack_entry(pack, i, &layer, &expert, len);
		uint32_t e = subset ? expert : i;
		if (e >= lp->moe.n_experts)
			return k3_err_set(err, -ESTALE, "'%s' entry %" PRIu32 " is expert %" PRIu32
					  ", which layer %" PRIu32 " does not have", path, i, expert,
					  lp->index);
		const struct k3_expert *x = &lp->moe.experts[e];
		if (layer != lp->index || expert != e || !x->w1.mxfp4 || !x->w2.mxfp4 ||
		    !x->w3.mxfp4 ||
		    len[K3_STORE_W1_PACKED] != x->w1.packed->nbytes ||
		    len[K3_STORE_W1_SCALE] != x->w1.scale->nbytes ||
		    len[K3_STORE_W2_PACKED] != x->w2.packed->nbytes ||
		    len[K3_STORE_W2_SCALE] != x->w2.scale->nbytes ||
		    len[K3_STORE_W3_PACKED] != x->w3.packed->nbytes ||
		    len[K3_STORE_W3_SCALE] != x->w3.scale->nbytes)
			return k3_err_set(err, -ESTALE, "'%s' entry %" PRIu32 " does not match expert"
					  " (%" PRIu32 ", %" PRIu32 ") of the model", path, i,
					  lp->index, e);
	}
	return 0;
}

/* The packs must match the files the shards are read through (files
 * 0..n-1 of src): if a path now names another file than the one opened,
 * the stat of the descriptor is what counts. */
static int read_idents(const struct k3_model *m, const struct k3_store_source *src,
		       struct k3_store_pack_ident *id, size_t n, struct k3_err *err)
{
	for (size_t i = 0; i < n; i++) {
		struct stat st;
		int rc = k3_store_source_file_stat(src, (uint32_t)i, &st);
		if (rc)
			return k3_err_set(err, rc, "cannot stat '%s': %s",
					  k3_model_shard_path(m, (uint32_t)i), strerror(-rc));
		k3_store_pack_ident_stat(&id[i], &st);
	}
	return 0;
}

int k3_store_source_open_model(const struct k3_model *m, const char *pack_dir,
			       enum k3_store_direct direct, struct k3_store_source **out,
			       struct k3_store_open_report *rep, struct k3_err *err)
{
	const struct k3_model_plan *plan = k3_model_plan(m);
	struct k3_store_open_report r0;
	struct k3_store_pack_ident *id = NULL;
	struct k3_store_source *src;
	size_t n_id = 0;
	char path[4096];
	int rc;

	*out = NULL;
	if (!rep)
		rep = &r0;
	memset(rep, 0, sizeof(*rep));
	src = k3_store_source_new(direct);
	if (!src)
		return k3_err_set(err, -ENOMEM, "out of memory");
	rc = k3_store_source_add_shards(src, m, err);
	if (rc == 0 && pack_dir)
		rc = k3_store_model_idents(m, &id, &n_id, err);
	if (rc == 0 && pack_dir)
		rc = read_idents(m, src, id, n_id, err);
	for (uint32_t l = 0; rc == 0 && l < plan->n_layers; l++) {
		struct k3_store_pack *pack = NULL;
		struct k3_err perr = { 0 };
		int prc = -ENOENT;

		if (!plan->layers[l].is_moe)
			continue;
		if (pack_dir) {
			rc = k3_store_pack_path(path, sizeof(path), pack_dir, l);
			if (rc) {
				k3_err_set(err, rc, "pack directory '%s' is too long", pack_dir);
				break;
			}
			prc = k3_store_pack_open(path, id, n_id, 0, &pack, &perr);
			if (prc == 0 && (prc = pack_fits_layer(pack, &plan->layers[l], path, false,
							      &perr))) {
				k3_store_pack_free(pack);
				pack = NULL;
			}
		}
		if (prc == 0) {
			rc = k3_store_pack_add_to_source(pack, path, src, err);
			rep->layers_packed++;
		} else {
			if (prc != -ENOENT && rep->packs_rejected++ == 0)
				snprintf(rep->first_rejection, sizeof(rep->first_rejection), "%s", perr.msg);
			rc = add_layer(src, &plan->layers[l], 0, NULL, err);
			rep->layers_shards++;
		}
		k3_store_pack_free(pack);
	}
	free(id);
	if (rc) {
		k3_store_source_free(src);
		return rc;
	}
	*out = src;
	return 0;
}

/* Copies of pack's experts on `drive` (the pack file added on it). */
static int add_copies(struct k3_store_source *src, const struct k3_store_pack *pack,
		      const char *path, uint32_t drive, struct k3_err *err)
{
	uint32_t file;
	int rc = k3_store_source_add_file_on(src, path, drive, &file, err);

	for (size_t i = 0; rc == 0 && i < k3_store_pack_expert_count(pack); i++) {
		const struct k3_store_pack_span *pe = k3_store_pack_span(pack, i);
		struct k3_store_expert e = { .layer = pe->layer, .expert = pe->expert };
		for (int a = 0; a < K3_STORE_ARRAYS; a++) {
			const struct k3_store_pack_array *x = k3_store_pack_array(pack, pe->first +
										   (uint32_t)a);
			e.ext[a] = (struct k3_store_extent){ .file = file, .offset = pe->offset + x->offset,
							     .length = x->length };
		}
		rc = k3_store_source_add_copy(src, &e, err);
	}
	return rc;
}

int k3_store_source_add_home(struct k3_store_source *src, const struct k3_model *m,
			     const char *dir, uint32_t drive, struct k3_store_home_report *rep,
			     struct k3_err *err)
{
	const struct k3_model_plan *plan = k3_model_plan(m);
	struct k3_store_pack_ident *id = NULL;
	size_t n_id = 0;
	char path[4096];
	int rc;

	memset(rep, 0, sizeof(*rep));
	if (drive == 0 || drive >= K3_STORE_MAX_DRIVES)
		return k3_err_set(err, -EINVAL, "'%s': drive %" PRIu32 " (1..%d)", dir, drive,
				  K3_STORE_MAX_DRIVES - 1);
	rc = k3_store_model_idents(m, &id, &n_id, err);
	if (rc == 0)
		rc = read_idents(m, src, id, n_id, err);
	for (uint32_t l = 0; rc == 0 && l < plan->n_layers; l++) {
		struct k3_store_pack *pack = NULL;
		struct k3_err perr = { 0 };
		int prc;

		if (!plan->layers[l].is_moe)
			continue;
		if ((rc = k3_store_pack_path(path, sizeof(path), dir, l)) != 0) {
			k3_err_set(err, rc, "'%s' is too long", dir);
			break;
		}
		prc = k3_store_pack_open(path, id, n_id, 0, &pack, &perr);
		if (prc == 0)
			prc = pack_fits_layer(pack, &plan->layers[l], path, true, &perr);
		if (prc == 0) {
			rc = add_copies(src, pack, path, drive, err);
			rep->layers++;
			rep->experts += (uint32_t)k3_store_pack_expert_count(pack);
		} else if (prc != -ENOENT && rep->packs_rejected++ == 0) {
			snprintf(rep->first_rejection, sizeof(rep->first_rejection), "%s", perr.msg);
		}
		k3_store_pack_free(pack);
	}
	free(id);
	return rc;
}

/* ---- the spine as a pack input ---- */

int k3_store_spine_pack_path(char *buf, size_t size, const char *pack_dir,
			     const struct k3_model *m)
{
	struct k3_model_int8_info i8;

	k3_model_int8_info_get(m, &i8);
	int n = snprintf(buf, size, "%s/%s", pack_dir,
			 i8.on ? K3_STORE_SPINE_INT8_PACK_NAME : K3_STORE_SPINE_PACK_NAME);
	return n < 0 || (size_t)n >= size ? -ENAMETOOLONG : 0;
}

void k3_store_spine_input_release(struct k3_store_spine_input *in)
{
	free(in->spans);
	free(in->extents);
	free(in->tensors);
	free(in->field);
	free(in->tensor);
	memset(in, 0, sizeof(*in));
}

/* Appends tensor t (provider field `field`) as the next array. */
static int spine_add(struct k3_store_spine_input *o, const struct k3_tensor *t, unsigned field,
		     struct k3_err *err)
{
	size_t j = o->in.n_arrays;
	struct k3_prov_tensor pt = k3_engine_prov_tensor(t, NULL);
	struct k3_store_pack_tensor *pk = &o->tensors[j];

	if (pt.dtype == K3_PROV_DTYPE_NONE)
		return k3_err_set(err, -EINVAL, "tensor '%s' has a dtype or rank the provider ABI"
				  " cannot carry", t->name);
	if (strlen(t->name) > K3_STORE_PACK_TENSOR_NAME_MAX)
		return k3_err_set(err, -EINVAL, "tensor name '%s' is longer than %d bytes", t->name,
				  K3_STORE_PACK_TENSOR_NAME_MAX);
	strcpy(pk->name, t->name);
	pk->dtype = pt.dtype;
	pk->ndim = pt.ndim;
	memcpy(pk->shape, pt.shape, sizeof(pk->shape));
	o->extents[j] = (struct k3_store_extent){ .file = t->shard, .offset = t->file_offset,
						  .length = t->nbytes };
	o->field[j] = (uint8_t)field;
	o->tensor[j] = t;
	o->in.n_arrays++;
	return 0;
}

/* Closes span `kind`/`layer` over the arrays added since `first`. */
static void spine_span(struct k3_store_spine_input *o, uint32_t kind, uint32_t layer, size_t first)
{
	o->spans[o->in.n_spans++] = (struct k3_store_pack_span){
		.kind = kind, .layer = layer, .first = (uint32_t)first,
		.count = (uint32_t)(o->in.n_arrays - first) };
}

int k3_store_spine_input_new(const struct k3_model *m, struct k3_store_spine_input *o,
			     struct k3_err *err)
{
	const struct k3_model_plan *plan = k3_model_plan(m);
	size_t cap = (size_t)plan->n_layers * K3_ENGINE_LAYER_FIELDS + 1 + K3_ENGINE_HEAD_FIELDS;
	const struct k3_tensor *f[K3_ENGINE_LAYER_FIELDS];
	int rc = 0;

	memset(o, 0, sizeof(*o));
	o->spans = calloc(plan->n_layers + 2, sizeof(*o->spans));
	o->extents = calloc(cap, sizeof(*o->extents));
	o->tensors = calloc(cap, sizeof(*o->tensors));
	o->field = calloc(cap, sizeof(*o->field));
	o->tensor = calloc(cap, sizeof(*o->tensor));
	if (!o->spans || !o->extents || !o->tensors || !o->field || !o->tensor) {
		k3_store_spine_input_release(o);
		return k3_err_set(err, -ENOMEM, "out of memory");
	}
	for (uint32_t l = 0; rc == 0 && l < plan->n_layers; l++) {
		size_t first = o->in.n_arrays;
		k3_engine_layer_tensors(&plan->layers[l], f);
		for (unsigned i = 0; rc == 0 && i < K3_ENGINE_LAYER_FIELDS; i++)
			if (f[i])
				rc = spine_add(o, f[i], i, err);
		spine_span(o, K3_STORE_SPAN_LAYER, l, first);
	}
	if (rc == 0) {
		size_t first = o->in.n_arrays;
		rc = spine_add(o, plan->embed_tokens, 0, err);
		spine_span(o, K3_STORE_SPAN_EMBED, 0, first);
	}
	if (rc == 0) {
		size_t first = o->in.n_arrays;
		k3_engine_head_tensors(plan, f);
		for (unsigned i = 0; rc == 0 && i < K3_ENGINE_HEAD_FIELDS; i++)
			if (f[i])
				rc = spine_add(o, f[i], i, err);
		spine_span(o, K3_STORE_SPAN_HEAD, 0, first);
	}
	if (rc) {
		k3_store_spine_input_release(o);
		return rc;
	}
	o->in.kind = K3_STORE_PACK_SPINE;
	o->in.spans = o->spans;
	o->in.extents = o->extents;
	o->in.tensors = o->tensors;
	return 0;
}

int k3_store_spine_pack_write(const struct k3_model *m, const char *path,
			      const struct k3_store_pack_ident *idents, size_t n_idents,
			      unsigned flags, struct k3_store_pack_result *res,
			      struct k3_err *err)
{
	struct k3_store_source *src = k3_store_source_new(K3_STORE_DIRECT_AUTO);
	struct k3_store_spine_input in;
	int rc;

	if (!src)
		return k3_err_set(err, -ENOMEM, "out of memory");
	rc = k3_store_spine_input_new(m, &in, err);
	if (rc == 0 && (rc = k3_store_source_add_spine(src, m, err)) != 0)
		k3_store_spine_input_release(&in);
	if (rc == 0) {
		in.in.src = src;
		rc = k3_store_pack_write_input(path, &in.in, idents, n_idents, flags, res, err);
		k3_store_spine_input_release(&in);
	}
	k3_store_source_free(src);
	return rc;
}

/*
 * store_model.h - the store's bridge to an opened checkpoint (model.h):
 * build an expert source from the shards, write per-layer packs, and open
 * the source the engine reads from (valid packs where present, shards
 * elsewhere); the model's spine as the input of a spine pack (and of the
 * spine loader, store_spine.h). Packs live in one directory, one file per
 * MoE layer, <pack_dir>/experts-L<layer, 3 digits>.k3pack, and a spine
 * pack per spine, <pack_dir>/spine.k3pack (the checkpoint's BF16 spine)
 * and <pack_dir>/spine-int8.k3pack (the spine of a model opened with the
 * int8 spine overlay, model.h), each naming every file its bytes come
 * from as its sources: the checkpoint's shards, and for the int8 spine
 * the overlay's shards after them.
 */
#ifndef K3_STORE_MODEL_H
#define K3_STORE_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "engine/engine.h"
#include "model/model.h"
#include "store/store_pack.h"
#include "store/store_source.h"

/* Default pack directory inside the model directory. */
#define K3_STORE_PACK_SUBDIR "k3-packs"

/* Identities of every shard of m (index = shard index). *out is malloc'd
 * (free it); *n gets the shard count. Hashes each shard's header. */
int k3_store_model_idents(const struct k3_model *m, struct k3_store_pack_ident **out,
			  size_t *n, struct k3_err *err);

/* Adds every shard of m to src as files 0..shards-1 (src must be empty),
 * then the routed experts of layer `layer` (UINT32_MAX: every MoE layer)
 * with their six tensors as extents. Returns 0, -EINVAL when src is not
 * empty, -ENOTSUP for an expert that is not MXFP4 (the store streams only
 * the six-array MXFP4 layout), or what the source calls return. */
int k3_store_source_add_model(struct k3_store_source *src, const struct k3_model *m,
			      uint32_t layer, struct k3_err *err);

/* The same for one layer's experts that keep[e] marks (keep has the
 * layer's expert count entries; NULL: every one): the source of a pack
 * holding part of a layer (k3ctl pack --hot). */
int k3_store_source_add_model_some(struct k3_store_source *src, const struct k3_model *m,
				   uint32_t layer, const uint8_t *keep, struct k3_err *err);

/* Adds every shard of m to src as files first..first + shards - 1 (first =
 * src's file count before the call). Returns what the source calls return. */
int k3_store_source_add_shards(struct k3_store_source *src, const struct k3_model *m,
			       struct k3_err *err);

/* Files the spine of m lies in, by shard number (k3_model_shard_path):
 * the model's shards, then, when m was opened with the int8 spine overlay,
 * the overlay's shards (its I8 tensors' shard numbers follow the model's).
 * Returns their count. */
uint32_t k3_store_spine_file_count(const struct k3_model *m);

/* Identities of those files (index = shard number): what a spine pack of
 * m records as its sources; for the BF16 spine the same as
 * k3_store_model_idents. *out is malloc'd (free it). Hashes each file's
 * header. */
int k3_store_spine_idents(const struct k3_model *m, struct k3_store_pack_ident **out,
			  size_t *n, struct k3_err *err);

/* Adds those files to src as files first..first + count - 1 (src is
 * usually empty: then file i is shard number i, as the extents of
 * k3_store_spine_input_new name them). Returns what the source calls
 * return. */
int k3_store_source_add_spine(struct k3_store_source *src, const struct k3_model *m,
			      struct k3_err *err);

/* Writes <pack_dir>/experts-Lnnn.k3pack for the experts of `layer` of m. */
int k3_store_pack_path(char *buf, size_t size, const char *pack_dir, uint32_t layer);

/* File names of the two spine packs inside a pack directory. */
#define K3_STORE_SPINE_PACK_NAME "spine.k3pack"
#define K3_STORE_SPINE_INT8_PACK_NAME "spine-int8.k3pack"

/* The spine pack of the spine m runs: <pack_dir>/spine.k3pack, or
 * <pack_dir>/spine-int8.k3pack for a model opened with the int8 spine
 * overlay (the two never replace each other). Returns 0 or
 * -ENAMETOOLONG. */
int k3_store_spine_pack_path(char *buf, size_t size, const char *pack_dir,
			     const struct k3_model *m);

/*
 * The model's spine as a pack input (store_pack.h): span i < n_layers is
 * layer i (every tensor k3_engine_layer_tensors names for it, in field
 * order), then the embedding, then the head (k3_engine_head_tensors
 * order); each array's extent is its tensor in the shards, file i being
 * shard number i (an int8 overlay's I8 tensors lie in the overlay's
 * shards, numbered after the model's; in.src is left NULL: set it to a
 * source whose files are k3_store_source_add_spine's). field[j] is the provider
 * field array j fills (layer fields, or head fields for the head; 0 for
 * the embedding); tensor[j] the model's tensor. No file is read. The
 * arrays are owned by the struct.
 */
struct k3_store_spine_input {
	struct k3_store_pack_input in;
	struct k3_store_pack_span *spans;
	struct k3_store_extent *extents;
	struct k3_store_pack_tensor *tensors;
	uint8_t *field;
	const struct k3_tensor **tensor;
};

/* Fills *out for m. Returns 0, -EINVAL (a tensor the provider ABI cannot
 * carry or whose name is too long), -ENOMEM. */
int k3_store_spine_input_new(const struct k3_model *m, struct k3_store_spine_input *out,
			     struct k3_err *err);
void k3_store_spine_input_release(struct k3_store_spine_input *in);

/* Writes the spine pack `path` of m (k3ctl pack): the spine m runs, BF16
 * or (opened with the overlay) int8, read from the files
 * k3_store_source_add_spine names with O_DIRECT where it works. idents as
 * k3_store_spine_idents gives them. */
int k3_store_spine_pack_write(const struct k3_model *m, const char *path,
			      const struct k3_store_pack_ident *idents, size_t n_idents,
			      unsigned flags, struct k3_store_pack_result *res,
			      struct k3_err *err);

struct k3_store_open_report {
	uint32_t layers_packed;     /* MoE layers read from a valid pack */
	uint32_t layers_shards;     /* MoE layers read from the shards */
	uint32_t packs_rejected;    /* packs present but stale or malformed */
	char first_rejection[K3_ERR_MSG_MAX];   /* why the first one was refused */
};

/* What one home of copies (k3d --expert-dir) held. */
struct k3_store_home_report {
	uint32_t layers;            /* MoE layers with a valid pack there */
	uint32_t experts;           /* experts those packs hold */
	uint32_t packs_rejected;    /* packs present but stale, malformed or foreign */
	char first_rejection[K3_ERR_MSG_MAX];
};

/* Adds the packs in `dir` (another drive's copy of the packs, full or
 * partial: a pack may hold any of its layer's experts, k3ctl pack --layers
 * / --hot) as copies on drive `drive` (1 .. K3_STORE_MAX_DRIVES - 1) of
 * the experts src already has. src must come from
 * k3_store_source_open_model (files 0..shards-1 are m's shards): each pack
 * gets the start-up check of a pack in the model's pack directory against
 * those shards. A missing or rejected pack is not an error (rep says).
 * Returns 0, -EINVAL (bad drive), or an errno of opening or adding. */
int k3_store_source_add_home(struct k3_store_source *src, const struct k3_model *m,
			     const char *dir, uint32_t drive, struct k3_store_home_report *rep,
			     struct k3_err *err);

/* Opens the source the engine streams experts from: for each MoE layer the
 * pack in pack_dir when it is valid for these shards (its header and
 * directory, and every shard's identity: name, size, header SHA-256,
 * device, inode, mtime, ctime, against the descriptor the shard is read
 * through; a stat and a header hash per shard, no expert byte read; the
 * span bytes are compared with the shards by k3ctl pack, not here),
 * otherwise the shard tensors. pack_dir NULL: shards only. rep may be NULL.
 * Returns 0 or a negative errno; a rejected pack is not an error (it is
 * reported in rep and the shards are used). */
int k3_store_source_open_model(const struct k3_model *m, const char *pack_dir,
			       enum k3_store_direct direct, struct k3_store_source **out,
			       struct k3_store_open_report *rep, struct k3_err *err);

#endif

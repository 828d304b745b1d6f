/*
 * model_internal.h - struct k3_model and the helpers its .c files share.
 * Not part of the contract: other modules use model.h only.
 */
#ifndef K3_MODEL_INTERNAL_H
#define K3_MODEL_INTERNAL_H

#include "model/model.h"
#include "model/safetensors.h"

struct k3_shard {
	char *path;                 /* absolute, resolved */
	uint64_t size;              /* file bytes */
	const uint8_t *map;         /* whole file, PROT_READ */
	uint64_t data_start;        /* 8 + header length */
	struct k3_st_header hdr;
};

/* The int8 spine overlay attached to a model (model_int8.c). */
struct k3_model_int8 {
	char *dir;                  /* resolved absolute overlay directory */
	unsigned roles;             /* enum k3_model_int8_role bits in use */
	struct k3_shard *shards;    /* numbered after the model's: shard n_shards + i */
	uint32_t n_shards;
	struct k3_tensor *views;    /* one I8 tensor per replaced matrix role */
	size_t n_views;
	uint64_t int8_bytes, bf16_bytes;   /* of the replaced matrices */
};

struct k3_model {
	char *dir;                  /* resolved absolute directory */
	struct k3_model_config cfg;
	struct k3_shard *shards;
	uint32_t n_shards;
	struct k3_tensor *tensors;  /* sorted by name */
	size_t n_tensors;
	struct k3_model_plan plan;
	struct k3_layer_plan *layers;
	struct k3_expert *experts;  /* every MoE layer's experts, layer-major */
	struct k3_model_int8 int8;  /* all zero without the overlay */
};

/* Opens, checks and maps shard `name` of directory root into *sh (the
 * resolved file must lie inside root). */
int k3_model_shard_open(const char *root, const char *name, struct k3_shard *sh,
			struct k3_err *err);

/* Shard i: the model's (i < n_shards), then the overlay's; NULL past them. */
const struct k3_shard *k3_model_shard_at(const struct k3_model *m, uint32_t i);

/* Opens opts->int8_dir and points the plan's matrix roles of opts'
 * classes at its I8 tensors (model_int8.c). On failure the plan may be
 * partly switched: the caller frees the model. */
int k3_model_int8_attach(struct k3_model *m, const struct k3_model_open_opts *opts,
			 struct k3_err *err);
/* Unmaps and frees the overlay (NULL-safe inside; m->int8 left zero). */
void k3_model_int8_release(struct k3_model *m);

#endif

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
};

#endif

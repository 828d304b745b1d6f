/*
 * inspect.h - what a checkpoint costs: bytes by role (embedding, spine per
 * layer, experts per layer, per-expert span), totals, and what fits in a
 * RAM budget. The numbers `k3ctl inspect` prints before a download.
 */
#ifndef K3_MODEL_INSPECT_H
#define K3_MODEL_INSPECT_H

#include <stdint.h>

#include "model/model.h"

struct k3_layer_bytes {
	uint64_t attn;        /* self_attn.* */
	uint64_t norms;       /* layernorms and AttnRes norm/proj */
	uint64_t mlp;         /* dense MLP */
	uint64_t moe_spine;   /* router, bias, latent projections and norm, shared experts */
	uint64_t experts;     /* all routed experts of the layer */
	uint32_t n_experts;
	uint64_t expert_span; /* bytes of one expert (largest in the layer) */
};

struct k3_model_bytes {
	uint64_t embed;       /* model.embed_tokens */
	uint64_t lm_head;
	uint64_t final;       /* model.norm, output AttnRes */
	uint64_t spine;       /* everything but routed experts */
	uint64_t experts;     /* every routed expert */
	uint64_t other;       /* stored but not used by the text model (vision, MTP, ...) */
	uint64_t total;       /* all tensor payloads */
	uint64_t expert_span; /* largest single expert, bytes (K3: 17,547,264) */
	uint32_t n_layers;
	struct k3_layer_bytes layer[K3_MODEL_MAX_LAYERS];
};

/* Fills *b from the open model's tensor table. */
void k3_model_bytes(const struct k3_model *m, struct k3_model_bytes *b);

/* With ram bytes available: whether the spine fits, and how many expert
 * slots (of expert_span bytes each) the rest holds, capped at the pool. */
struct k3_model_fit {
	uint64_t ram;
	bool spine_fits;
	uint64_t expert_slots;
	uint64_t expert_pool;          /* experts in all MoE layers */
	double pool_fraction;          /* expert_slots / expert_pool */
};
void k3_model_fit(const struct k3_model_bytes *b, uint64_t ram, struct k3_model_fit *f);

#endif

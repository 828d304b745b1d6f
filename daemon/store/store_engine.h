/*
 * store_engine.h - the store behind the engine's expert-source interface
 * (engine/engine.h, struct k3_expert_source): k3_engine_set_expert_source
 * with this adapter makes every routed expert come from the store's RAM
 * cache instead of the model's mmapped tensors.
 *
 * That interface asks for one expert per call and needs its bytes before
 * the call returns, so through it the store reads one expert at a time: a
 * step's misses cannot be issued together, sorted, with two or more in
 * flight. It is correct (pinning, counters, identical bytes) and is what
 * the invariance tests run; for full bandwidth the engine should hand the
 * store a layer's whole id list at once (docs/store.md, "For the engine").
 *
 * A step (k3_store_step_begin) starts at the first acquire after all of the
 * previous layer's experts were released, or when the layer changes.
 */
#ifndef K3_STORE_ENGINE_H
#define K3_STORE_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"
#include "store/store.h"

struct k3_store_engine_src {
	struct k3_store *store;        /* borrowed */
	struct k3_store_view *held;    /* views acquired and not yet released */
	size_t n_held, cap_held;
	uint32_t layer;                /* layer of the current step */
	int last_error;                /* first release of an unknown view (-ENOENT), else 0 */
};

/* Initializes ctx over store and fills *out for k3_engine_set_expert_source.
 * ctx must outlive the engine's use of *out. */
void k3_store_engine_src_init(struct k3_store_engine_src *ctx, struct k3_store *store,
			      struct k3_expert_source *out);

/* Frees ctx's bookkeeping (releases nothing: the engine releases what it
 * acquired). Accepts an initialized ctx only. */
void k3_store_engine_src_release(struct k3_store_engine_src *ctx);

#endif

/*
 * store_engine.h - the store behind the engine's expert-source interface
 * (engine/engine.h, struct k3_expert_source): k3_engine_set_expert_source
 * with this adapter makes every routed expert come from the store's RAM
 * cache instead of the model's mmapped tensors.
 *
 * The adapter fills both forms of the interface. The engine uses the
 * layer-wide one (acquire_layer / release_layer): one k3_store_acquire per
 * layer and group of positions, so a chunk's experts are deduplicated, its
 * misses issued together sorted by offset with several reads in flight,
 * and all of them pinned until the layer's routed_experts op is done; each
 * acquire_layer is one store step. request_layer (k3_store_request) starts
 * that step right after the router, so the misses are being read while the
 * engine computes the shared experts; the acquire_layer that follows with
 * the same ids only waits (k3_store_wait), or await_expert
 * (k3_store_wait_any) hands the experts out one by one as their reads
 * finish. max_experts is the store's slot count,
 * so a chunk whose distinct experts exceed the cache runs in groups of
 * positions instead of failing.
 *
 * The per-expert form (acquire / release) stays for wrappers and tests: a
 * step starts at the first acquire after all of the previous layer's
 * experts were released, or when the layer changes; through it the store
 * reads one expert at a time.
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
	struct k3_store_view *layer_views;   /* held by the last acquire_layer */
	size_t n_layer_views, cap_layer_views;
	uint64_t guesses;              /* lookahead guesses offered to the store */
	uint64_t guesses_queued;       /* of which k3_store_prefetch queued a read */
	/* request_layer done, acquire_layer not yet: layer_views[0..n_requested)
	 * are k3_store_request views for req_ids[0..n_requested) of `layer`. */
	size_t n_requested;
	uint32_t *req_ids;
	size_t cap_req_ids;
	uint8_t *taken;                /* [cap_req_ids]: await_expert handed layer_views[i] out */
};

/* Initializes ctx over store and fills *out for k3_engine_set_expert_source.
 * ctx must outlive the engine's use of *out. */
void k3_store_engine_src_init(struct k3_store_engine_src *ctx, struct k3_store *store,
			      struct k3_expert_source *out);

/* Turns router-lookahead prefetch on (per_position > 0: up to that many of
 * the next MoE layer's predicted experts per position are passed to
 * k3_store_prefetch after each MoE layer) or off (0: the engine then skips
 * the lookahead router). Call after init, before k3_engine_set_expert_source. */
void k3_store_engine_src_set_prefetch(struct k3_store_engine_src *ctx, uint32_t per_position,
				      struct k3_expert_source *out);

/* Frees ctx's bookkeeping (releases nothing: the engine releases what it
 * acquired). Accepts an initialized ctx only. */
void k3_store_engine_src_release(struct k3_store_engine_src *ctx);

#endif

/*
 * model_plan.h - building the typed tensor plan (model_plan.c) from a
 * parsed config and the sorted tensor table. Internal to daemon/model:
 * model.c calls it while opening a checkpoint; others read the finished
 * plan through k3_model_plan() (model.h).
 */
#ifndef K3_MODEL_PLAN_H
#define K3_MODEL_PLAN_H

#include <stddef.h>

#include "base/err.h"
#include "model/model.h"

/*
 * Locates every tensor the forward pass needs (docs/model.md §2) in
 * tensors[0..n_tensors) (sorted by k3_tensors_sort) and checks its dtype
 * and shape against cfg. Fills *plan, whose pointers point into tensors,
 * *layers (cfg->num_hidden_layers entries) and *experts (every MoE layer's
 * experts, layer-major); the caller frees *layers and *experts, also on
 * failure. Returns 0, -ENOMEM, or -EINVAL with one message in err listing
 * every problem found (a user fixing a checkpoint sees them all at once).
 */
int k3_model_plan_build(const struct k3_model_config *cfg, const struct k3_tensor *tensors,
			size_t n_tensors, struct k3_model_plan *plan, struct k3_layer_plan **layers,
			struct k3_expert **experts, struct k3_err *err);

#endif

/*
 * model_tensors.h - the checkpoint's tensor table: sorted by name, looked
 * up by name, values read as fp32. Shared by model.c (which builds the
 * table) and model_plan.c (which locates every tensor the forward pass
 * needs in it); neither calls the other through this. Not part of the
 * contract: other modules use model.h only.
 */
#ifndef K3_MODEL_TENSORS_H
#define K3_MODEL_TENSORS_H

#include <stddef.h>

#include "model/model.h"

/* Sorts v[0..n) by name (byte order), for k3_tensors_find. */
void k3_tensors_sort(struct k3_tensor *v, size_t n);

/* The tensor named name in v[0..n) sorted by k3_tensors_sort, or NULL.
 * O(log n) string compares. */
const struct k3_tensor *k3_tensors_find(const struct k3_tensor *v, size_t n, const char *name);

#endif

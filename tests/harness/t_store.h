/*
 * t_store.h - store fixtures over a real checkpoint: the expert packs
 * `k3ctl pack` writes, for tests that compare packs with shards. Header
 * only, include after t.h: it asserts each step with t.h's checks, whose
 * counters belong to the test program (libk3test cannot hold it).
 */
#ifndef K3_TEST_T_STORE_H
#define K3_TEST_T_STORE_H

#include <stdlib.h>

#include "model/model.h"
#include "store/store_model.h"
#include "store/store_pack.h"
#include "store/store_source.h"

/* Writes one expert pack per MoE layer of m into pack_dir (an existing
 * folder), from the model's shards, buffered; every step is a check. */
static inline void t_store_write_expert_packs(const struct k3_model *m, const char *pack_dir)
{
	const struct k3_model_plan *plan = k3_model_plan(m);
	struct k3_store_pack_ident *id = NULL;
	struct k3_err err = { 0 };
	size_t n_id = 0;
	char path[600];

	T_EQ_INT(k3_store_model_idents(m, &id, &n_id, &err), 0);
	for (uint32_t l = 0; l < plan->n_layers; l++) {
		struct k3_store_source *src;
		if (!plan->layers[l].is_moe)
			continue;
		src = k3_store_source_new(K3_STORE_DIRECT_OFF);
		T_EQ_INT(k3_store_source_add_model(src, m, l, &err), 0);
		T_EQ_INT(k3_store_pack_path(path, sizeof(path), pack_dir, l), 0);
		T_EQ_INT(k3_store_pack_write(path, src, id, n_id, 0, NULL, &err), 0);
		k3_store_source_free(src);
	}
	free(id);
}

#endif

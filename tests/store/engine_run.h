/*
 * engine_run.h - the run the store tests compare variants with (header
 * only, for tests/store): a prompt prefilled in the engine's chunks with
 * every position's logits and routes, then greedy decode steps, each
 * feeding back the argmax of the previous position.
 */
#ifndef K3_TEST_ENGINE_RUN_H
#define K3_TEST_ENGINE_RUN_H

#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"

/* Runs prompt[0..ntok) then ngen decode steps on a fresh sequence of e:
 * logits [ntok + ngen][V], ids and w [ntok + ngen][per] (per = n_moe x
 * top_k), gen[0..ngen) the fed-back ids. Returns 0 or the first error. */
static inline int t_engine_run(struct k3_engine *e, const int32_t *prompt, uint32_t ntok,
			       uint32_t ngen, float *logits, uint32_t *ids, float *w,
			       int32_t *gen, struct k3_err *err)
{
	uint32_t V = k3_engine_vocab(e), per = k3_engine_n_moe(e) * k3_engine_top_k(e);
	struct k3_engine_seq *s = NULL;
	int rc = k3_engine_seq_new(e, ntok + ngen, &s, err);

	if (!rc) {
		struct k3_engine_out out = { K3_ENGINE_LOGITS_ALL, logits, ids, w };
		rc = k3_engine_forward(e, s, prompt, ntok, &out, err);
	}
	for (uint32_t g = 0; !rc && g < ngen; g++) {
		uint32_t pos = ntok + g;
		int32_t id = (int32_t)k3_engine_argmax(logits + (size_t)(pos - 1) * V, V);
		struct k3_engine_out out = { K3_ENGINE_LOGITS_LAST, logits + (size_t)pos * V,
					     ids + (size_t)pos * per, w + (size_t)pos * per };
		gen[g] = id;
		rc = k3_engine_forward(e, s, &id, 1, &out, err);
	}
	k3_engine_seq_free(s);
	return rc;
}

#endif

/*
 * t_engine.h - the run tests compare variants and providers with
 * (libk3test): a prompt prefilled in the engine's chunks with every
 * position's logits and routes, then greedy decode steps, each feeding
 * back the argmax of the previous position.
 */
#ifndef K3_TEST_T_ENGINE_H
#define K3_TEST_T_ENGINE_H

#include <stdint.h>

#include "engine/engine.h"

/* Runs prompt[0..ntok) then ngen decode steps on a fresh sequence of e
 * (capacity ntok + ngen): logits [ntok + ngen][V], ids and w
 * [ntok + ngen][per] (per = n_moe x top_k), gen[0..ngen) the fed-back
 * ids; all caller-owned. Returns 0 or the first error (err says it). */
int t_engine_run(struct k3_engine *e, const int32_t *prompt, uint32_t ntok, uint32_t ngen,
		 float *logits, uint32_t *ids, float *w, int32_t *gen, struct k3_err *err);

#endif

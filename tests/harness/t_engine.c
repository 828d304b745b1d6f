/* t_engine.c - the greedy reference run of the engine tests (t_engine.h). */
#include "t_engine.h"

#include <stddef.h>

int t_engine_run(struct k3_engine *e, const int32_t *prompt, uint32_t ntok, uint32_t ngen,
		 float *logits, uint32_t *ids, float *w, int32_t *gen, struct k3_err *err)
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

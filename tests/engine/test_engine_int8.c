/*
 * test_engine_int8.c - the whole forward pass on an int8 spine (docs/
 * formats.md "int8 spine overlay"), on both golden checkpoints with an
 * overlay of every convertible matrix (router included) written into a
 * temp dir (the goldens are read-only), for the 8- and 40-token prompts:
 *
 *  - the fast path (I8 kernels of the process's ISA) and the scalar
 *    reference path (double sums) give the same logits within relative
 *    L2 1e-4, the bound the BF16 spine meets against the goldens, and the
 *    same routes at every MoE layer and position;
 *  - the int8 logits are not the BF16 ones (relative L2 above 1e-4: the
 *    overlay is in use, not silently ignored), and the default classes
 *    (router BF16) differ from the all-classes spine.
 * Prints the relative L2 figures.
 */
#include <jansson.h>
#include <stdlib.h>
#include <unistd.h>

#include "t.h"

#include "engine/engine.h"
#include "model/model.h"
#include "store/store_int8.h"

struct out {
	float *logits;               /* [T][V] */
	uint32_t *ids;               /* [T][n_moe][K] */
	size_t n_ids;
};

static double rel_l2(const float *a, const float *b, size_t n)
{
	double num = 0, den = 0;
	for (size_t i = 0; i < n; i++) {
		num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
		den += (double)b[i] * b[i];
	}
	return sqrt(num / den);
}

static int run(struct k3_model *m, bool reference, const int32_t *ids, uint32_t T, struct out *o)
{
	struct k3_err err = { 0 };
	struct k3_engine *e = NULL;
	struct k3_engine_seq *s = NULL;
	struct k3_engine_opts eo = { .threads = 1, .reference = reference };
	int rc = k3_engine_open(m, &eo, &e, &err);
	if (!rc)
		rc = k3_engine_seq_new(e, T, &s, &err);
	if (!rc) {
		uint32_t V = k3_engine_vocab(e);
		o->n_ids = (size_t)T * k3_engine_n_moe(e) * k3_engine_top_k(e);
		o->logits = calloc((size_t)T * V, sizeof(float));
		o->ids = calloc(o->n_ids ? o->n_ids : 1, sizeof(uint32_t));
		float *w = calloc(o->n_ids ? o->n_ids : 1, sizeof(float));
		struct k3_engine_out eout = { K3_ENGINE_LOGITS_ALL, o->logits, o->ids, w };
		rc = k3_engine_forward(e, s, ids, T, &eout, &err);
		free(w);
	}
	if (rc)
		printf("     %s\n", err.msg);
	k3_engine_seq_free(s);
	k3_engine_free(e);
	return rc;
}

static void check_case(const char *name, const char *ov)
{
	char path[256], gpath[256];
	struct k3_err err = { 0 };
	struct k3_model *bf = NULL, *all = NULL, *def = NULL;
	struct k3_store_int8_report rep;

	snprintf(path, sizeof(path), "%s", t_shared_path("golden/forward/"));
	snprintf(path + strlen(path), sizeof(path) - strlen(path), "%s/model", name);
	T_EQ_INT(k3_model_open(path, &bf, &err), 0);
	if (bf)
		T_EQ_INT(k3_store_int8_write(bf, ov, true, &rep, &err), 0);
	T_EQ_INT(k3_store_int8_open_model(path, ov, K3_MODEL_INT8_ALL, &all, &err), 0);
	T_EQ_INT(k3_store_int8_open_model(path, ov, 0, &def, &err), 0);
	if (!bf || !all || !def) {
		printf("     %s\n", err.msg);
		goto out;
	}
	uint32_t V = k3_model_config(bf)->vocab_size;
	static const char *const prompts[] = { "p8", "p40" };
	for (int p = 0; p < 2; p++) {
		snprintf(gpath, sizeof(gpath), "golden/forward/%s/golden/%s.json", name, prompts[p]);
		json_error_t je;
		json_t *g = json_load_file(t_shared_path(gpath), 0, &je);
		json_t *pr = json_object_get(g, "prompt");
		if (!T_OK(json_is_array(pr))) {
			json_decref(g);
			continue;
		}
		uint32_t T = (uint32_t)json_array_size(pr);
		int32_t *ids = calloc(T, sizeof(*ids));
		for (uint32_t t = 0; t < T; t++)
			ids[t] = (int32_t)json_integer_value(json_array_get(pr, t));
		struct out o_bf = { 0 }, o_fast = { 0 }, o_ref = { 0 }, o_def = { 0 };
		if (run(bf, false, ids, T, &o_bf) == 0 && run(all, false, ids, T, &o_fast) == 0 &&
		    run(all, true, ids, T, &o_ref) == 0 && run(def, false, ids, T, &o_def) == 0) {
			size_t n = (size_t)T * V;
			double fr = rel_l2(o_fast.logits, o_ref.logits, n);
			double fb = rel_l2(o_fast.logits, o_bf.logits, n);
			double db = rel_l2(o_def.logits, o_fast.logits, n);
			printf("%s %s: int8 fast vs reference rel-L2 %.3g; int8 vs bf16 %.3g; default"
			       " classes vs all %.3g\n", name, prompts[p], fr, fb, db);
			T_OK(fr <= 1e-4);
			T_EQ_MEM(o_fast.ids, o_ref.ids, o_fast.n_ids * sizeof(uint32_t));
			T_OK(fb > 1e-4);
			T_OK(db > 0);
		}
		free(o_bf.logits), free(o_bf.ids), free(o_fast.logits), free(o_fast.ids);
		free(o_ref.logits), free(o_ref.ids), free(o_def.logits), free(o_def.ids);
		free(ids);
		json_decref(g);
	}
out:
	k3_model_free(bf);
	k3_model_free(all);
	k3_model_free(def);
}

int main(void)
{
	const char *tmp = getenv("TMPDIR");
	char root[256], ov[300], cmd[400];

	snprintf(root, sizeof(root), "%s/k3eng8.XXXXXX", tmp ? tmp : "/tmp");
	if (!T_OK(mkdtemp(root) != NULL))
		return t_done();
	snprintf(ov, sizeof(ov), "%s/int8", root);
	check_case("k3tiny_a", ov);
	check_case("k3tiny_b", ov);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	if (system(cmd) != 0)
		printf("could not remove %s\n", root);
	return t_done();
}

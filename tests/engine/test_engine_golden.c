/*
 * test_engine_golden.c - the forward pass against the independent float64
 * reference in ../shared/golden/forward (see its README): for both golden
 * checkpoints and the 1-, 8- and 40-token prompts, on the fast path and on
 * the scalar reference path:
 *   - routes of every MoE layer and prompt position identical as sets,
 *     weights per id within 1e-4;
 *   - logits of every prompt position within relative L2 1e-4;
 *   - the 8-step greedy continuation identical, with its decode routes and
 *     the logits that chose each token.
 * Prints the worst relative L2 error per case.
 */
#include <jansson.h>

#include "t.h"
#include "t_golden.h"
#include "t_json.h"

#include "engine/engine.h"
#include "model/model.h"

static double worst_rel_l2;

/* Compares one route (ids/weights of top_k) with the golden entry as a set. */
static void check_route(const uint32_t *ids, const float *w, uint32_t K, json_t *gexp,
			json_t *gw, uint32_t layer, uint32_t pos)
{
	bool ok = json_array_size(gexp) == K;
	for (uint32_t i = 0; ok && i < K; i++) {
		uint32_t want = (uint32_t)json_integer_value(json_array_get(gexp, i));
		bool found = false;
		for (uint32_t j = 0; j < K; j++) {
			if (ids[j] != want)
				continue;
			found = true;
			double wr = json_number_value(json_array_get(gw, i));
			if (fabs(w[j] - wr) > 1e-4) {
				printf("     layer %u pos %u expert %u weight %.7f want %.7f\n",
				       layer, pos, want, w[j], wr);
				ok = false;
			}
		}
		if (!found) {
			printf("     layer %u pos %u: expert %u not selected\n", layer, pos, want);
			ok = false;
		}
	}
	T_OK(ok);
}

static void run_case(const char *name, const char *prompt, bool reference)
{
	struct k3_err err = { 0 };
	struct k3_model *model = NULL;
	struct k3_engine *e = NULL;
	struct k3_engine_seq *s = NULL;
	json_t *g = t_golden_json(name, prompt);

	if (!T_OK(g != NULL))
		return;
	if (!T_OK((model = t_golden_model(name)) != NULL)) {
		json_decref(g);
		return;
	}
	struct k3_engine_opts o = { .threads = 1, .max_chunk = 16, .reference = reference };
	if (!T_OK(k3_engine_open(model, &o, &e, &err) == 0) ||
	    !T_OK(k3_engine_seq_new(e, 64, &s, &err) == 0)) {
		printf("     %s\n", err.msg);
		goto out;
	}
	uint32_t V = k3_engine_vocab(e), K = k3_engine_top_k(e), nm = k3_engine_n_moe(e);
	const uint32_t *ml = k3_engine_moe_layers(e);
	int32_t ids[64];
	uint32_t T = t_golden_prompt(g, ids, 64);
	if (!T_OK(T > 0))
		goto out;

	float *logits = calloc((size_t)T * V, sizeof(float));
	uint32_t *rid = calloc((size_t)T * nm * K, sizeof(uint32_t));
	float *rw = calloc((size_t)T * nm * K, sizeof(float));
	struct k3_engine_out out = { K3_ENGINE_LOGITS_ALL, logits, rid, rw };
	if (!T_OK(k3_engine_forward(e, s, ids, T, &out, &err) == 0)) {
		printf("     %s\n", err.msg);
		goto free_bufs;
	}
	/* prompt logits, every position; the last one is the headline figure */
	double worst = 0.0, last = 0.0;
	json_t *all = json_object_get(g, "all_logits");
	for (uint32_t t = 0; t < T; t++) {
		double r = t_rel_l2_json(logits + (size_t)t * V, json_array_get(all, t), V);
		if (r > worst)
			worst = r;
	}
	last = t_rel_l2_json(logits + (size_t)(T - 1) * V, json_object_get(g, "last_logits"), V);
	T_OK(last <= 1e-4);
	T_OK(worst <= 1e-4);

	/* prompt routes */
	json_t *routes = json_object_get(g, "routes");
	T_EQ_INT(json_array_size(routes), nm);
	for (uint32_t i = 0; i < nm && i < json_array_size(routes); i++) {
		json_t *r = json_array_get(routes, i);
		T_EQ_INT(json_integer_value(json_object_get(r, "layer")), ml[i]);
		for (uint32_t t = 0; t < T; t++) {
			size_t off = ((size_t)t * nm + i) * K;
			check_route(rid + off, rw + off, K,
				    json_array_get(json_object_get(r, "experts"), t),
				    json_array_get(json_object_get(r, "weights"), t), ml[i], t);
		}
	}

	/* greedy continuation, one token at a time */
	json_t *gr = json_object_get(g, "greedy");
	json_t *gtok = json_object_get(gr, "tokens");
	json_t *steps = json_object_get(gr, "per_step");
	json_t *droutes = json_object_get(gr, "decode_routes");
	uint32_t n_steps = (uint32_t)json_array_size(gtok);
	T_OK(n_steps >= 1);
	const float *cur = logits + (size_t)(T - 1) * V;
	float *dl = calloc(V, sizeof(float));
	uint32_t *did = calloc((size_t)nm * K, sizeof(uint32_t));
	float *dw = calloc((size_t)nm * K, sizeof(float));
	double step_worst = 0.0;
	for (uint32_t i = 0; i < n_steps; i++) {
		uint32_t tok = k3_engine_argmax(cur, V);
		T_EQ_INT(tok, json_integer_value(json_array_get(gtok, i)));
		double r = t_rel_l2_json(cur, json_object_get(json_array_get(steps, i), "logits"), V);
		if (r > step_worst)
			step_worst = r;
		if (i + 1 == n_steps)
			break;
		int32_t id = (int32_t)tok;
		struct k3_engine_out o1 = { K3_ENGINE_LOGITS_LAST, dl, did, dw };
		if (!T_OK(k3_engine_forward(e, s, &id, 1, &o1, &err) == 0)) {
			printf("     %s\n", err.msg);
			break;
		}
		for (uint32_t mi = 0; mi < nm; mi++) {
			json_t *r2 = json_array_get(droutes, mi);
			check_route(did + (size_t)mi * K, dw + (size_t)mi * K, K,
				    json_array_get(json_object_get(r2, "experts"), i),
				    json_array_get(json_object_get(r2, "weights"), i), ml[mi], T + i);
		}
		cur = dl;
	}
	T_OK(step_worst <= 1e-4);
	printf("%s %s %-4s: last-logits rel L2 %.3g, worst prompt position %.3g, worst greedy step %.3g\n",
	       reference ? "ref " : "fast", name, prompt, last, worst, step_worst);
	if (worst > worst_rel_l2)
		worst_rel_l2 = worst;
	free(dl);
	free(did);
	free(dw);
free_bufs:
	free(logits);
	free(rid);
	free(rw);
out:
	k3_engine_seq_free(s);
	k3_engine_free(e);
	k3_model_free(model);
	json_decref(g);
}

int main(void)
{
	static const char *cases[] = { "k3tiny_a", "k3tiny_b" };
	static const char *prompts[] = { "p1", "p8", "p40" };
	for (int ref = 0; ref < 2; ref++)
		for (int c = 0; c < 2; c++)
			for (int p = 0; p < 3; p++)
				run_case(cases[c], prompts[p], ref);
	printf("worst relative L2 over all cases: %.3g\n", worst_rel_l2);
	return t_done();
}

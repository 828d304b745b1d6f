/*
 * test_torch_parity.c - the torch provider (providers/torch, ATen fp32 on
 * the CPU here) against the cpu provider (docs/providers.md, "Parity"):
 *   - end to end, on every golden case (both checkpoints of
 *     ../shared/golden/forward, prompts p1/p8/p40): the route of every MoE
 *     layer and position identical to the cpu provider's (ids in selection
 *     order), the 8 greedy ids and their decode routes identical, every
 *     logit row within relative L2 1e-4 of the golden; prints the logits'
 *     relative L2 against the cpu provider;
 *   - op by op, through each engine's provider handle on the same random
 *     inputs: embed bit-exact, router ids identical, every other op within
 *     relative L2 TOL_OP of the cpu provider (printed);
 *   - batch invariance of the torch provider (memcmp): every position's
 *     logits and route the same alone, in chunks of 5 and of 16, and with
 *     2 threads; and whether ATen on whole [T][n] chunks (batched
 *     matmul, K3_TORCH_BATCHED=1) would keep it (printed, not asserted:
 *     it does not, which is why the provider computes one position at a
 *     time);
 *   - the VRAM expert tier's engine path on the host-memory device
 *     (vram_host.h): with budgets from "transient slots only" to "every
 *     expert", through the model's tensors and through the expert store,
 *     logits and routes bit-identical to the torch provider without a
 *     tier, and the source asked for fewer experts once they are resident
 *     (the engine reads only misses).
 */
#include <jansson.h>
#include <errno.h>
#include <stdlib.h>

#include "t.h"
#include "t_engine.h"
#include "t_golden.h"
#include "t_json.h"

#include "engine/engine.h"
#include "model/model.h"
#include "store/store.h"
#include "store/store_engine.h"
#include "store/store_model.h"
#include "provider_registry.h"
#include "vram/vram.h"

/* ATen's fp32 kernels and the project's differ in summation order and in
 * the last ulp of exp/tanh: per op that stays under 1e-5 relative L2. */
#define TOL_OP 1e-5

static double rel_l2f(const float *a, const float *b, size_t n)
{
	double num = 0.0, den = 0.0;
	for (size_t i = 0; i < n; i++) {
		num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
		den += (double)b[i] * b[i];
	}
	return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* One provider's run of a golden case: prompt logits of every position,
 * routes, then greedy decode steps with their logits and routes. */
struct golden_run {
	uint32_t T, V, PER, steps;
	float *logits;       /* [T + steps][V] */
	uint32_t *ids;       /* [T + steps][PER] */
	int32_t tokens[16];  /* the fed-back greedy ids, [steps] */
	int rc;
};

static void golden_run(struct k3_model *model, const char *provider, const int32_t *prompt,
		       uint32_t T, uint32_t steps, struct golden_run *r)
{
	struct k3_err err = { 0 };
	struct k3_engine *e = NULL;
	struct k3_engine_opts o = { .provider = provider, .threads = 1, .max_chunk = 16 };
	memset(r, 0, sizeof(*r));
	if (steps > sizeof(r->tokens) / sizeof(r->tokens[0]))
		r->rc = k3_err_set(&err, -EINVAL, "%u greedy steps: at most 16", steps);
	else
		r->rc = k3_engine_open(model, &o, &e, &err);
	if (r->rc) {
		printf("     %s: %s\n", provider, err.msg);
		k3_engine_free(e);
		return;
	}
	r->T = T;
	r->steps = steps;
	r->V = k3_engine_vocab(e);
	r->PER = k3_engine_n_moe(e) * k3_engine_top_k(e);
	r->logits = calloc((size_t)(T + steps) * r->V, sizeof(float));
	r->ids = calloc((size_t)(T + steps) * r->PER, sizeof(uint32_t));
	float *w = calloc((size_t)(T + steps) * r->PER, sizeof(float));
	r->rc = t_engine_run(e, prompt, T, steps, r->logits, r->ids, w, r->tokens, &err);
	if (r->rc)
		printf("     %s: %s\n", provider, err.msg);
	free(w);
	k3_engine_free(e);
}

static void golden_free(struct golden_run *r)
{
	free(r->logits);
	free(r->ids);
}

static double worst_vs_cpu;

static void golden_case(const char *name, const char *prompt_name)
{
	struct k3_model *model = NULL;
	json_t *g = t_golden_json(name, prompt_name);

	if (!T_OK(g != NULL))
		return;
	if (!T_OK((model = t_golden_model(name)) != NULL)) {
		json_decref(g);
		return;
	}
	int32_t ids[64];
	uint32_t T = t_golden_prompt(g, ids, 64);
	T_OK(T > 0);
	json_t *gtok = json_object_get(json_object_get(g, "greedy"), "tokens");
	uint32_t steps = (uint32_t)json_array_size(gtok);
	/* the last greedy token needs no forward of its own */
	struct golden_run c, t;
	golden_run(model, "cpu", ids, T, steps - 1, &c);
	golden_run(model, "torch", ids, T, steps - 1, &t);
	if (T_OK(c.rc == 0 && t.rc == 0)) {
		uint32_t N = T + steps - 1, V = c.V;
		/* routes: identical ids in selection order, every position */
		T_OK(memcmp(c.ids, t.ids, (size_t)N * c.PER * sizeof(uint32_t)) == 0);
		/* greedy ids, including the last one chosen from the last logits */
		uint32_t last_c = k3_engine_argmax(c.logits + (size_t)(N - 1) * V, V);
		uint32_t last_t = k3_engine_argmax(t.logits + (size_t)(N - 1) * V, V);
		T_EQ_INT(last_t, last_c);
		for (uint32_t i = 0; i + 1 < steps; i++) {
			T_EQ_INT(t.tokens[i], c.tokens[i]);
			T_EQ_INT(t.tokens[i], json_integer_value(json_array_get(gtok, i)));
		}
		T_EQ_INT(last_t, json_integer_value(json_array_get(gtok, steps - 1)));
		double vs_cpu = 0.0, vs_golden = 0.0;
		json_t *all = json_object_get(g, "all_logits");
		json_t *per = json_object_get(json_object_get(g, "greedy"), "per_step");
		for (uint32_t p = 0; p < N; p++) {
			double r = rel_l2f(t.logits + (size_t)p * V, c.logits + (size_t)p * V, V);
			if (r > vs_cpu)
				vs_cpu = r;
			json_t *ref = p < T ? json_array_get(all, p)
				   : json_object_get(json_array_get(per, p - T + 1), "logits");
			double rg = t_rel_l2_json(t.logits + (size_t)p * V, ref, V);
			if (rg > vs_golden)
				vs_golden = rg;
		}
		/* fp32 through ATen, whose GEMM blocking follows the ISA: on an
		 * AVX2 host (AMD Zen 3) k3tiny_b's 40-position prompt reached
		 * 1.07e-4, on AVX-512 under 1e-4; the routes and greedy ids above
		 * are the exact checks, this bounds drift. */
		T_OK(vs_golden <= 3e-4);
		printf("torch vs cpu %s %-4s: routes and %u greedy ids identical; logits rel L2 "
		       "vs cpu worst %.3g, vs golden worst %.3g\n", name, prompt_name, steps,
		       vs_cpu, vs_golden);
		if (vs_cpu > worst_vs_cpu)
			worst_vs_cpu = vs_cpu;
	}
	golden_free(&c);
	golden_free(&t);
	k3_model_free(model);
	json_decref(g);
}

/* ------------------------------------------------------------ op by op */

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static float frand(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (float)((double)(rng >> 11) / (double)(1ull << 53) * 2.0 - 1.0);
}

static void fill(float *x, size_t n, float scale)
{
	for (size_t i = 0; i < n; i++)
		x[i] = frand() * scale;
}

struct pair {
	const struct k3_provider *p[2];
	k3_prov_model *m[2];
};

static void op_check(const char *op, const float *a, const float *b, size_t n)
{
	double r = rel_l2f(b, a, n);
	printf("op %-16s torch vs cpu rel L2 %.3g\n", op, r);
	if (!T_OK(r <= TOL_OP))
		printf("     op %s over %g\n", op, TOL_OP);
}

static void ops(struct k3_model *model)
{
	struct k3_err err = { 0 };
	struct k3_engine *e[2] = { NULL, NULL };
	const char *names[2] = { "cpu", "torch" };
	struct pair pp;
	for (int i = 0; i < 2; i++) {
		struct k3_engine_opts o = { .provider = names[i], .threads = 1, .max_chunk = 8 };
		if (!T_OK(k3_engine_open(model, &o, &e[i], &err) == 0)) {
			printf("     %s\n", err.msg);
			goto out;
		}
		pp.p[i] = k3_engine_provider(e[i], &pp.m[i]);
	}
	const struct k3_model_config *mc = k3_model_config(model);
	const struct k3_model_plan *plan = k3_model_plan(model);
	uint32_t D = mc->hidden_size, V = mc->vocab_size, K = mc->num_experts_per_token;
	uint32_t T = 5;
	struct k3_prov_status st = { 0 };
	float *x = calloc((size_t)T * D, sizeof(float)), *c1 = calloc((size_t)T * D, sizeof(float));
	float *y[2], *lg[2];
	for (int i = 0; i < 2; i++) {
		y[i] = calloc((size_t)T * D, sizeof(float));
		lg[i] = calloc((size_t)T * V, sizeof(float));
	}
	fill(x, (size_t)T * D, 1.0f);
	fill(c1, (size_t)T * D, 2.0f);

	int32_t tok[5] = { 0, 7, 100, 255, 3 };
	for (int i = 0; i < 2; i++)
		T_EQ_INT(pp.p[i]->embed(pp.m[i], tok, T, y[i], &st), 0);
	T_OK(memcmp(y[0], y[1], (size_t)T * D * sizeof(float)) == 0);

	const float *cands[2] = { x, c1 };
	for (int i = 0; i < 2; i++)
		T_EQ_INT(pp.p[i]->attnres_mix(pp.m[i], K3_PROV_MIX_MLP, 1, cands, 2, T, y[i], &st), 0);
	op_check("attnres_mix", y[0], y[1], (size_t)T * D);
	for (int i = 0; i < 2; i++)
		T_EQ_INT(pp.p[i]->ffn_norm(pp.m[i], 1, x, T, y[i], &st), 0);
	op_check("ffn_norm", y[0], y[1], (size_t)T * D);
	for (int i = 0; i < 2; i++)
		T_EQ_INT(pp.p[i]->mlp(pp.m[i], 0, x, T, y[i], &st), 0);
	op_check("mlp (dense)", y[0], y[1], (size_t)T * D);
	for (int i = 0; i < 2; i++)
		T_EQ_INT(pp.p[i]->mlp(pp.m[i], 1, x, T, y[i], &st), 0);
	op_check("mlp (shared)", y[0], y[1], (size_t)T * D);
	for (int i = 0; i < 2; i++)
		T_EQ_INT(pp.p[i]->logits(pp.m[i], x, T, lg[i], &st), 0);
	op_check("logits", lg[0], lg[1], (size_t)T * V);

	/* KDA (layer 0) and MLA (first MLA layer): a 5-position chunk and
	 * two single steps on the advanced state */
	uint32_t mla_l = 0;
	while (mla_l < mc->num_hidden_layers && mc->is_kda[mla_l])
		mla_l++;
	k3_prov_kda_state *ks[2] = { NULL, NULL };
	k3_prov_mla_cache *mcch[2] = { NULL, NULL };
	for (int i = 0; i < 2; i++) {
		T_EQ_INT(pp.p[i]->kda_state_new(pp.m[i], 0, &ks[i], &st), 0);
		T_EQ_INT(pp.p[i]->mla_cache_new(pp.m[i], mla_l, 4, &mcch[i], &st), 0);
	}
	for (int step = 0; step < 3; step++) {
		uint32_t n = step == 0 ? T : 1;
		const float *in = step == 0 ? x : c1 + (size_t)step * D;
		for (int i = 0; i < 2; i++)
			T_EQ_INT(pp.p[i]->kda(pp.m[i], 0, in, n, ks[i], y[i], 0, &st), 0);
		op_check(step == 0 ? "kda (T=5)" : "kda (T=1)", y[0], y[1], (size_t)n * D);
		for (int i = 0; i < 2; i++)
			T_EQ_INT(pp.p[i]->mla(pp.m[i], mla_l, in, n, mcch[i], y[i], 0, &st), 0);
		op_check(step == 0 ? "mla (T=5)" : "mla (T=1)", y[0], y[1], (size_t)n * D);
	}
	for (int i = 0; i < 2; i++) {
		pp.p[i]->kda_state_free(ks[i]);
		pp.p[i]->mla_cache_free(mcch[i]);
	}

	/* router and routed experts of layer 1 on a normed input */
	uint32_t rid[2][5 * 64];
	float rw[2][5 * 64];
	for (int i = 0; i < 2; i++) {
		T_EQ_INT(pp.p[i]->ffn_norm(pp.m[i], 1, x, T, c1, &st), 0);
		T_EQ_INT(pp.p[i]->router(pp.m[i], 1, c1, T, rid[i], rw[i], &st), 0);
	}
	T_OK(memcmp(rid[0], rid[1], (size_t)T * K * sizeof(uint32_t)) == 0);
	op_check("router weights", rw[0], rw[1], (size_t)T * K);
	struct k3_prov_expert sp[5 * 64];
	for (uint32_t j = 0; j < T * K; j++) {
		const struct k3_expert *xe = &plan->layers[1].moe.experts[rid[0][j]];
		sp[j] = (struct k3_prov_expert){ xe->w1.packed->data, xe->w1.scale->data,
						 xe->w3.packed->data, xe->w3.scale->data,
						 xe->w2.packed->data, xe->w2.scale->data };
	}
	for (int i = 0; i < 2; i++) {
		memset(y[i], 0, (size_t)T * D * sizeof(float));
		T_EQ_INT(pp.p[i]->routed_experts(pp.m[i], 1, c1, T, rid[0], rw[0], sp, y[i], &st), 0);
	}
	op_check("routed_experts", y[0], y[1], (size_t)T * D);
	/* errors change nothing and say why */
	uint32_t bad[64];
	memcpy(bad, rid[0], K * sizeof(uint32_t));
	bad[0] = mc->num_experts;
	st.msg[0] = 0;
	T_EQ_INT(pp.p[1]->routed_experts(pp.m[1], 1, c1, 1, bad, rw[0], sp, y[1], &st), -EINVAL);
	T_OK(strstr(st.msg, "id") != NULL);
	T_EQ_INT(pp.p[1]->kda(pp.m[1], mla_l, x, 1, NULL, y[1], 0, &st), -EINVAL);
	int32_t badtok = (int32_t)V;
	T_EQ_INT(pp.p[1]->embed(pp.m[1], &badtok, 1, y[1], &st), -EINVAL);
	T_EQ_INT(pp.p[1]->router(pp.m[1], 1, c1, 9, rid[1], rw[1], &st), -EINVAL);   /* T > max_batch */
	T_OK(strstr(st.msg, "batch") != NULL);
	for (int i = 0; i < 2; i++) {
		free(y[i]);
		free(lg[i]);
	}
	free(x);
	free(c1);
out:
	k3_engine_free(e[0]);
	k3_engine_free(e[1]);
}

/* ------------------------------------------------- batch invariance, tier */

enum { NTOK = 12, NGEN = 4, NALL = NTOK + NGEN };
static const int32_t prompt12[NTOK] = { 5, 231, 232, 165, 64, 57, 240, 60, 11, 200, 17, 93 };

struct inv_run {
	float *logits;     /* [NALL][V] */
	uint32_t *ids;     /* [NALL][PER] */
	size_t nl, nr;
	uint64_t acquires; /* experts the source handed out */
	uint64_t demand;   /* store: demand hits + misses */
	int rc;
};

struct counting {
	struct k3_expert_source inner;
	uint64_t n;
};

static int cnt_acquire(void *c, uint32_t l, uint32_t e, struct k3_prov_expert *out,
		       struct k3_err *err)
{
	struct counting *k = c;
	k->n++;
	return k->inner.acquire(k->inner.ctx, l, e, out, err);
}

static void cnt_release(void *c, uint32_t l, uint32_t e)
{
	struct counting *k = c;
	k->inner.release(k->inner.ctx, l, e);
}

/* The default source, counted: what the model handle's tensors gave. */
static int model_acquire(void *c, uint32_t layer, uint32_t expert, struct k3_prov_expert *out,
			 struct k3_err *err)
{
	(void)err;
	const struct k3_expert *x = &k3_model_plan(c)->layers[layer].moe.experts[expert];
	*out = (struct k3_prov_expert){ x->w1.packed->data, x->w1.scale->data, x->w3.packed->data,
					x->w3.scale->data, x->w2.packed->data, x->w2.scale->data };
	return 0;
}

static void model_release(void *c, uint32_t l, uint32_t e)
{
	(void)c;
	(void)l;
	(void)e;
}

/* Prompt as calls of `call` positions (chunk 16), then NGEN greedy steps. */
static void inv_run(struct k3_model *model, uint32_t call, uint32_t threads, uint64_t tier,
		    bool store, struct inv_run *r)
{
	struct k3_err err = { 0 };
	struct k3_engine *e = NULL;
	struct k3_engine_seq *s = NULL;
	struct k3_store_source *src = NULL;
	struct k3_store *st = NULL;
	struct k3_store_engine_src ectx;
	struct k3_expert_source es;
	struct counting cnt = { { .ctx = model, .acquire = model_acquire,
				  .release = model_release }, 0 };
	struct k3_engine_opts o = { .provider = "torch", .threads = threads, .max_chunk = 16,
				    .vram_cache_bytes = tier };
	memset(r, 0, sizeof(*r));
	r->rc = k3_engine_open(model, &o, &e, &err);
	if (!r->rc && store) {
		r->rc = k3_store_source_open_model(model, NULL, K3_STORE_DIRECT_OFF, &src, NULL, &err);
		if (!r->rc) {
			struct k3_store_config cfg = {
				.cache_bytes = k3_store_source_count(src) * k3_store_source_slot_bytes(src),
				.prefetch_slots = 0,
			};
			r->rc = k3_store_new(src, &cfg, &st, &err);
		}
		if (!r->rc) {
			k3_store_engine_src_init(&ectx, st, &es);
			k3_engine_set_expert_source(e, &es);
		}
	} else if (!r->rc) {
		struct k3_expert_source cs = { .ctx = &cnt, .acquire = cnt_acquire,
					       .release = cnt_release };
		k3_engine_set_expert_source(e, &cs);
	}
	if (!r->rc)
		r->rc = k3_engine_seq_new(e, NALL, &s, &err);
	uint32_t V = r->rc ? 0 : k3_engine_vocab(e);
	uint32_t PER = r->rc ? 0 : k3_engine_n_moe(e) * k3_engine_top_k(e);
	r->nl = (size_t)NALL * V;
	r->nr = (size_t)NALL * PER;
	r->logits = calloc(r->nl + 1, sizeof(float));
	r->ids = calloc(r->nr + 1, sizeof(uint32_t));
	float *w = calloc(r->nr + 1, sizeof(float));
	for (uint32_t done = 0; !r->rc && done < NTOK; done += call) {
		uint32_t n = NTOK - done < call ? NTOK - done : call;
		struct k3_engine_out out = { K3_ENGINE_LOGITS_ALL, r->logits + (size_t)done * V,
					     r->ids + (size_t)done * PER, w + (size_t)done * PER };
		r->rc = k3_engine_forward(e, s, prompt12 + done, n, &out, &err);
	}
	for (uint32_t g = 0; !r->rc && g < NGEN; g++) {
		uint32_t pos = NTOK + g;
		int32_t id = (int32_t)k3_engine_argmax(r->logits + (size_t)(pos - 1) * V, V);
		struct k3_engine_out out = { K3_ENGINE_LOGITS_LAST, r->logits + (size_t)pos * V,
					     r->ids + (size_t)pos * PER, w + (size_t)pos * PER };
		r->rc = k3_engine_forward(e, s, &id, 1, &out, &err);
	}
	if (r->rc)
		printf("     torch run (call %u, threads %u, tier %llu, store %d): %s\n", call, threads,
		       (unsigned long long)tier, store, err.msg);
	r->acquires = cnt.n;
	if (st) {
		struct k3_store_stats ss;
		k3_store_stats_get(st, &ss);
		r->demand = ss.demand_hits + ss.demand_misses;
		T_EQ_INT(ectx.n_held, 0);
		k3_store_engine_src_release(&ectx);
	}
	free(w);
	k3_engine_seq_free(s);
	k3_engine_free(e);
	k3_store_free(st);
	k3_store_source_free(src);
}

static bool same(const struct inv_run *a, const struct inv_run *b)
{
	return a->rc == 0 && b->rc == 0 && a->nl == b->nl &&
	       memcmp(a->logits, b->logits, a->nl * sizeof(float)) == 0 &&
	       memcmp(a->ids, b->ids, a->nr * sizeof(uint32_t)) == 0;
}

static void inv_free(struct inv_run *r)
{
	free(r->logits);
	free(r->ids);
}

static void invariance_and_tier(struct k3_model *model)
{
	const uint64_t NO_TIER = UINT64_MAX;
	struct inv_run base, r;
	inv_run(model, 1, 1, NO_TIER, false, &base);
	if (!T_OK(base.rc == 0))
		return;
	static const uint32_t calls[] = { 5, 16 };
	for (size_t i = 0; i < 2; i++) {
		inv_run(model, calls[i], 1, NO_TIER, false, &r);
		if (!T_OK(same(&base, &r)))
			printf("     torch: chunks of %u differ from one position per call\n", calls[i]);
		inv_free(&r);
	}
	inv_run(model, 16, 2, NO_TIER, false, &r);
	if (!T_OK(same(&base, &r)))
		printf("     torch: 2 threads differ from 1\n");
	inv_free(&r);
	/* ATen's batched matmul, for the record */
	setenv("K3_TORCH_BATCHED", "1", 1);
	struct inv_run b1, b16;
	inv_run(model, 1, 1, NO_TIER, false, &b1);
	inv_run(model, 16, 1, NO_TIER, false, &b16);
	unsetenv("K3_TORCH_BATCHED");
	printf("ATen on whole chunks (K3_TORCH_BATCHED=1): T=1 vs T=12 %s\n",
	       same(&b1, &b16) ? "bit-identical" : "NOT bit-identical (not batch invariant)");
	inv_free(&b1);
	inv_free(&b16);

	/* the tier on the host-memory device, from no resident slot to all */
	const struct k3_model_config *mc = k3_model_config(model);
	uint64_t ab[K3_VRAM_ARRAYS], off[K3_VRAM_ARRAYS];
	uint64_t n = (uint64_t)mc->moe_intermediate_size * mc->routed_expert_hidden_size;
	for (int a = 0; a < K3_VRAM_ARRAYS; a++)
		ab[a] = a % 2 == 0 ? n / 2 : n / 32;
	uint64_t slot = k3_vram_layout(ab, off);
	uint64_t all = (uint64_t)mc->n_moe * mc->num_experts;
	uint64_t budgets[3] = { 2 * slot, (2 + 6) * slot, (2 + all) * slot };
	const char *bname[3] = { "transient only", "6 slots", "every expert" };
	struct inv_run full, ref;
	inv_run(model, 16, 1, NO_TIER, false, &full);
	/* On the CPU a tier changes nothing but where the bytes come from:
	 * every run equals the one without. On a CUDA device the experts run
	 * on the device only with a tier (without one, on the CPU: other
	 * rounding), so the budgets are compared with each other. */
	bool device = strcmp(k3_provider_auto(), "torch") == 0;
	const struct inv_run *want = &base;
	if (device) {
		inv_run(model, 16, 1, budgets[0], false, &ref);
		want = &ref;
	}
	for (int i = 0; i < 3; i++) {
		inv_run(model, 16, 1, budgets[i], false, &r);
		if (!T_OK(same(want, &r)))
			printf("     tier '%s' changed logits or routes\n", bname[i]);
		if (i == 2)
			T_OK(r.acquires < full.acquires);   /* resident experts were not read */
		printf("tier %-14s: bits identical %s; source handed out %llu experts (no tier %llu)\n",
		       bname[i], same(want, &r) ? "yes" : "NO", (unsigned long long)r.acquires,
		       (unsigned long long)full.acquires);
		inv_free(&r);
	}
	inv_free(&full);
	struct inv_run sn, sa;
	inv_run(model, 16, 1, NO_TIER, true, &sn);
	inv_run(model, 16, 1, budgets[2], true, &sa);
	T_OK(same(&base, &sn));
	T_OK(same(want, &sa));
	T_OK(sa.demand < sn.demand);
	printf("store + tier every expert: bits identical %s; store demand accesses %llu (no tier %llu)\n",
	       same(want, &sa) ? "yes" : "NO", (unsigned long long)sa.demand,
	       (unsigned long long)sn.demand);
	if (device)
		inv_free(&ref);
	inv_free(&sn);
	inv_free(&sa);
	inv_free(&base);
}

int main(void)
{
	static const char *cases[] = { "k3tiny_a", "k3tiny_b" };
	static const char *prompts[] = { "p1", "p8", "p40" };
	for (int c = 0; c < 2; c++)
		for (int p = 0; p < 3; p++)
			golden_case(cases[c], prompts[p]);
	printf("torch vs cpu: worst logits relative L2 over all golden cases %.3g\n", worst_vs_cpu);

	struct k3_err err = { 0 };
	struct k3_model *model = NULL;
	if (T_OK(k3_model_open(t_shared_path("golden/forward/k3tiny_a/model"), &model, &err) == 0)) {
		ops(model);
		invariance_and_tier(model);
		k3_model_free(model);
	} else {
		printf("     %s\n", err.msg);
	}
	return t_done();
}

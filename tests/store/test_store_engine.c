/*
 * test_store_engine.c - invariance (issue 7 item 8): the engine's logits,
 * routes and greedy ids are bit-identical whether routed experts come from
 * the model's mmapped tensors or from the store, for cache budgets {floor,
 * small, unlimited}, packs vs shards, O_DIRECT on/off, 1 vs 2 I/O threads,
 * both eviction policies and prefetch on/off (with deliberately poor
 * guesses), the partial lookahead forced on in every MoE layer (the
 * store's would_block made to say yes, so the path runs whatever the
 * timing); and a budget below what one step pins fails
 * with a clear error instead of computing with wrong weights.
 */
#include "t.h"
#include "t_engine.h"
#include "t_store.h"

#include <errno.h>
#include <unistd.h>

#include "engine/engine.h"
#include "model/model.h"
#include "store/store.h"
#include "store/store_engine.h"
#include "store/store_model.h"

enum { NTOK = 12, NGEN = 6, NALL = NTOK + NGEN };

static const int32_t prompt[NTOK] = { 5, 231, 232, 165, 64, 57, 240, 60, 11, 200, 17, 93 };

struct result {
	float *logits;      /* [NALL][V] */
	uint32_t *ids;      /* [NALL][n_moe][K] */
	float *w;
	int32_t gen[NGEN];
	struct k3_store_stats st;
	uint64_t partial_scored;   /* partial lookahead guesses scored, all ranks */
	int rc;
	char msg[K3_ERR_MSG_MAX];
};

static struct k3_model *model;
static uint32_t V, PER, K, N_MOE;
static char packdir[256];

/* Wraps the store adapter with a guesser: at each layer's first acquire,
 * prefetch 3 pseudo-random experts of the next MoE layer (mostly wrong on
 * purpose: cancels, waste and evictions must not change any result). */
struct pf {
	struct k3_expert_source inner;
	struct k3_store *store;
	uint32_t layer;
	uint64_t rng;
	uint32_t n_experts;
};

static int pf_acquire(void *vctx, uint32_t layer, uint32_t expert, struct k3_prov_expert *out,
		      struct k3_err *err)
{
	struct pf *p = vctx;
	int rc = p->inner.acquire(p->inner.ctx, layer, expert, out, err);

	if (rc == 0 && layer != p->layer) {
		uint32_t g[3];
		p->layer = layer;
		for (int k = 0; k < 3; k++) {
			p->rng = p->rng * 6364136223846793005ull + 1442695040888963407ull;
			g[k] = (uint32_t)(p->rng >> 33) % p->n_experts;
		}
		k3_store_prefetch(p->store, layer + 1, g, 3);
	}
	return rc;
}

static void pf_release(void *vctx, uint32_t layer, uint32_t expert)
{
	struct pf *p = vctx;
	p->inner.release(p->inner.ctx, layer, expert);
}

struct variant {
	bool prefetch;
	const char *name;
	bool packs;
	enum k3_store_direct direct;
	unsigned threads;
	uint32_t slots;            /* 0 = every expert */
	uint32_t chunk;
	enum k3_store_policy policy;
	uint32_t lookahead;        /* engine router lookahead: guesses per position, 0 = off */
	bool per_expert;           /* hide the layer-wide interface (one expert per call) */
	double gate;               /* > 0: --prefetch auto with this precision gate */
	bool partial_always;       /* would_block always says yes: the partial lookahead
				    * runs in every MoE layer but the last */
};

/* The store adapter's would_block, asked (it starts the await) and
 * overruled: the engine then runs the partial lookahead at half of each
 * layer's experts, whether or not their reads are done. */
static bool (*store_would_block)(void *ctx, uint32_t layer);

static bool would_block_always(void *ctx, uint32_t layer)
{
	(void)store_would_block(ctx, layer);
	return true;
}

static void result_free(struct result *r)
{
	free(r->logits);
	free(r->ids);
	free(r->w);
}

/* Prompt in chunks, then NGEN greedy decode steps; v NULL = the model's
 * own tensors. */
static void run(const struct variant *v, struct result *r)
{
	struct k3_engine_opts o = { .threads = 1, .max_chunk = v ? v->chunk : 64 };
	struct k3_store_source *src = NULL;
	struct k3_store *store = NULL;
	struct k3_store_engine_src ectx;
	struct k3_expert_source es;
	struct k3_engine *e = NULL;
	struct k3_err err = { 0 };
	int rc;

	memset(r, 0, sizeof(*r));
	r->logits = calloc((size_t)NALL * V, sizeof(float));
	r->ids = calloc((size_t)NALL * PER, sizeof(uint32_t));
	r->w = calloc((size_t)NALL * PER, sizeof(float));
	rc = k3_engine_open(model, &o, &e, &err);
	if (!rc && v) {
		rc = k3_store_source_open_model(model, v->packs ? packdir : NULL, v->direct, &src,
						NULL, &err);
		if (!rc) {
			uint64_t slots = v->slots ? v->slots : k3_store_source_count(src);
			struct k3_store_config cfg = {
				.cache_bytes = slots * k3_store_source_slot_bytes(src),
				.io_threads = v->threads, .policy = v->policy,
				.check_scales = true, .prefetch_slots = -1,
				.prefetch_auto = v->gate > 0, .prefetch_min_precision = v->gate,
			};
			rc = k3_store_new(src, &cfg, &store, &err);
		}
		if (!rc) {
			k3_store_engine_src_init(&ectx, store, &es);
			k3_store_engine_src_set_prefetch(&ectx, v->lookahead, &es);
			if (v->partial_always) {
				store_would_block = es.would_block;
				es.would_block = would_block_always;
			}
			if (v->per_expert)
				es = (struct k3_expert_source){ .ctx = es.ctx, .acquire = es.acquire,
								.release = es.release };
			if (v->prefetch) {
				static struct pf pf;
				pf = (struct pf){ .inner = es, .store = store, .layer = UINT32_MAX,
						  .rng = 7, .n_experts = k3_model_config(model)->num_experts };
				es = (struct k3_expert_source){ .ctx = &pf, .acquire = pf_acquire,
								.release = pf_release };
			}
			k3_engine_set_expert_source(e, &es);
		}
	}
	if (!rc)
		rc = t_engine_run(e, prompt, NTOK, NGEN, r->logits, r->ids, r->w, r->gen, &err);
	r->rc = rc;
	snprintf(r->msg, sizeof(r->msg), "%s", rc ? err.msg : "");
	if (store) {
		k3_store_stats_get(store, &r->st);
		uint64_t scored[K3_STORE_GUESS_RANKS], right[K3_STORE_GUESS_RANKS];
		k3_store_guess_table(store, K3_STORE_GUESS_PARTIAL, scored, right);
		for (int k = 0; k < K3_STORE_GUESS_RANKS; k++)
			r->partial_scored += scored[k];
		T_EQ_INT(ectx.n_held, 0);        /* the engine released all it acquired */
		T_EQ_INT(ectx.last_error, 0);
		k3_store_engine_src_release(&ectx);
	}
	k3_engine_free(e);
	k3_store_free(store);
	k3_store_source_free(src);
}

/* Distinct experts per (call chunk, MoE layer), summed: what the store
 * counts as demand accesses (one per expert per step). */
static uint64_t per_step(const struct result *r, uint32_t chunk)
{
	static bool seen[4096];
	uint64_t n = 0;

	for (uint32_t p0 = 0; p0 < NALL;) {
		uint32_t len = p0 < NTOK ? (NTOK - p0 < chunk ? NTOK - p0 : chunk) : 1;
		for (uint32_t mi = 0; mi < N_MOE; mi++) {
			memset(seen, 0, sizeof(seen));
			for (uint32_t p = p0; p < p0 + len; p++)
				for (uint32_t k = 0; k < K; k++) {
					uint32_t e = r->ids[(size_t)p * PER + mi * K + k];
					n += !seen[e];
					seen[e] = true;
				}
		}
		p0 += len;
	}
	return n;
}

/* Distinct (layer index in MoE order, expert) pairs routed in r. */
static uint64_t distinct(const struct result *r)
{
	static bool seen[64][4096];
	uint64_t n = 0;

	memset(seen, 0, sizeof(seen));
	for (size_t i = 0; i < (size_t)NALL * PER; i++) {
		uint32_t mi = (uint32_t)(i % PER) / K;
		if (!seen[mi][r->ids[i]]) {
			seen[mi][r->ids[i]] = true;
			n++;
		}
	}
	return n;
}

static void run_case(const char *name)
{
	char rel[256], path[600];
	struct k3_err err = { 0 };
	struct result ref, got;

	snprintf(rel, sizeof(rel), "golden/forward/%s/model", name);
	if (k3_model_open(t_shared_path(rel), &model, &err) != 0) {
		printf("model_open: %s\n", err.msg);
		T_OK(0);
		return;
	}
	const struct k3_model_config *cfg = k3_model_config(model);
	const struct k3_model_plan *plan = k3_model_plan(model);
	K = cfg->num_experts_per_token;
	N_MOE = cfg->n_moe;
	PER = N_MOE * K;
	V = cfg->vocab_size;

	/* Packs for every MoE layer, in a temp dir. */
	t_store_write_expert_packs(model, packdir);

	run(NULL, &ref);
	T_EQ_INT(ref.rc, 0);

	const struct variant vs[] = {
		{ false, "shards, unlimited, O_DIRECT auto, 2 threads", false, K3_STORE_DIRECT_AUTO, 2, 0, 64, K3_STORE_POLICY_FREQ, 0, false, 0, false },
		{ false, "shards, small, buffered, 1 thread", false, K3_STORE_DIRECT_OFF, 1, 2 * K, 2, K3_STORE_POLICY_LRU, 0, false, 0, false },
		{ false, "shards, floor, O_DIRECT auto, 2 threads", false, K3_STORE_DIRECT_AUTO, 2, K, 1, K3_STORE_POLICY_FREQ, 0, false, 0, false },
		{ false, "packs, unlimited, buffered, 1 thread", true, K3_STORE_DIRECT_OFF, 1, 0, 64, K3_STORE_POLICY_LRU, 0, false, 0, false },
		{ false, "packs, small, O_DIRECT auto, 2 threads", true, K3_STORE_DIRECT_AUTO, 2, 2 * K, 2, K3_STORE_POLICY_FREQ, 0, false, 0, false },
		{ false, "packs, floor, buffered, 2 threads", true, K3_STORE_DIRECT_OFF, 2, K, 1, K3_STORE_POLICY_LRU, 0, false, 0, false },
		{ true, "prefetch, shards, small, O_DIRECT auto, 2 threads", false, K3_STORE_DIRECT_AUTO, 2, 3 * K, 2, K3_STORE_POLICY_FREQ, 0, false, 0, false },
		{ true, "prefetch, packs, floor + 2, buffered, 1 thread", true, K3_STORE_DIRECT_OFF, 1, K + 2, 1, K3_STORE_POLICY_LRU, 0, false, 0, false },
		/* chunk of 64 through a floor cache: the engine groups positions */
		{ false, "packs, floor, chunk 64 (grouped), O_DIRECT auto, 2 threads", true, K3_STORE_DIRECT_AUTO, 2, K, 64, K3_STORE_POLICY_FREQ, 0, false, 0, false },
		{ false, "lookahead 16, shards, small, O_DIRECT auto, 2 threads", false, K3_STORE_DIRECT_AUTO, 2, 3 * K, 4, K3_STORE_POLICY_FREQ, 16, false, 0, false },
		{ false, "lookahead 4, packs, floor, buffered, 1 thread", true, K3_STORE_DIRECT_OFF, 1, K, 1, K3_STORE_POLICY_LRU, 4, false, 0, false },
		{ false, "lookahead 16, packs, unlimited, O_DIRECT auto, 2 threads", true, K3_STORE_DIRECT_AUTO, 2, 0, 64, K3_STORE_POLICY_FREQ, 16, false, 0, false },
		{ false, "per-expert, packs, small, buffered, 2 threads", true, K3_STORE_DIRECT_OFF, 2, 2 * K, 2, K3_STORE_POLICY_FREQ, 0, true, 0, false },
		/* --prefetch auto: every rank offered, the precision gate reads
		 * some (a low gate, so guesses are read on these tiny models) */
		{ false, "lookahead auto (gate 0.01), shards, small, O_DIRECT auto, 2 threads", false, K3_STORE_DIRECT_AUTO, 2, 3 * K, 1, K3_STORE_POLICY_FREQ, K, false, 0.01, false },
		{ false, "lookahead auto (gate 0.9), packs, floor, buffered, 1 thread", true, K3_STORE_DIRECT_OFF, 1, K, 1, K3_STORE_POLICY_FREQ, K, false, 0.9, false },
		/* the partial lookahead in every layer, prefill chunks and decode */
		{ false, "partial lookahead forced, lookahead 2, shards, small, O_DIRECT auto, 2 threads", false, K3_STORE_DIRECT_AUTO, 2, 3 * K, 4, K3_STORE_POLICY_FREQ, 2, false, 0, true },
		{ false, "partial lookahead forced, lookahead auto (gate 0.01), packs, unlimited, buffered, 1 thread", true, K3_STORE_DIRECT_OFF, 1, 0, 64, K3_STORE_POLICY_LRU, K, false, 0.01, true },
	};
	for (size_t i = 0; i < sizeof(vs) / sizeof(vs[0]); i++) {
		run(&vs[i], &got);
		if (got.rc)
			printf("%s %s: %s\n", name, vs[i].name, got.msg);
		T_EQ_INT(got.rc, 0);
		bool same = got.rc == 0 &&
			    memcmp(got.logits, ref.logits, (size_t)NALL * V * sizeof(float)) == 0 &&
			    memcmp(got.ids, ref.ids, (size_t)NALL * PER * sizeof(uint32_t)) == 0 &&
			    memcmp(got.w, ref.w, (size_t)NALL * PER * sizeof(float)) == 0 &&
			    memcmp(got.gen, ref.gen, sizeof(ref.gen)) == 0;
		if (!same)
			printf("%s %s: results differ from the mmapped tensors\n", name, vs[i].name);
		T_OK(same);
		/* Every routed expert was acquired (one demand access per expert
		 * per step) and nothing was prefetched. */
		if (vs[i].slots == 0 || vs[i].slots >= vs[i].chunk * K)
			T_EQ_U64(got.st.demand_hits + got.st.demand_misses, per_step(&ref, vs[i].chunk));
		else   /* grouped: a group is a step, so more steps than chunks */
			T_OK(got.st.demand_hits + got.st.demand_misses > per_step(&ref, vs[i].chunk));
		if (vs[i].gate >= 0.5) {
			/* the gate may keep every rank closed here */
			T_OK(got.st.prefetch_used + got.st.prefetch_late <= got.st.prefetch_issued);
			T_OK(got.st.guesses_scored > 0);
		} else if (vs[i].prefetch || vs[i].lookahead) {
			T_OK(got.st.prefetch_issued > 0);
			T_OK(got.st.prefetch_used + got.st.prefetch_late <= got.st.prefetch_issued);
		} else {
			T_EQ_U64(got.st.prefetch_issued, 0);
		}
		T_EQ_U64(got.st.bytes_read, got.st.demand_bytes + got.st.prefetch_issued_bytes);
		if (vs[i].partial_always)   /* decode guesses of experts not resident */
			T_OK(vs[i].slots == 0 || got.partial_scored > 0);
		else if (!vs[i].lookahead)
			T_EQ_U64(got.partial_scored, 0);
		if (vs[i].lookahead && vs[i].slots == 0)   /* unlimited: guesses only add reads */
			T_OK(got.st.reads >= distinct(&ref));
		else if (vs[i].slots == 0)   /* unlimited: each distinct expert read once */
			T_EQ_U64(got.st.reads, distinct(&ref));
		else
			T_OK(got.st.reads >= distinct(&ref));
		result_free(&got);
	}

	/* Below what one step pins: a clear error, never a computation. */
	{
		const struct variant below = { false, "below floor", false, K3_STORE_DIRECT_OFF, 2, K - 1, 1,
					       K3_STORE_POLICY_FREQ, 0, false, 0, false };
		run(&below, &got);
		T_EQ_INT(got.rc, -ENOSPC);
		T_OK(strstr(got.msg, "cannot hold") != NULL);
		result_free(&got);
	}
	result_free(&ref);
	for (uint32_t l = 0; l < plan->n_layers; l++) {
		k3_store_pack_path(path, sizeof(path), packdir, l);
		unlink(path);
	}
	k3_model_free(model);
	model = NULL;
}

int main(void)
{
	return t_golden_main(packdir, sizeof(packdir), "k3engpacks", run_case);
}

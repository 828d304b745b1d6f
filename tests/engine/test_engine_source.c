/*
 * test_engine_source.c - the expert-source contract the store relies on,
 * and the engine's error paths:
 *   - the engine acquires exactly the routed (layer, expert) pairs, one per
 *     position and slot, and releases every one; results through a custom
 *     source are bit-identical to the default (model tensors);
 *   - a streaming source that says its reads are still in flight gets the
 *     partial lookahead: the next MoE layer's top guesses while the layer
 *     is held, results unchanged;
 *   - a streaming source whose cache holds fewer experts than a chunk
 *     uses (max_experts) gets the chunk in groups of positions, each group
 *     requested and its experts computed as they arrive (never one
 *     acquire_layer), results unchanged;
 *   - a failing source fails the call with its code and message and
 *     poisons the sequence;
 *   - bad ids, empty calls and unknown providers are refused with messages.
 */
#include <errno.h>

#include "t.h"

#include "engine/engine.h"
#include "model/model.h"
#include "provider_registry.h"

struct counting {
	const struct k3_model *m;
	long acquired, released;
	uint32_t log_layer[4096], log_expert[4096];
	int fail_layer;              /* -1: never fail */
};

static int src_acquire(void *ctx, uint32_t layer, uint32_t expert, struct k3_prov_expert *out,
		       struct k3_err *err)
{
	struct counting *c = ctx;
	if ((int)layer == c->fail_layer)
		return k3_err_set(err, -EIO, "test source: layer %u unavailable", layer);
	const struct k3_expert *x = &k3_model_plan(c->m)->layers[layer].moe.experts[expert];
	if (c->acquired < 4096) {
		c->log_layer[c->acquired] = layer;
		c->log_expert[c->acquired] = expert;
	}
	c->acquired++;
	*out = (struct k3_prov_expert){ x->w1.packed->data, x->w1.scale->data, x->w3.packed->data,
					x->w3.scale->data, x->w2.packed->data, x->w2.scale->data };
	return 0;
}

static void src_release(void *ctx, uint32_t layer, uint32_t expert)
{
	(void)layer;
	(void)expert;
	((struct counting *)ctx)->released++;
}

/* A layer-wide source that hands the requested experts out one by one in
 * REVERSE order of first appearance (await_expert), as a store whose reads
 * finish out of order would: the results must not change. */
struct streaming {
	const struct k3_model *m;
	uint32_t layer, ids[64], distinct[64];
	size_t n, n_distinct, next;
	long requests, awaited, releases, acquires;
	bool held;
	/* would_block / prefetch, for the partial lookahead */
	bool block;                  /* what would_block answers */
	uint32_t n_experts, next_of[64];   /* next_of[layer] = next MoE layer */
	long asked, partial, late, bad_partial;
};

static struct k3_prov_expert span_of(const struct k3_model *m, uint32_t layer, uint32_t expert)
{
	const struct k3_expert *x = &k3_model_plan(m)->layers[layer].moe.experts[expert];
	return (struct k3_prov_expert){ x->w1.packed->data, x->w1.scale->data, x->w3.packed->data,
					x->w3.scale->data, x->w2.packed->data, x->w2.scale->data };
}

static int st_request(void *ctx, uint32_t layer, const uint32_t *ids, size_t n, struct k3_err *err)
{
	struct streaming *c = ctx;
	if (c->held || n > 64)
		return k3_err_set(err, -EBUSY, "test source: busy or too many");
	c->layer = layer;
	c->n = n;
	c->n_distinct = 0;
	for (size_t i = 0; i < n; i++) {
		bool seen = false;
		for (size_t j = 0; j < c->n_distinct; j++)
			seen |= c->distinct[j] == ids[i];
		if (!seen)
			c->distinct[c->n_distinct++] = ids[i];
		c->ids[i] = ids[i];
	}
	c->next = 0;
	c->held = true;
	c->requests++;
	return 0;
}

static int st_acquire_layer(void *ctx, uint32_t layer, const uint32_t *ids, size_t n,
			    struct k3_prov_expert *out, struct k3_err *err)
{
	struct streaming *c = ctx;
	(void)err;
	for (size_t i = 0; i < n; i++)
		out[i] = span_of(c->m, layer, ids[i]);
	c->held = true;
	c->acquires++;
	return 0;
}

static int st_await(void *ctx, uint32_t layer, uint32_t *expert, struct k3_prov_expert *out,
		    struct k3_err *err)
{
	struct streaming *c = ctx;
	if (!c->held || layer != c->layer)
		return k3_err_set(err, -EINVAL, "test source: await without request");
	if (c->next == c->n_distinct)
		return 0;
	*expert = c->distinct[c->n_distinct - 1 - c->next++];
	*out = span_of(c->m, layer, *expert);
	c->awaited++;
	return 1;
}

static bool st_would_block(void *ctx, uint32_t layer)
{
	struct streaming *c = ctx;
	(void)layer;
	c->asked++;
	return c->block;
}

/* Partial lookahead guesses come while a layer is held, for the next MoE
 * layer, ranks 0..1, ids in range, each once; the others after it. */
static void st_prefetch(void *ctx, uint32_t layer, const uint32_t *ids, const uint32_t *ranks,
			size_t n, uint32_t positions, bool partial)
{
	struct streaming *c = ctx;
	if (!partial) {
		c->late++;
		c->bad_partial += c->held;
		return;
	}
	c->partial++;
	bool ok = c->held && layer == c->next_of[c->layer] && n > 0 &&
		  n <= 2 * (size_t)positions;
	for (size_t i = 0; i < n; i++) {
		ok &= ids[i] < c->n_experts && ranks[i] < 2;
		for (size_t j = 0; j < i; j++)
			ok &= ids[j] != ids[i];
	}
	c->bad_partial += !ok;
}

static void st_release_layer(void *ctx, uint32_t layer)
{
	struct streaming *c = ctx;
	(void)layer;
	c->held = false;
	c->releases++;
}

/* Two forward outputs agree to the bit: V logits, n route ids and weights. */
static void same_bits(const float *l1, const uint32_t *r1, const float *w1, const float *l2, const uint32_t *r2,
		      const float *w2, size_t V, size_t n)
{
	T_OK(memcmp(l1, l2, V * sizeof(float)) == 0);
	T_OK(memcmp(r1, r2, n * sizeof(uint32_t)) == 0);
	T_OK(memcmp(w1, w2, n * sizeof(float)) == 0);
}

/* ids through a fresh sequence of e that reads its experts from ss, into o
 * (its V logits zeroed first); the sequence is the caller's to free. */
static struct k3_engine_seq *forward_from(struct k3_engine *e, const struct k3_expert_source *ss,
					  const int32_t *ids, uint32_t T, const struct k3_engine_out *o,
					  size_t V)
{
	struct k3_err err = { 0 };
	struct k3_engine_seq *s = NULL;

	memset(o->logits, 0, V * sizeof(float));
	T_OK(k3_engine_seq_new(e, 16, &s, &err) == 0);
	k3_engine_set_expert_source(e, ss);
	T_OK(k3_engine_forward(e, s, ids, T, o, &err) == 0);
	return s;
}

int main(void)
{
	struct k3_err err = { 0 };
	struct k3_model *model = NULL;
	struct k3_engine *e = NULL;
	struct k3_engine_seq *s = NULL, *s2 = NULL;

	T_OK(k3_provider_find("nope", &err) == NULL);
	T_EQ_INT(err.code, -ENOENT);
	T_OK(strstr(err.msg, "'nope'") && strstr(err.msg, "cpu"));
	T_OK(k3_provider_find("cpu", &err) != NULL);

	if (!T_OK(k3_model_open(t_shared_path("golden/forward/k3tiny_a/model"), &model, &err) == 0)) {
		printf("     %s\n", err.msg);
		return t_done();
	}
	struct k3_engine_opts o = { .threads = 1, .max_chunk = 4 };
	T_OK(k3_engine_open(model, &o, &e, &err) == 0);
	T_OK(k3_engine_seq_new(e, 16, &s, &err) == 0);
	T_OK(k3_engine_seq_new(e, 16, &s2, &err) == 0);
	uint32_t V = k3_engine_vocab(e), K = k3_engine_top_k(e), nm = k3_engine_n_moe(e);
	const uint32_t *ml = k3_engine_moe_layers(e);
	enum { T = 6 };
	const int32_t ids[T] = { 5, 231, 232, 165, 64, 57 };
	float *l1 = calloc((size_t)V, sizeof(float)), *l2 = calloc((size_t)V, sizeof(float));
	uint32_t *r1 = calloc((size_t)T * nm * K, sizeof(uint32_t)), *r2 = calloc((size_t)T * nm * K, sizeof(uint32_t));
	float *w1 = calloc((size_t)T * nm * K, sizeof(float)), *w2 = calloc((size_t)T * nm * K, sizeof(float));

	/* default source */
	struct k3_engine_out o1 = { K3_ENGINE_LOGITS_LAST, l1, r1, w1 };
	T_OK(k3_engine_forward(e, s, ids, T, &o1, &err) == 0);

	/* counting source: same bits; exactly the routed pairs, in order */
	struct counting c = { .m = model, .fail_layer = -1 };
	struct k3_expert_source src = { .ctx = &c, .acquire = src_acquire, .release = src_release };
	k3_engine_set_expert_source(e, &src);
	struct k3_engine_out o2 = { K3_ENGINE_LOGITS_LAST, l2, r2, w2 };
	T_OK(k3_engine_forward(e, s2, ids, T, &o2, &err) == 0);
	same_bits(l1, r1, w1, l2, r2, w2, V, (size_t)T * nm * K);
	T_EQ_INT(c.acquired, (long)T * nm * K);
	T_EQ_INT(c.released, c.acquired);
	/* chunks of 4 then 2 positions; within a chunk, layer by layer,
	 * position-major slots */
	long i = 0;
	bool order_ok = true;
	for (uint32_t c0 = 0; c0 < T; c0 += 4) {
		uint32_t n = T - c0 < 4 ? T - c0 : 4;
		for (uint32_t mi = 0; mi < nm; mi++)
			for (uint32_t t = c0; t < c0 + n; t++)
				for (uint32_t k = 0; k < K; k++, i++)
					order_ok &= c.log_layer[i] == ml[mi] &&
						    c.log_expert[i] == r2[((size_t)t * nm + mi) * K + k];
	}
	T_OK(order_ok);

	/* streaming source, experts computed in reverse arrival order: same
	 * bits (the provider sums in route order whatever the order) */
	{
		struct k3_engine_seq *s3;
		struct streaming sc = { .m = model };
		struct k3_expert_source ss = { .ctx = &sc, .acquire = src_acquire,
					       .release = src_release,
					       .acquire_layer = st_acquire_layer,
					       .release_layer = st_release_layer,
					       .request_layer = st_request, .await_expert = st_await };
		float *l3 = calloc((size_t)V, sizeof(float));
		uint32_t *r3 = calloc((size_t)T * nm * K, sizeof(uint32_t));
		float *w3 = calloc((size_t)T * nm * K, sizeof(float));
		struct k3_engine_out o4 = { K3_ENGINE_LOGITS_LAST, l3, r3, w3 };
		s3 = forward_from(e, &ss, ids, T, &o4, V);
		same_bits(l1, r1, w1, l3, r3, w3, V, (size_t)T * nm * K);
		T_EQ_INT(sc.requests, 2 * (long)nm);   /* chunks of 4 and 2 */
		T_EQ_INT(sc.releases, sc.requests);
		T_OK(sc.awaited > 0 && sc.awaited <= (long)T * nm * K);
		T_OK(!sc.held);
		/* the same with prefetch: the partial lookahead runs in every MoE
		 * layer but the last when the reads are "in flight", never when
		 * they are ready, and changes no bit */
		for (uint32_t mi = 0; mi + 1 < nm; mi++)
			sc.next_of[ml[mi]] = ml[mi + 1];
		sc.next_of[ml[nm - 1]] = UINT32_MAX;
		sc.n_experts = k3_model_config(model)->num_experts;
		ss.would_block = st_would_block;
		ss.prefetch = st_prefetch;
		for (int block = 0; block < 2; block++) {
			struct k3_engine_seq *s4;
			sc.block = block;
			sc.asked = sc.partial = sc.late = sc.bad_partial = 0;
			s4 = forward_from(e, &ss, ids, T, &o4, V);
			same_bits(l1, r1, w1, l3, r3, w3, V, (size_t)T * nm * K);
			T_OK(sc.asked > 0);
			/* two chunks; per chunk one partial lookahead per MoE layer
			 * but the last, and nm late ones (embedding + after each) */
			T_EQ_INT(sc.partial, block ? 2 * (long)(nm - 1) : 0);
			T_EQ_INT(sc.late, 2 * (long)nm);
			T_EQ_INT(sc.bad_partial, 0);
			T_OK(!sc.held);
			k3_engine_seq_free(s4);
		}
		/* a cache of top_k experts: groups of positions, each requested
		 * and awaited, the same bits */
		{
			struct k3_engine_seq *s5;
			ss.would_block = NULL;
			ss.prefetch = NULL;
			ss.max_experts = K;
			sc.requests = sc.releases = sc.acquires = sc.awaited = 0;
			s5 = forward_from(e, &ss, ids, T, &o4, V);
			same_bits(l1, r1, w1, l3, r3, w3, V, (size_t)T * nm * K);
			T_OK(sc.requests > 2 * (long)nm);    /* more than one group a chunk */
			T_EQ_INT(sc.acquires, 0);
			T_EQ_INT(sc.releases, sc.requests);
			T_OK(!sc.held);
			k3_engine_seq_free(s5);
		}
		k3_engine_set_expert_source(e, &src);   /* the counting source again */
		k3_engine_seq_free(s3);
		free(l3); free(r3); free(w3);
	}

	/* a failing source: its error, then the sequence is poisoned */
	c.fail_layer = (int)ml[nm - 1];
	c.acquired = c.released = 0;
	int32_t tok = 7;
	struct k3_engine_out o3 = { K3_ENGINE_LOGITS_LAST, l2, NULL, NULL };
	T_EQ_INT(k3_engine_forward(e, s2, &tok, 1, &o3, &err), -EIO);
	T_OK(strstr(err.msg, "unavailable") != NULL);
	T_EQ_INT(c.released, c.acquired);
	T_EQ_INT(k3_engine_forward(e, s2, &tok, 1, &o3, &err), -EINVAL);
	T_OK(strstr(err.msg, "failed earlier") != NULL);
	k3_engine_set_expert_source(e, NULL);

	/* bad input is refused before any state changes */
	uint32_t len = k3_engine_seq_len(s);
	int32_t bad = (int32_t)V;
	T_EQ_INT(k3_engine_forward(e, s, &bad, 1, &o3, &err), -EINVAL);
	T_OK(strstr(err.msg, "not in 0..") != NULL);
	T_EQ_INT(k3_engine_forward(e, s, ids, 0, &o3, &err), -EINVAL);
	T_EQ_INT(k3_engine_seq_len(s), len);
	T_OK(k3_engine_forward(e, s, &tok, 1, &o3, &err) == 0);   /* still usable */
	T_EQ_INT(k3_engine_seq_len(s), len + 1);
	T_EQ_INT(k3_engine_argmax((const float[]){ 1.0f, 3.0f, 3.0f, 2.0f }, 4), 1);

	free(l1); free(l2); free(r1); free(r2); free(w1); free(w2);
	k3_engine_seq_free(s);
	k3_engine_seq_free(s2);
	k3_engine_free(e);
	k3_model_free(model);
	return t_done();
}

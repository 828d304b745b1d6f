/*
 * draft_test.c - the oracle and random test drafts (see draft_test.h).
 */
#include "draft/draft_test.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct oracle {
	struct k3_draft base;
	uint32_t *truth;
	size_t n;
	uint32_t vocab;
	uint64_t spoil_below;        /* a position is spoiled when its hash < this */
	uint64_t seed;
};

static uint64_t mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

static int oracle_propose(struct k3_draft *d, const uint32_t *ctx, size_t n, uint32_t max,
			  uint32_t *out, struct k3_err *err)
{
	struct oracle *o = (struct oracle *)d;
	(void)err;
	if (n > o->n || memcmp(ctx, o->truth, n * sizeof(uint32_t)) != 0)
		return 0;
	uint32_t r = 0;
	for (; r < max && n + r < o->n; r++) {
		size_t pos = n + r;
		uint32_t id = o->truth[pos];
		if (o->spoil_below && mix(o->seed ^ mix(pos)) < o->spoil_below)
			id = (id + 1) % o->vocab;
		out[r] = id;
	}
	return (int)r;
}

static void oracle_free(struct k3_draft *d)
{
	struct oracle *o = (struct oracle *)d;
	free(o->truth);
	free(o);
}

static const struct k3_draft_ops oracle_ops = {
	.name = "oracle",
	.propose = oracle_propose,
	.free = oracle_free,
};

int k3_draft_oracle_new(const uint32_t *truth, size_t n, uint32_t vocab, double spoil,
			uint64_t seed, struct k3_draft **out, struct k3_err *err)
{
	if (!(spoil >= 0.0 && spoil <= 1.0) || vocab < 2)
		return k3_err_set(err, -EINVAL, "oracle draft: spoil %g not in [0, 1] or vocab %u < 2",
				  spoil, vocab);
	struct oracle *o = calloc(1, sizeof(*o));
	if (!o || !(o->truth = malloc((n ? n : 1) * sizeof(uint32_t)))) {
		free(o);
		return k3_err_set(err, -ENOMEM, "out of memory");
	}
	memcpy(o->truth, truth, n * sizeof(uint32_t));
	o->base.ops = &oracle_ops;
	o->base.max_block = UINT32_MAX;
	o->n = n;
	o->vocab = vocab;
	o->seed = seed;
	/* spoil of the 2^64 hash range; 1.0 maps to every position */
	o->spoil_below = spoil >= 1.0 ? UINT64_MAX : (uint64_t)(spoil * 18446744073709551616.0);
	*out = &o->base;
	return 0;
}

struct rnd {
	struct k3_draft base;
	uint32_t vocab;
	uint64_t state;
};

static int random_propose(struct k3_draft *d, const uint32_t *ctx, size_t n, uint32_t max,
			  uint32_t *out, struct k3_err *err)
{
	struct rnd *r = (struct rnd *)d;
	(void)ctx;
	(void)n;
	(void)err;
	for (uint32_t i = 0; i < max; i++)
		out[i] = (uint32_t)(mix(r->state++) % r->vocab);
	return (int)max;
}

static void random_free(struct k3_draft *d)
{
	free(d);
}

static const struct k3_draft_ops random_ops = {
	.name = "random",
	.propose = random_propose,
	.free = random_free,
};

int k3_draft_random_new(uint32_t vocab, uint64_t seed, struct k3_draft **out, struct k3_err *err)
{
	if (vocab < 1)
		return k3_err_set(err, -EINVAL, "random draft: empty vocabulary");
	struct rnd *r = calloc(1, sizeof(*r));
	if (!r)
		return k3_err_set(err, -ENOMEM, "out of memory");
	r->base.ops = &random_ops;
	r->base.max_block = UINT32_MAX;
	r->vocab = vocab;
	r->state = mix(seed);
	*out = &r->base;
	return 0;
}

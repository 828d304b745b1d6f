/*
 * draft_ngram.c - suffix matching over the context (see draft_ngram.h).
 *
 * One open-addressed table maps (n, the n ids ending at position i) to the
 * latest such i. Before a proposal every position but the anchor's is
 * indexed, so a lookup of the suffix ending at the anchor finds its most
 * recent EARLIER occurrence; the proposal copies what followed it, reading
 * its own proposals once it runs past the context (a period shorter than
 * the proposal repeats, as a loop in the output would).
 */
#include "draft/draft_ngram.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

enum { NGRAM_MAX_N = 8 };

struct ngram {
	struct k3_draft base;
	uint32_t min_n, max_n;
	size_t indexed;              /* positions 0..indexed-1 are in the table */
	uint64_t *keys;              /* 0 = empty slot */
	uint32_t *pos;
	size_t cap, used;            /* cap: a power of two */
};

static uint64_t key_of(const uint32_t *ids, uint32_t n)
{
	uint64_t h = 0xcbf29ce484222325ull ^ n;
	for (uint32_t i = 0; i < n; i++) {
		h ^= ids[i];
		h *= 0x100000001b3ull;
		h ^= h >> 29;
	}
	return h | 1;                /* never the empty key */
}

static size_t slot_of(const struct ngram *g, uint64_t key)
{
	size_t i = (size_t)(key * 0x9e3779b97f4a7c15ull >> 17) & (g->cap - 1);
	while (g->keys[i] && g->keys[i] != key)
		i = (i + 1) & (g->cap - 1);
	return i;
}

static int grow(struct ngram *g)
{
	size_t ncap = g->cap ? g->cap * 2 : 1024;
	uint64_t *ok = g->keys;
	uint32_t *op = g->pos;
	size_t ocap = g->cap;

	g->keys = calloc(ncap, sizeof(*g->keys));
	g->pos = malloc(ncap * sizeof(*g->pos));
	if (!g->keys || !g->pos) {
		free(g->keys);
		free(g->pos);
		g->keys = ok;
		g->pos = op;
		return -ENOMEM;
	}
	g->cap = ncap;
	for (size_t i = 0; i < ocap; i++)
		if (ok[i]) {
			size_t s = slot_of(g, ok[i]);
			g->keys[s] = ok[i];
			g->pos[s] = op[i];
		}
	free(ok);
	free(op);
	return 0;
}

/* Records every n-gram ending at position i. */
static int index_pos(struct ngram *g, const uint32_t *ctx, size_t i)
{
	for (uint32_t n = g->min_n; n <= g->max_n && n <= i + 1; n++) {
		if (2 * (g->used + 1) > g->cap && grow(g) < 0)
			return -ENOMEM;
		uint64_t key = key_of(ctx + i + 1 - n, n);
		size_t s = slot_of(g, key);
		if (!g->keys[s]) {
			g->keys[s] = key;
			g->used++;
		}
		g->pos[s] = (uint32_t)i;
	}
	return 0;
}

static void ngram_reset(struct k3_draft *d)
{
	struct ngram *g = (struct ngram *)d;
	if (g->keys)
		memset(g->keys, 0, g->cap * sizeof(*g->keys));
	g->used = 0;
	g->indexed = 0;
}

static int ngram_propose(struct k3_draft *d, const uint32_t *ctx, size_t n, uint32_t max,
			 uint32_t *out, struct k3_err *err)
{
	struct ngram *g = (struct ngram *)d;

	if (n < g->indexed + 1 || n > UINT32_MAX)
		ngram_reset(d);      /* not an extension of the last context: a new one */
	for (; g->indexed + 1 < n; g->indexed++)
		if (index_pos(g, ctx, g->indexed) < 0)
			return k3_err_set(err, -ENOMEM, "n-gram draft: out of memory for %zu positions", n);
	/* longest recurring suffix first */
	for (uint32_t k = g->max_n < n - 1 ? g->max_n : (uint32_t)(n - 1); k >= g->min_n && k > 0; k--) {
		const uint32_t *suf = ctx + n - k;
		uint64_t key = key_of(suf, k);
		size_t s = slot_of(g, key);
		if (!g->keys[s])
			continue;
		size_t p = g->pos[s];    /* <= n - 2: the anchor's end is not indexed yet */
		if (memcmp(ctx + p + 1 - k, suf, k * sizeof(uint32_t)) != 0)
			continue;        /* a hash collision */
		for (uint32_t j = 0; j < max; j++) {
			size_t x = p + 1 + j;
			out[j] = x < n ? ctx[x] : out[x - n];
		}
		return (int)max;
	}
	return 0;
}

static void ngram_free(struct k3_draft *d)
{
	struct ngram *g = (struct ngram *)d;
	free(g->keys);
	free(g->pos);
	free(g);
}

static const struct k3_draft_ops ngram_ops = {
	.name = "ngram",
	.propose = ngram_propose,
	.reset = ngram_reset,
	.free = ngram_free,
};

int k3_draft_ngram_new(const struct k3_draft_ngram_opts *o, struct k3_draft **out,
		       struct k3_err *err)
{
	uint32_t min_n = o && o->min_n ? o->min_n : 2, max_n = o && o->max_n ? o->max_n : 4;

	if (min_n > max_n || max_n > NGRAM_MAX_N)
		return k3_err_set(err, -EINVAL, "n-gram draft: n from %u to %u (1 <= min <= max <= %d)",
				  min_n, max_n, NGRAM_MAX_N);
	struct ngram *g = calloc(1, sizeof(*g));
	if (!g)
		return k3_err_set(err, -ENOMEM, "out of memory");
	g->base.ops = &ngram_ops;
	g->base.max_block = UINT32_MAX;
	g->min_n = min_n;
	g->max_n = max_n;
	*out = &g->base;
	return 0;
}

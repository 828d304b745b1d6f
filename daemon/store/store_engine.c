/* store_engine.c - the store as the engine's expert source (see store_engine.h). */
#include "store/store_engine.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/array.h"

static int src_acquire(void *vctx, uint32_t layer, uint32_t expert,
		       struct k3_prov_expert *out, struct k3_err *err)
{
	struct k3_store_engine_src *c = vctx;
	struct k3_store_view v;
	int rc;

	if (k3_array_reserve(&c->held, &c->cap_held, c->n_held + 1, sizeof(*c->held), 64))
		return k3_err_set(err, -ENOMEM, "out of memory");
	if (c->n_held == 0 || layer != c->layer) {
		k3_store_step_begin(c->store);
		c->layer = layer;
	}
	rc = k3_store_acquire(c->store, layer, &expert, 1, &v, err);
	if (rc)
		return rc;
	c->held[c->n_held++] = v;
	out->w1_packed = v.array[K3_STORE_W1_PACKED];
	out->w1_scale = v.array[K3_STORE_W1_SCALE];
	out->w2_packed = v.array[K3_STORE_W2_PACKED];
	out->w2_scale = v.array[K3_STORE_W2_SCALE];
	out->w3_packed = v.array[K3_STORE_W3_PACKED];
	out->w3_scale = v.array[K3_STORE_W3_SCALE];
	return 0;
}

static void src_release(void *vctx, uint32_t layer, uint32_t expert)
{
	struct k3_store_engine_src *c = vctx;

	/* Most recent first: the engine releases in acquisition order, and
	 * duplicates are interchangeable (same slot). */
	for (size_t i = c->n_held; i-- > 0;) {
		if (c->held[i].layer == layer && c->held[i].expert == expert) {
			k3_store_release(c->store, &c->held[i], 1);
			c->held[i] = c->held[--c->n_held];
			return;
		}
	}
	if (!c->last_error)
		c->last_error = -ENOENT;
}

static int grow_layer_views(struct k3_store_engine_src *c, size_t n, struct k3_err *err)
{
	if (n > c->cap_layer_views) {
		struct k3_store_view *nv = realloc(c->layer_views, n * sizeof(*nv));
		if (!nv)
			return k3_err_set(err, -ENOMEM, "out of memory");
		c->layer_views = nv;
		c->cap_layer_views = n;
	}
	return 0;
}

static void fill_spans(const struct k3_store_view *views, size_t n, struct k3_prov_expert *out)
{
	for (size_t i = 0; i < n; i++) {
		const struct k3_store_view *v = &views[i];
		out[i].w1_packed = v->array[K3_STORE_W1_PACKED];
		out[i].w1_scale = v->array[K3_STORE_W1_SCALE];
		out[i].w2_packed = v->array[K3_STORE_W2_PACKED];
		out[i].w2_scale = v->array[K3_STORE_W2_SCALE];
		out[i].w3_packed = v->array[K3_STORE_W3_PACKED];
		out[i].w3_scale = v->array[K3_STORE_W3_SCALE];
	}
}

static int src_request_layer(void *vctx, uint32_t layer, const uint32_t *ids, size_t n,
			     struct k3_err *err)
{
	struct k3_store_engine_src *c = vctx;
	int rc;

	if (c->n_layer_views || c->n_requested)
		return k3_err_set(err, -EBUSY, "layer %u requested while layer %u is still held",
				  layer, c->layer);
	if (n == 0)
		return 0;
	rc = grow_layer_views(c, n, err);
	if (rc)
		return rc;
	if (n > c->cap_req_ids) {
		uint32_t *ni = realloc(c->req_ids, n * sizeof(*ni));
		if (!ni)
			return k3_err_set(err, -ENOMEM, "out of memory");
		c->req_ids = ni;
		uint8_t *nt = realloc(c->taken, n);
		if (!nt)
			return k3_err_set(err, -ENOMEM, "out of memory");
		c->taken = nt;
		c->cap_req_ids = n;
	}
	k3_store_step_begin(c->store);
	c->layer = layer;
	rc = k3_store_request(c->store, layer, ids, n, c->layer_views, err);
	if (rc)
		return rc;
	memcpy(c->req_ids, ids, n * sizeof(*ids));
	c->n_requested = n;
	return 0;
}

static int src_acquire_layer(void *vctx, uint32_t layer, const uint32_t *ids, size_t n,
			     struct k3_prov_expert *out, struct k3_err *err)
{
	struct k3_store_engine_src *c = vctx;
	int rc;

	if (c->n_requested) {
		size_t nr = c->n_requested;
		c->n_requested = 0;
		if (layer == c->layer && n == nr && memcmp(ids, c->req_ids, n * sizeof(*ids)) == 0) {
			rc = k3_store_wait(c->store, c->layer_views, n, err);
			if (rc)
				return rc;
			c->n_layer_views = n;
			fill_spans(c->layer_views, n, out);
			return 0;
		}
		/* Not what was requested (a caller outside the engine's
		 * order): give the request up and acquire afresh. */
		k3_store_request_abort(c->store, c->layer_views, nr);
	}
	if (c->n_layer_views)
		return k3_err_set(err, -EBUSY, "layer %u acquired while layer %u is still held",
				  layer, c->layer);
	rc = grow_layer_views(c, n, err);
	if (rc)
		return rc;
	k3_store_step_begin(c->store);
	c->layer = layer;
	rc = k3_store_acquire(c->store, layer, ids, n, c->layer_views, err);
	if (rc)
		return rc;
	c->n_layer_views = n;
	fill_spans(c->layer_views, n, out);
	return 0;
}

/* The first await_expert or would_block after request_layer: the request's
 * views become the layer's, none taken yet. */
static void start_await(struct k3_store_engine_src *c)
{
	if (c->n_requested) {
		c->n_layer_views = c->n_requested;
		c->n_requested = 0;
		memset(c->taken, 0, c->n_layer_views);
	}
}

static int src_await_expert(void *vctx, uint32_t layer, uint32_t *expert,
			    struct k3_prov_expert *out, struct k3_err *err)
{
	struct k3_store_engine_src *c = vctx;
	size_t k;
	int rc;

	if (c->n_requested && layer != c->layer)
		return k3_err_set(err, -EINVAL, "layer %u awaited, layer %u requested",
				  layer, c->layer);
	start_await(c);
	if (c->n_layer_views == 0)
		return 0;
	rc = k3_store_wait_any(c->store, c->layer_views, c->n_layer_views, c->taken, &k, err);
	if (rc < 0) {
		c->n_layer_views = 0;   /* wait_any unpinned the request */
		return rc;
	}
	if (rc == 0)
		return 0;
	*expert = c->layer_views[k].expert;
	fill_spans(&c->layer_views[k], 1, out);
	return 1;
}

static bool src_would_block(void *vctx, uint32_t layer)
{
	struct k3_store_engine_src *c = vctx;

	if (layer != c->layer)
		return false;
	start_await(c);
	return k3_store_would_block(c->store, c->layer_views, c->n_layer_views, c->taken);
}

static void src_release_layer(void *vctx, uint32_t layer)
{
	struct k3_store_engine_src *c = vctx;

	if (layer != c->layer && !c->last_error)
		c->last_error = -ENOENT;
	if (c->n_requested) {   /* requested, never acquired (an error in between) */
		k3_store_request_abort(c->store, c->layer_views, c->n_requested);
		c->n_requested = 0;
	}
	k3_store_release(c->store, c->layer_views, c->n_layer_views);
	c->n_layer_views = 0;
}

static void src_prefetch(void *vctx, uint32_t layer, const uint32_t *ids, const uint32_t *ranks,
			 size_t n, uint32_t positions, bool partial)
{
	struct k3_store_engine_src *c = vctx;

	/* Only one-position lookaheads score the guesses: a chunk's guesses
	 * meet the union of its positions' routes, which would flatter the
	 * precision that decode (one position) gets. */
	c->guesses += n;
	c->guesses_queued += k3_store_prefetch_ranked(c->store, layer, ids, ranks, n, positions == 1,
						      partial ? K3_STORE_GUESS_PARTIAL
							      : K3_STORE_GUESS_AFTER);
}

void k3_store_engine_src_set_prefetch(struct k3_store_engine_src *ctx, uint32_t per_position,
				      struct k3_expert_source *out)
{
	(void)ctx;
	out->prefetch = per_position ? src_prefetch : NULL;
	out->prefetch_max = per_position;
}

void k3_store_engine_src_init(struct k3_store_engine_src *ctx, struct k3_store *store,
			      struct k3_expert_source *out)
{
	memset(ctx, 0, sizeof(*ctx));
	ctx->store = store;
	struct k3_store_info info;
	k3_store_info_get(store, &info);
	*out = (struct k3_expert_source){ .ctx = ctx, .acquire = src_acquire,
					  .release = src_release,
					  .acquire_layer = src_acquire_layer,
					  .release_layer = src_release_layer,
					  .request_layer = src_request_layer,
					  .await_expert = src_await_expert,
					  .would_block = src_would_block,
					  .max_experts = info.n_slots };
}

void k3_store_engine_src_release(struct k3_store_engine_src *ctx)
{
	free(ctx->held);
	ctx->held = NULL;
	free(ctx->layer_views);
	ctx->layer_views = NULL;
	free(ctx->req_ids);
	ctx->req_ids = NULL;
	free(ctx->taken);
	ctx->taken = NULL;
	ctx->n_requested = ctx->cap_req_ids = 0;
	ctx->n_layer_views = ctx->cap_layer_views = 0;
	ctx->n_held = ctx->cap_held = 0;
}

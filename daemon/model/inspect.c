/* inspect.c - bytes by role and RAM fit (see inspect.h). */
#include "model/inspect.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The counter of *b a tensor's bytes belong to (name: stored, with the
 * checkpoint's prefix). */
static uint64_t *counter_of(struct k3_model_bytes *b, const struct k3_model_config *c,
			    const char *name)
{
	const char *pre = c->has_language_model_prefix ? "language_model." : "";
	size_t pl = strlen(pre);

	if (strncmp(name, pre, pl) != 0)
		return &b->other;
	name += pl;
	if (strcmp(name, "model.embed_tokens.weight") == 0)
		return &b->embed;
	if (strcmp(name, "lm_head.weight") == 0 || strcmp(name, "lm_head.weight_i8") == 0)
		return &b->lm_head;
	if (strncmp(name, "model.layers.", 13) == 0) {
		char *end;
		unsigned long l = strtoul(name + 13, &end, 10);
		if (end == name + 13 || *end != '.' || l >= c->num_hidden_layers)
			return &b->other;   /* MTP layers and anything past L */
		struct k3_layer_bytes *y = &b->layer[l];
		const char *role = end + 1;
		if (strncmp(role, "block_sparse_moe.experts.", 25) == 0)
			return &y->experts;
		if (strncmp(role, "block_sparse_moe.", 17) == 0)
			return &y->moe_spine;
		if (strncmp(role, "self_attn.", 10) == 0)
			return &y->attn;
		if (strncmp(role, "mlp.", 4) == 0)
			return &y->mlp;
		return &y->norms;
	}
	return strncmp(name, "model.", 6) == 0 ? &b->final : &b->other;
}

void k3_model_bytes(const struct k3_model *m, struct k3_model_bytes *b)
{
	const struct k3_model_config *c = k3_model_config(m);
	const struct k3_model_plan *p = k3_model_plan(m);
	struct k3_model_int8_info i8;
	size_t n;
	const struct k3_tensor *t = k3_model_tensors(m, &n);

	memset(b, 0, sizeof(*b));
	b->n_layers = c->num_hidden_layers;
	for (size_t i = 0; i < n; i++) {
		*counter_of(b, c, t[i].name) += t[i].nbytes;
		b->total += t[i].nbytes;
	}
	/* An int8 spine runs (and its loader holds) I8 rows and their scales in
	 * place of each BF16 matrix it replaces: its role weighs those. */
	k3_model_int8_info_get(m, &i8);
	if (i8.on) {
		size_t nv = 0;
		const struct k3_tensor *v = k3_model_int8_views(m, &nv);
		for (size_t i = 0; i < nv; i++) {
			uint64_t bf16 = v[i].shape[0] * v[i].shape[1] * 2;
			uint64_t *ctr = counter_of(b, c, v[i].name);
			*ctr = *ctr - bf16 + v[i].nbytes;
			b->total = b->total - bf16 + v[i].nbytes;
		}
	}
	for (uint32_t l = 0; l < p->n_layers; l++) {
		struct k3_layer_bytes *y = &b->layer[l];
		const struct k3_layer_plan *lp = &p->layers[l];
		b->experts += y->experts;
		if (lp->is_moe) {
			y->n_experts = lp->moe.n_experts;
			for (uint32_t e = 0; e < lp->moe.n_experts; e++)
				if (lp->moe.experts[e].payload_bytes > y->expert_span)
					y->expert_span = lp->moe.experts[e].payload_bytes;
		}
		if (y->expert_span > b->expert_span)
			b->expert_span = y->expert_span;
	}
	b->spine = b->total - b->experts - b->other;
}

void k3_model_fit(const struct k3_model_bytes *b, uint64_t ram, struct k3_model_fit *f)
{
	memset(f, 0, sizeof(*f));
	f->ram = ram;
	for (uint32_t l = 0; l < b->n_layers; l++)
		f->expert_pool += b->layer[l].n_experts;
	f->spine_fits = b->spine <= ram;
	if (f->spine_fits && b->expert_span) {
		f->expert_slots = (ram - b->spine) / b->expert_span;
		if (f->expert_slots > f->expert_pool)
			f->expert_slots = f->expert_pool;
	}
	f->pool_fraction = f->expert_pool ? (double)f->expert_slots / (double)f->expert_pool : 0.0;
}

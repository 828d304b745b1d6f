/*
 * fuzz_safetensors.c - the checkpoint parsers on hostile bytes. The first
 * byte picks the parser (mod 3), the rest is its input:
 *   0: a whole safetensors shard (8-byte length, JSON header, data);
 *   1: model.safetensors.index.json;
 *   2: config.json.
 * Properties: no crash, no read outside the input, and every accepted
 * shard header is sound: each payload lies inside the data section, its
 * length equals dtype size x shape, and no two payloads overlap.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "model/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int cmp_begin(const void *a, const void *b)
{
	const struct k3_st_entry *x = a, *y = b;

	return x->begin < y->begin ? -1 : x->begin > y->begin;
}

static void shard(const uint8_t *p, size_t n)
{
	uint64_t hl;
	struct k3_st_header h;

	if (k3_st_parse_prefix(p, n, n, "fuzz", &hl, NULL))
		return;
	if (hl > n - 8)
		abort();
	uint64_t data_len = n - 8 - hl;
	if (k3_st_parse_header((const char *)p + 8, (size_t)hl, data_len, "fuzz", &h, NULL))
		return;
	for (size_t i = 0; i < h.n; i++) {
		const struct k3_st_entry *e = &h.v[i];
		uint64_t ne = 1;
		for (uint32_t k = 0; k < e->ndim; k++)
			ne *= e->shape[k];
		if (e->begin > e->end || e->end > data_len || e->end - e->begin != e->nbytes ||
		    ne != e->nelem || e->nbytes != ne * k3_dtype_size(e->dtype) ||
		    !k3_dtype_name(e->dtype) || strlen(e->name) == 0)
			abort();
		/* touch the payload: must be inside the input */
		volatile uint8_t sink = 0;
		if (e->nbytes)
			sink ^= p[8 + hl + e->end - 1];
		(void)sink;
	}
	qsort(h.v, h.n, sizeof(*h.v), cmp_begin);
	for (size_t i = 1; i < h.n; i++)
		if (h.v[i - 1].nbytes && h.v[i].nbytes && h.v[i].begin < h.v[i - 1].end)
			abort();
	k3_st_header_release(&h);
}

static void index_json(const uint8_t *p, size_t n)
{
	struct k3_st_index x;

	if (k3_st_parse_index((const char *)p, n, &x, NULL))
		return;
	for (size_t i = 0; i < x.n; i++) {
		if (x.v[i].shard >= x.n_shards || !x.v[i].name[0])
			abort();
		if (i && strcmp(x.v[i - 1].name, x.v[i].name) > 0)
			abort();
	}
	for (uint32_t s = 0; s < x.n_shards; s++)
		if (strchr(x.shards[s], '/') || strcmp(x.shards[s], "..") == 0)
			abort();
	k3_st_index_release(&x);
}

static void config_json(const uint8_t *p, size_t n)
{
	static struct k3_model_config c;

	if (k3_model_config_parse((const char *)p, n, &c, NULL))
		return;
	if (c.num_hidden_layers == 0 || c.num_hidden_layers > K3_MODEL_MAX_LAYERS ||
	    c.n_kda + c.n_mla != c.num_hidden_layers || c.n_moe + c.n_dense != c.num_hidden_layers ||
	    (c.num_experts && c.num_experts_per_token > c.num_experts))
		abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	switch (data[0] % 3) {
	case 0: shard(data + 1, size - 1); break;
	case 1: index_json(data + 1, size - 1); break;
	case 2: config_json(data + 1, size - 1); break;
	}
	return 0;
}

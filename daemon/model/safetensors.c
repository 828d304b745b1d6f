/* safetensors.c - shard header and index parsers (see safetensors.h). */
#include "model/safetensors.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static const struct {
	const char *name;
	size_t size;
} dtypes[K3_DTYPE_COUNT] = {
	[K3_DTYPE_BOOL] = { "BOOL", 1 },
	[K3_DTYPE_U8] = { "U8", 1 },
	[K3_DTYPE_I8] = { "I8", 1 },
	[K3_DTYPE_U16] = { "U16", 2 },
	[K3_DTYPE_I16] = { "I16", 2 },
	[K3_DTYPE_F16] = { "F16", 2 },
	[K3_DTYPE_BF16] = { "BF16", 2 },
	[K3_DTYPE_U32] = { "U32", 4 },
	[K3_DTYPE_I32] = { "I32", 4 },
	[K3_DTYPE_F32] = { "F32", 4 },
	[K3_DTYPE_U64] = { "U64", 8 },
	[K3_DTYPE_I64] = { "I64", 8 },
	[K3_DTYPE_F64] = { "F64", 8 },
	[K3_DTYPE_F8_E4M3] = { "F8_E4M3", 1 },
	[K3_DTYPE_F8_E5M2] = { "F8_E5M2", 1 },
};

const char *k3_dtype_name(enum k3_dtype t)
{
	return (unsigned)t < K3_DTYPE_COUNT ? dtypes[t].name : NULL;
}

size_t k3_dtype_size(enum k3_dtype t)
{
	return (unsigned)t < K3_DTYPE_COUNT ? dtypes[t].size : 0;
}

int k3_dtype_parse(const char *s, enum k3_dtype *out)
{
	for (int i = 0; i < K3_DTYPE_COUNT; i++)
		if (strcmp(s, dtypes[i].name) == 0) {
			*out = (enum k3_dtype)i;
			return 0;
		}
	return -EINVAL;
}

int k3_st_parse_prefix(const uint8_t *p, size_t avail, uint64_t file_size,
		       const char *what, uint64_t *header_len, struct k3_err *err)
{
	uint64_t n = 0;

	if (avail < 8 || file_size < 8)
		return k3_err_set(err, -EINVAL,
				  "%s: %llu bytes is too short for a safetensors file (8-byte header length missing): truncated file",
				  what, (unsigned long long)file_size);
	for (int i = 7; i >= 0; i--)
		n = (n << 8) | p[i];
	if (n == 0)
		return k3_err_set(err, -EINVAL, "%s: header length is 0", what);
	if (n > K3_ST_HEADER_MAX)
		return k3_err_set(err, -EINVAL,
				  "%s: header length %llu exceeds the %u byte limit (not a safetensors file?)",
				  what, (unsigned long long)n, K3_ST_HEADER_MAX);
	if (n > file_size - 8)
		return k3_err_set(err, -EINVAL,
				  "%s: header length %llu runs past the end of the file (%llu bytes): truncated or corrupt",
				  what, (unsigned long long)n, (unsigned long long)file_size);
	*header_len = n;
	return 0;
}

void k3_st_header_release(struct k3_st_header *h)
{
	if (!h)
		return;
	for (size_t i = 0; i < h->n; i++)
		free(h->v[i].name);
	free(h->v);
	h->v = NULL;
	h->n = 0;
}

static int cmp_begin(const void *a, const void *b)
{
	const struct k3_st_entry *x = *(const struct k3_st_entry *const *)a;
	const struct k3_st_entry *y = *(const struct k3_st_entry *const *)b;

	if (x->begin != y->begin)
		return x->begin < y->begin ? -1 : 1;
	if (x->end != y->end)
		return x->end < y->end ? -1 : 1;
	return 0;
}

static bool get_u64(json_t *v, uint64_t *out)
{
	if (!json_is_integer(v) || json_integer_value(v) < 0)
		return false;
	*out = (uint64_t)json_integer_value(v);
	return true;
}

static int parse_entry(const char *what, const char *name, json_t *v, uint64_t data_len,
		       struct k3_st_entry *e, struct k3_err *err)
{
	json_t *dt, *sh, *off;

	if (!json_is_object(v))
		return k3_err_set(err, -EINVAL, "%s: tensor '%s': expected an object", what, name);
	dt = json_object_get(v, "dtype");
	sh = json_object_get(v, "shape");
	off = json_object_get(v, "data_offsets");
	if (!dt || !json_is_string(dt))
		return k3_err_set(err, -EINVAL, "%s: tensor '%s': 'dtype' missing or not a string", what, name);
	if (k3_dtype_parse(json_string_value(dt), &e->dtype))
		return k3_err_set(err, -EINVAL, "%s: tensor '%s': unknown dtype '%s'", what, name,
				  json_string_value(dt));
	if (!sh || !json_is_array(sh))
		return k3_err_set(err, -EINVAL, "%s: tensor '%s': 'shape' missing or not a list", what, name);
	if (json_array_size(sh) > K3_TENSOR_MAX_DIMS)
		return k3_err_set(err, -EINVAL, "%s: tensor '%s': %zu dimensions (at most %u supported)",
				  what, name, json_array_size(sh), K3_TENSOR_MAX_DIMS);
	e->ndim = (uint32_t)json_array_size(sh);
	e->nelem = 1;
	for (uint32_t i = 0; i < e->ndim; i++) {
		if (!get_u64(json_array_get(sh, i), &e->shape[i]))
			return k3_err_set(err, -EINVAL, "%s: tensor '%s': shape[%u] is not a non-negative integer",
					  what, name, i);
		if (__builtin_mul_overflow(e->nelem, e->shape[i], &e->nelem))
			return k3_err_set(err, -EINVAL, "%s: tensor '%s': element count overflows", what, name);
	}
	if (__builtin_mul_overflow(e->nelem, (uint64_t)k3_dtype_size(e->dtype), &e->nbytes))
		return k3_err_set(err, -EINVAL, "%s: tensor '%s': byte length overflows", what, name);
	if (!off || !json_is_array(off) || json_array_size(off) != 2 ||
	    !get_u64(json_array_get(off, 0), &e->begin) || !get_u64(json_array_get(off, 1), &e->end))
		return k3_err_set(err, -EINVAL,
				  "%s: tensor '%s': 'data_offsets' must be [begin, end] non-negative integers",
				  what, name);
	if (e->begin > e->end)
		return k3_err_set(err, -EINVAL, "%s: tensor '%s': data_offsets begin %llu > end %llu",
				  what, name, (unsigned long long)e->begin, (unsigned long long)e->end);
	if (e->end - e->begin != e->nbytes)
		return k3_err_set(err, -EINVAL,
				  "%s: tensor '%s': dtype/shape mismatch: %s x %llu elements = %llu bytes but data_offsets span %llu bytes",
				  what, name, k3_dtype_name(e->dtype), (unsigned long long)e->nelem,
				  (unsigned long long)e->nbytes, (unsigned long long)(e->end - e->begin));
	if (e->end > data_len)
		return k3_err_set(err, -EINVAL,
				  "%s: tensor '%s': payload [%llu, %llu) ends past the data section (%llu bytes): truncated file",
				  what, name, (unsigned long long)e->begin, (unsigned long long)e->end,
				  (unsigned long long)data_len);
	return 0;
}

/* Zeroed room for the n entries of a header or an index (what: its name
 * in errors, noun: what its entries are called there), n being at most
 * K3_MODEL_MAX_TENSORS. NULL with *r set on an error. */
static void *alloc_entries(size_t n, size_t size, const char *what, const char *noun,
			   struct k3_err *err, int *r)
{
	void *v = NULL;

	if (n > K3_MODEL_MAX_TENSORS)
		*r = k3_err_set(err, -EINVAL, "%s: %zu %s exceed the limit of %u", what, n, noun,
				K3_MODEL_MAX_TENSORS);
	else if (!(v = calloc(n ? n : 1, size)))
		*r = k3_err_set(err, -ENOMEM, "%s: out of memory for %zu tensors", what, n);
	return v;
}

int k3_st_parse_header(const char *json, size_t len, uint64_t data_len,
		       const char *what, struct k3_st_header *out,
		       struct k3_err *err)
{
	json_error_t je;
	json_t *root;
	const char *key;
	json_t *v;
	int r = 0;
	struct k3_st_entry **byoff = NULL;

	memset(out, 0, sizeof(*out));
	if (len > K3_ST_HEADER_MAX)
		return k3_err_set(err, -EINVAL, "%s: header of %zu bytes exceeds the limit", what, len);
	root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &je);
	if (!root)
		return k3_err_set(err, -EINVAL, "%s: header is not valid JSON (line %d column %d: %s)",
				  what, je.line, je.column, je.text);
	if (!json_is_object(root)) {
		r = k3_err_set(err, -EINVAL, "%s: header is not a JSON object", what);
		goto out;
	}
	if (!(out->v = alloc_entries(json_object_size(root), sizeof(*out->v), what, "header entries",
				     err, &r)))
		goto out;
	void *it;
	for (it = json_object_iter(root); it; it = json_object_iter_next(root, it)) {
		key = json_object_iter_key(it);
		v = json_object_iter_value(it);
		size_t klen = json_object_iter_key_len(it);
		if (klen != strlen(key)) {
			r = k3_err_set(err, -EINVAL, "%s: a tensor name contains a NUL byte", what);
			goto out;
		}
		if (strcmp(key, "__metadata__") == 0) {
			const char *mk;
			json_t *mv;
			if (!json_is_object(v)) {
				r = k3_err_set(err, -EINVAL, "%s: __metadata__ is not an object", what);
				goto out;
			}
			json_object_foreach(v, mk, mv) {
				if (!json_is_string(mv)) {
					r = k3_err_set(err, -EINVAL, "%s: __metadata__['%s'] is not a string",
						       what, mk);
					goto out;
				}
			}
			continue;
		}
		if (klen == 0 || klen > K3_TENSOR_NAME_MAX) {
			r = k3_err_set(err, -EINVAL, "%s: tensor name of %zu bytes (1..%u allowed)", what,
				       klen, K3_TENSOR_NAME_MAX);
			goto out;
		}
		struct k3_st_entry *e = &out->v[out->n];
		r = parse_entry(what, key, v, data_len, e, err);
		if (r)
			goto out;
		e->name = strdup(key);
		if (!e->name) {
			r = k3_err_set(err, -ENOMEM, "%s: out of memory", what);
			goto out;
		}
		out->n++;
	}
	/* Overlap check: sort by payload start, then neighbours must not
	 * intersect. Empty payloads occupy nothing and cannot overlap. */
	byoff = malloc((out->n ? out->n : 1) * sizeof(*byoff));
	if (!byoff) {
		r = k3_err_set(err, -ENOMEM, "%s: out of memory", what);
		goto out;
	}
	size_t m = 0;
	for (size_t i = 0; i < out->n; i++)
		if (out->v[i].nbytes)
			byoff[m++] = &out->v[i];
	qsort(byoff, m, sizeof(*byoff), cmp_begin);
	for (size_t i = 1; i < m; i++) {
		if (byoff[i]->begin < byoff[i - 1]->end) {
			r = k3_err_set(err, -EINVAL,
				       "%s: tensors '%s' [%llu, %llu) and '%s' [%llu, %llu) have overlapping data_offsets",
				       what, byoff[i - 1]->name, (unsigned long long)byoff[i - 1]->begin,
				       (unsigned long long)byoff[i - 1]->end, byoff[i]->name,
				       (unsigned long long)byoff[i]->begin, (unsigned long long)byoff[i]->end);
			goto out;
		}
	}
out:
	free(byoff);
	json_decref(root);
	if (r)
		k3_st_header_release(out);
	return r;
}

void k3_st_index_release(struct k3_st_index *x)
{
	if (!x)
		return;
	for (uint32_t i = 0; i < x->n_shards; i++)
		free(x->shards[i]);
	free(x->shards);
	for (size_t i = 0; i < x->n; i++)
		free(x->v[i].name);
	free(x->v);
	memset(x, 0, sizeof(*x));
}

static int cmp_index(const void *a, const void *b)
{
	return strcmp(((const struct k3_st_index_entry *)a)->name,
		      ((const struct k3_st_index_entry *)b)->name);
}

static int cmp_name(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static bool plain_file_name(const char *s, size_t len)
{
	if (len == 0 || len > 255 || strlen(s) != len)
		return false;
	if (strcmp(s, ".") == 0 || strcmp(s, "..") == 0)
		return false;
	return strchr(s, '/') == NULL;
}

int k3_st_parse_index(const char *json, size_t len, struct k3_st_index *out,
		      struct k3_err *err)
{
	json_error_t je;
	json_t *root, *wm, *md;
	int r = 0;
	const char *what = "model.safetensors.index.json";

	memset(out, 0, sizeof(*out));
	if (len > K3_MODEL_INDEX_MAX)
		return k3_err_set(err, -EINVAL, "%s: %zu bytes exceeds the limit", what, len);
	root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &je);
	if (!root)
		return k3_err_set(err, -EINVAL, "%s: not valid JSON (line %d column %d: %s)", what,
				  je.line, je.column, je.text);
	if (!json_is_object(root)) {
		r = k3_err_set(err, -EINVAL, "%s: not a JSON object", what);
		goto out;
	}
	md = json_object_get(root, "metadata");
	if (md && json_is_object(md)) {
		json_t *ts = json_object_get(md, "total_size");
		if (ts && json_is_integer(ts) && json_integer_value(ts) >= 0)
			out->total_size = (uint64_t)json_integer_value(ts);
	}
	wm = json_object_get(root, "weight_map");
	if (!wm || !json_is_object(wm)) {
		r = k3_err_set(err, -EINVAL, "%s: 'weight_map' object is missing", what);
		goto out;
	}
	if (!(out->v = alloc_entries(json_object_size(wm), sizeof(*out->v), what, "entries", err, &r)))
		goto out;
	for (void *it = json_object_iter(wm); it; it = json_object_iter_next(wm, it)) {
		const char *key = json_object_iter_key(it);
		json_t *v = json_object_iter_value(it);
		size_t klen = json_object_iter_key_len(it);
		if (klen == 0 || klen > K3_TENSOR_NAME_MAX || strlen(key) != klen) {
			r = k3_err_set(err, -EINVAL, "%s: weight_map has a tensor name of %zu bytes (1..%u, no NUL)",
				       what, klen, K3_TENSOR_NAME_MAX);
			goto out;
		}
		if (!json_is_string(v) ||
		    !plain_file_name(json_string_value(v), json_string_length(v))) {
			r = k3_err_set(err, -EINVAL,
				       "%s: weight_map['%s'] must be a plain shard file name in the model directory",
				       what, key);
			goto out;
		}
		const char *shard = json_string_value(v);
		uint32_t s;
		/* Shards are few (tens to a few hundred); a linear scan from the
		 * most recent one is fast because entries come grouped. */
		for (s = out->n_shards; s > 0; s--)
			if (strcmp(out->shards[s - 1], shard) == 0)
				break;
		if (s == 0) {
			if (out->n_shards >= K3_MODEL_MAX_SHARDS) {
				r = k3_err_set(err, -EINVAL, "%s: more than %u shards", what, K3_MODEL_MAX_SHARDS);
				goto out;
			}
			char **ns = realloc(out->shards, (out->n_shards + 1) * sizeof(*ns));
			if (!ns) {
				r = k3_err_set(err, -ENOMEM, "%s: out of memory", what);
				goto out;
			}
			out->shards = ns;
			if (!(ns[out->n_shards] = strdup(shard))) {
				r = k3_err_set(err, -ENOMEM, "%s: out of memory", what);
				goto out;
			}
			s = ++out->n_shards;
		}
		struct k3_st_index_entry *e = &out->v[out->n];
		e->shard = s - 1;
		if (!(e->name = strdup(key))) {
			r = k3_err_set(err, -ENOMEM, "%s: out of memory", what);
			goto out;
		}
		out->n++;
	}
	if (out->n == 0) {
		r = k3_err_set(err, -EINVAL, "%s: weight_map is empty", what);
		goto out;
	}
	qsort(out->v, out->n, sizeof(*out->v), cmp_index);
	/* Number shards in file-name order (model-00001-of-... first), not in
	 * the order the weight map happens to mention them. */
	{
		uint32_t *rank = malloc(out->n_shards * sizeof(*rank));
		char **sorted = malloc(out->n_shards * sizeof(*sorted));
		if (!rank || !sorted) {
			free(rank);
			free(sorted);
			r = k3_err_set(err, -ENOMEM, "%s: out of memory", what);
			goto out;
		}
		memcpy(sorted, out->shards, out->n_shards * sizeof(*sorted));
		qsort(sorted, out->n_shards, sizeof(*sorted), cmp_name);
		for (uint32_t i = 0; i < out->n_shards; i++)
			for (uint32_t j = 0; j < out->n_shards; j++)
				if (out->shards[i] == sorted[j])
					rank[i] = j;
		for (size_t i = 0; i < out->n; i++)
			out->v[i].shard = rank[out->v[i].shard];
		free(out->shards);
		out->shards = sorted;
		free(rank);
	}
out:
	json_decref(root);
	if (r)
		k3_st_index_release(out);
	return r;
}

/* setup_experts.c - expert map, per-expert table, expert extents (see setup_experts.h). */
#include "setup/setup_experts.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/safetensors.h"
#include "setup/setup_inventory.h"
#include "setup/setup_publish.h"
#include "setup/setup_verify.h"

#define MAP_MAGIC "K3XMAP1\n"
enum { MAP_HEADER = 64, TABLE_LINE = 96 };
#define TABLE_MAX ((size_t)64 << 20)
#define TABLE_HEAD "k3-expert-sha256 1\n"

/* ---- extents ---- */

static const struct k3_expert *find_expert(const struct k3_model *m, uint32_t layer,
					   uint32_t expert)
{
	const struct k3_model_plan *p = k3_model_plan(m);

	if (layer >= p->n_layers || !p->layers[layer].is_moe || expert >= p->layers[layer].moe.n_experts)
		return NULL;
	return &p->layers[layer].moe.experts[expert];
}

int k3_setup_expert_extents(const struct k3_model *m, uint32_t layer, uint32_t expert,
			    struct k3_setup_extent ext[6], unsigned *n)
{
	const struct k3_expert *x = find_expert(m, layer, expert);
	const struct k3_expert_proj *proj[3];
	unsigned k = 0;

	*n = 0;
	if (!x)
		return -ENOENT;
	proj[0] = &x->w1, proj[1] = &x->w2, proj[2] = &x->w3;
	for (int i = 0; i < 3; i++) {
		const struct k3_tensor *t[2] = { proj[i]->mxfp4 ? proj[i]->packed : proj[i]->weight,
						 proj[i]->mxfp4 ? proj[i]->scale : NULL };
		for (int j = 0; j < 2; j++)
			if (t[j]) {
				ext[k].shard = t[j]->shard;
				ext[k].offset = t[j]->file_offset;
				ext[k].length = t[j]->nbytes;
				k++;
			}
	}
	*n = k;
	return 0;
}

int k3_setup_expert_sha256(const struct k3_model *m, uint32_t layer, uint32_t expert,
			   const int *fds, uint8_t out[32], struct k3_err *err)
{
	struct k3_setup_extent ext[6];
	struct k3_setup_hasher *h;
	unsigned n;
	int rc = k3_setup_expert_extents(m, layer, expert, ext, &n);

	if (rc)
		return k3_err_set(err, rc, "(%" PRIu32 ", %" PRIu32 ") is not a routed expert", layer, expert);
	h = k3_setup_hasher_new();
	if (!h)
		return k3_err_set(err, -ENOMEM, "out of memory");
	for (unsigned i = 0; i < n && rc == 0; i++)
		rc = k3_setup_hash_fd(h, fds[ext[i].shard], ext[i].offset, ext[i].length,
				      k3_model_shard_path(m, ext[i].shard), err);
	if (rc == 0 && k3_setup_hasher_peek(h, out) != 0)
		rc = k3_err_set(err, -EIO, "SHA-256 failed");
	k3_setup_hasher_free(h);
	return rc;
}

/* ---- shard layout ---- */

static bool digits(const char **p, uint32_t *out)
{
	uint64_t v = 0;
	const char *s = *p;

	if (*s < '0' || *s > '9')
		return false;
	while (*s >= '0' && *s <= '9' && v < 100000000)
		v = v * 10 + (uint64_t)(*s++ - '0');
	if (*s != '.')
		return false;
	*out = (uint32_t)v;
	*p = s + 1;
	return true;
}

bool k3_setup_expert_tensor(const char *name, uint32_t *layer, uint32_t *expert)
{
	const char *l = strstr(name, "layers."), *e;
	uint32_t lv, ev;

	if (!l)
		return false;
	l += 7;
	if (!digits(&l, &lv) || !(e = strstr(l, ".experts.")))
		return false;
	e += 9;
	if (!digits(&e, &ev) || e[0] != 'w' || e[1] < '1' || e[1] > '3' || e[2] != '.')
		return false;
	if (layer)
		*layer = lv;
	if (expert)
		*expert = ev;
	return true;
}

static int cmp_range(const void *a, const void *b)
{
	const struct k3_setup_range *x = a, *y = b;

	return x->off < y->off ? -1 : x->off > y->off;
}

void k3_setup_shard_layout_release(struct k3_setup_shard_layout *l)
{
	free(l->spine);
	memset(l, 0, sizeof(*l));
}

int k3_setup_shard_layout(const uint8_t prefix[8], const char *header, size_t header_len,
			  uint64_t file_size, const char *what, struct k3_setup_shard_layout *out,
			  struct k3_err *err)
{
	struct k3_st_header h = { 0 };
	uint64_t hlen;
	size_t k = 0;
	int rc;

	memset(out, 0, sizeof(*out));
	rc = k3_st_parse_prefix(prefix, 8, file_size, what, &hlen, err);
	if (rc)
		return rc;
	if (hlen != header_len)
		return k3_err_set(err, -EINVAL, "%s: header of %zu bytes, its prefix says %" PRIu64,
				  what, header_len, hlen);
	rc = k3_st_parse_header(header, header_len, file_size - 8 - hlen, what, &h, err);
	if (rc)
		return rc;
	out->header_end = 8 + hlen;
	out->spine = calloc(h.n ? h.n : 1, sizeof(*out->spine));
	if (!out->spine) {
		k3_st_header_release(&h);
		return k3_err_set(err, -ENOMEM, "out of memory");
	}
	for (size_t i = 0; i < h.n; i++) {
		if (k3_setup_expert_tensor(h.v[i].name, NULL, NULL)) {
			out->n_expert_tensors++;
			continue;
		}
		if (h.v[i].end == h.v[i].begin)
			continue;
		out->spine[k].off = out->header_end + h.v[i].begin;
		out->spine[k].len = h.v[i].end - h.v[i].begin;
		k++;
	}
	k3_st_header_release(&h);
	qsort(out->spine, k, sizeof(*out->spine), cmp_range);
	out->n_spine = 0;
	out->spine_bytes = out->header_end;
	for (size_t i = 0; i < k; i++) {
		struct k3_setup_range *last = out->n_spine ? &out->spine[out->n_spine - 1] : NULL;
		out->spine_bytes += out->spine[i].len;
		if (last && last->off + last->len == out->spine[i].off)
			last->len += out->spine[i].len;
		else
			out->spine[out->n_spine++] = out->spine[i];
	}
	return 0;
}

int k3_setup_spine_bytes(int fd, uint64_t size, const char *what, uint64_t *out,
			 struct k3_err *err)
{
	struct k3_setup_shard_layout l;
	uint8_t prefix[8];
	uint64_t hlen;
	char *header;
	int rc;

	*out = 0;
	if (pread(fd, prefix, 8, 0) != 8)
		return k3_err_set(err, -EIO, "%s: cannot read the safetensors header length", what);
	rc = k3_st_parse_prefix(prefix, 8, size, what, &hlen, err);
	if (rc)
		return rc;
	header = malloc((size_t)hlen);
	if (!header)
		return k3_err_set(err, -ENOMEM, "out of memory");
	if (pread(fd, header, (size_t)hlen, 8) != (ssize_t)hlen) {
		free(header);
		return k3_err_set(err, -EIO, "%s: cannot read the safetensors header", what);
	}
	rc = k3_setup_shard_layout(prefix, header, (size_t)hlen, size, what, &l, err);
	free(header);
	if (rc == 0) {
		*out = l.spine_bytes;
		k3_setup_shard_layout_release(&l);
	}
	return rc;
}

/* ---- map ---- */

struct k3_setup_expert_map {
	uint8_t *base;
	size_t bytes;
	uint32_t layers, experts;
	bool write;
};

static void put_u32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_u32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

int k3_setup_expert_map_create(int dirfd, const struct k3_model *m, struct k3_err *err)
{
	const struct k3_model_config *c = k3_model_config(m);
	uint32_t layers = c->num_hidden_layers, experts = c->num_experts;
	struct k3_setup_expert_map *old = NULL;
	size_t bytes = MAP_HEADER + (size_t)layers * experts;
	uint8_t *buf;
	int sd, rc;

	rc = k3_setup_expert_map_open(dirfd, false, &old, NULL);
	if (rc == 0) {
		bool same = old->layers == layers && old->experts == experts;
		k3_setup_expert_map_close(old);
		return same ? 0 : k3_err_set(err, -EEXIST, K3_SETUP_DIR "/" K3_SETUP_EXPERT_MAP_NAME
					     " is for another model geometry");
	}
	if (experts == 0)
		return k3_err_set(err, -EINVAL, "the model has no routed experts to stream");
	buf = calloc(1, bytes);
	if (!buf)
		return k3_err_set(err, -ENOMEM, "out of memory");
	memcpy(buf, MAP_MAGIC, 8);
	put_u32(buf + 8, layers);
	put_u32(buf + 12, experts);
	for (uint32_t l = 0; l < layers; l++)
		if (!c->is_moe[l])
			memset(buf + MAP_HEADER + (size_t)l * experts, K3_SETUP_EXPERT_NONE, experts);
	rc = k3_setup_subdir_open(dirfd, K3_SETUP_DIR, true, 0755, &sd, err);
	if (rc == 0) {
		rc = k3_setup_write_atomic(sd, K3_SETUP_EXPERT_MAP_NAME, buf, bytes,
					   K3_SETUP_DIR "/" K3_SETUP_EXPERT_MAP_NAME, err);
		close(sd);
	}
	free(buf);
	return rc;
}

int k3_setup_expert_map_open(int dirfd, bool write, struct k3_setup_expert_map **out,
			     struct k3_err *err)
{
	struct k3_setup_expert_map *map;
	struct stat st;
	uint8_t head[MAP_HEADER];
	int sd, fd;

	*out = NULL;
	sd = openat(dirfd, K3_SETUP_DIR, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (sd < 0)
		return errno == ENOENT ? -ENOENT : k3_err_set(err, -errno, "cannot open '" K3_SETUP_DIR
							       "': %s", strerror(errno));
	fd = openat(sd, K3_SETUP_EXPERT_MAP_NAME, (write ? O_RDWR : O_RDONLY) | O_NOFOLLOW | O_CLOEXEC);
	close(sd);
	if (fd < 0)
		return errno == ENOENT ? -ENOENT : k3_err_set(err, -errno, "cannot open the expert map: %s",
							       strerror(errno));
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < MAP_HEADER ||
	    pread(fd, head, MAP_HEADER, 0) != MAP_HEADER || memcmp(head, MAP_MAGIC, 8) != 0 ||
	    get_u32(head + 8) == 0 || get_u32(head + 8) > K3_MODEL_MAX_LAYERS ||
	    get_u32(head + 12) == 0 || get_u32(head + 12) > K3_MODEL_MAX_EXPERTS ||
	    (uint64_t)st.st_size != MAP_HEADER + (uint64_t)get_u32(head + 8) * get_u32(head + 12)) {
		close(fd);
		return k3_err_set(err, -EINVAL, K3_SETUP_DIR "/" K3_SETUP_EXPERT_MAP_NAME " is malformed");
	}
	map = calloc(1, sizeof(*map));
	if (!map) {
		close(fd);
		return k3_err_set(err, -ENOMEM, "out of memory");
	}
	map->layers = get_u32(head + 8);
	map->experts = get_u32(head + 12);
	map->bytes = (size_t)st.st_size;
	map->write = write;
	map->base = mmap(NULL, map->bytes, PROT_READ | (write ? PROT_WRITE : 0), MAP_SHARED, fd, 0);
	close(fd);
	if (map->base == MAP_FAILED) {
		free(map);
		return k3_err_set(err, -errno, "cannot map the expert map: %s", strerror(errno));
	}
	*out = map;
	return 0;
}

void k3_setup_expert_map_close(struct k3_setup_expert_map *map)
{
	if (!map)
		return;
	munmap(map->base, map->bytes);
	free(map);
}

uint32_t k3_setup_expert_map_layers(const struct k3_setup_expert_map *map)
{
	return map->layers;
}

uint32_t k3_setup_expert_map_experts(const struct k3_setup_expert_map *map)
{
	return map->experts;
}

enum k3_setup_expert_have k3_setup_expert_map_get(const struct k3_setup_expert_map *map,
						  uint32_t layer, uint32_t expert)
{
	if (layer >= map->layers || expert >= map->experts)
		return K3_SETUP_EXPERT_NONE;
	return (enum k3_setup_expert_have)__atomic_load_n(
		&map->base[MAP_HEADER + (size_t)layer * map->experts + expert], __ATOMIC_ACQUIRE);
}

void k3_setup_expert_map_set(struct k3_setup_expert_map *map, uint32_t layer, uint32_t expert,
			     enum k3_setup_expert_have have)
{
	if (!map->write || layer >= map->layers || expert >= map->experts)
		return;
	__atomic_store_n(&map->base[MAP_HEADER + (size_t)layer * map->experts + expert],
			 (uint8_t)have, __ATOMIC_RELEASE);
}

int k3_setup_expert_map_sync(struct k3_setup_expert_map *map)
{
	return msync(map->base, map->bytes, MS_SYNC) == 0 ? 0 : -errno;
}

void k3_setup_expert_map_counts(const struct k3_setup_expert_map *map, uint64_t counts[4])
{
	const uint8_t *p = map->base + MAP_HEADER;

	memset(counts, 0, 4 * sizeof(counts[0]));
	for (size_t i = 0; i < (size_t)map->layers * map->experts; i++)
		if (p[i] < 4)
			counts[p[i]]++;
}

/* ---- table ---- */

struct table_entry {
	uint32_t layer, expert;
	uint8_t sha[32];
};

struct k3_setup_expert_table {
	struct table_entry *v;
	size_t n;
};

void k3_setup_expert_table_free(struct k3_setup_expert_table *t)
{
	if (!t)
		return;
	free(t->v);
	free(t);
}

size_t k3_setup_expert_table_count(const struct k3_setup_expert_table *t)
{
	return t->n;
}

int k3_setup_expert_table_parse(const char *text, size_t len, struct k3_setup_expert_table **out,
				struct k3_err *err)
{
	struct k3_setup_expert_table *t;
	const char *s = text, *end = text + len;
	size_t cap = 0, line_no = 1;

	*out = NULL;
	if (len > TABLE_MAX)
		return k3_err_set(err, -EFBIG, "expert table: over the 64 MiB limit");
	if (len < strlen(TABLE_HEAD) || memcmp(text, TABLE_HEAD, strlen(TABLE_HEAD)) != 0)
		return k3_err_set(err, -EINVAL, "expert table: the first line must be 'k3-expert-sha256 1'");
	t = calloc(1, sizeof(*t));
	if (!t)
		return k3_err_set(err, -ENOMEM, "out of memory");
	s += strlen(TABLE_HEAD);
	while (s < end) {
		const char *nl = memchr(s, '\n', (size_t)(end - s));
		char line[TABLE_LINE], hex[80];
		unsigned long layer, expert;
		struct table_entry *e;
		line_no++;
		if (!nl || nl - s >= (long)sizeof(line) ||
		    (memcpy(line, s, (size_t)(nl - s)), line[nl - s] = '\0',
		     sscanf(line, "%lu %lu %79s", &layer, &expert, hex) != 3) ||
		    layer >= K3_MODEL_MAX_LAYERS || expert >= K3_MODEL_MAX_EXPERTS) {
			k3_setup_expert_table_free(t);
			return k3_err_set(err, -EINVAL, "expert table: line %zu is not 'LAYER EXPERT SHA256'",
					  line_no);
		}
		s = nl + 1;
		if (t->n == cap) {
			size_t nc = cap ? cap * 2 : 1024;
			struct table_entry *v = realloc(t->v, nc * sizeof(*v));
			if (!v) {
				k3_setup_expert_table_free(t);
				return k3_err_set(err, -ENOMEM, "out of memory");
			}
			t->v = v;
			cap = nc;
		}
		e = &t->v[t->n];
		e->layer = (uint32_t)layer;
		e->expert = (uint32_t)expert;
		if (k3_setup_sha256_parse(hex, e->sha) != 0 ||
		    (t->n > 0 && (t->v[t->n - 1].layer > e->layer ||
				  (t->v[t->n - 1].layer == e->layer && t->v[t->n - 1].expert >= e->expert)))) {
			k3_setup_expert_table_free(t);
			return k3_err_set(err, -EINVAL, "expert table: line %zu: bad digest or not sorted"
					  " by (layer, expert)", line_no);
		}
		t->n++;
	}
	*out = t;
	return 0;
}

static int cmp_entry(const void *a, const void *b)
{
	const struct table_entry *x = a, *y = b;

	if (x->layer != y->layer)
		return x->layer < y->layer ? -1 : 1;
	return x->expert < y->expert ? -1 : x->expert > y->expert;
}

int k3_setup_expert_table_find(const struct k3_setup_expert_table *t, uint32_t layer,
			       uint32_t expert, uint8_t out[32])
{
	struct table_entry key = { .layer = layer, .expert = expert };
	const struct table_entry *e = t->n ? bsearch(&key, t->v, t->n, sizeof(key), cmp_entry) : NULL;

	if (!e)
		return -ENOENT;
	memcpy(out, e->sha, 32);
	return 0;
}

int k3_setup_expert_table_write(const struct k3_model *m, int dirfd, const char *name,
				size_t *n, struct k3_err *err)
{
	const struct k3_model_plan *p = k3_model_plan(m);
	size_t count = 0, cap = strlen(TABLE_HEAD) + 1, len;
	char *text;
	int rc = 0;

	*n = 0;
	for (uint32_t l = 0; l < p->n_layers; l++)
		if (p->layers[l].is_moe)
			count += p->layers[l].moe.n_experts;
	cap += count * TABLE_LINE;
	text = malloc(cap);
	if (!text)
		return k3_err_set(err, -ENOMEM, "out of memory");
	len = (size_t)sprintf(text, "%s", TABLE_HEAD);
	for (uint32_t l = 0; l < p->n_layers && rc == 0; l++) {
		if (!p->layers[l].is_moe)
			continue;
		for (uint32_t e = 0; e < p->layers[l].moe.n_experts && rc == 0; e++) {
			const struct k3_expert *x = &p->layers[l].moe.experts[e];
			const struct k3_expert_proj *proj[3] = { &x->w1, &x->w2, &x->w3 };
			struct k3_setup_hasher *h = k3_setup_hasher_new();
			uint8_t d[32];
			char hex[K3_SETUP_SHA256_HEX];
			if (!h) {
				rc = k3_err_set(err, -ENOMEM, "out of memory");
				break;
			}
			for (int i = 0; i < 3 && rc == 0; i++) {
				const struct k3_tensor *t[2] = {
					proj[i]->mxfp4 ? proj[i]->packed : proj[i]->weight,
					proj[i]->mxfp4 ? proj[i]->scale : NULL };
				for (int j = 0; j < 2 && rc == 0; j++)
					if (t[j] && k3_setup_hasher_update(h, t[j]->data, t[j]->nbytes) != 0)
						rc = k3_err_set(err, -EIO, "SHA-256 failed");
			}
			if (rc == 0 && k3_setup_hasher_peek(h, d) != 0)
				rc = k3_err_set(err, -EIO, "SHA-256 failed");
			k3_setup_hasher_free(h);
			k3_setup_sha256_hex(d, hex);
			len += (size_t)snprintf(text + len, cap - len, "%" PRIu32 " %" PRIu32 " %s\n", l, e, hex);
		}
	}
	if (rc == 0) {
		/* an identical table (one setup verified, say) is kept, not replaced */
		char *old = NULL;
		size_t old_len = 0;
		if (k3_setup_read_file(dirfd, name, TABLE_MAX, &old, &old_len, name, NULL) != 0 ||
		    old_len != len || memcmp(old, text, len) != 0)
			rc = k3_setup_write_atomic(dirfd, name, text, len, name, err);
		free(old);
	}
	free(text);
	if (rc == 0)
		*n = count;
	return rc;
}

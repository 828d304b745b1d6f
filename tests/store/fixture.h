/*
 * fixture.h - small fake checkpoints for the store tests: a temp dir with
 * safetensors-like shards (8-byte header length, a header, then random
 * bytes) and experts whose six arrays sit at scattered, unaligned offsets,
 * some in the other shard, in shuffled order. Header-only, for tests.
 */
#ifndef K3_TEST_STORE_FIXTURE_H
#define K3_TEST_STORE_FIXTURE_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "store/store_source.h"

enum { FX_SHARDS = 2, FX_LAYERS = 3, FX_EXPERTS = 6, FX_HEADER = 300 };

struct fixture {
	char dir[256];
	char shard[FX_SHARDS][300];
	uint8_t *bytes[FX_SHARDS];      /* whole shard contents */
	uint64_t size[FX_SHARDS];
	struct k3_store_expert ex[FX_LAYERS * FX_EXPERTS];
	size_t n_ex;
};

static uint64_t fx_rng = 0x9E3779B97F4A7C15ull;

static inline uint64_t fx_rand(void)
{
	fx_rng ^= fx_rng << 13;
	fx_rng ^= fx_rng >> 7;
	fx_rng ^= fx_rng << 17;
	return fx_rng;
}

static inline int fx_write_file(const char *path, const void *p, size_t n)
{
	FILE *f = fopen(path, "wb");
	if (!f)
		return -1;
	if (n && fwrite(p, 1, n, f) != n) {
		fclose(f);
		return -1;
	}
	return fclose(f);
}

/* Array sizes like K3's in miniature: packed, scale, packed, scale, ... */
static const uint64_t fx_len[K3_STORE_ARRAYS] = { 3000, 190, 2600, 170, 3000, 190 };

/* Builds the fixture; shard layout: header, then the arrays of every
 * expert with random gaps, w-order shuffled per expert. */
static inline int fx_init(struct fixture *fx)
{
	const char *tmp = getenv("TMPDIR");
	memset(fx, 0, sizeof(*fx));
	snprintf(fx->dir, sizeof(fx->dir), "%s/k3store.XXXXXX", tmp ? tmp : "/tmp");
	if (!mkdtemp(fx->dir))
		return -1;
	uint64_t cursor[FX_SHARDS];
	for (int s = 0; s < FX_SHARDS; s++) {
		snprintf(fx->shard[s], sizeof(fx->shard[s]), "%s/model-%05d-of-%05d.safetensors",
			 fx->dir, s + 1, FX_SHARDS);
		cursor[s] = 8 + FX_HEADER;
	}
	for (uint32_t l = 0; l < FX_LAYERS; l++)
		for (uint32_t e = 0; e < FX_EXPERTS; e++) {
			struct k3_store_expert *x = &fx->ex[fx->n_ex++];
			int perm[K3_STORE_ARRAYS] = { 0, 1, 2, 3, 4, 5 };
			x->layer = l + 1;           /* MoE layers start at 1 on K3 */
			x->expert = e * 3;          /* sparse ids */
			for (int a = K3_STORE_ARRAYS - 1; a > 0; a--) {
				int j = (int)(fx_rand() % (uint64_t)(a + 1)), t = perm[a];
				perm[a] = perm[j];
				perm[j] = t;
			}
			for (int k = 0; k < K3_STORE_ARRAYS; k++) {
				int a = perm[k];
				/* Most arrays in the shard of the layer; some in the other. */
				uint32_t s = (l + (fx_rand() % 5 == 0)) % FX_SHARDS;
				cursor[s] += fx_rand() % 3 == 0 ? fx_rand() % 9000 : fx_rand() % 64;
				x->ext[a].file = s;
				x->ext[a].offset = cursor[s];
				x->ext[a].length = fx_len[a];
				cursor[s] += fx_len[a];
			}
		}
	for (int s = 0; s < FX_SHARDS; s++) {
		fx->size[s] = cursor[s] + 123;
		fx->bytes[s] = malloc(fx->size[s]);
		if (!fx->bytes[s])
			return -1;
		for (uint64_t i = 0; i < fx->size[s]; i++)
			fx->bytes[s][i] = (uint8_t)(fx_rand() >> 24);
		for (int i = 0; i < 8; i++)
			fx->bytes[s][i] = (uint8_t)((uint64_t)FX_HEADER >> (8 * i));
		if (fx_write_file(fx->shard[s], fx->bytes[s], fx->size[s]) != 0)
			return -1;
	}
	return 0;
}

/* A source over the shards: file i = shard i. */
static inline struct k3_store_source *fx_source(struct fixture *fx, enum k3_store_direct d,
						struct k3_err *err)
{
	struct k3_store_source *src = k3_store_source_new(d);
	uint32_t f;

	if (!src)
		return NULL;
	for (int s = 0; s < FX_SHARDS; s++)
		if (k3_store_source_add_file(src, fx->shard[s], &f, err) != 0)
			goto fail;
	for (size_t i = 0; i < fx->n_ex; i++)
		if (k3_store_source_add_expert(src, &fx->ex[i], err) != 0)
			goto fail;
	return src;
fail:
	k3_store_source_free(src);
	return NULL;
}

/* The true bytes of array a of fixture expert i. */
static inline const uint8_t *fx_array(const struct fixture *fx, size_t i, int a)
{
	const struct k3_store_extent *x = &fx->ex[i].ext[a];
	return fx->bytes[x->file] + x->offset;
}

/* Index of (layer, expert) in fx->ex. */
static inline size_t fx_find(const struct fixture *fx, uint32_t layer, uint32_t expert)
{
	for (size_t i = 0; i < fx->n_ex; i++)
		if (fx->ex[i].layer == layer && fx->ex[i].expert == expert)
			return i;
	return (size_t)-1;
}

static inline void fx_release(struct fixture *fx)
{
	DIR *d = opendir(fx->dir);
	struct dirent *de;
	char p[600];

	while (d && (de = readdir(d))) {
		if (de->d_name[0] == '.')
			continue;
		snprintf(p, sizeof(p), "%s/%s", fx->dir, de->d_name);
		unlink(p);
	}
	if (d)
		closedir(d);
	rmdir(fx->dir);
	for (int s = 0; s < FX_SHARDS; s++)
		free(fx->bytes[s]);
}

/* Number of entries in fx->dir (temp files left behind show up here). */
static inline int fx_dir_entries(const struct fixture *fx)
{
	DIR *d = opendir(fx->dir);
	struct dirent *de;
	int n = 0;

	while (d && (de = readdir(d)))
		n += de->d_name[0] != '.';
	if (d)
		closedir(d);
	return n;
}

#endif

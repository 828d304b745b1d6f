/*
 * model.c - opening a checkpoint directory: config, index, shard headers,
 * read-only mappings, the sorted tensor table (see model.h).
 */
#include "model/model_internal.h"
#include "model/model_plan.h"
#include "model/model_tensors.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/file.h"
#include "base/path.h"

/* Opens, checks and maps one shard of directory root (the model's, or the
 * int8 spine overlay's). The resolved path must stay inside root: a
 * symlink may point within it, never out of it. */
int k3_model_shard_open(const char *root, const char *name, struct k3_shard *sh,
			struct k3_err *err)
{
	char *p = k3_path_join(root, name);
	char real[PATH_MAX];
	struct stat st;
	int fd = -1, r = 0;

	if (!p)
		return k3_err_set(err, -ENOMEM, "out of memory");
	if (!realpath(p, real)) {
		r = k3_err_set(err, -errno, "shard '%s': %s", name, strerror(errno));
		goto out;
	}
	size_t dl = strlen(root);
	if (strncmp(real, root, dl) != 0 || real[dl] != '/') {
		r = k3_err_set(err, -EXDEV,
			       "shard '%s' resolves to '%s', outside the model directory '%s' (symlinks must stay inside it)",
			       name, real, root);
		goto out;
	}
	fd = open(real, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		r = k3_err_set(err, -errno, "shard '%s': %s", name, strerror(errno));
		goto out;
	}
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		r = k3_err_set(err, -EINVAL, "shard '%s': not a regular file", name);
		goto out;
	}
	sh->size = (uint64_t)st.st_size;
	if (!(sh->path = strdup(real))) {
		r = k3_err_set(err, -ENOMEM, "out of memory");
		goto out;
	}
	uint8_t pre[8];
	ssize_t n = sh->size >= 8 ? pread(fd, pre, 8, 0) : 0;
	uint64_t hl;
	r = k3_st_parse_prefix(pre, n > 0 ? (size_t)n : 0, sh->size, name, &hl, err);
	if (r)
		goto out;
	if (sh->size > SIZE_MAX) {
		r = k3_err_set(err, -EFBIG, "shard '%s': too large to map", name);
		goto out;
	}
	void *map = mmap(NULL, (size_t)sh->size, PROT_READ, MAP_SHARED, fd, 0);
	if (map == MAP_FAILED) {
		r = k3_err_set(err, -errno, "shard '%s': mmap: %s", name, strerror(errno));
		goto out;
	}
	sh->map = map;
	sh->data_start = 8 + hl;
	r = k3_st_parse_header((const char *)sh->map + 8, (size_t)hl, sh->size - sh->data_start,
			       name, &sh->hdr, err);
out:
	if (fd >= 0)
		close(fd);
	free(p);
	return r;
}

/* Merges every shard header into one sorted table and checks it against
 * the index: each listed tensor is in the shard the index names, and every
 * stored tensor is listed. */
static int build_table(struct k3_model *m, const struct k3_st_index *ix, struct k3_err *err)
{
	size_t total = 0;

	for (uint32_t s = 0; s < m->n_shards; s++)
		total += m->shards[s].hdr.n;
	if (total > K3_MODEL_MAX_TENSORS)
		return k3_err_set(err, -EINVAL, "%zu tensors exceed the limit of %u", total, K3_MODEL_MAX_TENSORS);
	m->tensors = calloc(total ? total : 1, sizeof(*m->tensors));
	if (!m->tensors)
		return k3_err_set(err, -ENOMEM, "out of memory for %zu tensors", total);
	for (uint32_t s = 0; s < m->n_shards; s++) {
		const struct k3_shard *sh = &m->shards[s];
		for (size_t i = 0; i < sh->hdr.n; i++) {
			const struct k3_st_entry *e = &sh->hdr.v[i];
			struct k3_tensor *t = &m->tensors[m->n_tensors++];
			t->name = e->name;
			t->dtype = e->dtype;
			t->ndim = e->ndim;
			memcpy(t->shape, e->shape, sizeof(t->shape));
			t->nelem = e->nelem;
			t->nbytes = e->nbytes;
			t->shard = s;
			t->file_offset = sh->data_start + e->begin;
			t->data = sh->map + t->file_offset;
		}
	}
	k3_tensors_sort(m->tensors, m->n_tensors);
	for (size_t i = 1; i < m->n_tensors; i++)
		if (strcmp(m->tensors[i - 1].name, m->tensors[i].name) == 0)
			return k3_err_set(err, -EINVAL, "tensor '%s' is stored twice (in '%s' and '%s')",
					  m->tensors[i].name, m->shards[m->tensors[i - 1].shard].path,
					  m->shards[m->tensors[i].shard].path);
	if (!ix)
		return 0;
	/* Both lists are sorted by name: one merge pass. The index's shard
	 * numbers are the order shards were opened in (same as ix->shards). */
	size_t a = 0, b = 0;
	while (a < ix->n || b < m->n_tensors) {
		int c = a == ix->n ? 1 : b == m->n_tensors ? -1 : strcmp(ix->v[a].name, m->tensors[b].name);
		if (c < 0)
			return k3_err_set(err, -EINVAL,
					  "missing tensor: '%s' is listed in the index under '%s' but that shard does not store it",
					  ix->v[a].name, ix->shards[ix->v[a].shard]);
		if (c > 0)
			return k3_err_set(err, -EINVAL, "tensor '%s' in shard '%s' is not listed in the index",
					  m->tensors[b].name, m->shards[m->tensors[b].shard].path);
		if (ix->v[a].shard != m->tensors[b].shard)
			return k3_err_set(err, -EINVAL, "tensor '%s': the index names shard '%s' but it is stored in '%s'",
					  ix->v[a].name, ix->shards[ix->v[a].shard],
					  m->shards[m->tensors[b].shard].path);
		a++;
		b++;
	}
	return 0;
}

/* Scans every MXFP4 scale tensor for the forbidden byte 255 (§9) when the
 * total is small enough to read at open. Read with pread, not through the
 * mapping: a scan through the mapping would leave every scanned page, and
 * the neighbours the kernel maps around each fault (up to 64 KiB: other
 * experts' and spine tensors' bytes), in the process's resident memory,
 * which the spine streaming of issue 17 must keep to what it reads. */
static int check_scales(struct k3_model *m, struct k3_err *err)
{
	uint64_t total = 0, widest = 0;
	uint8_t *buf = NULL;
	uint32_t open_shard = UINT32_MAX;
	int fd = -1, r = 0;

	for (size_t i = 0; i < m->n_tensors; i++) {
		const char *n = m->tensors[i].name;
		size_t l = strlen(n);
		if (l > 13 && strcmp(n + l - 13, ".weight_scale") == 0) {
			total += m->tensors[i].nbytes;
			if (m->tensors[i].nbytes > widest)
				widest = m->tensors[i].nbytes;
		}
	}
	if (total > K3_MODEL_SCALE_SCAN_MAX || total == 0)
		return 0;   /* the store checks each span it reads */
	buf = malloc((size_t)widest);
	if (!buf)
		return k3_err_set(err, -ENOMEM, "out of memory for the MXFP4 scale scan");
	for (size_t i = 0; r == 0 && i < m->n_tensors; i++) {
		const struct k3_tensor *t = &m->tensors[i];
		size_t l = strlen(t->name), got = 0;
		if (l <= 13 || strcmp(t->name + l - 13, ".weight_scale") != 0)
			continue;
		if (t->shard != open_shard) {
			if (fd >= 0)
				close(fd);
			open_shard = t->shard;
			fd = open(m->shards[t->shard].path, O_RDONLY | O_CLOEXEC);
			if (fd < 0) {
				r = k3_err_set(err, -errno, "shard '%s': %s", m->shards[t->shard].path,
					       strerror(errno));
				break;
			}
		}
		while (got < t->nbytes) {
			ssize_t n = pread(fd, buf + got, (size_t)t->nbytes - got,
					  (off_t)(t->file_offset + got));
			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0) {
				r = k3_err_set(err, n < 0 ? -errno : -EIO, "shard '%s': cannot read '%s'",
					       m->shards[t->shard].path, t->name);
				break;
			}
			got += (size_t)n;
		}
		if (r == 0)
			r = k3_mxfp4_check_scales(buf, (size_t)t->nbytes, t->name, err);
	}
	if (fd >= 0)
		close(fd);
	free(buf);
	return r;
}

int k3_model_config_load(const char *dir, struct k3_model_config *out, struct k3_err *err)
{
	char *p = k3_path_join(dir, "config.json"), *text = NULL;
	size_t len = 0;
	int r;

	if (!p)
		return k3_err_set(err, -ENOMEM, "out of memory");
	r = k3_file_read(p, K3_MODEL_CONFIG_MAX, 0, &text, &len, err);
	if (r == 0)
		r = k3_model_config_parse(text, len, out, err);
	free(text);
	free(p);
	return r;
}

/* Opens dir; with_plan: a K3 checkpoint (config.json parsed, tensor plan
 * built, opts as k3_model_open_with), else only the tensors
 * (k3_model_open_tensors). */
static int model_open(const char *dir, bool with_plan, const struct k3_model_open_opts *opts,
		      struct k3_model **out, struct k3_err *err)
{
	struct k3_model *m;
	struct k3_st_index ix = { 0 };
	bool have_index = false;
	char *text = NULL, *p = NULL;
	size_t len;
	int r;

	*out = NULL;
	m = calloc(1, sizeof(*m));
	if (!m)
		return k3_err_set(err, -ENOMEM, "out of memory");
	char real[PATH_MAX];
	if (!realpath(dir, real)) {
		r = k3_err_set(err, -errno, "model directory '%s': %s", dir, strerror(errno));
		goto fail;
	}
	if (!(m->dir = strdup(real))) {
		r = k3_err_set(err, -ENOMEM, "out of memory");
		goto fail;
	}

	if (with_plan && (r = k3_model_config_load(m->dir, &m->cfg, err)))
		goto fail;

	if (!(p = k3_path_join(m->dir, "model.safetensors.index.json"))) {
		r = k3_err_set(err, -ENOMEM, "out of memory");
		goto fail;
	}
	if (access(p, F_OK) == 0) {
		r = k3_file_read(p, K3_MODEL_INDEX_MAX, 0, &text, &len, err);
		if (!r)
			r = k3_st_parse_index(text, len, &ix, err);
		free(text);
		text = NULL;
		if (r)
			goto fail;
		have_index = true;
	} else {
		/* A single-file checkpoint has no index. */
		free(p);
		p = NULL;
		if (!(p = k3_path_join(m->dir, "model.safetensors"))) {
			r = k3_err_set(err, -ENOMEM, "out of memory");
			goto fail;
		}
		if (access(p, F_OK) != 0) {
			r = k3_err_set(err, -ENOENT,
				       "'%s' has neither model.safetensors.index.json nor model.safetensors",
				       m->dir);
			goto fail;
		}
	}
	free(p);
	p = NULL;

	m->n_shards = have_index ? ix.n_shards : 1;
	m->shards = calloc(m->n_shards, sizeof(*m->shards));
	if (!m->shards) {
		r = k3_err_set(err, -ENOMEM, "out of memory");
		goto fail;
	}
	for (uint32_t s = 0; s < m->n_shards; s++) {
		r = k3_model_shard_open(m->dir, have_index ? ix.shards[s] : "model.safetensors",
					&m->shards[s], err);
		if (r)
			goto fail;
	}
	r = build_table(m, have_index ? &ix : NULL, err);
	if (r)
		goto fail;
	k3_st_index_release(&ix);
	r = with_plan ? k3_model_plan_build(&m->cfg, m->tensors, m->n_tensors, &m->plan, &m->layers,
					    &m->experts, err) : 0;
	if (r)
		goto fail;
	r = check_scales(m, err);
	if (r)
		goto fail;
	if (opts && opts->int8_dir && (r = k3_model_int8_attach(m, opts, err)) != 0)
		goto fail;
	*out = m;
	return 0;
fail:
	free(p);
	free(text);
	k3_st_index_release(&ix);
	k3_model_free(m);
	return r;
}

int k3_model_open(const char *dir, struct k3_model **out, struct k3_err *err)
{
	return model_open(dir, true, NULL, out, err);
}

int k3_model_open_with(const char *dir, const struct k3_model_open_opts *opts,
		       struct k3_model **out, struct k3_err *err)
{
	return model_open(dir, true, opts, out, err);
}

int k3_model_open_tensors(const char *dir, struct k3_model **out, struct k3_err *err)
{
	return model_open(dir, false, NULL, out, err);
}

void k3_model_free(struct k3_model *m)
{
	if (!m)
		return;
	for (uint32_t s = 0; s < m->n_shards; s++) {
		struct k3_shard *sh = &m->shards[s];
		if (sh->map)
			munmap((void *)sh->map, (size_t)sh->size);
		k3_st_header_release(&sh->hdr);
		free(sh->path);
	}
	free(m->shards);
	k3_model_int8_release(m);
	free(m->tensors);
	free(m->layers);
	free(m->experts);
	free(m->dir);
	free(m);
}

const struct k3_model_config *k3_model_config(const struct k3_model *m)
{
	return &m->cfg;
}

const struct k3_model_plan *k3_model_plan(const struct k3_model *m)
{
	return &m->plan;
}

const struct k3_tensor *k3_model_tensor(const struct k3_model *m, const char *name)
{
	return k3_tensors_find(m->tensors, m->n_tensors, name);
}

const struct k3_tensor *k3_model_tensors(const struct k3_model *m, size_t *n_out)
{
	*n_out = m->n_tensors;
	return m->tensors;
}

const char *k3_model_dir(const struct k3_model *m)
{
	return m->dir;
}

uint32_t k3_model_shard_count(const struct k3_model *m)
{
	return m->n_shards;
}

const char *k3_model_shard_path(const struct k3_model *m, uint32_t i)
{
	const struct k3_shard *sh = k3_model_shard_at(m, i);
	return sh ? sh->path : NULL;
}

uint64_t k3_model_shard_size(const struct k3_model *m, uint32_t i)
{
	const struct k3_shard *sh = k3_model_shard_at(m, i);
	return sh ? sh->size : 0;
}

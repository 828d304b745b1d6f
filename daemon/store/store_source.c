/* store_source.c - files and extents of routed experts (see store_source.h). */
#include "store/store_source.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/array.h"

struct source_file {
	char *path;
	int fd;
	bool direct;
	uint64_t size;
};

struct k3_store_source {
	enum k3_store_direct direct;
	struct source_file *files;
	size_t n_files, cap_files;
	struct k3_store_expert *experts;
	size_t n_experts, cap_experts;
	/* Dense (layer, expert) -> index table, rebuilt as bounds grow. */
	int32_t *index;
	uint32_t idx_layers, idx_experts;
};

struct k3_store_source *k3_store_source_new(enum k3_store_direct direct)
{
	struct k3_store_source *src = calloc(1, sizeof(*src));

	if (src)
		src->direct = direct;
	return src;
}

void k3_store_source_free(struct k3_store_source *src)
{
	if (!src)
		return;
	for (size_t i = 0; i < src->n_files; i++) {
		close(src->files[i].fd);
		free(src->files[i].path);
	}
	free(src->files);
	free(src->experts);
	free(src->index);
	free(src);
}

const char *k3_store_direct_name(enum k3_store_direct d)
{
	switch (d) {
	case K3_STORE_DIRECT_AUTO: return "auto";
	case K3_STORE_DIRECT_ON: return "on";
	case K3_STORE_DIRECT_OFF: return "off";
	}
	return "?";
}

int k3_store_direct_parse(const char *str, enum k3_store_direct *out, struct k3_err *err)
{
	static const enum k3_store_direct all[] = { K3_STORE_DIRECT_AUTO, K3_STORE_DIRECT_ON,
						    K3_STORE_DIRECT_OFF };
	for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
		if (strcmp(str, k3_store_direct_name(all[i])) == 0) {
			*out = all[i];
			return 0;
		}
	return k3_err_set(err, -EINVAL, "'%s' is not 'auto', 'on' or 'off'", str);
}

/* One aligned read at offset 0 tells whether this file system accepts
 * O_DIRECT for real (some accept the open flag and fail the read).
 * Returns 0 or the read's negative errno. */
static int direct_probe(int fd)
{
	void *buf = NULL;
	ssize_t n;

	if (posix_memalign(&buf, K3_STORE_ALIGN, K3_STORE_ALIGN) != 0)
		return -ENOMEM;
	do
		n = pread(fd, buf, K3_STORE_ALIGN, 0);
	while (n < 0 && errno == EINTR);
	int rc = n < 0 ? -errno : 0;
	free(buf);
	return rc;
}

int k3_store_source_add_file(struct k3_store_source *src, const char *path,
			     uint32_t *file, struct k3_err *err)
{
	struct source_file f = { .fd = -1 };
	struct stat st;
	int rc;

	if (src->n_files >= K3_STORE_MAX_FILES)
		return k3_err_set(err, -EMFILE, "more than %d expert files", K3_STORE_MAX_FILES);
	if (src->direct != K3_STORE_DIRECT_OFF) {
		int probe = 0;
		f.fd = open(path, O_RDONLY | O_CLOEXEC | O_DIRECT);
		if (f.fd < 0 && errno != EINVAL)
			return k3_err_set(err, -errno, "cannot open '%s': %s", path, strerror(errno));
		if (f.fd >= 0 && (probe = direct_probe(f.fd)) == 0) {
			f.direct = true;
		} else {
			if (f.fd >= 0)
				close(f.fd);
			f.fd = -1;
			if (src->direct == K3_STORE_DIRECT_ON)
				return k3_err_set(err, -EMEDIUMTYPE,
						  "O_DIRECT was required, but the file system holding"
						  " '%s' refuses it (%s: %s; tmpfs before Linux 6.6,"
						  " ramfs, and some FUSE and network file systems do):"
						  " use --direct auto (O_DIRECT where it works, else"
						  " buffered reads) or --direct off, or keep the model"
						  " on a local ext4, xfs or btrfs disk", path,
						  probe ? "an aligned 4 KiB read failed" : "open with O_DIRECT failed",
						  strerror(probe ? -probe : EINVAL));
		}
	}
	if (f.fd < 0) {
		f.fd = open(path, O_RDONLY | O_CLOEXEC);
		if (f.fd < 0)
			return k3_err_set(err, -errno, "cannot open '%s': %s", path, strerror(errno));
		/* Expert reads jump around; read-ahead would only evict useful pages. */
		(void)posix_fadvise(f.fd, 0, 0, POSIX_FADV_RANDOM);
	}
	if (fstat(f.fd, &st) != 0) {
		rc = k3_err_set(err, -errno, "cannot stat '%s': %s", path, strerror(errno));
		goto out_close;
	}
	if (!S_ISREG(st.st_mode)) {
		rc = k3_err_set(err, -EINVAL, "'%s' is not a regular file", path);
		goto out_close;
	}
	f.size = (uint64_t)st.st_size;
	f.path = strdup(path);
	if (!f.path) {
		rc = k3_err_set(err, -ENOMEM, "out of memory");
		goto out_close;
	}
	if (k3_array_reserve(&src->files, &src->cap_files, src->n_files + 1, sizeof(*src->files), 8)) {
		rc = k3_err_set(err, -ENOMEM, "out of memory");
		goto out_free;
	}
	src->files[src->n_files] = f;
	*file = (uint32_t)src->n_files++;
	return 0;

out_free:
	free(f.path);
out_close:
	close(f.fd);
	return rc;
}

static int grow_index(struct k3_store_source *src, uint32_t layers, uint32_t experts)
{
	uint32_t nl = layers > src->idx_layers ? layers : src->idx_layers;
	uint32_t ne = experts > src->idx_experts ? experts : src->idx_experts;
	/* Bounded by K3_STORE_MAX_LAYERS * K3_STORE_MAX_EXPERTS_PER_LAYER = 2^26. */
	size_t n = (size_t)nl * ne;
	int32_t *idx;

	if (nl == src->idx_layers && ne == src->idx_experts)
		return 0;
	idx = malloc(n * sizeof(*idx));
	if (!idx)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++)
		idx[i] = -1;
	for (size_t i = 0; i < src->n_experts; i++) {
		const struct k3_store_expert *e = &src->experts[i];
		idx[(size_t)e->layer * ne + e->expert] = (int32_t)i;
	}
	free(src->index);
	src->index = idx;
	src->idx_layers = nl;
	src->idx_experts = ne;
	return 0;
}

static uint32_t grow_dim(uint32_t have, uint32_t want_index, uint32_t max)
{
	uint32_t n;

	if (want_index < have)
		return have;
	n = have * 2 < max ? have * 2 : max;
	return n > want_index ? n : want_index + 1;
}

int k3_store_source_add_expert(struct k3_store_source *src,
			       const struct k3_store_expert *e,
			       struct k3_err *err)
{
	if (e->layer >= K3_STORE_MAX_LAYERS || e->expert >= K3_STORE_MAX_EXPERTS_PER_LAYER)
		return k3_err_set(err, -ERANGE, "expert (%" PRIu32 ", %" PRIu32 ") out of range",
				  e->layer, e->expert);
	if (src->n_experts >= K3_STORE_MAX_EXPERTS)
		return k3_err_set(err, -ERANGE, "more than %d experts", K3_STORE_MAX_EXPERTS);
	for (int a = 0; a < K3_STORE_ARRAYS; a++) {
		const struct k3_store_extent *x = &e->ext[a];
		if (x->file >= src->n_files)
			return k3_err_set(err, -EINVAL, "expert (%" PRIu32 ", %" PRIu32
					  ") array %d names unknown file %" PRIu32,
					  e->layer, e->expert, a, x->file);
		if (x->length == 0 || x->length > K3_STORE_MAX_ARRAY_BYTES ||
		    x->offset > src->files[x->file].size ||
		    x->length > src->files[x->file].size - x->offset)
			return k3_err_set(err, -ERANGE, "expert (%" PRIu32 ", %" PRIu32
					  ") array %d: %" PRIu64 " bytes at %" PRIu64
					  " do not fit in '%s' (%" PRIu64 " bytes)",
					  e->layer, e->expert, a, x->length, x->offset,
					  src->files[x->file].path, src->files[x->file].size);
	}
	if (k3_store_source_find(src, e->layer, e->expert) >= 0)
		return k3_err_set(err, -EEXIST, "expert (%" PRIu32 ", %" PRIu32 ") added twice",
				  e->layer, e->expert);
	if (k3_array_reserve(&src->experts, &src->cap_experts, src->n_experts + 1, sizeof(*src->experts), 64))
		return k3_err_set(err, -ENOMEM, "out of memory");
	if (e->layer >= src->idx_layers || e->expert >= src->idx_experts) {
		/* Grow geometrically so a layer-by-layer fill rebuilds rarely. */
		uint32_t nl = grow_dim(src->idx_layers, e->layer, K3_STORE_MAX_LAYERS);
		uint32_t ne = grow_dim(src->idx_experts, e->expert, K3_STORE_MAX_EXPERTS_PER_LAYER);
		if (grow_index(src, nl, ne) != 0)
			return k3_err_set(err, -ENOMEM, "out of memory");
	}
	src->experts[src->n_experts] = *e;
	src->index[(size_t)e->layer * src->idx_experts + e->expert] = (int32_t)src->n_experts;
	src->n_experts++;
	return 0;
}

size_t k3_store_source_count(const struct k3_store_source *src)
{
	return src->n_experts;
}

const struct k3_store_expert *k3_store_source_expert(const struct k3_store_source *src,
						     size_t i)
{
	return i < src->n_experts ? &src->experts[i] : NULL;
}

int k3_store_source_cmp_index(const void *a, const void *b, void *ctx)
{
	const struct k3_store_source *src = ctx;
	const struct k3_store_expert *x = &src->experts[*(const size_t *)a];
	const struct k3_store_expert *y = &src->experts[*(const size_t *)b];

	if (x->layer != y->layer)
		return x->layer < y->layer ? -1 : 1;
	return x->expert < y->expert ? -1 : x->expert > y->expert;
}

int64_t k3_store_source_find(const struct k3_store_source *src,
			     uint32_t layer, uint32_t expert)
{
	if (layer >= src->idx_layers || expert >= src->idx_experts)
		return -1;
	return src->index[(size_t)layer * src->idx_experts + expert];
}

size_t k3_store_source_file_count(const struct k3_store_source *src)
{
	return src->n_files;
}

bool k3_store_source_file_direct(const struct k3_store_source *src, uint32_t file)
{
	return file < src->n_files && src->files[file].direct;
}

const char *k3_store_source_file_path(const struct k3_store_source *src, uint32_t file)
{
	return file < src->n_files ? src->files[file].path : NULL;
}

int k3_store_source_file_stat(const struct k3_store_source *src, uint32_t file,
			      struct stat *st)
{
	if (file >= src->n_files)
		return -ERANGE;
	return fstat(src->files[file].fd, st) == 0 ? 0 : -errno;
}

static uint64_t align_up(uint64_t v)
{
	return (v + K3_STORE_ALIGN - 1) & ~(uint64_t)(K3_STORE_ALIGN - 1);
}

uint64_t k3_store_plan_extents(const struct k3_store_extent *x, unsigned n, unsigned *order,
			       struct k3_store_read *rd, unsigned *n_rd, uint64_t *offset)
{
	uint64_t cursor = 0;
	unsigned nr = 0;

	/* Sort by (file, offset): insertion sort, n is small (6 for an
	 * expert, a few dozen tensors for a spine layer). */
	for (unsigned a = 0; a < n; a++) {
		unsigned j = a;
		while (j > 0) {
			const struct k3_store_extent *p = &x[order[j - 1]], *q = &x[a];
			if (p->file < q->file || (p->file == q->file && p->offset <= q->offset))
				break;
			order[j] = order[j - 1];
			j--;
		}
		order[j] = a;
	}
	/* Merge neighbours of one file closer than one alignment unit: one read
	 * of a small gap costs less than a second request. The run of each
	 * extent goes into offset[] for now. */
	for (unsigned k = 0; k < n; k++) {
		const struct k3_store_extent *e = &x[order[k]];
		struct k3_store_read *r = nr ? &rd[nr - 1] : NULL;
		uint64_t end = e->offset + e->length;

		if (r && r->file == e->file && e->offset <= r->offset + r->length + K3_STORE_ALIGN) {
			if (end > r->offset + r->length)
				r->length = end - r->offset;
		} else {
			r = &rd[nr++];
			r->file = e->file;
			r->offset = e->offset;
			r->length = e->length;
		}
		offset[order[k]] = nr - 1;
	}
	for (unsigned k = 0; k < nr; k++) {
		struct k3_store_read *r = &rd[k];
		r->slot_offset = cursor + r->offset % K3_STORE_ALIGN;
		cursor = align_up(r->slot_offset + r->length);
	}
	for (unsigned a = 0; a < n; a++) {
		const struct k3_store_read *r = &rd[offset[a]];
		offset[a] = r->slot_offset + (x[a].offset - r->offset);
	}
	*n_rd = nr;
	return cursor;
}

void k3_store_source_plan(const struct k3_store_source *src, size_t i,
			  struct k3_store_plan *plan)
{
	const struct k3_store_expert *e = &src->experts[i];
	unsigned order[K3_STORE_ARRAYS];

	memset(plan, 0, sizeof(*plan));
	plan->slot_bytes = k3_store_plan_extents(e->ext, K3_STORE_ARRAYS, order, plan->read,
						 &plan->n_reads, plan->array_offset);
	for (int a = 0; a < K3_STORE_ARRAYS; a++) {
		plan->array_length[a] = e->ext[a].length;
		plan->useful_bytes += e->ext[a].length;
	}
}

uint64_t k3_store_source_slot_bytes(const struct k3_store_source *src)
{
	uint64_t best = 0;
	struct k3_store_plan plan;

	for (size_t i = 0; i < src->n_experts; i++) {
		k3_store_source_plan(src, i, &plan);
		if (plan.slot_bytes > best)
			best = plan.slot_bytes;
	}
	return best;
}

int64_t k3_store_source_pread(const struct k3_store_source *src,
			      const struct k3_store_read *rd, uint8_t *slot)
{
	const struct source_file *f = &src->files[rd->file];
	uint64_t head = 0, want = rd->length, need = rd->length, got = 0;
	uint64_t off = rd->offset;
	uint8_t *dst = slot + rd->slot_offset;

	if (f->direct) {
		head = rd->offset % K3_STORE_ALIGN;
		off -= head;
		dst -= head;
		need = head + rd->length;
		want = align_up(need);
	}
	while (got < want) {
		ssize_t n = pread(f->fd, dst + got, (size_t)(want - got), (off_t)(off + got));
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0)
			break;
		got += (uint64_t)n;
		/* O_DIRECT may return a partial block only at end of file. */
		if (f->direct && got % K3_STORE_ALIGN)
			break;
	}
	if (got < need)
		return -EIO;
	return (int64_t)got;
}

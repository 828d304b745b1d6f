/*
 * store_int8_write.c - writes the int8 spine overlay (store_int8.h,
 * docs/formats.md "int8 spine overlay"): each spine matrix of the model
 * quantized row by row (model.h k3_model_int8_quantize_rows) into
 * safetensors shards, one per source shard that holds spine matrices, then
 * the index and the manifest, published as a whole directory.
 *
 * Layout of one overlay shard: the 8-byte header length, the JSON header
 * padded with spaces so the data starts on a 64-byte boundary, then per
 * matrix (plan order) `<base>.weight_i8` (I8 [rows, cols], 64-aligned),
 * `<base>.weight_i8_pad` (U8 zeros up to the next 64 bytes, only when
 * rows * cols is not a multiple of 64), `<base>.weight_row_scale` (F32
 * [rows]) and `<base>.weight_row_scale_pad` (U8 zeros, only when 4 * rows
 * is not a multiple of 64): payloads are contiguous, so the file is valid
 * safetensors, and the scales sit where the provider ABI looks for them
 * (K3_MODEL_I8_SCALE_OFFSET after q).
 *
 * Memory: a chunk of rows at a time (CHUNK_BYTES of BF16), the source pages
 * of each chunk released after it (madvise): a 113 GB spine converts in a
 * few tens of MB.
 */
#include "store/store_int8.h"
#include "store/store_int8_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/file.h"
#include "model/model.h"
#include "store/store_model.h"

/* BF16 bytes quantized per step (bounded memory; large enough that the
 * writes stay sequential and big). */
enum { CHUNK_BYTES = 16 << 20 };

static const char INDEX_NAME[] = "model.safetensors.index.json";

static uint64_t align64(uint64_t v)
{
	return (v + 63) & ~(uint64_t)63;
}

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ---- the layout of one shard ---- */

struct ov_shard {
	uint32_t src;                /* the model shard its matrices come from */
	size_t first, n;             /* its matrices: [first, first + n) of the list */
	char name[64];
	char *header;                /* JSON, space-padded */
	uint64_t header_len;         /* bytes after the 8-byte length */
	uint64_t data_len;
};

/* Adds the tensors of one matrix at data offset *off to hdr (and the index
 * weight_map wm). */
static int add_matrix(json_t *hdr, json_t *wm, const char *shard, const struct k3_tensor *t,
		      uint64_t *off, struct k3_err *err)
{
	uint64_t rows = t->shape[0], cols = t->shape[1];
	uint64_t qb = rows * cols, sb = 4 * rows;
	struct { const char *suffix, *dtype; uint64_t n0, n1; int ndim; uint64_t bytes; } part[4] = {
		{ ".weight_i8", "I8", rows, cols, 2, qb },
		{ ".weight_i8_pad", "U8", align64(qb) - qb, 0, 1, align64(qb) - qb },
		{ ".weight_row_scale", "F32", rows, 0, 1, sb },
		{ ".weight_row_scale_pad", "U8", align64(sb) - sb, 0, 1, align64(sb) - sb },
	};
	for (int i = 0; i < 4; i++) {
		char name[K3_TENSOR_NAME_MAX + 32];
		if (!part[i].bytes)
			continue;
		if (k3_model_int8_name(t->name, part[i].suffix, name, sizeof(name)))
			return k3_err_set(err, -EINVAL, "'%s': no int8 name for it", t->name);
		json_t *shape = part[i].ndim == 2 ? json_pack("[I,I]", (json_int_t)part[i].n0,
							      (json_int_t)part[i].n1)
						  : json_pack("[I]", (json_int_t)part[i].n0);
		json_t *e = json_pack("{s:s, s:o, s:[I,I]}", "dtype", part[i].dtype, "shape", shape,
				      "data_offsets", (json_int_t)*off,
				      (json_int_t)(*off + part[i].bytes));
		if (!e || json_object_set_new(hdr, name, e) ||
		    json_object_set_new(wm, name, json_string(shard)))
			return k3_err_set(err, -ENOMEM, "out of memory");
		*off += part[i].bytes;
	}
	return 0;
}

static int plan_shard(struct ov_shard *sh, const struct k3_model_int8_matrix *mx, json_t *wm,
		      const char *src_name, struct k3_err *err)
{
	json_t *hdr = json_object();
	uint64_t off = 0;
	int rc = 0;

	if (!hdr || json_object_set_new(hdr, "__metadata__", json_pack("{s:s, s:s, s:s}",
	    "format", K3_STORE_INT8_FORMAT, "source", src_name, "scheme", K3_STORE_INT8_SCHEME)))
		rc = k3_err_set(err, -ENOMEM, "out of memory");
	for (size_t i = 0; !rc && i < sh->n; i++)
		rc = add_matrix(hdr, wm, sh->name, mx[sh->first + i].tensor, &off, err);
	char *text = rc ? NULL : json_dumps(hdr, JSON_COMPACT);
	json_decref(hdr);
	if (rc)
		return rc;
	if (!text)
		return k3_err_set(err, -ENOMEM, "out of memory");
	size_t len = strlen(text);
	/* spaces after the JSON (allowed by safetensors): data on a 64-byte
	 * boundary, so every q block is 64-byte aligned in the mapping */
	uint64_t hl = align64(8 + len) - 8;
	char *padded = malloc((size_t)hl);
	if (!padded) {
		free(text);
		return k3_err_set(err, -ENOMEM, "out of memory");
	}
	memcpy(padded, text, len);
	free(text);
	memset(padded + len, ' ', (size_t)(hl - len));
	sh->header = padded;
	sh->header_len = hl;
	sh->data_len = off;
	return 0;
}

/* ---- writing ---- */

/* Drops the mapped source pages of [p, p + n) from this process (the page
 * cache keeps them): the conversion's resident memory stays one chunk. */
static void release_pages(const void *p, size_t n)
{
	long pg = sysconf(_SC_PAGESIZE);
	uintptr_t a = (uintptr_t)p & ~(uintptr_t)(pg - 1);
	uintptr_t e = (uintptr_t)p + n;

	madvise((void *)a, e - a, MADV_DONTNEED);
}

struct bufs {
	uint16_t *w;                 /* aligned copy of a chunk of BF16 rows */
	int8_t *q;
	float *scales;               /* [rows of the largest matrix] */
	size_t w_cap, q_cap, s_cap;
};

static int grow(void **p, size_t *cap, size_t need)
{
	if (need <= *cap)
		return 0;
	void *n = realloc(*p, need);
	if (!n)
		return -ENOMEM;
	*p = n;
	*cap = need;
	return 0;
}

/* Quantizes t and writes q at off, its scales at off + align64(rows * cols). */
static int write_matrix(int fd, const char *path, const struct k3_tensor *t, uint64_t off,
			struct bufs *b, struct k3_store_int8_report *rep, struct k3_err *err)
{
	size_t rows = (size_t)t->shape[0], cols = (size_t)t->shape[1];
	size_t chunk = CHUNK_BYTES / (2 * cols) ? CHUNK_BYTES / (2 * cols) : 1;
	int rc;

	if (chunk > rows)
		chunk = rows;
	if (grow((void **)&b->w, &b->w_cap, chunk * cols * 2) ||
	    grow((void **)&b->q, &b->q_cap, chunk * cols) ||
	    grow((void **)&b->scales, &b->s_cap, rows * sizeof(float)))
		return k3_err_set(err, -ENOMEM, "out of memory for '%s'", t->name);
	for (size_t r0 = 0; r0 < rows; r0 += chunk) {
		size_t n = rows - r0 < chunk ? rows - r0 : chunk, bad = 0;
		const uint8_t *src = (const uint8_t *)t->data + 2 * r0 * cols;

		rc = k3_model_int8_quantize_rows(t, r0, n, b->w, b->q, b->scales + r0, &bad);
		release_pages(src, n * cols * 2);
		if (rc)
			return k3_err_set(err, -EINVAL, "'%s' row %zu holds a NaN or infinite weight:"
					  " it cannot be quantized", t->name, bad);
		for (size_t r = 0; r < n; r++) {
			float s = b->scales[r0 + r];
			if (s == 0.0f)
				continue;
			for (size_t c = 0; c < cols; c++) {
				uint32_t u = (uint32_t)b->w[r * cols + c] << 16;
				float w;
				memcpy(&w, &u, sizeof(w));
				double e = fabs((double)w - (double)b->q[r * cols + c] * s) / s;
				if (e > rep->max_step_error)
					rep->max_step_error = e;
			}
		}
		rc = k3_file_pwrite_all(fd, b->q, n * cols, off + r0 * cols);
		if (rc)
			return k3_err_set(err, rc, "cannot write '%s': %s", path, strerror(-rc));
	}
	rc = k3_file_pwrite_all(fd, b->scales, rows * sizeof(float), off + align64((uint64_t)rows * cols));
	if (rc)
		return k3_err_set(err, rc, "cannot write '%s': %s", path, strerror(-rc));
	rep->int8_bytes += K3_MODEL_I8_BYTES(rows, cols);
	rep->bf16_bytes += t->nbytes;
	return 0;
}

static int write_shard(const char *dir, const struct ov_shard *sh,
		       const struct k3_model_int8_matrix *mx, struct bufs *b,
		       struct k3_store_int8_report *rep, struct k3_err *err)
{
	char path[PATH_MAX];
	uint8_t len8[8];
	uint64_t data0 = 8 + sh->header_len, off = 0;
	int fd, rc = 0;

	if (snprintf(path, sizeof(path), "%s/%s", dir, sh->name) >= (int)sizeof(path))
		return k3_err_set(err, -ENAMETOOLONG, "overlay path too long");
	fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	if (fd < 0)
		return k3_err_set(err, -errno, "cannot create '%s': %s", path, strerror(errno));
	for (int i = 0; i < 8; i++)
		len8[i] = (uint8_t)(sh->header_len >> (8 * i));
	/* the pads are holes: they read as the zeros they must be */
	if (ftruncate(fd, (off_t)(data0 + sh->data_len)) != 0)
		rc = k3_err_set(err, -errno, "cannot size '%s': %s", path, strerror(errno));
	if (!rc && ((rc = k3_file_pwrite_all(fd, len8, 8, 0)) ||
		    (rc = k3_file_pwrite_all(fd, sh->header, (size_t)sh->header_len, 8))))
		k3_err_set(err, rc, "cannot write '%s': %s", path, strerror(-rc));
	for (size_t i = 0; !rc && i < sh->n; i++) {
		const struct k3_tensor *t = mx[sh->first + i].tensor;
		rc = write_matrix(fd, path, t, data0 + off, b, rep, err);
		uint64_t qb = t->shape[0] * t->shape[1];
		off += align64(qb) + align64(4 * t->shape[0]);
	}
	if (!rc && fsync(fd) != 0)
		rc = k3_err_set(err, -errno, "cannot fsync '%s': %s", path, strerror(errno));
	if (close(fd) != 0 && !rc)
		rc = k3_err_set(err, -errno, "cannot close '%s': %s", path, strerror(errno));
	rep->file_bytes += data0 + sh->data_len;
	return rc;
}

/* Writes text into dir/name and fsyncs it. */
static int write_small(const char *dir, const char *name, const char *text, struct k3_err *err)
{
	char path[PATH_MAX];
	int fd, rc;

	if (snprintf(path, sizeof(path), "%s/%s", dir, name) >= (int)sizeof(path))
		return k3_err_set(err, -ENAMETOOLONG, "overlay path too long");
	fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	if (fd < 0)
		return k3_err_set(err, -errno, "cannot create '%s': %s", path, strerror(errno));
	rc = k3_file_pwrite_all(fd, text, strlen(text), 0);
	if (!rc && fsync(fd) != 0)
		rc = -errno;
	if (close(fd) != 0 && !rc)
		rc = -errno;
	return rc ? k3_err_set(err, rc, "cannot write '%s': %s", path, strerror(-rc)) : 0;
}

/* ---- the directory ---- */

/* A file an overlay directory may hold (all of them are removed when it is
 * replaced; anything else makes the writer refuse to touch it). */
static bool overlay_file(const char *n)
{
	size_t l = strlen(n);
	return !strcmp(n, K3_STORE_INT8_MANIFEST) || !strcmp(n, INDEX_NAME) ||
	       (!strncmp(n, "spine-int8-", 11) && l > 12 && !strcmp(n + l - 12, ".safetensors"));
}

/* 0 when dir is missing (*exists false) or holds overlay files only; a
 * foreign file: -ENOTEMPTY naming it. */
static int scan_dir(const char *dir, bool *exists, struct k3_err *err)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int rc = 0;

	*exists = d != NULL;
	if (!d)
		return errno == ENOENT ? 0 : k3_err_set(err, -errno, "'%s': %s", dir, strerror(errno));
	while (!rc && (e = readdir(d)))
		if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && !overlay_file(e->d_name))
			rc = k3_err_set(err, -ENOTEMPTY, "'%s' holds '%s', which is not an int8 spine"
					" overlay's file: move it away (the writer replaces the whole"
					" directory) or pass another --out", dir, e->d_name);
	closedir(d);
	return rc;
}

/* Removes the overlay files of dir, then dir (best effort: a failure only
 * leaves garbage behind, never a broken overlay). */
static void remove_dir(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	char p[PATH_MAX];

	if (!d)
		return;
	while ((e = readdir(d)))
		if (overlay_file(e->d_name) && snprintf(p, sizeof(p), "%s/%s", dir, e->d_name) <
						   (int)sizeof(p))
			unlink(p);
	closedir(d);
	rmdir(dir);
}

/* Groups the matrices by source shard (stable: plan order inside one). */
static int group(const struct k3_model *m, struct k3_model_int8_matrix *mx, size_t n,
		 struct ov_shard **out, uint32_t *n_out, struct k3_err *err)
{
	uint32_t ns = k3_model_shard_count(m), k = 0;
	struct k3_model_int8_matrix *sorted = malloc((n ? n : 1) * sizeof(*sorted));
	struct ov_shard *sh = calloc(ns ? ns : 1, sizeof(*sh));
	size_t pos = 0;

	if (!sorted || !sh) {
		free(sorted);
		free(sh);
		return k3_err_set(err, -ENOMEM, "out of memory");
	}
	for (uint32_t s = 0; s < ns; s++) {
		size_t first = pos;
		for (size_t i = 0; i < n; i++)
			if (mx[i].tensor->shard == s)
				sorted[pos++] = mx[i];
		if (pos > first)
			sh[k++] = (struct ov_shard){ .src = s, .first = first, .n = pos - first };
	}
	memcpy(mx, sorted, n * sizeof(*mx));
	free(sorted);
	for (uint32_t i = 0; i < k; i++)
		snprintf(sh[i].name, sizeof(sh[i].name), "spine-int8-%05" PRIu32 "-of-%05" PRIu32
			 ".safetensors", i + 1, k);
	*out = sh;
	*n_out = k;
	return 0;
}

static const char *base_name(const char *path)
{
	const char *s = strrchr(path, '/');
	return s ? s + 1 : path;
}

/* The manifest: the scheme, the model shards it was made from (was[]),
 * and the identity of every file written into tmp. */
static int write_manifest(const char *tmp, const struct k3_store_pack_ident *was, size_t n_was,
			  const struct ov_shard *sh, uint32_t n_sh,
			  const struct k3_store_int8_report *rep, struct k3_err *err)
{
	json_t *man = json_pack("{s:s, s:i, s:b, s:s, s:I, s:I, s:I, s:[], s:[], s:[]}", "format",
				K3_STORE_INT8_FORMAT, "version", K3_STORE_INT8_VERSION,
				"weight_exact", 0, "scheme", K3_STORE_INT8_SCHEME,
				"matrices", (json_int_t)rep->matrices,
				"int8_bytes", (json_int_t)rep->int8_bytes,
				"bf16_bytes", (json_int_t)rep->bf16_bytes,
				"classes", "model_shards", "files");
	int rc = man ? 0 : k3_err_set(err, -ENOMEM, "out of memory");
	json_t *classes = json_object_get(man, "classes"), *ms = json_object_get(man, "model_shards");
	json_t *files = json_object_get(man, "files");

	for (unsigned b = 1; !rc && b <= K3_MODEL_INT8_ALL; b <<= 1)
		if (json_array_append_new(classes, json_string(k3_model_int8_role_name(b))))
			rc = k3_err_set(err, -ENOMEM, "out of memory");
	for (size_t i = 0; !rc && i < n_was; i++)
		if (json_array_append_new(ms, k3_store_int8_ident_json(&was[i])))
			rc = k3_err_set(err, -ENOMEM, "out of memory");
	for (uint32_t i = 0; !rc && i <= n_sh; i++) {
		char path[PATH_MAX];
		struct k3_store_pack_ident id;
		const char *name = i < n_sh ? sh[i].name : INDEX_NAME;
		struct stat st;

		if (snprintf(path, sizeof(path), "%s/%s", tmp, name) >= (int)sizeof(path))
			rc = k3_err_set(err, -ENAMETOOLONG, "overlay path too long");
		/* the index is small: its identity hashes all of it */
		else if (i == n_sh && stat(path, &st) != 0)
			rc = k3_err_set(err, -errno, "'%s': %s", path, strerror(errno));
		if (!rc)
			rc = k3_store_pack_ident(path, name, i < n_sh ? 0 : (uint64_t)st.st_size, &id,
						 err);
		if (!rc && json_array_append_new(files, k3_store_int8_ident_json(&id)))
			rc = k3_err_set(err, -ENOMEM, "out of memory");
	}
	char *text = rc ? NULL : json_dumps(man, JSON_INDENT(1));
	json_decref(man);
	if (rc)
		return rc;
	if (!text)
		return k3_err_set(err, -ENOMEM, "out of memory");
	rc = write_small(tmp, K3_STORE_INT8_MANIFEST, text, err);
	free(text);
	return rc;
}

/* Swaps tmp in as dir (RENAME_EXCHANGE when dir exists, then the old one,
 * now at tmp, is removed) and fsyncs the parent. */
static int publish(const char *tmp, const char *dir, bool exists, struct k3_err *err)
{
	int rc;

	if (exists)
		rc = renameat2(AT_FDCWD, tmp, AT_FDCWD, dir, RENAME_EXCHANGE) == 0 ? 0 : -errno;
	else
		rc = rename(tmp, dir) == 0 ? 0 : -errno;
	if (rc)
		return k3_err_set(err, rc, "cannot move '%s' to '%s': %s", tmp, dir, strerror(-rc));
	if (exists)
		remove_dir(tmp);
	rc = k3_file_fsync_parent(dir);
	return rc ? k3_err_set(err, rc, "cannot fsync the directory of '%s': %s", dir,
			       strerror(-rc)) : 0;
}

int k3_store_int8_write(const struct k3_model *m, const char *dir_opt, bool force,
			struct k3_store_int8_report *rep, struct k3_err *err)
{
	char dir[PATH_MAX], tmp[PATH_MAX + 16];
	struct k3_store_pack_ident *was = NULL, *after = NULL;
	struct k3_model_int8_matrix *mx = NULL;
	struct ov_shard *sh = NULL;
	struct bufs b = { 0 };
	uint32_t n_sh = 0;
	size_t n_was = 0, n_after = 0;
	bool exists = false, made_tmp = false;
	double t0 = now_s();
	json_t *index = NULL, *wm = NULL;
	int rc;

	memset(rep, 0, sizeof(*rep));
	if ((rc = k3_store_int8_dir(dir, sizeof(dir), k3_model_dir(m), dir_opt)))
		return k3_err_set(err, rc, "overlay path too long");
	if ((rc = scan_dir(dir, &exists, err)))
		return rc;
	if (exists && !force) {
		struct k3_err why = { 0 };
		if (k3_store_int8_check(m, dir, &why) == 0)
			return 0;                     /* up to date: kept */
		rep->replaced = true;
		snprintf(rep->why, sizeof(rep->why), "%s", why.msg);
	} else if (exists) {
		rep->replaced = true;
		snprintf(rep->why, sizeof(rep->why), "--force");
	}
	if ((rc = k3_store_model_idents(m, &was, &n_was, err)))
		return rc;
	size_t n = k3_model_int8_matrices(m, NULL, 0);
	mx = calloc(n ? n : 1, sizeof(*mx));
	if (!mx) {
		rc = k3_err_set(err, -ENOMEM, "out of memory");
		goto out;
	}
	k3_model_int8_matrices(m, mx, n);
	for (size_t i = 0; i < n; i++)
		if (mx[i].tensor->dtype != K3_DTYPE_BF16 || mx[i].tensor->ndim != 2) {
			rc = k3_err_set(err, -EINVAL, "'%s' is not a BF16 matrix (open the model"
					" without its int8 overlay to convert it)", mx[i].tensor->name);
			goto out;
		}
	rep->matrices = n;
	if ((rc = group(m, mx, n, &sh, &n_sh, err)))
		goto out;
	rep->shards = n_sh;
	snprintf(tmp, sizeof(tmp), "%s.tmp.XXXXXX", dir);
	if (!mkdtemp(tmp)) {
		rc = k3_err_set(err, -errno, "cannot create a directory beside '%s': %s", dir,
				strerror(errno));
		goto out;
	}
	made_tmp = true;
	/* mkdtemp makes it 0700: the overlay is read by k3d, often another
	 * user, as the model directory is */
	mode_t um = umask(0);
	umask(um);
	if (chmod(tmp, 0777 & ~um) != 0) {
		rc = k3_err_set(err, -errno, "cannot chmod '%s': %s", tmp, strerror(errno));
		goto out;
	}
	index = json_object();
	wm = json_object();
	if (!index || !wm) {
		rc = k3_err_set(err, -ENOMEM, "out of memory");
		goto out;
	}
	for (uint32_t i = 0; !rc && i < n_sh; i++)
		rc = plan_shard(&sh[i], mx, wm, base_name(k3_model_shard_path(m, sh[i].src)), err);
	for (uint32_t i = 0; !rc && i < n_sh; i++)
		rc = write_shard(tmp, &sh[i], mx, &b, rep, err);
	if (rc)
		goto out;
	if (json_object_set_new(index, "metadata", json_pack("{s:I, s:s}", "total_size",
	    (json_int_t)rep->int8_bytes, "format", K3_STORE_INT8_FORMAT)) ||
	    json_object_set(index, "weight_map", wm)) {
		rc = k3_err_set(err, -ENOMEM, "out of memory");
		goto out;
	}
	char *itext = json_dumps(index, JSON_INDENT(1) | JSON_SORT_KEYS);
	rc = itext ? write_small(tmp, INDEX_NAME, itext, err) : k3_err_set(err, -ENOMEM, "out of memory");
	free(itext);
	if (!rc)
		rc = write_manifest(tmp, was, n_was, sh, n_sh, rep, err);
	if (!rc && (rc = k3_file_fsync_dir(tmp)))
		k3_err_set(err, rc, "cannot fsync '%s': %s", tmp, strerror(-rc));
	if (rc)
		goto out;
	/* the sources must be the files they were when we started */
	if ((rc = k3_store_model_idents(m, &after, &n_after, err)))
		goto out;
	for (size_t i = 0; i < n_was; i++) {
		char what[128];
		if (k3_store_pack_ident_match(&was[i], &after[i], what, sizeof(what)) !=
		    K3_STORE_PACK_SAME) {
			rc = k3_err_set(err, -EAGAIN, "'%s' changed while it was converted (%s):"
					" nothing written; run it again", was[i].name, what);
			goto out;
		}
	}
	/* read back: the model must open with what was written */
	struct k3_model_open_opts o = { .int8_dir = tmp, .int8_roles = K3_MODEL_INT8_ALL };
	struct k3_model *back = NULL;
	if ((rc = k3_model_open_with(k3_model_dir(m), &o, &back, err))) {
		k3_err_prefix(err, "the overlay just written does not read back");
		goto out;
	}
	k3_model_free(back);
	if ((rc = publish(tmp, dir, exists, err)))
		goto out;
	made_tmp = false;
	rep->written = true;
out:
	if (made_tmp)
		remove_dir(tmp);
	for (uint32_t i = 0; sh && i < n_sh; i++)
		free(sh[i].header);
	free(sh);
	free(mx);
	free(was);
	free(after);
	free(b.w);
	free(b.q);
	free(b.scales);
	json_decref(wm);
	json_decref(index);
	rep->seconds = now_s() - t0;
	return rc;
}

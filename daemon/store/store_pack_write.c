/*
 * store_pack_write.c - the pack writer behind k3ctl pack (see store_pack.h,
 * k3_store_pack_write_input), for expert and spine packs alike: lays out
 * the spans, decides what an existing pack needs (kept, compared with its
 * sources, re-signed to the files now, rewritten), copies the spans into a
 * temp file in bounded chunks (a spine span may be gigabytes), reads them
 * back and publishes it atomically. The byte format itself is in
 * store_pack.c (k3_store_pack_encode_head); this file only places spans.
 */
#include "store/store_pack.h"

#include "base/file.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/evp.h>

/* Bytes per read or write while copying, comparing or hashing a span. */
enum { CHUNK = 8 << 20 };

static uint64_t align_to(uint64_t v, uint64_t a)
{
	return (v + a - 1) / a * a;
}

static void layout_release(struct k3_store_pack_layout *lo)
{
	free(lo->spans);
	free(lo->arrays);
	free(lo->tensors);
	memset(lo, 0, sizeof(*lo));
}

/* The pack for `in`: spans and arrays placed (each span on a 4 KiB
 * boundary from the data offset on, each array on a 64-byte boundary
 * inside it, in input order), hashes unset. Checks that `in` is what
 * store_pack.h says it must be. */
static int plan_layout(const struct k3_store_pack_input *in, size_t n_idents,
		       struct k3_store_pack_layout *lo, struct k3_err *err)
{
	bool spine = in->kind == K3_STORE_PACK_SPINE;
	uint32_t next = 0;
	uint64_t cursor;

	memset(lo, 0, sizeof(*lo));
	lo->kind = in->kind;
	lo->n_spans = in->n_spans;
	lo->n_arrays = in->n_arrays;
	if ((in->kind != K3_STORE_PACK_EXPERTS && !spine) || (spine && !in->tensors) ||
	    (spine && (in->n_spans == 0 || in->n_spans > K3_STORE_PACK_MAX_SPINE_SPANS ||
		       in->n_arrays > K3_STORE_PACK_MAX_TENSORS)))
		return k3_err_set(err, -EINVAL, "pack input: %zu spans, %zu arrays of kind %d",
				  in->n_spans, in->n_arrays, (int)in->kind);
	lo->spans = calloc(in->n_spans ? in->n_spans : 1, sizeof(*lo->spans));
	lo->arrays = calloc(in->n_arrays ? in->n_arrays : 1, sizeof(*lo->arrays));
	lo->tensors = spine ? calloc(in->n_arrays ? in->n_arrays : 1, sizeof(*lo->tensors)) : NULL;
	if (!lo->spans || !lo->arrays || (spine && !lo->tensors))
		return k3_err_set(err, -ENOMEM, "out of memory");
	cursor = k3_store_pack_data_offset(lo, n_idents);
	for (size_t i = 0; i < in->n_spans; i++) {
		const struct k3_store_pack_span *q = &in->spans[i];
		struct k3_store_pack_span *sp = &lo->spans[i];
		uint64_t off = 0;
		bool kind_ok = spine ? q->kind >= K3_STORE_SPAN_LAYER && q->kind <= K3_STORE_SPAN_HEAD
				     : q->kind == K3_STORE_SPAN_EXPERT && q->count == K3_STORE_ARRAYS;
		if (!kind_ok || q->first != next || q->count == 0 || q->count > in->n_arrays - next ||
		    (i > 0 && (q->kind < in->spans[i - 1].kind ||
			       (q->kind == in->spans[i - 1].kind &&
				(q->layer < in->spans[i - 1].layer ||
				 (q->layer == in->spans[i - 1].layer &&
				  q->expert <= in->spans[i - 1].expert))))))
			return k3_err_set(err, -EINVAL, "pack input: span %zu is out of order or its"
					  " arrays do not follow the previous span's", i);
		*sp = (struct k3_store_pack_span){ .kind = q->kind, .layer = q->layer,
						   .expert = q->expert, .offset = cursor,
						   .first = q->first, .count = q->count };
		for (uint32_t a = q->first; a < q->first + q->count; a++) {
			const struct k3_store_extent *x = &in->extents[a];
			if (x->length == 0 || x->length > K3_STORE_PACK_MAX_TENSOR_BYTES ||
			    x->file >= k3_store_source_file_count(in->src))
				return k3_err_set(err, -EINVAL, "pack input: array %" PRIu32 " has %"
						  PRIu64 " bytes in file %" PRIu32, a, x->length, x->file);
			if (spine) {
				lo->tensors[a] = in->tensors[a];
				if (!memchr(lo->tensors[a].name, 0, sizeof(lo->tensors[a].name)))
					return k3_err_set(err, -EINVAL, "pack input: tensor %" PRIu32
							  " has a name longer than %d bytes", a,
							  K3_STORE_PACK_TENSOR_NAME_MAX);
			}
			off = align_to(off, K3_STORE_PACK_ARRAY_ALIGN);
			lo->arrays[a].offset = off;
			lo->arrays[a].length = x->length;
			off += x->length;   /* <= 2^40 per array, 2^16 arrays: no overflow */
		}
		next += q->count;
		sp->length = off;
		cursor = align_to(cursor + off, K3_STORE_ALIGN);
	}
	if (next != in->n_arrays)
		return k3_err_set(err, -EINVAL, "pack input: %zu arrays, the spans name %" PRIu32,
				  in->n_arrays, next);
	lo->file_bytes = cursor;
	return 0;
}

/* True when the pack holds exactly the planned spans, arrays and tensors,
 * where they are planned (so its span hashes can be kept when only its
 * source records change). */
static bool layout_matches(const struct k3_store_pack_layout *a,
			   const struct k3_store_pack_layout *b)
{
	if (a->kind != b->kind || a->n_spans != b->n_spans || a->n_arrays != b->n_arrays ||
	    a->file_bytes != b->file_bytes)
		return false;
	for (size_t i = 0; i < a->n_spans; i++) {
		const struct k3_store_pack_span *x = &a->spans[i], *y = &b->spans[i];
		if (x->kind != y->kind || x->layer != y->layer || x->expert != y->expert ||
		    x->offset != y->offset || x->length != y->length || x->first != y->first ||
		    x->count != y->count)
			return false;
	}
	for (size_t j = 0; j < a->n_arrays; j++) {
		if (a->arrays[j].offset != b->arrays[j].offset ||
		    a->arrays[j].length != b->arrays[j].length)
			return false;
		if (a->tensors) {
			const struct k3_store_pack_tensor *x = &a->tensors[j], *y = &b->tensors[j];
			if (strcmp(x->name, y->name) || x->dtype != y->dtype || x->ndim != y->ndim ||
			    memcmp(x->shape, y->shape, sizeof(x->shape)))
				return false;
		}
	}
	return true;
}

/* Every file of src must still be the file its ident describes: the stat
 * of the descriptor the bytes come from against the ident's. `when` says
 * when it was checked ("before" or "after") for the message. */
static int check_files(const struct k3_store_source *src, const struct k3_store_pack_ident *idents,
		       size_t n, const char *when, struct k3_err *err)
{
	for (size_t i = 0; i < n; i++) {
		struct k3_store_pack_ident now = idents[i];
		struct stat st;
		char what[128];
		int rc = k3_store_source_file_stat(src, (uint32_t)i, &st);
		if (rc)
			return k3_err_set(err, rc, "cannot stat '%s': %s",
					  k3_store_source_file_path(src, (uint32_t)i), strerror(-rc));
		k3_store_pack_ident_stat(&now, &st);
		if (k3_store_pack_ident_match(&idents[i], &now, what, sizeof(what)) !=
		    K3_STORE_PACK_SAME)
			return k3_err_set(err, -EAGAIN, "'%s' changed %s k3ctl pack read it (%s no"
					  " longer as when its header was hashed): run k3ctl pack"
					  " again once nothing writes the model",
					  k3_store_source_file_path(src, (uint32_t)i), when, what);
	}
	return 0;
}

/* Two K3_STORE_ALIGN-aligned chunk buffers: what a source or the pack
 * reads land in (with O_DIRECT, the aligned superset of CHUNK bytes). */
struct bufs {
	uint8_t *a, *b;
};

static int bufs_init(struct bufs *bf, struct k3_err *err)
{
	void *a = NULL, *b = NULL;

	if (posix_memalign(&a, K3_STORE_ALIGN, CHUNK + K3_STORE_ALIGN) ||
	    posix_memalign(&b, K3_STORE_ALIGN, CHUNK + K3_STORE_ALIGN)) {
		free(a);
		return k3_err_set(err, -ENOMEM, "out of memory for the copy buffers");
	}
	bf->a = a;
	bf->b = b;
	return 0;
}

static void bufs_release(struct bufs *bf)
{
	free(bf->a);
	free(bf->b);
}

/* n <= CHUNK bytes of `file` of src at `off` into buf; *out points at them. */
static int read_at(const struct k3_store_source *src, uint32_t file, uint64_t off, uint64_t n,
		   uint8_t *buf, const uint8_t **out)
{
	struct k3_store_read rd = { .file = file, .offset = off, .length = n,
				    .slot_offset = off % K3_STORE_ALIGN };
	int64_t got = k3_store_source_pread(src, &rd, buf);

	if (got < 0)
		return (int)got;
	*out = buf + rd.slot_offset;
	return 0;
}

/* One piece of a span, in span order: `len` bytes at span offset `pos`,
 * which are zero (a gap before a 64-byte aligned array) or, from the
 * source, the bytes of array `array` (data). */
typedef int piece_fn(void *ctx, uint64_t pos, uint64_t len, const uint8_t *data, uint32_t array);

static const uint8_t zeros[K3_STORE_PACK_ARRAY_ALIGN];

/* Walks span i of lo in pieces of at most CHUNK bytes, reading each
 * array's bytes from in's source into buf, and calls fn for each. */
static int walk_span(const struct k3_store_pack_input *in, const struct k3_store_pack_layout *lo,
		     size_t i, uint8_t *buf, piece_fn *fn, void *ctx, struct k3_err *err)
{
	const struct k3_store_pack_span *sp = &lo->spans[i];
	uint64_t pos = 0;
	char name[64];
	int rc;

	for (uint32_t a = sp->first; a < sp->first + sp->count; a++) {
		const struct k3_store_pack_array *x = &lo->arrays[a];
		const struct k3_store_extent *ext = &in->extents[a];
		if (x->offset > pos && (rc = fn(ctx, pos, x->offset - pos, zeros, a)) != 0)
			return rc;
		for (uint64_t done = 0; done < x->length;) {
			uint64_t n = x->length - done < CHUNK ? x->length - done : CHUNK;
			const uint8_t *data = NULL;
			rc = read_at(in->src, ext->file, ext->offset + done, n, buf, &data);
			if (rc) {
				k3_store_pack_span_name(sp, name, sizeof(name));
				return k3_err_set(err, rc, "cannot read %s from '%s': %s", name,
						  k3_store_source_file_path(in->src, ext->file),
						  strerror(-rc));
			}
			if ((rc = fn(ctx, x->offset + done, n, data, a)) != 0)
				return rc;
			done += n;
		}
		pos = x->offset + x->length;
	}
	return 0;
}

/* Writing: each piece into the temp file and into the span's hash. */
struct write_ctx {
	int fd;
	uint64_t span_offset;
	EVP_MD_CTX *md;
	struct k3_err *err;
};

static int write_piece(void *vctx, uint64_t pos, uint64_t len, const uint8_t *data, uint32_t array)
{
	struct write_ctx *w = vctx;
	int rc;

	(void)array;
	if (EVP_DigestUpdate(w->md, data, len) != 1)
		return k3_err_set(w->err, -EIO, "SHA-256 failed");
	if (data == zeros)
		return 0;   /* the file was sized with zeros */
	rc = k3_file_pwrite_all(w->fd, data, len, w->span_offset + pos);
	return rc ? k3_err_set(w->err, rc, "cannot write the pack: %s", strerror(-rc)) : 0;
}

/* Copies every span into the temp file fd; fills the spans' hashes. */
static int write_spans(int fd, const struct k3_store_pack_input *in,
		       struct k3_store_pack_layout *lo, struct k3_err *err)
{
	struct write_ctx w = { .fd = fd, .md = EVP_MD_CTX_new(), .err = err };
	struct bufs bf = { 0 };
	int rc = w.md ? bufs_init(&bf, err) : k3_err_set(err, -ENOMEM, "out of memory");

	for (size_t i = 0; rc == 0 && i < lo->n_spans; i++) {
		unsigned len = 32;
		w.span_offset = lo->spans[i].offset;
		if (EVP_DigestInit_ex(w.md, EVP_sha256(), NULL) != 1) {
			rc = k3_err_set(err, -EIO, "SHA-256 failed");
			break;
		}
		rc = walk_span(in, lo, i, bf.a, write_piece, &w, err);
		if (rc == 0 && EVP_DigestFinal_ex(w.md, lo->spans[i].sha256, &len) != 1)
			rc = k3_err_set(err, -EIO, "SHA-256 failed");
	}
	EVP_MD_CTX_free(w.md);
	bufs_release(&bf);
	return rc;
}

/* Comparing: each piece against the same bytes of the existing pack, read
 * through psrc (file 0); the first difference stops the walk (1). */
struct cmp_ctx {
	const struct k3_store_source *psrc;
	uint64_t span_offset;
	uint8_t *buf;
	uint32_t differs;            /* the array whose piece differed */
	struct k3_err *err;
};

static int cmp_piece(void *vctx, uint64_t pos, uint64_t len, const uint8_t *data, uint32_t array)
{
	struct cmp_ctx *c = vctx;
	const uint8_t *have = NULL;
	int rc = read_at(c->psrc, 0, c->span_offset + pos, len, c->buf, &have);

	if (rc)
		return k3_err_set(c->err, rc, "cannot read the pack '%s': %s",
				  k3_store_source_file_path(c->psrc, 0), strerror(-rc));
	if (memcmp(have, data, len) == 0)
		return 0;
	c->differs = array;
	return 1;
}

/* SHA-256 of span sp of the pack read through psrc (file 0). */
static int hash_pack_span(const struct k3_store_source *psrc, const struct k3_store_pack_span *sp,
			  uint8_t *buf, uint8_t out[32])
{
	EVP_MD_CTX *md = EVP_MD_CTX_new();
	unsigned len = 32;
	int rc = md && EVP_DigestInit_ex(md, EVP_sha256(), NULL) == 1 ? 0 : -ENOMEM;

	for (uint64_t done = 0; rc == 0 && done < sp->length;) {
		uint64_t n = sp->length - done < CHUNK ? sp->length - done : CHUNK;
		const uint8_t *data = NULL;
		rc = read_at(psrc, 0, sp->offset + done, n, buf, &data);
		if (rc == 0 && EVP_DigestUpdate(md, data, n) != 1)
			rc = -EIO;
		done += n;
	}
	if (rc == 0 && EVP_DigestFinal_ex(md, out, &len) != 1)
		rc = -EIO;
	EVP_MD_CTX_free(md);
	return rc;
}

/* Compares every span of the existing pack `old` at path with the bytes it
 * was copied from (in; old's layout is the planned one: layout_matches).
 * Both sides are read (the pack through a source of its own, with O_DIRECT
 * where it works, so 1.5 TB does not churn the page cache). Returns 0 when
 * every span equals its source bytes; 1 when one differs from them but
 * matches its own SHA-256 (the sources changed: stale, why names the span
 * and the file); -EBADMSG when it also fails its own SHA-256 (the pack is
 * damaged); or an I/O errno. */
static int compare_spans(const char *path, const struct k3_store_pack *old,
			 const struct k3_store_pack_input *in, uint64_t *compared, char *why,
			 size_t why_size, struct k3_err *err)
{
	const struct k3_store_pack_layout *lo = k3_store_pack_layout(old);
	struct k3_store_source *psrc = k3_store_source_new(K3_STORE_DIRECT_AUTO);
	struct bufs bf = { 0 };
	uint32_t file;
	int rc;

	if (!psrc)
		return k3_err_set(err, -ENOMEM, "out of memory");
	rc = k3_store_source_add_file(psrc, path, &file, err);
	if (rc == 0)
		rc = bufs_init(&bf, err);
	for (size_t i = 0; rc == 0 && i < lo->n_spans; i++) {
		const struct k3_store_pack_span *sp = &lo->spans[i];
		struct cmp_ctx c = { .psrc = psrc, .span_offset = sp->offset, .buf = bf.b, .err = err };
		uint8_t sha[32];
		char name[64];
		rc = walk_span(in, lo, i, bf.a, cmp_piece, &c, err);
		if (rc < 0)
			break;
		*compared += sp->length;
		if (rc == 0)
			continue;
		/* differs: damaged (fails its own hash) or stale */
		rc = hash_pack_span(psrc, sp, bf.b, sha);
		if (rc) {
			k3_err_set(err, rc, "cannot read the pack '%s': %s", path, strerror(-rc));
			break;
		}
		if ((rc = k3_store_pack_span_check(path, sp, sha, err)) != 0)
			break;
		k3_store_pack_span_name(sp, name, sizeof(name));
		snprintf(why, why_size, "%s differs from its bytes in '%s'", name,
			 k3_store_source_file_path(in->src, in->extents[c.differs].file));
		rc = 1;
	}
	bufs_release(&bf);
	k3_store_source_free(psrc);
	return rc;
}

/* Rewrites, in place, the header and metadata of the pack at path (whose
 * spans equal their sources' bytes) with the sources' identities now. One
 * write of [0, metadata end), then fsync: a torn write leaves hashes that
 * do not match, so the pack is refused (and rewritten by the next k3ctl
 * pack), never trusted with stale identities. */
static int resign(const char *path, const struct k3_store_pack *old,
		  const struct k3_store_pack_ident *idents, size_t n_idents, struct k3_err *err)
{
	size_t head_bytes = 0;
	uint8_t *head = NULL;
	int fd = -1, rc;

	rc = k3_store_pack_encode_head(idents, n_idents, k3_store_pack_layout(old), &head,
				       &head_bytes);
	if (rc)
		return k3_err_set(err, rc, "out of memory");
	fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0) {
		rc = k3_err_set(err, -errno, "cannot open '%s' to update its source records: %s",
				path, strerror(errno));
		goto out;
	}
	rc = k3_file_pwrite_all(fd, head, head_bytes, 0);
	if (rc == 0 && fsync(fd) != 0)
		rc = -errno;
	if (rc)
		k3_err_set(err, rc, "cannot update the source records of '%s': %s", path,
			   strerror(-rc));
out:
	if (fd >= 0)
		close(fd);
	free(head);
	return rc;
}

/* Writes the layout into a temp file beside path, reads it back, renames
 * it over path. */
static int publish(const char *path, const struct k3_store_pack_input *in,
		   const struct k3_store_pack_ident *idents, size_t n_idents,
		   struct k3_store_pack_layout *lo, struct k3_store_pack_result *res,
		   struct k3_err *err)
{
	struct k3_store_pack *back = NULL;
	uint8_t *head = NULL;
	size_t head_bytes = 0;
	char tmp[PATH_MAX];
	int fd, rc;

	if (snprintf(tmp, sizeof(tmp), "%s.tmp.XXXXXX", path) >= (int)sizeof(tmp))
		return k3_err_set(err, -ENAMETOOLONG, "pack path '%s' is too long", path);
	fd = mkstemp(tmp);
	if (fd < 0)
		return k3_err_set(err, -errno, "cannot create '%s': %s", tmp, strerror(errno));
	if (fchmod(fd, 0644) != 0 || ftruncate(fd, (off_t)lo->file_bytes) != 0) {
		rc = k3_err_set(err, -errno, "cannot size '%s' to %" PRIu64 " bytes: %s", tmp,
				lo->file_bytes, strerror(errno));
		goto out_unlink;
	}
	rc = write_spans(fd, in, lo, err);
	/* the bytes copied came from the files the idents describe */
	if (rc == 0)
		rc = check_files(in->src, idents, n_idents, "while", err);
	if (rc)
		goto out_unlink;
	rc = k3_store_pack_encode_head(idents, n_idents, lo, &head, &head_bytes);
	if (rc) {
		k3_err_set(err, rc, "out of memory");
		goto out_unlink;
	}
	if ((rc = k3_file_pwrite_all(fd, head, head_bytes, 0)) != 0) {
		k3_err_set(err, rc, "cannot write '%s': %s", tmp, strerror(-rc));
		goto out_unlink;
	}
	if (fsync(fd) != 0) {
		rc = k3_err_set(err, -errno, "cannot fsync '%s': %s", tmp, strerror(errno));
		goto out_unlink;
	}
	/* Read back what reached the disk before publishing it: the pages are
	 * clean after fsync, so dropping them makes the reads go to the disk
	 * rather than check the page cache against itself. */
	(void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
	rc = k3_store_pack_open(tmp, idents, n_idents, K3_STORE_PACK_VERIFY, &back, err);
	if (rc)
		goto out_unlink;
	for (size_t i = 0; i < lo->n_spans; i++)
		res->verified_bytes += lo->spans[i].length;
	if (rename(tmp, path) != 0) {
		rc = k3_err_set(err, -errno, "cannot rename '%s' to '%s': %s", tmp, path,
				strerror(errno));
		goto out_unlink;
	}
	rc = k3_file_fsync_parent(path);
	if (rc)
		k3_err_set(err, rc, "cannot fsync the directory of '%s': %s", path, strerror(-rc));
	res->written = true;
	goto out;

out_unlink:
	unlink(tmp);
out:
	close(fd);
	k3_store_pack_free(back);
	free(head);
	return rc;
}

/* What an existing, structurally valid pack of the same layout needs:
 * returns 0 when it is kept (compared and re-signed as needed), 1 when it
 * must be rewritten (res->why says why), or a negative errno. */
static int check_existing(const char *path, const struct k3_store_pack *old,
			  const struct k3_store_pack_input *in,
			  const struct k3_store_pack_ident *idents, size_t n_idents,
			  unsigned flags, struct k3_store_pack_result *res, struct k3_err *err)
{
	enum k3_store_pack_match m = K3_STORE_PACK_SAME;
	char what[128] = "";
	size_t changed = 0, first = 0;
	int rc;

	if (k3_store_pack_source_count(old) != n_idents) {
		snprintf(res->why, sizeof(res->why), "it was built from %zu source files, not %zu",
			 k3_store_pack_source_count(old), n_idents);
		return 1;
	}
	for (size_t i = 0; i < n_idents; i++) {
		char w[128];
		enum k3_store_pack_match mi =
			k3_store_pack_ident_match(k3_store_pack_source(old, i), &idents[i], w,
						  sizeof(w));
		if (mi == K3_STORE_PACK_OTHER) {
			snprintf(res->why, sizeof(res->why), "source '%s' is another file (%s differ)",
				 idents[i].name, w);
			return 1;
		}
		if (mi == K3_STORE_PACK_CHANGED && changed++ == 0) {
			first = i;
			memcpy(what, w, sizeof(what));
		}
		if (mi > m)
			m = mi;
	}
	if (m == K3_STORE_PACK_SAME && !(flags & K3_STORE_PACK_VERIFY))
		return 0;
	rc = compare_spans(path, old, in, &res->verified_bytes, res->why, sizeof(res->why), err);
	if (rc)
		return rc;   /* 1: stale (why set), or an error */
	if (m == K3_STORE_PACK_CHANGED) {
		/* the bytes compared came from the files the idents describe */
		rc = check_files(in->src, idents, n_idents, "while", err);
		if (rc == 0)
			rc = resign(path, old, idents, n_idents, err);
		if (rc)
			return rc;
		res->reverified = true;
		snprintf(res->why, sizeof(res->why), "%zu source file%s changed ('%s': %s); every"
			 " span still equals its bytes", changed, changed == 1 ? "" : "s",
			 idents[first].name, what);
	}
	return 0;
}

int k3_store_pack_write_input(const char *path, const struct k3_store_pack_input *in,
			      const struct k3_store_pack_ident *idents, size_t n_idents,
			      unsigned flags, struct k3_store_pack_result *res,
			      struct k3_err *err)
{
	struct k3_store_pack_result r0 = { 0 };
	struct k3_store_pack *old = NULL;
	struct k3_store_pack_layout lo = { 0 };
	struct k3_err oerr = { 0 };
	int rc;

	if (!res)
		res = &r0;
	memset(res, 0, sizeof(*res));
	if (n_idents != k3_store_source_file_count(in->src) || n_idents == 0)
		return k3_err_set(err, -EINVAL, "%zu source identities for %zu source files",
				  n_idents, k3_store_source_file_count(in->src));
	rc = check_files(in->src, idents, n_idents, "before", err);
	if (rc)
		return rc;
	rc = plan_layout(in, n_idents, &lo, err);
	if (rc)
		goto out;
	res->n_spans = lo.n_spans;
	res->file_bytes = lo.file_bytes;
	for (size_t j = 0; j < lo.n_arrays; j++)
		res->payload_bytes += lo.arrays[j].length;

	/* An existing pack is checked, not rewritten, when its layout is the
	 * one planned: re-running k3ctl pack is cheap and safe. */
	rc = k3_store_pack_open(path, NULL, 0, 0, &old, &oerr);
	if (rc == 0 && layout_matches(k3_store_pack_layout(old), &lo)) {
		rc = check_existing(path, old, in, idents, n_idents, flags, res, err);
		if (rc <= 0)
			goto out;
	} else if (rc == 0) {
		snprintf(res->why, sizeof(res->why), "it holds other %s or another layout",
			 lo.kind == K3_STORE_PACK_SPINE ? "tensors" : "experts");
	} else if (rc != -ENOENT) {
		snprintf(res->why, sizeof(res->why), "%s", oerr.msg);
	}
	res->replaced = rc != -ENOENT;
	res->verified_bytes = 0;
	rc = publish(path, in, idents, n_idents, &lo, res, err);
out:
	k3_store_pack_free(old);
	layout_release(&lo);
	return rc;
}

int k3_store_pack_write(const char *path, const struct k3_store_source *src,
			const struct k3_store_pack_ident *idents, size_t n_idents,
			unsigned flags, struct k3_store_pack_result *res,
			struct k3_err *err)
{
	size_t n = k3_store_source_count(src);
	size_t *order = malloc((n ? n : 1) * sizeof(*order));
	struct k3_store_pack_span *spans = calloc(n ? n : 1, sizeof(*spans));
	struct k3_store_extent *ext = calloc(n ? n * K3_STORE_ARRAYS : 1, sizeof(*ext));
	int rc;

	if (!order || !spans || !ext) {
		rc = k3_err_set(err, -ENOMEM, "out of memory");
		goto out;
	}
	for (size_t i = 0; i < n; i++)
		order[i] = i;
	qsort_r(order, n, sizeof(*order), k3_store_source_cmp_index, (void *)src);
	for (size_t i = 0; i < n; i++) {
		const struct k3_store_expert *e = k3_store_source_expert(src, order[i]);
		spans[i] = (struct k3_store_pack_span){ .kind = K3_STORE_SPAN_EXPERT,
			.layer = e->layer, .expert = e->expert,
			.first = (uint32_t)(i * K3_STORE_ARRAYS), .count = K3_STORE_ARRAYS };
		memcpy(&ext[i * K3_STORE_ARRAYS], e->ext, sizeof(e->ext));
	}
	struct k3_store_pack_input in = { .kind = K3_STORE_PACK_EXPERTS, .src = src,
					  .spans = spans, .n_spans = n, .extents = ext,
					  .n_arrays = n * K3_STORE_ARRAYS };
	rc = k3_store_pack_write_input(path, &in, idents, n_idents, flags, res, err);
out:
	free(order);
	free(spans);
	free(ext);
	return rc;
}

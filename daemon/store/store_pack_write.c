/*
 * store_pack_write.c - the pack writer behind k3ctl pack (see store_pack.h,
 * k3_store_pack_write): lays out a layer's experts, decides what an
 * existing pack needs (kept, compared with its sources, re-signed to the
 * files now, rewritten), copies the spans into a temp file, reads them
 * back and publishes it atomically. The byte format itself is in
 * store_pack.c (k3_store_pack_encode_head); this file only places spans.
 */
#include "store/store_pack.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/evp.h>

static uint64_t align_to(uint64_t v, uint64_t a)
{
	return (v + a - 1) / a * a;
}

static int sha256(const void *data, size_t n, uint8_t out[32])
{
	unsigned len = 32;
	return EVP_Digest(data, n, out, &len, EVP_sha256(), NULL) == 1 ? 0 : -EIO;
}

static int pwrite_full(int fd, const void *buf, size_t n, uint64_t off)
{
	size_t put = 0;

	while (put < n) {
		ssize_t r = pwrite(fd, (const uint8_t *)buf + put, n - put, (off_t)(off + put));
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -errno;
		put += (size_t)r;
	}
	return 0;
}

/* The pack for src: spans sorted by (layer, expert) and placed, hashes
 * unset; order[i] is the source index of span i. */
struct layout {
	struct k3_store_pack_span *span;
	size_t *order;
	size_t n;
	uint64_t file_bytes;
};

static void layout_free(struct layout *lo)
{
	free(lo->span);
	free(lo->order);
}

static int plan_layout(const struct k3_store_source *src, size_t n_idents, struct layout *lo)
{
	size_t n = k3_store_source_count(src);
	uint64_t cursor;

	lo->n = n;
	lo->order = malloc((n ? n : 1) * sizeof(*lo->order));
	lo->span = calloc(n ? n : 1, sizeof(*lo->span));
	if (!lo->order || !lo->span)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++)
		lo->order[i] = i;
	qsort_r(lo->order, n, sizeof(*lo->order), k3_store_source_cmp_index, (void *)src);
	cursor = k3_store_pack_data_offset(n_idents, n);
	for (size_t i = 0; i < n; i++) {
		const struct k3_store_expert *e = k3_store_source_expert(src, lo->order[i]);
		struct k3_store_pack_span *sp = &lo->span[i];
		uint64_t off = 0;
		sp->layer = e->layer;
		sp->expert = e->expert;
		sp->offset = cursor;
		for (int a = 0; a < K3_STORE_ARRAYS; a++) {
			off = align_to(off, K3_STORE_PACK_ARRAY_ALIGN);
			sp->arr_off[a] = off;
			sp->arr_len[a] = e->ext[a].length;
			off += e->ext[a].length;   /* <= 6 GiB: no overflow */
		}
		sp->length = off;
		cursor = align_to(cursor + off, K3_STORE_ALIGN);
	}
	lo->file_bytes = cursor;
	return 0;
}

/* True when the pack holds exactly the planned spans, where they are
 * planned (so its span hashes can be kept when only its source records
 * change). */
static bool layout_matches(const struct k3_store_pack *p, const struct layout *lo)
{
	if (k3_store_pack_expert_count(p) != lo->n || k3_store_pack_file_bytes(p) != lo->file_bytes)
		return false;
	for (size_t i = 0; i < lo->n; i++) {
		const struct k3_store_pack_span *a = k3_store_pack_span(p, i), *b = &lo->span[i];
		if (a->layer != b->layer || a->expert != b->expert || a->offset != b->offset ||
		    a->length != b->length)
			return false;
		for (int k = 0; k < K3_STORE_ARRAYS; k++)
			if (a->arr_off[k] != b->arr_off[k] || a->arr_len[k] != b->arr_len[k])
				return false;
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

/* Buffers for one expert: its six arrays read from a source (slot, as the
 * store reads them) and its span as the pack lays it out. */
struct span_buf {
	uint8_t *slot, *span;
};

static int span_buf_init(struct span_buf *b, const struct k3_store_source *src,
			 const struct layout *lo, struct k3_err *err)
{
	uint64_t slot_bytes = k3_store_source_slot_bytes(src), span_max = 0;
	void *slot = NULL;

	for (size_t i = 0; i < lo->n; i++)
		if (lo->span[i].length > span_max)
			span_max = lo->span[i].length;
	b->span = malloc(span_max ? span_max : 1);
	if (posix_memalign(&slot, K3_STORE_ALIGN, slot_bytes ? slot_bytes : K3_STORE_ALIGN))
		slot = NULL;
	b->slot = slot;
	if (!b->slot || !b->span)
		return k3_err_set(err, -ENOMEM, "out of memory for a %" PRIu64 "-byte span", span_max);
	return 0;
}

static void span_buf_release(struct span_buf *b)
{
	free(b->slot);
	free(b->span);
}

/* Builds span i of the layout from the bytes of its expert in src: the
 * arrays at their span offsets, gaps zero. */
static int build_span(const struct k3_store_source *src, const struct layout *lo, size_t i,
		      struct span_buf *b, struct k3_err *err)
{
	const struct k3_store_pack_span *sp = &lo->span[i];
	struct k3_store_plan plan;

	k3_store_source_plan(src, lo->order[i], &plan);
	for (unsigned r = 0; r < plan.n_reads; r++) {
		int64_t got = k3_store_source_pread(src, &plan.read[r], b->slot);
		if (got < 0)
			return k3_err_set(err, (int)got, "cannot read expert (%" PRIu32 ", %" PRIu32
					  ") from '%s': %s", sp->layer, sp->expert,
					  k3_store_source_file_path(src, plan.read[r].file),
					  strerror((int)-got));
	}
	memset(b->span, 0, sp->length);
	for (int a = 0; a < K3_STORE_ARRAYS; a++)
		memcpy(b->span + sp->arr_off[a], b->slot + plan.array_offset[a], sp->arr_len[a]);
	return 0;
}

/* Copies every expert into the temp file fd; fills the spans' hashes. */
static int write_spans(int fd, const struct k3_store_source *src, struct layout *lo,
		       struct k3_err *err)
{
	struct span_buf b;
	int rc = span_buf_init(&b, src, lo, err);

	for (size_t i = 0; rc == 0 && i < lo->n; i++) {
		struct k3_store_pack_span *sp = &lo->span[i];
		rc = build_span(src, lo, i, &b, err);
		if (rc == 0 && ((rc = sha256(b.span, sp->length, sp->sha256)) != 0 ||
				(rc = pwrite_full(fd, b.span, sp->length, sp->offset)) != 0))
			k3_err_set(err, rc, "cannot write the pack: %s", strerror(-rc));
	}
	span_buf_release(&b);
	return rc;
}

/* Compares every span of the existing pack `old` at path with the bytes it
 * was copied from (src, the layout being the pack's: layout_matches).
 * Both sides are read (the pack through a source of its own, with
 * O_DIRECT where it works, so 1.5 TB does not churn the page cache).
 * Returns 0 when every span equals its source bytes; 1 when one differs
 * from them but matches its own SHA-256 (the sources changed: stale, why
 * names the expert and the file); -EBADMSG when it also fails its own
 * SHA-256 (the pack is damaged); or an I/O errno. */
static int compare_spans(const char *path, const struct k3_store_pack *old,
			 const struct k3_store_source *src, const struct layout *lo,
			 uint64_t *compared, char *why, size_t why_size, struct k3_err *err)
{
	struct k3_store_source *psrc = k3_store_source_new(K3_STORE_DIRECT_AUTO);
	struct span_buf b = { 0 };
	struct k3_store_plan pplan;
	void *pslot = NULL;
	int rc;

	if (!psrc)
		return k3_err_set(err, -ENOMEM, "out of memory");
	rc = k3_store_pack_add_to_source(old, path, psrc, err);
	if (rc == 0)
		rc = span_buf_init(&b, src, lo, err);
	if (rc == 0 && posix_memalign(&pslot, K3_STORE_ALIGN, k3_store_source_slot_bytes(psrc)))
		rc = k3_err_set(err, -ENOMEM, "out of memory");
	for (size_t i = 0; rc == 0 && i < lo->n; i++) {
		const struct k3_store_pack_span *sp = k3_store_pack_span(old, i);
		int64_t got;
		int differs = -1;
		uint8_t sha[32];
		rc = build_span(src, lo, i, &b, err);
		if (rc)
			break;
		/* span i of the pack is expert i of psrc, one read */
		k3_store_source_plan(psrc, i, &pplan);
		got = k3_store_source_pread(psrc, &pplan.read[0], pslot);
		if (got < 0) {
			rc = k3_err_set(err, (int)got, "'%s': cannot read expert (%" PRIu32 ", %" PRIu32
					"): %s", path, sp->layer, sp->expert, strerror((int)-got));
			break;
		}
		*compared += sp->length;
		const uint8_t *span = (const uint8_t *)pslot + pplan.read[0].slot_offset;
		if (memcmp(span, b.span, sp->length) == 0)
			continue;
		for (int a = 0; a < K3_STORE_ARRAYS && differs < 0; a++)
			if (memcmp(span + sp->arr_off[a], b.span + sp->arr_off[a], sp->arr_len[a]))
				differs = a;
		if ((rc = sha256(span, sp->length, sha)) != 0 ||
		    (rc = k3_store_pack_span_check(path, sp, sha, err)) != 0)
			break;
		const struct k3_store_expert *e = k3_store_source_expert(src, lo->order[i]);
		snprintf(why, why_size, "expert (%" PRIu32 ", %" PRIu32 ") differs from its bytes in"
			 " '%s'", sp->layer, sp->expert,
			 k3_store_source_file_path(src, e->ext[differs < 0 ? 0 : differs].file));
		rc = 1;
	}
	free(pslot);
	span_buf_release(&b);
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
	size_t n = k3_store_pack_expert_count(old), head_bytes = 0;
	struct k3_store_pack_span *spans = malloc((n ? n : 1) * sizeof(*spans));
	uint8_t *head = NULL;
	int fd = -1, rc;

	if (!spans)
		return k3_err_set(err, -ENOMEM, "out of memory");
	for (size_t i = 0; i < n; i++)
		spans[i] = *k3_store_pack_span(old, i);
	rc = k3_store_pack_encode_head(idents, n_idents, spans, n, k3_store_pack_file_bytes(old),
				       &head, &head_bytes);
	if (rc) {
		k3_err_set(err, rc, "out of memory");
		goto out;
	}
	fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0) {
		rc = k3_err_set(err, -errno, "cannot open '%s' to update its source records: %s",
				path, strerror(errno));
		goto out;
	}
	rc = pwrite_full(fd, head, head_bytes, 0);
	if (rc == 0 && fsync(fd) != 0)
		rc = -errno;
	if (rc)
		k3_err_set(err, rc, "cannot update the source records of '%s': %s", path,
			   strerror(-rc));
out:
	if (fd >= 0)
		close(fd);
	free(head);
	free(spans);
	return rc;
}

static int fsync_dir_of(const char *path)
{
	char buf[PATH_MAX];
	int fd, rc = 0;

	if (strlen(path) >= sizeof(buf))
		return -ENAMETOOLONG;
	strcpy(buf, path);
	fd = open(dirname(buf), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (fsync(fd) != 0)
		rc = -errno;
	close(fd);
	return rc;
}

/* Writes the layout into a temp file beside path, reads it back, renames
 * it over path. */
static int publish(const char *path, const struct k3_store_source *src,
		   const struct k3_store_pack_ident *idents, size_t n_idents, struct layout *lo,
		   struct k3_store_pack_result *res, struct k3_err *err)
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
	rc = write_spans(fd, src, lo, err);
	/* the bytes copied came from the files the idents describe */
	if (rc == 0)
		rc = check_files(src, idents, n_idents, "while", err);
	if (rc)
		goto out_unlink;
	rc = k3_store_pack_encode_head(idents, n_idents, lo->span, lo->n, lo->file_bytes, &head,
				       &head_bytes);
	if (rc) {
		k3_err_set(err, rc, "out of memory");
		goto out_unlink;
	}
	if ((rc = pwrite_full(fd, head, head_bytes, 0)) != 0) {
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
	for (size_t i = 0; i < lo->n; i++)
		res->verified_bytes += lo->span[i].length;
	if (rename(tmp, path) != 0) {
		rc = k3_err_set(err, -errno, "cannot rename '%s' to '%s': %s", tmp, path,
				strerror(errno));
		goto out_unlink;
	}
	rc = fsync_dir_of(path);
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
			  const struct k3_store_source *src,
			  const struct k3_store_pack_ident *idents, size_t n_idents,
			  const struct layout *lo, unsigned flags,
			  struct k3_store_pack_result *res, struct k3_err *err)
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
	rc = compare_spans(path, old, src, lo, &res->verified_bytes, res->why, sizeof(res->why),
			   err);
	if (rc)
		return rc;   /* 1: stale (why set), or an error */
	if (m == K3_STORE_PACK_CHANGED) {
		/* the bytes compared came from the files the idents describe */
		rc = check_files(src, idents, n_idents, "while", err);
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

int k3_store_pack_write(const char *path, const struct k3_store_source *src,
			const struct k3_store_pack_ident *idents, size_t n_idents,
			unsigned flags, struct k3_store_pack_result *res,
			struct k3_err *err)
{
	struct k3_store_pack_result r0 = { 0 };
	struct k3_store_pack *old = NULL;
	struct layout lo = { 0 };
	struct k3_err oerr = { 0 };
	int rc;

	if (!res)
		res = &r0;
	memset(res, 0, sizeof(*res));
	if (n_idents != k3_store_source_file_count(src) || n_idents == 0)
		return k3_err_set(err, -EINVAL, "%zu source identities for %zu source files",
				  n_idents, k3_store_source_file_count(src));
	rc = check_files(src, idents, n_idents, "before", err);
	if (rc)
		return rc;
	rc = plan_layout(src, n_idents, &lo);
	if (rc) {
		layout_free(&lo);
		return k3_err_set(err, rc, "out of memory");
	}
	res->n_experts = lo.n;
	res->file_bytes = lo.file_bytes;
	for (size_t i = 0; i < lo.n; i++)
		for (int a = 0; a < K3_STORE_ARRAYS; a++)
			res->payload_bytes += lo.span[i].arr_len[a];

	/* An existing pack is checked, not rewritten, when its layout is the
	 * one planned: re-running k3ctl pack is cheap and safe. */
	rc = k3_store_pack_open(path, NULL, 0, 0, &old, &oerr);
	if (rc == 0 && layout_matches(old, &lo)) {
		rc = check_existing(path, old, src, idents, n_idents, &lo, flags, res, err);
		if (rc <= 0)
			goto out;
	} else if (rc == 0) {
		snprintf(res->why, sizeof(res->why), "it holds other experts or another layout");
	} else if (rc != -ENOENT) {
		snprintf(res->why, sizeof(res->why), "%s", oerr.msg);
	}
	res->replaced = rc != -ENOENT;
	res->verified_bytes = 0;
	rc = publish(path, src, idents, n_idents, &lo, res, err);
out:
	k3_store_pack_free(old);
	layout_free(&lo);
	return rc;
}

/* store_pack.c - expert pack writer, reader and verifier (see store_pack.h). */
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

#define PACK_MAGIC "K3XPACK\n"

enum {
	HDR_BYTES = 4096,
	HDR_HASHED = 88,                 /* header bytes covered by header_sha256 */
	SRC_REC = 256 + 8 + 8 + 32,      /* name, size, header_bytes, digest */
	DIR_REC = 4 + 4 + 8 + 8 + K3_STORE_ARRAYS * 16 + 32,
	HASH_CHUNK = 4 << 20,            /* bytes per read while hashing */
};

struct pack_entry {
	uint32_t layer, expert;
	uint64_t offset, length;
	uint64_t arr_off[K3_STORE_ARRAYS], arr_len[K3_STORE_ARRAYS];
	uint8_t sha[32];
};

struct k3_store_pack {
	uint64_t file_bytes, data_offset;
	struct k3_store_pack_ident *idents;
	size_t n_idents;
	struct pack_entry *ent;
	size_t n_ent;
};

/* ---- little-endian codec ---- */

static void put_u32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static void put_u64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_u32(const uint8_t *p)
{
	uint32_t v = 0;
	for (int i = 3; i >= 0; i--)
		v = (v << 8) | p[i];
	return v;
}

static uint64_t get_u64(const uint8_t *p)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = (v << 8) | p[i];
	return v;
}

static uint64_t align_to(uint64_t v, uint64_t a)
{
	return (v + a - 1) / a * a;
}

static int sha256(const void *data, size_t n, uint8_t out[32])
{
	unsigned len = 32;
	return EVP_Digest(data, n, out, &len, EVP_sha256(), NULL) == 1 ? 0 : -EIO;
}

static int pread_full(int fd, void *buf, size_t n, uint64_t off)
{
	size_t got = 0;

	while (got < n) {
		ssize_t r = pread(fd, (uint8_t *)buf + got, n - got, (off_t)(off + got));
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -errno;
		if (r == 0)
			return -EIO;
		got += (size_t)r;
	}
	return 0;
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

/* SHA-256 of n bytes of fd at off, read in bounded chunks. */
static int hash_range(int fd, uint64_t off, uint64_t n, uint8_t *buf, uint8_t out[32])
{
	EVP_MD_CTX *ctx = EVP_MD_CTX_new();
	unsigned len = 32;
	int rc = 0;

	if (!ctx || EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) != 1) {
		rc = -ENOMEM;
		goto out;
	}
	while (n > 0) {
		size_t k = n < HASH_CHUNK ? (size_t)n : HASH_CHUNK;
		rc = pread_full(fd, buf, k, off);
		if (rc)
			goto out;
		if (EVP_DigestUpdate(ctx, buf, k) != 1) {
			rc = -EIO;
			goto out;
		}
		off += k;
		n -= k;
	}
	if (EVP_DigestFinal_ex(ctx, out, &len) != 1)
		rc = -EIO;
out:
	EVP_MD_CTX_free(ctx);
	return rc;
}

/* ---- identity ---- */

int k3_store_pack_ident(const char *path, const char *name, uint64_t header_bytes,
			struct k3_store_pack_ident *out, struct k3_err *err)
{
	struct stat st;
	uint8_t *buf = NULL;
	int fd, rc;

	memset(out, 0, sizeof(*out));
	if (strlen(name) > K3_STORE_PACK_NAME_MAX)
		return k3_err_set(err, -ENAMETOOLONG, "source name '%s' is longer than %d bytes",
				  name, K3_STORE_PACK_NAME_MAX);
	strcpy(out->name, name);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return k3_err_set(err, -errno, "cannot open '%s': %s", path, strerror(errno));
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
		rc = k3_err_set(err, -EINVAL, "'%s' is not a regular file", path);
		goto out;
	}
	out->size = (uint64_t)st.st_size;
	if (header_bytes == 0) {
		uint8_t len8[8];
		rc = pread_full(fd, len8, 8, 0);
		if (rc) {
			k3_err_set(err, rc, "'%s': cannot read the safetensors header length", path);
			goto out;
		}
		header_bytes = get_u64(len8);
		if (header_bytes > K3_STORE_PACK_MAX_HEADER_BYTES - 8) {
			rc = k3_err_set(err, -EBADMSG, "'%s': safetensors header of %" PRIu64
					" bytes is implausible", path, header_bytes);
			goto out;
		}
		header_bytes += 8;
	}
	if (header_bytes > K3_STORE_PACK_MAX_HEADER_BYTES || header_bytes > out->size) {
		rc = k3_err_set(err, -EBADMSG, "'%s': header of %" PRIu64 " bytes does not fit"
				" in the file (%" PRIu64 " bytes)", path, header_bytes, out->size);
		goto out;
	}
	out->header_bytes = header_bytes;
	buf = malloc(HASH_CHUNK);
	if (!buf) {
		rc = k3_err_set(err, -ENOMEM, "out of memory");
		goto out;
	}
	rc = hash_range(fd, 0, header_bytes, buf, out->header_sha256);
	if (rc)
		k3_err_set(err, rc, "'%s': cannot hash the header: %s", path, strerror(-rc));
out:
	free(buf);
	close(fd);
	return rc;
}

/* ---- reader ---- */

void k3_store_pack_free(struct k3_store_pack *pack)
{
	if (!pack)
		return;
	free(pack->idents);
	free(pack->ent);
	free(pack);
}

size_t k3_store_pack_expert_count(const struct k3_store_pack *pack)
{
	return pack->n_ent;
}

size_t k3_store_pack_source_count(const struct k3_store_pack *pack)
{
	return pack->n_idents;
}

const struct k3_store_pack_ident *k3_store_pack_source(const struct k3_store_pack *pack,
						       size_t i)
{
	return i < pack->n_idents ? &pack->idents[i] : NULL;
}

int k3_store_pack_entry(const struct k3_store_pack *pack, size_t i, uint32_t *layer,
			uint32_t *expert, uint64_t length[K3_STORE_ARRAYS])
{
	if (i >= pack->n_ent)
		return -ERANGE;
	*layer = pack->ent[i].layer;
	*expert = pack->ent[i].expert;
	for (int a = 0; a < K3_STORE_ARRAYS; a++)
		length[a] = pack->ent[i].arr_len[a];
	return 0;
}

static int verify_spans(int fd, const struct k3_store_pack *pack, const char *path,
			uint64_t *verified, struct k3_err *err)
{
	uint8_t *buf = malloc(HASH_CHUNK);
	uint8_t got[32];
	int rc = 0;

	if (!buf)
		return k3_err_set(err, -ENOMEM, "out of memory");
	for (size_t i = 0; i < pack->n_ent; i++) {
		const struct pack_entry *e = &pack->ent[i];
		rc = hash_range(fd, e->offset, e->length, buf, got);
		if (rc) {
			k3_err_set(err, rc, "'%s': cannot read expert (%" PRIu32 ", %" PRIu32 "): %s",
				   path, e->layer, e->expert, strerror(-rc));
			break;
		}
		if (memcmp(got, e->sha, 32) != 0) {
			rc = k3_err_set(err, -EBADMSG, "'%s': expert (%" PRIu32 ", %" PRIu32
					") at byte %" PRIu64 " fails its SHA-256 check (damaged pack;"
					" delete it and run k3ctl pack again)",
					path, e->layer, e->expert, e->offset);
			break;
		}
		if (verified)
			*verified += e->length;
	}
	free(buf);
	return rc;
}

static bool ident_equal(const struct k3_store_pack_ident *a, const struct k3_store_pack_ident *b)
{
	return strcmp(a->name, b->name) == 0 && a->size == b->size &&
	       a->header_bytes == b->header_bytes &&
	       memcmp(a->header_sha256, b->header_sha256, 32) == 0;
}

#define BAD(...) do { rc = k3_err_set(err, -EBADMSG, __VA_ARGS__); goto out; } while (0)

static int pack_parse(int fd, const char *path, struct k3_store_pack *p, struct k3_err *err)
{
	uint8_t hdr[HDR_BYTES], sha[32];
	uint8_t *meta = NULL;
	uint64_t meta_bytes, want_meta, prev_end;
	uint32_t n_src, n_exp;
	struct stat st;
	int rc;

	if (fstat(fd, &st) != 0)
		return k3_err_set(err, -errno, "cannot stat '%s': %s", path, strerror(errno));
	if (!S_ISREG(st.st_mode))
		return k3_err_set(err, -EINVAL, "'%s' is not a regular file", path);
	if ((uint64_t)st.st_size < HDR_BYTES)
		return k3_err_set(err, -EBADMSG, "'%s': %jd bytes is too short for a pack",
				  path, (intmax_t)st.st_size);
	rc = pread_full(fd, hdr, HDR_BYTES, 0);
	if (rc)
		return k3_err_set(err, rc, "cannot read '%s': %s", path, strerror(-rc));
	if (memcmp(hdr, PACK_MAGIC, 8) != 0)
		BAD("'%s' is not an expert pack (bad magic)", path);
	if (get_u32(hdr + 8) != K3_STORE_PACK_VERSION)
		BAD("'%s': pack version %" PRIu32 " is not %d", path, get_u32(hdr + 8),
		    K3_STORE_PACK_VERSION);
	if ((rc = sha256(hdr, HDR_HASHED, sha)) != 0)
		goto out;
	if (memcmp(sha, hdr + HDR_HASHED, 32) != 0)
		BAD("'%s': header fails its SHA-256 check", path);
	if (get_u32(hdr + 12) != K3_STORE_ARRAYS)
		BAD("'%s': %" PRIu32 " arrays per expert, expected %d", path, get_u32(hdr + 12),
		    K3_STORE_ARRAYS);
	n_src = get_u32(hdr + 16);
	n_exp = get_u32(hdr + 20);
	if (n_src == 0 || n_src > K3_STORE_MAX_FILES || n_exp > K3_STORE_MAX_EXPERTS)
		BAD("'%s': %" PRIu32 " sources, %" PRIu32 " experts out of bounds", path, n_src, n_exp);
	meta_bytes = get_u64(hdr + 32);
	want_meta = (uint64_t)n_src * SRC_REC + (uint64_t)n_exp * DIR_REC;
	p->data_offset = get_u64(hdr + 40);
	p->file_bytes = get_u64(hdr + 48);
	if (get_u64(hdr + 24) != HDR_BYTES || meta_bytes != want_meta ||
	    p->data_offset != align_to(HDR_BYTES + want_meta, K3_STORE_ALIGN))
		BAD("'%s': metadata layout is inconsistent", path);
	if (p->file_bytes != (uint64_t)st.st_size)
		BAD("'%s': file is %jd bytes, header says %" PRIu64 " (truncated?)", path,
		    (intmax_t)st.st_size, p->file_bytes);
	meta = malloc(meta_bytes ? meta_bytes : 1);
	p->idents = calloc(n_src, sizeof(*p->idents));
	p->ent = calloc(n_exp ? n_exp : 1, sizeof(*p->ent));
	if (!meta || !p->idents || !p->ent) {
		rc = k3_err_set(err, -ENOMEM, "out of memory");
		goto out;
	}
	rc = pread_full(fd, meta, meta_bytes, HDR_BYTES);
	if (rc) {
		k3_err_set(err, rc, "cannot read '%s': %s", path, strerror(-rc));
		goto out;
	}
	if ((rc = sha256(meta, meta_bytes, sha)) != 0)
		goto out;
	if (memcmp(sha, hdr + 56, 32) != 0)
		BAD("'%s': metadata fails its SHA-256 check", path);
	p->n_idents = n_src;
	for (uint32_t i = 0; i < n_src; i++) {
		const uint8_t *r = meta + (size_t)i * SRC_REC;
		struct k3_store_pack_ident *id = &p->idents[i];
		if (memchr(r, 0, 256) == NULL)
			BAD("'%s': source name %" PRIu32 " is not terminated", path, i);
		memcpy(id->name, r, 256);
		id->size = get_u64(r + 256);
		id->header_bytes = get_u64(r + 264);
		memcpy(id->header_sha256, r + 272, 32);
	}
	prev_end = p->data_offset;
	for (uint32_t i = 0; i < n_exp; i++) {
		const uint8_t *r = meta + (size_t)n_src * SRC_REC + (size_t)i * DIR_REC;
		struct pack_entry *e = &p->ent[i];
		e->layer = get_u32(r);
		e->expert = get_u32(r + 4);
		e->offset = get_u64(r + 8);
		e->length = get_u64(r + 16);
		for (int a = 0; a < K3_STORE_ARRAYS; a++) {
			e->arr_off[a] = get_u64(r + 24 + 16 * a);
			e->arr_len[a] = get_u64(r + 32 + 16 * a);
		}
		memcpy(e->sha, r + 24 + 16 * K3_STORE_ARRAYS, 32);
		if (e->layer >= K3_STORE_MAX_LAYERS || e->expert >= K3_STORE_MAX_EXPERTS_PER_LAYER)
			BAD("'%s': entry %" PRIu32 " names expert (%" PRIu32 ", %" PRIu32 ")"
			    " out of range", path, i, e->layer, e->expert);
		if (i > 0 && (e->layer < p->ent[i - 1].layer ||
			      (e->layer == p->ent[i - 1].layer && e->expert <= p->ent[i - 1].expert)))
			BAD("'%s': directory is not sorted by (layer, expert) at entry %" PRIu32,
			    path, i);
		if (e->offset % K3_STORE_ALIGN || e->offset < prev_end || e->length == 0 ||
		    e->offset > p->file_bytes || e->length > p->file_bytes - e->offset)
			BAD("'%s': span of expert (%" PRIu32 ", %" PRIu32 ") is misplaced", path,
			    e->layer, e->expert);
		prev_end = e->offset + e->length;
		for (int a = 0; a < K3_STORE_ARRAYS; a++)
			if (e->arr_len[a] == 0 || e->arr_len[a] > K3_STORE_MAX_ARRAY_BYTES ||
			    e->arr_off[a] > e->length || e->arr_len[a] > e->length - e->arr_off[a])
				BAD("'%s': array %d of expert (%" PRIu32 ", %" PRIu32 ") lies outside"
				    " its span", path, a, e->layer, e->expert);
	}
	p->n_ent = n_exp;
	rc = 0;
out:
	free(meta);
	return rc;
}

int k3_store_pack_open(const char *path, const struct k3_store_pack_ident *expect,
		       size_t n_expect, unsigned flags, struct k3_store_pack **out,
		       struct k3_err *err)
{
	struct k3_store_pack *p;
	int fd, rc;

	*out = NULL;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return k3_err_set(err, -errno, "cannot open pack '%s': %s", path, strerror(errno));
	p = calloc(1, sizeof(*p));
	if (!p) {
		close(fd);
		return k3_err_set(err, -ENOMEM, "out of memory");
	}
	rc = pack_parse(fd, path, p, err);
	if (rc)
		goto fail;
	if (expect) {
		bool same = n_expect == p->n_idents;
		for (size_t i = 0; same && i < n_expect; i++)
			same = ident_equal(&expect[i], &p->idents[i]);
		if (!same) {
			rc = k3_err_set(err, -ESTALE, "'%s' was built from other source files"
					" (run k3ctl pack again)", path);
			goto fail;
		}
	}
	if (flags & K3_STORE_PACK_VERIFY) {
		rc = verify_spans(fd, p, path, NULL, err);
		if (rc)
			goto fail;
	}
	close(fd);
	*out = p;
	return 0;
fail:
	close(fd);
	k3_store_pack_free(p);
	return rc;
}

int k3_store_pack_add_to_source(const struct k3_store_pack *pack, const char *path,
				struct k3_store_source *src, struct k3_err *err)
{
	uint32_t file;
	int rc = k3_store_source_add_file(src, path, &file, err);

	if (rc)
		return rc;
	for (size_t i = 0; i < pack->n_ent; i++) {
		const struct pack_entry *pe = &pack->ent[i];
		struct k3_store_expert e = { .layer = pe->layer, .expert = pe->expert };
		for (int a = 0; a < K3_STORE_ARRAYS; a++) {
			e.ext[a].file = file;
			e.ext[a].offset = pe->offset + pe->arr_off[a];
			e.ext[a].length = pe->arr_len[a];
		}
		rc = k3_store_source_add_expert(src, &e, err);
		if (rc)
			return rc;
	}
	return 0;
}

/* ---- writer ---- */

/* Lays out the pack for src: entries sorted, spans placed, hashes unset. */
static int plan_layout(const struct k3_store_source *src, struct pack_entry **out_ent,
		       size_t **out_order, uint64_t *data_offset, uint64_t *file_bytes,
		       size_t n_idents)
{
	size_t n = k3_store_source_count(src);
	size_t *order = malloc((n ? n : 1) * sizeof(*order));
	struct pack_entry *ent = calloc(n ? n : 1, sizeof(*ent));
	uint64_t cursor;

	if (!order || !ent) {
		free(order);
		free(ent);
		return -ENOMEM;
	}
	for (size_t i = 0; i < n; i++)
		order[i] = i;
	qsort_r(order, n, sizeof(*order), k3_store_source_cmp_index, (void *)src);
	*data_offset = align_to(HDR_BYTES + (uint64_t)n_idents * SRC_REC +
				(uint64_t)n * DIR_REC, K3_STORE_ALIGN);
	cursor = *data_offset;
	for (size_t i = 0; i < n; i++) {
		const struct k3_store_expert *e = k3_store_source_expert(src, order[i]);
		uint64_t off = 0;
		ent[i].layer = e->layer;
		ent[i].expert = e->expert;
		ent[i].offset = cursor;
		for (int a = 0; a < K3_STORE_ARRAYS; a++) {
			off = align_to(off, K3_STORE_PACK_ARRAY_ALIGN);
			ent[i].arr_off[a] = off;
			ent[i].arr_len[a] = e->ext[a].length;
			off += e->ext[a].length;   /* <= 6 GiB: no overflow */
		}
		ent[i].length = off;
		cursor = align_to(cursor + off, K3_STORE_ALIGN);
	}
	*file_bytes = cursor;
	*out_ent = ent;
	*out_order = order;
	return 0;
}

static bool layout_matches(const struct k3_store_pack *p, const struct pack_entry *ent, size_t n)
{
	if (p->n_ent != n)
		return false;
	for (size_t i = 0; i < n; i++) {
		const struct pack_entry *a = &p->ent[i], *b = &ent[i];
		if (a->layer != b->layer || a->expert != b->expert)
			return false;
		for (int k = 0; k < K3_STORE_ARRAYS; k++)
			if (a->arr_len[k] != b->arr_len[k])
				return false;
	}
	return true;
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

static void encode_meta(uint8_t *meta, const struct k3_store_pack_ident *idents, size_t n_idents,
			const struct pack_entry *ent, size_t n)
{
	for (size_t i = 0; i < n_idents; i++) {
		uint8_t *r = meta + i * SRC_REC;
		memcpy(r, idents[i].name, strlen(idents[i].name));
		put_u64(r + 256, idents[i].size);
		put_u64(r + 264, idents[i].header_bytes);
		memcpy(r + 272, idents[i].header_sha256, 32);
	}
	for (size_t i = 0; i < n; i++) {
		uint8_t *r = meta + n_idents * SRC_REC + i * DIR_REC;
		put_u32(r, ent[i].layer);
		put_u32(r + 4, ent[i].expert);
		put_u64(r + 8, ent[i].offset);
		put_u64(r + 16, ent[i].length);
		for (int a = 0; a < K3_STORE_ARRAYS; a++) {
			put_u64(r + 24 + 16 * a, ent[i].arr_off[a]);
			put_u64(r + 32 + 16 * a, ent[i].arr_len[a]);
		}
		memcpy(r + 24 + 16 * K3_STORE_ARRAYS, ent[i].sha, 32);
	}
}

/* Copies every expert into the temp file fd; fills ent[].sha. */
static int write_spans(int fd, const struct k3_store_source *src, const size_t *order,
		       struct pack_entry *ent, size_t n, struct k3_err *err)
{
	uint64_t slot_bytes = k3_store_source_slot_bytes(src), span_max = 0;
	void *slot = NULL, *span = NULL;
	struct k3_store_plan plan;
	int rc = 0;

	for (size_t i = 0; i < n; i++)
		if (ent[i].length > span_max)
			span_max = ent[i].length;
	if (posix_memalign(&slot, K3_STORE_ALIGN, slot_bytes ? slot_bytes : K3_STORE_ALIGN) ||
	    !(span = malloc(span_max ? span_max : 1))) {
		rc = k3_err_set(err, -ENOMEM, "out of memory for a %" PRIu64 "-byte span", span_max);
		goto out;
	}
	for (size_t i = 0; i < n; i++) {
		struct pack_entry *e = &ent[i];
		k3_store_source_plan(src, order[i], &plan);
		for (unsigned r = 0; r < plan.n_reads; r++) {
			int64_t got = k3_store_source_pread(src, &plan.read[r], slot);
			if (got < 0) {
				rc = k3_err_set(err, (int)got, "cannot read expert (%" PRIu32 ", %" PRIu32
						") from '%s': %s", e->layer, e->expert,
						k3_store_source_file_path(src, plan.read[r].file),
						strerror((int)-got));
				goto out;
			}
		}
		memset(span, 0, e->length);
		for (int a = 0; a < K3_STORE_ARRAYS; a++)
			memcpy((uint8_t *)span + e->arr_off[a], (uint8_t *)slot + plan.array_offset[a],
			       e->arr_len[a]);
		if ((rc = sha256(span, e->length, e->sha)) != 0 ||
		    (rc = pwrite_full(fd, span, e->length, e->offset)) != 0) {
			k3_err_set(err, rc, "cannot write the pack: %s", strerror(-rc));
			goto out;
		}
	}
out:
	free(slot);
	free(span);
	return rc;
}

int k3_store_pack_write(const char *path, const struct k3_store_source *src,
			const struct k3_store_pack_ident *idents, size_t n_idents,
			unsigned flags, struct k3_store_pack_result *res,
			struct k3_err *err)
{
	struct k3_store_pack_result r0 = { 0 };
	struct k3_store_pack *old = NULL;
	struct pack_entry *ent = NULL;
	size_t *order = NULL, n = k3_store_source_count(src);
	uint64_t data_offset, file_bytes, meta_bytes;
	uint8_t hdr[HDR_BYTES] = { 0 }, *meta = NULL;
	char tmp[PATH_MAX];
	int fd = -1, rc;

	if (!res)
		res = &r0;
	memset(res, 0, sizeof(*res));
	if (n_idents != k3_store_source_file_count(src) || n_idents == 0)
		return k3_err_set(err, -EINVAL, "%zu source identities for %zu source files",
				  n_idents, k3_store_source_file_count(src));
	rc = plan_layout(src, &ent, &order, &data_offset, &file_bytes, n_idents);
	if (rc)
		return k3_err_set(err, rc, "out of memory");
	res->n_experts = n;
	res->file_bytes = file_bytes;
	for (size_t i = 0; i < n; i++)
		for (int a = 0; a < K3_STORE_ARRAYS; a++)
			res->payload_bytes += ent[i].arr_len[a];

	/* An existing pack for the same sources and experts is verified, not
	 * rewritten: re-running k3ctl pack is cheap and safe. */
	rc = k3_store_pack_open(path, idents, n_idents, 0, &old, NULL);
	if (rc == 0 && layout_matches(old, ent, n)) {
		if (flags & K3_STORE_PACK_VERIFY) {
			int vfd = open(path, O_RDONLY | O_CLOEXEC);
			if (vfd < 0) {
				rc = k3_err_set(err, -errno, "cannot open '%s': %s", path, strerror(errno));
				goto out;
			}
			rc = verify_spans(vfd, old, path, &res->verified_bytes, err);
			close(vfd);
		}
		goto out;
	}
	res->replaced = rc != -ENOENT;

	if (snprintf(tmp, sizeof(tmp), "%s.tmp.XXXXXX", path) >= (int)sizeof(tmp)) {
		rc = k3_err_set(err, -ENAMETOOLONG, "pack path '%s' is too long", path);
		goto out;
	}
	fd = mkstemp(tmp);
	if (fd < 0) {
		rc = k3_err_set(err, -errno, "cannot create '%s': %s", tmp, strerror(errno));
		goto out;
	}
	if (fchmod(fd, 0644) != 0 || ftruncate(fd, (off_t)file_bytes) != 0) {
		rc = k3_err_set(err, -errno, "cannot size '%s' to %" PRIu64 " bytes: %s", tmp,
				file_bytes, strerror(errno));
		goto out_unlink;
	}
	rc = write_spans(fd, src, order, ent, n, err);
	if (rc)
		goto out_unlink;
	meta_bytes = (uint64_t)n_idents * SRC_REC + (uint64_t)n * DIR_REC;
	meta = calloc(1, meta_bytes);
	if (!meta) {
		rc = k3_err_set(err, -ENOMEM, "out of memory");
		goto out_unlink;
	}
	encode_meta(meta, idents, n_idents, ent, n);
	memcpy(hdr, PACK_MAGIC, 8);
	put_u32(hdr + 8, K3_STORE_PACK_VERSION);
	put_u32(hdr + 12, K3_STORE_ARRAYS);
	put_u32(hdr + 16, (uint32_t)n_idents);
	put_u32(hdr + 20, (uint32_t)n);
	put_u64(hdr + 24, HDR_BYTES);
	put_u64(hdr + 32, meta_bytes);
	put_u64(hdr + 40, data_offset);
	put_u64(hdr + 48, file_bytes);
	if ((rc = sha256(meta, meta_bytes, hdr + 56)) != 0 ||
	    (rc = sha256(hdr, HDR_HASHED, hdr + HDR_HASHED)) != 0)
		goto out_unlink;
	if ((rc = pwrite_full(fd, meta, meta_bytes, HDR_BYTES)) != 0 ||
	    (rc = pwrite_full(fd, hdr, HDR_BYTES, 0)) != 0) {
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
	k3_store_pack_free(old);
	old = NULL;
	rc = k3_store_pack_open(tmp, idents, n_idents, 0, &old, err);
	if (rc == 0) {
		res->verified_bytes = 0;
		rc = verify_spans(fd, old, tmp, &res->verified_bytes, err);
	}
	if (rc)
		goto out_unlink;
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
	if (fd >= 0)
		close(fd);
	k3_store_pack_free(old);
	free(meta);
	free(ent);
	free(order);
	return rc;
}

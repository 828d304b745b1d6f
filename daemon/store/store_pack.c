/*
 * store_pack.c - the pack format (see store_pack.h and docs/formats.md,
 * "Expert packs" and "Spine packs"): source identities and how they
 * compare, the reader and its checks for both kinds, the self-check of
 * span hashes, and the encoder of the header and metadata the writer
 * (store_pack_write.c) puts in front of the spans. Every byte offset of the
 * format is here.
 */
#include "store/store_pack.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/evp.h>

static const char *const pack_magic[2] = { "K3XPACK\n", "K3SPACK\n" };
static const char *const pack_noun[2] = { "an expert pack", "a spine pack" };

enum {
	HDR_BYTES = 4096,
	HDR_HASHED = 88,                 /* header bytes covered by header_sha256 */
	/* A source record (docs/formats.md, "Expert packs"): byte offsets. */
	SRC_NAME = 0,                    /* 256 bytes, NUL-padded */
	SRC_SIZE = 256,
	SRC_HEADER_BYTES = 264,
	SRC_HEADER_SHA = 272,            /* 32 bytes */
	SRC_DEV = 304,
	SRC_INO = 312,
	SRC_MTIME = 320,                 /* i64 ns */
	SRC_CTIME = 328,                 /* i64 ns */
	SRC_FLAGS = 336,                 /* u32, then 4 zero bytes */
	SRC_SHA = 344,                   /* 32 bytes: whole-file SHA-256 when flagged */
	SRC_REC = 384,                   /* 376..384 zero */
	SRC_FLAG_SHA256 = 1u << 0,
	/* An expert pack's directory entry: layer, expert, offset, length, six
	 * (offset, length) pairs, SHA-256. */
	DIR_REC = 4 + 4 + 8 + 8 + K3_STORE_ARRAYS * 16 + 32,
	/* A spine pack's span record: kind, layer, offset, length, first
	 * tensor, tensor count, SHA-256. */
	SPAN_REC = 4 + 4 + 8 + 8 + 4 + 4 + 32,
	/* A spine pack's tensor record: name (NUL-padded), dtype, ndim,
	 * shape[3], offset and length in its span. */
	TENSOR_NAME = 0,
	TENSOR_DTYPE = K3_STORE_PACK_TENSOR_NAME_MAX + 1,
	TENSOR_NDIM = TENSOR_DTYPE + 4,
	TENSOR_SHAPE = TENSOR_NDIM + 4,
	TENSOR_OFFSET = TENSOR_SHAPE + 24,
	TENSOR_LENGTH = TENSOR_OFFSET + 8,
	TENSOR_REC = TENSOR_LENGTH + 8,
	SPINE_DTYPE_MAX = 15,            /* dtype codes a spine pack may carry */
	HASH_CHUNK = 4 << 20,            /* bytes per read while hashing */
};

struct k3_store_pack {
	uint64_t data_offset;
	struct k3_store_pack_ident *idents;
	size_t n_idents;
	struct k3_store_pack_layout lo;
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

static int64_t ts_ns(const struct timespec *t)
{
	return (int64_t)t->tv_sec * 1000000000 + t->tv_nsec;
}

void k3_store_pack_ident_stat(struct k3_store_pack_ident *id, const struct stat *st)
{
	id->size = (uint64_t)st->st_size;
	id->dev = (uint64_t)st->st_dev;
	id->ino = (uint64_t)st->st_ino;
	id->mtime_ns = ts_ns(&st->st_mtim);
	id->ctime_ns = ts_ns(&st->st_ctim);
}

/* Appends ", name" (or "name" first) to the list in what. */
static void add_field(char *what, size_t size, const char *name)
{
	size_t n;

	if (!what || size == 0)
		return;
	n = strlen(what);
	snprintf(what + n, size - n, "%s%s", n ? ", " : "", name);
}

enum k3_store_pack_match k3_store_pack_ident_match(const struct k3_store_pack_ident *was,
						   const struct k3_store_pack_ident *now,
						   char *what, size_t what_size)
{
	enum k3_store_pack_match m = K3_STORE_PACK_SAME;
	const struct {
		bool differs;
		enum k3_store_pack_match kind;
		const char *name;
	} fields[] = {
		{ strcmp(was->name, now->name) != 0, K3_STORE_PACK_OTHER, "name" },
		{ was->size != now->size, K3_STORE_PACK_OTHER, "size" },
		{ was->header_bytes != now->header_bytes ||
		  memcmp(was->header_sha256, now->header_sha256, 32) != 0, K3_STORE_PACK_OTHER,
		  "header" },
		{ was->has_sha256 && now->has_sha256 && memcmp(was->sha256, now->sha256, 32) != 0,
		  K3_STORE_PACK_OTHER, "SHA-256" },
		/* a verified SHA-256 the pack does not record yet: compared with
		 * the (verified) source and then recorded (issue 20, item 6) */
		{ now->has_sha256 && !was->has_sha256, K3_STORE_PACK_CHANGED, "verified SHA-256" },
		{ was->dev != now->dev, K3_STORE_PACK_CHANGED, "device" },
		{ was->ino != now->ino, K3_STORE_PACK_CHANGED, "inode" },
		{ was->mtime_ns != now->mtime_ns, K3_STORE_PACK_CHANGED, "mtime" },
		{ was->ctime_ns != now->ctime_ns, K3_STORE_PACK_CHANGED, "ctime" },
	};

	if (what && what_size)
		what[0] = '\0';
	for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
		if (!fields[i].differs)
			continue;
		add_field(what, what_size, fields[i].name);
		if (fields[i].kind > m)
			m = fields[i].kind;
	}
	return m;
}

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
	k3_store_pack_ident_stat(out, &st);
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
	free(pack->lo.spans);
	free(pack->lo.arrays);
	free(pack->lo.tensors);
	free(pack);
}

enum k3_store_pack_kind k3_store_pack_kind(const struct k3_store_pack *pack)
{
	return pack->lo.kind;
}

const struct k3_store_pack_layout *k3_store_pack_layout(const struct k3_store_pack *pack)
{
	return &pack->lo;
}

size_t k3_store_pack_expert_count(const struct k3_store_pack *pack)
{
	return pack->lo.n_spans;
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

const struct k3_store_pack_span *k3_store_pack_span(const struct k3_store_pack *pack, size_t i)
{
	return i < pack->lo.n_spans ? &pack->lo.spans[i] : NULL;
}

const struct k3_store_pack_array *k3_store_pack_array(const struct k3_store_pack *pack, size_t j)
{
	return j < pack->lo.n_arrays ? &pack->lo.arrays[j] : NULL;
}

uint64_t k3_store_pack_file_bytes(const struct k3_store_pack *pack)
{
	return pack->lo.file_bytes;
}

int k3_store_pack_entry(const struct k3_store_pack *pack, size_t i, uint32_t *layer,
			uint32_t *expert, uint64_t length[K3_STORE_ARRAYS])
{
	if (i >= pack->lo.n_spans || pack->lo.kind != K3_STORE_PACK_EXPERTS)
		return -ERANGE;
	const struct k3_store_pack_span *sp = &pack->lo.spans[i];
	*layer = sp->layer;
	*expert = sp->expert;
	for (int a = 0; a < K3_STORE_ARRAYS; a++)
		length[a] = pack->lo.arrays[sp->first + (uint32_t)a].length;
	return 0;
}

void k3_store_pack_span_name(const struct k3_store_pack_span *span, char *buf, size_t size)
{
	switch (span->kind) {
	case K3_STORE_SPAN_EXPERT:
		snprintf(buf, size, "expert (%" PRIu32 ", %" PRIu32 ")", span->layer, span->expert);
		break;
	case K3_STORE_SPAN_LAYER:
		snprintf(buf, size, "layer %" PRIu32, span->layer);
		break;
	case K3_STORE_SPAN_EMBED:
		snprintf(buf, size, "the embedding");
		break;
	case K3_STORE_SPAN_HEAD:
		snprintf(buf, size, "the head");
		break;
	default:
		snprintf(buf, size, "span of kind %" PRIu32, span->kind);
		break;
	}
}

int k3_store_pack_span_check(const char *path, const struct k3_store_pack_span *span,
			     const uint8_t digest[32], struct k3_err *err)
{
	char name[64];

	if (memcmp(digest, span->sha256, 32) == 0)
		return 0;
	k3_store_pack_span_name(span, name, sizeof(name));
	return k3_err_set(err, -EBADMSG, "'%s': %s at byte %" PRIu64 " fails its SHA-256 check"
			  " (damaged pack; delete it and run k3ctl pack again)", path, name,
			  span->offset);
}

static int verify_spans(int fd, const struct k3_store_pack *pack, const char *path,
			struct k3_err *err)
{
	uint8_t *buf = malloc(HASH_CHUNK);
	uint8_t got[32];
	char name[64];
	int rc = 0;

	if (!buf)
		return k3_err_set(err, -ENOMEM, "out of memory");
	for (size_t i = 0; i < pack->lo.n_spans; i++) {
		const struct k3_store_pack_span *e = &pack->lo.spans[i];
		rc = hash_range(fd, e->offset, e->length, buf, got);
		if (rc) {
			k3_store_pack_span_name(e, name, sizeof(name));
			k3_err_set(err, rc, "'%s': cannot read %s: %s", path, name, strerror(-rc));
			break;
		}
		rc = k3_store_pack_span_check(path, e, got, err);
		if (rc)
			break;
	}
	free(buf);
	return rc;
}

/* Metadata bytes of a pack of this kind and these counts. */
static uint64_t meta_bytes_of(enum k3_store_pack_kind kind, uint64_t n_src, uint64_t n_spans,
			      uint64_t n_arrays)
{
	if (kind == K3_STORE_PACK_EXPERTS)
		return n_src * SRC_REC + n_spans * DIR_REC;
	return n_src * SRC_REC + n_spans * SPAN_REC + n_arrays * TENSOR_REC;
}

/* (kind, layer, expert) order of the directory: < 0, 0, > 0. */
static int span_cmp(const struct k3_store_pack_span *a, const struct k3_store_pack_span *b)
{
	if (a->kind != b->kind)
		return a->kind < b->kind ? -1 : 1;
	if (a->layer != b->layer)
		return a->layer < b->layer ? -1 : 1;
	return a->expert < b->expert ? -1 : a->expert > b->expert;
}

#define BAD(...) do { rc = k3_err_set(err, -EBADMSG, __VA_ARGS__); goto out; } while (0)

/* The sources records of meta into p->idents. */
static int parse_sources(const uint8_t *meta, const char *path, struct k3_store_pack *p,
			 struct k3_err *err)
{
	int rc = 0;

	for (size_t i = 0; i < p->n_idents; i++) {
		const uint8_t *r = meta + i * SRC_REC;
		struct k3_store_pack_ident *id = &p->idents[i];
		if (memchr(r, 0, 256) == NULL)
			BAD("'%s': source name %zu is not terminated", path, i);
		memcpy(id->name, r + SRC_NAME, 256);
		id->size = get_u64(r + SRC_SIZE);
		id->header_bytes = get_u64(r + SRC_HEADER_BYTES);
		memcpy(id->header_sha256, r + SRC_HEADER_SHA, 32);
		id->dev = get_u64(r + SRC_DEV);
		id->ino = get_u64(r + SRC_INO);
		id->mtime_ns = (int64_t)get_u64(r + SRC_MTIME);
		id->ctime_ns = (int64_t)get_u64(r + SRC_CTIME);
		uint32_t fl = get_u32(r + SRC_FLAGS);
		if ((fl & ~(uint32_t)SRC_FLAG_SHA256) || get_u32(r + SRC_FLAGS + 4) ||
		    get_u64(r + SRC_SHA + 32))
			BAD("'%s': source record %zu has unknown flags or fields", path, i);
		id->has_sha256 = fl & SRC_FLAG_SHA256;
		memcpy(id->sha256, r + SRC_SHA, 32);
	}
out:
	return rc;
}

/* Decodes span i's directory record (either kind) and, for an expert pack,
 * its six arrays. */
static void decode_span(const uint8_t *dir, size_t i, struct k3_store_pack_layout *lo)
{
	struct k3_store_pack_span *e = &lo->spans[i];

	if (lo->kind == K3_STORE_PACK_EXPERTS) {
		const uint8_t *r = dir + i * DIR_REC;
		e->kind = K3_STORE_SPAN_EXPERT;
		e->layer = get_u32(r);
		e->expert = get_u32(r + 4);
		e->offset = get_u64(r + 8);
		e->length = get_u64(r + 16);
		e->first = (uint32_t)(i * K3_STORE_ARRAYS);
		e->count = K3_STORE_ARRAYS;
		for (int a = 0; a < K3_STORE_ARRAYS; a++) {
			lo->arrays[e->first + (uint32_t)a].offset = get_u64(r + 24 + 16 * a);
			lo->arrays[e->first + (uint32_t)a].length = get_u64(r + 32 + 16 * a);
		}
		memcpy(e->sha256, r + 24 + 16 * K3_STORE_ARRAYS, 32);
		return;
	}
	const uint8_t *r = dir + i * SPAN_REC;
	e->kind = get_u32(r);
	e->layer = get_u32(r + 4);
	e->expert = 0;
	e->offset = get_u64(r + 8);
	e->length = get_u64(r + 16);
	e->first = get_u32(r + 24);
	e->count = get_u32(r + 28);
	memcpy(e->sha256, r + 32, 32);
}

/* Decodes spine tensor record j into arrays[j] and tensors[j]; checks what
 * the record alone can tell. */
static int decode_tensor(const uint8_t *rec, size_t j, struct k3_store_pack_layout *lo,
			 const char *path, struct k3_err *err)
{
	struct k3_store_pack_tensor *t = &lo->tensors[j];
	int rc = 0;

	if (memchr(rec + TENSOR_NAME, 0, K3_STORE_PACK_TENSOR_NAME_MAX + 1) == NULL || !rec[0])
		BAD("'%s': tensor %zu has no name or an unterminated one", path, j);
	memcpy(t->name, rec + TENSOR_NAME, K3_STORE_PACK_TENSOR_NAME_MAX + 1);
	t->dtype = get_u32(rec + TENSOR_DTYPE);
	t->ndim = get_u32(rec + TENSOR_NDIM);
	for (int d = 0; d < 3; d++)
		t->shape[d] = get_u64(rec + TENSOR_SHAPE + 8 * d);
	lo->arrays[j].offset = get_u64(rec + TENSOR_OFFSET);
	lo->arrays[j].length = get_u64(rec + TENSOR_LENGTH);
	if (t->dtype == 0 || t->dtype > SPINE_DTYPE_MAX || t->ndim < 1 || t->ndim > 3)
		BAD("'%s': tensor '%s' has dtype %" PRIu32 " and %" PRIu32 " dimensions (want a"
		    " provider dtype 1..%d and 1..3 dimensions)", path, t->name, t->dtype, t->ndim,
		    SPINE_DTYPE_MAX);
	for (uint32_t d = 0; d < 3; d++)
		if (t->shape[d] == 0 || t->shape[d] > ((uint64_t)1 << 40) ||
		    (d >= t->ndim && t->shape[d] != 1))
			BAD("'%s': tensor '%s' has a bad shape", path, t->name);
	if (lo->arrays[j].length == 0 || lo->arrays[j].length > K3_STORE_PACK_MAX_TENSOR_BYTES ||
	    lo->arrays[j].offset % K3_STORE_PACK_ARRAY_ALIGN)
		BAD("'%s': tensor '%s' has %" PRIu64 " bytes at span offset %" PRIu64 " (want 1.."
		    "2^40 bytes on a %d-byte boundary)", path, t->name, lo->arrays[j].length,
		    lo->arrays[j].offset, K3_STORE_PACK_ARRAY_ALIGN);
out:
	return rc;
}

/* The directory and (spine) tensor table of meta into p->lo, with every
 * structural check. */
static int parse_directory(const uint8_t *meta, const char *path, struct k3_store_pack *p,
			   struct k3_err *err)
{
	struct k3_store_pack_layout *lo = &p->lo;
	const uint8_t *dir = meta + p->n_idents * SRC_REC;
	uint64_t prev_end = p->data_offset;
	uint32_t next_array = 0;
	char name[64];
	int rc = 0;

	if (lo->kind == K3_STORE_PACK_SPINE)
		for (size_t j = 0; j < lo->n_arrays; j++)
			if ((rc = decode_tensor(dir + lo->n_spans * SPAN_REC + j * TENSOR_REC, j, lo,
						path, err)) != 0)
				goto out;
	for (size_t i = 0; i < lo->n_spans; i++) {
		struct k3_store_pack_span *e = &lo->spans[i];
		decode_span(dir, i, lo);
		k3_store_pack_span_name(e, name, sizeof(name));
		if (lo->kind == K3_STORE_PACK_EXPERTS) {
			if (e->layer >= K3_STORE_MAX_LAYERS || e->expert >= K3_STORE_MAX_EXPERTS_PER_LAYER)
				BAD("'%s': entry %zu names expert (%" PRIu32 ", %" PRIu32 ") out of range",
				    path, i, e->layer, e->expert);
		} else if (e->kind < K3_STORE_SPAN_LAYER || e->kind > K3_STORE_SPAN_HEAD ||
			   (e->kind == K3_STORE_SPAN_LAYER ? e->layer >= K3_STORE_MAX_LAYERS
							   : e->layer != 0)) {
			BAD("'%s': entry %zu is a span of kind %" PRIu32 " for layer %" PRIu32
			    " (want a layer, the embedding or the head)", path, i, e->kind, e->layer);
		}
		if (i > 0 && span_cmp(&lo->spans[i - 1], e) >= 0)
			BAD("'%s': directory is not sorted by (kind, layer, expert) at entry %zu",
			    path, i);
		if (e->offset % K3_STORE_ALIGN || e->offset < prev_end || e->length == 0 ||
		    e->offset > lo->file_bytes || e->length > lo->file_bytes - e->offset)
			BAD("'%s': span of %s is misplaced", path, name);
		prev_end = e->offset + e->length;
		if (e->first != next_array || e->count == 0 || e->count > lo->n_arrays - next_array)
			BAD("'%s': the arrays of %s do not follow the previous span's", path, name);
		next_array += e->count;
		uint64_t arr_end = 0;
		for (uint32_t a = e->first; a < e->first + e->count; a++) {
			const struct k3_store_pack_array *x = &lo->arrays[a];
			uint64_t max = lo->kind == K3_STORE_PACK_EXPERTS ? K3_STORE_MAX_ARRAY_BYTES
									 : K3_STORE_PACK_MAX_TENSOR_BYTES;
			if (x->length == 0 || x->length > max || x->offset > e->length ||
			    x->length > e->length - x->offset)
				BAD("'%s': array %" PRIu32 " of %s lies outside its span", path,
				    a - e->first, name);
			/* spine tensors in ascending order, never overlapping */
			if (lo->kind == K3_STORE_PACK_SPINE && x->offset < arr_end)
				BAD("'%s': tensor '%s' of %s overlaps the one before it", path,
				    lo->tensors[a].name, name);
			arr_end = x->offset + x->length;
		}
	}
	if (next_array != lo->n_arrays)
		BAD("'%s': %zu tensors, but the spans name %" PRIu32, path, lo->n_arrays, next_array);
out:
	return rc;
}

static int pack_parse(int fd, const char *path, struct k3_store_pack *p, struct k3_err *err)
{
	struct k3_store_pack_layout *lo = &p->lo;
	uint8_t hdr[HDR_BYTES], sha[32];
	uint8_t *meta = NULL;
	uint64_t meta_bytes, want_meta, n_arrays;
	uint32_t n_src, n_spans, version;
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
	if (memcmp(hdr, pack_magic[K3_STORE_PACK_EXPERTS], 8) == 0)
		lo->kind = K3_STORE_PACK_EXPERTS;
	else if (memcmp(hdr, pack_magic[K3_STORE_PACK_SPINE], 8) == 0)
		lo->kind = K3_STORE_PACK_SPINE;
	else
		BAD("'%s' is not an expert pack or a spine pack (bad magic)", path);
	version = get_u32(hdr + 8);
	if (version < K3_STORE_PACK_VERSION)
		BAD("'%s' is %s of format %" PRIu32 ", which does not record its sources' file"
		    " identity; this build reads format %d: run k3ctl pack --model DIR to rewrite"
		    " it", path, pack_noun[lo->kind], version, K3_STORE_PACK_VERSION);
	if (version != K3_STORE_PACK_VERSION)
		BAD("'%s' is %s of format %" PRIu32 ", newer than this build reads (%d): run this"
		    " build's k3ctl pack --model DIR to rewrite it, or a newer k3d", path,
		    pack_noun[lo->kind], version, K3_STORE_PACK_VERSION);
	if ((rc = sha256(hdr, HDR_HASHED, sha)) != 0)
		goto out;
	if (memcmp(sha, hdr + HDR_HASHED, 32) != 0)
		BAD("'%s': header fails its SHA-256 check", path);
	n_src = get_u32(hdr + 16);
	n_spans = get_u32(hdr + 20);
	if (lo->kind == K3_STORE_PACK_EXPERTS) {
		if (get_u32(hdr + 12) != K3_STORE_ARRAYS)
			BAD("'%s': %" PRIu32 " arrays per expert, expected %d", path,
			    get_u32(hdr + 12), K3_STORE_ARRAYS);
		if (n_spans > K3_STORE_MAX_EXPERTS)
			BAD("'%s': %" PRIu32 " experts out of bounds", path, n_spans);
		n_arrays = (uint64_t)n_spans * K3_STORE_ARRAYS;
	} else {
		n_arrays = get_u32(hdr + 12);
		if (n_spans == 0 || n_spans > K3_STORE_PACK_MAX_SPINE_SPANS ||
		    n_arrays > K3_STORE_PACK_MAX_TENSORS)
			BAD("'%s': %" PRIu32 " spans and %" PRIu64 " tensors out of bounds", path,
			    n_spans, n_arrays);
	}
	if (n_src == 0 || n_src > K3_STORE_MAX_FILES)
		BAD("'%s': %" PRIu32 " sources out of bounds", path, n_src);
	meta_bytes = get_u64(hdr + 32);
	want_meta = meta_bytes_of(lo->kind, n_src, n_spans, n_arrays);
	p->data_offset = get_u64(hdr + 40);
	lo->file_bytes = get_u64(hdr + 48);
	if (get_u64(hdr + 24) != HDR_BYTES || meta_bytes != want_meta ||
	    p->data_offset != align_to(HDR_BYTES + want_meta, K3_STORE_ALIGN))
		BAD("'%s': metadata layout is inconsistent", path);
	if (lo->file_bytes != (uint64_t)st.st_size)
		BAD("'%s': file is %jd bytes, header says %" PRIu64 " (truncated?)", path,
		    (intmax_t)st.st_size, lo->file_bytes);
	meta = malloc(meta_bytes ? meta_bytes : 1);
	p->idents = calloc(n_src, sizeof(*p->idents));
	lo->spans = calloc(n_spans ? n_spans : 1, sizeof(*lo->spans));
	lo->arrays = calloc(n_arrays ? n_arrays : 1, sizeof(*lo->arrays));
	if (lo->kind == K3_STORE_PACK_SPINE)
		lo->tensors = calloc(n_arrays ? n_arrays : 1, sizeof(*lo->tensors));
	if (!meta || !p->idents || !lo->spans || !lo->arrays ||
	    (lo->kind == K3_STORE_PACK_SPINE && !lo->tensors)) {
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
	lo->n_spans = n_spans;
	lo->n_arrays = (size_t)n_arrays;
	rc = parse_sources(meta, path, p, err);
	if (rc == 0)
		rc = parse_directory(meta, path, p, err);
out:
	free(meta);
	return rc;
}

/* The start-up check: the pack's sources must be SAME as expect. */
static int check_sources(const struct k3_store_pack *p, const struct k3_store_pack_ident *expect,
			 size_t n_expect, const char *path, struct k3_err *err)
{
	char what[128];

	if (n_expect != p->n_idents)
		return k3_err_set(err, -ESTALE, "'%s' was built from %zu source files, the model"
				  " has %zu (run k3ctl pack --model DIR)", path, p->n_idents, n_expect);
	for (size_t i = 0; i < n_expect; i++) {
		switch (k3_store_pack_ident_match(&p->idents[i], &expect[i], what, sizeof(what))) {
		case K3_STORE_PACK_SAME:
			continue;
		case K3_STORE_PACK_CHANGED:
			return k3_err_set(err, -ESTALE, "'%s' is not used: its source '%s' was written"
					  " or replaced since the pack was made (%s changed), so the"
					  " pack may hold other bytes; k3ctl pack --model DIR compares"
					  " it with the source and rewrites what differs", path,
					  expect[i].name, what);
		case K3_STORE_PACK_OTHER:
			return k3_err_set(err, -ESTALE, "'%s' was built from other source files:"
					  " source %zu ('%s') has another %s (run k3ctl pack --model"
					  " DIR)", path, i, expect[i].name, what);
		}
	}
	return 0;
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
		rc = check_sources(p, expect, n_expect, path, err);
		if (rc)
			goto fail;
	}
	if (flags & K3_STORE_PACK_VERIFY) {
		rc = verify_spans(fd, p, path, err);
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
	int rc;

	if (pack->lo.kind != K3_STORE_PACK_EXPERTS)
		return k3_err_set(err, -EINVAL, "'%s' is a spine pack, not an expert pack", path);
	rc = k3_store_source_add_file(src, path, &file, err);
	if (rc)
		return rc;
	for (size_t i = 0; i < pack->lo.n_spans; i++) {
		const struct k3_store_pack_span *pe = &pack->lo.spans[i];
		struct k3_store_expert e = { .layer = pe->layer, .expert = pe->expert };
		for (int a = 0; a < K3_STORE_ARRAYS; a++) {
			const struct k3_store_pack_array *x = &pack->lo.arrays[pe->first + (uint32_t)a];
			e.ext[a].file = file;
			e.ext[a].offset = pe->offset + x->offset;
			e.ext[a].length = x->length;
		}
		rc = k3_store_source_add_expert(src, &e, err);
		if (rc)
			return rc;
	}
	return 0;
}

/* ---- encoder (for the writer) ---- */

uint64_t k3_store_pack_data_offset(const struct k3_store_pack_layout *lo, size_t n_idents)
{
	return align_to(HDR_BYTES + meta_bytes_of(lo->kind, n_idents, lo->n_spans, lo->n_arrays),
			K3_STORE_ALIGN);
}

static void encode_meta(uint8_t *meta, const struct k3_store_pack_ident *idents, size_t n_idents,
			const struct k3_store_pack_layout *lo)
{
	uint8_t *dir = meta + n_idents * SRC_REC;

	for (size_t i = 0; i < n_idents; i++) {
		uint8_t *r = meta + i * SRC_REC;
		memcpy(r + SRC_NAME, idents[i].name, strlen(idents[i].name));
		put_u64(r + SRC_SIZE, idents[i].size);
		put_u64(r + SRC_HEADER_BYTES, idents[i].header_bytes);
		memcpy(r + SRC_HEADER_SHA, idents[i].header_sha256, 32);
		put_u64(r + SRC_DEV, idents[i].dev);
		put_u64(r + SRC_INO, idents[i].ino);
		put_u64(r + SRC_MTIME, (uint64_t)idents[i].mtime_ns);
		put_u64(r + SRC_CTIME, (uint64_t)idents[i].ctime_ns);
		if (idents[i].has_sha256) {
			put_u32(r + SRC_FLAGS, SRC_FLAG_SHA256);
			memcpy(r + SRC_SHA, idents[i].sha256, 32);
		}
	}
	for (size_t i = 0; i < lo->n_spans; i++) {
		const struct k3_store_pack_span *e = &lo->spans[i];
		if (lo->kind == K3_STORE_PACK_EXPERTS) {
			uint8_t *r = dir + i * DIR_REC;
			put_u32(r, e->layer);
			put_u32(r + 4, e->expert);
			put_u64(r + 8, e->offset);
			put_u64(r + 16, e->length);
			for (int a = 0; a < K3_STORE_ARRAYS; a++) {
				put_u64(r + 24 + 16 * a, lo->arrays[e->first + (uint32_t)a].offset);
				put_u64(r + 32 + 16 * a, lo->arrays[e->first + (uint32_t)a].length);
			}
			memcpy(r + 24 + 16 * K3_STORE_ARRAYS, e->sha256, 32);
		} else {
			uint8_t *r = dir + i * SPAN_REC;
			put_u32(r, e->kind);
			put_u32(r + 4, e->layer);
			put_u64(r + 8, e->offset);
			put_u64(r + 16, e->length);
			put_u32(r + 24, e->first);
			put_u32(r + 28, e->count);
			memcpy(r + 32, e->sha256, 32);
		}
	}
	if (lo->kind != K3_STORE_PACK_SPINE)
		return;
	for (size_t j = 0; j < lo->n_arrays; j++) {
		uint8_t *r = dir + lo->n_spans * SPAN_REC + j * TENSOR_REC;
		const struct k3_store_pack_tensor *t = &lo->tensors[j];
		memcpy(r + TENSOR_NAME, t->name, strlen(t->name));
		put_u32(r + TENSOR_DTYPE, t->dtype);
		put_u32(r + TENSOR_NDIM, t->ndim);
		for (int d = 0; d < 3; d++)
			put_u64(r + TENSOR_SHAPE + 8 * d, t->shape[d]);
		put_u64(r + TENSOR_OFFSET, lo->arrays[j].offset);
		put_u64(r + TENSOR_LENGTH, lo->arrays[j].length);
	}
}

int k3_store_pack_encode_head(const struct k3_store_pack_ident *idents, size_t n_idents,
			      const struct k3_store_pack_layout *lo, uint8_t **out,
			      size_t *out_bytes)
{
	uint64_t meta_bytes = meta_bytes_of(lo->kind, n_idents, lo->n_spans, lo->n_arrays);
	uint8_t *head = calloc(1, HDR_BYTES + meta_bytes), *meta = head + HDR_BYTES;
	int rc;

	*out = NULL;
	*out_bytes = 0;
	if (!head)
		return -ENOMEM;
	encode_meta(meta, idents, n_idents, lo);
	memcpy(head, pack_magic[lo->kind], 8);
	put_u32(head + 8, K3_STORE_PACK_VERSION);
	put_u32(head + 12, lo->kind == K3_STORE_PACK_EXPERTS ? K3_STORE_ARRAYS
							      : (uint32_t)lo->n_arrays);
	put_u32(head + 16, (uint32_t)n_idents);
	put_u32(head + 20, (uint32_t)lo->n_spans);
	put_u64(head + 24, HDR_BYTES);
	put_u64(head + 32, meta_bytes);
	put_u64(head + 40, k3_store_pack_data_offset(lo, n_idents));
	put_u64(head + 48, lo->file_bytes);
	if ((rc = sha256(meta, meta_bytes, head + 56)) != 0 ||
	    (rc = sha256(head, HDR_HASHED, head + HDR_HASHED)) != 0) {
		free(head);
		return rc;
	}
	*out = head;
	*out_bytes = HDR_BYTES + meta_bytes;
	return 0;
}

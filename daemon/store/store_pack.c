/*
 * store_pack.c - the expert pack format (see store_pack.h and
 * docs/formats.md, "Expert packs"): source identities and how they
 * compare, the reader and its checks, the self-check of span hashes, and
 * the encoder of the header and metadata the writer (store_pack_write.c)
 * puts in front of the spans. Every byte offset of the format is here.
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

#define PACK_MAGIC "K3XPACK\n"

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
	DIR_REC = 4 + 4 + 8 + 8 + K3_STORE_ARRAYS * 16 + 32,
	HASH_CHUNK = 4 << 20,            /* bytes per read while hashing */
};

struct k3_store_pack {
	uint64_t file_bytes, data_offset;
	struct k3_store_pack_ident *idents;
	size_t n_idents;
	struct k3_store_pack_span *ent;
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

const struct k3_store_pack_span *k3_store_pack_span(const struct k3_store_pack *pack, size_t i)
{
	return i < pack->n_ent ? &pack->ent[i] : NULL;
}

uint64_t k3_store_pack_file_bytes(const struct k3_store_pack *pack)
{
	return pack->file_bytes;
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

int k3_store_pack_span_check(const char *path, const struct k3_store_pack_span *span,
			     const uint8_t digest[32], struct k3_err *err)
{
	if (memcmp(digest, span->sha256, 32) == 0)
		return 0;
	return k3_err_set(err, -EBADMSG, "'%s': expert (%" PRIu32 ", %" PRIu32 ") at byte %" PRIu64
			  " fails its SHA-256 check (damaged pack; delete it and run k3ctl pack"
			  " again)", path, span->layer, span->expert, span->offset);
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
		const struct k3_store_pack_span *e = &pack->ent[i];
		rc = hash_range(fd, e->offset, e->length, buf, got);
		if (rc) {
			k3_err_set(err, rc, "'%s': cannot read expert (%" PRIu32 ", %" PRIu32 "): %s",
				   path, e->layer, e->expert, strerror(-rc));
			break;
		}
		rc = k3_store_pack_span_check(path, e, got, err);
		if (rc)
			break;
		if (verified)
			*verified += e->length;
	}
	free(buf);
	return rc;
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
	if (get_u32(hdr + 8) < K3_STORE_PACK_VERSION)
		BAD("'%s' is an expert pack of format %" PRIu32 ", which does not record its"
		    " sources' file identity; this build reads format %d: run k3ctl pack --model"
		    " DIR to rewrite it", path, get_u32(hdr + 8), K3_STORE_PACK_VERSION);
	if (get_u32(hdr + 8) != K3_STORE_PACK_VERSION)
		BAD("'%s' is an expert pack of format %" PRIu32 ", newer than this build reads"
		    " (%d): run this build's k3ctl pack --model DIR to rewrite it, or a newer"
		    " k3d", path, get_u32(hdr + 8), K3_STORE_PACK_VERSION);
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
			BAD("'%s': source record %" PRIu32 " has unknown flags or fields", path, i);
		id->has_sha256 = fl & SRC_FLAG_SHA256;
		memcpy(id->sha256, r + SRC_SHA, 32);
	}
	prev_end = p->data_offset;
	for (uint32_t i = 0; i < n_exp; i++) {
		const uint8_t *r = meta + (size_t)n_src * SRC_REC + (size_t)i * DIR_REC;
		struct k3_store_pack_span *e = &p->ent[i];
		e->layer = get_u32(r);
		e->expert = get_u32(r + 4);
		e->offset = get_u64(r + 8);
		e->length = get_u64(r + 16);
		for (int a = 0; a < K3_STORE_ARRAYS; a++) {
			e->arr_off[a] = get_u64(r + 24 + 16 * a);
			e->arr_len[a] = get_u64(r + 32 + 16 * a);
		}
		memcpy(e->sha256, r + 24 + 16 * K3_STORE_ARRAYS, 32);
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
		const struct k3_store_pack_span *pe = &pack->ent[i];
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

/* ---- encoder (for the writer) ---- */

uint64_t k3_store_pack_data_offset(size_t n_idents, size_t n_spans)
{
	return align_to(HDR_BYTES + (uint64_t)n_idents * SRC_REC + (uint64_t)n_spans * DIR_REC,
			K3_STORE_ALIGN);
}

static void encode_meta(uint8_t *meta, const struct k3_store_pack_ident *idents, size_t n_idents,
			const struct k3_store_pack_span *ent, size_t n)
{
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
		memcpy(r + 24 + 16 * K3_STORE_ARRAYS, ent[i].sha256, 32);
	}
}

int k3_store_pack_encode_head(const struct k3_store_pack_ident *idents, size_t n_idents,
			      const struct k3_store_pack_span *spans, size_t n_spans,
			      uint64_t file_bytes, uint8_t **out, size_t *out_bytes)
{
	uint64_t meta_bytes = (uint64_t)n_idents * SRC_REC + (uint64_t)n_spans * DIR_REC;
	uint8_t *head = calloc(1, HDR_BYTES + meta_bytes), *meta = head + HDR_BYTES;
	int rc;

	*out = NULL;
	*out_bytes = 0;
	if (!head)
		return -ENOMEM;
	encode_meta(meta, idents, n_idents, spans, n_spans);
	memcpy(head, PACK_MAGIC, 8);
	put_u32(head + 8, K3_STORE_PACK_VERSION);
	put_u32(head + 12, K3_STORE_ARRAYS);
	put_u32(head + 16, (uint32_t)n_idents);
	put_u32(head + 20, (uint32_t)n_spans);
	put_u64(head + 24, HDR_BYTES);
	put_u64(head + 32, meta_bytes);
	put_u64(head + 40, k3_store_pack_data_offset(n_idents, n_spans));
	put_u64(head + 48, file_bytes);
	if ((rc = sha256(meta, meta_bytes, head + 56)) != 0 ||
	    (rc = sha256(head, HDR_HASHED, head + HDR_HASHED)) != 0) {
		free(head);
		return rc;
	}
	*out = head;
	*out_bytes = HDR_BYTES + meta_bytes;
	return 0;
}

/*
 * store_pack.h - expert packs: each expert's six arrays copied, byte for
 * byte, into one contiguous span aligned to 4 KiB, so a cold expert costs one
 * O_DIRECT pread instead of six scattered ones (architecture.md, "Model
 * store"). docs/formats.md ("Expert packs") describes the file format; in
 * short (little endian):
 *
 *   [0, 4096)            header: magic "K3XPACK\n", version, counts, the
 *                        offsets below, SHA-256 of the metadata, SHA-256
 *                        of the header itself
 *   [4096, data_offset)  metadata: source records (name, size, header
 *                        bytes, SHA-256 of the header, the file's device,
 *                        inode, mtime and ctime, a SHA-256 of the whole
 *                        file when known) then the directory (layer,
 *                        expert, span offset, span length, six (offset,
 *                        length) pairs relative to the span, SHA-256 of
 *                        the span)
 *   [data_offset, end)   spans, each starting on a 4 KiB boundary; inside a
 *                        span the arrays follow enum k3_store_array, each
 *                        on a 64-byte boundary, gaps zero
 *
 * A pack must never outlive the bytes it was made from. It records the
 * identity of every source file it was built from; a reader refuses a pack
 * whose sources are other files (name, size, header) or whose files were
 * written or replaced since (device, inode, mtime, ctime): checking that
 * costs a stat and a header hash per source, never a read of the experts.
 * The writer (k3ctl pack) compares a pack whose sources changed, and with
 * K3_STORE_PACK_VERIFY any pack, span by span with the source bytes, and
 * rewrites a stale one. Packs are published atomically (temp file, fsync,
 * rename, fsync of the directory) and never change a weight byte.
 */
#ifndef K3_STORE_PACK_H
#define K3_STORE_PACK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#include "base/err.h"
#include "store/store_source.h"

enum {
	/* 2: source records carry the file's identity (device, inode, mtime,
	 * ctime) and a whole-file SHA-256 slot. 1: name, size and header
	 * only; refused with a message to run k3ctl pack, which rewrites it. */
	K3_STORE_PACK_VERSION = 2,
	K3_STORE_PACK_NAME_MAX = 255,       /* bytes of a source name, without NUL */
	K3_STORE_PACK_ARRAY_ALIGN = 64,     /* bytes, array start inside a span */
};
/* Bytes of a source file's header that are hashed into its identity. */
#define K3_STORE_PACK_MAX_HEADER_BYTES ((uint64_t)256 << 20)

/* Identity of a source file (a safetensors shard). The first four fields
 * say which file it is; the next four say that the file system has not
 * written or replaced it since (a copy, a restore, a re-download or an
 * in-place write changes at least one; ctime cannot be set from user
 * space). */
struct k3_store_pack_ident {
	char name[K3_STORE_PACK_NAME_MAX + 1];   /* file name as the model lists it */
	uint64_t size;                           /* bytes */
	uint64_t header_bytes;                   /* bytes hashed from offset 0 */
	uint8_t header_sha256[32];
	uint64_t dev, ino;                       /* st_dev, st_ino */
	int64_t mtime_ns, ctime_ns;              /* st_mtim, st_ctim, ns since the epoch */
	/* SHA-256 of the whole file when a verified download says so (issue
	 * 20 fills it); k3_store_pack_ident never reads the whole file. When
	 * both sides of a comparison have one they must be equal. */
	bool has_sha256;
	uint8_t sha256[32];
};

/* Computes the identity of `path`: its size, stat identity and the SHA-256
 * of its first header_bytes bytes. header_bytes == 0 means "a safetensors
 * file": 8 plus the little-endian u64 stored in its first 8 bytes (bounded
 * by K3_STORE_PACK_MAX_HEADER_BYTES). name is copied (must fit); the
 * whole-file SHA-256 is left unset. */
int k3_store_pack_ident(const char *path, const char *name, uint64_t header_bytes,
			struct k3_store_pack_ident *out, struct k3_err *err);

/* Sets the file-system fields of id (size, dev, ino, mtime, ctime) from st. */
void k3_store_pack_ident_stat(struct k3_store_pack_ident *id, const struct stat *st);

/* How a source identity recorded in a pack compares with the file now. */
enum k3_store_pack_match {
	K3_STORE_PACK_SAME = 0,      /* every field equal */
	/* Same name, size, header (and whole-file SHA-256 where both have
	 * one), but the file was written or replaced since: its bytes may
	 * differ. Only a comparison of the spans with it can tell. */
	K3_STORE_PACK_CHANGED = 1,
	/* (also: `now` has a verified SHA-256 that `was` lacks: k3ctl pack
	 * then compares the spans with the verified file and records it) */
	K3_STORE_PACK_OTHER = 2,     /* another file: name, size, header or SHA-256 differ */
};

/* Compares the identity `was` (recorded in a pack) with `now`. what (may be
 * NULL) gets the differing fields, e.g. "mtime, ctime". */
enum k3_store_pack_match k3_store_pack_ident_match(const struct k3_store_pack_ident *was,
						   const struct k3_store_pack_ident *now,
						   char *what, size_t what_size);

enum k3_store_pack_flags {
	/* pack_open: recheck every span against its SHA-256. pack_write:
	 * compare every span of an existing pack with its source bytes. */
	K3_STORE_PACK_VERIFY = 1 << 0,
};

struct k3_store_pack_result {
	bool written;          /* true: a new pack was published; false: existing one kept */
	bool replaced;         /* an existing pack (stale, malformed, older format) was replaced */
	/* Kept after a comparison with the sources: a source file changed
	 * identity (CHANGED), every span still equals its bytes, and the
	 * pack's source records were rewritten in place to the files now. */
	bool reverified;
	size_t n_experts;
	uint64_t file_bytes;
	uint64_t payload_bytes;   /* sum of array bytes (what the experts weigh) */
	/* Span bytes checked: compared with the sources (an existing pack) or
	 * rehashed after the write (a new one). */
	uint64_t verified_bytes;
	/* Why an existing pack was replaced or re-verified ("" otherwise). */
	char why[K3_ERR_MSG_MAX];
};

/* Writes the pack `path` holding every expert of `src`, sorted by (layer,
 * expert). src's file i must be the source described by idents[i]
 * (n_idents == its file count), identified before src opened it: a file
 * whose descriptor's stat differs from its ident, before or after the
 * copy, was changed meanwhile and fails the write (-EAGAIN, nothing
 * published). An existing pack at `path` for the same experts is
 *
 *   - kept as it is when every source is SAME (and VERIFY is not set);
 *   - compared span by span with its source bytes when a source is
 *     CHANGED, or with VERIFY: if every span is equal it is kept (after a
 *     CHANGED source, with its source records updated in place to the
 *     files now: res->reverified); if a span differs it is stale and
 *     rewritten (res->why names the expert and the file); if a span also
 *     fails its own SHA-256 the pack is damaged: -EBADMSG naming the
 *     expert, and the file is left for the user to inspect or delete;
 *   - rewritten when a source is OTHER, or the pack is malformed or of
 *     another format version.
 * A new pack is written to a temp file beside it, fsynced, every span read
 * back and its hash checked, then renamed over `path` and the directory
 * fsynced.
 * Returns 0; -EBADMSG (damaged, above); -EAGAIN (a source changed while it
 * was read); other negative errno for I/O failures. */
int k3_store_pack_write(const char *path, const struct k3_store_source *src,
			const struct k3_store_pack_ident *idents, size_t n_idents,
			unsigned flags, struct k3_store_pack_result *res,
			struct k3_err *err);

/* An opened, validated pack. */
struct k3_store_pack;

/* Opens and validates `path`: header and metadata hashes, every bound, spans
 * aligned, inside the file and not overlapping. When expect != NULL the
 * pack's sources must be SAME as expect[0..n_expect) (same order): this
 * is the check at k3d's start, a stat and a header hash per source and no
 * expert byte read. With K3_STORE_PACK_VERIFY every span hash is rechecked
 * too.
 * Returns 0, -ENOENT (no pack), -EBADMSG (malformed, damaged or of another
 * format version: the message says what, and what to run), -ESTALE (built
 * from other sources, or a source was written or replaced since: the
 * message names the file and the fields, and says to run k3ctl pack), or
 * an I/O errno. */
int k3_store_pack_open(const char *path, const struct k3_store_pack_ident *expect,
		       size_t n_expect, unsigned flags, struct k3_store_pack **out,
		       struct k3_err *err);
void k3_store_pack_free(struct k3_store_pack *pack);

size_t k3_store_pack_expert_count(const struct k3_store_pack *pack);
size_t k3_store_pack_source_count(const struct k3_store_pack *pack);
const struct k3_store_pack_ident *k3_store_pack_source(const struct k3_store_pack *pack,
						       size_t i);

/* One directory entry: an expert's span in the pack file. */
struct k3_store_pack_span {
	uint32_t layer, expert;
	uint64_t offset, length;     /* bytes in the file; offset a multiple of K3_STORE_ALIGN */
	uint64_t arr_off[K3_STORE_ARRAYS], arr_len[K3_STORE_ARRAYS];   /* relative to the span */
	uint8_t sha256[32];          /* of the span's length bytes, gaps included */
};

/* Span i (< expert count, sorted by (layer, expert)), or NULL. Owned by
 * the pack. */
const struct k3_store_pack_span *k3_store_pack_span(const struct k3_store_pack *pack, size_t i);
/* Checks the SHA-256 `digest` of span's bytes (read from the pack at path)
 * against the one recorded for it. Returns 0, or -EBADMSG with a message
 * naming the expert and its offset: the pack is damaged. */
int k3_store_pack_span_check(const char *path, const struct k3_store_pack_span *span,
			     const uint8_t digest[32], struct k3_err *err);
/* The pack file's size in bytes. */
uint64_t k3_store_pack_file_bytes(const struct k3_store_pack *pack);

/* Entry i (< expert count, sorted by (layer, expert)): its ids and the byte
 * length of each array. Returns 0 or -ERANGE. */
int k3_store_pack_entry(const struct k3_store_pack *pack, size_t i, uint32_t *layer,
			uint32_t *expert, uint64_t length[K3_STORE_ARRAYS]);

/* Adds the pack file to src and registers every expert of the pack with
 * extents pointing into its spans. Returns what the source calls return. */
int k3_store_pack_add_to_source(const struct k3_store_pack *pack, const char *path,
				struct k3_store_source *src, struct k3_err *err);

/* ---- the format, for the writer (store_pack_write.c) ---- */

/* Byte offset of the first span in a pack of n_idents sources and n_spans
 * experts: the header and metadata rounded up to K3_STORE_ALIGN. */
uint64_t k3_store_pack_data_offset(size_t n_idents, size_t n_spans);

/* Encodes the pack's header and metadata, the bytes [0, 4096 + metadata)
 * of the file, with both SHA-256s: the sources, then spans[0..n_spans)
 * (sorted by (layer, expert), placed from k3_store_pack_data_offset on,
 * hashes set). *out is malloc'd (free it), *out_bytes its length.
 * Returns 0 or -ENOMEM / -EIO. */
int k3_store_pack_encode_head(const struct k3_store_pack_ident *idents, size_t n_idents,
			      const struct k3_store_pack_span *spans, size_t n_spans,
			      uint64_t file_bytes, uint8_t **out, size_t *out_bytes);

#endif

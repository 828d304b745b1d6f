/*
 * store_pack.h - expert packs: each expert's six arrays copied, byte for
 * byte, into one contiguous span aligned to 4 KiB, so a cold expert costs one
 * O_DIRECT pread instead of six scattered ones (architecture.md, "Model
 * store"). docs/store.md describes the file format; in short (little
 * endian):
 *
 *   [0, 4096)            header: magic "K3XPACK\n", version, counts, the
 *                        offsets below, SHA-256 of the metadata, SHA-256
 *                        of the header itself
 *   [4096, data_offset)  metadata: source records (name, size, header
 *                        bytes, SHA-256 of the header) then the directory
 *                        (layer, expert, span offset, span length, six
 *                        (offset, length) pairs relative to the span,
 *                        SHA-256 of the span)
 *   [data_offset, end)   spans, each starting on a 4 KiB boundary; inside a
 *                        span the arrays follow enum k3_store_array, each
 *                        on a 64-byte boundary, gaps zero
 *
 * A pack names the source shards it was built from; a reader refuses a pack
 * whose sources changed. Packs are published atomically (temp file, fsync,
 * rename, fsync of the directory) and never change a weight byte.
 */
#ifndef K3_STORE_PACK_H
#define K3_STORE_PACK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "store/store_source.h"

enum {
	K3_STORE_PACK_VERSION = 1,
	K3_STORE_PACK_NAME_MAX = 255,       /* bytes of a source name, without NUL */
	K3_STORE_PACK_ARRAY_ALIGN = 64,     /* bytes, array start inside a span */
};
/* Bytes of a source file's header that are hashed into its identity. */
#define K3_STORE_PACK_MAX_HEADER_BYTES ((uint64_t)256 << 20)

/* Identity of a source file (a safetensors shard): a pack is valid only for
 * sources with exactly these names, sizes and header digests. */
struct k3_store_pack_ident {
	char name[K3_STORE_PACK_NAME_MAX + 1];   /* file name as the model lists it */
	uint64_t size;                           /* bytes */
	uint64_t header_bytes;                   /* bytes hashed from offset 0 */
	uint8_t header_sha256[32];
};

/* Computes the identity of `path`: its size and the SHA-256 of its first
 * header_bytes bytes. header_bytes == 0 means "a safetensors file": 8 plus
 * the little-endian u64 stored in its first 8 bytes (bounded by
 * K3_STORE_PACK_MAX_HEADER_BYTES). name is copied (must fit). */
int k3_store_pack_ident(const char *path, const char *name, uint64_t header_bytes,
			struct k3_store_pack_ident *out, struct k3_err *err);

enum k3_store_pack_flags {
	K3_STORE_PACK_VERIFY = 1 << 0,   /* recheck every span hash */
};

struct k3_store_pack_result {
	bool written;          /* true: a new pack was published; false: existing one kept */
	bool replaced;         /* an existing pack for other sources was replaced */
	size_t n_experts;
	uint64_t file_bytes;
	uint64_t payload_bytes;   /* sum of array bytes (what the experts weigh) */
	uint64_t verified_bytes;  /* span bytes rehashed (VERIFY or a fresh write) */
};

/* Writes the pack `path` holding every expert of `src`, sorted by (layer,
 * expert). src's file i must be the source described by idents[i]
 * (n_idents == its file count). If a pack already exists there for the same
 * sources and the same expert list it is kept (and with K3_STORE_PACK_VERIFY
 * every span is rehashed); otherwise a new pack is written to a temp file
 * beside it, fsynced, every span read back and its hash checked, then
 * renamed over `path` and the directory fsynced.
 * Returns 0; -EBADMSG when VERIFY finds a damaged span (the message names the
 * expert; the file is left alone for the user to inspect or delete); other
 * negative errno for I/O failures. */
int k3_store_pack_write(const char *path, const struct k3_store_source *src,
			const struct k3_store_pack_ident *idents, size_t n_idents,
			unsigned flags, struct k3_store_pack_result *res,
			struct k3_err *err);

/* An opened, validated pack. */
struct k3_store_pack;

/* Opens and validates `path`: header and metadata hashes, every bound, spans
 * aligned, inside the file and not overlapping. When expect != NULL the
 * pack's sources must equal expect[0..n_expect) (same order). With
 * K3_STORE_PACK_VERIFY every span hash is rechecked too.
 * Returns 0, -ENOENT (no pack), -EBADMSG (malformed or damaged: the message
 * says what), -ESTALE (built from other sources), or an I/O errno. */
int k3_store_pack_open(const char *path, const struct k3_store_pack_ident *expect,
		       size_t n_expect, unsigned flags, struct k3_store_pack **out,
		       struct k3_err *err);
void k3_store_pack_free(struct k3_store_pack *pack);

size_t k3_store_pack_expert_count(const struct k3_store_pack *pack);
size_t k3_store_pack_source_count(const struct k3_store_pack *pack);
const struct k3_store_pack_ident *k3_store_pack_source(const struct k3_store_pack *pack,
						       size_t i);

/* Entry i (< expert count, sorted by (layer, expert)): its ids and the byte
 * length of each array. Returns 0 or -ERANGE. */
int k3_store_pack_entry(const struct k3_store_pack *pack, size_t i, uint32_t *layer,
			uint32_t *expert, uint64_t length[K3_STORE_ARRAYS]);

/* Adds the pack file to src and registers every expert of the pack with
 * extents pointing into its spans. Returns what the source calls return. */
int k3_store_pack_add_to_source(const struct k3_store_pack *pack, const char *path,
				struct k3_store_source *src, struct k3_err *err);

#endif

/*
 * store_pack.h - packs: weight bytes copied, byte for byte, into contiguous
 * spans aligned to 4 KiB, so what the engine needs at once costs one
 * O_DIRECT pread instead of many scattered ones (docs/architecture.md, "Model
 * store"). Two kinds share one format, one reader and one writer:
 *
 *   expert packs ("K3XPACK\n", k3ctl pack, one file per MoE layer): a span
 *   per routed expert holding its six arrays;
 *   spine packs ("K3SPACK\n", one file per model): a span per layer with
 *   every tensor the layer needs besides its routed experts, one for the
 *   embedding and one for the head (final norm, output AttnRes norm and
 *   projection, lm_head), and a tensor table naming each tensor with its
 *   dtype and shape.
 *
 * docs/formats.md ("Expert packs", "Spine packs") describes the bytes; in
 * short (little endian):
 *
 *   [0, 4096)            header: magic, version, counts, the offsets below,
 *                        SHA-256 of the metadata, SHA-256 of the header
 *   [4096, data_offset)  metadata: source records (name, size, header
 *                        bytes, SHA-256 of the header, the file's device,
 *                        inode, mtime and ctime, a SHA-256 of the whole
 *                        file when known), then the directory (one entry
 *                        per span: kind, ids, offset, length, its arrays'
 *                        offsets and lengths relative to the span, SHA-256
 *                        of the span), then (spine packs) the tensor table
 *   [data_offset, end)   spans, each starting on a 4 KiB boundary; inside a
 *                        span the arrays follow in directory order, each on
 *                        a 64-byte boundary, gaps zero
 *
 * A pack must never outlive the bytes it was made from. It records the
 * identity of every source file it was built from; a reader refuses a pack
 * whose sources are other files (name, size, header) or whose files were
 * written or replaced since (device, inode, mtime, ctime): checking that
 * costs a stat and a header hash per source, never a read of the spans.
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

/* What a pack holds; its magic says which. */
enum k3_store_pack_kind {
	K3_STORE_PACK_EXPERTS = 0,   /* "K3XPACK\n": one span per routed expert of a layer */
	K3_STORE_PACK_SPINE = 1,     /* "K3SPACK\n": the spine, one span per layer + embed + head */
};

/* What one span holds. The directory is sorted by (kind, layer, expert). */
enum k3_store_span_kind {
	K3_STORE_SPAN_EXPERT = 0,    /* a routed expert's six arrays, enum k3_store_array order */
	K3_STORE_SPAN_LAYER = 1,     /* every tensor of `layer` but its routed experts */
	K3_STORE_SPAN_EMBED = 2,     /* model.embed_tokens (layer 0) */
	K3_STORE_SPAN_HEAD = 3,      /* model.norm, output AttnRes norm and proj, lm_head (layer 0) */
};

enum {
	K3_STORE_PACK_TENSOR_NAME_MAX = 159,   /* bytes of a tensor name, without NUL */
	K3_STORE_PACK_MAX_TENSORS = 1 << 16,   /* tensors of one spine pack */
	K3_STORE_PACK_MAX_SPINE_SPANS = K3_STORE_MAX_LAYERS + 2,
};
/* One spine tensor may not exceed 1 TiB (K3's embedding is 2.35 GB). */
#define K3_STORE_PACK_MAX_TENSOR_BYTES ((uint64_t)1 << 40)

/* One array of a span: its bytes, relative to the span's first byte. */
struct k3_store_pack_array {
	uint64_t offset, length;
};

/* What a spine pack records about each of its arrays (a tensor). The
 * dtype is the provider's (providers/k3_provider.h, enum k3_prov_dtype:
 * F32 1, BF16 2, U8 3, I8 4 = row-wise int8 followed by one fp32 scale
 * per row), never assumed: length need not be numel x element size. */
struct k3_store_pack_tensor {
	char name[K3_STORE_PACK_TENSOR_NAME_MAX + 1];   /* the checkpoint's name */
	uint32_t dtype;
	uint32_t ndim;                                  /* 1..3 */
	uint64_t shape[3];                              /* unused dims 1 */
};

/* One directory entry. */
struct k3_store_pack_span {
	uint32_t kind;               /* enum k3_store_span_kind */
	uint32_t layer, expert;      /* expert: the routed expert's id; 0 for spine spans */
	uint64_t offset, length;     /* bytes in the file; offset a multiple of K3_STORE_ALIGN */
	uint32_t first, count;       /* its arrays: [first, first + count) of the layout's */
	uint8_t sha256[32];          /* of the span's length bytes, gaps included */
};

/* Where everything of a pack lies (the reader's view, and what the writer
 * plans): spans sorted by (kind, layer, expert), their arrays consecutive
 * in span order (span i's first = the sum of the counts before it). */
struct k3_store_pack_layout {
	enum k3_store_pack_kind kind;
	struct k3_store_pack_span *spans;
	size_t n_spans;
	struct k3_store_pack_array *arrays;     /* [n_arrays] */
	struct k3_store_pack_tensor *tensors;   /* [n_arrays] for spine packs, NULL for expert packs */
	size_t n_arrays;
	uint64_t file_bytes;
};

struct k3_store_pack_result {
	bool written;          /* true: a new pack was published; false: existing one kept */
	bool replaced;         /* an existing pack (stale, malformed, older format) was replaced */
	/* Kept after a comparison with the sources: a source file changed
	 * identity (CHANGED), every span still equals its bytes, and the
	 * pack's source records were rewritten in place to the files now. */
	bool reverified;
	size_t n_spans;        /* experts (expert pack) or layers + embed + head (spine pack) */
	uint64_t file_bytes;
	uint64_t payload_bytes;   /* sum of array bytes (what the weights weigh) */
	/* Span bytes checked: compared with the sources (an existing pack) or
	 * rehashed after the write (a new one). */
	uint64_t verified_bytes;
	/* Why an existing pack was replaced or re-verified ("" otherwise). */
	char why[K3_ERR_MSG_MAX];
};

/* What the writer copies: spans (kind, layer, expert, first, count; the
 * rest is planned) sorted by (kind, layer, expert), and for each array the
 * extent of its bytes in src's files (file i of src is the source that
 * identity i describes) and, for a spine pack, the tensor it is. */
struct k3_store_pack_input {
	enum k3_store_pack_kind kind;
	const struct k3_store_source *src;
	const struct k3_store_pack_span *spans;
	size_t n_spans;
	const struct k3_store_extent *extents;        /* [n_arrays] */
	const struct k3_store_pack_tensor *tensors;   /* [n_arrays] (spine) or NULL (experts) */
	size_t n_arrays;
};

/* Writes the pack `path` holding in's spans. src's files must be the
 * sources described by idents[0..n_idents) (n_idents == its file count),
 * identified before src opened them: a file whose descriptor's stat
 * differs from its ident, before or after the copy, was changed meanwhile
 * and fails the write (-EAGAIN, nothing published). An existing pack at
 * `path` with the same layout is
 *
 *   - kept as it is when every source is SAME (and VERIFY is not set);
 *   - compared span by span with its source bytes when a source is
 *     CHANGED, or with VERIFY: if every span is equal it is kept (after a
 *     CHANGED source, with its source records updated in place to the
 *     files now: res->reverified); if a span differs it is stale and
 *     rewritten (res->why names the span and the file); if a span also
 *     fails its own SHA-256 the pack is damaged: -EBADMSG naming the
 *     span, and the file is left for the user to inspect or delete;
 *   - rewritten when a source is OTHER, or the pack is malformed or of
 *     another layout or format version.
 * A new pack is written to a temp file beside it (span by span in bounded
 * chunks: a span may be gigabytes), fsynced, every span read back and its
 * hash checked, then renamed over `path` and the directory fsynced.
 * Returns 0; -EINVAL (in is inconsistent: unsorted spans, arrays that do
 * not partition, a tensor name too long); -EBADMSG (damaged, above);
 * -EAGAIN (a source changed while it was read); other negative errno for
 * I/O failures. */
int k3_store_pack_write_input(const char *path, const struct k3_store_pack_input *in,
			      const struct k3_store_pack_ident *idents, size_t n_idents,
			      unsigned flags, struct k3_store_pack_result *res,
			      struct k3_err *err);

/* k3_store_pack_write_input of an expert pack holding every expert of
 * `src` (its six arrays each), sorted by (layer, expert). */
int k3_store_pack_write(const char *path, const struct k3_store_source *src,
			const struct k3_store_pack_ident *idents, size_t n_idents,
			unsigned flags, struct k3_store_pack_result *res,
			struct k3_err *err);

/* An opened, validated pack. */
struct k3_store_pack;

/* Opens and validates `path` (either kind): header and metadata hashes,
 * every bound, spans aligned, inside the file and not overlapping, arrays
 * inside their spans (spine packs: ascending, 64-byte aligned, tensors
 * named). When expect != NULL the pack's sources must be SAME as
 * expect[0..n_expect) (same order): this is the check at k3d's start, a
 * stat and a header hash per source and no span byte read. With
 * K3_STORE_PACK_VERIFY every span hash is rechecked too.
 * Returns 0, -ENOENT (no pack), -EBADMSG (malformed, damaged or of another
 * format version: the message says what, and what to run), -ESTALE (built
 * from other sources, or a source was written or replaced since: the
 * message names the file and the fields, and says to run k3ctl pack), or
 * an I/O errno. */
int k3_store_pack_open(const char *path, const struct k3_store_pack_ident *expect,
		       size_t n_expect, unsigned flags, struct k3_store_pack **out,
		       struct k3_err *err);
void k3_store_pack_free(struct k3_store_pack *pack);

enum k3_store_pack_kind k3_store_pack_kind(const struct k3_store_pack *pack);
/* The pack's spans, arrays and tensors (owned by the pack). */
const struct k3_store_pack_layout *k3_store_pack_layout(const struct k3_store_pack *pack);
/* Number of spans (for an expert pack: of experts). */
size_t k3_store_pack_expert_count(const struct k3_store_pack *pack);
size_t k3_store_pack_source_count(const struct k3_store_pack *pack);
const struct k3_store_pack_ident *k3_store_pack_source(const struct k3_store_pack *pack,
						       size_t i);

/* Span i (< span count, sorted by (kind, layer, expert)), or NULL. Owned
 * by the pack. */
const struct k3_store_pack_span *k3_store_pack_span(const struct k3_store_pack *pack, size_t i);
/* Array j (< the layout's n_arrays) relative to its span, or NULL. */
const struct k3_store_pack_array *k3_store_pack_array(const struct k3_store_pack *pack, size_t j);
/* Checks the SHA-256 `digest` of span's bytes (read from the pack at path)
 * against the one recorded for it. Returns 0, or -EBADMSG with a message
 * naming the span and its offset: the pack is damaged. */
int k3_store_pack_span_check(const char *path, const struct k3_store_pack_span *span,
			     const uint8_t digest[32], struct k3_err *err);
/* "expert (L, E)", "layer L", "the embedding" or "the head", for messages. */
void k3_store_pack_span_name(const struct k3_store_pack_span *span, char *buf, size_t size);
/* The pack file's size in bytes. */
uint64_t k3_store_pack_file_bytes(const struct k3_store_pack *pack);

/* Expert pack entry i (< expert count, sorted by (layer, expert)): its ids
 * and the byte length of each array. Returns 0, or -ERANGE (no entry i, or
 * a spine pack). */
int k3_store_pack_entry(const struct k3_store_pack *pack, size_t i, uint32_t *layer,
			uint32_t *expert, uint64_t length[K3_STORE_ARRAYS]);

/* Adds the pack file to src and registers every expert of an expert pack
 * with extents pointing into its spans. Returns what the source calls
 * return, or -EINVAL for a spine pack. */
int k3_store_pack_add_to_source(const struct k3_store_pack *pack, const char *path,
				struct k3_store_source *src, struct k3_err *err);

/* ---- the format, for the writer (store_pack_write.c) ---- */

/* Byte offset of the first span of a pack of the layout's kind and counts
 * with n_idents sources: the header and metadata rounded up to
 * K3_STORE_ALIGN. */
uint64_t k3_store_pack_data_offset(const struct k3_store_pack_layout *lo, size_t n_idents);

/* Encodes the pack's header and metadata, the bytes [0, 4096 + metadata)
 * of the file, with both SHA-256s: the sources, then the layout's spans
 * (placed from k3_store_pack_data_offset on, hashes set), arrays and
 * tensors. *out is malloc'd (free it), *out_bytes its length. Returns 0 or
 * -ENOMEM / -EIO. */
int k3_store_pack_encode_head(const struct k3_store_pack_ident *idents, size_t n_idents,
			      const struct k3_store_pack_layout *lo, uint8_t **out,
			      size_t *out_bytes);

#endif

/*
 * setup_experts.h - routed experts in a streaming install: which are on
 * disk and how well they are verified (the expert map), the per-expert
 * SHA-256 table that lets each one be verified before use, and where an
 * expert's bytes lie in its shard (what a range request asks for).
 *
 * A streaming install keeps the release's shard files at their real names
 * and sizes, sparse: the header and the spine are written by setup, each
 * routed expert's bytes land at their own offsets when they are first
 * fetched. So k3d opens the same checkpoint as a full install and reads
 * the same bytes, which is why both generate the same ids.
 *
 * The expert map, MODEL/.k3-setup/experts.map: a 64-byte header ("K3XMAP1\n",
 * u32 layers, u32 experts per layer, little endian, zero padding) and one
 * byte per (layer, expert), layer-major: enum k3_setup_expert_have, or 255
 * for a layer without routed experts. Shared, memory-mapped: k3ctl and k3d
 * see each other's updates. An expert is marked present only after its
 * bytes were written and synced, so the map never claims bytes a crash
 * lost (it may forget some: they are fetched again).
 *
 * The per-expert table (docs/formats.md, "Per-expert SHA-256 table"): text,
 *
 *     k3-expert-sha256 1
 *     LAYER EXPERT SHA256
 *     ...
 *
 * one line per routed expert sorted by (layer, expert); the digest is over
 * the expert's arrays concatenated in the order w1.weight_packed,
 * w1.weight_scale, w2.weight_packed, w2.weight_scale, w3.weight_packed,
 * w3.weight_scale (w1, w2, w3 .weight for an unquantized model), i.e.
 * independent of how the shard lays them out. `k3ctl pack` writes it on a
 * full install (k3-expert-sha256.txt beside the shards); an inventory that
 * lists it (expert_table) makes every streamed expert verified before use.
 */
#ifndef K3_SETUP_EXPERTS_H
#define K3_SETUP_EXPERTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "model/model.h"

enum k3_setup_expert_have {
	K3_SETUP_EXPERT_ABSENT = 0,     /* not on disk (a hole in the sparse shard) */
	K3_SETUP_EXPERT_TLS = 1,        /* on disk, verified only by TLS so far */
	K3_SETUP_EXPERT_VERIFIED = 2,   /* on disk, equal to the per-expert table */
	K3_SETUP_EXPERT_SHARD = 3,      /* on disk, its whole shard's SHA-256 checked */
	K3_SETUP_EXPERT_NONE = 255,     /* the layer has no routed experts */
};

#define K3_SETUP_EXPERT_MAP_NAME "experts.map"

/* ---- where an expert's bytes are ---- */

/* One array of an expert: bytes [offset, offset + length) of shard `shard`. */
struct k3_setup_extent {
	uint32_t shard;
	uint64_t offset, length;
};

/* The arrays of routed expert (layer, expert) of m in table order into
 * ext[6]; *n gets 6 (MXFP4) or 3 (unquantized). Returns 0 or -ENOENT (not
 * a routed expert of m). */
int k3_setup_expert_extents(const struct k3_model *m, uint32_t layer, uint32_t expert,
			    struct k3_setup_extent ext[6], unsigned *n);

/* SHA-256 of the expert's arrays in table order, read with pread from
 * fds[shard] (the shard files of m, indexed like k3_model_shard_path).
 * Returns 0 or the read errno. */
int k3_setup_expert_sha256(const struct k3_model *m, uint32_t layer, uint32_t expert,
			   const int *fds, uint8_t out[32], struct k3_err *err);

/* True when `name` is a routed expert's tensor (".experts.E.wN." after
 * "layers.L."); *layer and *expert get L and E (either may be NULL). */
bool k3_setup_expert_tensor(const char *name, uint32_t *layer, uint32_t *expert);

/* Where a shard's bytes go in a streaming install, from its header. */
struct k3_setup_range {
	uint64_t off, len;          /* absolute bytes of the file */
};
struct k3_setup_shard_layout {
	uint64_t header_end;        /* 8 + header length: [0, header_end) is the header */
	struct k3_setup_range *spine;   /* every other non-expert tensor, adjacent ones merged */
	size_t n_spine;
	uint64_t spine_bytes;       /* header_end + the spine ranges */
	size_t n_expert_tensors;
};

/* Lays out a shard of file_size bytes from its first 8 bytes and its JSON
 * header (header_len bytes), validated as k3d validates it
 * (safetensors.h). Returns 0 or -EINVAL naming `what`. */
int k3_setup_shard_layout(const uint8_t prefix[8], const char *header, size_t header_len,
			  uint64_t file_size, const char *what, struct k3_setup_shard_layout *out,
			  struct k3_err *err);
void k3_setup_shard_layout_release(struct k3_setup_shard_layout *l);

/* The spine bytes of the safetensors file open at fd (size bytes), read
 * from its header. Returns 0 or the errno. */
int k3_setup_spine_bytes(int fd, uint64_t size, const char *what, uint64_t *out,
			 struct k3_err *err);

/* ---- the map ---- */

struct k3_setup_expert_map;

/* Creates dirfd/.k3-setup/experts.map for m (every routed expert absent)
 * unless one for the same geometry exists. Returns 0, -EEXIST when one for
 * another geometry is there, or the errno. */
int k3_setup_expert_map_create(int dirfd, const struct k3_model *m, struct k3_err *err);
/* Opens it (read-write when write). Returns 0, -ENOENT (a full install has
 * none), -EINVAL (malformed) or the errno. */
int k3_setup_expert_map_open(int dirfd, bool write, struct k3_setup_expert_map **out,
			     struct k3_err *err);
void k3_setup_expert_map_close(struct k3_setup_expert_map *map);
uint32_t k3_setup_expert_map_layers(const struct k3_setup_expert_map *map);
uint32_t k3_setup_expert_map_experts(const struct k3_setup_expert_map *map);
/* The state of (layer, expert); K3_SETUP_EXPERT_NONE out of range. */
enum k3_setup_expert_have k3_setup_expert_map_get(const struct k3_setup_expert_map *map,
						  uint32_t layer, uint32_t expert);
/* Sets it (the map must be open for writing). */
void k3_setup_expert_map_set(struct k3_setup_expert_map *map, uint32_t layer, uint32_t expert,
			     enum k3_setup_expert_have have);
/* Makes the map's changes durable. 0 or the errno. */
int k3_setup_expert_map_sync(struct k3_setup_expert_map *map);
/* Routed experts in each state: counts[have] for have 0..3. */
void k3_setup_expert_map_counts(const struct k3_setup_expert_map *map, uint64_t counts[4]);

/* ---- the per-expert table ---- */

struct k3_setup_expert_table;

/* Parses a table (len bytes, at most 64 MiB). Returns 0 or -EINVAL naming
 * the line. */
int k3_setup_expert_table_parse(const char *text, size_t len, struct k3_setup_expert_table **out,
				struct k3_err *err);
void k3_setup_expert_table_free(struct k3_setup_expert_table *t);
/* The digest of (layer, expert). 0 or -ENOENT. */
int k3_setup_expert_table_find(const struct k3_setup_expert_table *t, uint32_t layer,
			       uint32_t expert, uint8_t out[32]);
size_t k3_setup_expert_table_count(const struct k3_setup_expert_table *t);

/* Writes the table of every routed expert of m to dirfd/name atomically,
 * hashing the mapped tensors; an identical file already there is kept.
 * Returns 0 or the errno; *n gets the count. */
int k3_setup_expert_table_write(const struct k3_model *m, int dirfd, const char *name,
				size_t *n, struct k3_err *err);

#endif

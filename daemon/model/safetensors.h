/*
 * safetensors.h - bounded parsers for the safetensors shard header and the
 * Hugging Face shard index (model.safetensors.index.json). Pure functions on
 * memory: no I/O, no logging; model.c does the file work. Fuzzed by
 * tests/fuzz/fuzz_safetensors.c.
 *
 * Shard file layout: u64 little-endian N, then N bytes of JSON header
 * ({"__metadata__": {str: str}, name: {"dtype", "shape", "data_offsets":
 * [begin, end]}}), then the data section. Offsets are relative to the data
 * section. Validated here: N <= K3_ST_HEADER_MAX and inside the file, known
 * dtypes only, every shape dimension an integer >= 0, nelem * dtype size ==
 * end - begin with checked arithmetic, begin <= end <= data length, no two
 * payloads overlapping, names 1..K3_TENSOR_NAME_MAX bytes without NUL, no
 * duplicate names (JSON duplicate keys are rejected).
 */
#ifndef K3_MODEL_SAFETENSORS_H
#define K3_MODEL_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "model/model.h"

struct k3_st_entry {
	char *name;                 /* owned, NUL-terminated */
	enum k3_dtype dtype;
	uint32_t ndim;
	uint64_t shape[K3_TENSOR_MAX_DIMS];
	uint64_t nelem;
	uint64_t nbytes;
	uint64_t begin, end;        /* payload [begin, end) within the data section */
};

struct k3_st_header {
	struct k3_st_entry *v;      /* owned; in header order */
	size_t n;
};

/* Reads the 8-byte length prefix at p (avail bytes readable) of a file of
 * file_size bytes. On success *header_len is N and 8 + N <= file_size.
 * -EINVAL with a message for a short file, N > K3_ST_HEADER_MAX, N == 0 or
 * N running past the end of the file. what names the file in messages. */
int k3_st_parse_prefix(const uint8_t *p, size_t avail, uint64_t file_size,
		       const char *what, uint64_t *header_len, struct k3_err *err);

/* Parses the JSON header (len bytes, not NUL-terminated) for a data section
 * of data_len bytes. On success *out owns the entries (release with
 * k3_st_header_release). Returns 0 or -EINVAL / -ENOMEM, message prefixed
 * by what. */
int k3_st_parse_header(const char *json, size_t len, uint64_t data_len,
		       const char *what, struct k3_st_header *out,
		       struct k3_err *err);

/* NULL-safe; leaves *h empty. */
void k3_st_header_release(struct k3_st_header *h);

struct k3_st_index_entry {
	char *name;                 /* owned tensor name */
	uint32_t shard;             /* index into k3_st_index.shards */
};

struct k3_st_index {
	char **shards;              /* owned distinct shard file names, in first-seen order */
	uint32_t n_shards;
	struct k3_st_index_entry *v;  /* owned, sorted by name */
	size_t n;
	uint64_t total_size;        /* metadata.total_size, 0 if absent */
};

/* Parses model.safetensors.index.json (len bytes). Shard names must be
 * plain file names (no '/', not "." or "..", no NUL, at most 255 bytes);
 * at most K3_MODEL_MAX_SHARDS distinct shards and K3_MODEL_MAX_TENSORS
 * entries. Returns 0 or -EINVAL / -ENOMEM. */
int k3_st_parse_index(const char *json, size_t len, struct k3_st_index *out,
		      struct k3_err *err);

/* NULL-safe; leaves *x empty. */
void k3_st_index_release(struct k3_st_index *x);

#endif

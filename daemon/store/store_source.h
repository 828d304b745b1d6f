/*
 * store_source.h - where each routed expert's bytes live on disk.
 *
 * An expert is six arrays (docs/model.md §2.6, §9): w1/w2/w3 `weight_packed`
 * (uint8, two E2M1 codes per byte) and `weight_scale` (uint8 E8M0). A source
 * maps (layer, expert) to six extents (file, byte offset, byte length). From
 * safetensors shards each array is its own extent; from a pack (store_pack.h)
 * the six extents lie inside one 4 KiB-aligned span and are read with one
 * pread. The store (store.h) never looks at the bytes; it copies them into
 * RAM slots and hands the engine one pointer per array.
 *
 * Files are opened once here. Expert payloads are always read with pread
 * (never mmap): with O_DIRECT where the file system allows it (probed with
 * one aligned read), otherwise buffered with posix_fadvise(RANDOM) so the
 * kernel does not waste the page cache on read-ahead.
 */
#ifndef K3_STORE_SOURCE_H
#define K3_STORE_SOURCE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#include "base/err.h"

/* The six arrays of one expert, in this fixed order everywhere in the store
 * (pack directory, slot views). Never renumber. */
enum k3_store_array {
	K3_STORE_W1_PACKED = 0,   /* [3072, 1792] on K3 */
	K3_STORE_W1_SCALE = 1,    /* [3072, 112] */
	K3_STORE_W2_PACKED = 2,   /* [3584, 1536] */
	K3_STORE_W2_SCALE = 3,    /* [3584, 96] */
	K3_STORE_W3_PACKED = 4,   /* [3072, 1792] */
	K3_STORE_W3_SCALE = 5,    /* [3072, 112] */
	K3_STORE_ARRAYS = 6,
};

/* Bounds on what a source (or a pack directory read from disk) may hold,
 * checked before allocating. K3 has 93 layers x 896 experts. */
enum {
	K3_STORE_MAX_FILES = 4096,
	K3_STORE_MAX_LAYERS = 1024,
	K3_STORE_MAX_EXPERTS_PER_LAYER = 65536,
	K3_STORE_MAX_EXPERTS = 1 << 20,
	K3_STORE_ALIGN = 4096,        /* slot, span and O_DIRECT alignment, bytes */
	/* Drives holding copies of the experts (docs/drives.md): drive 0 is
	 * the model directory's (packs or shards), each --expert-dir one
	 * more. */
	K3_STORE_MAX_DRIVES = 4,
};
/* One array may not exceed 1 GiB (a K3 array is 5.5 MB). */
#define K3_STORE_MAX_ARRAY_BYTES ((uint64_t)1 << 30)

/* How files are opened for expert reads. */
enum k3_store_direct {
	K3_STORE_DIRECT_AUTO = 0, /* O_DIRECT if the probe read works, else buffered */
	K3_STORE_DIRECT_OFF = 1,  /* always buffered + posix_fadvise(RANDOM) */
	K3_STORE_DIRECT_ON = 2,   /* O_DIRECT or fail (tests, benchmarks) */
};

/* "auto", "on", "off". */
const char *k3_store_direct_name(enum k3_store_direct d);
/* Parses "auto", "on" or "off". Returns 0 or -EINVAL (message names the
 * choices). */
int k3_store_direct_parse(const char *s, enum k3_store_direct *out, struct k3_err *err);

struct k3_store_extent {
	uint32_t file;     /* index returned by k3_store_source_add_file */
	uint64_t offset;   /* absolute byte offset in that file */
	uint64_t length;   /* bytes, 1 .. K3_STORE_MAX_ARRAY_BYTES */
};

struct k3_store_expert {
	uint32_t layer;    /* 0-based model layer */
	uint32_t expert;   /* 0-based routed expert id within the layer */
	struct k3_store_extent ext[K3_STORE_ARRAYS];   /* by enum k3_store_array */
};

struct k3_store_source;

/* Creates an empty source whose files will be opened in `direct` mode.
 * Returns NULL on allocation failure. */
struct k3_store_source *k3_store_source_new(enum k3_store_direct direct);

/* Closes every file. Accepts NULL. The source must outlive any store made
 * from it. */
void k3_store_source_free(struct k3_store_source *src);

/* Opens `path` read-only for expert reads and returns its index in *file.
 * Refuses non-regular files. Chooses O_DIRECT or buffered as described
 * above. Returns 0, -EMFILE past K3_STORE_MAX_FILES, -EMEDIUMTYPE when
 * DIRECT_ON was asked and the file system refuses O_DIRECT (the message
 * names the file, what failed and the alternatives), or the open/read
 * errno. The file is on drive 0. */
int k3_store_source_add_file(struct k3_store_source *src, const char *path,
			     uint32_t *file, struct k3_err *err);
/* The same for a file on drive `drive` (< K3_STORE_MAX_DRIVES, else
 * -EINVAL): the reads of its bytes go to that drive's readers. */
int k3_store_source_add_file_on(struct k3_store_source *src, const char *path, uint32_t drive,
				uint32_t *file, struct k3_err *err);

/* Registers one expert. Every extent must name an added file and lie inside
 * it (checked against the file size), all of one drive. Returns 0, -EEXIST
 * for a (layer, expert) added twice, -ERANGE/-EINVAL for bad bounds. This
 * is the expert's copy 0. */
int k3_store_source_add_expert(struct k3_store_source *src,
			       const struct k3_store_expert *e,
			       struct k3_err *err);

/* Registers another location of the bytes of an expert already added
 * (a copy of the packs on another drive): its extents are checked as
 * add_expert's, must all be on one drive that holds no copy of the expert
 * yet, and each array must have the primary's length (a copy holds the
 * same bytes; k3ctl pack verifies them, not this). It becomes the next
 * copy number. Returns 0, -ENOENT (no such expert), -EEXIST (that drive
 * has a copy), -EINVAL / -ERANGE (bad extents), -ENOMEM. */
int k3_store_source_add_copy(struct k3_store_source *src, const struct k3_store_expert *e,
			     struct k3_err *err);
/* Locations of expert index i (1 + its copies), and the drive of copy c
 * (0 <= c < copies; UINT32_MAX for another c). */
unsigned k3_store_source_copies(const struct k3_store_source *src, size_t i);
uint32_t k3_store_source_copy_drive(const struct k3_store_source *src, size_t i, unsigned c);
/* 1 + the largest drive of any file (1 for an empty source). */
uint32_t k3_store_source_drive_count(const struct k3_store_source *src);
uint32_t k3_store_source_file_drive(const struct k3_store_source *src, uint32_t file);

/* Number of experts registered; index i in [0, n) for source_expert(). */
size_t k3_store_source_count(const struct k3_store_source *src);
const struct k3_store_expert *k3_store_source_expert(const struct k3_store_source *src,
						     size_t i);

/* qsort_r comparator over expert indices (size_t elements) of the source
 * passed as ctx: by layer, then expert number. Indices must be < count. */
int k3_store_source_cmp_index(const void *a, const void *b, void *ctx);

/* Index of (layer, expert) in the source, or -1 when unknown. O(1). */
int64_t k3_store_source_find(const struct k3_store_source *src,
			     uint32_t layer, uint32_t expert);

size_t k3_store_source_file_count(const struct k3_store_source *src);
/* True when file i is read with O_DIRECT (for the caller to log). */
bool k3_store_source_file_direct(const struct k3_store_source *src, uint32_t file);
const char *k3_store_source_file_path(const struct k3_store_source *src, uint32_t file);
/* fstat of the descriptor file i is read through, now: the identity of the
 * bytes the source reads, whatever its path names meanwhile (store_pack.h
 * records it). Returns 0, -ERANGE for an unknown file, or fstat's errno. */
int k3_store_source_file_stat(const struct k3_store_source *src, uint32_t file,
			      struct stat *st);

/* ---- read planning (used by store.c and the benchmark) ---- */

/* One pread: `length` bytes of `file` at `offset` land at `slot_offset`
 * inside the slot. With O_DIRECT all three are multiples of K3_STORE_ALIGN
 * (the read may cover a few bytes beyond the arrays). */
struct k3_store_read {
	uint32_t file;
	uint64_t offset;
	uint64_t length;
	uint64_t slot_offset;
};

/* A plan: the reads for one expert and where each array ends up. */
struct k3_store_plan {
	unsigned n_reads;                          /* 1 .. K3_STORE_ARRAYS */
	struct k3_store_read read[K3_STORE_ARRAYS];
	uint64_t array_offset[K3_STORE_ARRAYS];    /* in the slot, bytes */
	uint64_t array_length[K3_STORE_ARRAYS];
	uint64_t slot_bytes;                       /* bytes of slot this plan needs */
	uint64_t useful_bytes;                     /* sum of array lengths */
};

/* Plans the reads of expert index i: extents of one file that are adjacent
 * or separated by less than K3_STORE_ALIGN bytes are merged into one read
 * (a pack span is one read; the tensors of one expert in a shard usually
 * are too). Each read is placed at a slot offset congruent to its file
 * offset modulo K3_STORE_ALIGN, so O_DIRECT can read the aligned superset
 * in place. Pure; never fails for a registered expert. */
void k3_store_source_plan(const struct k3_store_source *src, size_t i,
			  struct k3_store_plan *plan);
/* The same for copy c of expert i (c = 0: k3_store_source_plan; c must be
 * below k3_store_source_copies). */
void k3_store_source_plan_copy(const struct k3_store_source *src, size_t i, unsigned c,
			       struct k3_store_plan *plan);

/* The planning of k3_store_source_plan for any n extents (the spine
 * loader plans a layer's tensors with it): sorts them by (file, offset)
 * (order[n] is scratch), merges neighbours of one file closer than
 * K3_STORE_ALIGN into one read, and places each read at a slot offset
 * congruent to its file offset modulo K3_STORE_ALIGN, each on its own
 * aligned range. Fills rd[0..*n_rd) (at most n reads) and offset[i] :=
 * where extent i lands in the slot; returns the slot bytes the reads need
 * (a multiple of K3_STORE_ALIGN). Pure. */
uint64_t k3_store_plan_extents(const struct k3_store_extent *x, unsigned n, unsigned *order,
			       struct k3_store_read *rd, unsigned *n_rd, uint64_t *offset);

/* Largest slot_bytes over all experts and their copies (what one cache
 * slot must hold); 0 for an empty source. */
uint64_t k3_store_source_slot_bytes(const struct k3_store_source *src);

/* Reads one planned read into slot (K3_STORE_ALIGN-aligned), retrying short
 * reads and EINTR. Returns the number of bytes read from the device
 * (>= the useful bytes; with O_DIRECT the aligned length) or a negative
 * errno (-EIO for unexpected end of file). Thread-safe (pread). */
int64_t k3_store_source_pread(const struct k3_store_source *src,
			      const struct k3_store_read *rd, uint8_t *slot);

#endif

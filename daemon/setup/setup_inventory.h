/*
 * setup_inventory.h - what to fetch: a pinned description of one model
 * release (repository, immutable revision, every file with its size and
 * SHA-256), read from a JSON data file (docs/formats.md, "Inventories";
 * the shipped ones are in data/inventories/, never compiled in).
 *
 * A value may be left null in the file: "from the remote listing at that
 * revision on first use". k3ctl setup then reads the repository's file
 * listing (the Hugging Face tree API at the pinned revision), fills the
 * gap from it and pins the completed inventory beside the install. A value
 * that is pinned and disagrees with the listing, or a downloaded file that
 * disagrees with the inventory, is a manifest mismatch: fatal, never
 * "fixed" by trusting the remote side.
 *
 * Bounds (checked before allocating): the file is at most 16 MiB, at most
 * 4096 files, names 1..255 bytes of [A-Za-z0-9._-] (never "." or "..",
 * never our own ".k3-*" / "*.partial" names), sizes below 2^50, URLs
 * https:// only and at most 2048 bytes.
 */
#ifndef K3_SETUP_INVENTORY_H
#define K3_SETUP_INVENTORY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"

enum {
	K3_SETUP_INVENTORY_VERSION = 1,
	K3_SETUP_MAX_FILES = 4096,
	K3_SETUP_NAME_MAX = 255,            /* bytes of a file name */
	K3_SETUP_URL_MAX = 2048,            /* bytes of a URL */
	K3_SETUP_MAX_ALLOW_HOSTS = 32,
	K3_SETUP_HOST_MAX = 253,
};
#define K3_SETUP_INVENTORY_MAX_BYTES ((size_t)16 << 20)
#define K3_SETUP_MAX_FILE_BYTES ((uint64_t)1 << 50)
/* Where an install keeps its own files: the pinned inventory, the state,
 * the expert map. Never a model file name. */
#define K3_SETUP_DIR ".k3-setup"
/* The optional per-expert SHA-256 table (setup_experts.h) by convention. */
#define K3_SETUP_EXPERT_TABLE_NAME "k3-expert-sha256.txt"

struct k3_setup_file {
	char *path;               /* a plain file name inside the model directory */
	uint64_t size;            /* bytes; valid when size_known */
	bool size_known;
	uint8_t sha256[32];       /* valid when sha_known */
	bool sha_known;
	/* A safetensors file: the bytes a streaming install fetches up front
	 * (8 + header + every tensor that is not a routed expert's); valid
	 * when spine_known. For a file without experts it equals size. */
	uint64_t spine_bytes;
	bool spine_known;
};

struct k3_setup_inventory {
	char *name;               /* directory name under the model root, e.g. "kimi-k3" */
	char *repository;         /* e.g. "moonshotai/Kimi-K3" */
	char *revision;           /* immutable commit id */
	char *base_url;           /* file i is base_url + path; NULL when not given */
	char *listing_url;        /* the remote listing at revision; NULL when not given */
	char *expert_table;       /* name of a file in files[] holding per-expert SHA-256s, or NULL */
	char **allow_hosts;       /* hosts redirects may go to ("*.x" = any subdomain of x) */
	size_t n_allow_hosts;
	struct k3_setup_file *files;   /* sorted by path, unique */
	size_t n_files;
};

/* Parses an inventory document (len bytes). Unknown keys, wrong types,
 * duplicate names, a bad name, URL or hash, or a size out of bounds are
 * refused with -EINVAL and a message naming the field ("files[3].sha256:
 * ..."). *out is owned by the caller (k3_setup_inventory_free). */
int k3_setup_inventory_parse(const char *json, size_t len, struct k3_setup_inventory **out,
			     struct k3_err *err);
/* Reads and parses `path` (a regular file of at most 16 MiB). Also -ENOENT,
 * -EFBIG and the open/read errno. */
int k3_setup_inventory_load(const char *path, struct k3_setup_inventory **out,
			    struct k3_err *err);
void k3_setup_inventory_free(struct k3_setup_inventory *inv);

/* The document for inv (unknown values as null), indented, ending in a
 * newline; malloc'd, NULL when out of memory. Parsing it gives inv back. */
char *k3_setup_inventory_dump(const struct k3_setup_inventory *inv);

/* File named path, or NULL. */
const struct k3_setup_file *k3_setup_inventory_find(const struct k3_setup_inventory *inv,
						    const char *path);
/* The first file without a size or a SHA-256, or NULL when every value is
 * pinned. */
const struct k3_setup_file *k3_setup_inventory_incomplete(const struct k3_setup_inventory *inv);
/* Sum of the known sizes, bytes. */
uint64_t k3_setup_inventory_bytes(const struct k3_setup_inventory *inv);

/* True for a name a file of an inventory may have (see the bounds above). */
bool k3_setup_name_ok(const char *name);

/* Applies one page of a Hugging Face tree listing (a JSON array of
 * {"type","path","size","lfs":{"oid","size"}} objects) to inv: a file of
 * inv with an unknown size or SHA-256 takes it from its entry (the LFS oid
 * is the SHA-256); a pinned value that differs from the entry is refused
 * with -EBADMSG ("manifest mismatch: ..."). Entries for files inv does not
 * list are ignored. seen[i] is set for each file of inv the page lists.
 * Returns 0, -EINVAL for a malformed page, -EBADMSG. */
int k3_setup_inventory_apply_listing(struct k3_setup_inventory *inv, const char *json,
				     size_t len, bool *seen, struct k3_err *err);

/* Compares two inventories of the same release: same repository and
 * revision and, for every file of `pinned` with a known value, the same
 * value in `local`, and the same file list. Returns 0 or -EBADMSG naming
 * the first difference. */
int k3_setup_inventory_agree(const struct k3_setup_inventory *pinned,
			     const struct k3_setup_inventory *local, struct k3_err *err);

/* Options of k3_setup_inventory_scan. */
struct k3_setup_scan_opts {
	const char *name;         /* NULL: the directory's base name */
	const char *repository;   /* NULL: "local" */
	const char *revision;     /* NULL: "local" */
	const char *base_url;     /* NULL: none */
};

/* Describes the model directory dir: every regular file at its top level
 * whose name an inventory allows (hidden files, directories and partial
 * downloads are skipped; symbolic links are followed, so a Hugging Face
 * cache snapshot works), each hashed in full; a .safetensors file also gets
 * its spine_bytes from its header. A file named
 * K3_SETUP_EXPERT_TABLE_NAME becomes the expert table. Returns 0 or the
 * errno of the first failure (message names the file). */
int k3_setup_inventory_scan(const char *dir, const struct k3_setup_scan_opts *opts,
			    struct k3_setup_inventory **out, struct k3_err *err);

/* The host part of an https:// URL into host (lower case, without port or
 * user info). Returns 0 or -EINVAL. */
int k3_setup_url_host(const char *url, char *host, size_t size);
/* True when host matches an entry of hosts ("*.x" matches any subdomain of
 * x, not x itself). */
bool k3_setup_host_allowed(const char *host, char *const *hosts, size_t n);

#endif

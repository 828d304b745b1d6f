/*
 * setup_state.h - what an install holds, in MODEL/.k3-setup/state.json:
 * for every file of the inventory that is on disk, its size, its pinned
 * SHA-256, how far it is verified (sparse: a streaming install's shard with
 * its header and spine, experts arriving later; verified: every byte
 * present and hashing to the pinned value) and the file's identity (device,
 * inode, size, mtime) when that was established, so a later run trusts an
 * earlier verification only for the very same file. Also the install's
 * mode and where it streams from (k3d reads them for --fetch-experts).
 *
 * Writers hold the install lock (MODEL/.k3-setup/lock, flock): one k3ctl
 * setup at a time, and k3d's fetcher takes it briefly to record a shard it
 * completed.
 */
#ifndef K3_SETUP_STATE_H
#define K3_SETUP_STATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#include "base/err.h"
#include "setup/setup_inventory.h"

enum k3_setup_have {
	K3_SETUP_HAVE_NONE = 0,
	K3_SETUP_HAVE_SPARSE = 1,     /* header and spine present; experts on demand */
	K3_SETUP_HAVE_VERIFIED = 2,   /* every byte present, SHA-256 checked */
};

struct k3_setup_record {
	char path[K3_SETUP_NAME_MAX + 1];
	uint64_t size;
	uint8_t sha256[32];
	enum k3_setup_have have;
	uint64_t dev, ino;            /* identity when recorded */
	int64_t mtime_ns;
};

struct k3_setup_state {
	char repository[257];
	char revision[129];
	bool stream;                  /* a streaming install (experts on demand) */
	char *base_url;               /* where files came from (malloc'd) or NULL */
	char *cacert;                 /* CA bundle used, absolute path, or NULL */
	struct k3_setup_record *rec;  /* sorted by path */
	size_t n;
};

/* Loads dirfd/.k3-setup/state.json into a new state (an empty one when the
 * file does not exist). Returns 0, -EINVAL for a malformed file (named), or
 * the errno. */
int k3_setup_state_load(int dirfd, struct k3_setup_state **out, struct k3_err *err);
/* Writes it atomically (making .k3-setup when needed). */
int k3_setup_state_save(int dirfd, const struct k3_setup_state *st, struct k3_err *err);
void k3_setup_state_free(struct k3_setup_state *st);

/* Record for path, or NULL. */
struct k3_setup_record *k3_setup_state_find(const struct k3_setup_state *st, const char *path);
/* Adds or updates path's record with the identity of *sb (NULL: none).
 * Returns the record, or NULL when out of memory. */
struct k3_setup_record *k3_setup_state_set(struct k3_setup_state *st, const char *path,
					   uint64_t size, const uint8_t sha[32],
					   enum k3_setup_have have, const struct stat *sb);
/* Replaces a string field (base_url, cacert) with a copy of s (NULL
 * clears). 0 or -ENOMEM. */
int k3_setup_state_set_str(char **field, const char *s);
/* True when *sb is the file the record was made for (device, inode, size,
 * and modification time except for a sparse shard, which experts arriving
 * modify). */
bool k3_setup_record_same_file(const struct k3_setup_record *r, const struct stat *sb);

/* Takes the install lock: MODEL/.k3-setup/lock (created). wait false: a
 * held lock returns -EBUSY at once ("another k3ctl setup is running").
 * *fd gets the descriptor to close to release it. */
int k3_setup_lock(int dirfd, bool wait, int *fd, struct k3_err *err);

/* For packs (issue 20, item 6): the verified SHA-256 of model_dir/name,
 * when the install's state says that file (the same inode, size and mtime
 * as now) was verified against its inventory. Returns 0 and fills out,
 * -ENOENT when it is not known to be verified, or an errno. */
int k3_setup_verified_sha256(const char *model_dir, const char *name, uint8_t out[32]);

#endif

/*
 * setup_install.h - the commands behind `k3ctl setup`, `k3ctl
 * fetch-weights` and `k3ctl warm-expert-cache --fetch`: plan an install
 * (offline), install it (full, or streaming: metadata and spine now,
 * routed experts on demand), fetch parts of a streaming install, and audit
 * an install offline. docs/setup.md describes them for people.
 *
 * The order of a run, so that nothing is written or fetched that a check
 * could have refused first: take the install lock; compare the inventory
 * with the one pinned in the install; plan against the free space (no
 * network, no writes) and refuse when it does not fit; complete unknown
 * inventory values from the remote listing and pin the result; plan again;
 * then transfer, verifying and publishing file by file.
 */
#ifndef K3_SETUP_INSTALL_H
#define K3_SETUP_INSTALL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/err.h"
#include "setup/setup_inventory.h"
#include "setup/setup_progress.h"

struct k3_setup_opts {
	const char *dir;            /* the model directory (root/name) */
	const char *from;           /* mirror base URL (https://...), NULL: the inventory's */
	const char *cacert;         /* CA bundle, NULL: the system's */
	const char *token;          /* bearer token or NULL (never printed) */
	bool stream;                /* metadata and spine now, experts on demand */
	unsigned workers;           /* parallel transfers */
	unsigned idle_timeout_s;
	unsigned retries;           /* retries per transfer after the first attempt */
	unsigned retry_delay_ms;
	uint64_t chunk;             /* resume checkpoint distance, bytes */
	int64_t reserve;            /* bytes that must stay free; < 0: the default */
	enum k3_setup_progress_mode progress;
	FILE *out;                  /* reports (stdout) */
};

/* Fills o with the defaults: 4 workers, 60 s idle timeout, 8 retries from
 * 1 s, 64 MiB chunks, the default reserve, automatic progress, stdout. */
void k3_setup_opts_default(struct k3_setup_opts *o);

struct k3_setup_plan {
	size_t files, files_present, files_to_fetch, files_to_hash, files_size_unknown;
	uint64_t bytes_total;       /* all files (known sizes) */
	uint64_t bytes_present;     /* verified, or present and to be hashed, or in .partial */
	uint64_t bytes_to_fetch;    /* what the network still has to deliver */
	uint64_t peak_bytes;        /* most extra disk space the install will take */
	uint64_t eventual_bytes;    /* streaming: what the disk holds once every expert came */
	uint64_t free_bytes;        /* available to this user where the install goes */
	uint64_t reserve_bytes;     /* must stay free */
	uint64_t fs_bytes;          /* size of that file system */
	bool fits;                  /* free_bytes >= peak_bytes + reserve_bytes */
	bool spine_unknown;         /* streaming: some shard's spine size is not in the inventory */
	char problem[K3_ERR_MSG_MAX];   /* what the install will refuse, or "" */
};

/* Plans installing inv into o->dir: reads only what is on disk (state,
 * partials, sizes) and the file system's free space. Never fetches or
 * writes. Returns 0 (see plan->fits and plan->problem) or an errno. */
int k3_setup_plan_compute(const struct k3_setup_inventory *inv, const struct k3_setup_opts *o,
			  struct k3_setup_plan *plan, struct k3_err *err);
/* Prints the plan for a person, or one JSON object when json. */
void k3_setup_plan_print(const struct k3_setup_plan *plan, const struct k3_setup_inventory *inv,
			 const struct k3_setup_opts *o, bool json, FILE *out);

/* Installs inv into o->dir (see the order above). Returns 0; -ENOSPC (the
 * plan does not fit: nothing was fetched); -EBADMSG (a manifest mismatch);
 * -EBUSY (another setup holds the lock); -ELOOP / -EEXIST (a link or a
 * foreign file at a destination, never replaced); or the first transfer's
 * errno (the rest were still tried). err says what to do. */
int k3_setup_install(const struct k3_setup_inventory *inv, const struct k3_setup_opts *o,
		     struct k3_err *err);

/* What fetch-weights fetches on a streaming install. */
struct k3_setup_fetch_sel {
	bool spine;                 /* headers and spine of every shard */
	bool experts;               /* routed experts of the selected layers */
	const bool *layers;         /* [K3_MODEL_MAX_LAYERS] selection, NULL: all */
	const uint32_t *pairs;      /* or these (layer, expert) pairs: 2 * n_pairs, in order */
	size_t n_pairs;
	size_t limit;               /* with pairs: fetch the first `limit` that are absent (0: all) */
};

/* Fetches parts of the streaming install in o->dir (made by setup
 * --stream) by range requests into its sparse shards, verifies each expert
 * against the per-expert table when the install has one, and each shard's
 * SHA-256 once its last byte has arrived (then the shard counts as
 * verified: every expert in the map becomes "shard-verified"). A shard
 * whose SHA-256 fails is marked for a fresh download (setup does it).
 * *fetched gets the experts fetched (may be NULL). Returns 0, -ENOENT (not
 * a streaming install), or as k3_setup_install. */
int k3_setup_fetch(const struct k3_setup_opts *o, const struct k3_setup_fetch_sel *sel,
		   size_t *fetched, struct k3_err *err);

/* Audits the install in o->dir offline against its pinned inventory (or
 * inv when given): every file present with the pinned size; recorded
 * verifications still valid for the same files (with rehash, or for files
 * without one, every byte is hashed again); a streaming install's experts
 * by state, naming those verified only by TLS so far. Prints a report
 * (JSON when json). Returns 0 when the install is complete and verified
 * (or a consistent streaming install), -EBADMSG / -ENOENT otherwise, or an
 * errno. */
int k3_setup_check(const struct k3_setup_inventory *inv, const struct k3_setup_opts *o,
		   bool rehash, bool json, struct k3_err *err);

#endif

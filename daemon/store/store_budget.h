/*
 * store_budget.h - how many bytes the RAM expert cache may use
 * (docs/architecture.md, "Honest numbers"): derived from min(physical RAM, the
 * cgroup memory limit), never from free memory, and refused below the floor
 * one token needs instead of swapping.
 *
 * Auto budget (--expert-cache-gb auto):
 *
 *   limit    = min(physical RAM, cgroup limit of this process and its ancestors)
 *   headroom = max(2 GiB, limit / 10)      (allocator slack, page tables,
 *                                           the event loop, the kernel's own
 *                                           use of the cgroup: page cache of
 *                                           buffered reads is charged to it)
 *   cache    = limit - spine - state - headroom, rounded down to whole slots
 *
 * floor = floor_slots x slot_bytes, where floor_slots is the number of
 * experts one token pins at once (top-k: 16 on K3).
 */
#ifndef K3_STORE_BUDGET_H
#define K3_STORE_BUDGET_H

#include <stdbool.h>
#include <stdint.h>

#include "base/err.h"

struct k3_store_budget_in {
	uint64_t ram_bytes;         /* physical RAM; 0 = detect (sysconf) */
	uint64_t cgroup_bytes;      /* 0 = detect; UINT64_MAX = no limit */
	uint64_t spine_bytes;       /* resident non-expert weights */
	uint64_t state_bytes;       /* sequence state, activations, buffers */
	uint64_t headroom_bytes;    /* 0 = the default above */
	uint64_t slot_bytes;        /* bytes of one cache slot (> 0) */
	uint32_t floor_slots;       /* experts one token pins at once (> 0) */
	uint64_t requested_bytes;   /* an explicit budget; 0 = auto */
};

struct k3_store_budget_out {
	uint64_t limit_bytes;       /* min(RAM, cgroup) */
	bool limited_by_cgroup;
	uint64_t headroom_bytes;
	uint64_t available_bytes;   /* limit - spine - state - headroom (0 if negative) */
	uint64_t floor_bytes;
	uint64_t cache_bytes;       /* the budget: whole slots, >= floor */
	uint32_t slots;
};

/* Computes the budget. Returns 0, or -ENOMEM when the cache cannot reach the
 * floor (auto: not enough memory after spine, state and headroom; explicit:
 * below the floor, or above what is available, which would swap) with the
 * numbers in err; -EINVAL for zero slot_bytes / floor_slots. */
int k3_store_budget(const struct k3_store_budget_in *in, struct k3_store_budget_out *out,
		    struct k3_err *err);

/* Parses an --expert-cache-gb value: "auto" (*bytes = 0, meaning auto) or
 * a decimal number of gigabytes (10^9 bytes, fractions allowed, > 0 and at
 * most 1e6). Returns 0 or -EINVAL / -ERANGE with the reason in err. */
int k3_store_budget_parse_gb(const char *s, uint64_t *bytes, struct k3_err *err);

/* The memory limit of the cgroup this process runs in: the smallest of
 * memory.max (v2) or memory.limit_in_bytes (v1) over its cgroup and every
 * ancestor. proc_cgroup: normally "/proc/self/cgroup"; cgroup_root:
 * normally "/sys/fs/cgroup". *out = UINT64_MAX when nothing limits.
 * Returns 0 (also when no cgroup file is readable: no limit) or -EINVAL for
 * a malformed limit file. */
int k3_store_budget_cgroup_limit(const char *proc_cgroup, const char *cgroup_root,
				 uint64_t *out, struct k3_err *err);

/* Parses one limit file's text: "max" or a decimal byte count, optional
 * trailing newline. Values >= 2^62 (cgroup v1's "unlimited") map to
 * UINT64_MAX. Returns 0 or -EINVAL. */
int k3_store_budget_parse_limit(const char *text, uint64_t *out);

#endif

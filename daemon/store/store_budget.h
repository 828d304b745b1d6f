/*
 * store_budget.h - where the memory limit comes from and how budgets are
 * spelled: the cgroup limits of this process (v2 memory.max and
 * memory.high, v1 memory.limit_in_bytes) and the parsers of limit files
 * and --expert-cache-gb. The split of the limit between the tiers is the
 * planner's (store_plan.h): limits derive from min(physical RAM, the
 * cgroup), never from free memory (architecture.md, "Honest numbers").
 */
#ifndef K3_STORE_BUDGET_H
#define K3_STORE_BUDGET_H

#include <stdbool.h>
#include <stdint.h>

#include "base/err.h"

/* Parses an --expert-cache-gb value: "auto" (*bytes = 0, meaning auto) or
 * a decimal number of gigabytes (10^9 bytes, fractions allowed, > 0 and at
 * most 1e6). Returns 0 or -EINVAL / -ERANGE with the reason in err. */
int k3_store_budget_parse_gb(const char *s, uint64_t *bytes, struct k3_err *err);

/* The memory limits of the cgroup this process runs in, each the smallest
 * over its cgroup and every ancestor: max_bytes from memory.max (v2) or
 * memory.limit_in_bytes (v1), high_bytes from memory.high (v2 only: where
 * the kernel starts throttling and reclaiming). proc_cgroup: normally
 * "/proc/self/cgroup"; cgroup_root: normally "/sys/fs/cgroup". UINT64_MAX
 * where nothing limits. Returns 0 (also when no cgroup file is readable:
 * no limit) or -EINVAL for a malformed limit file. */
struct k3_store_budget_cgroup {
	uint64_t max_bytes;
	uint64_t high_bytes;
};
int k3_store_budget_cgroup_limits(const char *proc_cgroup, const char *cgroup_root,
				  struct k3_store_budget_cgroup *out, struct k3_err *err);

/* Parses one limit file's text: "max" or a decimal byte count, optional
 * trailing newline. Values >= 2^62 (cgroup v1's "unlimited") map to
 * UINT64_MAX. Returns 0 or -EINVAL. */
int k3_store_budget_parse_limit(const char *text, uint64_t *out);

#endif

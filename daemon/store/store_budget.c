/* store_budget.c - the RAM expert cache budget (see store_budget.h). */
#include "store/store_budget.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/parse.h"

#define GIB ((uint64_t)1 << 30)

int k3_store_budget_parse_limit(const char *text, uint64_t *out)
{
	char buf[64];
	size_t n = strlen(text);

	if (n > 0 && text[n - 1] == '\n')
		n--;
	if (n == 0 || n >= sizeof(buf))
		return -EINVAL;
	memcpy(buf, text, n);
	buf[n] = '\0';
	if (strcmp(buf, "max") == 0) {
		*out = UINT64_MAX;
		return 0;
	}
	if (k3_parse_u64(buf, 0, UINT64_MAX, out, NULL) != 0)
		return -EINVAL;
	/* cgroup v1 says "unlimited" with PAGE_COUNTER_MAX pages in bytes. */
	if (*out >= ((uint64_t)1 << 62))
		*out = UINT64_MAX;
	return 0;
}

int k3_store_budget_parse_gb(const char *s, uint64_t *bytes, struct k3_err *err)
{
	double gb;
	int rc;

	if (strcmp(s, "auto") == 0) {
		*bytes = 0;
		return 0;
	}
	rc = k3_parse_double(s, 0.0, 1e6, &gb, err);
	if (rc)
		return k3_err_prefix(err, "--expert-cache-gb");
	if (!(gb > 0.0))
		return k3_err_set(err, -ERANGE, "--expert-cache-gb must be 'auto' or above 0");
	*bytes = (uint64_t)(gb * 1e9);
	return 0;
}

/* Reads dir/file as a limit; returns 0 and leaves *out alone when absent. */
static int read_limit(const char *dir, const char *file, uint64_t *out, struct k3_err *err)
{
	char path[PATH_MAX], text[64];
	uint64_t v;
	FILE *f;
	size_t n;

	if (snprintf(path, sizeof(path), "%s/%s", dir, file) >= (int)sizeof(path))
		return 0;
	f = fopen(path, "re");
	if (!f)
		return 0;
	n = fread(text, 1, sizeof(text) - 1, f);
	fclose(f);
	text[n] = '\0';
	if (k3_store_budget_parse_limit(text, &v) != 0)
		return k3_err_set(err, -EINVAL, "'%s' holds '%s', not a memory limit", path, text);
	if (v < *out)
		*out = v;
	return 0;
}

/* min over dir and its ancestors up to root (the hierarchy mount). */
static int walk_up(const char *root, const char *rel, const char *file, uint64_t *out,
		   struct k3_err *err)
{
	char path[PATH_MAX];
	size_t rootlen = strlen(root);
	int rc;

	if (snprintf(path, sizeof(path), "%s%s", root, rel) >= (int)sizeof(path))
		return 0;
	for (;;) {
		size_t n = strlen(path);
		while (n > rootlen && path[n - 1] == '/')
			path[--n] = '\0';
		rc = read_limit(path, file, out, err);
		if (rc)
			return rc;
		if (n <= rootlen)
			return 0;
		char *slash = strrchr(path + rootlen, '/');
		if (!slash)
			path[rootlen] = '\0';
		else
			*slash = '\0';
	}
}

int k3_store_budget_cgroup_limit(const char *proc_cgroup, const char *cgroup_root,
				 uint64_t *out, struct k3_err *err)
{
	char line[PATH_MAX + 64], root[PATH_MAX];
	FILE *f = fopen(proc_cgroup, "re");
	int rc = 0;

	*out = UINT64_MAX;
	if (!f)
		return 0;
	while (rc == 0 && fgets(line, sizeof(line), f)) {
		char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
		char *nl = strchr(line, '\n');
		if (!c2)
			continue;
		if (nl)
			*nl = '\0';
		*c1 = '\0';
		*c2 = '\0';
		const char *ctrl = c1 + 1, *rel = c2 + 1;
		if (strcmp(line, "0") == 0 && *ctrl == '\0') {
			/* cgroup v2: unified hierarchy at the root. */
			rc = walk_up(cgroup_root, rel, "memory.max", out, err);
		} else {
			/* cgroup v1: the memory controller's own hierarchy. */
			bool mem = false;
			for (const char *p = ctrl; *p;) {
				size_t n = strcspn(p, ",");
				mem |= n == 6 && strncmp(p, "memory", 6) == 0;
				p += n + (p[n] == ',');
			}
			if (!mem || snprintf(root, sizeof(root), "%s/memory", cgroup_root) >=
					    (int)sizeof(root))
				continue;
			rc = walk_up(root, rel, "memory.limit_in_bytes", out, err);
		}
	}
	fclose(f);
	return rc;
}

int k3_store_budget(const struct k3_store_budget_in *in, struct k3_store_budget_out *out,
		    struct k3_err *err)
{
	uint64_t ram = in->ram_bytes, cg = in->cgroup_bytes, used, avail, cache;
	int rc;

	memset(out, 0, sizeof(*out));
	if (in->slot_bytes == 0 || in->floor_slots == 0)
		return k3_err_set(err, -EINVAL, "slot size and floor must be positive");
	if (ram == 0) {
		long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
		if (pages <= 0 || page <= 0)
			return k3_err_set(err, -EINVAL, "cannot read the physical memory size");
		ram = (uint64_t)pages * (uint64_t)page;
	}
	if (cg == 0) {
		rc = k3_store_budget_cgroup_limit("/proc/self/cgroup", "/sys/fs/cgroup", &cg, err);
		if (rc)
			return rc;
	}
	out->limited_by_cgroup = cg < ram;
	out->limit_bytes = cg < ram ? cg : ram;
	out->headroom_bytes = in->headroom_bytes ? in->headroom_bytes
						 : out->limit_bytes / 10 > 2 * GIB
						   ? out->limit_bytes / 10 : 2 * GIB;
	if (in->floor_slots > UINT64_MAX / in->slot_bytes)
		return k3_err_set(err, -EINVAL, "floor overflows");
	out->floor_bytes = (uint64_t)in->floor_slots * in->slot_bytes;
	used = in->spine_bytes;
	if (__builtin_add_overflow(used, in->state_bytes, &used) ||
	    __builtin_add_overflow(used, out->headroom_bytes, &used))
		used = UINT64_MAX;
	avail = out->limit_bytes > used ? out->limit_bytes - used : 0;
	out->available_bytes = avail;

	if (in->requested_bytes) {
		if (in->requested_bytes < out->floor_bytes)
			return k3_err_set(err, -ENOMEM, "expert cache of %" PRIu64 " bytes is below"
					  " the floor of %" PRIu64 " bytes: one token pins %" PRIu32
					  " experts of %" PRIu64 " bytes", in->requested_bytes,
					  out->floor_bytes, in->floor_slots, in->slot_bytes);
		if (in->requested_bytes > avail)
			return k3_err_set(err, -ENOMEM, "expert cache of %" PRIu64 " bytes does not"
					  " fit: the memory limit is %" PRIu64 " bytes (%s), minus"
					  " %" PRIu64 " spine, %" PRIu64 " state and %" PRIu64
					  " headroom leaves %" PRIu64, in->requested_bytes,
					  out->limit_bytes, out->limited_by_cgroup ? "cgroup" : "RAM",
					  in->spine_bytes, in->state_bytes, out->headroom_bytes, avail);
		cache = in->requested_bytes;
	} else {
		if (avail < out->floor_bytes)
			return k3_err_set(err, -ENOMEM, "not enough memory for the expert cache:"
					  " the memory limit is %" PRIu64 " bytes (%s), minus %" PRIu64
					  " spine, %" PRIu64 " state and %" PRIu64 " headroom leaves %"
					  PRIu64 ", below the floor of %" PRIu64 " bytes (%" PRIu32
					  " experts of %" PRIu64 " bytes that one token pins)",
					  out->limit_bytes, out->limited_by_cgroup ? "cgroup" : "RAM",
					  in->spine_bytes, in->state_bytes, out->headroom_bytes, avail,
					  out->floor_bytes, in->floor_slots, in->slot_bytes);
		cache = avail;
	}
	out->slots = (uint32_t)(cache / in->slot_bytes > UINT32_MAX ? UINT32_MAX
								   : cache / in->slot_bytes);
	out->cache_bytes = (uint64_t)out->slots * in->slot_bytes;
	return 0;
}

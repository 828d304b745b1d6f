/* store_budget.c - cgroup memory limits and budget spellings (see
 * store_budget.h). */
#include "store/store_budget.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "base/parse.h"

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

int k3_store_budget_cgroup_limits(const char *proc_cgroup, const char *cgroup_root,
				  struct k3_store_budget_cgroup *out, struct k3_err *err)
{
	char line[PATH_MAX + 64], root[PATH_MAX];
	FILE *f = fopen(proc_cgroup, "re");
	int rc = 0;

	out->max_bytes = out->high_bytes = UINT64_MAX;
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
			rc = walk_up(cgroup_root, rel, "memory.max", &out->max_bytes, err);
			if (rc == 0)
				rc = walk_up(cgroup_root, rel, "memory.high", &out->high_bytes, err);
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
			rc = walk_up(root, rel, "memory.limit_in_bytes", &out->max_bytes, err);
		}
	}
	fclose(f);
	return rc;
}

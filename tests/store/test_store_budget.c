/* Where the memory limit comes from: cgroup v1 and v2 limit discovery
 * (memory.max, memory.high, memory.limit_in_bytes), limit files and
 * --expert-cache-gb spellings. The split itself: test_store_plan.c. */
#include "t.h"

#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

#include "store/store_budget.h"

#define GIB ((uint64_t)1 << 30)

static char dir[256];

static void put(const char *rel, const char *text)
{
	char path[600];
	snprintf(path, sizeof(path), "%s/%s", dir, rel);
	FILE *f = fopen(path, "w");
	T_OK(f != NULL);
	if (f) {
		fputs(text, f);
		fclose(f);
	}
}

/* mkdir -p below dir: each level of rel is made (the last one must be new). */
static void mk(const char *rel)
{
	char path[600];
	int n = snprintf(path, sizeof(path), "%s/%s", dir, rel);
	for (int i = (int)strlen(dir) + 1; i < n; i++)
		if (path[i] == '/') {
			path[i] = '\0';
			(void)mkdir(path, 0700);
			path[i] = '/';
		}
	T_EQ_INT(mkdir(path, 0700), 0);
}

static char proc[600], root[600];   /* the fake /proc/self/cgroup and cgroup root */

/* The cgroup files as they are now give these limits (bytes). */
static void expect_limits(uint64_t max_bytes, uint64_t high_bytes)
{
	struct k3_store_budget_cgroup cg;
	struct k3_err err = { 0 };

	T_EQ_INT(k3_store_budget_cgroup_limits(proc, root, &cg, &err), 0);
	T_EQ_U64(cg.max_bytes, max_bytes);
	T_EQ_U64(cg.high_bytes, high_bytes);
}

int main(void)
{
	struct k3_store_budget_cgroup cg;
	struct k3_err err = { 0 };
	uint64_t v;

	/* --expert-cache-gb values. */
	T_EQ_INT(k3_store_budget_parse_gb("auto", &v, &err), 0);
	T_EQ_U64(v, 0);
	T_EQ_INT(k3_store_budget_parse_gb("96", &v, &err), 0);
	T_EQ_U64(v, 96000000000ull);
	T_EQ_INT(k3_store_budget_parse_gb("0.5", &v, &err), 0);
	T_EQ_U64(v, 500000000ull);
	T_OK(k3_store_budget_parse_gb("0", &v, &err) < 0);
	T_OK(k3_store_budget_parse_gb("-3", &v, &err) < 0);
	T_OK(k3_store_budget_parse_gb("12GB", &v, &err) < 0);
	T_OK(k3_store_budget_parse_gb("", &v, &err) < 0);
	T_OK(k3_store_budget_parse_gb("1e7", &v, &err) < 0);

	/* Limit files. */
	T_EQ_INT(k3_store_budget_parse_limit("max\n", &v), 0);
	T_EQ_U64(v, UINT64_MAX);
	T_EQ_INT(k3_store_budget_parse_limit("1073741824\n", &v), 0);
	T_EQ_U64(v, GIB);
	T_EQ_INT(k3_store_budget_parse_limit("9223372036854771712\n", &v), 0);
	T_EQ_U64(v, UINT64_MAX);
	T_EQ_INT(k3_store_budget_parse_limit("12k", &v), -EINVAL);
	T_EQ_INT(k3_store_budget_parse_limit("", &v), -EINVAL);
	T_EQ_INT(k3_store_budget_parse_limit("-1", &v), -EINVAL);

	if (!t_tempdir(dir, sizeof(dir), "k3budget"))
		return t_skip("no temp dir");
	snprintf(proc, sizeof(proc), "%s/cgroup", dir);
	snprintf(root, sizeof(root), "%s/fs", dir);

	/* v2: the smallest memory.max along the path counts. */
	mk("fs/a/b");
	put("fs/a/memory.max", "8589934592\n");
	put("fs/a/b/memory.max", "max\n");
	put("cgroup", "0::/a/b\n");
	expect_limits(8 * GIB, UINT64_MAX);
	put("fs/a/b/memory.max", "4294967296\n");
	expect_limits(4 * GIB, UINT64_MAX);
	/* memory.high: its own smallest value along the path (the kernel
	 * throttles there), reported apart from memory.max. */
	put("fs/a/memory.high", "3221225472\n");
	put("fs/a/b/memory.high", "max\n");
	expect_limits(4 * GIB, 3 * GIB);
	put("fs/a/b/memory.high", "1073741824\n");
	expect_limits(4 * GIB, GIB);
	put("fs/a/b/memory.high", "soon\n");
	T_EQ_INT(k3_store_budget_cgroup_limits(proc, root, &cg, &err), -EINVAL);
	put("fs/a/b/memory.high", "max\n");
	put("fs/a/b/memory.max", "lots\n");
	T_EQ_INT(k3_store_budget_cgroup_limits(proc, root, &cg, &err), -EINVAL);

	/* v1: the memory controller's hierarchy; "unlimited" is no limit. */
	mk("fs/memory/job");
	put("fs/memory/memory.limit_in_bytes", "9223372036854771712\n");
	put("fs/memory/job/memory.limit_in_bytes", "2147483648\n");
	put("cgroup", "5:cpu,cpuacct:/\n4:memory:/job\n0::/\n");
	expect_limits(2 * GIB, UINT64_MAX);
	put("cgroup", "4:memory:/gone\n");
	expect_limits(UINT64_MAX, UINT64_MAX);

	/* No cgroup file: no limit. */
	T_EQ_INT(k3_store_budget_cgroup_limits("/nonexistent/cgroup", root, &cg, &err), 0);
	T_EQ_U64(cg.max_bytes, UINT64_MAX);
	T_EQ_U64(cg.high_bytes, UINT64_MAX);

	static const char *const files[] = { "fs/a/b/memory.max", "fs/a/memory.max",
		"fs/a/b/memory.high", "fs/a/memory.high",
		"fs/memory/job/memory.limit_in_bytes", "fs/memory/memory.limit_in_bytes", "cgroup" };
	static const char *const dirs[] = { "fs/a/b", "fs/a", "fs/memory/job", "fs/memory", "fs", "" };
	char path[700];
	for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
		snprintf(path, sizeof(path), "%s/%s", dir, files[i]);
		unlink(path);
	}
	for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++) {
		snprintf(path, sizeof(path), "%s/%s", dir, dirs[i]);
		rmdir(path);
	}
	return t_done();
}

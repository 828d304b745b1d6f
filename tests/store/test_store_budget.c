/* Cache budget: min(RAM, cgroup), spine/state/headroom, the one-token floor
 * (refused with the numbers), cgroup v1 and v2 limit discovery. */
#include "t.h"

#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

#include "store/store_budget.h"

#define GIB ((uint64_t)1 << 30)
#define EXPERT 17547264ull

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

static void mk(const char *rel)
{
	char path[600];
	snprintf(path, sizeof(path), "%s/%s", dir, rel);
	T_EQ_INT(mkdir(path, 0700), 0);
}

/* The cgroup memory limit read through proc and root (fake /proc/self and
 * cgroup file systems) is want. */
static void want_limit(const char *proc, const char *root, uint64_t want)
{
	struct k3_err err = { 0 };
	uint64_t v = 0;

	T_EQ_INT(k3_store_budget_cgroup_limit(proc, root, &v, &err), 0);
	T_EQ_U64(v, want);
}

int main(void)
{
	struct k3_store_budget_in in = {
		.ram_bytes = 128 * GIB, .cgroup_bytes = UINT64_MAX, .spine_bytes = 20 * GIB,
		.state_bytes = 4 * GIB, .slot_bytes = EXPERT, .floor_slots = 16,
	};
	struct k3_store_budget_out out;
	struct k3_err err = { 0 };
	uint64_t v;

	/* 128 GiB RAM: headroom 12.8 GiB; cache = 128 - 20 - 4 - 12.8 GiB, whole slots. */
	T_EQ_INT(k3_store_budget(&in, &out, &err), 0);
	T_EQ_U64(out.limit_bytes, 128 * GIB);
	T_OK(!out.limited_by_cgroup);
	T_EQ_U64(out.headroom_bytes, 128 * GIB / 10);
	T_EQ_U64(out.available_bytes, 128 * GIB - 24 * GIB - 128 * GIB / 10);
	T_EQ_U64(out.slots, out.available_bytes / EXPERT);
	T_EQ_U64(out.cache_bytes, (uint64_t)out.slots * EXPERT);
	T_EQ_U64(out.floor_bytes, 16 * EXPERT);

	/* A cgroup limit below RAM wins; the small-machine headroom is 2 GiB. */
	in.cgroup_bytes = 16 * GIB;
	in.spine_bytes = 6 * GIB;
	T_EQ_INT(k3_store_budget(&in, &out, &err), 0);
	T_OK(out.limited_by_cgroup);
	T_EQ_U64(out.headroom_bytes, 2 * GIB);
	T_EQ_U64(out.available_bytes, 16 * GIB - 6 * GIB - 4 * GIB - 2 * GIB);

	/* Below the floor: refused, saying why. */
	in.spine_bytes = 13 * GIB;
	T_EQ_INT(k3_store_budget(&in, &out, &err), -ENOMEM);
	T_OK(strstr(err.msg, "below the floor of 280756224 bytes") != NULL);
	T_OK(strstr(err.msg, "cgroup") != NULL);

	/* Explicit budgets: below the floor, or more than fits, are refused. */
	in.spine_bytes = 6 * GIB;
	in.requested_bytes = 15 * EXPERT;
	T_EQ_INT(k3_store_budget(&in, &out, &err), -ENOMEM);
	T_OK(strstr(err.msg, "16 experts") != NULL);
	in.requested_bytes = 5 * GIB;
	T_EQ_INT(k3_store_budget(&in, &out, &err), -ENOMEM);
	T_OK(strstr(err.msg, "does not fit") != NULL);
	in.requested_bytes = 1 * GIB;
	T_EQ_INT(k3_store_budget(&in, &out, &err), 0);
	T_EQ_U64(out.slots, GIB / EXPERT);

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
	char proc[600], root[600];
	snprintf(proc, sizeof(proc), "%s/cgroup", dir);
	snprintf(root, sizeof(root), "%s/fs", dir);

	/* v2: the smallest memory.max along the path counts. */
	mk("fs");
	mk("fs/a");
	mk("fs/a/b");
	put("fs/a/memory.max", "8589934592\n");
	put("fs/a/b/memory.max", "max\n");
	put("cgroup", "0::/a/b\n");
	want_limit(proc, root, 8 * GIB);
	put("fs/a/b/memory.max", "4294967296\n");
	want_limit(proc, root, 4 * GIB);
	put("fs/a/b/memory.max", "lots\n");
	T_EQ_INT(k3_store_budget_cgroup_limit(proc, root, &v, &err), -EINVAL);

	/* v1: the memory controller's hierarchy; "unlimited" is no limit. */
	mk("fs/memory");
	mk("fs/memory/job");
	put("fs/memory/memory.limit_in_bytes", "9223372036854771712\n");
	put("fs/memory/job/memory.limit_in_bytes", "2147483648\n");
	put("cgroup", "5:cpu,cpuacct:/\n4:memory:/job\n0::/\n");
	want_limit(proc, root, 2 * GIB);
	put("cgroup", "4:memory:/gone\n");
	want_limit(proc, root, UINT64_MAX);

	/* No cgroup file: no limit. */
	T_EQ_INT(k3_store_budget_cgroup_limit("/nonexistent/cgroup", root, &v, &err), 0);
	T_EQ_U64(v, UINT64_MAX);

	/* Auto-detection on this machine works and finds some RAM. */
	in = (struct k3_store_budget_in){ .slot_bytes = 4096, .floor_slots = 1 };
	T_EQ_INT(k3_store_budget(&in, &out, &err), 0);
	T_OK(out.limit_bytes > 0);

	static const char *const files[] = { "fs/a/b/memory.max", "fs/a/memory.max",
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

/*
 * t.h - the test harness: header-only checks that print every failure with
 * file:line and the values compared, count them, and turn the count into
 * the exit code (0 pass, 1 fail, 77 skip: meson's exitcode protocol).
 *
 *   int main(void) {
 *       T_EQ_INT(add(2, 2), 4);
 *       return t_done();
 *   }
 *
 * Paths to shared data: t_shared_path("golden/forward/...") resolves
 * against $K3_SHARED (set by tests/meson.build), falling back to the
 * source-relative ../shared.
 */
#ifndef K3_TEST_T_H
#define K3_TEST_T_H

#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int t_checks, t_failures;

static inline bool t_report(bool ok, const char *file, int line, const char *expr)
{
	t_checks++;
	if (!ok) {
		t_failures++;
		printf("FAIL %s:%d: %s\n", file, line, expr);
	}
	return ok;
}

#define T_OK(cond) t_report((cond), __FILE__, __LINE__, #cond)

#define T_EQ_INT(a, b) do { \
	long long t_a_ = (long long)(a), t_b_ = (long long)(b); \
	if (!t_report(t_a_ == t_b_, __FILE__, __LINE__, #a " == " #b)) \
		printf("     got %lld, want %lld\n", t_a_, t_b_); \
} while (0)

#define T_EQ_U64(a, b) do { \
	unsigned long long t_a_ = (unsigned long long)(a), t_b_ = (unsigned long long)(b); \
	if (!t_report(t_a_ == t_b_, __FILE__, __LINE__, #a " == " #b)) \
		printf("     got %llu, want %llu\n", t_a_, t_b_); \
} while (0)

#define T_EQ_STR(a, b) do { \
	const char *t_a_ = (a), *t_b_ = (b); \
	if (!t_report(t_a_ && t_b_ && strcmp(t_a_, t_b_) == 0, __FILE__, __LINE__, #a " == " #b)) \
		printf("     got '%s', want '%s'\n", t_a_ ? t_a_ : "(null)", t_b_ ? t_b_ : "(null)"); \
} while (0)

#define T_EQ_MEM(a, b, n) do { \
	if (!t_report(memcmp((a), (b), (n)) == 0, __FILE__, __LINE__, "memcmp(" #a ", " #b ") == 0")) \
		printf("     %zu bytes differ\n", (size_t)(n)); \
} while (0)

/* |a - b| <= tol */
#define T_NEAR(a, b, tol) do { \
	double t_a_ = (double)(a), t_b_ = (double)(b); \
	if (!t_report(fabs(t_a_ - t_b_) <= (tol), __FILE__, __LINE__, #a " ~= " #b)) \
		printf("     got %.9g, want %.9g (tol %g)\n", t_a_, t_b_, (double)(tol)); \
} while (0)

/* dir/name, in one of four buffers used in turn: up to four such paths
 * may be live at once (one call's arguments, say). */
static inline const char *t_join(const char *dir, const char *name)
{
	static char buf[4][4096];
	static unsigned slot;
	char *out = buf[slot++ & 3];

	snprintf(out, sizeof(buf[0]), "%s/%s", dir, name);
	return out;
}

static inline const char *t_shared_path(const char *rel)
{
	const char *root = getenv("K3_SHARED");

	return t_join(root ? root : "../shared", rel);
}

/* Reads a whole file into a malloc'ed, NUL-terminated buffer (the NUL is
 * not counted in *n). Returns NULL (and *n = 0) when it cannot. */
static inline unsigned char *t_read_file(const char *path, size_t *n)
{
	FILE *f = fopen(path, "rb");
	unsigned char *b;
	long len;

	*n = 0;
	if (!f)
		return NULL;
	if (fseek(f, 0, SEEK_END) != 0 || (len = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
		fclose(f);
		return NULL;
	}
	b = malloc((size_t)len + 1);
	if (b) {
		*n = fread(b, 1, (size_t)len, f);
		b[*n] = 0;
	}
	fclose(f);
	return b;
}

/* Call from main() before returning when a prerequisite is missing. */
static inline int t_skip(const char *why)
{
	printf("SKIP: %s\n", why);
	return 77;
}

/* Makes a fresh directory $TMPDIR/name.XXXXXX (/tmp without TMPDIR) into
 * dir[cap]. Returns false when it cannot. */
static inline bool t_tempdir(char *dir, size_t cap, const char *name)
{
	const char *tmp = getenv("TMPDIR");

	return (size_t)snprintf(dir, cap, "%s/%s.XXXXXX", tmp ? tmp : "/tmp", name) < cap && mkdtemp(dir);
}

static inline int t_done(void)
{
	printf("%d checks, %d failed\n", t_checks, t_failures);
	if (t_checks == 0) {
		printf("FAIL: no checks ran\n");
		return 1;
	}
	return t_failures ? 1 : 0;
}

/* main() of a test that runs each golden checkpoint (k3tiny_a, then
 * k3tiny_b) through run, with a fresh temporary directory in dir[cap]
 * (t_tempdir(name); run leaves it empty, and it is removed). SKIPs without
 * the checkpoints. */
static inline int t_golden_main(char *dir, size_t cap, const char *name, void (*run)(const char *model))
{
	if (access(t_shared_path("golden/forward/k3tiny_a/model/config.json"), R_OK) != 0)
		return t_skip("golden checkpoints not found");
	if (!t_tempdir(dir, cap, name))
		return t_skip("no temp dir");
	run("k3tiny_a");
	run("k3tiny_b");
	rmdir(dir);
	return t_done();
}

#endif

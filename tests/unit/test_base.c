/* test_base.c - base/: strict number and size parsing, error messages, growing
 * arrays, carved blocks, whole-file reads, path joining and systemd socket activation,
 * linked without the core. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "base/array.h"
#include "base/carve.h"
#include "base/err.h"
#include "base/file.h"
#include "base/parse.h"
#include "base/path.h"
#include "base/sockact.h"
#include "t.h"

static void test_parse_u64(void)
{
	struct k3_err err = { 0, "" };
	uint64_t v = 7;

	T_EQ_INT(k3_parse_u64("42", 0, 100, &v, &err), 0);
	T_EQ_U64(v, 42);
	T_EQ_INT(k3_parse_u64("18446744073709551615", 0, UINT64_MAX, &v, &err), 0);
	T_EQ_U64(v, UINT64_MAX);
	v = 7;
	T_EQ_INT(k3_parse_u64("18446744073709551616", 0, UINT64_MAX, &v, &err), -ERANGE);
	T_EQ_U64(v, 7);   /* unchanged on failure */
	T_EQ_INT(k3_parse_u64("101", 0, 100, &v, &err), -ERANGE);
	T_OK(strstr(err.msg, "out of range [0, 100]") != NULL);
	T_EQ_INT(k3_parse_u64("", 0, 100, &v, &err), -EINVAL);
	T_EQ_INT(k3_parse_u64("-1", 0, 100, &v, &err), -EINVAL);
	T_EQ_INT(k3_parse_u64("+1", 0, 100, &v, &err), -EINVAL);
	T_EQ_INT(k3_parse_u64(" 1", 0, 100, &v, &err), -EINVAL);
	T_EQ_INT(k3_parse_u64("1x", 0, 100, &v, &err), -EINVAL);
	T_OK(strstr(err.msg, "'1x'") != NULL);
	T_EQ_INT(k3_parse_u64(NULL, 0, 100, &v, NULL), -EINVAL);
	T_EQ_INT(k3_parse_u64("3", 5, 100, &v, NULL), -ERANGE);
}

static void test_parse_double(void)
{
	struct k3_err err = { 0, "" };
	double d = 0;

	T_EQ_INT(k3_parse_double("2.5", 0, 10, &d, &err), 0);
	T_NEAR(d, 2.5, 0);
	T_EQ_INT(k3_parse_double("1e3", 0, 1e4, &d, &err), 0);
	T_NEAR(d, 1000, 0);
	T_EQ_INT(k3_parse_double("nan", 0, 10, &d, &err), -EINVAL);
	T_EQ_INT(k3_parse_double("inf", 0, 10, &d, &err), -EINVAL);
	T_EQ_INT(k3_parse_double("11", 0, 10, &d, &err), -ERANGE);
	T_EQ_INT(k3_parse_double("", 0, 10, &d, &err), -EINVAL);
	T_EQ_INT(k3_parse_double("2.5s", 0, 10, &d, &err), -EINVAL);
}

static void test_err(void)
{
	struct k3_err err = { 0, "" };
	char big[2 * K3_ERR_MSG_MAX];

	T_EQ_INT(k3_err_set(&err, -ENOENT, "cannot open '%s'", "x"), -ENOENT);
	T_EQ_INT(err.code, -ENOENT);
	T_EQ_STR(err.msg, "cannot open 'x'");
	T_EQ_INT(k3_err_prefix(&err, "model '%s'", "m"), -ENOENT);
	T_EQ_STR(err.msg, "model 'm': cannot open 'x'");
	T_EQ_INT(k3_err_set(NULL, -EIO, "dropped"), -EIO);
	T_EQ_INT(k3_err_prefix(NULL, "x"), -EINVAL);
	/* Long messages are truncated, never overflow, and stay terminated. */
	memset(big, 'a', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	k3_err_set(&err, -E2BIG, "%s", big);
	T_EQ_INT(strlen(err.msg), K3_ERR_MSG_MAX - 1);
	k3_err_prefix(&err, "%s", big);
	T_EQ_INT(strlen(err.msg), K3_ERR_MSG_MAX - 1);
	k3_err_set(&err, -E2BIG, "tail");
	k3_err_prefix(&err, "%s", big);
	T_OK(strncmp(err.msg, "aaaa", 4) == 0);
}

static void test_parse_size(void)
{
	struct k3_err err = { 0, "" };
	uint64_t v = 7;

	T_EQ_INT(k3_parse_size("123456", &v, &err), 0);
	T_EQ_U64(v, 123456);
	T_EQ_INT(k3_parse_size("512K", &v, &err), 0);
	T_EQ_U64(v, 512u << 10);
	T_EQ_INT(k3_parse_size("64m", &v, &err), 0);
	T_EQ_U64(v, 64ull << 20);
	T_EQ_INT(k3_parse_size("64G", &v, &err), 0);
	T_EQ_U64(v, 64ull << 30);
	T_EQ_INT(k3_parse_size("1t", &v, &err), 0);
	T_EQ_U64(v, 1ull << 40);
	T_EQ_INT(k3_parse_size("16777215T", &v, &err), 0);   /* 2^64 - 2^40 */
	T_EQ_U64(v, 16777215ull << 40);
	v = 7;
	T_EQ_INT(k3_parse_size("16777216T", &v, &err), -EINVAL);   /* 2^64: one past */
	T_OK(strstr(err.msg, "out of range") != NULL);
	T_EQ_U64(v, 7);
	T_EQ_INT(k3_parse_size("", &v, &err), -EINVAL);
	T_EQ_STR(err.msg, "'' is not a size");
	T_EQ_INT(k3_parse_size("G", &v, &err), -EINVAL);
	T_EQ_INT(k3_parse_size("64X", &v, &err), -EINVAL);
	T_EQ_INT(k3_parse_size("-1G", &v, &err), -EINVAL);
	T_EQ_INT(k3_parse_size("1.5G", &v, &err), -EINVAL);
	T_EQ_INT(k3_parse_size("123456789012345678901234567890123", &v, &err), -EINVAL);
	T_EQ_U64(v, 7);
}

/* The first allocation, doubling, a need past the doubling, and refusals
 * that leave the array as it was. */
static void test_array_reserve(void)
{
	uint32_t *v = NULL;
	size_t cap = 0;

	T_EQ_INT(k3_array_reserve(&v, &cap, 0, sizeof(*v), 8), 0);
	T_OK(v == NULL && cap == 0);
	T_EQ_INT(k3_array_reserve(&v, &cap, 1, sizeof(*v), 8), 0);
	T_OK(v != NULL);
	T_EQ_U64(cap, 8);
	v[7] = 77;
	T_EQ_INT(k3_array_reserve(&v, &cap, 9, sizeof(*v), 8), 0);
	T_EQ_U64(cap, 16);
	T_EQ_INT(v[7], 77);
	T_EQ_INT(k3_array_reserve(&v, &cap, 100, sizeof(*v), 8), 0);
	T_EQ_U64(cap, 128);
	T_EQ_INT(k3_array_reserve(&v, &cap, 50, sizeof(*v), 8), 0);
	T_EQ_U64(cap, 128);
	uint32_t *was = v;
	T_EQ_INT(k3_array_reserve(&v, &cap, SIZE_MAX / 2, sizeof(*v), 8), -ENOMEM);
	T_OK(v == was && cap == 128 && v[7] == 77);
	free(v);
}

/* Carving: the measuring pass hands out NULLs, the second pass aligned,
 * zeroed, disjoint parts in order; sizes that overflow end the loop with no
 * block and every part NULL (out of memory takes the same path). */
static void test_carve(void)
{
	double *a = (double *)1;
	uint8_t *b = (uint8_t *)1, *z = (uint8_t *)1;
	uint32_t *c = (uint32_t *)1;
	struct k3_carve k = { 0 };
	int passes = 0;
	while (k3_carve_next(&k)) {
		passes++;
		K3_CARVE(&k, a, 3);
		K3_CARVE(&k, b, 65);
		K3_CARVE(&k, z, 0);
		K3_CARVE(&k, c, 1000);
		if (passes == 1)
			T_OK(!a && !b && !z && !c && !k.block);
	}
	T_EQ_INT(passes, 2);
	T_OK(k.block != NULL);
	/* each part on its own 64-byte boundary, in order, none overlapping */
	T_EQ_U64((uintptr_t)a % K3_CARVE_ALIGN, 0);
	T_EQ_U64((uintptr_t)b - (uintptr_t)a, 64);      /* 24 bytes round to 64 */
	T_EQ_U64((uintptr_t)z - (uintptr_t)b, 128);     /* 65 bytes round to 128 */
	T_EQ_U64((uintptr_t)c - (uintptr_t)z, 64);      /* an empty part still has a place */
	T_EQ_U64(k.used, 64 + 128 + 64 + 4032);
	int zero = 1;
	for (int i = 0; i < 3; i++)
		zero &= a[i] == 0.0;
	for (int i = 0; i < 65; i++)
		zero &= b[i] == 0;
	for (int i = 0; i < 1000; i++)
		zero &= c[i] == 0;
	T_OK(zero);
	c[999] = 7;     /* the last element is inside the block (ASan checks) */
	free(k.block);

	/* sizes that overflow: no block, the loop never reaches a second pass */
	struct k3_carve o = { 0 };
	passes = 0;
	while (k3_carve_next(&o)) {
		passes++;
		K3_CARVE(&o, a, SIZE_MAX / 4);
		K3_CARVE(&o, b, 1);
	}
	T_EQ_INT(passes, 1);
	T_OK(!o.block && !a && !b);

}

static void test_path_join(void)
{
	char *p = k3_path_join("/models/k3", "config.json");

	T_EQ_STR(p, "/models/k3/config.json");
	free(p);
	p = k3_path_join("", "x");
	T_EQ_STR(p, "/x");
	free(p);
	p = k3_path_join("dir/", "");
	T_EQ_STR(p, "dir//");
	free(p);
}

static void write_all(const char *path, const void *p, size_t n)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);

	T_OK(fd >= 0);
	T_EQ_INT(write(fd, p, n), (long long)n);
	close(fd);
}

static void test_file_read(void)
{
	char dir[] = "/tmp/k3-test-base-XXXXXX", path[128], fifo[128];
	struct k3_err err = { 0, "" };
	static const char data[] = "abc\0def\n";   /* a NUL inside: the length counts it */
	char *buf = (char *)1;
	size_t n = 9;
	int pfd[2];

	T_OK(mkdtemp(dir) != NULL);
	snprintf(path, sizeof(path), "%s/f", dir);
	write_all(path, data, sizeof(data) - 1);
	T_EQ_INT(k3_file_read(path, 64, 0, &buf, &n, &err), 0);
	T_EQ_U64(n, sizeof(data) - 1);
	T_EQ_MEM(buf, data, sizeof(data) - 1);
	T_EQ_INT(buf[n], 0);
	free(buf);
	/* exactly the limit is fine, one byte less is not */
	T_EQ_INT(k3_file_read(path, sizeof(data) - 1, 0, &buf, &n, &err), 0);
	free(buf);
	T_EQ_INT(k3_file_read(path, sizeof(data) - 2, 0, &buf, &n, &err), -EFBIG);
	T_OK(strstr(err.msg, "is 8 bytes, which exceeds the 7 byte limit") != NULL);
	T_OK(buf == NULL && n == 0);
	/* empty file */
	write_all(path, "", 0);
	T_EQ_INT(k3_file_read(path, 64, 0, &buf, &n, &err), 0);
	T_OK(buf != NULL && n == 0 && buf[0] == 0);
	free(buf);
	/* missing, directory */
	snprintf(path, sizeof(path), "%s/missing", dir);
	T_EQ_INT(k3_file_read(path, 64, 0, &buf, &n, &err), -ENOENT);
	T_OK(strstr(err.msg, "cannot open '") != NULL && strstr(err.msg, "/missing'") != NULL);
	T_EQ_INT(k3_file_read(dir, 64, K3_FILE_STREAMS, &buf, &n, &err), -EINVAL);
	T_OK(strstr(err.msg, "is not a regular file") != NULL);
	/* a FIFO: refused unless streams are asked for (a loader must not block) */
	snprintf(fifo, sizeof(fifo), "%s/fifo", dir);
	T_EQ_INT(mkfifo(fifo, 0600), 0);
	{
		int rd = open(fifo, O_RDONLY | O_NONBLOCK), wr = open(fifo, O_WRONLY);

		T_EQ_INT(write(wr, "piped", 5), 5);
		close(wr);
		T_EQ_INT(k3_file_read(fifo, 64, 0, &buf, &n, &err), -EINVAL);
		close(rd);
	}
	/* a pipe read as standard input, longer than one 64 KiB chunk */
	T_EQ_INT(pipe(pfd), 0);
	if (fork() == 0) {
		static char chunk[50000];

		close(pfd[0]);
		memset(chunk, 'x', sizeof(chunk));
		for (int i = 0; i < 3; i++)
			if (write(pfd[1], chunk, sizeof(chunk)) != (ssize_t)sizeof(chunk))
				_exit(1);
		_exit(0);
	}
	close(pfd[1]);
	{
		int saved = dup(STDIN_FILENO);

		dup2(pfd[0], STDIN_FILENO);
		close(pfd[0]);
		T_EQ_INT(k3_file_read("-", 150000, K3_FILE_STREAMS, &buf, &n, &err), 0);
		T_EQ_U64(n, 150000);
		T_OK(buf && buf[0] == 'x' && buf[149999] == 'x' && buf[150000] == 0);
		free(buf);
		dup2(saved, STDIN_FILENO);
		close(saved);
	}
	/* the same stream one byte over the limit */
	T_EQ_INT(pipe(pfd), 0);
	T_EQ_INT(write(pfd[1], "0123456789", 10), 10);
	close(pfd[1]);
	snprintf(path, sizeof(path), "/dev/fd/%d", pfd[0]);
	T_EQ_INT(k3_file_read(path, 9, K3_FILE_STREAMS, &buf, &n, &err), -EFBIG);
	T_OK(strstr(err.msg, "has more than 9 bytes") != NULL);
	close(pfd[0]);
	unlink(fifo);
	snprintf(path, sizeof(path), "%s/f", dir);
	unlink(path);
	rmdir(dir);
}

/* Puts fd at 3 (where systemd passes sockets) and sets the variables. */
static void pass_fd(int fd, const char *pid, const char *fds)
{
	if (fd != K3_SOCKACT_FIRST_FD) {
		T_EQ_INT(dup2(fd, K3_SOCKACT_FIRST_FD), K3_SOCKACT_FIRST_FD);
		close(fd);
	}
	setenv("LISTEN_PID", pid, 1);
	setenv("LISTEN_FDS", fds, 1);
}

static void test_sockact(void)
{
	struct k3_err err = { 0, "" };
	struct sockaddr_un sun = { .sun_family = AF_UNIX };
	char pid[32];
	int saved = dup(K3_SOCKACT_FIRST_FD), fd;

	snprintf(pid, sizeof(pid), "%d", (int)getpid());
	unsetenv("LISTEN_PID");
	unsetenv("LISTEN_FDS");
	T_EQ_INT(k3_sockact_listen_fds(AF_UNIX, "k3d.socket", &err), 0);

	/* a listening Unix socket: adopted, non-blocking, variables gone */
	snprintf(sun.sun_path, sizeof(sun.sun_path), "/tmp/k3-test-sockact-%d", (int)getpid());
	unlink(sun.sun_path);
	fd = socket(AF_UNIX, SOCK_STREAM, 0);
	T_EQ_INT(bind(fd, (struct sockaddr *)&sun, sizeof(sun)), 0);
	T_EQ_INT(listen(fd, 4), 0);
	pass_fd(fd, pid, "1");
	T_EQ_INT(k3_sockact_listen_fds(AF_UNIX, "k3d.socket", &err), 1);
	T_OK(fcntl(K3_SOCKACT_FIRST_FD, F_GETFL) & O_NONBLOCK);
	T_OK(fcntl(K3_SOCKACT_FIRST_FD, F_GETFD) & FD_CLOEXEC);
	T_OK(getenv("LISTEN_PID") == NULL && getenv("LISTEN_FDS") == NULL);
	/* the wrong family for the caller */
	setenv("LISTEN_PID", pid, 1);
	setenv("LISTEN_FDS", "1", 1);
	T_EQ_INT(k3_sockact_listen_fds(AF_INET, "k3-gateway.socket", &err), -ENOTSOCK);
	T_EQ_STR(err.msg, "passed fd 3 is not a listening IP stream socket; check ListenStream= in "
		 "k3-gateway.socket");
	/* meant for another process: not ours, and not inherited either */
	setenv("LISTEN_PID", "1", 1);
	setenv("LISTEN_FDS", "1", 1);
	T_EQ_INT(k3_sockact_listen_fds(AF_UNIX, "k3d.socket", &err), 0);
	T_OK(getenv("LISTEN_PID") == NULL);
	/* malformed variables */
	setenv("LISTEN_PID", pid, 1);
	setenv("LISTEN_FDS", "1x", 1);
	T_EQ_INT(k3_sockact_listen_fds(AF_UNIX, "k3d.socket", &err), -EINVAL);
	T_OK(strstr(err.msg, "LISTEN_FDS='1x'") != NULL);
	/* more than K3_SOCKACT_MAX (fds 4..67 are open, so systemd's own
	 * check of each fd passes and ours is the one that refuses) */
	for (int i = 1; i <= K3_SOCKACT_MAX; i++)
		T_EQ_INT(dup2(K3_SOCKACT_FIRST_FD, K3_SOCKACT_FIRST_FD + i), K3_SOCKACT_FIRST_FD + i);
	setenv("LISTEN_PID", pid, 1);
	setenv("LISTEN_FDS", "65", 1);
	T_EQ_INT(k3_sockact_listen_fds(AF_UNIX, "k3d.socket", &err), -E2BIG);
	T_OK(strstr(err.msg, "systemd passed 65 sockets; at most 64") != NULL);
	for (int i = 0; i <= K3_SOCKACT_MAX; i++)
		close(K3_SOCKACT_FIRST_FD + i);
	unlink(sun.sun_path);

	/* a socket that does not listen */
	fd = socket(AF_UNIX, SOCK_STREAM, 0);
	pass_fd(fd, pid, "1");
	T_EQ_INT(k3_sockact_listen_fds(AF_UNIX, "k3d.socket", &err), -ENOTSOCK);
	T_EQ_STR(err.msg, "passed fd 3 is not a listening Unix stream socket; check ListenStream= in "
		 "k3d.socket");
	close(K3_SOCKACT_FIRST_FD);
	if (saved >= 0) {
		dup2(saved, K3_SOCKACT_FIRST_FD);
		close(saved);
	}
}

int main(void)
{
	test_parse_u64();
	test_parse_double();
	test_parse_size();
	test_err();
	test_array_reserve();
	test_carve();
	test_path_join();
	test_file_read();
	test_sockact();
	return t_done();
}

/* file.c - whole-file reads with a size bound (see file.h). */
#include "base/file.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Reads until EOF or until more than max bytes arrived. The buffer grows
 * by doubling from 64 KiB and never holds more than max + 1 data bytes
 * (the one past max proves the stream is too long) plus the final NUL. */
static int read_stream(int fd, const char *path, size_t max, char **out, size_t *len,
		       struct k3_err *err)
{
	size_t limit = max < SIZE_MAX - 2 ? max + 2 : SIZE_MAX;   /* buffer bytes, at most */
	size_t cap = limit < 65536 ? limit : 65536, n = 0;
	char *buf = malloc(cap);

	if (!buf)
		return k3_err_set(err, -ENOMEM, "out of memory reading '%s'", path);
	for (;;) {
		if (n + 1 == cap) {   /* full: n < max + 1 here, so cap < limit */
			size_t ncap = cap > limit / 2 ? limit : cap * 2;
			char *nb = realloc(buf, ncap);

			if (!nb) {
				free(buf);
				return k3_err_set(err, -ENOMEM, "out of memory reading '%s'", path);
			}
			buf = nb;
			cap = ncap;
		}
		ssize_t r = read(fd, buf + n, cap - 1 - n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			int e = errno;

			free(buf);
			return k3_err_set(err, -e, "cannot read '%s': %s", path, strerror(e));
		}
		if (r == 0)
			break;
		n += (size_t)r;
		if (n > max) {
			free(buf);
			return k3_err_set(err, -EFBIG, "'%s' has more than %zu bytes, the limit", path, max);
		}
	}
	buf[n] = '\0';
	*out = buf;
	*len = n;
	return 0;
}

/* Reads exactly size bytes of a regular file (a file that shrank while
 * read is an I/O error, not a short result). */
static int read_sized(int fd, const char *path, size_t size, char **out, size_t *len,
		      struct k3_err *err)
{
	char *buf = malloc(size + 1);
	size_t got = 0;

	if (!buf)
		return k3_err_set(err, -ENOMEM, "out of memory reading '%s'", path);
	while (got < size) {
		ssize_t r = read(fd, buf + got, size - got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			int e = r < 0 ? errno : EIO;

			free(buf);
			return k3_err_set(err, -e, "cannot read '%s': %s", path,
					  r < 0 ? strerror(e) : "file shrank while being read");
		}
		got += (size_t)r;
	}
	buf[got] = '\0';
	*out = buf;
	*len = got;
	return 0;
}

int k3_file_read(const char *path, size_t max, unsigned flags, char **out, size_t *len,
		 struct k3_err *err)
{
	bool is_stdin = (flags & K3_FILE_STREAMS) && strcmp(path, "-") == 0;
	/* Without K3_FILE_STREAMS, O_NONBLOCK keeps open(2) of a FIFO from
	 * waiting for a writer (it has no effect on regular files). */
	int fd = is_stdin ? STDIN_FILENO :
		 open(path, O_RDONLY | O_CLOEXEC | ((flags & K3_FILE_STREAMS) ? 0 : O_NONBLOCK));
	struct stat st;
	int r;

	*out = NULL;
	*len = 0;
	if (fd < 0)
		return k3_err_set(err, -errno, "cannot open '%s': %s", path, strerror(errno));
	if (fstat(fd, &st) != 0) {
		r = k3_err_set(err, -errno, "cannot read '%s': %s", path, strerror(errno));
	} else if (S_ISREG(st.st_mode)) {
		if ((uint64_t)st.st_size > max)
			r = k3_err_set(err, -EFBIG, "'%s' is %lld bytes, which exceeds the %zu byte limit",
				       path, (long long)st.st_size, max);
		else
			r = read_sized(fd, path, (size_t)st.st_size, out, len, err);
	} else if ((flags & K3_FILE_STREAMS) && !S_ISDIR(st.st_mode)) {
		r = read_stream(fd, is_stdin ? "standard input" : path, max, out, len, err);
	} else {
		r = k3_err_set(err, -EINVAL, "'%s' is not a regular file", path);
	}
	if (!is_stdin)
		close(fd);
	return r;
}

int k3_file_pwrite_all(int fd, const void *buf, size_t n, uint64_t off)
{
	const uint8_t *p = buf;

	while (n) {
		ssize_t w = pwrite(fd, p, n, (off_t)off);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return w < 0 ? -errno : -EIO;
		p += w;
		n -= (size_t)w;
		off += (uint64_t)w;
	}
	return 0;
}

int k3_file_fsync_dir(const char *dir)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC), rc = 0;

	if (fd < 0)
		return -errno;
	if (fsync(fd) != 0)
		rc = -errno;
	close(fd);
	return rc;
}

int k3_file_fsync_parent(const char *path)
{
	char buf[PATH_MAX];

	if (strlen(path) >= sizeof(buf))
		return -ENAMETOOLONG;
	strcpy(buf, path);
	return k3_file_fsync_dir(dirname(buf));
}

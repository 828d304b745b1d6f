/* setup_publish.c - no-follow opens, durable no-replace publishing (see setup_publish.h). */
#include "setup/setup_publish.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"

#ifndef RENAME_NOREPLACE
#define RENAME_NOREPLACE (1 << 0)
#endif

int k3_setup_dir_open(const char *path, bool create, int *out, struct k3_err *err)
{
	int fd;

	*out = -1;
	fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0 && errno == ENOENT && create) {
		char buf[4096];
		size_t n = strlen(path);
		if (n == 0 || n >= sizeof(buf))
			return k3_err_set(err, -ENAMETOOLONG, "directory path '%s' is too long", path);
		memcpy(buf, path, n + 1);
		for (char *p = buf + 1; *p; p++) {
			if (*p != '/')
				continue;
			*p = '\0';
			if (mkdir(buf, 0755) != 0 && errno != EEXIST)
				return k3_err_set(err, -errno, "cannot create '%s': %s", buf, strerror(errno));
			*p = '/';
		}
		if (mkdir(buf, 0755) != 0 && errno != EEXIST)
			return k3_err_set(err, -errno, "cannot create '%s': %s", buf, strerror(errno));
		fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	}
	if (fd < 0)
		return k3_err_set(err, -errno, "cannot open directory '%s': %s", path, strerror(errno));
	*out = fd;
	return 0;
}

int k3_setup_subdir_open(int dirfd, const char *name, bool create, unsigned mode, int *out,
			 struct k3_err *err)
{
	int fd;

	*out = -1;
	if (create && mkdirat(dirfd, name, mode) != 0 && errno != EEXIST)
		return k3_err_set(err, -errno, "cannot create '%s': %s", name, strerror(errno));
	fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		int e = errno == ENOTDIR ? -ENOTDIR : -errno;
		if (errno == ELOOP || errno == ENOTDIR) {
			struct stat st;
			if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode))
				return k3_err_set(err, -ELOOP, "'%s' is a symbolic link: refusing to"
						  " follow it (remove it)", name);
		}
		return k3_err_set(err, e, "cannot open directory '%s': %s", name, strerror(-e));
	}
	*out = fd;
	return 0;
}

int k3_setup_fsync_dir(int dirfd, const char *what, struct k3_err *err)
{
	if (fsync(dirfd) != 0 && errno != EINVAL)
		return k3_err_set(err, -errno, "cannot fsync directory '%s': %s", what, strerror(errno));
	return 0;
}

int k3_setup_probe(int dirfd, const char *name, const char *what, struct stat *st,
		   struct k3_err *err)
{
	if (fstatat(dirfd, name, st, AT_SYMLINK_NOFOLLOW) != 0) {
		if (errno == ENOENT)
			return -ENOENT;
		return k3_err_set(err, -errno, "cannot stat '%s': %s", what, strerror(errno));
	}
	if (S_ISLNK(st->st_mode))
		return k3_err_set(err, -ELOOP, "'%s' is a symbolic link: refusing to write through it"
				  " or replace it (remove it and run again)", what);
	if (!S_ISREG(st->st_mode))
		return k3_err_set(err, -EEXIST, "'%s' exists and is not a regular file", what);
	return 0;
}

int k3_setup_open_file(int dirfd, const char *name, int flags, unsigned mode, const char *what,
		       struct k3_err *err)
{
	struct stat st;
	int fd = openat(dirfd, name, flags | O_NOFOLLOW | O_CLOEXEC, (mode_t)mode);

	if (fd < 0) {
		if (errno == ELOOP)
			return k3_err_set(err, -ELOOP, "'%s' is a symbolic link: refusing to write"
					  " through it (remove it and run again)", what);
		return k3_err_set(err, -errno, "cannot open '%s': %s", what, strerror(errno));
	}
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
		close(fd);
		return k3_err_set(err, -EEXIST, "'%s' is not a regular file", what);
	}
	return fd;
}

int k3_setup_publish(int dirfd, int fd, const char *from, const char *to, const char *what,
		     struct k3_err *err)
{
	if (fdatasync(fd) != 0)
		return k3_err_set(err, -errno, "cannot fsync '%s': %s", what, strerror(errno));
	if (renameat2(dirfd, from, dirfd, to, RENAME_NOREPLACE) != 0) {
		if (errno == EEXIST)
			return k3_err_set(err, -EEXIST, "'%s' appeared while it was downloaded: refusing"
					  " to replace it (the verified download stays as '%s')", what, from);
		if (errno != EINVAL && errno != ENOSYS)
			return k3_err_set(err, -errno, "cannot rename '%s' into place: %s", what,
					  strerror(errno));
		/* No RENAME_NOREPLACE here: a hard link fails on an existing
		 * name just the same. */
		if (linkat(dirfd, from, dirfd, to, 0) != 0)
			return k3_err_set(err, -errno, errno == EEXIST ? "'%s' appeared while it was"
					  " downloaded: refusing to replace it" : "cannot publish '%s': %s",
					  what, strerror(errno));
		if (unlinkat(dirfd, from, 0) != 0)
			return k3_err_set(err, -errno, "cannot remove '%s': %s", from, strerror(errno));
	}
	return k3_setup_fsync_dir(dirfd, what, err);
}

int k3_setup_write_atomic(int dirfd, const char *name, const void *data, size_t len,
			  const char *what, struct k3_err *err)
{
	char tmp[512];
	int fd, rc;

	if (snprintf(tmp, sizeof(tmp), ".%s.tmp.%ld", name, (long)getpid()) >= (int)sizeof(tmp))
		return k3_err_set(err, -ENAMETOOLONG, "name '%s' is too long", name);
	(void)unlinkat(dirfd, tmp, 0);
	fd = openat(dirfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
	if (fd < 0)
		return k3_err_set(err, -errno, "cannot create a temporary file for '%s': %s", what,
				  strerror(errno));
	rc = k3_file_pwrite_all(fd, data, len, 0);
	if (rc == 0 && fsync(fd) != 0)
		rc = -errno;
	close(fd);
	if (rc == 0 && renameat(dirfd, tmp, dirfd, name) != 0)
		rc = -errno;
	if (rc) {
		(void)unlinkat(dirfd, tmp, 0);
		return k3_err_set(err, rc, "cannot write '%s': %s", what, strerror(-rc));
	}
	return k3_setup_fsync_dir(dirfd, what, err);
}

int k3_setup_read_fd(int fd, size_t max, char **out, size_t *len, const char *what,
		     struct k3_err *err)
{
	struct stat st;
	char *buf;
	size_t got = 0;

	*out = NULL;
	*len = 0;
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size > max)
		return k3_err_set(err, -EFBIG, "'%s' is not a regular file of at most %zu bytes", what, max);
	buf = malloc((size_t)st.st_size + 1);
	if (!buf)
		return k3_err_set(err, -ENOMEM, "out of memory");
	while (got < (size_t)st.st_size) {
		ssize_t r = pread(fd, buf + got, (size_t)st.st_size - got, (off_t)got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		got += (size_t)r;
	}
	if (got != (size_t)st.st_size) {
		free(buf);
		return k3_err_set(err, -EIO, "cannot read '%s'", what);
	}
	buf[got] = '\0';
	*out = buf;
	*len = got;
	return 0;
}

int k3_setup_read_file(int dirfd, const char *name, size_t max, char **out, size_t *len,
		       const char *what, struct k3_err *err)
{
	int fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC), rc;

	*out = NULL;
	*len = 0;
	if (fd < 0) {
		if (errno == ENOENT)
			return -ENOENT;
		return k3_err_set(err, -errno, "cannot open '%s': %s", what, strerror(errno));
	}
	rc = k3_setup_read_fd(fd, max, out, len, what, err);
	close(fd);
	return rc;
}

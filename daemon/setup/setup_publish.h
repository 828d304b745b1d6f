/*
 * setup_publish.h - the file-system side of an install, written so that a
 * crash, a planted link or a second copy of k3ctl can never leave a file
 * that was not verified under a model file's name, nor remove one that was:
 *
 *   - every file inside a model directory is opened relative to the
 *     directory's descriptor with O_NOFOLLOW: a symbolic link planted at a
 *     destination (or at its .partial) is refused, never written through;
 *   - a download is published by fsync of the file, rename(2) with
 *     RENAME_NOREPLACE onto its name (link + unlink where the file system
 *     lacks it), then fsync of the directory: the name appears only with
 *     complete, durable, verified bytes, and nothing already at the name is
 *     ever replaced;
 *   - the setup's own small files (.k3-setup/state.json, the pinned
 *     inventory) are replaced atomically the same way, with a temporary
 *     file beside them.
 *
 * The model directory itself is opened by the path the user gave (a link
 * there is the user's choice, e.g. /var/lib/k3d/models/kimi-k3 -> /nvme).
 */
#ifndef K3_SETUP_PUBLISH_H
#define K3_SETUP_PUBLISH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#include "base/err.h"

/* Opens directory `path` (made with mode 0755, parents included, when
 * create and missing) and returns an O_DIRECTORY descriptor in *out.
 * Returns 0, -ENOTDIR, or the errno. */
int k3_setup_dir_open(const char *path, bool create, int *out, struct k3_err *err);

/* Opens the subdirectory `name` of dirfd (creating it with `mode` when
 * create), refusing a symbolic link. Returns 0, -ELOOP, -ENOTDIR or the
 * errno. */
int k3_setup_subdir_open(int dirfd, const char *name, bool create, unsigned mode, int *out,
			 struct k3_err *err);

/* fsync of a directory. 0 or the errno (message names `what`). */
int k3_setup_fsync_dir(int dirfd, const char *what, struct k3_err *err);

/* What is at dirfd/name, without following links: -ENOENT (nothing), 0 (a
 * regular file; *st filled), -ELOOP (a symbolic link: refused, the message
 * names it and says to remove it), -EEXIST (something else). `what` is the
 * path for messages. */
int k3_setup_probe(int dirfd, const char *name, const char *what, struct stat *st,
		   struct k3_err *err);

/* Opens dirfd/name with O_NOFOLLOW | O_CLOEXEC | flags (mode for O_CREAT)
 * and checks it is a regular file. Returns the descriptor or a negative
 * errno (-ELOOP for a link, with a message naming `what`). */
int k3_setup_open_file(int dirfd, const char *name, int flags, unsigned mode, const char *what,
		       struct k3_err *err);

/* Publishes: fdatasync(fd), renames dirfd/from to dirfd/to without
 * replacing anything there, fsyncs the directory. Returns 0, -EEXIST when
 * `to` exists (from is left in place), or the errno. */
int k3_setup_publish(int dirfd, int fd, const char *from, const char *to, const char *what,
		     struct k3_err *err);

/* Replaces dirfd/name with len bytes of data atomically (temporary file,
 * fsync, rename, fsync of the directory). For the setup's own files, never
 * for model files. Returns 0 or the errno. */
int k3_setup_write_atomic(int dirfd, const char *name, const void *data, size_t len,
			  const char *what, struct k3_err *err);

/* Reads the open file fd (a regular file of at most max bytes) into a
 * malloc'd, NUL-terminated buffer. Returns 0, -EFBIG or the errno; `what`
 * names it in messages. */
int k3_setup_read_fd(int fd, size_t max, char **out, size_t *len, const char *what,
		     struct k3_err *err);

/* Reads dirfd/name (O_NOFOLLOW, a regular file of at most max bytes) into a
 * malloc'd, NUL-terminated buffer. Returns 0, -ENOENT, -EFBIG, -ELOOP or
 * the errno. */
int k3_setup_read_file(int dirfd, const char *name, size_t max, char **out, size_t *len,
		       const char *what, struct k3_err *err);

#endif

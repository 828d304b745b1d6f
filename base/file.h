/*
 * file.h - reading a whole (small) file into memory: configs, tokenizer
 * files, chat JSON. One implementation for the loaders and the command
 * line, so every caller bounds the size before it allocates and reports
 * the same clear errors. And making directory entries durable (fsync of
 * a directory) for the writers that publish files by rename.
 */
#ifndef K3_BASE_FILE_H
#define K3_BASE_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"

enum k3_file_flags {
	/* Also read what cannot be sized in advance: "-" (standard input),
	 * pipes, terminals and other character devices. Without it anything
	 * but a regular file is refused (a loader must not block on a FIFO). */
	K3_FILE_STREAMS = 1u << 0,
};

/*
 * Reads all of path into *out: a malloc'd buffer of *len bytes plus one
 * NUL after them (the data itself may contain NULs; *len does not count
 * the extra one). The caller frees *out. A regular file is sized with
 * fstat and refused before allocating when it holds more than max bytes;
 * a stream (K3_FILE_STREAMS) is read in growing chunks and refused as soon
 * as it passes max.
 * Returns 0, or a negative errno with err naming the path: the open(2)
 * error (-ENOENT, -EACCES, ...), -EINVAL for a directory or another file
 * type flags do not allow, -EFBIG for more than max bytes, -ENOMEM, or the
 * read(2) error. On failure *out is NULL and *len 0.
 */
int k3_file_read(const char *path, size_t max, unsigned flags, char **out, size_t *len,
		 struct k3_err *err);

/* Writes all n bytes of buf to fd at offset off (pwrite(2), retried on
 * EINTR and short writes). Returns 0, the negative errno of pwrite, or
 * -EIO when it writes nothing (a full device reports ENOSPC instead). */
int k3_file_pwrite_all(int fd, const void *buf, size_t n, uint64_t off);

/* fsync(2) of directory dir, so that entries created, renamed or removed
 * in it survive a crash. Returns 0 or a negative errno (open or fsync). */
int k3_file_fsync_dir(const char *dir);

/* k3_file_fsync_dir of the directory that holds path ("." for a bare
 * name). -ENAMETOOLONG for a path of PATH_MAX bytes or more. */
int k3_file_fsync_parent(const char *path);

#endif

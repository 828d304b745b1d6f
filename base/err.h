/*
 * err.h - the error report every fallible core function can fill in.
 *
 * Functions named as actions return 0 or a negative errno; where the caller
 * needs to know why, they take a `struct k3_err *err` as the last parameter
 * and write it only on failure. err may be NULL (the message is dropped).
 * The message is for a person: what failed first, values in single quotes,
 * lower case, no full stop.
 */
#ifndef K3_BASE_ERR_H
#define K3_BASE_ERR_H

enum { K3_ERR_MSG_MAX = 512 };

struct k3_err {
	int code;                   /* negative errno, 0 when unset */
	char msg[K3_ERR_MSG_MAX];   /* NUL-terminated, truncated to fit */
};

/* Records code and the formatted message in err (if non-NULL) and returns
 * code, so a caller can write `return k3_err_set(err, -EINVAL, ...)`. */
int k3_err_set(struct k3_err *err, int code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* Prepends "prefix: " to an existing message (for context added by a caller
 * one level up). Returns err->code, or -EINVAL when err is NULL. */
int k3_err_prefix(struct k3_err *err, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

#endif

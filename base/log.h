/*
 * log.h - leveled logging to stderr with "<N>" syslog level prefixes, which
 * journald understands. Log once, at the boundary where an error is handled;
 * library code (proto/, kernels/, providers/) does not log.
 *
 * Thread-safe: each line is written with one write(2).
 */
#ifndef K3_BASE_LOG_H
#define K3_BASE_LOG_H

#include <stdbool.h>

enum k3_log_level {
	K3_LOG_ERR = 3,
	K3_LOG_WARNING = 4,
	K3_LOG_NOTICE = 5,
	K3_LOG_INFO = 6,
	K3_LOG_DEBUG = 7,
};

/* Sets the most verbose level that is printed (default K3_LOG_INFO) and
 * whether lines carry the "<N>" prefix (default: only when stderr is not a
 * terminal, i.e. under systemd). */
void k3_log_setup(enum k3_log_level max, bool prefix);
bool k3_log_enabled(enum k3_log_level level);
void k3_log_write(enum k3_log_level level, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* Logs and returns code in one step: `return k3_log_errno(r, "cannot bind '%s'", p);` */
int k3_log_error_code(int code, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* Checks the level before formatting, so disabled debug lines cost nothing. */
#define k3_log(level, ...) \
	do { if (k3_log_enabled(level)) k3_log_write(level, __VA_ARGS__); } while (0)
#define k3_log_err(...)     k3_log(K3_LOG_ERR, __VA_ARGS__)
#define k3_log_warning(...) k3_log(K3_LOG_WARNING, __VA_ARGS__)
#define k3_log_notice(...)  k3_log(K3_LOG_NOTICE, __VA_ARGS__)
#define k3_log_info(...)    k3_log(K3_LOG_INFO, __VA_ARGS__)
#define k3_log_debug(...)   k3_log(K3_LOG_DEBUG, __VA_ARGS__)

#endif

/* err.c - struct k3_err helpers (see err.h). */
#include "base/err.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int k3_err_set(struct k3_err *err, int code, const char *fmt, ...)
{
	va_list ap;

	if (!err)
		return code;
	err->code = code;
	va_start(ap, fmt);
	vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
	va_end(ap);
	return code;
}

int k3_err_prefix(struct k3_err *err, const char *fmt, ...)
{
	char head[K3_ERR_MSG_MAX], old[K3_ERR_MSG_MAX];
	va_list ap;

	if (!err)
		return -EINVAL;
	va_start(ap, fmt);
	vsnprintf(head, sizeof(head), fmt, ap);
	va_end(ap);
	memcpy(old, err->msg, sizeof(old));
	/* Truncation is fine: the head matters most. */
	size_t n = strlen(head);
	if (n > sizeof(err->msg) - 3)
		n = sizeof(err->msg) - 3;
	memcpy(err->msg, head, n);
	memcpy(err->msg + n, ": ", 2);
	n += 2;
	size_t m = strlen(old);
	if (m > sizeof(err->msg) - 1 - n)
		m = sizeof(err->msg) - 1 - n;
	memcpy(err->msg + n, old, m);
	err->msg[n + m] = '\0';
	return err->code;
}

/* log.c - stderr logging with journald level prefixes (see log.h). */
#include "base/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

static enum k3_log_level log_max = K3_LOG_INFO;
static int log_prefix = -1; /* -1: decide from isatty(2) on first use */

void k3_log_setup(enum k3_log_level max, bool prefix)
{
	log_max = max;
	log_prefix = prefix;
}

bool k3_log_enabled(enum k3_log_level level)
{
	return level <= log_max;
}

static void log_vwrite(enum k3_log_level level, const char *fmt, va_list ap)
{
	char line[2048];
	int n = 0, m;

	if (log_prefix < 0)
		log_prefix = !isatty(STDERR_FILENO);
	if (log_prefix)
		n = snprintf(line, sizeof(line), "<%d>", (int)level);
	m = vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
	if (m < 0)
		return;
	n += m;
	if (n > (int)sizeof(line) - 2)
		n = (int)sizeof(line) - 2;
	line[n++] = '\n';
	/* One write per line keeps lines whole when threads log at once. */
	if (write(STDERR_FILENO, line, (size_t)n) < 0)
		return;
}

void k3_log_write(enum k3_log_level level, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	log_vwrite(level, fmt, ap);
	va_end(ap);
}

int k3_log_error_code(int code, const char *fmt, ...)
{
	va_list ap;

	if (!k3_log_enabled(K3_LOG_ERR))
		return code;
	va_start(ap, fmt);
	log_vwrite(K3_LOG_ERR, fmt, ap);
	va_end(ap);
	return code;
}

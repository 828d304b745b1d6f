/* parse.c - strict number and size parsing (see parse.h). */
#include "base/parse.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

int k3_parse_u64(const char *s, uint64_t min, uint64_t max, uint64_t *out,
		 struct k3_err *err)
{
	unsigned long long v;
	char *end;

	if (!s || !isdigit((unsigned char)s[0]))
		return k3_err_set(err, -EINVAL, "'%s' is not a non-negative integer",
				  s ? s : "");
	errno = 0;
	v = strtoull(s, &end, 10);
	if (*end != '\0')
		return k3_err_set(err, -EINVAL, "'%s' is not a non-negative integer", s);
	if (errno == ERANGE || v < min || v > max)
		return k3_err_set(err, -ERANGE, "'%s' is out of range [%llu, %llu]", s,
				  (unsigned long long)min, (unsigned long long)max);
	*out = v;
	return 0;
}

int k3_parse_double(const char *s, double min, double max, double *out,
		    struct k3_err *err)
{
	double v;
	char *end;

	if (!s || !*s || isspace((unsigned char)s[0]))
		return k3_err_set(err, -EINVAL, "'%s' is not a number", s ? s : "");
	errno = 0;
	v = strtod(s, &end);
	if (*end != '\0' || !isfinite(v))
		return k3_err_set(err, -EINVAL, "'%s' is not a number", s);
	if (errno == ERANGE || v < min || v > max)
		return k3_err_set(err, -ERANGE, "'%s' is out of range [%g, %g]", s, min, max);
	*out = v;
	return 0;
}

int k3_parse_size(const char *s, uint64_t *out, struct k3_err *err)
{
	char num[32];
	size_t n = s ? strlen(s) : 0;
	unsigned shift = 0;
	uint64_t v;

	if (n == 0 || n >= sizeof(num))
		return k3_err_set(err, -EINVAL, "'%s' is not a size", s ? s : "");
	memcpy(num, s, n + 1);
	switch (num[n - 1]) {
	case 'K': case 'k': shift = 10; break;
	case 'M': case 'm': shift = 20; break;
	case 'G': case 'g': shift = 30; break;
	case 'T': case 't': shift = 40; break;
	}
	if (shift)
		num[n - 1] = '\0';
	if (k3_parse_u64(num, 0, UINT64_MAX >> shift, &v, err))
		return -EINVAL;
	*out = v << shift;
	return 0;
}

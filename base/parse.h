/*
 * parse.h - strict number and size parsing for command lines, config files
 * and environment variables. Never use atoi/strtol directly: these reject empty
 * strings, signs where none is allowed, trailing garbage and out-of-range
 * values, and name the problem in err.
 */
#ifndef K3_BASE_PARSE_H
#define K3_BASE_PARSE_H

#include <stdint.h>

#include "base/err.h"

/* Parses a decimal unsigned integer in [min, max] into *out.
 * Returns 0, or -EINVAL (not a number / trailing bytes) or -ERANGE. */
int k3_parse_u64(const char *s, uint64_t min, uint64_t max, uint64_t *out,
		 struct k3_err *err);

/* Parses a finite decimal floating-point number in [min, max]. */
int k3_parse_double(const char *s, double min, double max, double *out,
		    struct k3_err *err);

/* Parses a byte count with an optional binary unit: "123456", "512K",
 * "64M", "64G", "1T" (K/M/G/T = 2^10/2^20/2^30/2^40, either case) into
 * *out bytes. Returns 0, or -EINVAL (not a size, or one past 2^64 - 1
 * bytes) with the reason in err; *out is unchanged on failure. */
int k3_parse_size(const char *s, uint64_t *out, struct k3_err *err);

#endif

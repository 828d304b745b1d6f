/* text_json.c - Python-compatible JSON text (see text_json.h). */
#include "text/text_json.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3_limits.h"

void k3_pyjson_float_repr(double x, struct k3_sbuf *b)
{
	char buf[64], digits[32];
	int prec, exp10, nd = 0, decpt;

	if (isnan(x)) {
		k3_sbuf_adds(b, "NaN");
		return;
	}
	if (isinf(x)) {
		k3_sbuf_adds(b, x < 0 ? "-Infinity" : "Infinity");
		return;
	}
	if (x == 0) {
		k3_sbuf_adds(b, signbit(x) ? "-0.0" : "0.0");
		return;
	}
	/* shortest %.Ne that reads back as x: the digits of repr */
	for (prec = 0; prec < 17; prec++) {
		snprintf(buf, sizeof(buf), "%.*e", prec, x);
		if (strtod(buf, NULL) == x)
			break;
	}
	snprintf(buf, sizeof(buf), "%.*e", prec, x);
	{
		const char *p = buf;
		if (*p == '-') {
			k3_sbuf_addc(b, '-');
			p++;
		}
		for (; *p && *p != 'e'; p++)
			if (*p >= '0' && *p <= '9')
				digits[nd++] = *p;
		exp10 = atoi(p + 1);
	}
	while (nd > 1 && digits[nd - 1] == '0')
		nd--;
	decpt = exp10 + 1;   /* value = 0.DIGITS × 10^decpt */
	if (decpt > -4 && decpt <= 16) {
		/* fixed notation, at least one digit after the point */
		if (decpt <= 0) {
			k3_sbuf_adds(b, "0.");
			for (int i = 0; i < -decpt; i++)
				k3_sbuf_addc(b, '0');
			k3_sbuf_add(b, digits, (size_t)nd);
		} else if (decpt >= nd) {
			k3_sbuf_add(b, digits, (size_t)nd);
			for (int i = nd; i < decpt; i++)
				k3_sbuf_addc(b, '0');
			k3_sbuf_adds(b, ".0");
		} else {
			k3_sbuf_add(b, digits, (size_t)decpt);
			k3_sbuf_addc(b, '.');
			k3_sbuf_add(b, digits + decpt, (size_t)(nd - decpt));
		}
	} else {
		char e[16];
		k3_sbuf_addc(b, digits[0]);
		if (nd > 1) {
			k3_sbuf_addc(b, '.');
			k3_sbuf_add(b, digits + 1, (size_t)(nd - 1));
		}
		snprintf(e, sizeof(e), "e%c%02d", exp10 < 0 ? '-' : '+', abs(exp10));
		k3_sbuf_adds(b, e);
	}
}

static void dump_string(const char *s, size_t n, struct k3_sbuf *b)
{
	size_t run = 0;

	k3_sbuf_addc(b, '"');
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];
		const char *esc = NULL;
		char u[8];

		switch (c) {
		case '"': esc = "\\\""; break;
		case '\\': esc = "\\\\"; break;
		case '\n': esc = "\\n"; break;
		case '\r': esc = "\\r"; break;
		case '\t': esc = "\\t"; break;
		case '\b': esc = "\\b"; break;
		case '\f': esc = "\\f"; break;
		default:
			if (c < 0x20) {
				snprintf(u, sizeof(u), "\\u%04x", c);
				esc = u;
			}
		}
		if (esc) {
			k3_sbuf_add(b, s + i - run, run);
			run = 0;
			k3_sbuf_adds(b, esc);
		} else {
			run++;
		}
	}
	k3_sbuf_add(b, s + n - run, run);
	k3_sbuf_addc(b, '"');
}

/* An object key with its length: keys may hold NULs (json_object_setn). */
struct key {
	const char *p;
	size_t n;
};

static int cmp_keys(const void *a, const void *b)
{
	const struct key *x = a, *y = b;
	int c = memcmp(x->p, y->p, x->n < y->n ? x->n : y->n);

	/* UTF-8 byte order is code-point order; a prefix sorts first */
	return c ? c : (x->n > y->n) - (x->n < y->n);
}

static int dump(const json_t *v, unsigned flags, struct k3_sbuf *b, unsigned depth)
{
	const char *item_sep = (flags & K3_PYJSON_COMPACT) ? "," : ", ";
	const char *kv_sep = (flags & K3_PYJSON_COMPACT) ? ":" : ": ";
	int rc = 0;

	if (depth > K3_LIM_JSON_DEPTH)
		return -EINVAL;
	switch (json_typeof(v)) {
	case JSON_OBJECT: {
		size_t n = json_object_size(v), i = 0, kl;
		struct key *keys = n ? malloc(n * sizeof(*keys)) : NULL;
		const char *k;
		json_t *x;

		if (n && !keys) {
			b->oom = true;
			return 0;
		}
		json_object_keylen_foreach((json_t *)v, k, kl, x) {
			keys[i].p = k;
			keys[i++].n = kl;
		}
		if (n && (flags & K3_PYJSON_SORT_KEYS))   /* qsort(NULL, 0) is undefined */
			qsort(keys, n, sizeof(*keys), cmp_keys);
		k3_sbuf_addc(b, '{');
		for (i = 0; i < n && !rc; i++) {
			if (i)
				k3_sbuf_adds(b, item_sep);
			dump_string(keys[i].p, keys[i].n, b);
			k3_sbuf_adds(b, kv_sep);
			rc = dump(json_object_getn(v, keys[i].p, keys[i].n), flags, b, depth + 1);
		}
		k3_sbuf_addc(b, '}');
		free(keys);
		break;
	}
	case JSON_ARRAY:
		k3_sbuf_addc(b, '[');
		for (size_t i = 0; i < json_array_size(v) && !rc; i++) {
			if (i)
				k3_sbuf_adds(b, item_sep);
			rc = dump(json_array_get(v, i), flags, b, depth + 1);
		}
		k3_sbuf_addc(b, ']');
		break;
	case JSON_STRING:
		dump_string(json_string_value(v), json_string_length(v), b);
		break;
	case JSON_INTEGER: {
		char t[32];
		snprintf(t, sizeof(t), "%" JSON_INTEGER_FORMAT, json_integer_value(v));
		k3_sbuf_adds(b, t);
		break;
	}
	case JSON_REAL:
		k3_pyjson_float_repr(json_real_value(v), b);
		break;
	case JSON_TRUE:
		k3_sbuf_adds(b, "true");
		break;
	case JSON_FALSE:
		k3_sbuf_adds(b, "false");
		break;
	case JSON_NULL:
		k3_sbuf_adds(b, "null");
		break;
	}
	return rc;
}

int k3_pyjson_dump(const json_t *v, unsigned flags, struct k3_sbuf *b)
{
	if (!v) {
		k3_sbuf_adds(b, "null");
		return 0;
	}
	return dump(v, flags, b, 0);
}

int k3_pyjson_str(const json_t *v, struct k3_sbuf *b)
{
	char t[32];

	switch (v ? json_typeof(v) : JSON_NULL) {
	case JSON_STRING:
		k3_sbuf_add(b, json_string_value(v), json_string_length(v));
		return 0;
	case JSON_INTEGER:
		snprintf(t, sizeof(t), "%" JSON_INTEGER_FORMAT, json_integer_value(v));
		k3_sbuf_adds(b, t);
		return 0;
	case JSON_REAL: {
		double x = json_real_value(v);
		/* str(float) is repr(float), but nan/inf print lower case */
		if (isnan(x))
			k3_sbuf_adds(b, "nan");
		else if (isinf(x))
			k3_sbuf_adds(b, x < 0 ? "-inf" : "inf");
		else
			k3_pyjson_float_repr(x, b);
		return 0;
	}
	case JSON_TRUE:
		k3_sbuf_adds(b, "True");
		return 0;
	case JSON_FALSE:
		k3_sbuf_adds(b, "False");
		return 0;
	case JSON_NULL:
		k3_sbuf_adds(b, "None");
		return 0;
	default:
		return -EINVAL;
	}
}

bool k3_pyjson_truthy(const json_t *v)
{
	if (!v)
		return false;
	switch (json_typeof(v)) {
	case JSON_OBJECT: return json_object_size(v) > 0;
	case JSON_ARRAY: return json_array_size(v) > 0;
	case JSON_STRING: return json_string_length(v) > 0;
	case JSON_INTEGER: return json_integer_value(v) != 0;
	case JSON_REAL: return json_real_value(v) != 0;
	case JSON_TRUE: return true;
	default: return false;
	}
}

/*
 * json_fields.h - k3ctl's JSON output: a struct's plain fields as JSON
 * members, from a table of (key, offset, type), for the replies and
 * reports that list dozens of counters one after another (k3ctl status,
 * k3ctl plan), so each list is data, in output order, instead of a call
 * per line; and the one line a --json command prints.
 */
#ifndef K3CTL_JSON_FIELDS_H
#define K3CTL_JSON_FIELDS_H

#include <stddef.h>

#include <jansson.h>

enum k3ctl_json_type { K3CTL_JSON_U32, K3CTL_JSON_U64, K3CTL_JSON_F64, K3CTL_JSON_BOOL };

struct k3ctl_json_field {
	const char *key;
	size_t offset;               /* offsetof the member */
	size_t size;                 /* sizeof the member: checked against type */
	enum k3ctl_json_type type;
};

/* One table row: member `member` of struct type `type`, as JSON key `key`. */
#define K3CTL_JSON_FIELD(key, type, member, jtype) \
	{ key, offsetof(type, member), sizeof(((type *)0)->member), jtype }

/* Adds to object o, in table order, f[0..n)'s members of the struct at
 * obj: integers for U32/U64, reals for F64, booleans for BOOL. A row whose
 * size does not match its type is a programming error: it aborts. */
void k3ctl_json_set_fields(json_t *o, const void *obj, const struct k3ctl_json_field *f,
			   size_t n);

/* Prints j encoded with flags (json_dumps's) as one line on stdout, or
 * fallback (NULL: nothing) when it cannot be encoded (j NULL, out of
 * memory), and drops the caller's reference to j. Returns 0, or -ENOMEM
 * when j's encoding was not printed. */
int k3ctl_json_puts(json_t *j, size_t flags, const char *fallback);

#endif

/*
 * json_fields.h - a struct's plain fields as JSON members, from a table
 * of (key, offset, type): for the replies and reports that list dozens of
 * counters one after another (k3ctl status, k3ctl plan), so each list is
 * data, in output order, instead of a call per line.
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

#endif

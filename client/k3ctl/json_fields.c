/* json_fields.c - see json_fields.h. */
#include "json_fields.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void k3ctl_json_set_fields(json_t *o, const void *obj, const struct k3ctl_json_field *f,
			   size_t n)
{
	static const size_t size_of[] = { sizeof(uint32_t), sizeof(uint64_t), sizeof(double),
					  sizeof(bool) };
	const unsigned char *base = obj;

	for (size_t i = 0; i < n; i++) {
		union { uint32_t u32; uint64_t u64; double f64; bool b; } v;
		enum k3ctl_json_type t = f[i].type;

		if ((unsigned)t >= sizeof(size_of) / sizeof(size_of[0]) || f[i].size != size_of[t]) {
			fprintf(stderr, "k3ctl: JSON field '%s': size %zu does not fit its type\n",
				f[i].key, f[i].size);
			abort();
		}
		memcpy(&v, base + f[i].offset, f[i].size);
		json_object_set_new(o, f[i].key,
				    t == K3CTL_JSON_U32 ? json_integer(v.u32) :
				    t == K3CTL_JSON_U64 ? json_integer((json_int_t)v.u64) :
				    t == K3CTL_JSON_F64 ? json_real(v.f64) : json_boolean(v.b));
	}
}

int k3ctl_json_puts(json_t *j, size_t flags, const char *fallback)
{
	char *s = json_dumps(j, flags);   /* NULL for a NULL j */

	if (s || fallback)
		puts(s ? s : fallback);
	free(s);
	json_decref(j);
	return s ? 0 : -ENOMEM;
}

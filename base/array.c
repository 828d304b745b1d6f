/* array.c - heap arrays that grow by doubling (see array.h). */
#include "base/array.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int k3_array_reserve(void *vp, size_t *cap, size_t need, size_t size, size_t first)
{
	size_t n = *cap ? *cap : first ? first : 1;
	void *v, *nv;

	if (need <= *cap)
		return 0;
	while (n < need)
		n = n > SIZE_MAX / 2 ? need : n * 2;
	if (size && n > SIZE_MAX / size)
		return -ENOMEM;
	/* vp holds some T **: copied as bytes, so no T ** is read as void ** */
	memcpy(&v, vp, sizeof(v));
	nv = realloc(v, n * size);
	if (!nv)
		return -ENOMEM;
	memcpy(vp, &nv, sizeof(nv));
	*cap = n;
	return 0;
}

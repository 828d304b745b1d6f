/*
 * carve.c - one allocation carved into several arrays (carve.h).
 */
#include "base/carve.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

void *k3_carve_part(struct k3_carve *c, size_t n, size_t size)
{
	if (c->used == SIZE_MAX)
		return NULL;
	size_t bytes = n * size;
	size_t at = c->used;
	/* round up to the next part's alignment; a part of 0 bytes still
	 * takes one aligned place so it is distinct and non-NULL */
	size_t step = bytes ? (bytes + K3_CARVE_ALIGN - 1) / K3_CARVE_ALIGN * K3_CARVE_ALIGN : K3_CARVE_ALIGN;
	if ((size && n > SIZE_MAX / size) || bytes > SIZE_MAX - K3_CARVE_ALIGN || step > SIZE_MAX - at - 1) {
		c->used = SIZE_MAX;
		return NULL;
	}
	c->used = at + step;
	return c->block ? (unsigned char *)c->block + at : NULL;
}

bool k3_carve_next(struct k3_carve *c)
{
	if (c->pass++ == 0)
		return true;
	if (c->pass > 2 || c->used == SIZE_MAX)
		return false;
	size_t bytes = c->used ? c->used : K3_CARVE_ALIGN;
	c->block = aligned_alloc(K3_CARVE_ALIGN, bytes);
	if (!c->block)
		return false;
	memset(c->block, 0, bytes);
	c->used = 0;
	return true;
}

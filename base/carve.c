/*
 * carve.c - one allocation carved into several arrays (carve.h).
 */
#include "base/carve.h"

#include <stdint.h>
#include <stdlib.h>

void *k3_carve_part(struct k3_carve *c, size_t n, size_t size)
{
	if (c->used == SIZE_MAX)
		return NULL;
	size_t bytes = n * size;
	size_t at = c->used;
	/* round up to the next part's alignment; a part of 0 bytes still
	 * takes one aligned place so it is distinct and non-NULL */
	size_t step = bytes ? (bytes + K3_CARVE_ALIGN - 1) / K3_CARVE_ALIGN * K3_CARVE_ALIGN : K3_CARVE_ALIGN;
	if ((size && n > SIZE_MAX / size) || bytes > SIZE_MAX - K3_CARVE_ALIGN || step > SIZE_MAX - K3_CARVE_ALIGN - at) {
		c->used = SIZE_MAX;
		return NULL;
	}
	c->used = at + step;
	return c->block ? c->base + at : NULL;
}

bool k3_carve_next(struct k3_carve *c)
{
	if (c->pass++ == 0)
		return true;
	if (c->pass > 2 || c->used == SIZE_MAX)
		return false;
	/* room to round the start up to the alignment; used is a multiple
	 * of it and at most SIZE_MAX - K3_CARVE_ALIGN (k3_carve_part) */
	size_t bytes = (c->used ? c->used : K3_CARVE_ALIGN) + K3_CARVE_ALIGN - 1;
	c->block = calloc(1, bytes);
	if (!c->block)
		return false;
	uintptr_t at = (uintptr_t)c->block;
	c->base = (unsigned char *)c->block + ((K3_CARVE_ALIGN - at % K3_CARVE_ALIGN) % K3_CARVE_ALIGN);
	c->used = 0;
	return true;
}

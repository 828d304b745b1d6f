/*
 * array.h - heap arrays that grow by doubling: the one realloc loop for
 * every table that is filled one element (or one run of bytes) at a time.
 */
#ifndef K3_BASE_ARRAY_H
#define K3_BASE_ARRAY_H

#include <stddef.h>

/*
 * Makes room for need elements of size bytes in the array *vp points to
 * (vp is the address of the array pointer, e.g. &list->v), whose capacity
 * is *cap elements: when need > *cap it reallocs to the first doubling of
 * *cap (of first, when *cap is 0) that holds need. Returns 0, or -ENOMEM
 * (out of memory, or more than SIZE_MAX bytes) with the array and *cap
 * unchanged.
 */
int k3_array_reserve(void *vp, size_t *cap, size_t need, size_t size, size_t first);

#endif

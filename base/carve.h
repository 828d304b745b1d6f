/*
 * carve.h - one allocation carved into several arrays of one lifetime.
 *
 * A struct that owns many arrays sized once (at open) and freed together
 * takes them from one zeroed block: one allocation, one out-of-memory
 * check, one free. The caller lists its parts once, in a loop that runs
 * twice: the first pass (no block yet) only adds up the sizes and hands
 * out NULLs, then the block is allocated and the second pass hands out the
 * parts in the same order:
 *
 *   struct k3_carve k = { 0 };
 *   while (k3_carve_next(&k)) {
 *           K3_CARVE(&k, x->a, n_a);
 *           K3_CARVE(&k, x->b, n_b);
 *   }
 *   x->block = k.block;     NULL: out of memory; free(x->block) frees all
 *
 * Each part starts at a K3_CARVE_ALIGN-byte boundary, so a part is at
 * least as aligned as its own malloc would have been and no two parts share
 * a cache line. The block comes from calloc, not malloc + memset: a large
 * block is fresh zero pages, and a part the caller never touches (a long
 * prefill chunk's rows on a short prompt) costs no resident memory. Arrays
 * that grow later (realloc) do not belong in a block.
 */
#ifndef K3_BASE_CARVE_H
#define K3_BASE_CARVE_H

#include <stdbool.h>
#include <stddef.h>

enum { K3_CARVE_ALIGN = 64 };   /* a cache line: no two parts share one */

struct k3_carve {
	void *block;     /* NULL while measuring; the caller owns it (free()) */
	unsigned char *base;  /* block rounded up to K3_CARVE_ALIGN: parts start here */
	size_t used;     /* bytes handed out (or measured) so far; SIZE_MAX on overflow */
	int pass;        /* passes begun (k3_carve_next) */
};

/*
 * The next part: n elements of size bytes. While measuring returns NULL
 * and only counts; in the second pass returns the part (zeroed). A part
 * of 0 bytes still gets its own (empty) place, so it is never NULL once the
 * block exists.
 */
void *k3_carve_part(struct k3_carve *c, size_t n, size_t size);

/*
 * Drives the two passes over a zeroed struct k3_carve: true to begin the
 * measuring pass; then allocates the zeroed block for what it counted and
 * returns true to begin the second; then false. Also false, with c->block
 * NULL and no part handed out, when the block cannot be had (out of
 * memory, or the sizes overflowed).
 */
bool k3_carve_next(struct k3_carve *c);

/* ptr = the next part of n elements of *ptr's type. */
#define K3_CARVE(c, ptr, n) ((ptr) = k3_carve_part((c), (n), sizeof(*(ptr))))

#endif

/*
 * text_sbuf.h - a growable byte buffer for the text module (internal).
 * Failures are sticky: after an allocation failure every append is a no-op
 * and `oom` stays set, so callers check once at the end.
 */
#ifndef K3_TEXT_SBUF_H
#define K3_TEXT_SBUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

struct k3_sbuf {
	char *p;        /* NUL-terminated when non-NULL */
	size_t n, cap;
	bool oom;
};

static inline void k3_sbuf_release(struct k3_sbuf *b)
{
	free(b->p);
	b->p = NULL;
	b->n = b->cap = 0;
	b->oom = false;
}

static inline bool k3_sbuf_reserve(struct k3_sbuf *b, size_t extra)
{
	size_t cap;
	char *p;

	if (b->oom)
		return false;
	if (b->cap && extra < b->cap - b->n)
		return true;   /* room for extra bytes and the NUL */
	if (extra > ((size_t)1 << 40) - b->n) {
		b->oom = true;
		return false;
	}
	cap = b->cap ? b->cap : 64;
	while (cap < b->n + extra + 1)
		cap *= 2;
	p = realloc(b->p, cap);
	if (!p) {
		b->oom = true;
		return false;
	}
	b->p = p;
	b->cap = cap;
	return true;
}

static inline void k3_sbuf_add(struct k3_sbuf *b, const void *s, size_t n)
{
	if (!k3_sbuf_reserve(b, n))
		return;
	if (n)
		memcpy(b->p + b->n, s, n);
	b->n += n;
	b->p[b->n] = 0;
}

static inline void k3_sbuf_adds(struct k3_sbuf *b, const char *s)
{
	k3_sbuf_add(b, s, strlen(s));
}

static inline void k3_sbuf_addc(struct k3_sbuf *b, char c)
{
	k3_sbuf_add(b, &c, 1);
}

#endif

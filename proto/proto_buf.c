/* proto_buf.c - bounded growable byte buffer (see k3_proto.h). */
#include "k3_proto.h"

#include <stdlib.h>
#include <string.h>

void k3_proto_buf_init(struct k3_proto_buf *b, size_t max)
{
	b->data = NULL;
	b->len = b->cap = 0;
	b->max = max;
}

void k3_proto_buf_release(struct k3_proto_buf *b)
{
	free(b->data);
	b->data = NULL;
	b->len = b->cap = 0;
}

void k3_proto_buf_reset(struct k3_proto_buf *b)
{
	b->len = 0;
}

int k3_proto_buf_append(struct k3_proto_buf *b, const void *p, size_t n)
{
	if (n == 0)
		return 0;
	if (n > b->max || b->len > b->max - n)
		return K3_PROTO_E_NOMEM;
	if (b->len + n > b->cap) {
		size_t cap = b->cap ? b->cap : 256;
		uint8_t *d;

		while (cap < b->len + n)
			cap = cap > b->max / 2 ? b->max : cap * 2;
		d = realloc(b->data, cap);
		if (!d)
			return K3_PROTO_E_NOMEM;
		b->data = d;
		b->cap = cap;
	}
	memcpy(b->data + b->len, p, n);
	b->len += n;
	return 0;
}

void k3_proto_buf_consume(struct k3_proto_buf *b, size_t n)
{
	if (n >= b->len) {
		b->len = 0;
		return;
	}
	memmove(b->data, b->data + n, b->len - n);
	b->len -= n;
}

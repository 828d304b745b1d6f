/*
 * gw_chunked_sim.h - what libevent would read from a connection once
 * k3-gateway's chunked-body check has seen it: the bytes a client sent,
 * given in any number of reads, edited as gw_http.c edits its input
 * buffer after each read (a STRIP cuts a chunk-size line down to its
 * digits, a BAD ends the body where it was cut). Shared by test_chunked.c
 * and the fuzz target fuzz_gateway_chunked.c.
 */
#ifndef K3_TEST_GW_CHUNKED_SIM_H
#define K3_TEST_GW_CHUNKED_SIM_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../client/gateway/gw_chunked.h"

struct chunked_sim {
	struct gw_chunked c;
	char *buf;                 /* what libevent reads */
	size_t len, cap;
	unsigned strips;
	size_t skipped;            /* body bytes counted, not fed (gw_chunked_skip) */
};

static inline void chunked_sim_init(struct chunked_sim *s)
{
	memset(s, 0, sizeof(*s));
	gw_chunked_init(&s->c);
}

static inline void chunked_sim_release(struct chunked_sim *s)
{
	free(s->buf);
}

static inline void chunked_sim_reserve(struct chunked_sim *s, size_t need)
{
	if (need <= s->cap)
		return;
	s->cap = need * 2 + 64;
	s->buf = realloc(s->buf, s->cap);
	if (!s->buf)
		abort();
}

/* Replaces buf[a, b) by z. */
static inline void chunked_sim_edit(struct chunked_sim *s, size_t a, size_t b, const char *z)
{
	size_t zn = strlen(z);

	chunked_sim_reserve(s, s->len - (b - a) + zn);
	memmove(s->buf + a + zn, s->buf + b, s->len - b);
	memcpy(s->buf + a, z, zn);
	s->len = s->len - (b - a) + zn;
}

/* One read of n bytes: appended, then checked and edited like gw_http.c's
 * chunk_input_cb does. */
static inline void chunked_sim_read(struct chunked_sim *s, const char *p, size_t n)
{
	size_t todo = n;

	if (!n)
		return;
	chunked_sim_reserve(s, s->len + n);
	memcpy(s->buf + s->len, p, n);
	s->len += n;
	while (todo && !gw_chunked_passive(&s->c)) {
		struct gw_chunked_verdict v;
		uint64_t opaque = gw_chunked_opaque(&s->c);

		if (opaque) {   /* as the gateway: body bytes counted, not fed */
			size_t k = todo < opaque ? todo : (size_t)opaque;

			gw_chunked_skip(&s->c, k);
			todo -= k;
			s->skipped += k;
			continue;
		}
		size_t r = gw_chunked_feed(&s->c, (const uint8_t *)s->buf + s->len - todo, todo, &v);

		todo -= r;
		if (v.event == GW_CHUNKED_STRIP) {
			size_t end = s->len - todo;

			chunked_sim_edit(s, end - v.line_len + v.digits, end, "\r\n");
			s->strips++;
		} else if (v.event == GW_CHUNKED_BAD) {
			if (v.back <= s->len - todo)
				chunked_sim_edit(s, s->len - todo - v.back, s->len, v.end);
			return;
		}
	}
}

#endif

/*
 * fuzz_gateway_chunked.c - any bytes as what a client sends on one
 * connection, through k3-gateway's chunked-body check
 * (client/gateway/gw_chunked.c) as gw_http.c applies it
 * (tests/gateway/gw_chunked_sim.h). The first byte picks how the rest is
 * split into reads. Properties: no crash, no read past the input; the
 * same verdict and the same bytes for libevent whether the stream is read
 * whole, a byte at a time or in the picked pieces (after a malformed body
 * only up to the end the check gives it, since the rest is never read);
 * and what libevent is given is canonical: checked again, it needs no cut
 * and is not malformed.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../gateway/gw_chunked_sim.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void same(const struct chunked_sim *whole, const struct chunked_sim *s)
{
	if (s->c.n_requests != whole->c.n_requests || s->c.bad_request != whole->c.bad_request ||
	    gw_chunked_passive(&s->c) != gw_chunked_passive(&whole->c) || s->strips != whole->strips)
		abort();
	if (whole->c.bad_request ? s->len < whole->len : s->len != whole->len)
		abort();
	if (whole->len && memcmp(s->buf, whole->buf, whole->len) != 0)
		abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct chunked_sim whole, bytes, pieces, again;
	const char *in = (const char *)data + 1;
	size_t n = size ? size - 1 : 0, step;

	if (!size)
		return 0;
	step = 1 + data[0] % 37;
	chunked_sim_init(&whole);
	chunked_sim_read(&whole, in, n);
	chunked_sim_init(&bytes);
	for (size_t i = 0; i < n; i++)
		chunked_sim_read(&bytes, in + i, 1);
	chunked_sim_init(&pieces);
	for (size_t i = 0; i < n; i += step)
		chunked_sim_read(&pieces, in + i, n - i < step ? n - i : step);
	same(&whole, &bytes);
	same(&whole, &pieces);

	chunked_sim_init(&again);
	chunked_sim_read(&again, whole.buf, whole.len);
	if (again.strips || again.c.bad_request || again.c.n_requests != whole.c.n_requests ||
	    gw_chunked_passive(&again.c) != gw_chunked_passive(&whole.c))
		abort();

	chunked_sim_release(&whole);
	chunked_sim_release(&bytes);
	chunked_sim_release(&pieces);
	chunked_sim_release(&again);
	return 0;
}

/*
 * test_chunked.c - k3-gateway's chunked-body check (client/gateway/
 * gw_chunked.c) on a catalogue of request streams, good and malformed,
 * single and pipelined, each read whole, in every two-read split, byte by
 * byte and in random splits: the verdict (how many requests, which one is
 * malformed) and what libevent then reads (gw_chunked_sim.h) must be the
 * same every time and the ones written here.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gw_chunked_sim.h"
#include "t.h"

#define POST "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" \
	     "Transfer-Encoding: chunked\r\n\r\n"
#define GET "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
#define END "0\r\n\r\n"

struct chunked_case {
	const char *name;
	const char *in;
	size_t in_len;             /* 0: strlen(in) */
	const char *want;          /* what libevent reads; NULL: in unchanged */
	unsigned requests;         /* request heads read */
	unsigned bad;              /* the malformed request (1-based), 0: none */
	bool passive;              /* the check stopped (libevent alone decides) */
};

static const struct chunked_case cases[] = {
	/* well-formed: libevent reads them unchanged, or with the extensions cut */
	{ "one chunk", POST "3\r\nabc\r\n" END, 0, NULL, 1, 0, false },
	{ "LF line ends (libevent reads them)", POST "3\nabc\n0\n\n", 0, NULL, 1, 0, false },
	{ "upper-case hex, leading zeros", POST "00000A\r\n0123456789\r\n" END, 0, NULL, 1, 0, false },
	{ "data that looks like framing", POST "6\r\nzz\r\n\r\n\r\n" END, 0, NULL, 1, 0, false },
	{ "extensions cut to the digits", POST "3;ext=1\r\nabc\r\n0;last\r\n\r\n", 0,
	  POST "3\r\nabc\r\n" END, 1, 0, false },
	{ "blanks and a quoted extension", POST "3 \t;x=\"q;r\"\r\nabc\r\n" END, 0,
	  POST "3\r\nabc\r\n" END, 1, 0, false },
	{ "trailing blank after the size", POST "3 \r\nabc\r\n" END, 0, POST "3\r\nabc\r\n" END, 1, 0, false },
	{ "trailers", POST "3\r\nabc\r\n0\r\nX-Trailer: v\r\nEmpty:\r\nTab:\tv \r\n\r\n", 0, NULL, 1, 0,
	  false },
	{ "pipelined keep-alive", POST "1\r\na\r\n" END GET POST "2;e\r\nbc\r\n" END GET, 0,
	  POST "1\r\na\r\n" END GET POST "2\r\nbc\r\n" END GET, 4, 0, false },
	{ "Content-Length body is not chunked",
	  "POST / HTTP/1.1\r\nContent-Length: 8\r\n\r\nzz\r\nxx\r\n" GET, 0, NULL, 2, 0, false },
	{ "GET with a Content-Length body", "GET / HTTP/1.1\r\nContent-Length: 3\r\n\r\nzz\n" GET, 0, NULL,
	  2, 0, false },
	{ "Content-Length 0", "POST / HTTP/1.1\r\nContent-Length: 0\r\n\r\n" GET, 0, NULL, 2, 0, false },
	{ "header name and value as libevent reads them",
	  "PUT / HTTP/1.0\r\ntransfer-ENCODING:   CHUNKED \t\r\n\r\n1\r\nx\r\n" END, 0, NULL, 1, 0, false },
	{ "the largest chunk size, incomplete", POST "7fffffffffffffff\r\nab", 0, NULL, 1, 0, false },

	/* heads libevent might read otherwise: not checked */
	{ "two codings", "POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\nzz\r\n", 0, NULL, 1, 0,
	  true },
	{ "a tab before the coding", "POST / HTTP/1.1\r\nTransfer-Encoding:\tchunked\r\n\r\nzz\r\n", 0, NULL,
	  1, 0, true },
	{ "Transfer-Encoding twice", "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n"
	  "Transfer-Encoding: chunked\r\n\r\nzz\r\n", 0, NULL, 1, 0, true },
	{ "a folded header", "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n x\r\n\r\nzz\r\n", 0, NULL, 0,
	  0, true },
	{ "HEAD with a body header", "HEAD / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 0, NULL,
	  1, 0, true },
	{ "an unknown method", "BREW / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 0, NULL, 1, 0,
	  true },
	{ "a blank line between requests", GET "\r\n" GET, 0, NULL, 1, 0, true },
	{ "Content-Length with a sign", "POST / HTTP/1.1\r\nContent-Length: +3\r\n\r\nabc", 0, NULL, 1, 0,
	  true },

	/* malformed: libevent reads the body up to the fault, then its end */
	{ "size not hex (zz)", POST "zz\r\nabc\r\n" END, 0, POST END, 1, 1, false },
	{ "size with a bad digit (1G)", POST "1G\r\n{\r\n" END, 0, POST END, 1, 1, false },
	{ "a later chunk", POST "3\r\nabc\r\nzz\r\n" END, 0, POST "3\r\nabc\r\n" END, 1, 1, false },
	{ "negative size", POST "-1\r\n", 0, POST END, 1, 1, false },
	{ "size with a sign", POST "+1\r\nx\r\n" END, 0, POST END, 1, 1, false },
	{ "size with 0x", POST "0x1\r\nx\r\n" END, 0, POST END, 1, 1, false },
	{ "blank before the size", POST " 1\r\nx\r\n" END, 0, POST END, 1, 1, false },
	{ "empty size line", POST "\r\n", 0, POST END, 1, 1, false },
	{ "text after the size", POST "1 x\r\nx\r\n" END, 0, POST END, 1, 1, false },
	{ "control character in an extension", POST "1;\x01\r\nx\r\n" END, 0, POST END, 1, 1, false },
	{ "CR without LF in the size line", POST "1\rx", 0, POST END, 1, 1, false },
	{ "size past 63 bits", POST "8000000000000000\r\n", 0, POST END, 1, 1, false },
	{ "data longer than its size", POST "2\r\nabc\r\n" END, 0, POST "2\r\nab\r\n" END, 1, 1, false },
	{ "data without CRLF, then a size", POST "3\r\nabcXY0\r\n\r\n", 0, POST "3\r\nabc\r\n" END, 1, 1,
	  false },
	{ "CR without LF after the data", POST "3\r\nabc\rX", 0, POST "3\r\nabc\r\n" END, 1, 1, false },
	{ "trailer name with a blank", POST "0\r\nBad Name: v\r\n\r\n", 0, POST "0\r\n\r\n", 1, 1, false },
	{ "folded trailer", POST "0\r\nA: b\r\n c\r\n\r\n", 0, POST "0\r\nA: b\r\n\r\n", 1, 1, false },
	{ "trailer without ':'", POST "0\r\nnocolon\r\n\r\n", 0, POST "0\r\n\r\n", 1, 1, false },
	{ "NUL in a trailer value", POST "0\r\nA: b\0c\r\n\r\n", sizeof(POST "0\r\nA: b\0c\r\n\r\n") - 1,
	  POST "0\r\n\r\n", 1, 1, false },
	{ "CR without LF in a trailer", POST "0\r\nA: b\rc", 0, POST "0\r\n\r\n", 1, 1, false },
	{ "CR without LF at the end", POST "0\r\n\rX", 0, POST "0\r\n\r\n", 1, 1, false },
	{ "the third request of a keep-alive connection",
	  GET POST "1\r\na\r\n" END POST "zz\r\n" END GET, 0, GET POST "1\r\na\r\n" END POST END, 3, 3, false },
};

static unsigned lcg(unsigned long long *s)
{
	*s = *s * 6364136223846793005ull + 1442695040888963407ull;
	return (unsigned)(*s >> 33);
}

/* Reads in through a fresh check in the given reads (cuts: ascending
 * offsets, n of them) and compares with c. */
static void run(const struct chunked_case *c, const char *in, size_t len, const char *want, size_t want_len,
		const size_t *cuts, size_t n, const char *how)
{
	struct chunked_sim s;
	size_t at = 0;
	bool ok;

	chunked_sim_init(&s);
	for (size_t i = 0; i <= n; i++) {
		size_t to = i < n ? cuts[i] : len;

		chunked_sim_read(&s, in + at, to - at);
		at = to;
	}
	/* After a fault, what follows the end libevent is given is never
	 * read (the 400 closes the connection): only the start must match. */
	ok = c->bad ? s.len >= want_len && memcmp(s.buf, want, want_len) == 0
		    : s.len == want_len && memcmp(s.buf, want, want_len) == 0;
	if (!T_OK(ok))
		printf("     %s, read %s: libevent would read %zu bytes: '%.*s'\n", c->name, how, s.len,
		       (int)s.len, s.buf);
	if (!T_OK(s.c.n_requests == c->requests && s.c.bad_request == c->bad &&
		  gw_chunked_passive(&s.c) == c->passive))
		printf("     %s, read %s: %u requests, malformed %u, passive %d\n", c->name, how,
		       s.c.n_requests, s.c.bad_request, gw_chunked_passive(&s.c));
	chunked_sim_release(&s);
}

static void check_case(const struct chunked_case *c, const char *in, size_t len, const char *want,
		       size_t want_len)
{
	unsigned long long seed = 0x9e3779b97f4a7c15ull ^ len;
	size_t cuts[8];
	char how[64];

	run(c, in, len, want, want_len, NULL, 0, "whole");
	for (size_t i = 1; i < len; i++) {
		cuts[0] = i;
		snprintf(how, sizeof(how), "in two at %zu", i);
		run(c, in, len, want, want_len, cuts, 1, how);
	}
	{
		struct chunked_sim s;

		chunked_sim_init(&s);
		for (size_t i = 0; i < len; i++)
			chunked_sim_read(&s, in + i, 1);
		T_OK(s.c.n_requests == c->requests && s.c.bad_request == c->bad);
		T_OK(c->bad ? s.len >= want_len && memcmp(s.buf, want, want_len) == 0
			    : s.len == want_len && memcmp(s.buf, want, want_len) == 0);
		chunked_sim_release(&s);
	}
	for (int k = 0; k < 200 && len > 8; k++) {
		size_t n = 1 + lcg(&seed) % 8, prev = 0;

		for (size_t i = 0; i < n; i++) {
			cuts[i] = prev + lcg(&seed) % (len - prev);
			prev = cuts[i];
		}
		run(c, in, len, want, want_len, cuts, n, "in random pieces");
	}
}

int main(void)
{
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const struct chunked_case *c = &cases[i];
		size_t len = c->in_len ? c->in_len : strlen(c->in);
		const char *want = c->want ? c->want : c->in;
		size_t want_len = c->want ? strlen(c->want) : len;

		check_case(c, c->in, len, want, want_len);
	}

	/* Body bytes are counted, not fed: a Content-Length body and chunk
	 * data that a read starts with pass gw_chunked_skip (byte by byte:
	 * all 8 of them; in one read the feed counts them itself), and the
	 * request after them is still followed. */
	{
		static const char in[] = "POST /v1/x HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello"
					 POST "3\r\nabc\r\n" END;
		struct chunked_sim whole, bytes;

		chunked_sim_init(&whole);
		chunked_sim_init(&bytes);
		chunked_sim_read(&whole, in, sizeof(in) - 1);
		for (size_t i = 0; i + 1 < sizeof(in); i++)
			chunked_sim_read(&bytes, in + i, 1);
		T_EQ_U64(whole.skipped, 0);
		T_EQ_U64(bytes.skipped, 5 + 3);
		T_OK(whole.c.n_requests == 2 && bytes.c.n_requests == 2 && !whole.c.bad_request &&
		     !gw_chunked_passive(&whole.c) && !gw_chunked_passive(&bytes.c));
		chunked_sim_release(&whole);
		chunked_sim_release(&bytes);
	}

	/* The size-line bound: 4096 bytes pass (cut to the digit), 4097 do not. */
	for (size_t line = 4096; line <= 4097; line++) {
		static char in[8192], want[8192];
		struct chunked_case c = { line == 4096 ? "a 4096-byte size line" : "a 4097-byte size line",
					  in, 0, want, 1, line == 4096 ? 0 : 1, false };
		size_t h = strlen(POST);

		memcpy(in, POST "1;", h + 2);
		memset(in + h + 2, 'a', line - 4);
		memcpy(in + h + line - 2, "\r\nx\r\n" END, 11);
		snprintf(want, sizeof(want), "%s", line == 4096 ? POST "1\r\nx\r\n" END : POST END);
		check_case(&c, in, h + line + 8, want, strlen(want));
	}
	return t_done();
}

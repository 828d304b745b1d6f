/*
 * gw_chunked.h - the framing of the HTTP/1.1 requests on one connection,
 * followed byte by byte as they arrive, to find malformed chunked bodies
 * before libevent does (docs/k3-gateway.md, "Headers and framing").
 *
 * libevent 2.1 parses chunked bodies before any gateway code runs and
 * answers a corrupt chunk line with its own HTML 413; it also refuses
 * chunk extensions, which are valid HTTP. gw_http.c feeds every byte a
 * client sends through this checker first: a chunk-size line with an
 * extension (or trailing blanks) is cut down to its digits, and at the
 * first malformed byte the body is ended there, so that libevent hands the
 * request to the gateway, which answers 400 with its JSON error and
 * closes the connection.
 *
 * It mirrors what libevent does with a request head (which requests have
 * a body and how long it is: Transfer-Encoding "chunked", else
 * Content-Length, none for HEAD and TRACE) and checks the body against RFC
 * 9112 section 7.1: chunk-size = 1*HEXDIG, optional chunk extensions after
 * ";", CRLF (or LF alone, as libevent reads lines), chunk data followed by
 * CRLF, the last chunk, then trailer field lines up to an empty line.
 * Where a head is anything libevent might read differently (an unknown
 * method, a repeated or odd Transfer-Encoding or Content-Length, a folded
 * header line) it stops checking that connection and libevent alone
 * decides, as before.
 *
 * Pure: no I/O, no allocation; O(1) state per connection.
 */
#ifndef K3_GW_CHUNKED_H
#define K3_GW_CHUNKED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The longest chunk-size line (digits, extensions, line end) accepted. */
#define GW_CHUNKED_LINE_MAX 4096u

enum gw_chunked_event {
	GW_CHUNKED_NONE,    /* every byte fed was read; nothing to do */
	/* The chunk-size line that just ended carries more than its digits:
	 * keep its first digits bytes, replace the rest of the line (line_len
	 * bytes from its start, which is line_len bytes before the end of
	 * what feed read) by "\r\n". */
	GW_CHUNKED_STRIP,
	/* The body is malformed: cut everything from back bytes before the
	 * end of what feed read (the start of the offending line, or the
	 * offending byte) and append end (NUL-terminated), which completes
	 * the body where it was cut. Every later byte is ignored. */
	GW_CHUNKED_BAD,
};

struct gw_chunked_verdict {
	enum gw_chunked_event event;
	size_t line_len, digits;         /* STRIP */
	size_t back;                     /* BAD */
	const char *end;                 /* BAD */
	const char *why;                 /* BAD: what was wrong, for a person */
};

struct gw_chunked {
	unsigned state;
	unsigned method;                 /* of the request being read */
	unsigned n_te, n_cl;             /* Transfer-Encoding, Content-Length lines */
	bool te_chunked, cl_valid;
	char name[20];                   /* header name being read, lower case */
	unsigned name_len;
	char value[24];                  /* Transfer-Encoding or Content-Length value */
	unsigned value_len;
	bool value_long;
	uint64_t remaining;              /* bytes left of a chunk or a Content-Length body */
	uint64_t size;                   /* chunk size being read */
	size_t line_len;                 /* bytes of the chunk-size line so far */
	unsigned digits, sig_digits;
	bool ext;                        /* the chunk-size line has more than digits */
	uint32_t n_requests;             /* request heads read so far */
	uint32_t bad_request;            /* 1-based index of the malformed one; 0 = none */
	const char *why;
};

void gw_chunked_init(struct gw_chunked *c);

/*
 * Reads p[0..n) of the connection's byte stream (in order, any split).
 * Returns how many bytes it read (n, or fewer when it stops at an event)
 * and fills v: NONE, or the STRIP or BAD that the bytes read so far call
 * for (positions counted back from p + the return value). After STRIP
 * the caller edits and feeds the rest; after BAD every byte is read and
 * ignored.
 */
size_t gw_chunked_feed(struct gw_chunked *c, const uint8_t *p, size_t n, struct gw_chunked_verdict *v);

/*
 * Bytes of a Content-Length body or of chunk data that come next: the
 * check only counts them, so a caller may pass them with gw_chunked_skip
 * (n bytes, at most this many) instead of feeding them. 0 when the next
 * byte must be fed.
 */
uint64_t gw_chunked_opaque(const struct gw_chunked *c);
void gw_chunked_skip(struct gw_chunked *c, uint64_t n);

/* True once the connection has stopped being checked (see above). */
bool gw_chunked_passive(const struct gw_chunked *c);
/* Stops checking (the caller lost track of the stream); a BAD stays. */
void gw_chunked_stop(struct gw_chunked *c);

#endif

/*
 * gw_chunked.c - follows the request framing on one connection and finds
 * malformed chunked bodies (see gw_chunked.h).
 *
 * One state per byte position; chunk data and Content-Length bodies are
 * skipped in bulk. Head lines are read only as far as the framing needs:
 * the method, and the Transfer-Encoding and Content-Length values, with
 * libevent's own reading (a value loses its leading spaces and trailing
 * blanks; a name is everything before ':', matched ignoring case).
 */
#include "gw_chunked.h"

#include <ctype.h>
#include <stdint.h>
#include <string.h>
#include <strings.h>

enum {
	ST_REQ_START,        /* a request line begins */
	ST_METHOD,
	ST_TARGET,
	ST_VERSION,
	ST_HEAD_LF,          /* CR of a head line: LF must follow */
	ST_HDR_START,        /* a header line, or the empty line, begins */
	ST_HDR_NAME,
	ST_HDR_VALUE,
	ST_HEAD_END_LF,      /* CR of the empty line ending the head */
	ST_SKIP,             /* a Content-Length body */
	ST_CSIZE,            /* chunk-size digits (ST_CSIZE..ST_CSIZE_LF: the size line) */
	ST_CBLANK,           /* blanks after the digits */
	ST_CEXT,             /* a chunk extension, after ';' */
	ST_CSIZE_LF,         /* CR of the chunk-size line */
	ST_CDATA,
	ST_CDATA_CR,         /* the CRLF after chunk data */
	ST_CDATA_LF,
	ST_TR_START,         /* a trailer line, or the empty line, begins */
	ST_TR_NAME,
	ST_TR_VALUE,
	ST_TR_LF,            /* CR of a trailer line */
	ST_TR_END_LF,        /* CR of the empty line ending the body */
	ST_PASSIVE,          /* not checking this connection any more */
	ST_BAD,              /* malformed: the rest is ignored */
};

/* Request methods as libevent frames them: HEAD and TRACE never have a
 * body; every other method it knows may (2.1.12 reads one for GET,
 * DELETE, OPTIONS and CONNECT too). */
enum { M_UNKNOWN, M_NO_BODY, M_BODY };

/* What replaces a cut body: the last chunk and the end of the trailers
 * (after chunk data, its CRLF first), or inside the trailers just their
 * end; so that what libevent reads is a well-formed body. */
static const char end_body[] = "0\r\n\r\n";
static const char end_data[] = "\r\n0\r\n\r\n";
static const char end_trailers[] = "\r\n";

void gw_chunked_init(struct gw_chunked *c)
{
	memset(c, 0, sizeof(*c));
	c->state = ST_REQ_START;
}

uint64_t gw_chunked_opaque(const struct gw_chunked *c)
{
	return c->state == ST_SKIP || c->state == ST_CDATA ? c->remaining : 0;
}

void gw_chunked_skip(struct gw_chunked *c, uint64_t n)
{
	if (n > gw_chunked_opaque(c))
		n = gw_chunked_opaque(c);
	c->remaining -= n;
	if (n && !c->remaining)
		c->state = c->state == ST_SKIP ? ST_REQ_START : ST_CDATA_CR;
}

bool gw_chunked_passive(const struct gw_chunked *c)
{
	return c->state == ST_PASSIVE;
}

void gw_chunked_stop(struct gw_chunked *c)
{
	if (c->state != ST_BAD)
		c->state = ST_PASSIVE;
}

static bool is_tchar(uint8_t b)
{
	return (b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z') || (b >= '0' && b <= '9') ||
	       (b && strchr("!#$%&'*+-.^_`|~", b));
}

/* isxdigit is the same in every locale (C11 7.4.1.12): 0-9, a-f, A-F. */
static int hex_value(uint8_t b)
{
	if (!isxdigit(b))
		return -1;
	return b <= '9' ? b - '0' : (b | 0x20) - 'a' + 10;
}

static unsigned method_kind(const char *m, size_t n)
{
	static const char *const body[] = { "GET", "POST", "PUT", "DELETE", "OPTIONS", "CONNECT", "PATCH" };

	if ((n == 4 && memcmp(m, "HEAD", 4) == 0) || (n == 5 && memcmp(m, "TRACE", 5) == 0))
		return M_NO_BODY;
	for (size_t i = 0; i < sizeof(body) / sizeof(body[0]); i++)
		if (strlen(body[i]) == n && memcmp(m, body[i], n) == 0)
			return M_BODY;
	return M_UNKNOWN;
}

/* A head line ended: take what the framing needs from it. */
static void header_done(struct gw_chunked *c)
{
	bool te = c->name_len == 17 && memcmp(c->name, "transfer-encoding", 17) == 0;
	bool cl = c->name_len == 14 && memcmp(c->name, "content-length", 14) == 0;
	unsigned n = c->value_len;

	if (!te && !cl)
		return;
	while (n && (c->value[n - 1] == ' ' || c->value[n - 1] == '\t'))
		n--;
	if (te) {
		c->n_te++;
		c->te_chunked = !c->value_long && n == 7 && strncasecmp(c->value, "chunked", 7) == 0;
		return;
	}
	c->n_cl++;
	c->cl_valid = !c->value_long && n > 0 && n <= 18;
	c->remaining = 0;
	for (unsigned i = 0; i < n && c->cl_valid; i++) {
		if (c->value[i] < '0' || c->value[i] > '9')
			c->cl_valid = false;
		else
			c->remaining = c->remaining * 10 + (uint64_t)(c->value[i] - '0');
	}
}

/* The empty line ended the head: where is the body, if any? */
static unsigned head_done(struct gw_chunked *c)
{
	c->n_requests++;
	if (c->method == M_UNKNOWN || c->n_te > 1 || c->n_cl > 1)
		return ST_PASSIVE;
	if (c->method == M_NO_BODY)
		return c->n_te || c->n_cl ? ST_PASSIVE : ST_REQ_START;
	if (c->n_te) {
		if (!c->te_chunked)
			return ST_PASSIVE;   /* libevent would go by Content-Length */
		c->line_len = c->digits = 0;
		c->size = 0;
		c->ext = false;
		return ST_CSIZE;
	}
	if (c->n_cl)
		return !c->cl_valid ? ST_PASSIVE : c->remaining ? ST_SKIP : ST_REQ_START;
	return ST_REQ_START;
}

static size_t bad(struct gw_chunked *c, struct gw_chunked_verdict *v, size_t read, size_t back,
		  const char *end, const char *why)
{
	c->state = ST_BAD;
	c->bad_request = c->n_requests;
	c->why = why;
	v->event = GW_CHUNKED_BAD;
	v->back = back;
	v->end = end;
	v->why = why;
	return read;
}

/* The chunk-size line ended (its LF was read, the read-th byte). */
static size_t size_line_done(struct gw_chunked *c, struct gw_chunked_verdict *v, size_t read)
{
	c->state = c->size ? ST_CDATA : ST_TR_START;
	c->remaining = c->size;
	if (!c->ext)
		return 0;
	v->event = GW_CHUNKED_STRIP;
	v->line_len = c->line_len;
	v->digits = c->digits;
	return read;
}

size_t gw_chunked_feed(struct gw_chunked *c, const uint8_t *p, size_t n, struct gw_chunked_verdict *v)
{
	size_t i, r;

	memset(v, 0, sizeof(*v));
	for (i = 0; i < n; i++) {
		uint8_t b = p[i];

		if (c->state >= ST_CSIZE && c->state <= ST_CSIZE_LF && ++c->line_len > GW_CHUNKED_LINE_MAX)
			return bad(c, v, i + 1, c->line_len, end_body, "a chunk-size line longer than 4096 bytes");
		switch (c->state) {
		case ST_PASSIVE:
		case ST_BAD:
			return n;
		case ST_REQ_START:
			c->method = M_UNKNOWN;
			c->n_te = c->n_cl = 0;
			c->te_chunked = c->cl_valid = false;
			c->name_len = 0;
			c->state = ST_METHOD;
			/* fall through */
		case ST_METHOD:
			if (b == ' ') {
				c->method = method_kind(c->name, c->name_len);
				c->state = ST_TARGET;
			} else if (b >= 'A' && b <= 'Z' && c->name_len < sizeof(c->name)) {
				c->name[c->name_len++] = (char)b;
			} else {
				c->state = ST_PASSIVE;   /* not a method libevent knows */
			}
			break;
		case ST_TARGET:
			if (b == ' ')
				c->state = ST_VERSION;
			else if (b == '\r' || b == '\n' || b == 0)
				c->state = ST_PASSIVE;
			break;
		case ST_VERSION:
			if (b == '\r')
				c->state = ST_HEAD_LF;
			else if (b == '\n')
				c->state = ST_HDR_START;
			else if (b == 0)
				c->state = ST_PASSIVE;
			break;
		case ST_HEAD_LF:
			/* a bare CR inside a head line: libevent keeps it in the line */
			c->state = b == '\n' ? ST_HDR_START : ST_PASSIVE;
			break;
		case ST_HDR_START:
			if (b == '\r') {
				c->state = ST_HEAD_END_LF;
				break;
			}
			if (b == '\n') {
				c->state = head_done(c);
				break;
			}
			if (b == ' ' || b == '\t' || b == 0) {
				c->state = ST_PASSIVE;   /* a folded line continues the last value */
				break;
			}
			c->name_len = 0;
			c->state = ST_HDR_NAME;
			/* fall through */
		case ST_HDR_NAME:
			if (b == ':') {
				c->value_len = 0;
				c->value_long = false;
				c->state = ST_HDR_VALUE;
			} else if (b == '\r' || b == '\n' || b == 0) {
				c->state = ST_PASSIVE;   /* libevent refuses the head */
			} else if (c->name_len < sizeof(c->name)) {
				c->name[c->name_len++] = (char)(b >= 'A' && b <= 'Z' ? b + 32 : b);
			} else {
				c->name_len = UINT8_MAX;   /* longer than any name we need */
			}
			break;
		case ST_HDR_VALUE:
			if (b == '\r' || b == '\n') {
				header_done(c);
				c->state = b == '\r' ? ST_HEAD_LF : ST_HDR_START;
			} else if (b == 0) {
				c->state = ST_PASSIVE;
			} else if (b == ' ' && c->value_len == 0) {
				/* libevent drops leading spaces (not tabs) */
			} else if (c->value_len < sizeof(c->value)) {
				c->value[c->value_len++] = (char)b;
			} else {
				c->value_long = true;
			}
			break;
		case ST_HEAD_END_LF:
			c->state = b == '\n' ? head_done(c) : ST_PASSIVE;
			break;
		case ST_SKIP:
		case ST_CDATA:
			/* a Content-Length body or chunk data: in bulk */
			r = n - i < c->remaining ? n - i : (size_t)c->remaining;
			gw_chunked_skip(c, r);
			i += r - 1;
			break;
		case ST_CSIZE:
			if (hex_value(b) >= 0) {
				if (c->size >> 59)
					return bad(c, v, i + 1, c->line_len, end_body,
						   "a chunk size that does not fit in 63 bits");
				c->size = c->size << 4 | (uint64_t)hex_value(b);
				c->digits++;
				break;
			}
			if (!c->digits)
				return bad(c, v, i + 1, c->line_len, end_body,
					   "a chunk size that is not a hexadecimal number");
			if (b == ';' || b == ' ' || b == '\t') {
				c->ext = true;
				c->state = b == ';' ? ST_CEXT : ST_CBLANK;
			} else if (b == '\r') {
				c->state = ST_CSIZE_LF;
			} else if (b == '\n') {
				if ((r = size_line_done(c, v, i + 1)))
					return r;
			} else {
				return bad(c, v, i + 1, c->line_len, end_body,
					   "a chunk size that is not a hexadecimal number");
			}
			break;
		case ST_CBLANK:
		case ST_CEXT:
			if (b == '\r') {
				c->state = ST_CSIZE_LF;
			} else if (b == '\n') {
				if ((r = size_line_done(c, v, i + 1)))
					return r;
			} else if (c->state == ST_CBLANK && b == ';') {
				c->state = ST_CEXT;
			} else if (c->state == ST_CBLANK ? b != ' ' && b != '\t'
							 : (b < 0x20 && b != '\t') || b == 0x7f) {
				return bad(c, v, i + 1, c->line_len, end_body,
					   c->state == ST_CBLANK ? "text after a chunk size that is not a ';' extension"
								 : "a control character in a chunk extension");
			}
			break;
		case ST_CSIZE_LF:
			if (b != '\n')
				return bad(c, v, i + 1, c->line_len, end_body, "a CR without LF in a chunk-size line");
			if ((r = size_line_done(c, v, i + 1)))
				return r;
			break;
		case ST_CDATA_CR:
			if (b == '\r' || b == '\n') {
				c->state = b == '\r' ? ST_CDATA_LF : ST_CSIZE;
				c->line_len = c->digits = 0;
				c->size = 0;
				c->ext = false;
				break;
			}
			return bad(c, v, i + 1, 1, end_data, "chunk data longer than its chunk size");
		case ST_CDATA_LF:
			if (b != '\n')
				return bad(c, v, i + 1, 2, end_data, "a CR without LF after chunk data");
			c->state = ST_CSIZE;
			break;
		case ST_TR_START:
			c->line_len = 1;
			if (b == '\r') {
				c->state = ST_TR_END_LF;
				break;
			}
			if (b == '\n') {
				c->state = ST_REQ_START;
				break;
			}
			if (!is_tchar(b))
				return bad(c, v, i + 1, 1, end_trailers,
					   b == ' ' || b == '\t' ? "a folded trailer line"
								 : "a trailer line without a field name");
			c->state = ST_TR_NAME;
			break;
		case ST_TR_NAME:
			c->line_len++;
			if (b == ':')
				c->state = ST_TR_VALUE;
			else if (!is_tchar(b))
				return bad(c, v, i + 1, c->line_len, end_trailers,
					   "a trailer line without ':' after its field name");
			break;
		case ST_TR_VALUE:
			c->line_len++;
			if (b == '\r')
				c->state = ST_TR_LF;
			else if (b == '\n')
				c->state = ST_TR_START;
			else if ((b < 0x20 && b != '\t') || b == 0x7f)
				return bad(c, v, i + 1, c->line_len, end_trailers,
					   "a control character in a trailer value");
			break;
		case ST_TR_LF:
			c->line_len++;
			if (b != '\n')
				return bad(c, v, i + 1, c->line_len, end_trailers, "a CR without LF in a trailer line");
			c->state = ST_TR_START;
			break;
		case ST_TR_END_LF:
			if (b != '\n')
				return bad(c, v, i + 1, 2, end_trailers, "a CR without LF at the end of the trailers");
			c->state = ST_REQ_START;
			break;
		}
	}
	return n;
}

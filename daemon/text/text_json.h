/*
 * text_json.h - Python `json.dumps` and `str()` for values parsed by
 * jansson, byte for byte, because the K3 renderer feeds their output to the
 * tokenizer (docs/text-and-draft.md §3.6): ensure_ascii=False, escapes for
 * `"`, backslash, \n \r \t \b \f and other C0 controls as \u00xx (lower-case
 * hex), no escape for `/`, DEL or U+2028/2029; integers exact; floats as
 * Python repr (shortest round-trip digits; exponent form below 1e-4 and from
 * 1e16, e.g. 1e-05, 1e+16, 1.5).
 *
 * Strings and object keys are written with their lengths, so a U+0000 in
 * them comes out as \u0000 rather than ending the string.
 *
 * Known divergence: jansson cannot hold NaN/Infinity or integers outside
 * int64, which Python's json accepts, nor decode a key holding \u0000;
 * such input fails to parse earlier.
 */
#ifndef K3_TEXT_JSON_H
#define K3_TEXT_JSON_H

#include <stdbool.h>

#include <jansson.h>

#include "text/text_sbuf.h"

enum k3_pyjson_flags {
	K3_PYJSON_COMPACT = 1 << 0,   /* separators (",", ":"); else (", ", ": ") */
	K3_PYJSON_SORT_KEYS = 1 << 1, /* keys sorted by code point at every level */
};

/* Appends json.dumps(v) to b. Returns 0, or -EINVAL for nesting deeper than
 * K3_LIM_JSON_DEPTH. Allocation failure shows as b->oom. */
int k3_pyjson_dump(const json_t *v, unsigned flags, struct k3_sbuf *b);

/* Appends Python str() of a JSON scalar: strings raw, integers decimal,
 * reals as repr, true/false/null as True/False/None. Containers → -EINVAL
 * (their Python str() is a repr the renderer never needs). */
int k3_pyjson_str(const json_t *v, struct k3_sbuf *b);

/* Python truthiness of a JSON value (null, false, 0, 0.0, "", [], {} are
 * false). NULL is false. */
bool k3_pyjson_truthy(const json_t *v);

/* Appends Python repr(float) of x (finite or not: nan, inf). */
void k3_pyjson_float_repr(double x, struct k3_sbuf *b);

#endif

/*
 * proto_msg.c - schema-driven payload codec (the tables are in
 * proto_schema.c) and whole-frame decoding. Decoding work is bounded by the
 * payload length: each tag may appear once (STRV up to its count), so a
 * payload holds at most as many fields as its schema has slots.
 *
 * Files of proto/ depend in one direction: proto_err <- proto_schema <-
 * proto_frame <- proto_msg (the frame splitter needs only the schema's
 * bounds; encoding a message needs the header encoder).
 */
#include "proto_internal.h"
#include "proto_schema.h"

#include <stddef.h>
#include <string.h>

static const struct k3_proto_field_desc *field_find(const struct k3_proto_msg_desc *m, uint16_t tag)
{
	for (size_t i = 0; i < m->n_fields; i++)
		if (m->fields[i].tag == tag)
			return &m->fields[i];
	return NULL;
}

/* Checks one field value against its descriptor and stores it in body. */
static int field_decode(const struct k3_proto_msg_desc *m, const struct k3_proto_field_desc *f,
			const uint8_t *v, uint32_t len, uint8_t *body,
			struct k3_proto_err *err)
{
	bool *has = (bool *)(body + f->has_off);
	void *dst = body + f->off;
	size_t want = 0;

	if (*has && f->kind != K3_PROTO_STRV)
		return k3_proto_fail(err, K3_PROTO_E_DUPLICATE_FIELD, "%s: field '%s' appears twice",
				     m->name, f->name);
	switch (f->kind) {
	case K3_PROTO_U32: want = 4; break;
	case K3_PROTO_U64: want = 8; break;
	case K3_PROTO_F64: want = 8; break;
	case K3_PROTO_BOOL: want = 1; break;
	default: break;
	}
	if (want && len != want)
		return k3_proto_fail(err, K3_PROTO_E_FIELD_SIZE, "%s: field '%s' has %u bytes, expected %zu",
				     m->name, f->name, len, want);
	switch (f->kind) {
	case K3_PROTO_U32:
		*(uint32_t *)dst = k3_proto_rd32(v);
		break;
	case K3_PROTO_U64:
		*(uint64_t *)dst = k3_proto_rd64(v);
		break;
	case K3_PROTO_F64: {
		uint64_t bits = k3_proto_rd64(v);
		memcpy(dst, &bits, sizeof(bits));
		break;
	}
	case K3_PROTO_BOOL:
		if (v[0] > 1)
			return k3_proto_fail(err, K3_PROTO_E_BAD_VALUE, "%s: field '%s' is %u, not a boolean",
					     m->name, f->name, v[0]);
		*(bool *)dst = v[0];
		break;
	case K3_PROTO_STR:
	case K3_PROTO_BYTES: {
		struct k3_proto_str *s = dst;

		if (len > f->bound)
			return k3_proto_fail(err, K3_PROTO_E_TOO_LONG, "%s: field '%s' has %u bytes, limit %u",
					     m->name, f->name, len, f->bound);
		if (f->kind == K3_PROTO_STR && !k3_proto_utf8_valid(v, len))
			return k3_proto_fail(err, K3_PROTO_E_BAD_UTF8, "%s: field '%s' is not valid UTF-8",
					     m->name, f->name);
		s->p = (const char *)v;
		s->len = len;
		break;
	}
	case K3_PROTO_IDS:
	case K3_PROTO_U64S: {
		uint32_t w = f->kind == K3_PROTO_IDS ? 4 : 8;

		if (len % w)
			return k3_proto_fail(err, K3_PROTO_E_FIELD_SIZE,
					     "%s: field '%s' has %u bytes, not a multiple of %u",
					     m->name, f->name, len, w);
		if (len / w > f->bound)
			return k3_proto_fail(err, K3_PROTO_E_TOO_LONG, "%s: field '%s' has %u %s, limit %u",
					     m->name, f->name, len / w, w == 4 ? "ids" : "values", f->bound);
		if (f->kind == K3_PROTO_IDS) {
			struct k3_proto_ids *ids = dst;

			ids->n = len / w;
			ids->v = NULL;
			ids->le = v;
		} else {
			struct k3_proto_u64s *a = dst;

			a->n = len / w;
			a->v = NULL;
			a->le = v;
		}
		break;
	}
	case K3_PROTO_STRV: {
		struct k3_proto_strv *sv = dst;

		if (sv->n >= f->bound)
			return k3_proto_fail(err, K3_PROTO_E_TOO_MANY, "%s: field '%s' repeats more than %u times",
					     m->name, f->name, f->bound);
		if (len > K3_LIM_STOP_BYTES)
			return k3_proto_fail(err, K3_PROTO_E_TOO_LONG, "%s: field '%s' entry has %u bytes, limit %u",
					     m->name, f->name, len, K3_LIM_STOP_BYTES);
		if (!k3_proto_utf8_valid(v, len))
			return k3_proto_fail(err, K3_PROTO_E_BAD_UTF8, "%s: field '%s' is not valid UTF-8",
					     m->name, f->name);
		sv->v[sv->n].p = (const char *)v;
		sv->v[sv->n].len = len;
		sv->n++;
		break;
	}
	default:
		return k3_proto_fail(err, K3_PROTO_E_BAD_VALUE, "%s: field '%s' has no kind", m->name, f->name);
	}
	*has = true;
	return 0;
}

int k3_proto_decode(uint32_t type, const uint8_t *payload, size_t len, void *body,
		    struct k3_proto_err *err)
{
	const struct k3_proto_msg_desc *m = k3_proto_schema_msg(type);
	size_t pos = 0;
	int r;

	if (!m)
		return k3_proto_fail(err, K3_PROTO_E_UNKNOWN_TYPE, "unknown message type %u", type);
	if (len > m->payload_max)
		return k3_proto_fail(err, K3_PROTO_E_OVERSIZED, "%s: payload of %zu bytes exceeds the limit of %u",
				     m->name, len, m->payload_max);
	memset(body, 0, m->size);
	while (pos < len) {
		uint16_t tag;
		uint32_t flen;
		const struct k3_proto_field_desc *f;

		if (len - pos < K3_PROTO_FIELD_HEADER)
			return k3_proto_fail(err, K3_PROTO_E_TRAILING, "%s: %zu trailing bytes after the last field",
					     m->name, len - pos);
		tag = k3_proto_rd16(payload + pos);
		flen = k3_proto_rd32(payload + pos + 2);
		pos += K3_PROTO_FIELD_HEADER;
		if (flen > len - pos)
			return k3_proto_fail(err, K3_PROTO_E_FIELD_OVERRUN,
					     "%s: field %u claims %u bytes but %zu remain",
					     m->name, tag, flen, len - pos);
		f = field_find(m, tag);
		if (!f)
			return k3_proto_fail(err, K3_PROTO_E_UNKNOWN_FIELD, "%s: unknown field tag %u",
					     m->name, tag);
		r = field_decode(m, f, payload + pos, flen, body, err);
		if (r < 0)
			return r;
		pos += flen;
	}
	for (size_t i = 0; i < m->n_fields; i++) {
		const struct k3_proto_field_desc *f = &m->fields[i];

		if (f->required && !*(const bool *)((const uint8_t *)body + f->has_off))
			return k3_proto_fail(err, K3_PROTO_E_MISSING_FIELD, "%s: required field '%s' is missing",
					     m->name, f->name);
	}
	return 0;
}

/* ---- encoder ---------------------------------------------------------- */

static int put_field(struct k3_proto_buf *out, uint16_t tag, const void *v, uint32_t len)
{
	uint8_t h[K3_PROTO_FIELD_HEADER];
	int r;

	k3_proto_wr16(h, tag);
	k3_proto_wr32(h + 2, len);
	r = k3_proto_buf_append(out, h, sizeof(h));
	if (r == 0)
		r = k3_proto_buf_append(out, v, len);
	return r;
}

static int put_str(struct k3_proto_buf *out, const struct k3_proto_msg_desc *m,
		   const struct k3_proto_field_desc *f, const struct k3_proto_str *s,
		   uint32_t bound, bool utf8, struct k3_proto_err *err)
{
	if (s->len > bound)
		return k3_proto_fail(err, K3_PROTO_E_TOO_LONG, "%s: field '%s' has %u bytes, limit %u",
				     m->name, f->name, s->len, bound);
	if (s->len && !s->p)
		return k3_proto_fail(err, K3_PROTO_E_BAD_VALUE, "%s: field '%s' has no data",
				     m->name, f->name);
	if (utf8 && !k3_proto_utf8_valid(s->p, s->len))
		return k3_proto_fail(err, K3_PROTO_E_BAD_UTF8, "%s: field '%s' is not valid UTF-8",
				     m->name, f->name);
	return put_field(out, f->tag, s->p ? s->p : "", s->len);
}

static int field_encode(struct k3_proto_buf *out, const struct k3_proto_msg_desc *m,
			const struct k3_proto_field_desc *f, const uint8_t *body,
			struct k3_proto_err *err)
{
	const void *src = body + f->off;
	uint8_t tmp[8];

	switch (f->kind) {
	case K3_PROTO_U32:
		k3_proto_wr32(tmp, *(const uint32_t *)src);
		return put_field(out, f->tag, tmp, 4);
	case K3_PROTO_U64:
		k3_proto_wr64(tmp, *(const uint64_t *)src);
		return put_field(out, f->tag, tmp, 8);
	case K3_PROTO_F64: {
		uint64_t bits;

		memcpy(&bits, src, sizeof(bits));
		k3_proto_wr64(tmp, bits);
		return put_field(out, f->tag, tmp, 8);
	}
	case K3_PROTO_BOOL:
		tmp[0] = *(const bool *)src ? 1 : 0;
		return put_field(out, f->tag, tmp, 1);
	case K3_PROTO_STR:
	case K3_PROTO_BYTES:
		return put_str(out, m, f, src, f->bound, f->kind == K3_PROTO_STR, err);
	case K3_PROTO_IDS:
	case K3_PROTO_U64S: {
		/* Both array kinds start with n and the source pointers. */
		const struct k3_proto_ids *ids = src;
		const struct k3_proto_u64s *a = src;
		bool wide = f->kind == K3_PROTO_U64S;
		uint32_t n = wide ? a->n : ids->n, w = wide ? 8 : 4;
		bool data = wide ? a->v || a->le : ids->v || ids->le;
		uint8_t h[K3_PROTO_FIELD_HEADER];
		int r;

		if (n > f->bound)
			return k3_proto_fail(err, K3_PROTO_E_TOO_LONG, "%s: field '%s' has %u %s, limit %u",
					     m->name, f->name, n, wide ? "values" : "ids", f->bound);
		if (n && !data)
			return k3_proto_fail(err, K3_PROTO_E_BAD_VALUE, "%s: field '%s' has no data",
					     m->name, f->name);
		k3_proto_wr16(h, f->tag);
		k3_proto_wr32(h + 2, n * w);
		r = k3_proto_buf_append(out, h, sizeof(h));
		for (uint32_t i = 0; r == 0 && i < n; i++) {
			if (wide)
				k3_proto_wr64(tmp, k3_proto_u64s_at(a, i));
			else
				k3_proto_wr32(tmp, k3_proto_ids_at(ids, i));
			r = k3_proto_buf_append(out, tmp, w);
		}
		return r;
	}
	case K3_PROTO_STRV: {
		const struct k3_proto_strv *sv = src;
		int r = 0;

		if (sv->n > f->bound)
			return k3_proto_fail(err, K3_PROTO_E_TOO_MANY, "%s: field '%s' repeats more than %u times",
					     m->name, f->name, f->bound);
		for (uint32_t i = 0; r == 0 && i < sv->n; i++)
			r = put_str(out, m, f, &sv->v[i], K3_LIM_STOP_BYTES, true, err);
		return r;
	}
	default:
		return k3_proto_fail(err, K3_PROTO_E_BAD_VALUE, "%s: field '%s' has no kind", m->name, f->name);
	}
}

int k3_proto_encode(struct k3_proto_buf *out, uint32_t type, uint32_t request_id,
		    const void *body, struct k3_proto_err *err)
{
	const struct k3_proto_msg_desc *m = k3_proto_schema_msg(type);
	struct k3_proto_header h = { K3_PROTO_MAGIC, K3_PROTO_VERSION, (uint16_t)type, 0, 0, request_id, 0 };
	uint8_t hdr[K3_PROTO_HEADER_SIZE] = { 0 };
	size_t start = out->len, plen = 0;
	int r;

	if (!m)
		return k3_proto_fail(err, K3_PROTO_E_UNKNOWN_TYPE, "unknown message type %u", type);
	r = k3_proto_buf_append(out, hdr, sizeof(hdr));
	for (size_t i = 0; r == 0 && i < m->n_fields; i++) {
		const struct k3_proto_field_desc *f = &m->fields[i];

		if (!*(const bool *)((const uint8_t *)body + f->has_off)) {
			if (f->required)
				r = k3_proto_fail(err, K3_PROTO_E_MISSING_FIELD,
						  "%s: required field '%s' is missing", m->name, f->name);
			continue;
		}
		r = field_encode(out, m, f, body, err);
	}
	if (r == K3_PROTO_E_NOMEM && (!err || err->code != K3_PROTO_E_NOMEM))
		k3_proto_fail(err, r, "%s: frame does not fit the output buffer", m->name);
	if (r == 0) {
		plen = out->len - start - K3_PROTO_HEADER_SIZE;
		if (plen > m->payload_max)
			r = k3_proto_fail(err, K3_PROTO_E_OVERSIZED,
					  "%s: payload of %zu bytes exceeds the limit of %u",
					  m->name, plen, m->payload_max);
	}
	if (r < 0) {
		out->len = start;
		return r;
	}
	h.length = (uint32_t)plen;
	k3_proto_header_encode(&h, out->data + start);
	return 0;
}

int k3_proto_frame_decode(const uint8_t *buf, size_t len, struct k3_proto_header *h,
			  union k3_proto_body *body, struct k3_proto_err *err)
{
	const uint8_t *payload = NULL;
	int n = k3_proto_frame_split(buf, len, h, &payload, err);

	if (n < 0)
		return n;
	if (n == 0)
		return k3_proto_fail(err, K3_PROTO_E_TRUNCATED, "frame truncated after %zu bytes", len);
	if ((size_t)n != len)
		return k3_proto_fail(err, K3_PROTO_E_TRAILING, "%zu bytes after the end of the frame",
				     len - (size_t)n);
	return k3_proto_decode(h->type, payload, h->length, body, err);
}

/* proto_frame.c - frame header codec and stream splitting (see k3_proto.h). */
#include "proto_internal.h"
#include "proto_schema.h"

_Static_assert(K3_PROTO_HEADER_SIZE == 4 + 2 + 2 + 2 + 2 + 4 + 4, "header layout");

#define rd16 k3_proto_rd16
#define rd32 k3_proto_rd32
#define wr16 k3_proto_wr16
#define wr32 k3_proto_wr32
#define fail k3_proto_fail

void k3_proto_header_encode(const struct k3_proto_header *h, uint8_t out[K3_PROTO_HEADER_SIZE])
{
	wr32(out, h->magic);
	wr16(out + 4, h->version);
	wr16(out + 6, h->type);
	wr16(out + 8, h->flags);
	wr16(out + 10, h->reserved);
	wr32(out + 12, h->request_id);
	wr32(out + 16, h->length);
}

int k3_proto_frame_split(const uint8_t *buf, size_t len, struct k3_proto_header *h,
			 const uint8_t **payload, struct k3_proto_err *err)
{
	uint32_t max;

	/* Refuse garbage as soon as the magic can be judged, so a peer
	 * speaking another protocol is not left waiting for 20 bytes. */
	for (size_t i = 0; i < len && i < 4; i++)
		if (buf[i] != (uint8_t)(K3_PROTO_MAGIC >> (8 * i)))
			return fail(err, K3_PROTO_E_BAD_MAGIC, "bad magic: not a k3 protocol frame");
	if (len < K3_PROTO_HEADER_SIZE)
		return 0;
	h->magic = rd32(buf);
	h->version = rd16(buf + 4);
	h->type = rd16(buf + 6);
	h->flags = rd16(buf + 8);
	h->reserved = rd16(buf + 10);
	h->request_id = rd32(buf + 12);
	h->length = rd32(buf + 16);
	if (h->version != K3_PROTO_VERSION)
		return fail(err, K3_PROTO_E_BAD_VERSION,
			    "protocol version %u is not supported (this peer speaks %u)",
			    h->version, K3_PROTO_VERSION);
	max = k3_proto_type_payload_max(h->type);
	if (max == 0)
		return fail(err, K3_PROTO_E_UNKNOWN_TYPE, "unknown message type %u", h->type);
	if (h->flags != 0)
		return fail(err, K3_PROTO_E_BAD_FLAGS, "%s: unknown flags 0x%x",
			    k3_proto_type_name(h->type), h->flags);
	if (h->reserved != 0)
		return fail(err, K3_PROTO_E_RESERVED, "%s: reserved header field is 0x%x, not 0",
			    k3_proto_type_name(h->type), h->reserved);
	if (h->length > max)
		return fail(err, K3_PROTO_E_OVERSIZED, "%s: payload of %u bytes exceeds the limit of %u",
			    k3_proto_type_name(h->type), h->length, max);
	if (len - K3_PROTO_HEADER_SIZE < h->length)
		return 0;
	*payload = buf + K3_PROTO_HEADER_SIZE;
	return (int)(K3_PROTO_HEADER_SIZE + h->length);
}

/*
 * proto_schema.h - the message schema as tables (one descriptor per
 * message and per field), generated from K3_PROTO_MESSAGES and
 * K3_PROTO_FIELDS_* in k3_proto.h, so the decoder, the encoder, the frame
 * splitter and the C structs cannot drift apart. Internal to proto/.
 */
#ifndef K3_PROTO_SCHEMA_H
#define K3_PROTO_SCHEMA_H

#include <stddef.h>
#include <stdint.h>

#include "k3_proto.h"

struct k3_proto_field_desc {
	uint16_t tag;
	uint8_t kind;         /* enum k3_proto_kind */
	uint8_t required;
	uint32_t bound;       /* bytes (STR/BYTES) or count (IDS/U64S/STRV) */
	size_t off, has_off;  /* offsets of the value and of has_<name> */
	const char *name;
};

struct k3_proto_msg_desc {
	const char *name;
	uint32_t payload_max;
	size_t size;          /* sizeof the message struct */
	const struct k3_proto_field_desc *fields;
	size_t n_fields;
};

/* The descriptor of a message type, or NULL for an unknown type. */
const struct k3_proto_msg_desc *k3_proto_schema_msg(uint32_t type);

#endif

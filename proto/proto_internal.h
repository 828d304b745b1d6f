/* proto_internal.h - helpers shared by the proto/ sources; not installed. */
#ifndef K3_PROTO_INTERNAL_H
#define K3_PROTO_INTERNAL_H

#include "k3_proto.h"

/* Writes code and a formatted message into err (may be NULL); returns code. */
int k3_proto_fail(struct k3_proto_err *err, int code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static inline uint16_t k3_proto_rd16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static inline uint32_t k3_proto_rd32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t k3_proto_rd64(const uint8_t *p)
{
	return (uint64_t)k3_proto_rd32(p) | (uint64_t)k3_proto_rd32(p + 4) << 32;
}
static inline void k3_proto_wr16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static inline void k3_proto_wr32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); p[2] = (uint8_t)(v >> 16); p[3] = (uint8_t)(v >> 24);
}
static inline void k3_proto_wr64(uint8_t *p, uint64_t v)
{
	k3_proto_wr32(p, (uint32_t)v);
	k3_proto_wr32(p + 4, (uint32_t)(v >> 32));
}

#endif

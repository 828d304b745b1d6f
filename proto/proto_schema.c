/* proto_schema.c - the schema tables and the queries on them (see proto_schema.h). */
#include "proto_schema.h"

#define FIELD_ROW_(m, tag, KIND, fname, bound, req) \
	{ tag, K3_PROTO_##KIND, req, bound, offsetof(struct k3_msg_##m, fname), \
	  offsetof(struct k3_msg_##m, has_##fname), #fname },
#define FIELD_TABLE_(id, NAME, name, bound) \
	static const struct k3_proto_field_desc fields_##name[] = { \
		K3_PROTO_FIELDS_##NAME(FIELD_ROW_, name) \
		{ 0, 0, 0, 0, 0, 0, NULL } };
K3_PROTO_MESSAGES(FIELD_TABLE_)
#undef FIELD_TABLE_
#undef FIELD_ROW_

static const struct k3_proto_msg_desc messages[K3_MSG_COUNT] = {
#define MSG_ROW_(id, NAME, name, bound) \
	[id] = { #NAME, bound, sizeof(struct k3_msg_##name), fields_##name, \
		 sizeof(fields_##name) / sizeof(fields_##name[0]) - 1 },
	K3_PROTO_MESSAGES(MSG_ROW_)
#undef MSG_ROW_
};

const struct k3_proto_msg_desc *k3_proto_schema_msg(uint32_t type)
{
	if (type == 0 || type >= K3_MSG_COUNT || !messages[type].name)
		return NULL;
	return &messages[type];
}

const char *k3_proto_type_name(uint32_t type)
{
	const struct k3_proto_msg_desc *m = k3_proto_schema_msg(type);

	return m ? m->name : NULL;
}

uint32_t k3_proto_type_payload_max(uint32_t type)
{
	const struct k3_proto_msg_desc *m = k3_proto_schema_msg(type);

	return m ? m->payload_max : 0;
}

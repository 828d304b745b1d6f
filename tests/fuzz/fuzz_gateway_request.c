/*
 * fuzz_gateway_request.c - any bytes as an OpenAI request body into the
 * gateway's request side (client/gateway/gw_openai.c: JSON parse, depth
 * bound, field policy). The first byte picks the endpoint (even: chat,
 * odd: legacy completions); the rest is the body.
 * Properties: no crash or leak; a refusal (malformed JSON included) is a
 * 400 with a message; an accepted request always encodes into a GENERATE
 * frame that decodes again, with canonical messages that are a JSON array
 * of objects whose role is system, user, assistant or tool.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "../../client/gateway/gw_openai.h"
#include "k3_proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_messages(const char *s)
{
	json_t *m = json_loads(s, 0, NULL), *v;
	size_t i;

	if (!json_is_array(m) || json_array_size(m) == 0)
		abort();
	json_array_foreach(m, i, v) {
		const char *role = json_string_value(json_object_get(v, "role"));

		if (!role || (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant") &&
			      strcmp(role, "tool")))
			abort();
	}
	json_decref(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct gw_openai_request r;
	struct gw_openai_error e;
	enum gw_endpoint ep;

	if (size < 1)
		return 0;
	ep = (data[0] & 1) ? GW_EP_COMPLETIONS : GW_EP_CHAT;
	memset(&r, 0, sizeof(r));
	memset(&e, 0, sizeof(e));
	if (gw_openai_parse_body(ep, (const char *)data + 1, size - 1, &r, &e) < 0) {
		if (e.status != 400 || !e.message[0])
			abort();
	} else {
		struct k3_msg_generate g;
		struct k3_proto_buf buf;
		struct k3_proto_err err;
		struct k3_proto_header h;
		union k3_proto_body back;

		if (ep == GW_EP_CHAT)
			check_messages(r.messages);
		gw_openai_to_generate(&r, &g);
		k3_proto_buf_init(&buf, (size_t)K3_LIM_PAYLOAD_MAX + K3_PROTO_HEADER_SIZE);
		if (k3_proto_encode(&buf, K3_MSG_GENERATE, 1, &g, &err) != 0)
			abort();
		if (k3_proto_frame_decode(buf.data, buf.len, &h, &back, &err) != 0)
			abort();
		if (back.generate.stop.n != r.n_stop || back.generate.has_max_new != r.has_max_new)
			abort();
		k3_proto_buf_release(&buf);
	}
	gw_openai_request_release(&r);
	return 0;
}

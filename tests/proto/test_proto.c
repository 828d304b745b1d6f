/*
 * test_proto.c - libk3proto: round trips of every message type, exact
 * header bytes, and the malformed-frame catalogue where each way of being
 * malformed yields its own named error.
 *
 * With --write-corpus DIR it writes one valid frame per message type (the
 * fuzz seed corpus in tests/fuzz/corpus/proto) and exits.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "k3_proto.h"
#include "t.h"

static const uint32_t ids5[] = { 1, 163584, 0, 0xffffffffu, 42 };
/* STATUS_REPLY's job list: two jobs (a job id past 2^32, an age past 2^32 ms) */
static const uint64_t job_ids2[] = { (1ull << 40) + 7, 8 };
static const uint64_t job_ages2[] = { 12345, (1ull << 33) + 1 };
static const uint32_t job_states2[] = { K3_JOB_RUNNING, K3_JOB_QUEUED };
static const uint32_t job_kinds2[] = { K3_JOB_GENERATE, K3_JOB_WARM_EXPERTS };
static const uint32_t job_uids2[] = { 1000, 0 };
static const uint32_t job_pids2[] = { 4242, 0x7fffffffu };

/* Fills every field of a message of `type` with a distinctive value. */
static void fill(uint32_t type, union k3_proto_body *b)
{
	memset(b, 0, sizeof(*b));
	switch (type) {
	case K3_MSG_HELLO:
		b->hello.client = k3_proto_str_of("k3ctl/0.1"); b->hello.has_client = true;
		b->hello.version = 1; b->hello.has_version = true;
		b->hello.caps = 0x7; b->hello.has_caps = true;
		break;
	case K3_MSG_HELLO_OK:
		b->hello_ok.server = k3_proto_str_of("k3d/0.1"); b->hello_ok.has_server = true;
		b->hello_ok.version = 1; b->hello_ok.has_version = true;
		b->hello_ok.model = k3_proto_str_of("kimi-k3"); b->hello_ok.has_model = true;
		b->hello_ok.state = K3_STATE_READY; b->hello_ok.has_state = true;
		break;
	case K3_MSG_ERROR:
		b->error.status = K3_STATUS_BUSY; b->error.has_status = true;
		b->error.message = k3_proto_str_of("engine busy: 1 running, queue 0/0"); b->error.has_message = true;
		b->error.param = k3_proto_str_of("max_new"); b->error.has_param = true;
		break;
	case K3_MSG_OK:
		b->ok.message = k3_proto_str_of("draining"); b->ok.has_message = true;
		break;
	case K3_MSG_PONG:
		b->pong.state = K3_STATE_LOADING; b->pong.has_state = true;
		break;
	case K3_MSG_STATUS_REPLY:
		b->status_reply.version = k3_proto_str_of("0.1.0"); b->status_reply.has_version = true;
		b->status_reply.state = 1; b->status_reply.has_state = true;
		b->status_reply.pid = 1234; b->status_reply.has_pid = true;
		b->status_reply.uptime_s = 12.5; b->status_reply.has_uptime_s = true;
		b->status_reply.connections = 3; b->status_reply.has_connections = true;
		b->status_reply.running = 1; b->status_reply.has_running = true;
		b->status_reply.queued = 0; b->status_reply.has_queued = true;
		b->status_reply.queue_max = 4; b->status_reply.has_queue_max = true;
		b->status_reply.expert_bytes_read = 25830000000ull; b->status_reply.has_expert_bytes_read = true;
		b->status_reply.io_wait_s_total = 12.25; b->status_reply.has_io_wait_s_total = true;
		b->status_reply.compute_s_total = 3.5; b->status_reply.has_compute_s_total = true;
		b->status_reply.positions_total = 1000; b->status_reply.has_positions_total = true;
		b->status_reply.spine_bytes_read = 226000000000ull;
		b->status_reply.has_spine_bytes_read = true;
		b->status_reply.spine_loads = 184; b->status_reply.has_spine_loads = true;
		b->status_reply.spine_memory_bytes = 3ull << 30;
		b->status_reply.has_spine_memory_bytes = true;
		b->status_reply.spine_io_wait_s_total = 2.5;
		b->status_reply.has_spine_io_wait_s_total = true;
		b->status_reply.job_ids.n = 2; b->status_reply.job_ids.v = job_ids2;
		b->status_reply.has_job_ids = true;
		b->status_reply.job_states.n = 2; b->status_reply.job_states.v = job_states2;
		b->status_reply.has_job_states = true;
		b->status_reply.job_kinds.n = 2; b->status_reply.job_kinds.v = job_kinds2;
		b->status_reply.has_job_kinds = true;
		b->status_reply.job_uids.n = 2; b->status_reply.job_uids.v = job_uids2;
		b->status_reply.has_job_uids = true;
		b->status_reply.job_pids.n = 2; b->status_reply.job_pids.v = job_pids2;
		b->status_reply.has_job_pids = true;
		b->status_reply.job_ages_ms.n = 2; b->status_reply.job_ages_ms.v = job_ages2;
		b->status_reply.has_job_ages_ms = true;
		break;
	case K3_MSG_MODEL_INFO_REPLY:
		b->model_info_reply.id = k3_proto_str_of("kimi-k3"); b->model_info_reply.has_id = true;
		b->model_info_reply.context_length = 1048576; b->model_info_reply.has_context_length = true;
		b->model_info_reply.params_total = 2800000000000ull; b->model_info_reply.has_params_total = true;
		break;
	case K3_MSG_TOKENIZE:
		b->tokenize.text = k3_proto_str_of("héllo 世界 👋"); b->tokenize.has_text = true;
		b->tokenize.special = true; b->tokenize.has_special = true;
		break;
	case K3_MSG_TOKENIZE_REPLY:
		b->tokenize_reply.ids.n = 5; b->tokenize_reply.ids.v = ids5; b->tokenize_reply.has_ids = true;
		break;
	case K3_MSG_DETOKENIZE:
		b->detokenize.ids.n = 5; b->detokenize.ids.v = ids5; b->detokenize.has_ids = true;
		break;
	case K3_MSG_DETOKENIZE_REPLY:
		b->detokenize_reply.bytes.p = "\xf0\x9f"; b->detokenize_reply.bytes.len = 2;
		b->detokenize_reply.has_bytes = true;
		break;
	case K3_MSG_GENERATE:
		b->generate.mode = K3_MODE_CHAT; b->generate.has_mode = true;
		b->generate.messages = k3_proto_str_of("[{\"role\":\"user\",\"content\":\"hi\"}]");
		b->generate.has_messages = true;
		b->generate.max_new = 64; b->generate.has_max_new = true;
		b->generate.stop.n = 2;
		b->generate.stop.v[0] = k3_proto_str_of("\n\n");
		b->generate.stop.v[1] = k3_proto_str_of("END");
		b->generate.has_stop = true;
		b->generate.stop_ids.n = 2; b->generate.stop_ids.v = ids5; b->generate.has_stop_ids = true;
		b->generate.thinking = false; b->generate.has_thinking = true;
		b->generate.reasoning_effort = K3_EFFORT_HIGH; b->generate.has_reasoning_effort = true;
		break;
	case K3_MSG_ACCEPTED:
		b->accepted.job_id = 7; b->accepted.has_job_id = true;
		b->accepted.queue_position = 2; b->accepted.has_queue_position = true;
		break;
	case K3_MSG_PROGRESS:
		b->progress.done = 128; b->progress.has_done = true;
		b->progress.total = 4096; b->progress.has_total = true;
		break;
	case K3_MSG_TOKEN:
		b->token.ids.n = 1; b->token.ids.v = ids5 + 4; b->token.has_ids = true;
		b->token.text = k3_proto_str_of("Paris"); b->token.has_text = true;
		b->token.channel = K3_CHANNEL_REASONING; b->token.has_channel = true;
		break;
	case K3_MSG_TOOL_CALL:
		b->tool_call.index = 0; b->tool_call.has_index = true;
		b->tool_call.name = k3_proto_str_of("get_weather"); b->tool_call.has_name = true;
		b->tool_call.arguments = k3_proto_str_of("{\"city\":"); b->tool_call.has_arguments = true;
		break;
	case K3_MSG_DONE:
		b->done.finish = K3_FINISH_LENGTH; b->done.has_finish = true;
		b->done.prompt_tokens = 6; b->done.has_prompt_tokens = true;
		b->done.completion_tokens = 16; b->done.has_completion_tokens = true;
		b->done.decode_tps = 3.25; b->done.has_decode_tps = true;
		b->done.expert_bytes_read = 1ull << 40; b->done.has_expert_bytes_read = true;
		b->done.spine_bytes_read = 113000000000ull; b->done.has_spine_bytes_read = true;
		b->done.spine_loads = 92; b->done.has_spine_loads = true;
		b->done.spine_rows_read = 17; b->done.has_spine_rows_read = true;
		b->done.spine_io_wait_s = 0.125; b->done.has_spine_io_wait_s = true;
		break;
	case K3_MSG_CANCEL:
		b->cancel.job_id = 99; b->cancel.has_job_id = true;
		break;
	case K3_MSG_WARM_EXPERTS:
		b->warm_experts.layers.n = 5; b->warm_experts.layers.v = ids5;
		b->warm_experts.has_layers = true;
		b->warm_experts.experts.n = 5; b->warm_experts.experts.v = ids5;
		b->warm_experts.has_experts = true;
		break;
	case K3_MSG_WARM_EXPERTS_REPLY:
		b->warm_experts_reply.requested = 5; b->warm_experts_reply.has_requested = true;
		b->warm_experts_reply.loaded = 4; b->warm_experts_reply.has_loaded = true;
		b->warm_experts_reply.resident = 4; b->warm_experts_reply.has_resident = true;
		b->warm_experts_reply.bytes_read = 70205440; b->warm_experts_reply.has_bytes_read = true;
		break;
	default:
		break;   /* PING, STATUS, MODEL_INFO, SHUTDOWN: empty bodies */
	}
}

static bool str_eq(struct k3_proto_str a, struct k3_proto_str b)
{
	return a.len == b.len && (a.len == 0 || memcmp(a.p, b.p, a.len) == 0);
}

static void test_round_trips(void)
{
	for (uint32_t type = 1; type < K3_MSG_COUNT; type++) {
		union k3_proto_body in, out;
		struct k3_proto_buf buf;
		struct k3_proto_header h;
		struct k3_proto_err err;
		int r;

		fill(type, &in);
		k3_proto_buf_init(&buf, 1 << 20);
		r = k3_proto_encode(&buf, type, 1000 + type, &in, &err);
		T_EQ_INT(r, 0);
		r = k3_proto_frame_decode(buf.data, buf.len, &h, &out, &err);
		if (!T_OK(r == 0))
			printf("     %s: %s\n", k3_proto_type_name(type), err.msg);
		T_EQ_INT(h.type, type);
		T_EQ_INT(h.request_id, 1000 + type);
		T_EQ_INT(h.length, buf.len - K3_PROTO_HEADER_SIZE);
		k3_proto_buf_release(&buf);
	}

	/* Field values survive, including ids, repeated strings and doubles. */
	{
		union k3_proto_body in, out;
		struct k3_proto_buf buf;
		struct k3_proto_header h;
		struct k3_proto_err err;

		fill(K3_MSG_GENERATE, &in);
		k3_proto_buf_init(&buf, 1 << 20);
		T_EQ_INT(k3_proto_encode(&buf, K3_MSG_GENERATE, 5, &in, &err), 0);
		T_EQ_INT(k3_proto_frame_decode(buf.data, buf.len, &h, &out, &err), 0);
		T_EQ_INT(out.generate.mode, K3_MODE_CHAT);
		T_OK(str_eq(out.generate.messages, in.generate.messages));
		T_EQ_INT(out.generate.stop.n, 2);
		T_OK(str_eq(out.generate.stop.v[1], k3_proto_str_of("END")));
		T_EQ_INT(out.generate.stop_ids.n, 2);
		T_EQ_U64(k3_proto_ids_at(&out.generate.stop_ids, 1), 163584);
		T_OK(out.generate.has_thinking && !out.generate.thinking);
		T_OK(!out.generate.has_prompt);
		k3_proto_buf_release(&buf);

		fill(K3_MSG_TOKENIZE_REPLY, &in);
		k3_proto_buf_init(&buf, 1 << 20);
		T_EQ_INT(k3_proto_encode(&buf, K3_MSG_TOKENIZE_REPLY, 6, &in, &err), 0);
		T_EQ_INT(k3_proto_frame_decode(buf.data, buf.len, &h, &out, &err), 0);
		T_EQ_INT(out.tokenize_reply.ids.n, 5);
		for (uint32_t i = 0; i < 5; i++)
			T_EQ_U64(k3_proto_ids_at(&out.tokenize_reply.ids, i), ids5[i]);
		k3_proto_buf_release(&buf);

		fill(K3_MSG_DONE, &in);
		k3_proto_buf_init(&buf, 1 << 20);
		T_EQ_INT(k3_proto_encode(&buf, K3_MSG_DONE, 7, &in, &err), 0);
		T_EQ_INT(k3_proto_frame_decode(buf.data, buf.len, &h, &out, &err), 0);
		T_OK(out.done.decode_tps == 3.25);
		T_EQ_U64(out.done.expert_bytes_read, 1ull << 40);
		/* the spine's bytes apart from the experts' (issue 17) */
		T_OK(out.done.has_spine_bytes_read && out.done.has_spine_loads &&
		     out.done.has_spine_rows_read && out.done.has_spine_io_wait_s);
		T_EQ_U64(out.done.spine_bytes_read, 113000000000ull);
		T_EQ_U64(out.done.spine_loads, 92);
		T_EQ_U64(out.done.spine_rows_read, 17);
		T_OK(out.done.spine_io_wait_s == 0.125);
		T_OK(!out.done.has_prefill_s);
		k3_proto_buf_release(&buf);

		/* STATUS_REPLY's job list: u64 and u32 arrays, entry by entry. */
		fill(K3_MSG_STATUS_REPLY, &in);
		k3_proto_buf_init(&buf, 1 << 20);
		T_EQ_INT(k3_proto_encode(&buf, K3_MSG_STATUS_REPLY, 8, &in, &err), 0);
		T_EQ_INT(k3_proto_frame_decode(buf.data, buf.len, &h, &out, &err), 0);
		const struct k3_msg_status_reply *st = &out.status_reply;
		T_EQ_U64(st->spine_bytes_read, 226000000000ull);
		T_EQ_U64(st->spine_loads, 184);
		T_EQ_U64(st->spine_memory_bytes, 3ull << 30);
		T_OK(st->has_spine_io_wait_s_total && st->spine_io_wait_s_total == 2.5);
		T_OK(st->has_job_ids && st->has_job_states && st->has_job_kinds && st->has_job_uids &&
		     st->has_job_pids && st->has_job_ages_ms);
		T_EQ_INT(st->job_ids.n, 2);
		T_EQ_INT(st->job_ages_ms.n, 2);
		T_EQ_INT(st->job_pids.n, 2);
		for (uint32_t i = 0; i < 2; i++) {
			T_EQ_U64(k3_proto_u64s_at(&st->job_ids, i), job_ids2[i]);
			T_EQ_U64(k3_proto_u64s_at(&st->job_ages_ms, i), job_ages2[i]);
			T_EQ_U64(k3_proto_ids_at(&st->job_states, i), job_states2[i]);
			T_EQ_U64(k3_proto_ids_at(&st->job_kinds, i), job_kinds2[i]);
			T_EQ_U64(k3_proto_ids_at(&st->job_uids, i), job_uids2[i]);
			T_EQ_U64(k3_proto_ids_at(&st->job_pids, i), job_pids2[i]);
		}
		k3_proto_buf_release(&buf);
	}
}

/* The exact bytes of a PING frame: the header layout is normative. */
static void test_header_bytes(void)
{
	static const uint8_t want[] = {
		'K', '3', '3', 'P', 1, 0, 5, 0, 0, 0, 0, 0, 0x78, 0x56, 0x34, 0x12, 0, 0, 0, 0,
	};
	union k3_proto_body b;
	struct k3_proto_buf buf;

	memset(&b, 0, sizeof(b));
	k3_proto_buf_init(&buf, 64);
	T_EQ_INT(k3_proto_encode(&buf, K3_MSG_PING, 0x12345678, &b, NULL), 0);
	T_EQ_INT(buf.len, sizeof(want));
	T_EQ_MEM(buf.data, want, sizeof(want));

	/* ERROR {status=5 (u32), message="x"}: field bytes in schema order. */
	static const uint8_t want_err[] = {
		'K', '3', '3', 'P', 1, 0, 3, 0, 0, 0, 0, 0, 9, 0, 0, 0, 17, 0, 0, 0,
		1, 0, 4, 0, 0, 0, 5, 0, 0, 0,
		2, 0, 1, 0, 0, 0, 'x',
	};
	b.error.status = K3_STATUS_BUSY; b.error.has_status = true;
	b.error.message = k3_proto_str_of("x"); b.error.has_message = true;
	k3_proto_buf_reset(&buf);
	T_EQ_INT(k3_proto_encode(&buf, K3_MSG_ERROR, 9, &b, NULL), 0);
	T_EQ_INT(buf.len, sizeof(want_err));
	T_EQ_MEM(buf.data, want_err, sizeof(want_err));
	k3_proto_buf_release(&buf);
}

/* ---- malformed-frame catalogue ---------------------------------------- */

struct frame { uint8_t b[1024]; size_t n; };

static void f_hdr(struct frame *f, uint32_t magic, uint16_t ver, uint16_t type, uint16_t flags,
		  uint16_t reserved, uint32_t len)
{
	struct k3_proto_header h = { magic, ver, type, flags, reserved, 1, len };

	k3_proto_header_encode(&h, f->b);
	f->n = K3_PROTO_HEADER_SIZE;
}

static void f_field(struct frame *f, uint16_t tag, uint32_t len, const void *v, size_t vlen)
{
	uint8_t *p = f->b + f->n;

	p[0] = (uint8_t)tag; p[1] = (uint8_t)(tag >> 8);
	p[2] = (uint8_t)len; p[3] = (uint8_t)(len >> 8); p[4] = (uint8_t)(len >> 16); p[5] = (uint8_t)(len >> 24);
	memcpy(p + 6, v, vlen);
	f->n += 6 + vlen;
}

/* Sets the header's length to the bytes written after it. */
static void f_fix(struct frame *f)
{
	uint32_t len = (uint32_t)(f->n - K3_PROTO_HEADER_SIZE);

	f->b[16] = (uint8_t)len; f->b[17] = (uint8_t)(len >> 8);
	f->b[18] = (uint8_t)(len >> 16); f->b[19] = (uint8_t)(len >> 24);
}

static void expect(const char *what, const struct frame *f, int want)
{
	struct k3_proto_header h;
	union k3_proto_body body;
	struct k3_proto_err err = { 0, "" };
	int r = k3_proto_frame_decode(f->b, f->n, &h, &body, &err);

	if (!T_OK(r == want))
		printf("     %s: got %s (%s), want %s\n", what, k3_proto_error_name(r), err.msg,
		       k3_proto_error_name(want));
	else if (want != 0)
		T_OK(err.msg[0] != '\0');   /* every error explains itself */
}

static void test_malformed(void)
{
	static const uint8_t u32_1[4] = { 1, 0, 0, 0 };
	struct frame f;

	f_hdr(&f, 0x41414141, 1, K3_MSG_PING, 0, 0, 0);
	expect("bad magic", &f, K3_PROTO_E_BAD_MAGIC);

	f_hdr(&f, K3_PROTO_MAGIC, 2, K3_MSG_PING, 0, 0, 0);
	expect("wrong version", &f, K3_PROTO_E_BAD_VERSION);

	f_hdr(&f, K3_PROTO_MAGIC, 1, 999, 0, 0, 0);
	expect("unknown type", &f, K3_PROTO_E_UNKNOWN_TYPE);
	f_hdr(&f, K3_PROTO_MAGIC, 1, 0, 0, 0, 0);
	expect("type zero", &f, K3_PROTO_E_UNKNOWN_TYPE);

	f_hdr(&f, K3_PROTO_MAGIC, 1, K3_MSG_PING, 0x8000, 0, 0);
	expect("unknown flags", &f, K3_PROTO_E_BAD_FLAGS);

	f_hdr(&f, K3_PROTO_MAGIC, 1, K3_MSG_PING, 0, 1, 0);
	expect("reserved bits", &f, K3_PROTO_E_RESERVED);

	f_hdr(&f, K3_PROTO_MAGIC, 1, K3_MSG_STATUS, 0, 0, K3_LIM_PAYLOAD_SMALL + 1);
	expect("oversized control frame", &f, K3_PROTO_E_OVERSIZED);
	f_hdr(&f, K3_PROTO_MAGIC, 1, K3_MSG_GENERATE, 0, 0, 0xffffffffu);
	expect("length overflow (4 GiB)", &f, K3_PROTO_E_OVERSIZED);

	f_hdr(&f, K3_PROTO_MAGIC, 1, K3_MSG_PONG, 0, 0, 0);
	f_field(&f, 1, 4, u32_1, 4);
	f.n -= 2;   /* header promises 10 bytes, 8 arrive */
	f.b[16] = 10;
	expect("truncated payload", &f, K3_PROTO_E_TRUNCATED);
	f.n = 12;
	expect("truncated header", &f, K3_PROTO_E_TRUNCATED);

	f_hdr(&f, K3_PROTO_MAGIC, 1, K3_MSG_PING, 0, 0, 0);
	f.b[f.n++] = 0;
	expect("bytes after the frame", &f, K3_PROTO_E_TRAILING);

	f_hdr(&f, K3_PROTO_MAGIC, 1, K3_MSG_PONG, 0, 0, 0);
	f_field(&f, 1, 4, u32_1, 4);
	f.b[f.n++] = 0; f.b[f.n++] = 0; f.b[f.n++] = 0;
	f_fix(&f);
	expect("trailing bytes after the last field", &f, K3_PROTO_E_TRAILING);

	f_hdr(&f, K3_PROTO_MAGIC, 1, K3_MSG_PONG, 0, 0, 0);
	f_field(&f, 1, 0xfffffff0u, u32_1, 4);
	f_fix(&f);
	expect("field length overflow", &f, K3_PROTO_E_FIELD_OVERRUN);

	f_hdr(&f, K3_PROTO_MAGIC, 1, K3_MSG_PONG, 0, 0, 0);
	f_field(&f, 1, 4, u32_1, 4);
	f_field(&f, 77, 4, u32_1, 4);
	f_fix(&f);
	expect("unknown field", &f, K3_PROTO_E_UNKNOWN_FIELD);

	f_hdr(&f, K3_PROTO_MAGIC, 1, K3_MSG_PONG, 0, 0, 0);
	f_field(&f, 1, 4, u32_1, 4);
	f_field(&f, 1, 4, u32_1, 4);
	f_fix(&f);
	expect("duplicate field", &f, K3_PROTO_E_DUPLICATE_FIELD);

	f_hdr(&f, K3_PROTO_MAGIC, 1, K3_MSG_PONG, 0, 0, 0);
	expect("missing required field", &f, K3_PROTO_E_MISSING_FIELD);

	f_hdr(&f, K3_PROTO_MAGIC, 1, K3_MSG_PONG, 0, 0, 0);
	f_field(&f, 1, 3, u32_1, 3);
	f_fix(&f);
	expect("u32 with 3 bytes", &f, K3_PROTO_E_FIELD_SIZE);

	f_hdr(&f, K3_PROTO_MAGIC, 1, K3_MSG_DETOKENIZE, 0, 0, 0);
	f_field(&f, 1, 6, "\1\0\0\0\2\0", 6);
	f_fix(&f);
	expect("ids not a multiple of 4", &f, K3_PROTO_E_FIELD_SIZE);

	/* STATUS_REPLY with the required fields, then one job-list field. */
	static const uint8_t f64_0[8] = { 0 };
	struct frame st;
	f_hdr(&st, K3_PROTO_MAGIC, 1, K3_MSG_STATUS_REPLY, 0, 0, 0);
	f_field(&st, 1, 1, "v", 1);
	f_field(&st, 2, 4, u32_1, 4);
	f_field(&st, 5, 4, u32_1, 4);
	f_field(&st, 6, 8, f64_0, 8);
	for (uint16_t tag = 7; tag <= 10; tag++)
		f_field(&st, tag, 4, u32_1, 4);
	f = st;
	f_field(&f, 29, 12, "\1\0\0\0\0\0\0\0\2\0\0\0", 12);
	f_fix(&f);
	expect("u64 array not a multiple of 8", &f, K3_PROTO_E_FIELD_SIZE);
	{
		static uint8_t many[8 * (K3_LIM_STATUS_JOBS + 1)];

		f = st;
		f_field(&f, 34, sizeof(many), many, sizeof(many));
		f_fix(&f);
		expect("job list over K3_LIM_STATUS_JOBS", &f, K3_PROTO_E_TOO_LONG);
		f = st;
		f_field(&f, 34, sizeof(many) - 8, many, sizeof(many) - 8);
		f_fix(&f);
		expect("job list at K3_LIM_STATUS_JOBS", &f, 0);
	}

	f_hdr(&f, K3_PROTO_MAGIC, 1, K3_MSG_TOKENIZE, 0, 0, 0);
	f_field(&f, 1, 4, "a\xc3\x28z", 4);
	f_fix(&f);
	expect("bad UTF-8 in text", &f, K3_PROTO_E_BAD_UTF8);
	f_hdr(&f, K3_PROTO_MAGIC, 1, K3_MSG_TOKENIZE, 0, 0, 0);
	f_field(&f, 1, 3, "\xed\xa0\x80", 3);
	f_fix(&f);
	expect("UTF-16 surrogate in text", &f, K3_PROTO_E_BAD_UTF8);
	f_hdr(&f, K3_PROTO_MAGIC, 1, K3_MSG_TOKENIZE, 0, 0, 0);
	f_field(&f, 1, 2, "\xc0\xaf", 2);
	f_fix(&f);
	expect("overlong UTF-8", &f, K3_PROTO_E_BAD_UTF8);

	{
		char name[K3_LIM_NAME_MAX + 1];

		memset(name, 'a', sizeof(name));
		static uint8_t store[K3_PROTO_HEADER_SIZE + 6 + sizeof(name) + 16];
		struct k3_proto_header h = { K3_PROTO_MAGIC, 1, K3_MSG_HELLO, 0, 0, 1,
					     (uint32_t)(6 + sizeof(name)) };
		union k3_proto_body body;
		struct k3_proto_err err;

		k3_proto_header_encode(&h, store);
		store[20] = 1; store[21] = 0;
		store[22] = (uint8_t)sizeof(name); store[23] = (uint8_t)(sizeof(name) >> 8);
		store[24] = 0; store[25] = 0;
		memcpy(store + 26, name, sizeof(name));
		int r = k3_proto_frame_decode(store, K3_PROTO_HEADER_SIZE + 6 + sizeof(name), &h, &body, &err);
		T_EQ_INT(r, K3_PROTO_E_TOO_LONG);
	}

	f_hdr(&f, K3_PROTO_MAGIC, 1, K3_MSG_GENERATE, 0, 0, 0);
	f_field(&f, 1, 4, u32_1, 4);
	for (int i = 0; i < 5; i++)
		f_field(&f, 9, 1, "s", 1);
	f_fix(&f);
	expect("five stop strings", &f, K3_PROTO_E_TOO_MANY);

	f_hdr(&f, K3_PROTO_MAGIC, 1, K3_MSG_TOKENIZE, 0, 0, 0);
	f_field(&f, 1, 1, "a", 1);
	f_field(&f, 2, 1, "\2", 1);
	f_fix(&f);
	expect("bool that is 2", &f, K3_PROTO_E_BAD_VALUE);

	/* A valid frame still decodes after all that. */
	f_hdr(&f, K3_PROTO_MAGIC, 1, K3_MSG_PONG, 0, 0, 0);
	f_field(&f, 1, 4, u32_1, 4);
	f_fix(&f);
	expect("valid PONG", &f, 0);
}

/* The stream splitter: byte-at-a-time arrival, several frames per read,
 * and refusal of a bad length before the payload arrives. */
static void test_split(void)
{
	struct k3_proto_buf buf;
	union k3_proto_body b;
	struct k3_proto_header h;
	const uint8_t *payload;
	struct k3_proto_err err;
	size_t off = 0;
	int frames = 0;

	k3_proto_buf_init(&buf, 1 << 20);
	fill(K3_MSG_TOKEN, &b);
	T_EQ_INT(k3_proto_encode(&buf, K3_MSG_TOKEN, 1, &b, NULL), 0);
	fill(K3_MSG_DONE, &b);
	T_EQ_INT(k3_proto_encode(&buf, K3_MSG_DONE, 1, &b, NULL), 0);
	for (size_t have = 1; have <= buf.len; have++) {
		int n = k3_proto_frame_split(buf.data + off, have - off, &h, &payload, &err);

		T_OK(n >= 0);
		if (n > 0) {
			frames++;
			off += (size_t)n;
		}
	}
	T_EQ_INT(frames, 2);
	T_EQ_U64(off, buf.len);

	/* A 20-byte header with a 100 MiB PING length is refused at once. */
	struct frame f;
	f_hdr(&f, K3_PROTO_MAGIC, 1, K3_MSG_PING, 0, 0, 100u << 20);
	T_EQ_INT(k3_proto_frame_split(f.b, f.n, &h, &payload, &err), K3_PROTO_E_OVERSIZED);
	/* A wrong first byte is refused before the header is complete. */
	T_EQ_INT(k3_proto_frame_split((const uint8_t *)"G", 1, &h, &payload, &err), K3_PROTO_E_BAD_MAGIC);
	T_EQ_INT(k3_proto_frame_split((const uint8_t *)"K3", 2, &h, &payload, &err), 0);
	k3_proto_buf_release(&buf);
}

static void test_encoder_refuses(void)
{
	union k3_proto_body b;
	struct k3_proto_buf buf;
	struct k3_proto_err err;

	k3_proto_buf_init(&buf, 1 << 20);
	memset(&b, 0, sizeof(b));
	T_EQ_INT(k3_proto_encode(&buf, K3_MSG_ERROR, 1, &b, &err), K3_PROTO_E_MISSING_FIELD);
	T_EQ_INT(buf.len, 0);   /* unchanged on failure */
	b.tokenize.text.p = "\xff"; b.tokenize.text.len = 1; b.tokenize.has_text = true;
	T_EQ_INT(k3_proto_encode(&buf, K3_MSG_TOKENIZE, 1, &b, &err), K3_PROTO_E_BAD_UTF8);
	T_EQ_INT(k3_proto_encode(&buf, 12345, 1, &b, &err), K3_PROTO_E_UNKNOWN_TYPE);
	/* A job list longer than its bound is refused by the encoder too. */
	{
		static uint64_t many[K3_LIM_STATUS_JOBS + 1];

		fill(K3_MSG_STATUS_REPLY, &b);
		b.status_reply.job_ids.n = K3_LIM_STATUS_JOBS + 1;
		b.status_reply.job_ids.v = many;
		T_EQ_INT(k3_proto_encode(&buf, K3_MSG_STATUS_REPLY, 1, &b, &err), K3_PROTO_E_TOO_LONG);
		T_EQ_INT(buf.len, 0);
	}
	k3_proto_buf_release(&buf);

	/* A buffer whose max is too small refuses without partial output. */
	k3_proto_buf_init(&buf, 30);
	fill(K3_MSG_GENERATE, &b);
	T_EQ_INT(k3_proto_encode(&buf, K3_MSG_GENERATE, 1, &b, &err), K3_PROTO_E_NOMEM);
	T_EQ_INT(buf.len, 0);
	k3_proto_buf_release(&buf);

	T_OK(k3_proto_utf8_valid("\xf4\x8f\xbf\xbf", 4));
	T_OK(!k3_proto_utf8_valid("\xf4\x90\x80\x80", 4));
	T_OK(!k3_proto_utf8_valid("\xe2\x82", 2));
	T_EQ_STR(k3_proto_status_name(K3_STATUS_BUSY), "busy");
	T_EQ_STR(k3_proto_error_name(K3_PROTO_E_BAD_UTF8), "bad_utf8");
	T_EQ_STR(k3_proto_type_name(K3_MSG_GENERATE), "GENERATE");
	/* draft policies: the names every client and k3d share */
	uint32_t p = 99;
	T_OK(k3_proto_draft_policy_parse("ngram", &p) == 0 && p == K3_PROTO_DRAFT_NGRAM);
	T_OK(k3_proto_draft_policy_parse("dspark", &p) == 0 && p == K3_PROTO_DRAFT_DSPARK);
	T_OK(k3_proto_draft_policy_parse("off", &p) == 0 && p == K3_PROTO_DRAFT_OFF);
	T_EQ_INT(k3_proto_draft_policy_parse("unset", &p), -1);
	T_EQ_INT(k3_proto_draft_policy_parse("eagle", &p), -1);
	T_EQ_STR(k3_proto_draft_policy_name(K3_PROTO_DRAFT_AUTO), "auto");
	T_EQ_STR(k3_proto_draft_policy_name(0), "unset");
	T_EQ_STR(k3_proto_draft_policy_name(99), "?");
}

static int write_corpus(const char *dir)
{
	mkdir(dir, 0755);
	for (uint32_t type = 1; type < K3_MSG_COUNT; type++) {
		union k3_proto_body b;
		struct k3_proto_buf buf;
		char path[4096];
		FILE *f;

		fill(type, &b);
		k3_proto_buf_init(&buf, 1 << 20);
		if (k3_proto_encode(&buf, type, type, &b, NULL) != 0)
			return 1;
		snprintf(path, sizeof(path), "%s/%02u-%s", dir, type, k3_proto_type_name(type));
		f = fopen(path, "wb");
		if (!f || fwrite(buf.data, 1, buf.len, f) != buf.len)
			return 1;
		fclose(f);
		k3_proto_buf_release(&buf);
	}
	return 0;
}

/* The generated setters store the value and mark the field present: a
 * DONE built with them encodes to the same bytes as one built by hand, and
 * a field never set stays absent (not sent as zero). */
static void test_setters(void)
{
	struct k3_msg_done a, b;
	struct k3_msg_generate g;
	struct k3_proto_buf ba, bb;
	struct k3_proto_err err;
	union k3_proto_body out;
	struct k3_proto_header h;
	static const uint32_t stop_ids[] = { 7, 8 };

	memset(&a, 0, sizeof(a));
	memset(&b, 0, sizeof(b));
	k3_msg_done_set_finish(&a, K3_FINISH_CANCELLED);
	k3_msg_done_set_prompt_tokens(&a, 6);
	k3_msg_done_set_completion_tokens(&a, 0);
	k3_msg_done_set_cancel_reason(&a, K3_CANCEL_BY_ID);
	k3_msg_done_set_stop_matched(&a, k3_proto_str_of("END"));
	b.finish = K3_FINISH_CANCELLED; b.has_finish = true;
	b.prompt_tokens = 6; b.has_prompt_tokens = true;
	b.completion_tokens = 0; b.has_completion_tokens = true;
	b.cancel_reason = K3_CANCEL_BY_ID; b.has_cancel_reason = true;
	b.stop_matched = k3_proto_str_of("END"); b.has_stop_matched = true;
	T_OK(a.has_finish && a.has_completion_tokens && a.has_cancel_reason && !a.has_queued_s);
	k3_proto_buf_init(&ba, 4096);
	k3_proto_buf_init(&bb, 4096);
	T_EQ_INT(k3_proto_encode(&ba, K3_MSG_DONE, 3, &a, &err), 0);
	T_EQ_INT(k3_proto_encode(&bb, K3_MSG_DONE, 3, &b, &err), 0);
	T_EQ_U64(ba.len, bb.len);
	T_EQ_MEM(ba.data, bb.data, ba.len);
	T_EQ_INT(k3_proto_frame_decode(ba.data, ba.len, &h, &out, &err), 0);
	T_OK(out.done.has_cancel_reason && out.done.cancel_reason == K3_CANCEL_BY_ID);
	T_OK(out.done.has_completion_tokens && out.done.completion_tokens == 0);
	T_OK(!out.done.has_queued_s && !out.done.has_reasoning_tokens);
	T_OK(out.done.stop_matched.len == 3 && memcmp(out.done.stop_matched.p, "END", 3) == 0);

	/* array kinds: ids and repeated strings are views set as a whole */
	memset(&g, 0, sizeof(g));
	k3_msg_generate_set_mode(&g, K3_MODE_RAW);
	k3_msg_generate_set_prompt(&g, k3_proto_str_of("a\0b"));   /* 1 byte: a C string view */
	k3_msg_generate_set_stop_ids(&g, (struct k3_proto_ids){ 2, stop_ids, NULL });
	k3_msg_generate_set_stop(&g, (struct k3_proto_strv){ .n = 1, .v = { { "\n\n", 2 } } });
	k3_proto_buf_reset(&ba);
	T_EQ_INT(k3_proto_encode(&ba, K3_MSG_GENERATE, 4, &g, &err), 0);
	T_EQ_INT(k3_proto_frame_decode(ba.data, ba.len, &h, &out, &err), 0);
	T_OK(out.generate.has_prompt && out.generate.prompt.len == 1);
	T_OK(out.generate.has_stop_ids && out.generate.stop_ids.n == 2 &&
	     k3_proto_ids_at(&out.generate.stop_ids, 1) == 8);
	T_OK(out.generate.has_stop && out.generate.stop.n == 1 && out.generate.stop.v[0].len == 2);
	T_OK(!out.generate.has_max_new && !out.generate.has_messages);
	k3_proto_buf_release(&ba);
	k3_proto_buf_release(&bb);
}

int main(int argc, char **argv)
{
	if (argc == 3 && strcmp(argv[1], "--write-corpus") == 0)
		return write_corpus(argv[2]);
	test_round_trips();
	test_header_bytes();
	test_malformed();
	test_split();
	test_encoder_refuses();
	test_setters();
	return t_done();
}

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
		k3_msg_hello_set_client(&b->hello, k3_proto_str_of("k3ctl/0.1"));
		k3_msg_hello_set_version(&b->hello, 1);
		k3_msg_hello_set_caps(&b->hello, 0x7);
		break;
	case K3_MSG_HELLO_OK:
		k3_msg_hello_ok_set_server(&b->hello_ok, k3_proto_str_of("k3d/0.1"));
		k3_msg_hello_ok_set_version(&b->hello_ok, 1);
		k3_msg_hello_ok_set_model(&b->hello_ok, k3_proto_str_of("kimi-k3"));
		k3_msg_hello_ok_set_state(&b->hello_ok, K3_STATE_READY);
		break;
	case K3_MSG_ERROR:
		k3_msg_error_set_status(&b->error, K3_STATUS_BUSY);
		k3_msg_error_set_message(&b->error, k3_proto_str_of("engine busy: 1 running, queue 0/0"));
		k3_msg_error_set_param(&b->error, k3_proto_str_of("max_new"));
		break;
	case K3_MSG_OK:
		k3_msg_ok_set_message(&b->ok, k3_proto_str_of("draining"));
		break;
	case K3_MSG_PONG:
		k3_msg_pong_set_state(&b->pong, K3_STATE_LOADING);
		break;
	case K3_MSG_STATUS_REPLY: {
		struct k3_msg_status_reply *m = &b->status_reply;

		k3_msg_status_reply_set_version(m, k3_proto_str_of("0.1.0"));
		k3_msg_status_reply_set_state(m, 1);
		k3_msg_status_reply_set_pid(m, 1234);
		k3_msg_status_reply_set_uptime_s(m, 12.5);
		k3_msg_status_reply_set_connections(m, 3);
		k3_msg_status_reply_set_running(m, 1);
		k3_msg_status_reply_set_queued(m, 0);
		k3_msg_status_reply_set_queue_max(m, 4);
		k3_msg_status_reply_set_expert_bytes_read(m, 25830000000ull);
		k3_msg_status_reply_set_io_wait_s_total(m, 12.25);
		k3_msg_status_reply_set_compute_s_total(m, 3.5);
		k3_msg_status_reply_set_positions_total(m, 1000);
		k3_msg_status_reply_set_job_ids(m, (struct k3_proto_u64s){ .n = 2, .v = job_ids2 });
		k3_msg_status_reply_set_job_states(m, (struct k3_proto_ids){ .n = 2, .v = job_states2 });
		k3_msg_status_reply_set_job_kinds(m, (struct k3_proto_ids){ .n = 2, .v = job_kinds2 });
		k3_msg_status_reply_set_job_uids(m, (struct k3_proto_ids){ .n = 2, .v = job_uids2 });
		k3_msg_status_reply_set_job_pids(m, (struct k3_proto_ids){ .n = 2, .v = job_pids2 });
		k3_msg_status_reply_set_job_ages_ms(m, (struct k3_proto_u64s){ .n = 2, .v = job_ages2 });
		k3_msg_status_reply_set_spine_bytes_read(m, 226000000000ull);
		k3_msg_status_reply_set_spine_loads(m, 184);
		k3_msg_status_reply_set_spine_memory_bytes(m, 3ull << 30);
		k3_msg_status_reply_set_spine_io_wait_s_total(m, 2.5);
		break;
	}
	case K3_MSG_MODEL_INFO_REPLY:
		k3_msg_model_info_reply_set_id(&b->model_info_reply, k3_proto_str_of("kimi-k3"));
		k3_msg_model_info_reply_set_context_length(&b->model_info_reply, 1048576);
		k3_msg_model_info_reply_set_params_total(&b->model_info_reply, 2800000000000ull);
		break;
	case K3_MSG_TOKENIZE:
		k3_msg_tokenize_set_text(&b->tokenize, k3_proto_str_of("héllo 世界 👋"));
		k3_msg_tokenize_set_special(&b->tokenize, true);
		break;
	case K3_MSG_TOKENIZE_REPLY:
		k3_msg_tokenize_reply_set_ids(&b->tokenize_reply, (struct k3_proto_ids){ .n = 5, .v = ids5 });
		break;
	case K3_MSG_DETOKENIZE:
		k3_msg_detokenize_set_ids(&b->detokenize, (struct k3_proto_ids){ .n = 5, .v = ids5 });
		break;
	case K3_MSG_DETOKENIZE_REPLY:
		k3_msg_detokenize_reply_set_bytes(&b->detokenize_reply, (struct k3_proto_str){ "\xf0\x9f", 2 });
		break;
	case K3_MSG_GENERATE:
		k3_msg_generate_set_mode(&b->generate, K3_MODE_CHAT);
		k3_msg_generate_set_messages(&b->generate,
					     k3_proto_str_of("[{\"role\":\"user\",\"content\":\"hi\"}]"));
		k3_msg_generate_set_max_new(&b->generate, 64);
		b->generate.stop.n = 2;
		b->generate.stop.v[0] = k3_proto_str_of("\n\n");
		b->generate.stop.v[1] = k3_proto_str_of("END");
		b->generate.has_stop = true;
		k3_msg_generate_set_stop_ids(&b->generate, (struct k3_proto_ids){ .n = 2, .v = ids5 });
		k3_msg_generate_set_thinking(&b->generate, false);
		k3_msg_generate_set_reasoning_effort(&b->generate, K3_EFFORT_HIGH);
		break;
	case K3_MSG_ACCEPTED:
		k3_msg_accepted_set_job_id(&b->accepted, 7);
		k3_msg_accepted_set_queue_position(&b->accepted, 2);
		break;
	case K3_MSG_PROGRESS:
		k3_msg_progress_set_done(&b->progress, 128);
		k3_msg_progress_set_total(&b->progress, 4096);
		break;
	case K3_MSG_TOKEN:
		k3_msg_token_set_ids(&b->token, (struct k3_proto_ids){ .n = 1, .v = ids5 + 4 });
		k3_msg_token_set_text(&b->token, k3_proto_str_of("Paris"));
		k3_msg_token_set_channel(&b->token, K3_CHANNEL_REASONING);
		break;
	case K3_MSG_TOOL_CALL:
		k3_msg_tool_call_set_index(&b->tool_call, 0);
		k3_msg_tool_call_set_name(&b->tool_call, k3_proto_str_of("get_weather"));
		k3_msg_tool_call_set_arguments(&b->tool_call, k3_proto_str_of("{\"city\":"));
		break;
	case K3_MSG_DONE:
		k3_msg_done_set_finish(&b->done, K3_FINISH_LENGTH);
		k3_msg_done_set_prompt_tokens(&b->done, 6);
		k3_msg_done_set_completion_tokens(&b->done, 16);
		k3_msg_done_set_decode_tps(&b->done, 3.25);
		k3_msg_done_set_expert_bytes_read(&b->done, 1ull << 40);
		k3_msg_done_set_spine_bytes_read(&b->done, 113000000000ull);
		k3_msg_done_set_spine_loads(&b->done, 92);
		k3_msg_done_set_spine_rows_read(&b->done, 17);
		k3_msg_done_set_spine_io_wait_s(&b->done, 0.125);
		break;
	case K3_MSG_CANCEL:
		k3_msg_cancel_set_job_id(&b->cancel, 99);
		break;
	case K3_MSG_WARM_EXPERTS:
		k3_msg_warm_experts_set_layers(&b->warm_experts, (struct k3_proto_ids){ .n = 5, .v = ids5 });
		k3_msg_warm_experts_set_experts(&b->warm_experts, (struct k3_proto_ids){ .n = 5, .v = ids5 });
		break;
	case K3_MSG_WARM_EXPERTS_REPLY:
		k3_msg_warm_experts_reply_set_requested(&b->warm_experts_reply, 5);
		k3_msg_warm_experts_reply_set_loaded(&b->warm_experts_reply, 4);
		k3_msg_warm_experts_reply_set_resident(&b->warm_experts_reply, 4);
		k3_msg_warm_experts_reply_set_bytes_read(&b->warm_experts_reply, 70205440);
		break;
	default:
		break;   /* PING, STATUS, MODEL_INFO, SHUTDOWN: empty bodies */
	}
}

static bool str_eq(struct k3_proto_str a, struct k3_proto_str b)
{
	return a.len == b.len && (a.len == 0 || memcmp(a.p, b.p, a.len) == 0);
}

/* The body fill(type) gives, in *in, encoded with request id rid into buf
 * (initialized here; the caller releases it once done with out, whose
 * views point into it) and decoded into *h and *out. False (reported)
 * when either step fails. */
static bool round_trip(uint32_t type, uint32_t rid, union k3_proto_body *in, struct k3_proto_buf *buf,
		       struct k3_proto_header *h, union k3_proto_body *out)
{
	struct k3_proto_err err;

	fill(type, in);
	k3_proto_buf_init(buf, 1 << 20);
	if (!T_OK(k3_proto_encode(buf, type, rid, in, &err) == 0) ||
	    !T_OK(k3_proto_frame_decode(buf->data, buf->len, h, out, &err) == 0)) {
		printf("     %s: %s\n", k3_proto_type_name(type), err.msg);
		return false;
	}
	return true;
}

static void test_round_trips(void)
{
	union k3_proto_body in, out;
	struct k3_proto_buf buf;
	struct k3_proto_header h;

	for (uint32_t type = 1; type < K3_MSG_COUNT; type++) {
		if (round_trip(type, 1000 + type, &in, &buf, &h, &out)) {
			T_EQ_INT(h.type, type);
			T_EQ_INT(h.request_id, 1000 + type);
			T_EQ_INT(h.length, buf.len - K3_PROTO_HEADER_SIZE);
		}
		k3_proto_buf_release(&buf);
	}

	/* Field values survive, including ids, repeated strings and doubles. */
	if (round_trip(K3_MSG_GENERATE, 5, &in, &buf, &h, &out)) {
		T_EQ_INT(out.generate.mode, K3_MODE_CHAT);
		T_OK(str_eq(out.generate.messages, in.generate.messages));
		T_EQ_INT(out.generate.stop.n, 2);
		T_OK(str_eq(out.generate.stop.v[1], k3_proto_str_of("END")));
		T_EQ_INT(out.generate.stop_ids.n, 2);
		T_EQ_U64(k3_proto_ids_at(&out.generate.stop_ids, 1), 163584);
		T_OK(out.generate.has_thinking && !out.generate.thinking);
		T_OK(!out.generate.has_prompt);
	}
	k3_proto_buf_release(&buf);

	if (round_trip(K3_MSG_TOKENIZE_REPLY, 6, &in, &buf, &h, &out)) {
		T_EQ_INT(out.tokenize_reply.ids.n, 5);
		for (uint32_t i = 0; i < 5; i++)
			T_EQ_U64(k3_proto_ids_at(&out.tokenize_reply.ids, i), ids5[i]);
	}
	k3_proto_buf_release(&buf);

	if (round_trip(K3_MSG_DONE, 7, &in, &buf, &h, &out)) {
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
	}
	k3_proto_buf_release(&buf);

	/* STATUS_REPLY's job list: u64 and u32 arrays, entry by entry. */
	if (round_trip(K3_MSG_STATUS_REPLY, 8, &in, &buf, &h, &out)) {
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
	}
	k3_proto_buf_release(&buf);
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

/* A frame of type holding one field. */
static void f_one(struct frame *f, uint16_t type, uint16_t tag, uint32_t len, const void *v, size_t vlen)
{
	f_hdr(f, K3_PROTO_MAGIC, 1, type, 0, 0, 0);
	f_field(f, tag, len, v, vlen);
	f_fix(f);
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

	f_one(&f, K3_MSG_PONG, 1, 0xfffffff0u, u32_1, 4);
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

	f_one(&f, K3_MSG_PONG, 1, 3, u32_1, 3);
	expect("u32 with 3 bytes", &f, K3_PROTO_E_FIELD_SIZE);

	f_one(&f, K3_MSG_DETOKENIZE, 1, 6, "\1\0\0\0\2\0", 6);
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

	f_one(&f, K3_MSG_TOKENIZE, 1, 4, "a\xc3\x28z", 4);
	expect("bad UTF-8 in text", &f, K3_PROTO_E_BAD_UTF8);
	f_one(&f, K3_MSG_TOKENIZE, 1, 3, "\xed\xa0\x80", 3);
	expect("UTF-16 surrogate in text", &f, K3_PROTO_E_BAD_UTF8);
	f_one(&f, K3_MSG_TOKENIZE, 1, 2, "\xc0\xaf", 2);
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
	f_one(&f, K3_MSG_PONG, 1, 4, u32_1, 4);
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

/*
 * fuzz_gateway_reply.c - what k3d sends for a generation, as any bytes,
 * into the gateway's reply shaper (client/gateway/gw_openai_reply.c).
 * Byte 0 picks the request: bit 0 legacy completions (else chat), bit 1
 * stream_options.include_usage, bit 2 a max_tokens above the wire bound.
 * The rest is k3 frames (split and decoded as gw_daemon.c does); TOKEN,
 * TOOL_CALL, HELLO_OK, DONE and ERROR go to a streaming and a
 * non-streaming reply of that request, up to the first DONE or ERROR.
 * Properties: no crash or leak; every shaped object serializes (the bytes
 * the client gets) on one line and parses back; each stream chunk carries
 * exactly its event (token text and tool-call arguments byte for byte,
 * U+0000 included; id, type and name only in a call's first delta); the
 * joined stream equals the non-streaming completion (content, reasoning,
 * every call's id, name and arguments); usage adds up; every error the
 * error map gives is a valid OpenAI error with a 4xx/5xx status.
 * Seeds: tests/fuzz/make_gateway_reply_seeds.py.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "../../client/gateway/gw_openai_reply.h"
#include "k3_proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_CALLS 16     /* tool-call indices the reference tracks */

/* What the events said, kept apart from the shaper to check it against. */
struct call {
	uint32_t index;
	struct k3_proto_buf id, name, args;
};
struct ref {
	struct k3_proto_buf answer, reasoning;
	struct call calls[MAX_CALLS];
	unsigned n_calls;
	bool untracked;      /* more calls than MAX_CALLS: the per-call checks are off */
};

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, #c); abort(); } } while (0)

static bool same_mem(const json_t *s, const void *p, size_t n)
{
	return json_is_string(s) && json_string_length(s) == n && (n == 0 || memcmp(json_string_value(s), p, n) == 0);
}

static bool same(const json_t *s, const struct k3_proto_buf *b)
{
	return same_mem(s, b->data, b->len);
}

/* The bytes the gateway would send: one line that parses back. Takes v. */
static json_t *wire(json_t *v)
{
	char *s;
	json_t *back;

	CHECK(v);
	s = json_dumps(v, JSON_COMPACT | JSON_PRESERVE_ORDER);
	json_decref(v);
	CHECK(s && !strchr(s, '\n'));
	back = json_loads(s, JSON_ALLOW_NUL, NULL);
	free(s);
	CHECK(back);
	return back;
}

/* A chunk's common fields; returns its one choice. */
static json_t *choice0(const json_t *chunk, const struct gw_openai_reply *rp)
{
	CHECK(same_mem(json_object_get(chunk, "id"), rp->id, strlen(rp->id)));
	CHECK(same_mem(json_object_get(chunk, "model"), rp->model, strlen(rp->model)));
	CHECK(json_array_size(json_object_get(chunk, "choices")) == 1);
	CHECK(json_is_null(json_object_get(chunk, "usage")) == rp->include_usage);
	return json_array_get(json_object_get(chunk, "choices"), 0);
}

static void check_error(const struct gw_openai_reply_error *e)
{
	json_t *v, *err;

	CHECK(e->status >= 400 && e->status <= 599 && e->type && e->message[0]);
	v = wire(gw_openai_error_json(e->type, e->message, e->param, e->code));
	err = json_object_get(v, "error");
	CHECK(json_object_size(err) == 4 && same_mem(json_object_get(err, "message"), e->message, strlen(e->message)));
	CHECK(json_is_null(json_object_get(err, "param")) == !e->param[0]);
	CHECK(json_is_null(json_object_get(err, "code")) == !e->code);
	json_decref(v);
}

static struct call *ref_call(struct ref *ref, uint32_t index, bool *first)
{
	struct call *c;

	*first = false;
	for (unsigned i = 0; i < ref->n_calls; i++)
		if (ref->calls[i].index == index)
			return &ref->calls[i];
	if (ref->n_calls == MAX_CALLS) {
		ref->untracked = true;
		return NULL;
	}
	c = &ref->calls[ref->n_calls++];
	c->index = index;
	k3_proto_buf_init(&c->id, SIZE_MAX);
	k3_proto_buf_init(&c->name, SIZE_MAX);
	k3_proto_buf_init(&c->args, SIZE_MAX);
	*first = true;
	return c;
}

static void on_token(struct gw_openai_reply *rs, struct gw_openai_reply *rn, struct ref *ref,
		     const struct k3_msg_token *t)
{
	bool reasoning = t->has_channel && t->channel == K3_CHANNEL_REASONING;
	json_t *c = gw_openai_reply_token(rs, t), *ch;

	CHECK(!gw_openai_reply_token(rn, t));
	if (!t->has_text || t->text.len == 0) {
		CHECK(!c);
		return;
	}
	k3_proto_buf_append(reasoning ? &ref->reasoning : &ref->answer, t->text.p, t->text.len);
	c = wire(c);
	ch = choice0(c, rs);
	CHECK(json_is_null(json_object_get(ch, "finish_reason")));
	if (rs->ep == GW_EP_CHAT) {
		json_t *delta = json_object_get(ch, "delta");

		CHECK(json_object_size(delta) == 1);
		CHECK(same_mem(json_object_get(delta, reasoning ? "reasoning_content" : "content"), t->text.p,
			       t->text.len));
	} else {
		CHECK(same_mem(json_object_get(ch, "text"), t->text.p, t->text.len));
	}
	json_decref(c);
}

static const char fallback_id[] = "call_fuzz";

static void on_tool_call(struct gw_openai_reply *rs, struct gw_openai_reply *rn, struct ref *ref,
			 const struct k3_msg_tool_call *tc)
{
	json_t *c = gw_openai_reply_tool_call(rs, tc, fallback_id), *call, *fn;
	bool first;
	struct call *rc;

	CHECK(!gw_openai_reply_tool_call(rn, tc, fallback_id));
	if (rs->ep != GW_EP_CHAT) {
		CHECK(!c);
		return;
	}
	rc = ref_call(ref, tc->index, &first);
	if (rc && first) {
		if (tc->has_id && tc->id.len)
			k3_proto_buf_append(&rc->id, tc->id.p, tc->id.len);
		else
			k3_proto_buf_append(&rc->id, fallback_id, strlen(fallback_id));
	}
	if (rc && tc->has_name) {
		k3_proto_buf_reset(&rc->name);
		k3_proto_buf_append(&rc->name, tc->name.p, tc->name.len);
	}
	if (rc && tc->has_arguments)
		k3_proto_buf_append(&rc->args, tc->arguments.p, tc->arguments.len);
	c = wire(c);
	call = json_array_get(json_object_get(json_object_get(choice0(c, rs), "delta"), "tool_calls"), 0);
	fn = json_object_get(call, "function");
	CHECK(json_integer_value(json_object_get(call, "index")) == (json_int_t)tc->index);
	CHECK(same_mem(json_object_get(fn, "arguments"), tc->has_arguments ? tc->arguments.p : "",
		       tc->has_arguments ? tc->arguments.len : 0));
	if (rc) {
		/* id, type and name once per call, in its first delta */
		CHECK(!json_object_get(call, "id") == !first && !json_object_get(fn, "name") == !first);
		CHECK(!json_object_get(call, "type") == !first);
		if (first) {
			CHECK(same(json_object_get(call, "id"), &rc->id));
			CHECK(same_mem(json_object_get(fn, "name"), tc->has_name ? tc->name.p : "",
				       tc->has_name ? tc->name.len : 0));
		}
	}
	json_decref(c);
}

static void check_usage(const json_t *u, const struct k3_msg_done *d)
{
	CHECK(json_integer_value(json_object_get(u, "total_tokens")) ==
	      (json_int_t)d->prompt_tokens + (json_int_t)d->completion_tokens);
	CHECK(json_integer_value(json_object_get(json_object_get(u, "completion_tokens_details"),
						 "reasoning_tokens")) == (json_int_t)d->reasoning_tokens);
}

/* The end of the reply: the streaming final and usage chunks, and the
 * non-streaming completion, against what the events said. */
static void on_done(struct gw_openai_reply *rs, struct gw_openai_reply *rn, struct ref *ref,
		    const struct k3_msg_done *d)
{
	const char *finish = gw_openai_finish_reason(rs->ep, d);
	json_t *c, *ch, *msg;

	if (!finish) {
		struct gw_openai_reply_error e;

		gw_openai_done_error(d, &e);
		CHECK(e.status == 500 || e.status == 503);
		check_error(&e);
		return;
	}
	c = wire(gw_openai_reply_final_chunk(rs, finish));
	ch = choice0(c, rs);
	CHECK(same_mem(json_object_get(ch, "finish_reason"), finish, strlen(finish)));
	if (rs->ep == GW_EP_CHAT)
		CHECK(json_object_size(json_object_get(ch, "delta")) == 0);
	else
		CHECK(same_mem(json_object_get(ch, "text"), "", 0));
	json_decref(c);
	c = gw_openai_reply_usage_chunk(rs, d);
	CHECK(!c == !rs->include_usage);
	if (c) {
		c = wire(c);
		CHECK(json_array_size(json_object_get(c, "choices")) == 0);
		check_usage(json_object_get(c, "usage"), d);
		json_decref(c);
	}
	c = wire(gw_openai_reply_completion(rn, d, finish));
	check_usage(json_object_get(c, "usage"), d);
	ch = json_array_get(json_object_get(c, "choices"), 0);
	CHECK(same_mem(json_object_get(ch, "finish_reason"), finish, strlen(finish)));
	if (rn->ep != GW_EP_CHAT) {
		/* the answer, then any reasoning (the stream had them in arrival order) */
		json_t *text = json_object_get(ch, "text");

		CHECK(json_string_length(text) == ref->answer.len + ref->reasoning.len);
		CHECK(ref->answer.len == 0 || memcmp(json_string_value(text), ref->answer.data, ref->answer.len) == 0);
		CHECK(ref->reasoning.len == 0 || memcmp(json_string_value(text) + ref->answer.len,
							ref->reasoning.data, ref->reasoning.len) == 0);
		json_decref(c);
		return;
	}
	msg = json_object_get(ch, "message");
	if (ref->n_calls && ref->answer.len == 0)
		CHECK(json_is_null(json_object_get(msg, "content")));
	else
		CHECK(same(json_object_get(msg, "content"), &ref->answer));
	if (ref->reasoning.len)
		CHECK(same(json_object_get(msg, "reasoning_content"), &ref->reasoning));
	else
		CHECK(!json_object_get(msg, "reasoning_content"));
	if (!ref->untracked) {
		json_t *calls = json_object_get(msg, "tool_calls");

		CHECK(json_array_size(calls) == ref->n_calls);
		for (unsigned i = 0; i < ref->n_calls; i++) {
			json_t *call = json_array_get(calls, i), *fn = json_object_get(call, "function");

			CHECK(same(json_object_get(call, "id"), &ref->calls[i].id));
			CHECK(same(json_object_get(fn, "name"), &ref->calls[i].name));
			CHECK(same(json_object_get(fn, "arguments"), &ref->calls[i].args));
			CHECK(!json_object_get(call, "__index"));
		}
	}
	json_decref(c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct gw_openai_request rq;
	struct gw_openai_reply rs, rn;
	struct ref ref;
	size_t off = 1;

	if (size < 1)
		return 0;
	memset(&rq, 0, sizeof(rq));
	memset(&ref, 0, sizeof(ref));
	rq.ep = data[0] & 1 ? GW_EP_COMPLETIONS : GW_EP_CHAT;
	rq.include_usage = data[0] & 2;
	if (data[0] & 4) {
		rq.has_max_new = true;
		rq.max_new = K3_LIM_MAX_NEW;
		rq.max_asked = (long long)K3_LIM_MAX_NEW * 3;
		rq.max_param = rq.ep == GW_EP_CHAT ? "max_completion_tokens" : "max_tokens";
	}
	rq.stream = true;
	CHECK(gw_openai_reply_init(&rs, &rq, rq.ep == GW_EP_CHAT ? "chatcmpl-fuzz" : "cmpl-fuzz", 1760000000,
				   "kimi-k3") == 0);
	rq.stream = false;
	CHECK(gw_openai_reply_init(&rn, &rq, rs.id, rs.created, rs.model) == 0);
	k3_proto_buf_init(&ref.answer, SIZE_MAX);
	k3_proto_buf_init(&ref.reasoning, SIZE_MAX);
	if (rq.ep == GW_EP_CHAT) {
		json_t *c = wire(gw_openai_reply_first_chunk(&rs));

		CHECK(json_object_size(json_object_get(choice0(c, &rs), "delta")) == 2);
		json_decref(c);
	} else {
		CHECK(!gw_openai_reply_first_chunk(&rs));
	}
	while (off < size) {
		struct k3_proto_header h;
		const uint8_t *payload;
		union k3_proto_body b;
		struct k3_proto_err err;
		struct gw_openai_reply_error e;
		int n = k3_proto_frame_split(data + off, size - off, &h, &payload, &err);

		if (n <= 0)
			break;
		off += (size_t)n;
		if (k3_proto_decode(h.type, payload, h.length, &b, &err) != 0)
			continue;    /* gw_daemon fails the connection; nothing is shaped */
		if (h.type == K3_MSG_TOKEN) {
			on_token(&rs, &rn, &ref, &b.token);
		} else if (h.type == K3_MSG_TOOL_CALL) {
			on_tool_call(&rs, &rn, &ref, &b.tool_call);
		} else if (h.type == K3_MSG_HELLO_OK) {
			if (gw_openai_state_error(b.hello_ok.state, &e) < 0) {
				CHECK(e.status == 503);
				check_error(&e);
			} else {
				CHECK(b.hello_ok.state == K3_STATE_READY);
			}
		} else if (h.type == K3_MSG_DONE) {
			on_done(&rs, &rn, &ref, &b.done);
			break;
		} else if (h.type == K3_MSG_ERROR) {
			gw_openai_k3d_error(&rq, &b.error, &e);
			check_error(&e);
			break;
		}
	}
	gw_openai_reply_release(&rs);
	gw_openai_reply_release(&rn);
	k3_proto_buf_release(&ref.answer);
	k3_proto_buf_release(&ref.reasoning);
	for (unsigned i = 0; i < ref.n_calls; i++) {
		k3_proto_buf_release(&ref.calls[i].id);
		k3_proto_buf_release(&ref.calls[i].name);
		k3_proto_buf_release(&ref.calls[i].args);
	}
	return 0;
}

/*
 * test_openai_reply.c - the gateway's reply side (client/gateway/
 * gw_openai_reply.c) without HTTP, Python or a daemon: the exact bytes of
 * each chunk and completion object (what the conformance suite checks
 * through the real SDKs), model output carried byte for byte with U+0000,
 * and every row of the error map (docs/k3-gateway.md, "k3d answers ->
 * HTTP"). Runs where the Python venv of the conformance suite is missing.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "../../client/gateway/gw_openai_reply.h"
#include "t.h"

/* The wire form of v (compact, keys in insertion order); takes v. */
static char *wire(json_t *v)
{
	char *s = v ? json_dumps(v, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;

	json_decref(v);
	return s;
}

#define T_WIRE(v, want) do { \
	char *t_s_ = wire(v); \
	T_EQ_STR(t_s_, want); \
	free(t_s_); \
} while (0)

static void setup(struct gw_openai_reply *rp, enum gw_endpoint ep, bool stream, bool usage)
{
	struct gw_openai_request rq;

	memset(&rq, 0, sizeof(rq));
	rq.ep = ep;
	rq.stream = stream;
	rq.include_usage = usage;
	T_EQ_INT(gw_openai_reply_init(rp, &rq, ep == GW_EP_CHAT ? "chatcmpl-1" : "cmpl-1", 1760000000, "k3"), 0);
}

static struct k3_msg_token token(const char *text, size_t len, uint32_t channel)
{
	struct k3_msg_token t;

	memset(&t, 0, sizeof(t));
	t.text.p = text;
	t.text.len = (uint32_t)len;
	t.has_text = true;
	t.channel = channel;
	t.has_channel = true;
	return t;
}

static struct k3_msg_tool_call tool(uint32_t index, const char *id, const char *name, const char *args,
				    size_t args_len)
{
	struct k3_msg_tool_call tc;

	memset(&tc, 0, sizeof(tc));
	tc.index = index;
	if (id) {
		tc.id = k3_proto_str_of(id);
		tc.has_id = true;
	}
	if (name) {
		tc.name = k3_proto_str_of(name);
		tc.has_name = true;
	}
	if (args) {
		tc.arguments.p = args;
		tc.arguments.len = (uint32_t)args_len;
		tc.has_arguments = true;
	}
	return tc;
}

#define CHUNK "{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1760000000,\"model\":\"k3\","
#define LCHUNK "{\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":1760000000,\"model\":\"k3\","

static void test_chat_stream(void)
{
	struct gw_openai_reply rp;
	struct k3_msg_token t;
	struct k3_msg_tool_call tc;
	struct k3_msg_done d = { .finish = K3_FINISH_TOOL_CALLS, .prompt_tokens = 9, .completion_tokens = 4,
				 .reasoning_tokens = 1, .cached_tokens = 3 };

	setup(&rp, GW_EP_CHAT, true, true);
	T_WIRE(gw_openai_reply_first_chunk(&rp), CHUNK "\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\","
		"\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}");
	t = token("a\0b", 3, K3_CHANNEL_CONTENT);
	T_WIRE(gw_openai_reply_token(&rp, &t), CHUNK "\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\\u0000b\"},"
		"\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}");
	t = token("r", 1, K3_CHANNEL_REASONING);
	T_WIRE(gw_openai_reply_token(&rp, &t), CHUNK "\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"r\"},"
		"\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}");
	t = token("", 0, K3_CHANNEL_CONTENT);
	T_OK(gw_openai_reply_token(&rp, &t) == NULL);     /* nothing to send */
	tc = tool(0, NULL, "f", "{\"a", 3);
	T_WIRE(gw_openai_reply_tool_call(&rp, &tc, "call_x"), CHUNK "\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":"
		"[{\"index\":0,\"id\":\"call_x\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":"
		"\"{\\\"a\"}}]},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}");
	tc = tool(0, "call_late", "g", "\":1}", 4);   /* id, type, name only in the first delta */
	T_WIRE(gw_openai_reply_tool_call(&rp, &tc, "call_y"), CHUNK "\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":"
		"[{\"index\":0,\"function\":{\"arguments\":\"\\\":1}\"}}]},\"logprobs\":null,\"finish_reason\":null}],"
		"\"usage\":null}");
	T_EQ_STR(gw_openai_finish_reason(GW_EP_CHAT, &d), "tool_calls");
	T_WIRE(gw_openai_reply_final_chunk(&rp, "tool_calls"), CHUNK "\"choices\":[{\"index\":0,\"delta\":{},"
		"\"logprobs\":null,\"finish_reason\":\"tool_calls\"}],\"usage\":null}");
	T_WIRE(gw_openai_reply_usage_chunk(&rp, &d), CHUNK "\"choices\":[],\"usage\":{\"prompt_tokens\":9,"
		"\"completion_tokens\":4,\"total_tokens\":13,\"prompt_tokens_details\":{\"cached_tokens\":3},"
		"\"completion_tokens_details\":{\"reasoning_tokens\":1}}}");
	gw_openai_reply_release(&rp);

	setup(&rp, GW_EP_CHAT, true, false);    /* no include_usage: no usage key, no usage chunk */
	T_WIRE(gw_openai_reply_final_chunk(&rp, "stop"), CHUNK "\"choices\":[{\"index\":0,\"delta\":{},"
		"\"logprobs\":null,\"finish_reason\":\"stop\"}]}");
	T_OK(gw_openai_reply_usage_chunk(&rp, &d) == NULL);
	gw_openai_reply_release(&rp);
}

static void test_chat_completion(void)
{
	struct gw_openai_reply rp;
	struct k3_msg_token t;
	struct k3_msg_tool_call tc;
	struct k3_msg_done d = { .finish = K3_FINISH_STOP, .prompt_tokens = 2, .completion_tokens = 3 };

	setup(&rp, GW_EP_CHAT, false, false);
	t = token("th\0", 3, K3_CHANNEL_REASONING);
	T_OK(gw_openai_reply_token(&rp, &t) == NULL);
	t = token("Hi", 2, K3_CHANNEL_CONTENT);
	T_OK(gw_openai_reply_token(&rp, &t) == NULL);
	t = token(" \xc3\xa9", 3, K3_CHANNEL_CONTENT);
	T_OK(gw_openai_reply_token(&rp, &t) == NULL);
	T_WIRE(gw_openai_reply_completion(&rp, &d, "stop"), "{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion\","
		"\"created\":1760000000,\"model\":\"k3\",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\","
		"\"content\":\"Hi \xc3\xa9\",\"refusal\":null,\"reasoning_content\":\"th\\u0000\"},\"logprobs\":null,"
		"\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":2,\"completion_tokens\":3,\"total_tokens\":5,"
		"\"prompt_tokens_details\":{\"cached_tokens\":0},\"completion_tokens_details\":{\"reasoning_tokens\":0}}}");
	gw_openai_reply_release(&rp);

	/* tool calls: arguments joined with their NULs, the last name, the first
	 * id (or the fallback); content null when there was no text */
	setup(&rp, GW_EP_CHAT, false, false);
	tc = tool(1, NULL, "f", "{\"q\":\"x\0", 8);
	T_OK(gw_openai_reply_tool_call(&rp, &tc, "call_gen") == NULL);
	tc = tool(0, "call_a", "g", "{}", 2);
	T_OK(gw_openai_reply_tool_call(&rp, &tc, "call_gen2") == NULL);
	tc = tool(1, "call_ignored", "h", "y\"}", 3);
	T_OK(gw_openai_reply_tool_call(&rp, &tc, "call_gen3") == NULL);
	d.finish = K3_FINISH_TOOL_CALLS;
	T_WIRE(gw_openai_reply_completion(&rp, &d, "tool_calls"), "{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion\","
		"\"created\":1760000000,\"model\":\"k3\",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\","
		"\"content\":null,\"refusal\":null,\"tool_calls\":[{\"id\":\"call_gen\",\"type\":\"function\",\"function\":"
		"{\"name\":\"h\",\"arguments\":\"{\\\"q\\\":\\\"x\\u0000y\\\"}\"}},{\"id\":\"call_a\",\"type\":\"function\","
		"\"function\":{\"name\":\"g\",\"arguments\":\"{}\"}}]},\"logprobs\":null,\"finish_reason\":\"tool_calls\"}],"
		"\"usage\":{\"prompt_tokens\":2,\"completion_tokens\":3,\"total_tokens\":5,\"prompt_tokens_details\":"
		"{\"cached_tokens\":0},\"completion_tokens_details\":{\"reasoning_tokens\":0}}}");
	gw_openai_reply_release(&rp);
}

static void test_legacy(void)
{
	struct gw_openai_reply rp;
	struct k3_msg_token t;
	struct k3_msg_tool_call tc = tool(0, "c", "f", "{}", 2);
	struct k3_msg_done d = { .finish = K3_FINISH_TOOL_CALLS, .prompt_tokens = 1, .completion_tokens = 2 };

	setup(&rp, GW_EP_COMPLETIONS, true, false);
	T_OK(gw_openai_reply_first_chunk(&rp) == NULL);
	t = token("a\0b", 3, K3_CHANNEL_CONTENT);
	T_WIRE(gw_openai_reply_token(&rp, &t), LCHUNK "\"choices\":[{\"text\":\"a\\u0000b\",\"index\":0,"
		"\"logprobs\":null,\"finish_reason\":null}]}");
	T_OK(gw_openai_reply_tool_call(&rp, &tc, "x") == NULL);   /* legacy completions have no tools */
	T_EQ_STR(gw_openai_finish_reason(GW_EP_COMPLETIONS, &d), "stop");
	T_WIRE(gw_openai_reply_final_chunk(&rp, "stop"), LCHUNK "\"choices\":[{\"text\":\"\",\"index\":0,"
		"\"logprobs\":null,\"finish_reason\":\"stop\"}]}");
	gw_openai_reply_release(&rp);

	setup(&rp, GW_EP_COMPLETIONS, false, false);
	t = token("r", 1, K3_CHANNEL_REASONING);
	gw_openai_reply_token(&rp, &t);
	t = token("ans\0", 4, K3_CHANNEL_CONTENT);
	gw_openai_reply_token(&rp, &t);
	d.finish = K3_FINISH_LENGTH;
	T_WIRE(gw_openai_reply_completion(&rp, &d, "length"), "{\"id\":\"cmpl-1\",\"object\":\"text_completion\","
		"\"created\":1760000000,\"model\":\"k3\",\"choices\":[{\"text\":\"ans\\u0000r\",\"index\":0,"
		"\"logprobs\":null,\"finish_reason\":\"length\"}],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2,"
		"\"total_tokens\":3,\"prompt_tokens_details\":{\"cached_tokens\":0},\"completion_tokens_details\":"
		"{\"reasoning_tokens\":0}}}");
	gw_openai_reply_release(&rp);
	T_WIRE(gw_openai_model_list("k3", 5), "{\"object\":\"list\",\"data\":[{\"id\":\"k3\",\"object\":\"model\","
		"\"created\":5,\"owned_by\":\"k3d\"}]}");
}

static const struct {
	uint32_t status;
	const char *param;        /* k3d's; NULL = absent */
	enum gw_endpoint ep;
	int http;
	const char *type, *code;  /* code NULL = null */
	const char *want_param;   /* "" = null */
	const char *message;
} k3d_rows[] = {
	{ K3_STATUS_BUSY, NULL, GW_EP_CHAT, 429, "rate_limit_error", "rate_limit_exceeded", "",
	  "k3d is busy: its generation slot and queue are full (MSG). Retry after the Retry-After delay." },
	{ K3_STATUS_NOT_READY, NULL, GW_EP_CHAT, 503, "server_error", "model_not_ready", "",
	  "k3d is still loading the model: MSG" },
	{ K3_STATUS_SHUTTING_DOWN, NULL, GW_EP_CHAT, 503, "server_error", "shutting_down", "",
	  GW_OPENAI_DRAINING_WHY "; this request did not run." },
	{ K3_STATUS_CONTEXT_EXCEEDED, "max_new", GW_EP_CHAT, 400, "invalid_request_error", "context_length_exceeded",
	  "max_completion_tokens", "This model's maximum context length was exceeded: MSG ('max_completion_tokens' "
	  "was 3000000, sent to k3d as its bound 1048576)" },
	{ K3_STATUS_CONTEXT_EXCEEDED, "prompt", GW_EP_CHAT, 400, "invalid_request_error", "context_length_exceeded",
	  "messages", "This model's maximum context length was exceeded: MSG" },
	{ K3_STATUS_CONTEXT_EXCEEDED, "prompt", GW_EP_COMPLETIONS, 400, "invalid_request_error",
	  "context_length_exceeded", "prompt", "This model's maximum context length was exceeded: MSG" },
	{ K3_STATUS_CONTEXT_EXCEEDED, NULL, GW_EP_CHAT, 400, "invalid_request_error", "context_length_exceeded",
	  "messages", "This model's maximum context length was exceeded: MSG" },
	/* no param from k3d: the prompt is the client's field that ran over */
	{ K3_STATUS_CONTEXT_EXCEEDED, NULL, GW_EP_COMPLETIONS, 400, "invalid_request_error",
	  "context_length_exceeded", "prompt", "This model's maximum context length was exceeded: MSG" },
	{ K3_STATUS_INVALID_ARGUMENT, "stop", GW_EP_CHAT, 400, "invalid_request_error", "invalid_value", "stop", "MSG" },
	{ K3_STATUS_BAD_REQUEST, NULL, GW_EP_CHAT, 400, "invalid_request_error", "invalid_value", "", "MSG" },
	{ K3_STATUS_UNSUPPORTED, "tools", GW_EP_CHAT, 400, "invalid_request_error", "unsupported_value", "tools", "MSG" },
	{ K3_STATUS_TOO_LARGE, "messages", GW_EP_CHAT, 413, "invalid_request_error", NULL, "messages", "MSG" },
	{ K3_STATUS_INTERNAL, "x", GW_EP_CHAT, 500, "server_error", NULL, "", "k3d failed: MSG" },
	{ 999, NULL, GW_EP_CHAT, 500, "server_error", NULL, "", "k3d failed: MSG" },
};

static void expect(const struct gw_openai_reply_error *e, int http, const char *type, const char *code,
		   const char *param, const char *message)
{
	T_EQ_INT(e->status, http);
	T_EQ_STR(e->type, type);
	T_OK(code ? e->code && strcmp(e->code, code) == 0 : e->code == NULL);
	T_EQ_STR(e->param, param);
	T_EQ_STR(e->message, message);
}

static void test_error_map(void)
{
	struct gw_openai_reply_error e;
	struct k3_msg_done d = { .finish = K3_FINISH_CANCELLED };
	char *s;

	for (size_t i = 0; i < sizeof(k3d_rows) / sizeof(k3d_rows[0]); i++) {
		struct gw_openai_request rq;
		struct k3_msg_error ke;

		memset(&rq, 0, sizeof(rq));
		memset(&ke, 0, sizeof(ke));
		rq.ep = k3d_rows[i].ep;
		rq.has_max_new = true;
		rq.max_new = K3_LIM_MAX_NEW;
		rq.max_asked = 3000000;
		rq.max_param = "max_completion_tokens";
		ke.status = k3d_rows[i].status;
		ke.message = k3_proto_str_of("MSG");
		if (k3d_rows[i].param) {
			ke.param = k3_proto_str_of(k3d_rows[i].param);
			ke.has_param = true;
		}
		gw_openai_k3d_error(&rq, &ke, &e);
		expect(&e, k3d_rows[i].http, k3d_rows[i].type, k3d_rows[i].code, k3d_rows[i].want_param,
		       k3d_rows[i].message);
	}
	d.cancel_reason = K3_CANCEL_SHUTDOWN;
	gw_openai_done_error(&d, &e);
	expect(&e, 503, "server_error", "shutting_down", "",
	       GW_OPENAI_DRAINING_WHY "; it stopped this generation before it finished.");
	d.cancel_reason = K3_CANCEL_BY_ID;
	gw_openai_done_error(&d, &e);
	expect(&e, 500, "server_error", "cancelled", "", "an operator cancelled this generation in k3d ('k3ctl cancel')");
	d.cancel_reason = K3_CANCEL_UNSET;
	gw_openai_done_error(&d, &e);
	expect(&e, 500, "server_error", NULL, "", "the generation was cancelled in k3d");
	d.finish = K3_FINISH_ERROR;
	T_OK(gw_openai_finish_reason(GW_EP_CHAT, &d) == NULL);
	gw_openai_done_error(&d, &e);
	expect(&e, 500, "server_error", NULL, "", "the engine failed during generation");
	T_EQ_INT(gw_openai_state_error(K3_STATE_READY, &e), 0);
	T_EQ_INT(gw_openai_state_error(K3_STATE_DRAINING, &e), -1);
	expect(&e, 503, "server_error", "shutting_down", "", GW_OPENAI_DRAINING_WHY "; this request did not run.");
	T_EQ_INT(gw_openai_state_error(K3_STATE_LOADING, &e), -1);
	expect(&e, 503, "server_error", "model_not_ready", "",
	       "k3d is still loading the model; retry after the Retry-After delay.");
	T_EQ_INT(gw_openai_state_error(K3_STATE_NO_MODEL, &e), -1);
	expect(&e, 503, "server_error", "model_not_ready", "", "k3d has no model loaded; start it with --model DIR.");
	T_EQ_INT(gw_openai_state_error(7, &e), -1);
	expect(&e, 503, "server_error", "model_not_ready", "", "k3d is not ready (state 7).");
	gw_openai_stopping_error(&e);
	expect(&e, 503, "server_error", "shutting_down", "",
	       "k3-gateway is shutting down; it stopped this request before it finished.");
	T_WIRE(gw_openai_error_json("server_error", "m", "", NULL),
	       "{\"error\":{\"message\":\"m\",\"type\":\"server_error\",\"param\":null,\"code\":null}}");
	s = wire(gw_openai_error_json("server_error", "bad \xc3", NULL, NULL));
	T_OK(s == NULL);    /* invalid UTF-8 is refused, which is why cut texts are trimmed */
	free(s);
}

int main(void)
{
	test_chat_stream();
	test_chat_completion();
	test_legacy();
	test_error_map();
	return t_done();
}

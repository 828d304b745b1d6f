/*
 * test_openai_policy.c - the gateway's field policy (client/gateway/
 * gw_openai.c) without HTTP, Python or a daemon: every refusal names the
 * OpenAI param and code the man page's FIELD POLICY table promises, and
 * accepted requests map onto the exact GENERATE fields (docs/k3-gateway.md,
 * "GENERATE fields the gateway sends"). Runs where the Python venv of the
 * conformance suite is missing.
 */
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "../../client/gateway/gw_openai.h"
#include "t.h"

struct refusal {
	enum gw_endpoint ep;
	const char *body;
	const char *param;     /* "" = null */
	const char *code;      /* "" = null */
};

static const struct refusal refusals[] = {
	{ GW_EP_CHAT, "[]", "", "invalid_type" },
	{ GW_EP_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", "model", "missing_required_parameter" },
	{ GW_EP_CHAT, "{\"model\":\"m\"}", "messages", "missing_required_parameter" },
	{ GW_EP_CHAT, "{\"model\":\"m\",\"messages\":[]}", "messages", "empty_array" },
	{ GW_EP_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"bot\",\"content\":\"x\"}]}", "messages.[0].role", "invalid_value" },
	{ GW_EP_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"function\",\"content\":\"x\"}]}", "messages.[0].role", "unsupported_value" },
	{ GW_EP_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\"}]}", "messages.[0].content", "missing_required_parameter" },
	{ GW_EP_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"image_url\",\"image_url\":{\"url\":\"x\"}}]}]}", "messages.[0].content.[1].type", "" },
	{ GW_EP_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}", "messages.[0].tool_call_id", "missing_required_parameter" },
#define M "\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]"
	{ GW_EP_CHAT, "{" M ",\"foo\":1}", "foo", "unknown_parameter" },
	{ GW_EP_CHAT, "{" M ",\"top_k\":40}", "top_k", "unknown_parameter" },
	{ GW_EP_CHAT, "{" M ",\"temperature\":0.7}", "temperature", "unsupported_value" },
	{ GW_EP_CHAT, "{" M ",\"temperature\":3}", "temperature", "decimal_above_max_value" },
	{ GW_EP_CHAT, "{" M ",\"temperature\":-1}", "temperature", "decimal_below_min_value" },
	{ GW_EP_CHAT, "{" M ",\"temperature\":\"0\"}", "temperature", "invalid_type" },
	{ GW_EP_CHAT, "{" M ",\"top_p\":0}", "top_p", "decimal_below_min_value" },
	{ GW_EP_CHAT, "{" M ",\"n\":2}", "n", "unsupported_value" },
	{ GW_EP_CHAT, "{" M ",\"n\":0}", "n", "integer_below_min_value" },
	{ GW_EP_CHAT, "{" M ",\"presence_penalty\":0.1}", "presence_penalty", "unsupported_value" },
	{ GW_EP_CHAT, "{" M ",\"logit_bias\":{\"5\":1}}", "logit_bias", "unsupported_parameter" },
	{ GW_EP_CHAT, "{" M ",\"logprobs\":true}", "logprobs", "unsupported_value" },
	{ GW_EP_CHAT, "{" M ",\"seed\":1.5}", "seed", "invalid_type" },
	{ GW_EP_CHAT, "{" M ",\"max_tokens\":0}", "max_tokens", "integer_below_min_value" },
	{ GW_EP_CHAT, "{" M ",\"max_tokens\":\"5\"}", "max_tokens", "invalid_type" },
	{ GW_EP_CHAT, "{" M ",\"max_tokens\":5,\"max_completion_tokens\":7}", "max_tokens", "invalid_value" },
	{ GW_EP_CHAT, "{" M ",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", "stop", "array_above_max_length" },
	{ GW_EP_CHAT, "{" M ",\"stop\":[\"\"]}", "stop", "invalid_value" },
	{ GW_EP_CHAT, "{" M ",\"stop\":5}", "stop", "invalid_type" },
	{ GW_EP_CHAT, "{" M ",\"stream_options\":{\"include_usage\":true}}", "stream_options", "invalid_value" },
	{ GW_EP_CHAT, "{" M ",\"stream\":true,\"stream_options\":{\"x\":1}}", "stream_options.x", "unknown_parameter" },
	{ GW_EP_CHAT, "{" M ",\"reasoning_effort\":\"medium\"}", "reasoning_effort", "unsupported_value" },
	{ GW_EP_CHAT, "{" M ",\"tool_choice\":\"auto\"}", "tool_choice", "invalid_value" },
	{ GW_EP_CHAT, "{" M ",\"tools\":[{\"type\":\"custom\"}]}", "tools.[0]", "unsupported_value" },
	{ GW_EP_CHAT, "{" M ",\"functions\":[]}", "functions", "unsupported_parameter" },
	{ GW_EP_CHAT, "{" M ",\"response_format\":{\"type\":\"xml\"}}", "response_format.type", "invalid_value" },
	{ GW_EP_CHAT, "{" M ",\"store\":true}", "store", "unsupported_value" },
	{ GW_EP_CHAT, "{" M ",\"draft\":\"eagle\"}", "draft", "invalid_value" },
	{ GW_EP_CHAT, "{" M ",\"draft\":1}", "draft", "invalid_type" },
#define P "\"model\":\"m\",\"prompt\":\"a\""   /* a legacy request's minimum, as M is a chat's */
	{ GW_EP_COMPLETIONS, "{" P ",\"draft\":\"unset\"}", "draft", "invalid_value" },
	{ GW_EP_COMPLETIONS, "{\"model\":\"m\",\"prompt\":[\"a\",\"b\"]}", "prompt", "unsupported_value" },
	{ GW_EP_COMPLETIONS, "{\"model\":\"m\",\"prompt\":[1,2]}", "prompt", "unsupported_value" },
	{ GW_EP_COMPLETIONS, "{" P ",\"echo\":true}", "echo", "unsupported_value" },
	{ GW_EP_COMPLETIONS, "{" P ",\"best_of\":2}", "best_of", "unsupported_value" },
	{ GW_EP_COMPLETIONS, "{" P ",\"messages\":[]}", "messages", "unknown_parameter" },
};

static int parse(enum gw_endpoint ep, const char *text, struct gw_openai_request *r, struct gw_openai_error *e)
{
	json_t *body = json_loads(text, JSON_DECODE_ANY, NULL);
	int rc;

	memset(r, 0, sizeof(*r));
	memset(e, 0, sizeof(*e));
	if (!body)
		return -2;
	rc = gw_openai_parse(ep, body, r, e);
	json_decref(body);
	return rc;
}

static void test_refusals(void)
{
	for (size_t i = 0; i < sizeof(refusals) / sizeof(refusals[0]); i++) {
		struct gw_openai_request r;
		struct gw_openai_error e;
		int rc = parse(refusals[i].ep, refusals[i].body, &r, &e);

		if (!T_OK(rc == -1))
			fprintf(stderr, "  accepted: %s\n", refusals[i].body);
		T_EQ_INT(e.status, 400);
		T_EQ_STR(e.param, refusals[i].param);
		T_EQ_STR(e.code, refusals[i].code);
		T_OK(e.message[0] != 0);
		gw_openai_request_release(&r);
	}
}

static void test_image_message(void)
{
	struct gw_openai_request r;
	struct gw_openai_error e;

	parse(GW_EP_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_audio\"}]}]}",
	      &r, &e);
	T_EQ_STR(e.message, "Invalid content type. input_audio is only supported by certain models.");
	gw_openai_request_release(&r);
}

/* The refusal of a field that needs tools quotes the field twice, in
 * OpenAI's words. */
static void test_needs_tools(void)
{
	static const char *const said[][2] = {
		{ "{" M ",\"tool_choice\":\"auto\"}",
		  "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified." },
		{ "{" M ",\"parallel_tool_calls\":true}",
		  "Invalid value for 'parallel_tool_calls': 'parallel_tool_calls' is only allowed when 'tools' are "
		  "specified." },
	};
	struct gw_openai_request r;
	struct gw_openai_error e;

	for (size_t i = 0; i < sizeof(said) / sizeof(said[0]); i++) {
		T_EQ_INT(parse(GW_EP_CHAT, said[i][0], &r, &e), -1);
		T_EQ_STR(e.code, "invalid_value");
		T_EQ_STR(e.message, said[i][1]);
		gw_openai_request_release(&r);
	}
}

static void test_chat_mapping(void)
{
	struct gw_openai_request r;
	struct gw_openai_error e;
	struct k3_msg_generate g;
	const char *body =
		"{\"model\":\"anything\",\"temperature\":0,\"top_p\":0.5,\"n\":1,\"seed\":9,\"user\":\"u\","
		"\"max_completion_tokens\":7,\"stop\":[\"a\",\"\\n\\n\"],\"stream\":true,"
		"\"stream_options\":{\"include_usage\":true},\"reasoning_effort\":\"none\","
		"\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],\"tool_choice\":\"required\","
		"\"response_format\":{\"type\":\"json_object\"},\"messages\":["
		"{\"role\":\"developer\",\"content\":\"s\",\"junk\":1},"
		"{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"}],\"name\":\"n\"},"
		"{\"role\":\"assistant\",\"content\":null,\"reasoning\":\"r\",\"tool_calls\":[{\"id\":\"c\",\"type\":"
		"\"function\",\"function\":{\"name\":\"f\",\"arguments\":{\"x\":1}}}]},"
		"{\"role\":\"tool\",\"tool_call_id\":\"c\",\"content\":\"ok\"}]}";

	T_EQ_INT(parse(GW_EP_CHAT, body, &r, &e), 0);
	T_OK(r.stream && r.include_usage);
	T_EQ_STR(r.messages,
		 "[{\"role\":\"system\",\"content\":\"s\"},"
		 "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"}],\"name\":\"n\"},"
		 "{\"role\":\"assistant\",\"content\":null,\"reasoning_content\":\"r\",\"tool_calls\":[{\"id\":\"c\","
		 "\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"x\\\":1}\"}}]},"
		 "{\"role\":\"tool\",\"content\":\"ok\",\"tool_call_id\":\"c\"}]");
	T_EQ_STR(r.tools, "[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]");
	T_EQ_STR(r.tool_choice, "\"required\"");
	T_EQ_STR(r.response_format, "{\"type\":\"json_object\"}");
	T_EQ_STR(r.max_param, "max_completion_tokens");
	gw_openai_to_generate(&r, &g);
	T_EQ_INT(g.mode, K3_MODE_CHAT);
	T_OK(g.has_messages && g.has_tools && g.has_tool_choice && g.has_response_format && !g.has_prompt);
	T_OK(g.has_max_new);
	T_EQ_INT(g.max_new, 7);
	T_OK(g.has_stop);
	T_EQ_INT(g.stop.n, 2);
	T_EQ_MEM(g.stop.v[1].p, "\n\n", 2);
	T_OK(g.has_thinking && !g.thinking);
	T_EQ_INT(g.reasoning_effort, K3_EFFORT_NONE);
	gw_openai_request_release(&r);

	/* tools: [] is absent; effort high keeps thinking unset; no max_new */
	T_EQ_INT(parse(GW_EP_CHAT, "{" M ",\"tools\":[],\"reasoning_effort\":\"high\",\"max_tokens\":null}", &r, &e), 0);
	gw_openai_to_generate(&r, &g);
	T_OK(!g.has_tools && !g.has_thinking && !g.has_max_new && !g.has_stop);
	T_EQ_INT(g.reasoning_effort, K3_EFFORT_HIGH);
	gw_openai_request_release(&r);

	/* "draft" (k3d extension) -> GENERATE.draft_policy; absent -> absent */
	T_OK(!g.has_draft_policy);
	T_EQ_INT(parse(GW_EP_CHAT, "{" M ",\"draft\":\"ngram\"}", &r, &e), 0);
	gw_openai_to_generate(&r, &g);
	T_OK(g.has_draft_policy);
	T_EQ_INT(g.draft_policy, K3_PROTO_DRAFT_NGRAM);
	gw_openai_request_release(&r);
	T_EQ_INT(parse(GW_EP_COMPLETIONS, "{" P ",\"draft\":\"off\"}", &r, &e), 0);
	gw_openai_to_generate(&r, &g);
	T_EQ_INT(g.draft_policy, K3_PROTO_DRAFT_OFF);
	gw_openai_request_release(&r);

	/* max_tokens above the wire bound is sent as the bound */
	T_EQ_INT(parse(GW_EP_CHAT, "{" M ",\"max_tokens\":99999999999}", &r, &e), 0);
	T_EQ_INT(r.max_new, K3_LIM_MAX_NEW);
	T_OK(r.max_asked == 99999999999LL);   /* quoted if k3d refuses the bound */
	gw_openai_request_release(&r);
}

static void test_legacy_mapping(void)
{
	struct gw_openai_request r;
	struct gw_openai_error e;
	struct k3_msg_generate g;

	T_EQ_INT(parse(GW_EP_COMPLETIONS, "{\"model\":\"m\",\"prompt\":[\"Hi\"],\"stop\":\"\\nuser:\"}", &r, &e), 0);
	gw_openai_to_generate(&r, &g);
	T_EQ_INT(g.mode, K3_MODE_RAW);
	T_OK(g.has_prompt && !g.has_messages);
	T_EQ_MEM(g.prompt.p, "Hi", 2);
	T_EQ_INT(g.max_new, 16);   /* the spec's default for legacy completions */
	T_EQ_INT(g.stop.n, 1);
	gw_openai_request_release(&r);
}

/* U+0000 is text: a history that resends model output holding it (the
 * replies carry it as "\u0000") reaches k3d byte for byte, in content,
 * reasoning, tool-call arguments and tool results, and in stop strings and
 * prompts; but "user\u0000x" is no role, nor "auto\u0000" a tool_choice. */
static void test_nul_is_text(void)
{
	static const char chat[] =
		"{\"model\":\"m\",\"stop\":[\"s\\u0000t\"],\"messages\":["
		"{\"role\":\"user\",\"content\":\"a\\u0000b\"},"
		"{\"role\":\"assistant\",\"content\":\"c\\u0000\",\"reasoning_content\":\"\\u0000r\","
		"\"tool_calls\":[{\"id\":\"t\",\"type\":\"function\",\"function\":{\"name\":\"f\","
		"\"arguments\":\"{\\\"q\\\": \\\"x\\u0000y\\\"}\"}}]},"
		"{\"role\":\"tool\",\"tool_call_id\":\"t\",\"content\":[{\"type\":\"text\",\"text\":\"ok\\u0000\"}]}],"
		"\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"description\":\"d\\u0000\"}}]}";
	static const char legacy[] = "{\"model\":\"m\",\"prompt\":\"p\\u0000q\"}";
	static const struct { enum gw_endpoint ep; const char *body, *param; } refused[] = {
		{ GW_EP_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\\u0000x\",\"content\":\"a\"}]}",
		  "messages.[0].role" },
		{ GW_EP_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":"
		  "\"text\\u0000\",\"text\":\"a\"}]}]}", "messages.[0].content.[0].type" },
		{ GW_EP_CHAT, "{" M ",\"reasoning_effort\":\"low\\u0000\"}", "reasoning_effort" },
		{ GW_EP_CHAT, "{" M ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],"
		  "\"tool_choice\":\"auto\\u0000\"}", "tool_choice" },
		{ GW_EP_CHAT, "{" M ",\"tools\":[{\"type\":\"function\\u0000\",\"function\":{\"name\":\"f\"}}]}",
		  "tools.[0]" },
	};
	struct gw_openai_request r;
	struct gw_openai_error e;
	struct k3_msg_generate g;

	memset(&r, 0, sizeof(r));
	if (!T_OK(gw_openai_parse_body(GW_EP_CHAT, chat, sizeof(chat) - 1, &r, &e) == 0)) {
		printf("     %s\n", e.message);
		return;
	}
	T_EQ_STR(r.messages,
		 "[{\"role\":\"user\",\"content\":\"a\\u0000b\"},"
		 "{\"role\":\"assistant\",\"content\":\"c\\u0000\",\"reasoning_content\":\"\\u0000r\","
		 "\"tool_calls\":[{\"id\":\"t\",\"type\":\"function\",\"function\":{\"name\":\"f\","
		 "\"arguments\":\"{\\\"q\\\": \\\"x\\u0000y\\\"}\"}}]},"
		 "{\"role\":\"tool\",\"content\":[{\"type\":\"text\",\"text\":\"ok\\u0000\"}],\"tool_call_id\":\"t\"}]");
	T_EQ_STR(r.tools, "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"description\":\"d\\u0000\"}}]");
	gw_openai_to_generate(&r, &g);
	T_EQ_INT(g.stop.n, 1);
	T_EQ_INT(g.stop.v[0].len, 3);
	T_EQ_MEM(g.stop.v[0].p, "s\0t", 3);
	gw_openai_request_release(&r);

	memset(&r, 0, sizeof(r));
	if (!T_OK(gw_openai_parse_body(GW_EP_COMPLETIONS, legacy, sizeof(legacy) - 1, &r, &e) == 0))
		return;
	gw_openai_to_generate(&r, &g);
	T_EQ_INT(g.prompt.len, 3);
	T_EQ_MEM(g.prompt.p, "p\0q", 3);
	gw_openai_request_release(&r);

	for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
		memset(&r, 0, sizeof(r));
		if (!T_OK(gw_openai_parse_body(refused[i].ep, refused[i].body, strlen(refused[i].body), &r, &e) == -1))
			fprintf(stderr, "  accepted: %s\n", refused[i].body);
		T_EQ_STR(e.param, refused[i].param);
		gw_openai_request_release(&r);
	}
}

/* head, then n e-acutes (2 bytes each), then tail, into body. */
static void with_e_acutes(char *body, size_t cap, const char *head, int n, const char *tail)
{
	size_t o = (size_t)snprintf(body, cap, "%s", head);

	for (int k = 0; k < n; k++)
		o += (size_t)snprintf(body + o, cap - o, "\xc3\xa9");
	snprintf(body + o, cap - o, "%s", tail);
}

/* Error texts cut to their buffers never end in half a UTF-8 character,
 * which jansson would refuse (the 400 became a 500 "out of memory"). */
static void test_cut_texts_stay_utf8(void)
{
	static const char *const trims[][2] = {
		{ "ab\xc3", "ab" }, { "ab\xf0\x9f\x98", "ab" }, { "ab\xe9\xbe", "ab" },
		{ "ab\xc3\xa9", "ab\xc3\xa9" }, { "ab", "ab" }, { "", "" },
	};
	struct gw_openai_request r;
	struct gw_openai_error e;
	char body[4096], s[16];

	for (size_t i = 0; i < sizeof(trims) / sizeof(trims[0]); i++) {
		snprintf(s, sizeof(s), "%s", trims[i][0]);
		gw_openai_utf8_trim(s);
		T_EQ_STR(s, trims[i][1]);
	}
	/* one of the two offsets puts each cut inside a character */
	for (int odd = 0; odd < 2; odd++) {
		/* a role of 300 e-acutes: the 512-byte message is cut */
		with_e_acutes(body, sizeof(body), odd ? "{\"model\":\"m\",\"messages\":[{\"role\":\"x" :
			      "{\"model\":\"m\",\"messages\":[{\"role\":\"", 300, "\",\"content\":\"x\"}]}");
		T_EQ_INT(parse(GW_EP_CHAT, body, &r, &e), -1);
		T_EQ_STR(e.param, "messages.[0].role");
		T_OK(strlen(e.message) > 400 && k3_proto_utf8_valid(e.message, strlen(e.message)));
		gw_openai_request_release(&r);
		/* an unknown key of 100 e-acutes: param (128 bytes) is cut too */
		with_e_acutes(body, sizeof(body), odd ? "{" M ",\"x" : "{" M ",\"", 100, "\":1}");
		T_EQ_INT(parse(GW_EP_CHAT, body, &r, &e), -1);
		T_EQ_STR(e.code, "unknown_parameter");
		T_OK(strlen(e.param) > 120 && k3_proto_utf8_valid(e.param, strlen(e.param)));
		T_OK(k3_proto_utf8_valid(e.message, strlen(e.message)));
		gw_openai_request_release(&r);
	}
}

int main(void)
{
	test_refusals();
	test_image_message();
	test_needs_tools();
	test_chat_mapping();
	test_legacy_mapping();
	test_nul_is_text();
	test_cut_texts_stay_utf8();
	return t_done();
}

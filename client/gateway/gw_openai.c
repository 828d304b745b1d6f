/*
 * gw_openai.c - request parsing and field policy of the OpenAI endpoints
 * (see gw_openai.h and the FIELD POLICY table of docs/k3-gateway.8, which
 * must agree with the tables below). Error texts follow OpenAI's wording
 * where clients match on it (docs/k3-gateway.md, "Errors").
 */
#include "gw_openai.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void gw_openai_utf8_trim(char *s)
{
	size_t n = strlen(s);

	/* A cut can only split the last character, which has at most 4 bytes. */
	for (size_t k = 0; k < 4 && k <= n; k++) {
		if (k3_proto_utf8_valid(s, n - k)) {
			s[n - k] = 0;
			return;
		}
	}
}

static int fail(struct gw_openai_error *e, const char *param, const char *code, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

static int fail(struct gw_openai_error *e, const char *param, const char *code, const char *fmt, ...)
{
	va_list ap;

	e->status = 400;
	snprintf(e->param, sizeof(e->param), "%s", param ? param : "");
	snprintf(e->code, sizeof(e->code), "%s", code ? code : "");
	va_start(ap, fmt);
	vsnprintf(e->message, sizeof(e->message), fmt, ap);
	va_end(ap);
	/* Client strings (a key, a role) may be cut at the buffers' ends. */
	gw_openai_utf8_trim(e->param);
	gw_openai_utf8_trim(e->message);
	return -1;
}

static const char *type_word(const json_t *v)
{
	switch (json_typeof(v)) {
	case JSON_OBJECT: return "an object";
	case JSON_ARRAY: return "an array";
	case JSON_STRING: return "a string";
	case JSON_INTEGER: return "an integer";
	case JSON_REAL: return "a decimal";
	case JSON_TRUE:
	case JSON_FALSE: return "a boolean";
	case JSON_NULL: return "null";
	}
	return "a value";
}

static int bad_type(struct gw_openai_error *e, const char *param, const char *want, const json_t *v)
{
	return fail(e, param, "invalid_type",
		    "Invalid type for '%s': expected %s, but got %s instead.", param, want, type_word(v));
}

/* param means something only beside tools (OpenAI's words for its refusal). */
static int without_tools(struct gw_openai_error *e, const char *param)
{
	return fail(e, param, "invalid_value",
		    "Invalid value for '%s': '%s' is only allowed when 'tools' are specified.", param, param);
}

/* null means absent for every optional field (docs/k3-gateway.md,
 * "Request fields"). */
static json_t *opt(json_t *body, const char *key)
{
	json_t *v = json_object_get(body, key);

	return v && !json_is_null(v) ? v : NULL;
}

/* A number field that only its neutral value (and null) may carry: any
 * other value would change greedy output. */
static int neutral_number(json_t *body, const char *key, double neutral, double lo, double hi,
			  struct gw_openai_error *e)
{
	json_t *v = opt(body, key);
	double x;

	if (!v)
		return 0;
	if (!json_is_number(v))
		return bad_type(e, key, "a number", v);
	x = json_number_value(v);
	if (x > hi)
		return fail(e, key, "decimal_above_max_value",
			    "Invalid '%s': decimal above maximum value. Expected a value <= %g, but got %g instead.",
			    key, hi, x);
	if (x < lo)
		return fail(e, key, "decimal_below_min_value",
			    "Invalid '%s': decimal below minimum value. Expected a value >= %g, but got %g instead.",
			    key, lo, x);
	if (x != neutral)
		return fail(e, key, "unsupported_value",
			    "Unsupported value: '%s' does not support %g with this server. Only %g is supported: "
			    "k3d decodes greedily (exact argmax), so any other value would change the output.",
			    key, x, neutral);
	return 0;
}

static int get_bool(json_t *body, const char *key, bool *out, struct gw_openai_error *e)
{
	json_t *v = opt(body, key);

	if (!v)
		return 0;
	if (!json_is_boolean(v))
		return bad_type(e, key, "a boolean", v);
	*out = json_is_true(v);
	return 0;
}

/* A boolean this server can honour only as false (or absent): true is
 * refused with msg. */
static int only_false(json_t *body, const char *key, const char *msg, struct gw_openai_error *e)
{
	bool on = false;

	if (get_bool(body, key, &on, e))
		return -1;
	return on ? fail(e, key, "unsupported_value", "%s", msg) : 0;
}

/* Positive token count (max_tokens and friends). */
static int get_count(json_t *body, const char *key, bool *has, json_int_t *out,
		     struct gw_openai_error *e)
{
	json_t *v = opt(body, key);

	*has = false;
	if (!v)
		return 0;
	if (!json_is_integer(v))
		return bad_type(e, key, "an integer", v);
	*out = json_integer_value(v);
	if (*out < 1)
		return fail(e, key, "integer_below_min_value",
			    "Invalid '%s': integer below minimum value. Expected a value >= 1, but got %lld instead.",
			    key, (long long)*out);
	*has = true;
	return 0;
}

/* Whether v is the JSON string w. Length-aware: bodies may carry U+0000
 * (a history that resends model output does), and "user\u0000x" is not
 * "user". */
static bool is_word(json_t *v, const char *w)
{
	size_t n = strlen(w);

	return json_is_string(v) && json_string_length(v) == n && memcmp(json_string_value(v), w, n) == 0;
}

/* A copy of the JSON string v, U+0000 included, NUL-terminated; its
 * length in *len. NULL when out of memory. */
/* Adds s (NULL: an allocation that failed) to what r owns; returns it, or
 * NULL, having freed it, past GW_OPENAI_OWNED_MAX (not reached: each
 * string field is set once). */
static char *own(struct gw_openai_request *r, char *s)
{
	if (s && r->n_owned == GW_OPENAI_OWNED_MAX) {
		free(s);
		return NULL;
	}
	if (s)
		r->owned[r->n_owned++] = s;
	return s;
}

static char *dup_string(struct gw_openai_request *r, json_t *v, uint32_t *len)
{
	size_t n = json_string_length(v);
	char *s = own(r, malloc(n + 1));

	if (s) {
		memcpy(s, json_string_value(v), n);
		s[n] = 0;
		*len = (uint32_t)n;
	}
	return s;
}

static int dup_json(struct gw_openai_request *r, json_t *v, const char **out, struct gw_openai_error *e,
		    const char *param)
{
	*out = own(r, json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY | JSON_PRESERVE_ORDER));
	if (!*out)
		return fail(e, param, NULL, "Cannot encode '%s'.", param);
	return 0;
}

/* ---- shared sampling fields ------------------------------------------- */

static int parse_stop(json_t *body, struct gw_openai_request *r, struct gw_openai_error *e)
{
	json_t *v = opt(body, "stop"), *s;
	size_t i;

	if (!v)
		return 0;
	if (json_is_string(v)) {
		if (json_string_length(v) == 0)
			return fail(e, "stop", "invalid_value", "Invalid 'stop': empty string.");
		r->stop[0] = dup_string(r, v, &r->stop_len[0]);
		r->n_stop = 1;
	} else if (json_is_array(v)) {
		if (json_array_size(v) > K3_LIM_STOP_COUNT)
			return fail(e, "stop", "array_above_max_length",
				    "Invalid 'stop': array too long. Expected an array with maximum length %u, but got "
				    "an array with length %zu instead.", K3_LIM_STOP_COUNT, json_array_size(v));
		if (json_array_size(v) == 0)
			return fail(e, "stop", "empty_array",
				    "Invalid 'stop': empty array. Expected an array with minimum length 1, but got an "
				    "empty array instead.");
		json_array_foreach(v, i, s) {
			if (!json_is_string(s))
				return bad_type(e, "stop", "a string or an array of strings", s);
			if (json_string_length(s) == 0)
				return fail(e, "stop", "invalid_value", "Invalid 'stop': empty string.");
		}
		json_array_foreach(v, i, s) {
			r->stop[r->n_stop] = dup_string(r, s, &r->stop_len[r->n_stop]);
			r->n_stop++;
		}
	} else {
		return bad_type(e, "stop", "a string or an array of strings", v);
	}
	for (uint32_t k = 0; k < r->n_stop; k++) {
		if (!r->stop[k])
			return fail(e, "stop", NULL, "Out of memory.");
		if (r->stop_len[k] > K3_LIM_STOP_BYTES)
			return fail(e, "stop", "string_above_max_length",
				    "Invalid 'stop': each stop sequence may have at most %u bytes.", K3_LIM_STOP_BYTES);
	}
	return 0;
}

static int parse_stream(json_t *body, struct gw_openai_request *r, struct gw_openai_error *e)
{
	json_t *so;
	const char *k;
	json_t *v;

	if (get_bool(body, "stream", &r->stream, e))
		return -1;
	so = opt(body, "stream_options");
	if (!so)
		return 0;
	if (!r->stream)
		return fail(e, "stream_options", "invalid_value",
			    "The 'stream_options' parameter is only allowed when 'stream' is enabled.");
	if (!json_is_object(so))
		return bad_type(e, "stream_options", "an object", so);
	json_object_foreach(so, k, v) {
		if (strcmp(k, "include_usage") == 0) {
			if (!json_is_null(v) && !json_is_boolean(v))
				return bad_type(e, "stream_options.include_usage", "a boolean", v);
			r->include_usage = json_is_true(v);
		} else if (strcmp(k, "include_obfuscation") == 0) {
			if (!json_is_null(v) && !json_is_boolean(v))
				return bad_type(e, "stream_options.include_obfuscation", "a boolean", v);
		} else {
			char p[128];

			snprintf(p, sizeof(p), "stream_options.%s", k);
			return fail(e, p, "unknown_parameter", "Unrecognized request argument supplied: %s", p);
		}
	}
	return 0;
}

/* Fields both endpoints treat the same way. */
static int parse_common(json_t *body, struct gw_openai_request *r, struct gw_openai_error *e)
{
	json_t *v;
	bool has;
	json_int_t n;

	v = json_object_get(body, "model");
	if (!v || json_is_null(v))
		return fail(e, "model", "missing_required_parameter", "you must provide a model parameter");
	if (!json_is_string(v))
		return bad_type(e, "model", "a string", v);
	if (neutral_number(body, "temperature", 0, 0, 2, e))
		return -1;
	v = opt(body, "top_p");
	if (v) {
		double x;

		if (!json_is_number(v))
			return bad_type(e, "top_p", "a number", v);
		x = json_number_value(v);
		if (x > 1)
			return fail(e, "top_p", "decimal_above_max_value",
				    "Invalid 'top_p': decimal above maximum value. Expected a value <= 1, but got %g "
				    "instead.", x);
		/* The argmax token is inside every nucleus with top_p > 0, so
		 * those values are honoured exactly; 0 selects nothing. */
		if (!(x > 0))
			return fail(e, "top_p", "decimal_below_min_value",
				    "Invalid 'top_p': expected a value > 0, but got %g instead.", x);
	}
	if (get_count(body, "n", &has, &n, e))
		return -1;
	if (has && n != 1)
		return fail(e, "n", "unsupported_value",
			    "Unsupported value: 'n' must be 1: k3d decodes greedily, so every choice would be the same.");
	if (neutral_number(body, "presence_penalty", 0, -2, 2, e) ||
	    neutral_number(body, "frequency_penalty", 0, -2, 2, e))
		return -1;
	v = opt(body, "logit_bias");
	if (v) {
		if (!json_is_object(v))
			return bad_type(e, "logit_bias", "an object", v);
		if (json_object_size(v))
			return fail(e, "logit_bias", "unsupported_parameter",
				    "Unsupported parameter: 'logit_bias' is not supported by this server.");
	}
	v = opt(body, "seed");
	if (v && !json_is_integer(v))
		return bad_type(e, "seed", "an integer", v);
	static const char *const strings[] = { "user", "safety_identifier", "prompt_cache_key" };
	for (size_t i = 0; i < sizeof(strings) / sizeof(strings[0]); i++) {
		v = opt(body, strings[i]);
		if (v && !json_is_string(v))
			return bad_type(e, strings[i], "a string", v);
	}
	v = opt(body, "metadata");
	if (v) {
		const char *k;
		json_t *mv;

		if (!json_is_object(v))
			return bad_type(e, "metadata", "an object", v);
		if (json_object_size(v) > 16)
			return fail(e, "metadata", "object_above_max_properties",
				    "Invalid 'metadata': at most 16 keys are allowed.");
		json_object_foreach(v, k, mv) {
			if (strlen(k) > 64 || !json_is_string(mv) || json_string_length(mv) > 512)
				return fail(e, "metadata", "invalid_value",
					    "Invalid 'metadata': keys are strings of at most 64 characters and values "
					    "strings of at most 512.");
		}
	}
	/* k3d extension: the speculative-decoding policy (docs/draft.md); the
	 * output is the same for every value, so only the spelling is checked */
	v = opt(body, "draft");
	if (v) {
		if (!json_is_string(v))
			return bad_type(e, "draft", "a string", v);
		if (k3_proto_draft_policy_parse(json_string_value(v), &r->draft) < 0)
			return fail(e, "draft", "invalid_value", "Invalid 'draft': expected one of 'off', "
				    "'auto', 'ngram', 'dspark' (a k3d extension), got '%s'.",
				    json_string_value(v));
	}
	if (parse_stop(body, r, e) || parse_stream(body, r, e))
		return -1;
	return 0;
}

/* ---- messages ---------------------------------------------------------- */

static int content_parts(json_t *content, size_t mi, bool allow_refusal, json_t **out,
			 struct gw_openai_error *e)
{
	json_t *part, *arr = json_array();
	size_t j;
	char p[128];

	json_array_foreach(content, j, part) {
		json_t *type = json_object_get(part, "type");
		const char *t;

		snprintf(p, sizeof(p), "messages.[%zu].content.[%zu].type", mi, j);
		if (!json_is_object(part) || !json_is_string(type)) {
			json_decref(arr);
			return fail(e, p, "missing_required_parameter",
				    "Missing required parameter: '%s'.", p);
		}
		t = json_string_value(type);
		if (is_word(type, "text") || (allow_refusal && is_word(type, "refusal"))) {
			const char *field = t[0] == 't' ? "text" : "refusal";
			json_t *txt = json_object_get(part, field);

			if (!json_is_string(txt)) {
				json_decref(arr);
				snprintf(p, sizeof(p), "messages.[%zu].content.[%zu].%s", mi, j, field);
				return bad_type(e, p, "a string", txt ? txt : json_null());
			}
			if (t[0] == 't')
				json_array_append_new(arr, json_pack("{s:s,s:O}", "type", "text", "text", txt));
		} else if (is_word(type, "image_url") || is_word(type, "input_audio") || is_word(type, "file") ||
			   is_word(type, "image") || is_word(type, "video_url")) {
			json_decref(arr);
			/* OpenAI's text-only model answer, word for word. */
			fail(e, p, NULL, "Invalid content type. %s is only supported by certain models.", t);
			return -1;
		} else {
			json_decref(arr);
			return fail(e, p, "invalid_value",
				    "Invalid value: '%s'. Supported values are: 'text'%s.", t,
				    allow_refusal ? " and 'refusal'" : "");
		}
	}
	*out = arr;
	return 0;
}

static int tool_calls_canon(json_t *tcs, size_t mi, json_t **out, struct gw_openai_error *e)
{
	json_t *tc, *arr = json_array();
	size_t j;
	char p[128];

	json_array_foreach(tcs, j, tc) {
		json_t *id = json_object_get(tc, "id"), *fn = json_object_get(tc, "function");
		json_t *name = json_object_get(fn, "name"), *args = json_object_get(fn, "arguments");
		json_t *type = json_object_get(tc, "type"), *args_v = NULL;

		snprintf(p, sizeof(p), "messages.[%zu].tool_calls.[%zu]", mi, j);
		if (!json_is_object(tc) || !json_is_string(id) || !json_is_object(fn) || !json_is_string(name) ||
		    (type && !json_is_null(type) && !is_word(type, "function"))) {
			json_decref(arr);
			return fail(e, p, "invalid_value",
				    "Invalid '%s': expected {\"id\", \"type\": \"function\", \"function\": {\"name\", "
				    "\"arguments\"}}.", p);
		}
		/* the string as sent, U+0000 included; an object as its JSON text */
		if (json_is_string(args)) {
			args_v = json_incref(args);
		} else if (json_is_object(args)) {
			char *s = json_dumps(args, JSON_COMPACT | JSON_PRESERVE_ORDER);

			args_v = s ? json_string(s) : NULL;
			free(s);
		} else if (!args || json_is_null(args)) {
			args_v = json_string("{}");
		}
		if (!args_v) {
			json_decref(arr);
			return fail(e, p, "invalid_value", "Invalid '%s.function.arguments': expected a JSON string.", p);
		}
		json_array_append_new(arr, json_pack("{s:O,s:s,s:{s:O,s:o}}", "id", id, "type", "function",
						     "function", "name", name, "arguments", args_v));
	}
	*out = arr;
	return 0;
}

/* An optional string field of message i, copied as key into c, its
 * canonical form; -1 (e filled) when it is not a string. */
static int copy_string(json_t *c, const char *key, json_t *v, size_t i, struct gw_openai_error *e)
{
	char p[128];

	if (!v)
		return 0;
	if (!json_is_string(v)) {
		snprintf(p, sizeof(p), "messages.[%zu].%s", i, key);
		return bad_type(e, p, "a string", v);
	}
	json_object_set(c, key, v);
	return 0;
}

static int parse_messages(json_t *body, struct gw_openai_request *r, struct gw_openai_error *e)
{
	json_t *msgs = json_object_get(body, "messages"), *m, *canon;
	size_t i;
	char p[128];

	if (!msgs || json_is_null(msgs))
		return fail(e, "messages", "missing_required_parameter",
			    "Missing required parameter: 'messages'.");
	if (!json_is_array(msgs))
		return bad_type(e, "messages", "an array", msgs);
	if (json_array_size(msgs) == 0)
		return fail(e, "messages", "empty_array", "[] is too short - 'messages'");
	canon = json_array();
	json_array_foreach(msgs, i, m) {
		json_t *role = json_object_get(m, "role"), *content, *c = json_object(), *v;
		const char *ro;
		bool is_asst, is_tool;

		json_array_append_new(canon, c);
		snprintf(p, sizeof(p), "messages.[%zu].role", i);
		if (!json_is_object(m) || !json_is_string(role)) {
			json_decref(canon);
			return fail(e, p, "missing_required_parameter", "Missing required parameter: '%s'.", p);
		}
		ro = json_string_value(role);
		is_asst = is_word(role, "assistant");
		is_tool = is_word(role, "tool");
		if (is_word(role, "function")) {
			json_decref(canon);
			return fail(e, p, "unsupported_value",
				    "Unsupported value: role 'function' is deprecated; use tool calls and role 'tool'.");
		}
		if (!is_asst && !is_tool && !is_word(role, "user") && !is_word(role, "system") &&
		    !is_word(role, "developer")) {
			json_decref(canon);
			return fail(e, p, "invalid_value",
				    "Invalid value: '%s'. Supported values are: 'system', 'assistant', 'user', "
				    "'function', 'tool', and 'developer'.", ro);
		}
		json_object_set_new(c, "role", json_string(is_word(role, "developer") ? "system" : ro));
		content = json_object_get(m, "content");
		snprintf(p, sizeof(p), "messages.[%zu].content", i);
		if (!content || json_is_null(content)) {
			if (!is_asst) {
				json_decref(canon);
				return fail(e, p, "missing_required_parameter", "Missing required parameter: '%s'.", p);
			}
			json_object_set_new(c, "content", json_null());
		} else if (json_is_string(content)) {
			json_object_set(c, "content", content);
		} else if (json_is_array(content)) {
			json_t *parts = NULL;

			if (content_parts(content, i, is_asst, &parts, e)) {
				json_decref(canon);
				return -1;
			}
			json_object_set_new(c, "content", parts);
		} else {
			json_decref(canon);
			return bad_type(e, p, "a string or an array of content parts", content);
		}
		if (copy_string(c, "name", opt(m, "name"), i, e)) {
			json_decref(canon);
			return -1;
		}
		if (is_asst) {
			v = opt(m, "reasoning_content");
			if (copy_string(c, "reasoning_content", v ? v : opt(m, "reasoning"), i, e)) {
				json_decref(canon);
				return -1;
			}
			v = opt(m, "tool_calls");
			if (v) {
				json_t *tcs = NULL;

				if (!json_is_array(v)) {
					json_decref(canon);
					snprintf(p, sizeof(p), "messages.[%zu].tool_calls", i);
					return bad_type(e, p, "an array", v);
				}
				if (tool_calls_canon(v, i, &tcs, e)) {
					json_decref(canon);
					return -1;
				}
				if (json_array_size(tcs))
					json_object_set_new(c, "tool_calls", tcs);
				else
					json_decref(tcs);
			}
		}
		if (is_tool) {
			v = json_object_get(m, "tool_call_id");
			if (!json_is_string(v)) {
				json_decref(canon);
				snprintf(p, sizeof(p), "messages.[%zu].tool_call_id", i);
				return fail(e, p, "missing_required_parameter", "Missing required parameter: '%s'.", p);
			}
			json_object_set(c, "tool_call_id", v);
		}
	}
	r->messages = own(r, json_dumps(canon, JSON_COMPACT | JSON_PRESERVE_ORDER));
	json_decref(canon);
	if (!r->messages)
		return fail(e, "messages", NULL, "Cannot encode 'messages'.");
	return 0;
}

/* ---- chat-only fields -------------------------------------------------- */

static int parse_tools(json_t *body, struct gw_openai_request *r, struct gw_openai_error *e)
{
	json_t *tools = opt(body, "tools"), *tc = opt(body, "tool_choice"), *t;
	json_t *ptc = opt(body, "parallel_tool_calls");
	size_t i;

	if (tools) {
		if (!json_is_array(tools))
			return bad_type(e, "tools", "an array", tools);
		json_array_foreach(tools, i, t) {
			json_t *type = json_object_get(t, "type"), *fn = json_object_get(t, "function");
			char p[64];

			snprintf(p, sizeof(p), "tools.[%zu]", i);
			if (!json_is_object(t) || !is_word(type, "function"))
				return fail(e, p, "unsupported_value",
					    "Invalid '%s': only tools of type 'function' are supported.", p);
			if (!json_is_object(fn) || !json_is_string(json_object_get(fn, "name")))
				return fail(e, p, "missing_required_parameter",
					    "Missing required parameter: '%s.function.name'.", p);
		}
		/* tools: [] is treated as absent (issue 6), unlike OpenAI. */
		if (json_array_size(tools) == 0)
			tools = NULL;
	}
	if (tools && dup_json(r, tools, &r->tools, e, "tools"))
		return -1;
	if (tc) {
		if (!tools)
			return without_tools(e, "tool_choice");
		if (json_is_object(tc))
			return fail(e, "tool_choice", "unsupported_value",
				    "Unsupported value: 'tool_choice' naming a function is not supported; use 'auto', "
				    "'none' or 'required'.");
		if (!json_is_string(tc))
			return bad_type(e, "tool_choice", "a string", tc);
		if (!is_word(tc, "auto") && !is_word(tc, "none") && !is_word(tc, "required"))
			return fail(e, "tool_choice", "invalid_value",
				    "Invalid value: '%s'. Supported values are: 'none', 'auto', and 'required'.",
				    json_string_value(tc));
		if (dup_json(r, tc, &r->tool_choice, e, "tool_choice"))
			return -1;
	}
	if (ptc) {
		if (!tools)
			return without_tools(e, "parallel_tool_calls");
		if (!json_is_boolean(ptc))
			return bad_type(e, "parallel_tool_calls", "a boolean", ptc);
		if (json_is_false(ptc))
			return fail(e, "parallel_tool_calls", "unsupported_value",
				    "Unsupported value: 'parallel_tool_calls' false cannot be enforced by this server.");
	}
	return 0;
}

static int parse_response_format(json_t *body, struct gw_openai_request *r, struct gw_openai_error *e)
{
	json_t *rf = opt(body, "response_format"), *type;
	const char *t;

	if (!rf)
		return 0;
	if (!json_is_object(rf))
		return bad_type(e, "response_format", "an object", rf);
	type = json_object_get(rf, "type");
	if (!json_is_string(type))
		return fail(e, "response_format.type", "missing_required_parameter",
			    "Missing required parameter: 'response_format.type'.");
	t = json_string_value(type);
	if (is_word(type, "text"))
		return 0;
	if (is_word(type, "json_schema")) {
		json_t *js = json_object_get(rf, "json_schema");

		if (!json_is_object(js) || !json_is_string(json_object_get(js, "name")))
			return fail(e, "response_format.json_schema", "missing_required_parameter",
				    "Missing required parameter: 'response_format.json_schema' with a 'name'.");
	} else if (!is_word(type, "json_object")) {
		return fail(e, "response_format.type", "invalid_value",
			    "Invalid value: '%s'. Supported values are: 'text', 'json_object', and 'json_schema'.", t);
	}
	return dup_json(r, rf, &r->response_format, e, "response_format");
}

static int parse_effort(json_t *body, struct gw_openai_request *r, struct gw_openai_error *e)
{
	static const struct { const char *name; uint32_t effort; } map[] = {
		{ "none", K3_EFFORT_NONE }, { "low", K3_EFFORT_LOW },
		{ "high", K3_EFFORT_HIGH }, { "max", K3_EFFORT_MAX },
	};
	json_t *v = opt(body, "reasoning_effort");

	r->effort = K3_EFFORT_UNSET;
	if (!v)
		return 0;
	if (!json_is_string(v))
		return bad_type(e, "reasoning_effort", "a string", v);
	for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++) {
		if (is_word(v, map[i].name)) {
			r->effort = map[i].effort;
			return 0;
		}
	}
	return fail(e, "reasoning_effort", "unsupported_value",
		    "Unsupported value: 'reasoning_effort' does not support '%s' with this model. Kimi K3 supports "
		    "'none' (thinking off), 'low', 'high' and 'max'.", json_string_value(v));
}

/* Chat fields that must be absent, null, or one accepted value. */
static int chat_refusals(json_t *body, struct gw_openai_error *e)
{
	static const char *const unsupported[] = {
		"functions", "function_call", "audio", "prediction", "web_search_options", "verbosity",
	};
	json_t *v;

	for (size_t i = 0; i < sizeof(unsupported) / sizeof(unsupported[0]); i++) {
		if (opt(body, unsupported[i]))
			return fail(e, unsupported[i], "unsupported_parameter",
				    "Unsupported parameter: '%s' is not supported by this server.", unsupported[i]);
	}
	if (only_false(body, "logprobs", "Unsupported value: 'logprobs' true is not supported by this server.", e))
		return -1;
	if (opt(body, "top_logprobs"))
		return fail(e, "top_logprobs", "unsupported_parameter",
			    "Unsupported parameter: 'top_logprobs' needs 'logprobs', which this server does not "
			    "support.");
	if (only_false(body, "store", "Unsupported value: 'store' true: this server stores nothing.", e))
		return -1;
	v = opt(body, "modalities");
	if (v) {
		if (!json_is_array(v))
			return bad_type(e, "modalities", "an array", v);
		if (json_array_size(v) != 1 || !is_word(json_array_get(v, 0), "text"))
			return fail(e, "modalities", "unsupported_value",
				    "Unsupported value: 'modalities' must be [\"text\"].");
	}
	v = opt(body, "service_tier");
	if (v) {
		if (!json_is_string(v))
			return bad_type(e, "service_tier", "a string", v);
		if (!is_word(v, "auto") && !is_word(v, "default"))
			return fail(e, "service_tier", "unsupported_value",
				    "Unsupported value: 'service_tier' must be 'auto' or 'default'.");
	}
	return 0;
}

static int check_known(json_t *body, const char *const *known, size_t n, struct gw_openai_error *e)
{
	const char *k;
	json_t *v;

	json_object_foreach(body, k, v) {
		size_t i;

		for (i = 0; i < n; i++)
			if (strcmp(k, known[i]) == 0)
				break;
		if (i == n)
			return fail(e, k, "unknown_parameter", "Unrecognized request argument supplied: %s", k);
	}
	return 0;
}

static const char *const chat_known[] = {
	"model", "messages", "temperature", "top_p", "n", "max_tokens", "max_completion_tokens", "stop",
	"stream", "stream_options", "presence_penalty", "frequency_penalty", "logit_bias", "logprobs",
	"top_logprobs", "seed", "user", "safety_identifier", "prompt_cache_key", "metadata",
	"response_format", "tools", "tool_choice", "parallel_tool_calls", "functions", "function_call",
	"reasoning_effort", "verbosity", "modalities", "audio", "prediction", "web_search_options",
	"store", "service_tier", "draft",
};

static const char *const completions_known[] = {
	"model", "prompt", "temperature", "top_p", "n", "max_tokens", "stop", "stream", "stream_options",
	"presence_penalty", "frequency_penalty", "logit_bias", "logprobs", "seed", "user", "echo",
	"suffix", "best_of", "safety_identifier", "prompt_cache_key", "metadata", "draft",
};

static int set_max_new(struct gw_openai_request *r, json_int_t n)
{
	r->has_max_new = true;
	r->max_asked = (long long)n;
	/* Past K3's context no request can generate more, so larger values
	 * mean "until the context fills" rather than an error. */
	r->max_new = n > (json_int_t)K3_LIM_MAX_NEW ? K3_LIM_MAX_NEW : (uint32_t)n;
	return 0;
}

static int parse_chat(json_t *body, struct gw_openai_request *r, struct gw_openai_error *e)
{
	bool has_a, has_b;
	json_int_t a = 0, b = 0;

	if (check_known(body, chat_known, sizeof(chat_known) / sizeof(chat_known[0]), e) ||
	    parse_common(body, r, e) || chat_refusals(body, e) || parse_messages(body, r, e) ||
	    parse_tools(body, r, e) || parse_response_format(body, r, e) || parse_effort(body, r, e))
		return -1;
	if (get_count(body, "max_tokens", &has_a, &a, e) ||
	    get_count(body, "max_completion_tokens", &has_b, &b, e))
		return -1;
	if (has_a && has_b && a != b)
		return fail(e, "max_tokens", "invalid_value",
			    "Invalid 'max_tokens': 'max_tokens' (%lld) and 'max_completion_tokens' (%lld) disagree; "
			    "send one of them.", (long long)a, (long long)b);
	if (has_a || has_b) {
		set_max_new(r, has_b ? b : a);
		r->max_param = has_a ? "max_tokens" : "max_completion_tokens";
	}
	return 0;
}

static int parse_completions(json_t *body, struct gw_openai_request *r, struct gw_openai_error *e)
{
	json_t *prompt, *v;
	bool has;
	json_int_t n = 16;

	if (check_known(body, completions_known, sizeof(completions_known) / sizeof(completions_known[0]), e) ||
	    parse_common(body, r, e))
		return -1;
	prompt = json_object_get(body, "prompt");
	if (!prompt || json_is_null(prompt))
		return fail(e, "prompt", "missing_required_parameter", "Missing required parameter: 'prompt'.");
	if (json_is_array(prompt)) {
		if (json_array_size(prompt) != 1)
			return fail(e, "prompt", "unsupported_value",
				    "Unsupported value: 'prompt' must be one string (or an array of exactly one string); "
				    "this server runs one generation per request.");
		prompt = json_array_get(prompt, 0);
	}
	if (!json_is_string(prompt))
		return fail(e, "prompt", "unsupported_value",
			    "Unsupported value: 'prompt' must be a string; token-id prompts are not supported.");
	r->prompt = dup_string(r, prompt, &r->prompt_len);
	if (!r->prompt)
		return fail(e, "prompt", NULL, "Out of memory.");
	v = opt(body, "logprobs");
	if (v && !(json_is_integer(v) && json_integer_value(v) == 0))
		return fail(e, "logprobs", "unsupported_value",
			    "Unsupported value: 'logprobs' is not supported by this server.");
	if (only_false(body, "echo", "Unsupported value: 'echo' true is not supported.", e))
		return -1;
	if (opt(body, "suffix"))
		return fail(e, "suffix", "unsupported_parameter",
			    "Unsupported parameter: 'suffix' is not supported by this server.");
	if (get_count(body, "best_of", &has, &n, e))
		return -1;
	if (has && n != 1)
		return fail(e, "best_of", "unsupported_value",
			    "Unsupported value: 'best_of' must be 1: k3d decodes greedily.");
	n = 16;   /* the spec's default for legacy completions */
	if (get_count(body, "max_tokens", &has, &n, e))
		return -1;
	set_max_new(r, has ? n : 16);
	r->max_param = "max_tokens";
	return 0;
}

int gw_openai_parse(enum gw_endpoint ep, json_t *body, struct gw_openai_request *out, struct gw_openai_error *e)
{
	out->ep = ep;
	if (!json_is_object(body))
		return fail(e, NULL, "invalid_type",
			    "The request body must be a JSON object, but got %s.", type_word(body));
	return ep == GW_EP_CHAT ? parse_chat(body, out, e) : parse_completions(body, out, e);
}

static bool json_too_deep(json_t *v, unsigned depth)
{
	size_t i;
	const char *k;
	json_t *c;

	if (depth > K3_LIM_JSON_DEPTH)
		return true;
	if (json_is_array(v)) {
		json_array_foreach(v, i, c)
			if (json_too_deep(c, depth + 1))
				return true;
	} else if (json_is_object(v)) {
		json_object_foreach(v, k, c)
			if (json_too_deep(c, depth + 1))
				return true;
	}
	return false;
}

int gw_openai_parse_body(enum gw_endpoint ep, const char *body, size_t len, struct gw_openai_request *out,
			 struct gw_openai_error *e)
{
	json_error_t je;
	/* JSON_ALLOW_NUL: "\u0000" is text like any other (model output holds
	 * it, and a client resends its history); every string is taken with
	 * its length from here on. */
	json_t *v = json_loadb(len ? body : "", len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY | JSON_ALLOW_NUL,
			       &je);
	int rc;

	if (!v)
		return fail(e, NULL, NULL,
			    "We could not parse the JSON body of your request (%s at line %d, column %d). The "
			    "body must be valid JSON.", je.text, je.line, je.column);
	if (json_too_deep(v, 0)) {
		json_decref(v);
		return fail(e, NULL, NULL, "The JSON body nests deeper than %u levels.", K3_LIM_JSON_DEPTH);
	}
	rc = gw_openai_parse(ep, v, out, e);
	json_decref(v);
	return rc;
}

void gw_openai_request_release(struct gw_openai_request *r)
{
	for (uint32_t i = 0; i < r->n_owned; i++)
		free(r->owned[i]);
	memset(r, 0, sizeof(*r));
}

void gw_openai_to_generate(const struct gw_openai_request *r, struct k3_msg_generate *g)
{
	memset(g, 0, sizeof(*g));
	if (r->ep == GW_EP_CHAT) {
		k3_msg_generate_set_mode(g, K3_MODE_CHAT);
		if (r->messages)
			k3_msg_generate_set_messages(g, k3_proto_str_of(r->messages));
		if (r->tools)
			k3_msg_generate_set_tools(g, k3_proto_str_of(r->tools));
		if (r->tool_choice)
			k3_msg_generate_set_tool_choice(g, k3_proto_str_of(r->tool_choice));
		if (r->response_format)
			k3_msg_generate_set_response_format(g, k3_proto_str_of(r->response_format));
		if (r->effort == K3_EFFORT_NONE)
			k3_msg_generate_set_thinking(g, false);
		if (r->effort != K3_EFFORT_UNSET)
			k3_msg_generate_set_reasoning_effort(g, r->effort);
	} else {
		k3_msg_generate_set_mode(g, K3_MODE_RAW);
		if (r->prompt)
			k3_msg_generate_set_prompt(g, (struct k3_proto_str){ r->prompt, r->prompt_len });
	}
	if (r->has_max_new)
		k3_msg_generate_set_max_new(g, r->max_new);
	for (uint32_t i = 0; i < r->n_stop; i++)
		g->stop.v[i] = (struct k3_proto_str){ r->stop[i], r->stop_len[i] };
	g->stop.n = r->n_stop;
	g->has_stop = r->n_stop > 0;
	if (r->draft)
		k3_msg_generate_set_draft_policy(g, r->draft);
}

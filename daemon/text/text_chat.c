/*
 * text_chat.c - K3 XTML renderer (see text_chat.h; docs/text-and-draft.md
 * §3). The order of operations follows build_chat_segments: re-sort tool
 * results, normalize tool-call arguments, tool declaration, effort message,
 * messages, tool_choice, response_format, generation prompt.
 */
#include "text/text_chat.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/array.h"
#include "text/text_json.h"
#include "text/text_sbuf.h"

#define OPEN "<|open|>"
#define CLOSE "<|close|>"
#define SEP "<|sep|>"
#define EOM "<|end_of_msg|>"

struct render {
	struct k3_sbuf text;
	struct k3_chat *out;
	struct k3_err *err;
	int rc;                 /* first error, sticky */
};

static int fail(struct render *r, int code, const char *fmt, const char *a, size_t idx)
{
	if (!r->rc) {
		r->rc = code;
		char m[K3_ERR_MSG_MAX];
		snprintf(m, sizeof(m), fmt, a ? a : "");
		k3_err_set(r->err, code, "message %zu: %s", idx, m);
	}
	return r->rc;
}

static void seg(struct render *r, const char *s, size_t n, bool special)
{
	struct k3_chat *c = r->out;

	if (n == 0 || r->rc)
		return;   /* empty texts produce no segment (_segment) */
	if (k3_array_reserve(&c->segs, &c->cap_segs, c->n_segs + 1, sizeof(*c->segs), 64)) {
		r->text.oom = true;
		return;
	}
	c->segs[c->n_segs++] = (struct k3_chat_seg){ r->text.n, n, special };
	k3_sbuf_add(&r->text, s, n);
}

static void text(struct render *r, const char *s) { seg(r, s, strlen(s), false); }
static void control(struct render *r, const char *s) { seg(r, s, strlen(s), true); }

/* One attribute: ` key`, `="`, escaped value, `"` as four text segments
 * (latest release; vLLM's vendored copy joins them). */
static void attr(struct render *r, const char *key, size_t key_len, const char *val, size_t n)
{
	struct k3_sbuf k = { 0 }, e = { 0 };

	k3_sbuf_addc(&k, ' ');
	k3_sbuf_add(&k, key, key_len);
	for (size_t i = 0; i < n; i++) {
		if (val[i] == '&')
			k3_sbuf_adds(&e, "&amp;");
		else if (val[i] == '"')
			k3_sbuf_adds(&e, "&quot;");
		else
			k3_sbuf_addc(&e, val[i]);
	}
	if (k.oom || e.oom)
		r->text.oom = true;
	else {
		seg(r, k.p, k.n, false);
		text(r, "=\"");
		seg(r, e.p ? e.p : "", e.n, false);
		text(r, "\"");
	}
	k3_sbuf_release(&k);
	k3_sbuf_release(&e);
}

/* Attribute whose value is Python str() of a JSON scalar. */
static void attr_json(struct render *r, const char *key, const json_t *v, size_t idx)
{
	struct k3_sbuf s = { 0 };

	if (k3_pyjson_str(v, &s)) {
		fail(r, -EINVAL, "attribute '%s' must be a string or number", key, idx);
	} else if (s.oom) {
		r->text.oom = true;
	} else {
		attr(r, key, strlen(key), s.p ? s.p : "", s.n);
	}
	k3_sbuf_release(&s);
}

static void open_plain(struct render *r, const char *tag)
{
	control(r, OPEN);
	text(r, tag);
	control(r, SEP);
}

static void close_tag(struct render *r, const char *tag)
{
	control(r, CLOSE);
	text(r, tag);
	control(r, SEP);
}

static void internal_system(struct render *r, const char *type, const char *body, size_t body_len)
{
	control(r, OPEN);
	text(r, "message");
	attr(r, "role", 4, "system", 6);
	attr(r, "type", 4, type, strlen(type));
	control(r, SEP);
	/* body.strip(): the fixed bodies have no outer whitespace */
	seg(r, body, body_len, false);
	close_tag(r, "message");
	control(r, EOM);
}

static void tool_declare(struct render *r, const json_t *tools, bool dynamic)
{
	struct k3_sbuf b = { 0 };

	k3_sbuf_adds(&b, dynamic ?
		"## New Tools Available\n"
		"The system dynamically extends the toolset via lazy-loading.\n"
		"You have access to all existing and extended tools.\n"
		"Here are the specs for the extended tools.\n\n"
		"```json\n" :
		"# Tools\n"
		"Here are the available tools, described in JSONSchema.\n\n"
		"```json\n");
	if (k3_pyjson_dump(tools, K3_PYJSON_COMPACT | K3_PYJSON_SORT_KEYS, &b))
		fail(r, -EINVAL, "tools nest too deeply%s", NULL, 0);
	k3_sbuf_adds(&b, "\n```");
	if (b.oom)
		r->text.oom = true;
	control(r, OPEN);
	text(r, "message");
	attr(r, "role", 4, "system", 6);
	attr(r, "type", 4, "tool-declare", 12);
	control(r, SEP);
	seg(r, b.p, b.n, false);
	close_tag(r, "message");
	control(r, EOM);
	k3_sbuf_release(&b);
}

/* str(x) of a value appended as one text segment (empty → nothing). */
static void text_json(struct render *r, const json_t *v, const char *what, size_t idx)
{
	struct k3_sbuf s = { 0 };

	if (k3_pyjson_str(v, &s))
		fail(r, -EINVAL, "%s must be a string", what, idx);
	else if (s.oom)
		r->text.oom = true;
	else
		seg(r, s.p, s.n, false);
	k3_sbuf_release(&s);
}

static void content(struct render *r, const json_t *c, size_t idx)
{
	if (!c || json_is_null(c))
		return;
	if (json_is_string(c)) {
		seg(r, json_string_value(c), json_string_length(c), false);
		return;
	}
	if (!json_is_array(c)) {
		fail(r, -EINVAL, "'content' must be a string, null or a list of parts%s", NULL, idx);
		return;
	}
	for (size_t i = 0; i < json_array_size(c) && !r->rc; i++) {
		const json_t *part = json_array_get(c, i);
		const char *type = json_string_value(json_object_get(part, "type"));
		if (!json_is_object(part) || !type) {
			fail(r, -EINVAL, "content parts must be objects with a 'type'%s", NULL, idx);
			return;
		}
		if (!strcmp(type, "image") || !strcmp(type, "image_url") || !strcmp(type, "input_audio") ||
		    !strcmp(type, "audio") || !strcmp(type, "video") || !strcmp(type, "video_url")) {
			fail(r, -ENOTSUP, "content part of type '%s' is not supported: this server is text-only",
			     type, idx);
			return;
		}
		if (!json_object_get(part, "text")) {
			fail(r, -EINVAL, "content part of type '%s' has no 'text'", type, idx);
			return;
		}
		text_json(r, json_object_get(part, "text"), "a content part's 'text'", idx);
	}
}

static const char *xtml_type(const json_t *v)
{
	switch (json_typeof(v)) {
	case JSON_TRUE:
	case JSON_FALSE: return "boolean";
	case JSON_NULL: return "null";
	case JSON_INTEGER:
	case JSON_REAL: return "number";
	case JSON_STRING: return "string";
	case JSON_OBJECT: return "object";
	default: return "array";
	}
}

/* normalize_tool_arguments: sets *args (borrowed or *owned) or *raw. */
static int norm_args(struct render *r, const json_t *a, const json_t **args, json_t **owned,
		     const char **raw, size_t *raw_len, size_t idx)
{
	*args = NULL;
	*owned = NULL;
	*raw = NULL;
	if (!a || json_is_null(a))
		return 0;
	if (json_is_object(a)) {
		*args = a;
		return 0;
	}
	if (json_is_string(a)) {
		const char *s = json_string_value(a);
		size_t n = json_string_length(a);
		json_t *p;
		if (k3_tok_py_isblank(s, n))
			return 0;
		p = json_loadb(s, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);   /* Python's json.loads takes \u0000 */
		if (!p) {
			*raw = s;
			*raw_len = n;
			return 0;
		}
		if (!json_is_object(p)) {
			json_decref(p);
			return fail(r, -EINVAL, "tool call arguments must be a JSON object%s", NULL, idx);
		}
		*args = *owned = p;
		return 0;
	}
	return fail(r, -EINVAL, "tool call arguments must be an object or a JSON object string%s", NULL, idx);
}

static void assistant_body(struct render *r, const json_t *m, bool thinking, size_t idx)
{
	const json_t *calls = json_object_get(m, "tool_calls");

	if (thinking) {
		const json_t *rc = json_object_get(m, "reasoning_content");
		if (!k3_pyjson_truthy(rc))
			rc = json_object_get(m, "reasoning");
		open_plain(r, "think");
		if (rc && !json_is_null(rc)) {
			struct k3_sbuf s = { 0 };
			if (k3_pyjson_str(rc, &s))
				fail(r, -EINVAL, "'reasoning_content' must be a string%s", NULL, idx);
			else if (!k3_tok_py_isblank(s.p ? s.p : "", s.n))
				seg(r, s.p, s.n, false);
			r->text.oom |= s.oom;
			k3_sbuf_release(&s);
		}
		close_tag(r, "think");
	}
	open_plain(r, "response");
	content(r, json_object_get(m, "content"), idx);
	close_tag(r, "response");

	if (!k3_pyjson_truthy(calls))
		return;
	if (!json_is_array(calls)) {
		fail(r, -EINVAL, "'tool_calls' must be a list%s", NULL, idx);
		return;
	}
	open_plain(r, "tools");
	for (size_t i = 0; i < json_array_size(calls) && !r->rc; i++) {
		const json_t *tc = json_array_get(calls, i), *fn, *name, *args = NULL;
		const char *raw = NULL;
		size_t raw_len = 0;
		json_t *owned = NULL;
		char ix[24];

		if (!json_is_object(tc)) {
			fail(r, -EINVAL, "each tool call must be an object%s", NULL, idx);
			return;
		}
		fn = json_object_get(tc, "function");
		if (!fn)
			fn = tc;
		name = json_object_get(fn, "name");
		if (!json_is_object(fn) || !name) {
			fail(r, -EINVAL, "a tool call has no function name%s", NULL, idx);
			return;
		}
		/* arguments live in the function object when it is one */
		if (norm_args(r, json_object_get(fn, "arguments"), &args, &owned, &raw, &raw_len, idx))
			return;
		control(r, OPEN);
		text(r, "call");
		attr_json(r, "tool", name, idx);
		snprintf(ix, sizeof(ix), "%zu", i + 1);
		attr(r, "index", 5, ix, strlen(ix));
		control(r, SEP);
		if (raw) {
			control(r, OPEN);
			text(r, "json");
			attr(r, "type", 4, "object", 6);
			control(r, SEP);
			seg(r, raw, raw_len, false);
			close_tag(r, "json");
		} else if (args) {
			const char *key;
			json_t *v;
			json_object_foreach((json_t *)args, key, v) {
				struct k3_sbuf s = { 0 };
				control(r, OPEN);
				text(r, "argument");
				attr(r, "key", 3, key, strlen(key));
				attr(r, "type", 4, xtml_type(v), strlen(xtml_type(v)));
				control(r, SEP);
				if (json_is_string(v))
					seg(r, json_string_value(v), json_string_length(v), false);
				else if (k3_pyjson_dump(v, 0, &s))
					fail(r, -EINVAL, "tool call argument nests too deeply%s", NULL, idx);
				else
					seg(r, s.p, s.n, false);
				r->text.oom |= s.oom;
				k3_sbuf_release(&s);
				close_tag(r, "argument");
			}
		}
		close_tag(r, "call");
		json_decref(owned);
	}
	close_tag(r, "tools");
}

/* ---- tool-result re-sorting (normalize_xtml_tool_result_messages) ------- */

struct item {
	const json_t *m;
	const json_t *tool;     /* resolved function name overriding `tool`, or NULL */
	size_t pos, off;        /* sort key within a run */
	size_t src;             /* original index, for error messages */
};

struct call_key { char *id; size_t pos; const json_t *name; };

static void free_keys(struct call_key *k, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(k[i].id);
	free(k);
}

static char *py_str_dup(const json_t *v)
{
	struct k3_sbuf s = { 0 };
	if (k3_pyjson_str(v, &s) || s.oom) {
		k3_sbuf_release(&s);
		return NULL;
	}
	if (!s.p)
		return strdup("");
	return s.p;
}

static int item_cmp(const void *a, const void *b)
{
	const struct item *x = a, *y = b;
	if (x->pos != y->pos)
		return x->pos < y->pos ? -1 : 1;
	return x->off < y->off ? -1 : x->off > y->off;
}

static bool role_is(const json_t *m, const char *role)
{
	const char *r = json_string_value(json_object_get(m, "role"));
	return json_is_object(m) && r && strcmp(r, role) == 0;
}

static int resort_tools(const json_t *msgs, struct item *items)
{
	size_t n = json_array_size(msgs), i = 0;
	struct call_key *keys = NULL;
	size_t nk = 0;

	while (i < n) {
		const json_t *m = json_array_get(msgs, i);
		if (role_is(m, "assistant")) {
			const json_t *calls = json_object_get(m, "tool_calls");
			free_keys(keys, nk);
			keys = NULL;
			nk = 0;
			if (k3_pyjson_truthy(calls) && json_is_array(calls)) {
				keys = calloc(json_array_size(calls), sizeof(*keys));
				if (!keys)
					return -ENOMEM;
				for (size_t p = 0; p < json_array_size(calls); p++) {
					const json_t *tc = json_array_get(calls, p), *id, *fn;
					char *k;
					bool dup = false;
					if (!json_is_object(tc) || !(id = json_object_get(tc, "id")) || json_is_null(id))
						continue;
					if (!(k = py_str_dup(id)))
						continue;
					for (size_t q = 0; q < nk; q++)
						dup |= strcmp(keys[q].id, k) == 0;
					if (dup) {
						free(k);
						continue;
					}
					fn = json_object_get(tc, "function");
					keys[nk++] = (struct call_key){ k, p + 1,
						json_is_object(fn) ? json_object_get(fn, "name") : json_object_get(tc, "name") };
				}
			}
			items[i] = (struct item){ m, NULL, 0, 0, i };
			i++;
			continue;
		}
		if (!role_is(m, "tool")) {
			items[i] = (struct item){ m, NULL, 0, 0, i };
			i++;
			continue;
		}
		size_t start = i;
		bool unresolved = false;
		for (; i < n && role_is(json_array_get(msgs, i), "tool"); i++) {
			const json_t *t = json_array_get(msgs, i), *cid, *name = NULL;
			size_t pos = 0;
			cid = json_object_get(t, "tool_call_id");
			if (!cid)
				cid = json_object_get(t, "id");
			if (cid && !json_is_null(cid)) {
				char *k = py_str_dup(cid);
				for (size_t q = 0; k && q < nk; q++) {
					if (!strcmp(keys[q].id, k)) {
						pos = keys[q].pos;
						name = keys[q].name;
						break;
					}
				}
				free(k);
			}
			if (!pos)
				unresolved = true;
			items[i] = (struct item){ t, name && !json_is_null(name) ? name : NULL, pos, i - start, i };
		}
		if (unresolved) {
			for (size_t q = start; q < i; q++)
				items[q].tool = NULL;
		} else {
			qsort(items + start, i - start, sizeof(*items), item_cmp);
		}
	}
	free_keys(keys, nk);
	return 0;
}

/* ---- the renderer --------------------------------------------------------- */

void k3_chat_opts_init(struct k3_chat_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->thinking = true;
	o->add_generation_prompt = true;
}

int k3_chat_opts_from_json(const json_t *obj, struct k3_chat_opts *o, struct k3_err *err)
{
	const json_t *v;

	if (!json_is_object(obj))
		return k3_err_set(err, -EINVAL, "chat options must be a JSON object");
	if ((v = json_object_get(obj, "thinking")) || (v = json_object_get(obj, "enable_thinking"))) {
		if (!json_is_boolean(v))
			return k3_err_set(err, -EINVAL, "'thinking' must be true or false");
		o->thinking = json_is_true(v);
	}
	if ((v = json_object_get(obj, "reasoning_effort")) && !json_is_null(v)) {
		const char *s = json_string_value(v);
		if (s && !strcmp(s, "none"))
			o->thinking = false;
		else if (s && (!strcmp(s, "low") || !strcmp(s, "high") || !strcmp(s, "max")))
			o->thinking_effort = s;
		else
			return k3_err_set(err, -EINVAL, "Kimi K3 supports thinking_effort values: low, high, max");
	}
	if ((v = json_object_get(obj, "thinking_effort"))) {
		if (json_is_null(v))
			o->thinking_effort = NULL;
		else if (!json_is_string(v))
			return k3_err_set(err, -EINVAL, "'thinking_effort' must be a string");
		else
			o->thinking_effort = json_string_value(v);
	}
	if ((v = json_object_get(obj, "tools")))
		o->tools = v;
	if ((v = json_object_get(obj, "tool_choice")))
		o->tool_choice = v;
	if ((v = json_object_get(obj, "response_format")))
		o->response_format = v;
	if ((v = json_object_get(obj, "response_schema"))) {
		o->response_schema = v;
		o->has_response_schema = true;
	}
	if ((v = json_object_get(obj, "add_generation_prompt"))) {
		if (!json_is_boolean(v))
			return k3_err_set(err, -EINVAL, "'add_generation_prompt' must be true or false");
		o->add_generation_prompt = json_is_true(v);
	}
	return 0;
}

void k3_chat_release(struct k3_chat *c)
{
	if (!c)
		return;
	free(c->text);
	free(c->segs);
	memset(c, 0, sizeof(*c));
}

/* extract_response_schema */
static const json_t *response_schema(const json_t *rf)
{
	const json_t *js, *v;

	if (!json_is_object(rf))
		return NULL;
	js = json_object_get(rf, "json_schema");
	if (!js || json_is_null(js))
		return NULL;
	if (!json_is_object(js))
		return js;
	if ((v = json_object_get(js, "schema")))
		return v;
	if ((v = json_object_get(js, "json_schema")))
		return v;
	return js;
}

static void render_message(struct render *r, const struct item *it, const struct k3_chat_opts *o,
			   const json_t **last_calls, size_t *tool_index)
{
	const json_t *m = it->m, *name;
	const char *role;
	size_t idx = it->src;

	if (!json_is_object(m))
		return;
	if (!json_object_get(m, "role")) {
		fail(r, -EINVAL, "message has no 'role'%s", NULL, idx);
		return;
	}
	role = json_string_value(json_object_get(m, "role"));
	if (!role)
		return;
	if (!strcmp(role, "developer"))
		role = "system";
	name = json_object_get(m, "name");

	if (!strcmp(role, "user") || (!strcmp(role, "system") && !k3_pyjson_truthy(json_object_get(m, "tools")))) {
		control(r, OPEN);
		text(r, "message");
		attr(r, "role", 4, role, strlen(role));
		if (k3_pyjson_truthy(name))
			attr_json(r, "name", name, idx);
		control(r, SEP);
		content(r, json_object_get(m, "content"), idx);
		close_tag(r, "message");
		control(r, EOM);
	} else if (!strcmp(role, "system")) {
		tool_declare(r, json_object_get(m, "tools"), true);
	} else if (!strcmp(role, "tool")) {
		const json_t *tool;
		char ix[24];
		++*tool_index;
		/* message.get("tool", message.get("name")): a present `tool`
		 * wins even when null */
		if (it->tool)
			tool = it->tool;
		else if (json_object_get(m, "tool"))
			tool = json_object_get(m, "tool");
		else
			tool = name;
		if ((!tool || json_is_null(tool)) && *last_calls && json_is_array(*last_calls) &&
		    *tool_index <= json_array_size(*last_calls)) {
			const json_t *tc = json_array_get(*last_calls, *tool_index - 1);
			const json_t *fn = json_object_get(tc, "function");
			tool = json_object_get(fn ? fn : tc, "name");
		}
		if (!tool || json_is_null(tool)) {
			fail(r, -EINVAL, "tool message needs a resolvable tool name: carry 'tool'/'name', "
			     "or match a preceding assistant tool_call by order%s", NULL, idx);
			return;
		}
		control(r, OPEN);
		text(r, "message");
		attr(r, "role", 4, "tool", 4);
		attr_json(r, "tool", tool, idx);
		snprintf(ix, sizeof(ix), "%zu", *tool_index);
		attr(r, "index", 5, ix, strlen(ix));
		control(r, SEP);
		content(r, json_object_get(m, "content"), idx);
		close_tag(r, "message");
		control(r, EOM);
	} else if (!strcmp(role, "assistant")) {
		*last_calls = json_object_get(m, "tool_calls");
		if (*last_calls && json_is_null(*last_calls))
			*last_calls = NULL;
		*tool_index = 0;
		control(r, OPEN);
		text(r, "message");
		attr(r, "role", 4, "assistant", 9);
		if (k3_pyjson_truthy(name))
			attr_json(r, "name", name, idx);
		control(r, SEP);
		assistant_body(r, m, o->thinking, idx);
		close_tag(r, "message");
		control(r, EOM);
	}
	/* other roles are skipped, as in the release */
}

int k3_chat_render(const json_t *messages, const struct k3_chat_opts *o, struct k3_chat *out,
		   struct k3_err *err)
{
	struct render r = { .out = out, .err = err };
	struct item *items = NULL;
	const json_t *last_calls = NULL;
	size_t n, tool_index = 0;

	memset(out, 0, sizeof(*out));
	if (!json_is_array(messages))
		return k3_err_set(err, -EINVAL, "'messages' must be a list");
	/* checked before anything is rendered (the release asserts) */
	if (o->thinking && o->thinking_effort && strcmp(o->thinking_effort, "low") &&
	    strcmp(o->thinking_effort, "high") && strcmp(o->thinking_effort, "max"))
		return k3_err_set(err, -EINVAL, "unsupported thinking_effort '%.40s'; supported values are high, low, max",
				  o->thinking_effort);
	n = json_array_size(messages);
	items = calloc(n ? n : 1, sizeof(*items));
	if (!items || resort_tools(messages, items)) {
		free(items);
		return k3_err_set(err, -ENOMEM, "out of memory rendering %zu messages", n);
	}

	if (k3_pyjson_truthy(o->tools))
		tool_declare(&r, o->tools, false);

	if (o->thinking && o->thinking_effort) {
		const char *e = o->thinking_effort;
		char body[512];
		int bl = snprintf(body, sizeof(body),
			"`thinking_effort` guides on how much to think in your thinking channel "
			"(not including the response channel), supported values include "
			"`low`, `medium`, `high`, and `max`.\n"
			"Now the system is invoked with `thinking_effort=%s`.", e);
		internal_system(&r, "thinking-effort", body, (size_t)bl);
	}

	for (size_t i = 0; i < n && !r.rc; i++)
		render_message(&r, &items[i], o, &last_calls, &tool_index);
	free(items);

	if (json_is_string(o->tool_choice)) {
		static const char req[] = "The system is invoked with `tool_choice=required`.\n"
					  "You MUST call tools in the next message.";
		static const char none[] = "The system is invoked with `tool_choice=none`.\n"
					   "You MUST NOT call any tools in the next message.";
		if (!strcmp(json_string_value(o->tool_choice), "required"))
			internal_system(&r, "tool-choice", req, sizeof(req) - 1);
		else if (!strcmp(json_string_value(o->tool_choice), "none"))
			internal_system(&r, "tool-choice", none, sizeof(none) - 1);
	}

	{
		const json_t *rf = o->response_format, *t = rf;
		static const char head[] = "The system is invoked with `response_format=%s`.\n"
			"Your response must be raw JSON data without markdown code blocks (```json) "
			"or any additional formatting.";
		if (json_is_object(rf) && json_object_get(rf, "type"))
			t = json_object_get(rf, "type");
		const char *ts = json_string_value(t);
		if (ts && !strcmp(ts, "json_object")) {
			char body[256];
			int bl = snprintf(body, sizeof(body), head, "json_object");
			internal_system(&r, "response-format", body, (size_t)bl);
		} else if (ts && !strcmp(ts, "json_schema")) {
			struct k3_sbuf b = { 0 };
			char h[256];
			const json_t *schema = o->has_response_schema ? o->response_schema : response_schema(rf);
			snprintf(h, sizeof(h), head, "json_schema");
			k3_sbuf_adds(&b, h);
			k3_sbuf_adds(&b, "\nThe JSON data must match the following schema:\n```json\n");
			if (k3_pyjson_dump(schema, K3_PYJSON_COMPACT | K3_PYJSON_SORT_KEYS, &b))
				fail(&r, -EINVAL, "response schema nests too deeply%s", NULL, 0);
			k3_sbuf_adds(&b, "\n```");
			r.text.oom |= b.oom;
			internal_system(&r, "response-format", b.p, b.n);
			k3_sbuf_release(&b);
		}
	}

	if (o->add_generation_prompt) {
		control(&r, OPEN);
		text(&r, "message");
		attr(&r, "role", 4, "assistant", 9);
		control(&r, SEP);
		open_plain(&r, o->thinking ? "think" : "response");
	}

	if (!r.rc && r.text.oom)
		r.rc = k3_err_set(err, -ENOMEM, "out of memory rendering the chat");
	if (r.rc) {
		k3_sbuf_release(&r.text);
		k3_chat_release(out);
		return r.rc;
	}
	out->text = r.text.p ? r.text.p : strdup("");
	out->text_len = r.text.n;
	if (!out->text) {
		k3_chat_release(out);
		return k3_err_set(err, -ENOMEM, "out of memory rendering the chat");
	}
	return 0;
}

int k3_chat_encode(const struct k3_tok *tok, const struct k3_chat *chat, struct k3_tok_ids *ids,
		   struct k3_err *err)
{
	size_t n0 = ids->n;

	for (size_t i = 0; i < chat->n_segs; i++) {
		const struct k3_chat_seg *s = &chat->segs[i];
		int rc = k3_tok_encode(tok, chat->text + s->off, s->len, s->special, ids, err);
		if (rc) {
			ids->n = n0;
			return rc;
		}
	}
	return 0;
}

/* ---- parallel encoding ---------------------------------------------------- */

struct enc_job {
	const struct k3_tok *tok;
	const struct k3_chat *chat;
	size_t first, last;     /* segment range [first, last) */
	struct k3_tok_ids ids;
	struct k3_err err;
	int rc;
};

static void *enc_run(void *arg)
{
	struct enc_job *j = arg;

	for (size_t i = j->first; i < j->last && !j->rc; i++) {
		const struct k3_chat_seg *s = &j->chat->segs[i];
		j->rc = k3_tok_encode(j->tok, j->chat->text + s->off, s->len, s->special, &j->ids, &j->err);
	}
	return NULL;
}

int k3_chat_encode_parallel(const struct k3_tok *tok, const struct k3_chat *chat, unsigned n_threads,
			    struct k3_tok_ids *ids, struct k3_err *err)
{
	struct enc_job jobs[64];
	pthread_t th[64];
	size_t per, at = 0, total = 0;
	unsigned n = 0, started = 0;
	int rc = 0;

	if (n_threads > 64)
		n_threads = 64;
	if (n_threads <= 1 || chat->text_len < K3_CHAT_PAR_MIN_BYTES || chat->n_segs < 2)
		return k3_chat_encode(tok, chat, ids, err);
	/* contiguous runs of about equal bytes keep the order trivially */
	per = chat->text_len / n_threads + 1;
	while (at < chat->n_segs && n < n_threads) {
		size_t bytes = 0, first = at;
		while (at < chat->n_segs && (bytes < per || n + 1 == n_threads))
			bytes += chat->segs[at++].len;
		jobs[n] = (struct enc_job){ .tok = tok, .chat = chat, .first = first, .last = at };
		n++;
	}
	for (unsigned i = 1; i < n; i++) {
		if (pthread_create(&th[i], NULL, enc_run, &jobs[i]))
			break;
		started = i;
	}
	enc_run(&jobs[0]);
	for (unsigned i = 1; i <= started; i++)
		pthread_join(th[i], NULL);
	if (started + 1 < n)
		rc = k3_err_set(err, -EAGAIN, "cannot start encoder threads");
	for (unsigned i = 0; i < n && !rc; i++) {
		if (jobs[i].rc) {
			rc = jobs[i].rc;
			if (err)
				*err = jobs[i].err;
		}
		total += jobs[i].ids.n;
	}
	if (!rc) {
		size_t need = ids->n + total;
		if (need > ids->cap) {
			uint32_t *v = realloc(ids->v, need * sizeof(*v));
			if (!v)
				rc = k3_err_set(err, -ENOMEM, "out of memory joining %zu ids", total);
			else {
				ids->v = v;
				ids->cap = need;
			}
		}
		for (unsigned i = 0; i < n && !rc; i++) {
			if (jobs[i].ids.n)
				memcpy(ids->v + ids->n, jobs[i].ids.v, jobs[i].ids.n * sizeof(uint32_t));
			ids->n += jobs[i].ids.n;
		}
	}
	for (unsigned i = 0; i < n; i++)
		k3_tok_ids_release(&jobs[i].ids);
	return rc;
}

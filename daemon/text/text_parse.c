/* text_parse.c - incremental K3 output parser (see text_parse.h). */
#include "text/text_parse.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "text/text_detok.h"
#include "text/text_json.h"
#include "text/text_sbuf.h"

enum ctx { C_ROOT, C_THINK, C_RESPONSE, C_TOOLS, C_CALL, C_ARG, C_JSON, C_OTHER };
enum route { R_REASONING, R_CONTENT, R_BETWEEN, R_ARG, R_JSON, R_DROP };
enum mode { M_TEXT, M_OPEN_HDR, M_CLOSE_HDR };

#define DEPTH_MAX 32
#define HDR_MAX 4096
#define TAG_MAX 40

struct frame {
	enum ctx c;
	char tag[TAG_MAX];
};

struct k3_parse {
	const struct k3_tok *tok;
	struct k3_parse_opts o;
	k3_parse_cb cb;
	void *ud;
	struct frame st[DEPTH_MAX];
	unsigned depth;
	enum mode mode;
	struct k3_sbuf hdr, raw, between, argval, jsonraw, tmp, textq;
	bool in_call, dropped, arg_string, args_done;
	unsigned n_calls, n_args;
	uint64_t id_ctr;
	bool ended;
	int rc;
};

void k3_parse_opts_init(struct k3_parse_opts *o)
{
	o->thinking = true;
	o->id_seed = 0;
}

int k3_parse_new(const struct k3_tok *tok, const struct k3_parse_opts *o, k3_parse_cb cb, void *ud,
		 struct k3_parse **out, struct k3_err *err)
{
	struct k3_parse *p = calloc(1, sizeof(*p));

	if (!p)
		return k3_err_set(err, -ENOMEM, "out of memory");
	p->tok = tok;
	if (o)
		p->o = *o;
	else
		k3_parse_opts_init(&p->o);
	p->cb = cb;
	p->ud = ud;
	p->st[0].c = C_ROOT;
	strcpy(p->st[0].tag, "message");
	p->st[1].c = p->o.thinking ? C_THINK : C_RESPONSE;
	strcpy(p->st[1].tag, p->o.thinking ? "think" : "response");
	p->depth = 2;
	*out = p;
	return 0;
}

void k3_parse_free(struct k3_parse *p)
{
	if (!p)
		return;
	k3_sbuf_release(&p->hdr);
	k3_sbuf_release(&p->raw);
	k3_sbuf_release(&p->between);
	k3_sbuf_release(&p->argval);
	k3_sbuf_release(&p->jsonraw);
	k3_sbuf_release(&p->tmp);
	k3_sbuf_release(&p->textq);
	free(p);
}

static void emit(struct k3_parse *p, enum k3_parse_ev_type t, const char *s, size_t n)
{
	struct k3_parse_event ev = { .type = t, .text = s, .len = n, .tool_index = p->n_calls ? p->n_calls - 1 : 0 };

	if (p->rc || ((t == K3_PARSE_REASONING || t == K3_PARSE_CONTENT || t == K3_PARSE_TOOL_ARGS) && n == 0))
		return;
	p->rc = p->cb(p->ud, &ev);
}

static void emit_args(struct k3_parse *p, const char *s)
{
	emit(p, K3_PARSE_TOOL_ARGS, s, strlen(s));
}

static enum route route_of(const struct k3_parse *p)
{
	for (unsigned i = p->depth; i-- > 0;) {
		switch (p->st[i].c) {
		case C_THINK: return R_REASONING;
		case C_RESPONSE:
		case C_ROOT: return R_CONTENT;
		case C_TOOLS:
		case C_CALL: return R_BETWEEN;
		case C_ARG: return p->dropped ? R_DROP : R_ARG;
		case C_JSON: return p->dropped ? R_DROP : R_JSON;
		case C_OTHER: continue;
		}
	}
	return R_CONTENT;
}

/* JSON-escapes s (Python json.dumps string body, without quotes). */
static void json_escape_into(struct k3_sbuf *b, const char *s, size_t n)
{
	struct k3_sbuf t = { 0 };
	json_t *j = json_stringn_nocheck(s, n);

	if (!j) {
		b->oom = true;
		return;
	}
	k3_pyjson_dump(j, 0, &t);
	if (t.n >= 2)
		k3_sbuf_add(b, t.p + 1, t.n - 2);
	b->oom |= t.oom;
	k3_sbuf_release(&t);
	json_decref(j);
}

/* Complete UTF-8 text for the current route. */
static void route_text(struct k3_parse *p, const char *s, size_t n)
{
	if (!n)
		return;
	switch (route_of(p)) {
	case R_REASONING:
		emit(p, K3_PARSE_REASONING, s, n);
		break;
	case R_CONTENT:
		emit(p, K3_PARSE_CONTENT, s, n);
		break;
	case R_BETWEEN:
		k3_sbuf_add(&p->between, s, n);
		break;
	case R_ARG:
		if (p->arg_string) {
			p->tmp.n = 0;
			json_escape_into(&p->tmp, s, n);
			emit(p, K3_PARSE_TOOL_ARGS, p->tmp.p, p->tmp.n);
		} else {
			k3_sbuf_add(&p->argval, s, n);
		}
		break;
	case R_JSON:
		k3_sbuf_add(&p->jsonraw, s, n);
		break;
	case R_DROP:
		break;
	}
}

/* Text bytes of one token. */
static void add_bytes(struct k3_parse *p, const uint8_t *b, size_t n, bool final)
{
	struct k3_sbuf out = { 0 };
	size_t used;

	k3_sbuf_add(&p->raw, b, n);
	if (!p->raw.n)
		return;
	used = k3_utf8_take((const uint8_t *)p->raw.p, p->raw.n, final, &out);
	memmove(p->raw.p, p->raw.p + used, p->raw.n - used);
	p->raw.n -= used;
	if (out.oom)
		p->rc = p->rc ? p->rc : -ENOMEM;
	route_text(p, out.p, out.n);
	k3_sbuf_release(&out);
}

/* Before any structural change: no byte of text may cross it. */
static void flush_text(struct k3_parse *p)
{
	add_bytes(p, NULL, 0, true);
	if (p->between.n) {
		if (!k3_tok_py_isblank(p->between.p, p->between.n))
			emit(p, K3_PARSE_CONTENT, p->between.p, p->between.n);
		p->between.n = 0;
	}
}

/* An unterminated header is the model's text: degrade to content. */
static void header_as_text(struct k3_parse *p)
{
	if (p->mode != M_TEXT && p->hdr.n) {
		struct k3_sbuf out = { 0 };
		k3_utf8_take((const uint8_t *)p->hdr.p, p->hdr.n, true, &out);
		emit(p, K3_PARSE_CONTENT, out.p, out.n);
		k3_sbuf_release(&out);
	}
	p->hdr.n = 0;
	p->mode = M_TEXT;
}

static void finish_arg(struct k3_parse *p)
{
	if (p->dropped)
		return;
	if (p->arg_string) {
		emit_args(p, "\"");
		return;
	}
	json_t *j = json_loadb(p->argval.p ? p->argval.p : "", p->argval.n, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
	p->tmp.n = 0;
	if (j) {
		k3_pyjson_dump(j, 0, &p->tmp);
		json_decref(j);
	} else {
		k3_sbuf_addc(&p->tmp, '"');
		json_escape_into(&p->tmp, p->argval.p ? p->argval.p : "", p->argval.n);
		k3_sbuf_addc(&p->tmp, '"');
	}
	emit(p, K3_PARSE_TOOL_ARGS, p->tmp.p, p->tmp.n);
	p->argval.n = 0;
}

static void finish_json(struct k3_parse *p)
{
	if (p->dropped || p->n_args || p->args_done) {
		p->jsonraw.n = 0;
		return;
	}
	json_t *j = json_loadb(p->jsonraw.p ? p->jsonraw.p : "", p->jsonraw.n, JSON_ALLOW_NUL, NULL);
	p->tmp.n = 0;
	if (json_is_object(j))
		k3_pyjson_dump(j, 0, &p->tmp);
	else
		k3_sbuf_add(&p->tmp, p->jsonraw.p, p->jsonraw.n);
	json_decref(j);
	emit(p, K3_PARSE_TOOL_ARGS, p->tmp.p, p->tmp.n);
	p->args_done = true;
	p->jsonraw.n = 0;
}

static void finish_call(struct k3_parse *p)
{
	if (!p->in_call)
		return;
	if (!p->dropped) {
		if (!p->args_done)
			emit_args(p, p->n_args ? "}" : "{}");
		emit(p, K3_PARSE_TOOL_END, NULL, 0);
	}
	p->in_call = false;
	p->dropped = false;
}

static void pop(struct k3_parse *p)
{
	switch (p->st[--p->depth].c) {
	case C_ARG: finish_arg(p); break;
	case C_JSON: finish_json(p); break;
	case C_CALL: finish_call(p); break;
	default: break;
	}
}

static void push(struct k3_parse *p, enum ctx c, const char *tag, size_t tag_len)
{
	if (p->depth == DEPTH_MAX)
		return;   /* deeper nesting is ignored; its text joins the parent */
	p->st[p->depth].c = c;
	if (tag_len >= TAG_MAX)
		tag_len = TAG_MAX - 1;
	memcpy(p->st[p->depth].tag, tag, tag_len);
	p->st[p->depth].tag[tag_len] = 0;
	p->depth++;
}

/* Finds attribute `key` in a header's attribute text; unescapes its value
 * (&quot; then &amp;) into out. Returns false when absent. */
static bool header_attr(const char *a, size_t n, const char *key, struct k3_sbuf *out)
{
	size_t kl = strlen(key), i = 0;

	out->n = 0;
	while (i < n) {
		while (i < n && a[i] == ' ')
			i++;
		size_t ks = i;
		while (i < n && a[i] != '=' && a[i] != ' ')
			i++;
		if (i + 1 >= n || a[i] != '=' || a[i + 1] != '"')
			return false;
		size_t ke = i, vs = i + 2, ve = vs;
		while (ve < n && a[ve] != '"')
			ve++;
		if (ke - ks == kl && memcmp(a + ks, key, kl) == 0) {
			for (size_t j = vs; j < ve; j++) {
				if (!strncmp(a + j, "&quot;", 6) && j + 6 <= ve) {
					k3_sbuf_addc(out, '"');
					j += 5;
				} else if (!strncmp(a + j, "&amp;", 5) && j + 5 <= ve) {
					k3_sbuf_addc(out, '&');
					j += 4;
				} else {
					k3_sbuf_addc(out, a[j]);
				}
			}
			k3_sbuf_add(out, "", 0);
			return true;
		}
		i = ve + 1;
	}
	return false;
}

static bool in_ctx(const struct k3_parse *p, enum ctx c)
{
	return p->depth && p->st[p->depth - 1].c == c;
}

static void call_id(struct k3_parse *p, char out[32])
{
	uint64_t a, b, z = p->o.id_seed + 0x9e3779b97f4a7c15ull * ++p->id_ctr;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	a = z ^ (z >> 31);
	b = (a * 0x9e3779b97f4a7c15ull) ^ (a >> 29);
	snprintf(out, 32, "call_%016llx%08llx", (unsigned long long)a, (unsigned long long)(b & 0xffffffffu));
}

static void handle_open(struct k3_parse *p)
{
	const char *h = p->hdr.p ? p->hdr.p : "";
	size_t n = p->hdr.n, tl = 0;
	struct k3_sbuf v = { 0 };

	while (tl < n && h[tl] != ' ')
		tl++;
#define IS(t) (tl == sizeof(t) - 1 && memcmp(h, t, tl) == 0)
	if (IS("think")) {
		push(p, C_THINK, h, tl);
	} else if (IS("response")) {
		push(p, C_RESPONSE, h, tl);
	} else if (IS("tools")) {
		push(p, C_TOOLS, h, tl);
	} else if (IS("call") && !p->in_call) {
		char id[32];
		push(p, C_CALL, h, tl);
		p->in_call = true;
		p->n_args = 0;
		p->args_done = false;
		p->dropped = !header_attr(h + tl, n - tl, "tool", &v) || v.n == 0;
		if (!p->dropped) {
			struct k3_parse_event ev = { .type = K3_PARSE_TOOL_START, .tool_index = p->n_calls++,
						     .name = v.p, .name_len = v.n, .id = id };
			call_id(p, id);
			if (!p->rc)
				p->rc = p->cb(p->ud, &ev);
		}
	} else if (IS("argument") && in_ctx(p, C_CALL)) {
		push(p, C_ARG, h, tl);
		bool has_type = header_attr(h + tl, n - tl, "type", &v);
		p->arg_string = !has_type || (v.n == 6 && !memcmp(v.p, "string", 6));
		p->argval.n = 0;
		if (!p->dropped && !p->args_done) {
			p->tmp.n = 0;
			k3_sbuf_adds(&p->tmp, p->n_args ? ", \"" : "{\"");
			header_attr(h + tl, n - tl, "key", &v);
			json_escape_into(&p->tmp, v.p ? v.p : "", v.n);
			k3_sbuf_adds(&p->tmp, p->arg_string ? "\": \"" : "\": ");
			emit(p, K3_PARSE_TOOL_ARGS, p->tmp.p, p->tmp.n);
			p->n_args++;
		} else {
			p->dropped = true;   /* an argument after a json block: ignore */
		}
	} else if (IS("json") && in_ctx(p, C_CALL)) {
		push(p, C_JSON, h, tl);
		p->jsonraw.n = 0;
	} else {
		push(p, C_OTHER, h, tl);
	}
#undef IS
	k3_sbuf_release(&v);
}

static void handle_close(struct k3_parse *p)
{
	const char *h = p->hdr.p ? p->hdr.p : "";
	size_t n = p->hdr.n < TAG_MAX - 1 ? p->hdr.n : TAG_MAX - 1;

	for (unsigned i = p->depth; i-- > 0;) {
		if (strlen(p->st[i].tag) == n && memcmp(p->st[i].tag, h, n) == 0) {
			while (p->depth > i)
				pop(p);
			return;
		}
	}
	/* closing a tag that is not open (e.g. think with thinking off): ignore */
}

static void end_stream(struct k3_parse *p)
{
	flush_text(p);
	header_as_text(p);
	while (p->depth)
		pop(p);
	p->ended = true;
	emit(p, K3_PARSE_END, NULL, 0);
}

int k3_parse_feed_id(struct k3_parse *p, uint32_t id)
{
	const uint8_t *b;
	size_t n;

	if (k3_tok_id_bytes(p->tok, id, &b, &n))
		return -ERANGE;
	if (p->ended || p->rc)
		return p->rc;
	if (k3_tok_is_special(p->tok, id)) {
		uint32_t base = k3_tok_special(p->tok, 0);
		switch (id - base) {
		case K3_TOK_SP_OPEN:
		case K3_TOK_SP_CLOSE:
			flush_text(p);
			header_as_text(p);
			p->mode = id - base == K3_TOK_SP_OPEN ? M_OPEN_HDR : M_CLOSE_HDR;
			break;
		case K3_TOK_SP_SEP:
			if (p->mode == M_OPEN_HDR)
				handle_open(p);
			else if (p->mode == M_CLOSE_HDR)
				handle_close(p);
			p->hdr.n = 0;
			p->mode = M_TEXT;
			break;
		case K3_TOK_SP_END_OF_MSG:
		case K3_TOK_SP_EOS:
			end_stream(p);
			break;
		default:
			break;   /* other specials carry no text and no structure */
		}
	} else if (p->mode != M_TEXT) {
		k3_sbuf_add(&p->hdr, b, n);
		if (p->hdr.n > HDR_MAX)
			header_as_text(p);
	} else {
		add_bytes(p, b, n, false);
	}
	if (!p->rc && (p->hdr.oom || p->raw.oom || p->between.oom || p->argval.oom || p->jsonraw.oom || p->tmp.oom))
		p->rc = -ENOMEM;
	return p->rc;
}

static int feed_ids(struct k3_parse *p, const char *s, size_t n)
{
	struct k3_tok_ids ids = { 0 };
	int rc = k3_tok_encode(p->tok, s, n, true, &ids, NULL);

	for (size_t i = 0; !rc && i < ids.n; i++)
		rc = k3_parse_feed_id(p, ids.v[i]);
	k3_tok_ids_release(&ids);
	return rc;
}

int k3_parse_feed_text(struct k3_parse *p, const char *text, size_t len)
{
	size_t n, keep = 0, valid;
	int rc;

	k3_sbuf_add(&p->textq, text, len);
	if (p->textq.oom)
		return -ENOMEM;
	n = p->textq.n;
	valid = k3_tok_utf8_valid_prefix(p->textq.p, n);
	if (n - valid > 3)
		return -EILSEQ;
	if (valid < n) {
		/* a character cut by the caller: keep it whole for later */
		keep = n - valid;
		n = valid;
	}
	/* hold a tail that may grow into a special name */
	for (size_t j = n > K3_TOK_SPECIAL_NAME_MAX ? n - K3_TOK_SPECIAL_NAME_MAX : 0; j < n; j++) {
		if (k3_tok_special_prefix(p->tok, p->textq.p + j, n - j)) {
			keep += n - j;
			n = j;
			break;
		}
	}
	rc = feed_ids(p, p->textq.p, n);
	memmove(p->textq.p, p->textq.p + n, keep);
	p->textq.n = keep;
	return rc;
}

int k3_parse_finish(struct k3_parse *p)
{
	int rc = 0;

	if (p->textq.n) {
		size_t v = k3_tok_utf8_valid_prefix(p->textq.p, p->textq.n);
		rc = feed_ids(p, p->textq.p, v);
		p->textq.n = 0;
	}
	if (!rc && !p->ended && !p->rc)
		end_stream(p);
	return rc ? rc : p->rc;
}

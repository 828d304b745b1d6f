/*
 * parse_collect.h - what the text tests collect from the K3 output parser
 * (daemon/text/text_parse.h): the reasoning and content text, and the
 * first four tool calls' names, ids and arguments, all as bytes (U+0000
 * included); the counts of calls, tool ends and ends. Shared by
 * test_stream.c and test_nul.c.
 */
#ifndef K3_TEST_PARSE_COLLECT_H
#define K3_TEST_PARSE_COLLECT_H

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "text/text_parse.h"
#include "text/text_sbuf.h"

enum { TG_CALLS = 4 };

struct tg_collect {
	struct k3_sbuf reasoning, content, args[TG_CALLS], names[TG_CALLS];
	char ids[TG_CALLS][40];
	unsigned n_calls, n_end, n_tool_end;
	bool bad_order;              /* a call's index was not the next one */
};

/* The parser's event callback; ud is a zeroed struct tg_collect. */
static inline int tg_collect_event(void *ud, const struct k3_parse_event *ev)
{
	struct tg_collect *c = ud;

	switch (ev->type) {
	case K3_PARSE_REASONING: k3_sbuf_add(&c->reasoning, ev->text, ev->len); break;
	case K3_PARSE_CONTENT: k3_sbuf_add(&c->content, ev->text, ev->len); break;
	case K3_PARSE_TOOL_START:
		c->bad_order |= ev->tool_index != c->n_calls;
		if (c->n_calls < TG_CALLS) {
			k3_sbuf_add(&c->names[c->n_calls], ev->name, ev->name_len);
			snprintf(c->ids[c->n_calls], sizeof(c->ids[0]), "%s", ev->id);
		}
		c->n_calls++;
		break;
	case K3_PARSE_TOOL_ARGS:
		if (ev->tool_index < TG_CALLS)
			k3_sbuf_add(&c->args[ev->tool_index], ev->text, ev->len);
		break;
	case K3_PARSE_TOOL_END: c->n_tool_end++; break;
	case K3_PARSE_END: c->n_end++; break;
	}
	return 0;
}

static inline void tg_collect_release(struct tg_collect *c)
{
	k3_sbuf_release(&c->reasoning);
	k3_sbuf_release(&c->content);
	for (int i = 0; i < TG_CALLS; i++) {
		k3_sbuf_release(&c->args[i]);
		k3_sbuf_release(&c->names[i]);
	}
}

#endif

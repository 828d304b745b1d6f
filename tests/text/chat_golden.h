/* chat_golden.h - turns a golden chat.jsonl line into renderer options. */
#ifndef K3_TEST_CHAT_GOLDEN_H
#define K3_TEST_CHAT_GOLDEN_H

#include "text/text_chat.h"

/* options + kwargs of a golden line → opts (values borrowed from line) */
static inline void cg_opts(json_t *line, struct k3_chat_opts *o)
{
	json_t *op = json_object_get(line, "options"), *kw = json_object_get(line, "kwargs");
	k3_chat_opts_init(o);
	o->thinking = !json_is_false(json_object_get(op, "thinking"));
	o->thinking_effort = json_string_value(json_object_get(op, "thinking_effort"));
	o->tools = json_object_get(op, "tools");
	o->tool_choice = json_object_get(op, "tool_choice");
	o->response_format = json_object_get(op, "response_format");
	if (json_object_get(kw, "response_schema")) {
		o->has_response_schema = true;
		o->response_schema = json_object_get(kw, "response_schema");
	}
	o->add_generation_prompt = !json_is_false(json_object_get(op, "add_generation_prompt"));
}

#endif

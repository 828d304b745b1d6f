/*
 * sched_stage.c - output staging: what a generated id becomes on the wire
 * (sched_internal.h, "output staging"). The ids that end a generation
 * (end of message, EOS, the request's stop_ids), the stop-string holdback
 * (text that might begin a stop string is held until it cannot, and a
 * matched stop string is never sent), the chat output parser's split into
 * reasoning, content and tool calls, and the TOKEN / TOOL_CALL events.
 *
 * Runs on the engine thread (sched_stage_prepare: wherever the request is
 * prepared). It decides nothing about the model: the decode loop
 * (sched_job.c) asks it once per committed id whether to stop.
 */
#include "server/sched_internal.h"

#include <errno.h>
#include <string.h>

#include "model/model.h"

int sched_stage_prepare(const struct k3_sched *s, const struct k3_msg_generate *g,
			struct sched_job *j)
{
	const struct k3_model_config *mc = k3_model_config(s->model);

	if (s->tok) {
		j->end_ids[j->n_end++] = k3_tok_special(s->tok, K3_TOK_SP_END_OF_MSG);
		j->end_ids[j->n_end++] = k3_tok_special(s->tok, K3_TOK_SP_EOS);
	} else if (mc->eos_token_id >= 0) {
		j->end_ids[j->n_end++] = (uint32_t)mc->eos_token_id;
	}
	for (uint32_t i = 0; g->has_stop_ids && i < g->stop_ids.n; i++)
		j->end_ids[j->n_end++] = k3_proto_ids_at(&g->stop_ids, i);
	for (uint32_t i = 0; g->has_stop && i < g->stop.n; i++) {
		if (g->stop.v[i].len == 0)
			return sched_prep_fail(j, K3_STATUS_INVALID_ARGUMENT, "stop", -EINVAL,
					       "stop strings must not be empty");
		j->stop[i] = strndup(g->stop.v[i].p, g->stop.v[i].len);
		if (!j->stop[i])
			return sched_prep_fail(j, K3_STATUS_INTERNAL, NULL, -ENOMEM, "out of memory");
		j->n_stop = i + 1;
	}
	return 0;
}

static void post_tool(struct sched_job *j, unsigned index, const char *id, const char *name,
		      size_t name_len, const char *args, size_t args_len)
{
	struct k3_msg_tool_call t;

	memset(&t, 0, sizeof(t));
	k3_msg_tool_call_set_index(&t, index);
	if (id)
		k3_msg_tool_call_set_id(&t, k3_proto_str_of(id));
	if (name)
		k3_msg_tool_call_set_name(&t, (struct k3_proto_str){ name, (uint32_t)name_len });
	if (args)
		k3_msg_tool_call_set_arguments(&t, (struct k3_proto_str){ args, (uint32_t)args_len });
	sched_post_frame(j, K3_MSG_TOOL_CALL, &t);
}

static int stage_parse_cb(void *ud, const struct k3_parse_event *ev)
{
	struct sched_stage *st = ud;
	const char *t;
	size_t n;
	int r;

	switch (ev->type) {
	case K3_PARSE_REASONING:
		k3_sbuf_add(&st->reasoning, ev->text, ev->len);
		st->channel = K3_CHANNEL_REASONING;
		break;
	case K3_PARSE_CONTENT:
		if (st->stopped)
			break;
		r = k3_detok_feed_text(st->detok, ev->text, ev->len, &t, &n);
		if (r < 0)
			return r;
		k3_sbuf_add(&st->content, t, n);
		st->channel = K3_CHANNEL_CONTENT;
		if (r == 1)
			st->stopped = true;
		break;
	case K3_PARSE_TOOL_START:
		st->any_tool = true;
		post_tool(st->j, ev->tool_index, ev->id, ev->name, ev->name_len, NULL, 0);
		break;
	case K3_PARSE_TOOL_ARGS:
		post_tool(st->j, ev->tool_index, NULL, NULL, 0, ev->text, ev->len);
		break;
	case K3_PARSE_TOOL_END:
		break;
	case K3_PARSE_END:
		st->stopped = true;
		break;
	}
	return 0;
}

/* Posts the text the current id produced: reasoning first, then content.
 * The id rides on the first frame; an id that produced no text still gets
 * a TOKEN so clients can count and trace ids. */
static void stage_post(struct sched_stage *st, const uint32_t *id)
{
	struct k3_msg_token t;
	struct k3_sbuf *bufs[2] = { &st->reasoning, &st->content };
	const enum k3_proto_channel chans[2] = { K3_CHANNEL_REASONING, K3_CHANNEL_CONTENT };
	bool sent = false;

	for (int i = 0; i < 2; i++) {
		if (!bufs[i]->n)
			continue;
		memset(&t, 0, sizeof(t));
		k3_msg_token_set_ids(&t, (struct k3_proto_ids){ .n = id && !sent ? 1 : 0, .v = id });
		k3_msg_token_set_text(&t, (struct k3_proto_str){ bufs[i]->p, (uint32_t)bufs[i]->n });
		k3_msg_token_set_channel(&t, chans[i]);
		sched_post_frame(st->j, K3_MSG_TOKEN, &t);
		sent = true;
		bufs[i]->n = 0;
	}
	if (!sent && id) {
		memset(&t, 0, sizeof(t));
		k3_msg_token_set_ids(&t, (struct k3_proto_ids){ .n = 1, .v = id });
		k3_msg_token_set_channel(&t, st->channel);
		sched_post_frame(st->j, K3_MSG_TOKEN, &t);
	}
}

int sched_stage_init(struct sched_stage *st, struct sched_job *j, struct k3_err *err)
{
	struct k3_sched *s = j->s;
	size_t lens[K3_LIM_STOP_COUNT];
	int r;

	memset(st, 0, sizeof(*st));
	st->j = j;
	st->channel = j->thinking ? K3_CHANNEL_REASONING : K3_CHANNEL_CONTENT;
	if (!s->tok)
		return 0;   /* ids-only model: TOKEN events carry ids, no text */
	for (uint32_t i = 0; i < j->n_stop; i++)
		lens[i] = strlen(j->stop[i]);
	r = k3_detok_new(s->tok, (const char *const *)j->stop, lens, j->n_stop,
			 j->chat ? 0 : K3_DETOK_SKIP_SPECIAL, &st->detok, err);
	if (r == 0 && j->chat) {
		struct k3_parse_opts o;

		k3_parse_opts_init(&o);
		o.thinking = j->thinking;
		o.id_seed = j->id;
		r = k3_parse_new(s->tok, &o, stage_parse_cb, st, &st->parse, err);
	}
	return r;
}

static bool is_end(const struct sched_job *j, uint32_t id)
{
	for (uint32_t i = 0; i < j->n_end; i++)
		if (j->end_ids[i] == id)
			return true;
	return false;
}

int sched_stage_feed(struct sched_stage *st, uint32_t id)
{
	const char *t;
	size_t n;
	int r;

	if (is_end(st->j, id))
		return 1;
	if (st->parse) {
		r = k3_parse_feed_id(st->parse, id);
	} else if (!st->detok) {
		r = 0;
	} else {
		r = k3_detok_feed(st->detok, id, &t, &n);
		if (r >= 0) {
			k3_sbuf_add(&st->content, t, n);
			if (r == 1)
				st->stopped = true;
			r = 0;
		}
	}
	if (r < 0)
		return r;
	stage_post(st, &id);
	if (st->channel == K3_CHANNEL_REASONING)
		st->j->n_reasoning++;
	return st->stopped ? 1 : 0;
}

int sched_stage_finish(struct sched_stage *st)
{
	const char *t;
	size_t n;
	int r = 0;

	if (st->parse && !st->stopped)
		r = k3_parse_finish(st->parse);
	if (r >= 0 && !st->stopped && st->detok) {
		r = k3_detok_flush(st->detok, &t, &n);
		if (r >= 0)
			k3_sbuf_add(&st->content, t, n);
	}
	stage_post(st, NULL);
	return r < 0 ? r : 0;
}

void sched_stage_release(struct sched_stage *st)
{
	k3_parse_free(st->parse);
	k3_detok_free(st->detok);
	k3_sbuf_release(&st->reasoning);
	k3_sbuf_release(&st->content);
}

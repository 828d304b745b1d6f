/*
 * sched_prep.c - request preparation: a GENERATE becomes a job (mode and
 * field checks, the chat rendered with K3's template, the prompt
 * tokenized, the context and max_new checked, stop strings and end ids
 * via sched_stage_prepare), and TOKENIZE becomes its reply. Requests with
 * less than SCHED_PREP_INLINE_BYTES of text are prepared inline on the
 * loop thread; bigger ones are deep-copied and handed to the prep thread,
 * one at a time in arrival order (so prepared GENERATEs keep their FIFO
 * order), so that one 128 MiB prompt does not stall every other client.
 *
 * sched_prep_job and tokenize_reply touch no connection, so either thread
 * may run them; everything else here is loop thread only.
 */
#include "server/sched_internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "model/model.h"
#include "text/text_chat.h"

int sched_prep_fail(struct sched_job *j, uint32_t status, const char *param, int code,
		    const char *fmt, ...)
{
	va_list ap;

	j->err_status = status;
	j->err_param = param;
	va_start(ap, fmt);
	vsnprintf(j->err_msg, sizeof(j->err_msg), fmt, ap);
	va_end(ap);
	return code;
}
/* A raw prompt: text to tokenize, or ids checked against the vocabulary.
 * Returns 0, a negative errno with err (tokenizer), or sched_prep_fail. */
static int prep_raw(const struct k3_sched *s, const struct k3_msg_generate *g, struct sched_job *j,
		    struct k3_err *err)
{
	int r = 0;

	if (g->has_prompt == g->has_prompt_ids)
		return sched_prep_fail(j, K3_STATUS_BAD_REQUEST, "prompt", -EINVAL,
				       "a raw GENERATE needs exactly one of prompt and prompt_ids");
	if (g->has_prompt)
		r = k3_tok_encode(s->tok, g->prompt.p, g->prompt.len, false, &j->prompt, err);
	for (uint32_t i = 0; r == 0 && g->has_prompt_ids && i < g->prompt_ids.n; i++) {
		uint32_t id = k3_proto_ids_at(&g->prompt_ids, i);

		if (id >= k3_engine_vocab(s->engine))
			return sched_prep_fail(j, K3_STATUS_INVALID_ARGUMENT, "prompt_ids", -EINVAL,
					       "token id %u is outside the vocabulary (%u ids)", id,
					       k3_engine_vocab(s->engine));
		r = k3_tok_ids_push(&j->prompt, id);
	}
	return r;
}

/* A chat prompt: messages (and tools, tool_choice, response_format)
 * rendered with K3's chat template, then tokenized. Returns 0 or
 * sched_prep_fail. */
static int prep_chat(const struct k3_sched *s, const struct k3_msg_generate *g, struct sched_job *j)
{
	static const char *const efforts[] = { NULL, NULL, "low", "high", "max" };
	struct k3_err err = { 0, "" };
	struct k3_chat_opts o;
	struct k3_chat chat;
	json_t *msgs, *tools = NULL, *choice = NULL, *fmt = NULL;
	json_error_t jerr;
	int r = 0;

	if (!g->has_messages || g->has_prompt || g->has_prompt_ids)
		return sched_prep_fail(j, K3_STATUS_BAD_REQUEST, "messages", -EINVAL,
				       "a chat GENERATE needs messages and no prompt");
	/* U+0000 is text like any other: a history resends what K3 wrote */
	msgs = json_loadb(g->messages.p, g->messages.len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &jerr);
	if (!msgs || !json_is_array(msgs)) {
		json_decref(msgs);
		return sched_prep_fail(j, K3_STATUS_BAD_REQUEST, "messages", -EINVAL,
				       "messages must be a JSON array: %s", msgs ? "not an array" : jerr.text);
	}
	k3_chat_opts_init(&o);
	if (g->has_thinking)
		o.thinking = g->thinking;
	if (g->has_reasoning_effort && g->reasoning_effort > K3_EFFORT_MAX) {
		json_decref(msgs);
		return sched_prep_fail(j, K3_STATUS_INVALID_ARGUMENT, "reasoning_effort", -EINVAL,
				       "unknown reasoning effort %u", g->reasoning_effort);
	}
	/* Unset effort means "max", as the release's apply_chat_template
	 * does; thinking stays on unless the request turns it off. */
	o.thinking_effort = "max";
	if (g->has_reasoning_effort && g->reasoning_effort == K3_EFFORT_NONE)
		o.thinking = false;
	else if (g->has_reasoning_effort && g->reasoning_effort != K3_EFFORT_UNSET)
		o.thinking_effort = efforts[g->reasoning_effort];
	if (g->has_tools && !(tools = json_loadb(g->tools.p, g->tools.len, 0, &jerr)))
		r = k3_err_set(&err, -EINVAL, "tools: %s", jerr.text);
	if (r == 0 && g->has_tool_choice &&
	    !(choice = json_loadb(g->tool_choice.p, g->tool_choice.len, JSON_DECODE_ANY, &jerr)))
		r = k3_err_set(&err, -EINVAL, "tool_choice: %s", jerr.text);
	if (r == 0 && g->has_response_format &&
	    !(fmt = json_loadb(g->response_format.p, g->response_format.len, JSON_DECODE_ANY, &jerr)))
		r = k3_err_set(&err, -EINVAL, "response_format: %s", jerr.text);
	o.tools = tools;
	o.tool_choice = choice;
	o.response_format = fmt;
	o.add_generation_prompt = !(g->has_no_generation_prompt && g->no_generation_prompt);
	j->thinking = o.thinking && o.add_generation_prompt;
	memset(&chat, 0, sizeof(chat));
	if (r == 0)
		r = k3_chat_render(msgs, &o, &chat, &err);
	/* Long histories encode their segments in parallel (same ids). */
	if (r == 0)
		r = k3_chat_encode_parallel(s->tok, &chat, 2, &j->prompt, &err);
	k3_chat_release(&chat);
	json_decref(msgs);
	json_decref(tools);
	json_decref(choice);
	json_decref(fmt);
	if (r < 0)
		return sched_prep_fail(j, r == -ENOTSUP ? K3_STATUS_UNSUPPORTED : K3_STATUS_INVALID_ARGUMENT,
				       "messages", r, "%s", err.msg);
	return 0;
}

_Static_assert((int)K3_PROTO_DRAFT_OFF == (int)K3_DRAFT_POLICY_OFF &&
	       (int)K3_PROTO_DRAFT_AUTO == (int)K3_DRAFT_POLICY_AUTO &&
	       (int)K3_PROTO_DRAFT_NGRAM == (int)K3_DRAFT_POLICY_NGRAM &&
	       (int)K3_PROTO_DRAFT_DSPARK == (int)K3_DRAFT_POLICY_DSPARK,
	       "GENERATE.draft_policy carries enum k3_draft_policy");

/* The request's draft policy (GENERATE.draft_policy, unset = k3d's
 * --draft), resolved once here. Drafting never changes an id, so the only
 * refusals are a value out of range and asking for a DSpark draft that
 * k3d has not loaded. Returns 0 or sched_prep_fail. */
static int prep_draft(const struct k3_sched *s, const struct k3_msg_generate *g, struct sched_job *j)
{
	uint32_t p = g->has_draft_policy ? g->draft_policy : K3_DRAFT_POLICY_UNSET;

	if (p >= K3_DRAFT_POLICY_COUNT)
		return sched_prep_fail(j, K3_STATUS_INVALID_ARGUMENT, "draft_policy", -EINVAL,
				       "unknown draft policy %u (0 k3d's default, 1 off, 2 auto, 3 ngram, "
				       "4 dspark)", p);
	if (p == K3_DRAFT_POLICY_UNSET)
		p = (uint32_t)s->opts->draft;
	if (p == K3_DRAFT_POLICY_DSPARK && !s->draft_dspark)
		return sched_prep_fail(j, K3_STATUS_INVALID_ARGUMENT, "draft_policy", -EINVAL,
				       "no DSpark draft is loaded (start k3d with --draft-model DIR)");
	j->draft_policy = p;
	return 0;
}

/* Copies the request into a job: ids from prompt text, prompt ids or the
 * rendered chat, then the context check, max_new, stop strings and end
 * ids. On failure returns < 0 with the ERROR to send recorded in j.
 * Touches no connection, so it may run on the prep thread. */
static int prep_job(const struct k3_sched *s, const struct k3_msg_generate *g, struct sched_job *j)
{
	uint64_t ctx = sched_context_tokens(s);
	struct k3_err err = { 0, "" };
	int r;

	j->chat = g->mode == K3_MODE_CHAT;
	if (!s->tok && (j->chat || g->has_prompt || g->has_stop))
		return sched_prep_fail(j, K3_STATUS_UNSUPPORTED, j->chat ? "messages" : "prompt", -ENOTSUP,
				       "this model has no tokenizer (tiktoken.model): send prompt_ids");
	if (g->mode > K3_MODE_CHAT)
		return sched_prep_fail(j, K3_STATUS_BAD_REQUEST, "mode", -EINVAL, "unknown mode %u", g->mode);
	if (j->chat) {
		if ((r = prep_chat(s, g, j)) < 0)
			return r;
	} else if ((r = prep_raw(s, g, j, &err)) < 0) {
		return j->err_status ? r : sched_prep_fail(j, K3_STATUS_INVALID_ARGUMENT, "prompt", r,
							   "%s", err.msg);
	}
	if (j->prompt.n == 0)
		return sched_prep_fail(j, K3_STATUS_INVALID_ARGUMENT, "prompt", -EINVAL,
				       "the prompt is empty");
	if (j->prompt.n >= ctx)
		return sched_prep_fail(j, K3_STATUS_CONTEXT_EXCEEDED, "messages", -E2BIG,
				       "the prompt has %zu tokens; the context holds %llu", j->prompt.n,
				       (unsigned long long)ctx);
	/* The request's own number goes into the message, before any cap. */
	if (g->has_max_new && (uint64_t)j->prompt.n + g->max_new > ctx)
		return sched_prep_fail(j, K3_STATUS_CONTEXT_EXCEEDED, "max_new", -E2BIG,
				       "the prompt has %zu tokens and %u new tokens were asked for; the "
				       "context holds %llu", j->prompt.n, g->max_new,
				       (unsigned long long)ctx);
	j->max_new = g->has_max_new ? g->max_new : (uint32_t)(ctx - j->prompt.n);
	if (j->max_new > K3_LIM_MAX_NEW)
		j->max_new = K3_LIM_MAX_NEW;
	if ((r = prep_draft(s, g, j)) < 0)
		return r;
	return sched_stage_prepare(s, g, j);
}

void sched_prep_free(struct sched_prep *t)
{
	if (!t)
		return;
	k3_conn_unref(t->conn);
	sched_job_free(t->job);
	free(t->frame);
	free(t);
}

/* Hands t to the prep thread and remembers it as in flight. */
static void prep_submit(struct k3_sched *s, struct sched_prep *t)
{
	sched_fifo_push(&s->prep_inflight, &t->inflight);
	if (!t->tokenize)
		s->n_prepping++;
	pthread_mutex_lock(&s->lock);
	sched_fifo_push(&s->prep_queue, &t->link);
	pthread_cond_signal(&s->prep_cond);
	pthread_mutex_unlock(&s->lock);
}

bool sched_prep_has_rid(const struct k3_sched *s, const struct k3_conn *c, uint32_t rid)
{
	for (const struct sched_link *l = s->prep_inflight.head; l; l = l->next) {
		const struct sched_prep *p = sched_entry(l, const struct sched_prep, inflight);

		if (!p->tokenize && p->conn == c && p->rid == rid)
			return true;
	}
	return false;
}

unsigned sched_prep_cancel(struct k3_sched *s, const struct k3_conn *c, bool by_rid, uint32_t rid)
{
	unsigned n = 0;

	for (struct sched_link *l = s->prep_inflight.head; l; l = l->next) {
		struct sched_prep *t = sched_entry(l, struct sched_prep, inflight);

		if (!t->tokenize && !t->cancel && t->conn == c && (!by_rid || t->rid == rid)) {
			t->cancel = true;
			n++;
		}
	}
	return n;
}

/* The bytes generate_copy needs for g's strings and ids. */
static size_t generate_bytes(const struct k3_msg_generate *g)
{
	size_t bytes = (size_t)g->prompt.len + g->messages.len + g->tools.len + g->tool_choice.len +
		       g->response_format.len;

	for (uint32_t i = 0; i < g->stop.n; i++)
		bytes += g->stop.v[i].len;
	return bytes + ((size_t)g->prompt_ids.n + g->stop_ids.n) * sizeof(uint32_t);
}

/* A deep copy of a GENERATE: *out = g with its strings and ids copied into
 * b (generate_bytes(g) bytes, 4-byte aligned), so that the request
 * outlives the connection's frame buffer. */
static void generate_copy(const struct k3_msg_generate *g, struct k3_msg_generate *out, uint8_t *b)
{
	const struct k3_proto_str *strs[5 + K3_LIM_STOP_COUNT];
	struct k3_proto_str *dst[5 + K3_LIM_STOP_COUNT];
	size_t n = 0, off;

	*out = *g;
	strs[n] = &g->prompt; dst[n++] = &out->prompt;
	strs[n] = &g->messages; dst[n++] = &out->messages;
	strs[n] = &g->tools; dst[n++] = &out->tools;
	strs[n] = &g->tool_choice; dst[n++] = &out->tool_choice;
	strs[n] = &g->response_format; dst[n++] = &out->response_format;
	for (uint32_t i = 0; i < g->stop.n; i++) {
		strs[n] = &g->stop.v[i];
		dst[n++] = &out->stop.v[i];
	}
	off = ((size_t)g->prompt_ids.n + g->stop_ids.n) * sizeof(uint32_t);
	for (uint32_t i = 0; i < g->prompt_ids.n; i++)
		((uint32_t *)b)[i] = k3_proto_ids_at(&g->prompt_ids, i);
	for (uint32_t i = 0; i < g->stop_ids.n; i++)
		((uint32_t *)b)[g->prompt_ids.n + i] = k3_proto_ids_at(&g->stop_ids, i);
	out->prompt_ids.v = (const uint32_t *)b;
	out->prompt_ids.le = NULL;
	out->stop_ids.v = (const uint32_t *)b + g->prompt_ids.n;
	out->stop_ids.le = NULL;
	for (size_t i = 0; i < n; i++) {
		if (strs[i]->len)
			memcpy(b + off, strs[i]->p, strs[i]->len);
		dst[i]->p = (const char *)b + off;
		off += strs[i]->len;
	}
}

void sched_prep_generate(struct k3_sched *s, struct k3_conn *c, uint32_t rid,
			 const struct k3_msg_generate *g)
{
	struct sched_prep *t;
	struct sched_job *j;
	size_t text;

	if (sched_admit(s, c, rid) < 0)
		return;
	j = sched_job_new(s, K3_JOB_GENERATE, rid);
	if (!j) {
		k3_conn_send_error(c, rid, K3_STATUS_INTERNAL, NULL, "out of memory");
		return;
	}
	text = (size_t)g->prompt.len + g->messages.len + g->tools.len + g->tool_choice.len +
	       g->response_format.len + (size_t)g->prompt_ids.n * 4;
	if (text < SCHED_PREP_INLINE_BYTES) {
		prep_job(s, g, j);
		sched_enqueue(s, c, j);
		return;
	}
	size_t bytes = generate_bytes(g);
	t = calloc(1, sizeof(*t) + bytes);
	if (!t) {
		sched_job_free(j);
		k3_conn_send_error(c, rid, K3_STATUS_INTERNAL, NULL, "out of memory");
		return;
	}
	generate_copy(g, &t->g, (uint8_t *)t->payload);
	t->conn = k3_conn_ref(c);
	t->rid = rid;
	t->job = j;
	prep_submit(s, t);
}

/* TOKENIZE: encodes and writes the reply (or ERROR) frame into out. Pure,
 * so it runs inline for small texts and on the prep thread for big ones. */
static void tokenize_reply(const struct k3_sched *s, uint32_t rid, const char *text, size_t len,
			   bool special, struct k3_proto_buf *out)
{
	struct k3_tok_ids ids;
	struct k3_err err = { 0, "" };
	int rc;

	k3_tok_ids_init(&ids);
	rc = k3_tok_encode(s->tok, text, len, special, &ids, &err);
	if (rc == 0 && ids.n > K3_LIM_IDS_MAX)
		rc = k3_err_set(&err, -E2BIG, "%zu ids exceed the limit of %u", ids.n, K3_LIM_IDS_MAX);
	if (rc < 0) {
		struct k3_msg_error e;

		memset(&e, 0, sizeof(e));
		k3_msg_error_set_status(&e, K3_STATUS_INVALID_ARGUMENT);
		k3_msg_error_set_message(&e, k3_proto_str_of(err.msg));
		k3_msg_error_set_param(&e, k3_proto_str_of("text"));
		k3_proto_encode(out, K3_MSG_ERROR, rid, &e, NULL);
	} else {
		struct k3_msg_tokenize_reply r;

		memset(&r, 0, sizeof(r));
		k3_msg_tokenize_reply_set_ids(&r, (struct k3_proto_ids){ .n = (uint32_t)ids.n,
									 .v = ids.v });
		k3_proto_encode(out, K3_MSG_TOKENIZE_REPLY, rid, &r, NULL);
	}
	k3_tok_ids_release(&ids);
}

void sched_prep_tokenize(struct k3_sched *s, struct k3_conn *c, uint32_t rid,
			 const struct k3_msg_tokenize *m)
{
	struct k3_proto_buf out;
	struct sched_prep *t;

	if (m->text.len < SCHED_PREP_INLINE_BYTES) {
		k3_proto_buf_init(&out, K3_LIM_PAYLOAD_MAX + K3_PROTO_HEADER_SIZE);
		tokenize_reply(s, rid, m->text.p, m->text.len, m->has_special && m->special, &out);
		if (out.len)
			k3_conn_send_raw(c, out.data, out.len);
		k3_proto_buf_release(&out);
		return;
	}
	t = calloc(1, sizeof(*t) + m->text.len);
	if (!t) {
		k3_conn_send_error(c, rid, K3_STATUS_INTERNAL, NULL, "out of memory");
		return;
	}
	t->text = (char *)t->payload;
	memcpy(t->text, m->text.p, m->text.len);
	t->text_len = m->text.len;
	t->special = m->has_special && m->special;
	t->tokenize = true;
	t->conn = k3_conn_ref(c);
	t->rid = rid;
	prep_submit(s, t);
}

/* The prep thread: renders and tokenizes big requests, one at a time, in
 * arrival order (so prepared GENERATEs keep their FIFO order). */
void *sched_prep_main(void *arg)
{
	struct k3_sched *s = arg;

	pthread_mutex_lock(&s->lock);
	while (!s->stopping) {
		struct sched_prep *t = sched_entry(sched_fifo_pop(&s->prep_queue), struct sched_prep, link);
		struct sched_msg *m;

		if (!t) {
			pthread_cond_wait(&s->prep_cond, &s->lock);
			continue;
		}
		pthread_mutex_unlock(&s->lock);
		if (t->tokenize) {
			struct k3_proto_buf out;

			k3_proto_buf_init(&out, K3_LIM_PAYLOAD_MAX + K3_PROTO_HEADER_SIZE);
			tokenize_reply(s, t->rid, t->text, t->text_len, t->special, &out);
			t->frame = out.data;
			t->frame_len = out.len;
		} else {
			prep_job(s, &t->g, t->job);
		}
		m = calloc(1, sizeof(*m));
		pthread_mutex_lock(&s->lock);
		if (m) {
			m->kind = MSG_PREPARED;
			m->task = t;
			sched_post_locked(s, m);
		} else {
			sched_prep_free(t);   /* leaked into nowhere would be worse: drop it */
		}
	}
	pthread_mutex_unlock(&s->lock);
	return NULL;
}

void sched_prep_done(struct k3_sched *s, struct sched_prep *t)
{
	sched_fifo_remove(&s->prep_inflight, &t->inflight);
	if (!t->tokenize)
		s->n_prepping--;
	if (!k3_conn_is_open(t->conn)) {
		/* the peer left while we worked: nothing to answer */
	} else if (t->tokenize) {
		if (t->frame_len)
			k3_conn_send_raw(t->conn, t->frame, t->frame_len);
	} else if (t->cancel) {
		struct k3_msg_done d;

		memset(&d, 0, sizeof(d));
		k3_msg_done_set_finish(&d, K3_FINISH_CANCELLED);
		k3_msg_done_set_prompt_tokens(&d, (uint32_t)t->job->prompt.n);
		k3_msg_done_set_completion_tokens(&d, 0);
		sched_done_spine(s, &d);
		k3_conn_send(t->conn, K3_MSG_DONE, t->rid, &d);
	} else if (s->draining) {
		k3_conn_send_error(t->conn, t->rid, K3_STATUS_SHUTTING_DOWN, NULL, "k3d is shutting down");
	} else {
		sched_enqueue(s, t->conn, t->job);
		t->job = NULL;
	}
	sched_prep_free(t);
}

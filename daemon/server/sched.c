/*
 * sched.c - model loading, the engine thread, the job FIFO and the
 * published conversation (see sched.h).
 *
 * Ownership. A job is created and freed on the loop thread. The engine
 * thread reads its inputs and writes its results (finish reason, counters,
 * the state branch) before posting MSG_FINISHED, after which it never
 * touches the job again. Frames travel engine -> loop as encoded bytes in
 * struct sched_msg; the loop writes them if the job's connection is still
 * open. Cancellation is one atomic flag per job, polled by the engine
 * thread between prefill chunks and decode steps.
 */
#include "server/sched.h"

#include <errno.h>
#include <stdarg.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>
#include <jansson.h>

#include "base/log.h"
#include "engine/engine.h"
#include "model/model.h"
#include "store/store.h"
#include "store/store_budget.h"
#include "store/store_engine.h"
#include "store/store_model.h"
#include "store/store_trace.h"
#include "text/text_chat.h"
#include "text/text_detok.h"
#include "text/text_parse.h"
#include "text/text_tok.h"

/* PUBLISH_DEADLINE_S: how long a finished job's branch states wait for
 * its client to take the DONE frame; later they are dropped, unpublished
 * (a slow reader only loses conversation reuse; tests/integration/
 * test_generate.py knows this value). */
enum { PREFILL_CHUNK = 64, N_END_IDS = 2 + K3_LIM_STOP_IDS, PUBLISH_DEADLINE_S = 5,
       PREP_INLINE_BYTES = 64 << 10 };

/* A sequence state and the ids it has consumed. */
struct conv_state {
	struct k3_engine_seq *seq;
	struct k3_tok_ids ids;
};

static void conv_state_release(struct conv_state *c)
{
	k3_engine_seq_free(c->seq);
	c->seq = NULL;
	k3_tok_ids_release(&c->ids);
}

struct job {
	struct k3_sched *s;
	uint64_t id;
	/* WARM_EXPERTS: preload these (layer, expert) pairs instead of
	 * generating (owned arrays, n_warm entries, best first) */
	bool warm;
	uint32_t *warm_layer, *warm_expert;
	uint32_t n_warm, warm_requested;
	uint32_t rid;
	struct k3_conn *conn;           /* ref held; loop thread only */
	bool chat;
	bool thinking;                  /* chat prompt ends inside the think channel */
	struct k3_tok_ids prompt;       /* prompt ids (owned) */
	uint32_t max_new;
	uint32_t n_stop;
	char *stop[K3_LIM_STOP_COUNT];  /* owned copies */
	uint32_t n_end;
	uint32_t end_ids[N_END_IDS];    /* ids that end generation */
	struct timespec t_submit;
	atomic_bool cancel;
	bool queued;                    /* in s->queue (loop view) */
	uint32_t queue_pos_sent;
	struct job *next;
	/* results, written by the engine thread before MSG_FINISHED */
	uint32_t finish;                /* enum k3_proto_finish */
	atomic_uint cancel_reason;      /* enum k3_proto_cancel_reason, set before cancel */
	/* Publishable branches: [0] the state right after the prompt, [1] after
	 * prompt + generated[:-1]. Both are kept because a chat client sends
	 * the answer back as text, whose re-tokenization may differ from the
	 * ids the model produced; the prompt-end state still matches then. */
	struct conv_state branch[2];
	bool done_sent;
	struct sched_msg *final;        /* DONE or ERROR, posted with the slot's release */
	struct event *publish_timer;    /* PUBLISH_DEADLINE_S while DONE is unflushed; loop thread */
	uint32_t n_gen, n_reasoning, n_cached;
	/* engine thread, read by the loop after MSG_FINISHED (STATUS totals) */
	uint64_t positions;             /* positions the engine computed */
	double prefill_s, decode_s, io_wait_s, compute_s;
	/* set by job_prepare when the request cannot run */
	uint32_t err_status;            /* enum k3_proto_status; 0 = none */
	const char *err_param;
	char err_msg[K3_LIM_MESSAGE_MAX];
};

/*
 * A GENERATE or TOKENIZE carrying more text than the loop thread should
 * render or tokenize itself (a 128 MiB prompt takes seconds): the prep
 * thread does that work on a private copy of the request and posts the
 * result back, so every other client stays served meanwhile. Small
 * requests take the same functions inline.
 */
struct prep_task {
	bool tokenize;
	struct k3_conn *conn;           /* ref held; loop thread only */
	uint32_t rid;
	struct job *job;                /* GENERATE */
	struct k3_msg_generate g;       /* GENERATE, strings and ids in blob */
	void *blob;
	char *text;                     /* TOKENIZE */
	size_t text_len;
	bool special;
	uint8_t *frame;                 /* TOKENIZE: reply or ERROR, encoded */
	size_t frame_len;
	bool cancel;                    /* loop thread only */
	struct prep_task *next;         /* prep queue (under lock) */
	struct prep_task *lnext;        /* in-flight list (loop thread) */
};

enum sched_msg_kind { MSG_FRAME, MSG_STARTED, MSG_FINISHED, MSG_LOADED, MSG_PREPARED };

struct sched_msg {
	enum sched_msg_kind kind;
	struct job *job;
	struct prep_task *task;         /* MSG_PREPARED */
	uint8_t *bytes;
	size_t len;
	bool ok;
	char text[K3_ERR_MSG_MAX + 128];
	struct sched_msg *next;
};

struct k3_sched {
	struct event_base *base;
	struct k3_server *srv;
	const struct k3_options *opts;
	void (*on_ready)(void *ctx, bool ok, const char *message);
	void *ready_ctx;
	struct event *wake;
	pthread_t thread, prep_thread;
	bool thread_started, prep_started;

	/* set once by the engine thread before MSG_LOADED, read-only after */
	struct k3_model *model;
	struct k3_engine *engine;
	struct k3_tok *tok;
	char model_id[K3_LIM_NAME_MAX];
	bool loaded;
	/* the expert store (NULL: experts from the mmapped shards) */
	struct k3_store_source *xsrc;
	struct k3_store *store;
	struct k3_store_engine_src xctx;
	/* --router-trace, engine thread only */
	struct k3_store_trace *trace;
	uint32_t *route_ids;            /* [PREFILL_CHUNK][n_moe][K] */
	float *route_w;

	pthread_mutex_t lock;           /* guards everything below */
	pthread_cond_t cond;
	struct job *queue_head, *queue_tail;
	unsigned n_queued;
	struct job *running;
	bool stopping;
	struct sched_msg *msgs, *msgs_tail;
	struct prep_task *prep_head, *prep_tail;
	pthread_cond_t prep_cond;
	/* the published conversation */
	struct conv_state pub[2];

	/* loop thread only */
	struct prep_task *inflight;     /* tasks on the prep thread */
	unsigned n_prepping;            /* GENERATEs among them */
	bool ready;                     /* MSG_LOADED arrived with success */
	uint64_t next_job_id;
	bool draining;
	struct k3_msg_status_reply totals;
};

/* ---- messages engine -> loop ---------------------------------------------- */

/* Appends m to the loop's inbox; the caller holds s->lock. */
static void post_locked(struct k3_sched *s, struct sched_msg *m)
{
	m->next = NULL;
	if (s->msgs_tail)
		s->msgs_tail->next = m;
	else
		s->msgs = m;
	s->msgs_tail = m;
}

static void post(struct k3_sched *s, struct sched_msg *m)
{
	pthread_mutex_lock(&s->lock);
	post_locked(s, m);
	pthread_mutex_unlock(&s->lock);
	event_active(s->wake, EV_READ, 0);
}

/* Encodes a frame for job j; NULL when it cannot. Engine thread. */
static struct sched_msg *encode_frame(struct job *j, uint32_t type, const void *body)
{
	struct k3_proto_buf buf;
	struct sched_msg *m = calloc(1, sizeof(*m));
	struct k3_proto_err perr;

	if (!m)
		return NULL;
	k3_proto_buf_init(&buf, K3_LIM_PAYLOAD_MAX + K3_PROTO_HEADER_SIZE);
	if (k3_proto_encode(&buf, type, j->rid, body, &perr) != 0) {
		k3_log_err("job %llu: cannot encode %s: %s", (unsigned long long)j->id,
			   k3_proto_type_name(type), perr.msg);
		k3_proto_buf_release(&buf);
		free(m);
		return NULL;
	}
	m->kind = MSG_FRAME;
	m->job = j;
	m->bytes = buf.data;
	m->len = buf.len;
	return m;
}

/* Encodes a frame for job j and posts it. Engine thread. */
static void post_frame(struct job *j, uint32_t type, const void *body)
{
	struct sched_msg *m = encode_frame(j, type, body);

	if (m)
		post(j->s, m);
}

static void post_kind(struct k3_sched *s, enum sched_msg_kind kind, struct job *j, bool ok,
		      const char *text)
{
	struct sched_msg *m = calloc(1, sizeof(*m));

	if (!m)
		return;
	m->kind = kind;
	m->job = j;
	m->ok = ok;
	if (text)
		snprintf(m->text, sizeof(m->text), "%s", text);
	post(s, m);
}

static double since(const struct timespec *t0)
{
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	return (double)(now.tv_sec - t0->tv_sec) + (double)(now.tv_nsec - t0->tv_nsec) * 1e-9;
}

/* ---- the engine thread ------------------------------------------------------ */

/*
 * Turns generated ids into protocol events. Raw mode: the detokenizer
 * (special ids skipped, stop strings held back). Chat mode: the output
 * parser splits reasoning, content and tool calls; content then passes
 * through the detokenizer's stop-string matcher, so stop strings apply to
 * the answer only and are never partly emitted.
 */
struct out_stage {
	struct job *j;
	struct k3_detok *detok;
	struct k3_parse *parse;
	struct k3_sbuf reasoning, content;   /* text produced by the current id */
	enum k3_proto_channel channel;       /* channel of the latest text */
	bool stopped;                        /* a stop string or END arrived */
	bool any_tool;
	int err;
};

static void post_tool(struct job *j, unsigned index, const char *id, const char *name,
		      size_t name_len, const char *args, size_t args_len)
{
	struct k3_msg_tool_call t;

	memset(&t, 0, sizeof(t));
	t.index = index; t.has_index = true;
	if (id) {
		t.id = k3_proto_str_of(id);
		t.has_id = true;
	}
	if (name) {
		t.name = (struct k3_proto_str){ name, (uint32_t)name_len };
		t.has_name = true;
	}
	if (args) {
		t.arguments.p = args;
		t.arguments.len = (uint32_t)args_len;
		t.has_arguments = true;
	}
	post_frame(j, K3_MSG_TOOL_CALL, &t);
}

static int stage_parse_cb(void *ud, const struct k3_parse_event *ev)
{
	struct out_stage *st = ud;
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
static void stage_post(struct out_stage *st, const uint32_t *id)
{
	struct k3_msg_token t;
	struct k3_sbuf *bufs[2] = { &st->reasoning, &st->content };
	const enum k3_proto_channel chans[2] = { K3_CHANNEL_REASONING, K3_CHANNEL_CONTENT };
	bool sent = false;

	for (int i = 0; i < 2; i++) {
		if (!bufs[i]->n)
			continue;
		memset(&t, 0, sizeof(t));
		t.ids.n = id && !sent ? 1 : 0;
		t.ids.v = id;
		t.has_ids = true;
		t.text.p = bufs[i]->p;
		t.text.len = (uint32_t)bufs[i]->n;
		t.has_text = true;
		t.channel = chans[i]; t.has_channel = true;
		post_frame(st->j, K3_MSG_TOKEN, &t);
		sent = true;
		bufs[i]->n = 0;
	}
	if (!sent && id) {
		memset(&t, 0, sizeof(t));
		t.ids.n = 1;
		t.ids.v = id;
		t.has_ids = true;
		t.channel = st->channel; t.has_channel = true;
		post_frame(st->j, K3_MSG_TOKEN, &t);
	}
}

static int stage_init(struct out_stage *st, struct job *j, struct k3_err *err)
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

/* Feeds one generated id; returns 1 when generation should stop. */
static int stage_feed(struct out_stage *st, uint32_t id)
{
	const char *t;
	size_t n;
	int r;

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
	return st->stopped ? 1 : 0;
}

/* End of generation: flush what parser and detokenizer hold. */
static int stage_finish(struct out_stage *st)
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

static void stage_release(struct out_stage *st)
{
	k3_parse_free(st->parse);
	k3_detok_free(st->detok);
	k3_sbuf_release(&st->reasoning);
	k3_sbuf_release(&st->content);
}

static bool is_end(const struct job *j, uint32_t id)
{
	for (uint32_t i = 0; i < j->n_end; i++)
		if (j->end_ids[i] == id)
			return true;
	return false;
}

/* Appends the routes of the last forward call (c positions from pos) to
 * --router-trace. A write error or the size cap stops tracing with one
 * log line; generation goes on. */
static void trace_routes(struct k3_sched *s, const struct job *j, uint32_t pos, uint32_t c)
{
	struct k3_err err = { 0, "" };

	if (!s->trace || !s->route_ids)
		return;
	int r = k3_store_trace_write_routes(s->trace, j->id, pos, c, k3_engine_moe_layers(s->engine),
					    k3_engine_n_moe(s->engine), k3_engine_top_k(s->engine),
					    s->route_ids, s->route_w, &err);
	if (r < 0) {
		k3_log_warning("router trace stopped: %s", err.msg);
		k3_store_trace_close(s->trace, NULL);
		s->trace = NULL;
	}
}

static void run_job(struct k3_sched *s, struct job *j)
{
	const uint32_t V = k3_engine_vocab(s->engine);
	struct k3_engine_seq *seq = NULL;
	struct k3_err err = { 0, "" };
	struct k3_msg_done done;
	struct k3_engine_out out_none = { K3_ENGINE_LOGITS_NONE, NULL, NULL, NULL };
	struct k3_engine_out out_last;
	struct timespec t0, t1;
	struct out_stage st;
	float *logits = malloc((size_t)V * sizeof(float));
	uint32_t start = 0, n = (uint32_t)j->prompt.n, tok;
	double queued_s = since(&j->t_submit), prefill_s = 0, decode_s = 0;
	bool prefilled = false;
	uint32_t prefill_end = 0;        /* prompt position prefill reached */
	int r = 0;

	struct k3_store_stats xs0, xs1, xd;
	memset(&xs0, 0, sizeof(xs0));
	if (s->store)
		k3_store_stats_get(s->store, &xs0);
	memset(&done, 0, sizeof(done));
	clock_gettime(CLOCK_MONOTONIC, &t0);
	t1 = t0;
	out_last = (struct k3_engine_out){ K3_ENGINE_LOGITS_LAST, logits, s->route_ids, s->route_w };
	out_none.route_ids = s->route_ids;
	out_none.route_weights = s->route_w;
	j->finish = K3_FINISH_ERROR;
	r = stage_init(&st, j, &err);
	if (r == 0 && !logits)
		r = k3_err_set(&err, -ENOMEM, "out of memory");
	if (r < 0)
		goto out;
	/* Reuse the published conversation when the prompt strictly extends it. */
	pthread_mutex_lock(&s->lock);
	for (int k = 0; j->chat && k < 2; k++) {
		const struct conv_state *p = &s->pub[k];

		if (p->seq && p->ids.n > start && p->ids.n < n &&
		    memcmp(p->ids.v, j->prompt.v, p->ids.n * sizeof(uint32_t)) == 0) {
			k3_engine_seq_free(seq);
			seq = NULL;
			r = k3_engine_seq_clone(s->engine, p->seq, &seq, &err);
			if (r < 0)
				break;
			start = (uint32_t)p->ids.n;
		}
	}
	pthread_mutex_unlock(&s->lock);
	if (r < 0)
		goto out;
	/* The capacity is a hint (MLA caches grow past it): do not reserve a
	 * whole context for a request that may stop early. */
	if (!seq && (r = k3_engine_seq_new(s->engine, n + (j->max_new < 4096 ? j->max_new : 4096) + 1,
					   &seq, &err)) < 0)
		goto out;
	k3_engine_set_cancel(s->engine, &j->cancel);
	j->n_cached = start;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	prefill_end = start;
	for (uint32_t pos = start; pos < n;) {
		uint32_t c = n - pos < PREFILL_CHUNK ? n - pos : PREFILL_CHUNK;
		struct k3_msg_progress p;

		if (atomic_load(&j->cancel)) {
			j->finish = K3_FINISH_CANCELLED;
			goto out;
		}
		r = k3_engine_forward(s->engine, seq, (const int32_t *)j->prompt.v + pos, c,
				      pos + c == n ? &out_last : &out_none, &err);
		if (r < 0)
			goto out;
		j->positions += c;
		trace_routes(s, j, pos, c);
		pos += c;
		prefill_end = pos;
		memset(&p, 0, sizeof(p));
		p.done = pos; p.has_done = true;
		p.total = n; p.has_total = true;
		post_frame(j, K3_MSG_PROGRESS, &p);
	}
	for (uint32_t i = 0; i < n; i++)
		if ((r = k3_tok_ids_push(&j->branch[1].ids, j->prompt.v[i])) < 0 ||
		    (j->chat && (r = k3_tok_ids_push(&j->branch[0].ids, j->prompt.v[i])) < 0))
			goto out;
	if (j->chat && (r = k3_engine_seq_clone(s->engine, seq, &j->branch[0].seq, &err)) < 0)
		goto out;
	prefill_s = since(&t0);
	prefilled = true;

	clock_gettime(CLOCK_MONOTONIC, &t1);
	j->finish = K3_FINISH_LENGTH;
	while (j->n_gen < j->max_new) {
		if (atomic_load(&j->cancel)) {
			j->finish = K3_FINISH_CANCELLED;
			break;
		}
		tok = k3_engine_argmax(logits, V);
		j->n_gen++;
		if (is_end(j, tok)) {
			j->finish = K3_FINISH_STOP;
			break;
		}
		r = stage_feed(&st, tok);
		if (r < 0) {
			k3_err_set(&err, r, "output stage failed on id %u", tok);
			goto out;
		}
		if (st.channel == K3_CHANNEL_REASONING)
			j->n_reasoning++;
		if (r == 1) {
			j->finish = K3_FINISH_STOP;
			break;
		}
		if (j->n_gen == j->max_new)
			break;
		r = k3_engine_forward(s->engine, seq, (const int32_t *)&tok, 1, &out_last, &err);
		if (r < 0)
			goto out;
		j->positions++;
		trace_routes(s, j, n + j->n_gen - 1, 1);
		if ((r = k3_tok_ids_push(&j->branch[1].ids, tok)) < 0)
			goto out;
	}
	r = stage_finish(&st);
	if (st.any_tool && j->finish == K3_FINISH_STOP)
		j->finish = K3_FINISH_TOOL_CALLS;
	decode_s = since(&t1);
out:
	stage_release(&st);
	free(logits);
	k3_engine_set_cancel(s->engine, NULL);
	if (s->trace) {
		/* Each finished request is on disk for warm-expert-cache, and a
		 * crash loses at most the running one. */
		struct k3_err terr = { 0, "" };
		if (k3_store_trace_flush(s->trace, &terr) < 0) {
			k3_log_warning("router trace stopped: %s", terr.msg);
			k3_store_trace_close(s->trace, NULL);
			s->trace = NULL;
		}
	}
	memset(&xd, 0, sizeof(xd));
	if (s->store) {
		/* Guesses still queued are for layers this request has passed:
		 * drop them, and let reads in flight land, so every byte is
		 * charged to the request that caused it. */
		k3_store_prefetch_cancel(s->store, UINT32_MAX);
		k3_store_drain(s->store);
		k3_store_idle(s->store);
		k3_store_stats_get(s->store, &xs1);
		k3_store_stats_sub(&xs1, &xs0, &xd);
	}
	if (r == -ECANCELED) {
		/* Stopped between layers: the branch is half-advanced, drop it. */
		r = 0;
		j->finish = K3_FINISH_CANCELLED;
		decode_s = since(&t1);
	}
	if (!prefilled && j->finish == K3_FINISH_CANCELLED) {
		/* Cancelled during prefill: that time was prefill, none was decode. */
		prefill_s = since(&t0);
		decode_s = 0;
	}
	j->prefill_s = prefill_s;
	j->decode_s = decode_s;
	j->io_wait_s = (double)xd.io_wait_ns * 1e-9;
	j->compute_s = prefill_s + decode_s > j->io_wait_s ? prefill_s + decode_s - j->io_wait_s : 0;
	if (r < 0) {
		struct k3_msg_error e;

		k3_log_err("job %llu failed: %s", (unsigned long long)j->id, err.msg);
		memset(&e, 0, sizeof(e));
		e.status = K3_STATUS_INTERNAL; e.has_status = true;
		e.message = k3_proto_str_of(err.msg[0] ? err.msg : "engine failure"); e.has_message = true;
		j->final = encode_frame(j, K3_MSG_ERROR, &e);
		k3_engine_seq_free(seq);
		seq = NULL;
		j->finish = K3_FINISH_ERROR;
	} else {
		done.finish = j->finish; done.has_finish = true;
		if (j->finish == K3_FINISH_CANCELLED && atomic_load(&j->cancel_reason)) {
			done.cancel_reason = atomic_load(&j->cancel_reason);
			done.has_cancel_reason = true;
		}
		done.prompt_tokens = n; done.has_prompt_tokens = true;
		done.completion_tokens = j->n_gen; done.has_completion_tokens = true;
		done.reasoning_tokens = j->n_reasoning; done.has_reasoning_tokens = true;
		done.cached_tokens = j->n_cached; done.has_cached_tokens = true;
		done.queued_s = queued_s; done.has_queued_s = true;
		done.prefill_s = prefill_s; done.has_prefill_s = true;
		done.decode_s = decode_s; done.has_decode_s = true;
		done.prefill_tps = prefill_s > 0 ? (double)(prefill_end - start) / prefill_s : 0;
		done.has_prefill_tps = true;
		done.decode_tps = decode_s > 0 ? (double)j->n_gen / decode_s : 0;
		done.has_decode_tps = true;
		/* Honest split of the engine's time: waiting for expert reads
		 * vs everything else (compute_s + io_wait_s = prefill + decode). */
		done.io_wait_s = (double)xd.io_wait_ns * 1e-9; done.has_io_wait_s = true;
		done.compute_s = prefill_s + decode_s - done.io_wait_s;
		if (done.compute_s < 0)
			done.compute_s = 0;
		done.has_compute_s = true;
		if (s->store) {
			/* hits exclude same-step prefetches (docs/store.md, counters) */
			done.expert_bytes_read = xd.bytes_read; done.has_expert_bytes_read = true;
			done.expert_hits = xd.demand_hits; done.has_expert_hits = true;
			done.expert_misses = xd.demand_misses; done.has_expert_misses = true;
			done.prefetch_issued = xd.prefetch_issued; done.has_prefetch_issued = true;
			done.prefetch_issued_bytes = xd.prefetch_issued_bytes;
			done.has_prefetch_issued_bytes = true;
			done.prefetch_used = xd.prefetch_used; done.has_prefetch_used = true;
			done.prefetch_wasted_bytes = xd.prefetch_wasted_bytes;
			done.has_prefetch_wasted_bytes = true;
		}
		j->final = encode_frame(j, K3_MSG_DONE, &done);
		j->done_sent = j->final != NULL;
	}
	/* Only a complete answer becomes publishable state. */
	if (seq && (j->finish == K3_FINISH_STOP || j->finish == K3_FINISH_LENGTH ||
		    j->finish == K3_FINISH_TOOL_CALLS)) {
		j->branch[1].seq = seq;
	} else {
		k3_engine_seq_free(seq);
		conv_state_release(&j->branch[0]);
		conv_state_release(&j->branch[1]);
	}
}

/* Bytes of the routed experts' tensors (what the store streams). */
static uint64_t expert_tensor_bytes(const struct k3_model *m)
{
	const struct k3_model_plan *plan = k3_model_plan(m);
	uint64_t sum = 0;

	for (uint32_t l = 0; l < plan->n_layers; l++) {
		if (!plan->layers[l].is_moe)
			continue;
		for (uint32_t x = 0; x < plan->layers[l].moe.n_experts; x++) {
			const struct k3_expert *e = &plan->layers[l].moe.experts[x];
			const struct k3_expert_proj *pr[3] = { &e->w1, &e->w2, &e->w3 };
			for (int i = 0; i < 3; i++) {
				if (pr[i]->packed)
					sum += pr[i]->packed->nbytes;
				if (pr[i]->scale)
					sum += pr[i]->scale->nbytes;
				if (pr[i]->weight)
					sum += pr[i]->weight->nbytes;
			}
		}
	}
	return sum;
}

/* The first expert file read without O_DIRECT (for the log). */
static uint32_t first_buffered(const struct k3_store_source *src)
{
	for (uint32_t f = 0; f < k3_store_source_file_count(src); f++)
		if (!k3_store_source_file_direct(src, f))
			return f;
	return 0;
}

/* Per-request state the budget reserves besides the cache: MLA caches and
 * KDA states of one sequence plus activations (small next to the experts at
 * every scale this build serves; a long-context K3 request needs more and
 * --expert-cache-gb N then sets the share explicitly). */
#define SCHED_STATE_RESERVE ((uint64_t)512 << 20)

/* Opens --router-trace FILE and the per-chunk route buffers. Apart from
 * the model so that a bad trace path is reported as what it is (a symlink,
 * not a regular file, not writable), never as "cannot load model". */
static int open_trace(struct k3_sched *s, struct k3_err *err)
{
	const struct k3_options *o = s->opts;
	size_t per;
	int r;

	if (!o->router_trace)
		return 0;
	per = (size_t)PREFILL_CHUNK * k3_engine_n_moe(s->engine) * k3_engine_top_k(s->engine);
	r = k3_store_trace_open(o->router_trace, 0, K3_STORE_TRACE_BUFFERED, &s->trace, err);
	if (r < 0)
		return r;
	s->route_ids = calloc(per ? per : 1, sizeof(*s->route_ids));
	s->route_w = calloc(per ? per : 1, sizeof(*s->route_w));
	if (!s->route_ids || !s->route_w)
		return k3_err_set(err, -ENOMEM, "out of memory for the router trace buffers");
	k3_log_info("router trace: appending to %s", o->router_trace);
	return 0;
}

/* Opens the expert store behind the engine (docs/store.md, "For the
 * engine"): packs when valid (else shards, logged with the reason), the
 * RAM budget (refused below one token's floor), the reader threads and the
 * lookahead. A model whose experts the store cannot
 * stream (not MXFP4) keeps the mmapped tensors, with a warning. */
static int open_store(struct k3_sched *s, struct k3_err *err)
{
	const struct k3_options *o = s->opts;
	const struct k3_model_config *mc = k3_model_config(s->model);
	struct k3_store_open_report rep;
	struct k3_store_budget_out b;
	char packdir[4096];
	int r;

	if (!mc->n_moe)
		return 0;
	if (snprintf(packdir, sizeof(packdir), "%s/%s", o->model_dir, K3_STORE_PACK_SUBDIR) >=
	    (int)sizeof(packdir))
		return k3_err_set(err, -ENAMETOOLONG, "model path too long");
	memset(&rep, 0, sizeof(rep));
	bool have_packs = !o->no_packs && access(packdir, F_OK) == 0;
	r = k3_store_source_open_model(s->model, have_packs ? packdir : NULL,
				       (enum k3_store_direct)o->direct, &s->xsrc, &rep, err);
	if (r == -ENOTSUP) {
		k3_log_warning("expert store off: %s; routed experts come from the mmapped shards", err->msg);
		err->code = 0;
		err->msg[0] = '\0';
		return 0;
	}
	if (r == -EMEDIUMTYPE)   /* --direct on, and the file system refuses O_DIRECT */
		return k3_err_prefix(err, "--direct on");
	if (r < 0)
		return k3_err_prefix(err, "expert store");
	if (o->no_packs)
		k3_log_info("experts: %u MoE layers from the shards (--no-packs)", rep.layers_shards);
	else if (!have_packs)
		k3_log_info("experts: %u MoE layers from the shards (no %s; `k3ctl pack --model DIR` writes packs)",
			    rep.layers_shards, packdir);
	else if (rep.layers_shards)
		k3_log_info("experts: %u MoE layers from packs, %u from the shards (%u packs rejected; first: %s)",
			    rep.layers_packed, rep.layers_shards, rep.packs_rejected,
			    rep.first_rejection[0] ? rep.first_rejection : "no pack for the layer");
	else
		k3_log_info("experts: all %u MoE layers from packs in %s", rep.layers_packed, packdir);

	size_t n_t = 0;
	const struct k3_tensor *t = k3_model_tensors(s->model, &n_t);
	uint64_t weights = 0, xbytes = expert_tensor_bytes(s->model);
	uint64_t slot = k3_store_source_slot_bytes(s->xsrc);
	uint64_t pool = (uint64_t)k3_store_source_count(s->xsrc) * slot;
	for (size_t i = 0; i < n_t; i++)
		weights += t[i].nbytes;
	struct k3_store_budget_in bi = {
		.spine_bytes = weights > xbytes ? weights - xbytes : 0,
		.state_bytes = SCHED_STATE_RESERVE,
		.slot_bytes = slot,
		.floor_slots = mc->num_experts_per_token,
		.requested_bytes = o->expert_cache_bytes,
	};
	r = k3_store_budget(&bi, &b, err);
	if (r < 0)
		return k3_err_prefix(err, "--expert-cache-gb");
	/* More than every expert buys nothing. */
	uint64_t cache = b.cache_bytes < pool ? b.cache_bytes : pool;
	if (cache < b.floor_bytes)
		cache = b.floor_bytes;
	/* auto: every rank is offered, the store's precision gate decides. */
	bool pf_auto = o->prefetch < 0;
	int prefetch = pf_auto ? (int)mc->num_experts_per_token : o->prefetch;
	struct k3_store_config cfg = {
		.cache_bytes = cache,
		.io_threads = o->io_threads,
		.policy = K3_STORE_POLICY_FREQ,
		.prefetch_slots = prefetch ? -1 : 0,
		.prefetch_auto = pf_auto,
		.check_scales = true,
	};
	r = k3_store_new(s->xsrc, &cfg, &s->store, err);
	if (r < 0)
		return k3_err_prefix(err, "expert store");
	struct k3_store_info info;
	struct k3_expert_source es;
	k3_store_info_get(s->store, &info);
	k3_store_engine_src_init(&s->xctx, s->store, &es);
	k3_store_engine_src_set_prefetch(&s->xctx, (uint32_t)prefetch, &es);
	k3_engine_set_expert_source(s->engine, &es);
	char pfs[96];
	if (pf_auto)
		snprintf(pfs, sizeof(pfs), "auto (a rank is read ahead while its precision >= %.2f)",
			 K3_STORE_PREFETCH_MIN_PRECISION);
	else if (prefetch)
		snprintf(pfs, sizeof(pfs), "%d guesses per position", prefetch);
	else
		snprintf(pfs, sizeof(pfs), "off");
	k3_log_info("expert cache: %u slots of %" PRIu64 " bytes = %.3f GB (%s; limit %.1f GB%s, "
		    "spine %.3f GB, floor %.3f GB, experts %.3f GB); %u reader threads; prefetch %s",
		    info.n_slots, info.slot_bytes, (double)info.n_slots * (double)info.slot_bytes / 1e9,
		    o->expert_cache_bytes ? "--expert-cache-gb" : "auto", (double)b.limit_bytes / 1e9,
		    b.limited_by_cgroup ? " by cgroup" : "", (double)bi.spine_bytes / 1e9,
		    (double)b.floor_bytes / 1e9, (double)pool / 1e9, info.io_threads, pfs);
	if (info.files_buffered && o->direct == K3_STORE_DIRECT_AUTO)
		k3_log_warning("expert reads: %u files with O_DIRECT, %u buffered + posix_fadvise(RANDOM)"
			       " (--direct auto: the file system refused O_DIRECT for %s)",
			       info.files_direct, info.files_buffered,
			       k3_store_source_file_path(s->xsrc, first_buffered(s->xsrc)));
	else
		k3_log_info("expert reads: %u files with O_DIRECT, %u buffered + posix_fadvise(RANDOM)"
			    " (--direct %s)", info.files_direct, info.files_buffered,
			    k3_store_direct_name((enum k3_store_direct)o->direct));
	return 0;
}

/* Preloads a WARM_EXPERTS job's experts on the engine thread (between
 * generations, so no step is in progress): per layer, in batches of at
 * most half the slots, acquire (reads the misses sorted by offset, several
 * in flight) and release at once, leaving them resident and unpinned. The
 * job holds at most as many experts as the cache has slots (the best
 * first), so later batches take free or evictable slots, never fail. The
 * reads count in the store's counters like any demand read. */
static void run_warm(struct k3_sched *s, struct job *j)
{
	struct k3_store_info info;
	struct k3_store_stats a, b;
	struct k3_msg_warm_experts_reply r;
	struct k3_err err = { 0, "" };
	struct timespec t0;
	uint32_t loaded = 0, resident = 0;
	int rc = 0;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	k3_store_info_get(s->store, &info);
	k3_store_stats_get(s->store, &a);
	uint32_t batch = info.n_slots / 2 ? info.n_slots / 2 : 1;
	struct k3_store_view *views = calloc(batch, sizeof(*views));
	uint32_t *ids = calloc(batch, sizeof(*ids));
	bool *done_mask = calloc(j->n_warm ? j->n_warm : 1, sizeof(*done_mask));
	if (!views || !ids || !done_mask)
		rc = k3_err_set(&err, -ENOMEM, "out of memory");
	/* Layer by layer in order of each layer's best entry; inside a layer,
	 * rank order. */
	for (uint32_t i = 0; rc == 0 && i < j->n_warm; i++) {
		if (done_mask[i])
			continue;
		uint32_t layer = j->warm_layer[i], n = 0;
		for (uint32_t k = i; k < j->n_warm; k++) {
			if (done_mask[k] || j->warm_layer[k] != layer)
				continue;
			done_mask[k] = true;
			ids[n++] = j->warm_expert[k];
			if (n == batch || k + 1 == j->n_warm) {
				if (atomic_load(&j->cancel)) {
					rc = k3_err_set(&err, -ECANCELED, "cancelled");
					break;
				}
				k3_store_step_begin(s->store);
				rc = k3_store_acquire(s->store, layer, ids, n, views, &err);
				if (rc)
					break;
				k3_store_release(s->store, views, n);
				loaded += n;
				n = 0;
			}
		}
		if (rc == 0 && n) {
			k3_store_step_begin(s->store);
			rc = k3_store_acquire(s->store, layer, ids, n, views, &err);
			if (rc == 0) {
				k3_store_release(s->store, views, n);
				loaded += n;
			}
		}
	}
	k3_store_idle(s->store);
	k3_store_stats_get(s->store, &b);
	for (uint32_t i = 0; i < j->n_warm; i++)
		resident += k3_store_resident(s->store, j->warm_layer[i], j->warm_expert[i]);
	free(views);
	free(ids);
	free(done_mask);
	if (rc < 0) {
		struct k3_msg_error e;

		k3_log_warning("warm-experts job %llu: %s", (unsigned long long)j->id, err.msg);
		memset(&e, 0, sizeof(e));
		e.status = rc == -ECANCELED ? K3_STATUS_CANCELLED : K3_STATUS_INTERNAL; e.has_status = true;
		e.message = k3_proto_str_of(err.msg); e.has_message = true;
		j->final = encode_frame(j, K3_MSG_ERROR, &e);
		return;
	}
	memset(&r, 0, sizeof(r));
	r.requested = j->warm_requested; r.has_requested = true;
	r.loaded = loaded; r.has_loaded = true;
	r.resident = resident; r.has_resident = true;
	r.bytes_read = b.bytes_read - a.bytes_read; r.has_bytes_read = true;
	r.seconds = since(&t0); r.has_seconds = true;
	k3_log_info("warmed %u of %u requested experts (%u resident now), %.1f MB read in %.2f s",
		    loaded, j->warm_requested, resident, (double)r.bytes_read / 1e6, r.seconds);
	j->final = encode_frame(j, K3_MSG_WARM_EXPERTS_REPLY, &r);
}

static void load_model(struct k3_sched *s)
{
	struct k3_err err = { 0, "" };
	struct k3_engine_opts eo = { .threads = s->opts->threads };
	const char *dir = s->opts->model_dir;
	const char *base;
	char msg[K3_ERR_MSG_MAX + 64];
	int r;

	r = k3_model_open(dir, &s->model, &err);
	snprintf(msg, sizeof(msg), "%s/tiktoken.model", dir);
	if (r == 0 && access(msg, F_OK) == 0)
		r = k3_tok_load_dir(dir, &s->tok, &err);
	else if (r == 0)
		k3_log_warning("model '%s' has no tiktoken.model: serving token-id requests only", dir);
	if (r == 0)
		r = k3_engine_open(s->model, &eo, &s->engine, &err);
	if (r == 0 && (r = open_trace(s, &err)) < 0) {
		snprintf(msg, sizeof(msg), "cannot use --router-trace: %s", err.msg);
		post_kind(s, MSG_LOADED, NULL, false, msg);
		return;
	}
	if (r == 0)
		r = open_store(s, &err);
	if (r < 0) {
		snprintf(msg, sizeof(msg), "cannot load model '%s': %s", dir, err.msg);
		post_kind(s, MSG_LOADED, NULL, false, msg);
		return;
	}
	{
		size_t n_t = 0;
		const struct k3_tensor *t = k3_model_tensors(s->model, &n_t);
		uint64_t mapped = 0, weights = 0, rss_kb = 0;
		char line[256];
		FILE *f = fopen("/proc/self/status", "r");

		for (uint32_t i = 0; i < k3_model_shard_count(s->model); i++)
			mapped += k3_model_shard_size(s->model, i);
		for (size_t i = 0; i < n_t; i++)
			weights += t[i].nbytes;
		while (f && fgets(line, sizeof(line), f))
			if (sscanf(line, "VmRSS: %" SCNu64, &rss_kb) == 1)
				break;
		if (f)
			fclose(f);
		/* Weights are mapped read-only and paged in on use, so resident
		 * memory grows with the first tokens, not at load. */
		k3_log_info("model: %u shards, %.1f MB mapped read-only, %zu tensors with %.1f MB of "
			    "weights; resident now %.1f MB; per-sequence state is allocated per request",
			    k3_model_shard_count(s->model), (double)mapped / 1e6, n_t, (double)weights / 1e6,
			    (double)rss_kb / 1e3);
	}
	base = strrchr(dir, '/');
	base = base && base[1] ? base + 1 : dir;
	snprintf(s->model_id, sizeof(s->model_id), "%s", base);
	s->loaded = true;
	post_kind(s, MSG_LOADED, NULL, true, NULL);
}

static void *engine_main(void *arg)
{
	struct k3_sched *s = arg;

	load_model(s);
	pthread_mutex_lock(&s->lock);
	while (!s->stopping) {
		struct job *j = s->queue_head;

		if (!j || !s->loaded) {
			pthread_cond_wait(&s->cond, &s->lock);
			continue;
		}
		s->queue_head = j->next;
		if (!s->queue_head)
			s->queue_tail = NULL;
		s->n_queued--;
		s->running = j;
		pthread_mutex_unlock(&s->lock);
		post_kind(s, MSG_STARTED, j, true, NULL);
		if (j->warm)
			run_warm(s, j);
		else
			run_job(s, j);
		/* The slot frees in the same step that queues the final frame, so
		 * a client that reacts to DONE at once never sees a stale BUSY. */
		struct sched_msg *fin = calloc(1, sizeof(*fin));
		pthread_mutex_lock(&s->lock);
		s->running = NULL;
		if (j->final)
			post_locked(s, j->final);
		j->final = NULL;
		if (fin) {
			fin->kind = MSG_FINISHED;
			fin->job = j;
			post_locked(s, fin);
		}
		event_active(s->wake, EV_READ, 0);
	}
	pthread_mutex_unlock(&s->lock);
	return NULL;
}

/* ---- the loop thread ---------------------------------------------------------- */

static void job_free(struct job *j)
{
	if (!j)
		return;
	if (j->publish_timer)
		event_free(j->publish_timer);
	k3_conn_unref(j->conn);
	k3_tok_ids_release(&j->prompt);
	free(j->warm_layer);
	free(j->warm_expert);
	for (uint32_t i = 0; i < j->n_stop; i++)
		free(j->stop[i]);
	conv_state_release(&j->branch[0]);
	conv_state_release(&j->branch[1]);
	free(j);
}

/* DONE reached the kernel (or not): publish the branch, or drop it. */
static void job_flushed(void *arg, bool written)
{
	struct job *j = arg;
	struct k3_sched *s = j->s;

	if (written && j->branch[1].seq) {
		pthread_mutex_lock(&s->lock);
		for (int k = 0; k < 2; k++) {
			conv_state_release(&s->pub[k]);
			s->pub[k] = j->branch[k];
			memset(&j->branch[k], 0, sizeof(j->branch[k]));
		}
		pthread_mutex_unlock(&s->lock);
	}
	job_free(j);
}

/* The client has not taken its DONE in time: drop the branch states now
 * rather than pin them until it reads or goes away; job_flushed then
 * finds nothing to publish. */
static void job_publish_late(evutil_socket_t fd, short what, void *arg)
{
	struct job *j = arg;

	(void)fd; (void)what;
	k3_log_debug("job %llu: DONE unread after %d s; its state will not be published",
		     (unsigned long long)j->id, PUBLISH_DEADLINE_S);
	conv_state_release(&j->branch[0]);
	conv_state_release(&j->branch[1]);
}

static void send_positions(struct k3_sched *s)
{
	uint32_t pos = 1;

	pthread_mutex_lock(&s->lock);
	for (struct job *j = s->queue_head; j; j = j->next, pos++) {
		if (!j->warm && j->queue_pos_sent != pos && j->conn && k3_conn_is_open(j->conn)) {
			struct k3_msg_accepted a;

			memset(&a, 0, sizeof(a));
			a.job_id = j->id; a.has_job_id = true;
			a.queue_position = pos; a.has_queue_position = true;
			k3_conn_send(j->conn, K3_MSG_ACCEPTED, j->rid, &a);
			j->queue_pos_sent = pos;
		}
	}
	pthread_mutex_unlock(&s->lock);
}

static void prep_done(struct k3_sched *s, struct prep_task *t);

static void wake_cb(evutil_socket_t fd, short what, void *arg)
{
	struct k3_sched *s = arg;
	struct sched_msg *m, *next;

	(void)fd; (void)what;
	pthread_mutex_lock(&s->lock);
	m = s->msgs;
	s->msgs = s->msgs_tail = NULL;
	pthread_mutex_unlock(&s->lock);
	for (; m; m = next) {
		struct job *j = m->job;

		next = m->next;
		switch (m->kind) {
		case MSG_FRAME:
			if (j->conn && k3_conn_send_raw(j->conn, m->bytes, m->len) < 0)
				atomic_store(&j->cancel, true);   /* nobody is listening */
			break;
		case MSG_STARTED:
			send_positions(s);
			break;
		case MSG_FINISHED:
			if (j->warm) {
				job_free(j);
				break;
			}
			s->totals.requests_total++;
			s->totals.prompt_tokens_total += j->prompt.n;
			s->totals.completion_tokens_total += j->n_gen;
			s->totals.reasoning_tokens_total += j->n_reasoning;
			s->totals.positions_total += j->positions;
			s->totals.prefill_s_total += j->prefill_s;
			s->totals.decode_s_total += j->decode_s;
			s->totals.io_wait_s_total += j->io_wait_s;
			s->totals.compute_s_total += j->compute_s;
			if (j->conn && j->done_sent) {
				struct timeval tv = { PUBLISH_DEADLINE_S, 0 };

				/* Armed first: a synchronous job_flushed frees it with j. */
				j->publish_timer = evtimer_new(s->base, job_publish_late, j);
				if (j->publish_timer)
					evtimer_add(j->publish_timer, &tv);
				if (k3_conn_when_flushed(j->conn, job_flushed, j) == 0)
					break;
			}
			job_free(j);
			break;
		case MSG_PREPARED:
			prep_done(s, m->task);
			break;
		case MSG_LOADED:
			if (m->ok)
				k3_log_notice("model '%s' loaded (%u layers, vocab %u)", s->model_id,
					      k3_model_config(s->model)->num_hidden_layers,
					      k3_engine_vocab(s->engine));
			s->ready = m->ok;
			s->on_ready(s->ready_ctx, m->ok, m->ok ? s->model_id : m->text);
			break;
		}
		if (m->kind == MSG_FINISHED && s->draining) {
			pthread_mutex_lock(&s->lock);
			bool idle = !s->running;
			pthread_mutex_unlock(&s->lock);
			if (idle)
				k3_server_drain_done(s->srv);
		}
		free(m->bytes);
		free(m);
	}
}

/* Records why a request cannot run (sent as ERROR by the loop thread). */
static int prep_fail(struct job *j, uint32_t status, const char *param, int code,
		     const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static int prep_fail(struct job *j, uint32_t status, const char *param, int code,
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

/* Copies the request into a job: ids from prompt text, prompt ids or the
 * rendered chat. On failure returns < 0 with the ERROR to send recorded in
 * j. Touches no connection, so it may run on the prep thread. */
static int job_prepare(struct k3_sched *s, const struct k3_msg_generate *g, struct job *j)
{
	const struct k3_model_config *mc = k3_model_config(s->model);
	uint64_t ctx = mc->max_position_embeddings ? mc->max_position_embeddings : 4096;
	struct k3_err err = { 0, "" };
	int r = 0;

	j->chat = g->mode == K3_MODE_CHAT;
	if (!s->tok && (j->chat || g->has_prompt || g->has_stop))
		return prep_fail(j, K3_STATUS_UNSUPPORTED, j->chat ? "messages" : "prompt", -ENOTSUP,
					  "this model has no tokenizer (tiktoken.model): send prompt_ids");
	if (g->mode > K3_MODE_CHAT)
		return prep_fail(j, K3_STATUS_BAD_REQUEST, "mode", -EINVAL, "unknown mode %u", g->mode);
	if (!j->chat) {
		if (g->has_prompt == g->has_prompt_ids)
			return prep_fail(j, K3_STATUS_BAD_REQUEST, "prompt", -EINVAL,
						  "a raw GENERATE needs exactly one of prompt and prompt_ids");
		if (g->has_prompt)
			r = k3_tok_encode(s->tok, g->prompt.p, g->prompt.len, false, &j->prompt, &err);
		for (uint32_t i = 0; r == 0 && g->has_prompt_ids && i < g->prompt_ids.n; i++) {
			uint32_t id = k3_proto_ids_at(&g->prompt_ids, i);

			if (id >= k3_engine_vocab(s->engine))
				return prep_fail(j, K3_STATUS_INVALID_ARGUMENT, "prompt_ids", -EINVAL,
							  "token id %u is outside the vocabulary (%u ids)", id,
							  k3_engine_vocab(s->engine));
			r = k3_tok_ids_push(&j->prompt, id);
		}
	} else {
		struct k3_chat_opts o;
		struct k3_chat chat;
		json_t *msgs, *tools = NULL, *choice = NULL, *fmt = NULL;
		json_error_t jerr;
		static const char *const efforts[] = { NULL, NULL, "low", "high", "max" };

		if (!g->has_messages || g->has_prompt || g->has_prompt_ids)
			return prep_fail(j, K3_STATUS_BAD_REQUEST, "messages", -EINVAL,
						  "a chat GENERATE needs messages and no prompt");
		/* U+0000 is text like any other: a history resends what K3 wrote */
		msgs = json_loadb(g->messages.p, g->messages.len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &jerr);
		if (!msgs || !json_is_array(msgs)) {
			json_decref(msgs);
			return prep_fail(j, K3_STATUS_BAD_REQUEST, "messages", -EINVAL,
						  "messages must be a JSON array: %s", msgs ? "not an array" : jerr.text);
		}
		k3_chat_opts_init(&o);
		if (g->has_thinking)
			o.thinking = g->thinking;
		if (g->has_reasoning_effort && g->reasoning_effort > K3_EFFORT_MAX) {
			json_decref(msgs);
			return prep_fail(j, K3_STATUS_INVALID_ARGUMENT, "reasoning_effort", -EINVAL,
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
			return prep_fail(j, r == -ENOTSUP ? K3_STATUS_UNSUPPORTED :
						  K3_STATUS_INVALID_ARGUMENT, "messages", r, "%s", err.msg);
	}
	if (r < 0)
		return prep_fail(j, K3_STATUS_INVALID_ARGUMENT, "prompt", r, "%s", err.msg);
	if (j->prompt.n == 0)
		return prep_fail(j, K3_STATUS_INVALID_ARGUMENT, "prompt", -EINVAL,
					  "the prompt is empty");
	if (j->prompt.n >= ctx)
		return prep_fail(j, K3_STATUS_CONTEXT_EXCEEDED, "messages", -E2BIG,
				 "the prompt has %zu tokens; the context holds %llu", j->prompt.n,
				 (unsigned long long)ctx);
	/* The request's own number goes into the message, before any cap. */
	if (g->has_max_new && (uint64_t)j->prompt.n + g->max_new > ctx)
		return prep_fail(j, K3_STATUS_CONTEXT_EXCEEDED, "max_new", -E2BIG,
				 "the prompt has %zu tokens and %u new tokens were asked for; the "
				 "context holds %llu", j->prompt.n, g->max_new, (unsigned long long)ctx);
	j->max_new = g->has_max_new ? g->max_new : (uint32_t)(ctx - j->prompt.n);
	if (j->max_new > K3_LIM_MAX_NEW)
		j->max_new = K3_LIM_MAX_NEW;
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
			return prep_fail(j, K3_STATUS_INVALID_ARGUMENT, "stop", -EINVAL,
						  "stop strings must not be empty");
		j->stop[i] = strndup(g->stop.v[i].p, g->stop.v[i].len);
		if (!j->stop[i])
			return prep_fail(j, K3_STATUS_INTERNAL, NULL, -ENOMEM, "out of memory");
		j->n_stop = i + 1;
	}
	return 0;
}

/* Queues a prepared job (or answers its ERROR) and sends ACCEPTED. Loop
 * thread; takes ownership of j. */
static void job_admit(struct k3_sched *s, struct k3_conn *c, uint32_t rid, struct job *j)
{
	struct k3_msg_accepted a;
	unsigned ahead;

	if (j->err_status) {
		k3_conn_send_error(c, rid, j->err_status, j->err_param, "%s", j->err_msg);
		job_free(j);
		return;
	}
	j->conn = k3_conn_ref(c);
	j->id = ++s->next_job_id;
	clock_gettime(CLOCK_MONOTONIC, &j->t_submit);
	pthread_mutex_lock(&s->lock);
	ahead = s->n_queued + (s->running ? 1 : 0);
	if (s->queue_tail)
		s->queue_tail->next = j;
	else
		s->queue_head = j;
	s->queue_tail = j;
	s->n_queued++;
	j->queue_pos_sent = ahead;
	pthread_cond_signal(&s->cond);
	pthread_mutex_unlock(&s->lock);
	memset(&a, 0, sizeof(a));
	a.job_id = j->id; a.has_job_id = true;
	a.queue_position = ahead; a.has_queue_position = true;
	a.prompt_tokens = (uint32_t)j->prompt.n; a.has_prompt_tokens = true;
	k3_conn_send(c, K3_MSG_ACCEPTED, rid, &a);
}

static void prep_task_free(struct prep_task *t)
{
	if (!t)
		return;
	k3_conn_unref(t->conn);
	job_free(t->job);
	free(t->blob);
	free(t->text);
	free(t->frame);
	free(t);
}

/* Hands t to the prep thread and remembers it as in flight. */
static void prep_submit(struct k3_sched *s, struct prep_task *t)
{
	t->lnext = s->inflight;
	s->inflight = t;
	if (!t->tokenize)
		s->n_prepping++;
	pthread_mutex_lock(&s->lock);
	t->next = NULL;
	if (s->prep_tail)
		s->prep_tail->next = t;
	else
		s->prep_head = t;
	s->prep_tail = t;
	pthread_cond_signal(&s->prep_cond);
	pthread_mutex_unlock(&s->lock);
}

/* A deep copy of a GENERATE whose strings and ids live in one blob, so the
 * request outlives the connection's frame buffer. */
static int generate_copy(const struct k3_msg_generate *g, struct k3_msg_generate *out, void **blob)
{
	const struct k3_proto_str *strs[5 + K3_LIM_STOP_COUNT];
	struct k3_proto_str *dst[5 + K3_LIM_STOP_COUNT];
	size_t n = 0, bytes = 0, off;
	uint8_t *b;

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
	for (size_t i = 0; i < n; i++)
		bytes += strs[i]->len;
	bytes += ((size_t)g->prompt_ids.n + g->stop_ids.n) * sizeof(uint32_t);
	b = malloc(bytes ? bytes : 1);
	if (!b)
		return -ENOMEM;
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
	*blob = b;
	return 0;
}

static void handle_generate(struct k3_sched *s, struct k3_conn *c, uint32_t rid,
			    const struct k3_msg_generate *g)
{
	struct prep_task *t;
	struct job *j;
	unsigned ahead;
	size_t text;
	bool dup;

	if (s->draining) {
		k3_conn_send_error(c, rid, K3_STATUS_SHUTTING_DOWN, NULL, "k3d is shutting down");
		return;
	}
	pthread_mutex_lock(&s->lock);
	/* Requests still on the prep thread hold a place too. */
	/* A running job already told to stop ends within one layer step; a
	 * client that cancelled (or disconnected) and asks again at once must
	 * not be answered BUSY for that window: it queues behind it. */
	ahead = s->n_queued + (s->running && !atomic_load(&s->running->cancel) ? 1 : 0) + s->n_prepping;
	/* Events and CANCEL are matched by request id: two live GENERATEs
	 * with one id on one connection could not be told apart. */
	dup = s->running && s->running->conn == c && s->running->rid == rid;
	for (struct job *q = s->queue_head; q && !dup; q = q->next)
		dup = q->conn == c && q->rid == rid;
	pthread_mutex_unlock(&s->lock);
	for (struct prep_task *p = s->inflight; p && !dup; p = p->lnext)
		dup = !p->tokenize && p->conn == c && p->rid == rid;
	if (dup) {
		k3_conn_send_error(c, rid, K3_STATUS_BAD_REQUEST, NULL,
				   "request id %u is already in use by a queued or running GENERATE "
				   "on this connection", rid);
		return;
	}
	if (ahead > s->opts->queue_max) {
		k3_conn_send_error(c, rid, K3_STATUS_BUSY, NULL,
				   "engine busy: 1 generation running and %u/%u queued; retry later",
				   ahead - 1, s->opts->queue_max);
		return;
	}
	j = calloc(1, sizeof(*j));
	if (!j) {
		k3_conn_send_error(c, rid, K3_STATUS_INTERNAL, NULL, "out of memory");
		return;
	}
	j->s = s;
	j->rid = rid;
	k3_tok_ids_init(&j->prompt);
	text = (size_t)g->prompt.len + g->messages.len + g->tools.len + g->tool_choice.len +
	       g->response_format.len + (size_t)g->prompt_ids.n * 4;
	if (text < PREP_INLINE_BYTES) {
		job_prepare(s, g, j);
		job_admit(s, c, rid, j);
		return;
	}
	t = calloc(1, sizeof(*t));
	if (!t || generate_copy(g, &t->g, &t->blob) < 0) {
		free(t);
		job_free(j);
		k3_conn_send_error(c, rid, K3_STATUS_INTERNAL, NULL, "out of memory");
		return;
	}
	t->conn = k3_conn_ref(c);
	t->rid = rid;
	t->job = j;
	prep_submit(s, t);
}

/* TOKENIZE: encodes and writes the reply (or ERROR) frame into out. Pure,
 * so it runs inline for small texts and on the prep thread for big ones. */
static void tokenize_reply(struct k3_sched *s, uint32_t rid, const char *text, size_t len,
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
		e.status = K3_STATUS_INVALID_ARGUMENT; e.has_status = true;
		e.message = k3_proto_str_of(err.msg); e.has_message = true;
		e.param = k3_proto_str_of("text"); e.has_param = true;
		k3_proto_encode(out, K3_MSG_ERROR, rid, &e, NULL);
	} else {
		struct k3_msg_tokenize_reply r;

		memset(&r, 0, sizeof(r));
		r.ids.n = (uint32_t)ids.n;
		r.ids.v = ids.v;
		r.has_ids = true;
		k3_proto_encode(out, K3_MSG_TOKENIZE_REPLY, rid, &r, NULL);
	}
	k3_tok_ids_release(&ids);
}

static void handle_tokenize(struct k3_sched *s, struct k3_conn *c, uint32_t rid,
			    const struct k3_msg_tokenize *m)
{
	struct k3_proto_buf out;
	struct prep_task *t;

	if (m->text.len < PREP_INLINE_BYTES) {
		k3_proto_buf_init(&out, K3_LIM_PAYLOAD_MAX + K3_PROTO_HEADER_SIZE);
		tokenize_reply(s, rid, m->text.p, m->text.len, m->has_special && m->special, &out);
		if (out.len)
			k3_conn_send_raw(c, out.data, out.len);
		k3_proto_buf_release(&out);
		return;
	}
	t = calloc(1, sizeof(*t));
	if (t)
		t->text = malloc(m->text.len);
	if (!t || !t->text) {
		free(t);
		k3_conn_send_error(c, rid, K3_STATUS_INTERNAL, NULL, "out of memory");
		return;
	}
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
static void *prep_main(void *arg)
{
	struct k3_sched *s = arg;

	pthread_mutex_lock(&s->lock);
	while (!s->stopping) {
		struct prep_task *t = s->prep_head;
		struct sched_msg *m;

		if (!t) {
			pthread_cond_wait(&s->prep_cond, &s->lock);
			continue;
		}
		s->prep_head = t->next;
		if (!s->prep_head)
			s->prep_tail = NULL;
		pthread_mutex_unlock(&s->lock);
		if (t->tokenize) {
			struct k3_proto_buf out;

			k3_proto_buf_init(&out, K3_LIM_PAYLOAD_MAX + K3_PROTO_HEADER_SIZE);
			tokenize_reply(s, t->rid, t->text, t->text_len, t->special, &out);
			t->frame = out.data;
			t->frame_len = out.len;
		} else {
			job_prepare(s, &t->g, t->job);
		}
		m = calloc(1, sizeof(*m));
		pthread_mutex_lock(&s->lock);
		if (m) {
			m->kind = MSG_PREPARED;
			m->task = t;
			post_locked(s, m);
			event_active(s->wake, EV_READ, 0);
		} else {
			t->next = NULL;   /* leaked into nowhere would be worse: drop it */
			prep_task_free(t);
		}
	}
	pthread_mutex_unlock(&s->lock);
	return NULL;
}

/* A prep task came back (loop thread). */
static void prep_done(struct k3_sched *s, struct prep_task *t)
{
	struct prep_task **pp;

	for (pp = &s->inflight; *pp; pp = &(*pp)->lnext)
		if (*pp == t) {
			*pp = t->lnext;
			break;
		}
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
		d.finish = K3_FINISH_CANCELLED; d.has_finish = true;
		d.prompt_tokens = (uint32_t)t->job->prompt.n; d.has_prompt_tokens = true;
		d.completion_tokens = 0; d.has_completion_tokens = true;
		k3_conn_send(t->conn, K3_MSG_DONE, t->rid, &d);
	} else if (s->draining) {
		k3_conn_send_error(t->conn, t->rid, K3_STATUS_SHUTTING_DOWN, NULL, "k3d is shutting down");
	} else {
		job_admit(s, t->conn, t->rid, t->job);
		t->job = NULL;
	}
	prep_task_free(t);
}

static void handle_warm(struct k3_sched *s, struct k3_conn *c, uint32_t rid,
			const struct k3_msg_warm_experts *m)
{
	struct k3_store_info info;
	struct job *j;
	unsigned ahead;

	if (!s->store) {
		k3_conn_send_error(c, rid, K3_STATUS_UNSUPPORTED, NULL,
				   "this model's experts are not streamed through the expert cache");
		return;
	}
	if (m->layers.n != m->experts.n || m->layers.n == 0) {
		k3_conn_send_error(c, rid, K3_STATUS_BAD_REQUEST, "experts",
				   "layers (%u) and experts (%u) must pair up, at least one",
				   m->layers.n, m->experts.n);
		return;
	}
	for (uint32_t i = 0; i < m->layers.n; i++) {
		uint32_t l = k3_proto_ids_at(&m->layers, i), x = k3_proto_ids_at(&m->experts, i);
		if (k3_store_source_find(s->xsrc, l, x) < 0) {
			k3_conn_send_error(c, rid, K3_STATUS_INVALID_ARGUMENT, "experts",
					   "entry %u: layer %u has no routed expert %u", i, l, x);
			return;
		}
	}
	pthread_mutex_lock(&s->lock);
	ahead = s->n_queued + (s->running ? 1 : 0);
	pthread_mutex_unlock(&s->lock);
	if (ahead > s->opts->queue_max) {
		k3_conn_send_error(c, rid, K3_STATUS_BUSY, NULL,
				   "engine busy: 1 request running and %u/%u queued; retry later",
				   ahead - 1, s->opts->queue_max);
		return;
	}
	k3_store_info_get(s->store, &info);
	j = calloc(1, sizeof(*j));
	uint32_t n = m->layers.n < info.n_slots ? m->layers.n : info.n_slots;
	if (j) {
		j->warm_layer = malloc(n * sizeof(uint32_t));
		j->warm_expert = malloc(n * sizeof(uint32_t));
	}
	if (!j || !j->warm_layer || !j->warm_expert) {
		if (j) {
			free(j->warm_layer);
			free(j->warm_expert);
		}
		free(j);
		k3_conn_send_error(c, rid, K3_STATUS_INTERNAL, NULL, "out of memory");
		return;
	}
	/* Duplicates would only waste slots of the best-first prefix. */
	for (uint32_t i = 0; i < m->layers.n && j->n_warm < n; i++) {
		uint32_t l = k3_proto_ids_at(&m->layers, i), x = k3_proto_ids_at(&m->experts, i);
		bool dup = false;
		for (uint32_t k = 0; k < j->n_warm && !dup; k++)
			dup = j->warm_layer[k] == l && j->warm_expert[k] == x;
		if (!dup) {
			j->warm_layer[j->n_warm] = l;
			j->warm_expert[j->n_warm++] = x;
		}
	}
	j->s = s;
	j->rid = rid;
	j->warm = true;
	j->warm_requested = m->layers.n;
	k3_tok_ids_init(&j->prompt);
	j->conn = k3_conn_ref(c);
	j->id = ++s->next_job_id;
	clock_gettime(CLOCK_MONOTONIC, &j->t_submit);
	pthread_mutex_lock(&s->lock);
	if (s->queue_tail)
		s->queue_tail->next = j;
	else
		s->queue_head = j;
	s->queue_tail = j;
	s->n_queued++;
	pthread_cond_signal(&s->cond);
	pthread_mutex_unlock(&s->lock);
}

/* Whether connection c may cancel job j by its job id: its own uid's
 * jobs, or any job for an admin peer (job ids are sequential, so any
 * group member could otherwise stop everyone's work). */
static bool may_cancel(const struct k3_conn *c, const struct job *j)
{
	return k3_conn_is_admin(c) || (j->conn && k3_conn_uid(j->conn) == k3_conn_uid(c));
}

/* Marks matching jobs cancelled; queued ones are removed and answered at
 * once, the running one stops at its next step. Returns how many matched. */
static unsigned cancel_where(struct k3_sched *s, const struct k3_conn *c, bool by_rid, uint32_t rid,
			     uint64_t job_id)
{
	struct job **pp, *gone = NULL;
	unsigned n = 0;

	pthread_mutex_lock(&s->lock);
	for (pp = &s->queue_head; *pp;) {
		struct job *j = *pp;
		bool match = job_id ? j->id == job_id && may_cancel(c, j) :
				      (j->conn == c && (!by_rid || j->rid == rid));

		if (match) {
			*pp = j->next;
			s->n_queued--;
			j->next = gone;
			gone = j;
			n++;
		} else {
			pp = &j->next;
		}
	}
	s->queue_tail = NULL;
	for (struct job *j = s->queue_head; j; j = j->next)
		s->queue_tail = j;
	if (s->running) {
		struct job *j = s->running;
		bool match = job_id ? j->id == job_id && may_cancel(c, j) :
				      (j->conn == c && (!by_rid || j->rid == rid));

		if (match) {
			atomic_store(&j->cancel_reason, j->conn == c ? K3_CANCEL_CLIENT : K3_CANCEL_BY_ID);
			atomic_store(&j->cancel, true);
			n++;
		}
	}
	pthread_mutex_unlock(&s->lock);
	/* Still being prepared: answered DONE{cancelled} when it comes back
	 * (it has no job id yet, so only its own connection can name it). */
	for (struct prep_task *t = s->inflight; t && !job_id; t = t->lnext)
		if (!t->tokenize && !t->cancel && t->conn == c && (!by_rid || t->rid == rid)) {
			t->cancel = true;
			n++;
		}
	while (gone) {
		struct job *j = gone;
		struct k3_msg_done d;

		gone = j->next;
		memset(&d, 0, sizeof(d));
		d.finish = K3_FINISH_CANCELLED; d.has_finish = true;
		d.cancel_reason = j->conn == c ? K3_CANCEL_CLIENT : K3_CANCEL_BY_ID;
		d.has_cancel_reason = true;
		d.prompt_tokens = (uint32_t)j->prompt.n; d.has_prompt_tokens = true;
		d.completion_tokens = 0; d.has_completion_tokens = true;
		d.queued_s = since(&j->t_submit); d.has_queued_s = true;
		if (j->warm && k3_conn_is_open(j->conn))
			k3_conn_send_error(j->conn, j->rid, K3_STATUS_CANCELLED, NULL,
					   "expert preload cancelled before it started");
		else if (k3_conn_is_open(j->conn))
			k3_conn_send(j->conn, K3_MSG_DONE, j->rid, &d);
		job_free(j);
	}
	send_positions(s);
	return n;
}

static int hook_request(void *ctx, struct k3_conn *c, const struct k3_proto_header *h,
			const union k3_proto_body *body)
{
	struct k3_sched *s = ctx;

	if (!s->ready) {
		k3_conn_send_error(c, h->request_id, K3_STATUS_NOT_READY, NULL,
				   "the model is still loading; retry when k3ctl status says ready");
		return -EAGAIN;
	}
	if (!s->tok && (h->type == K3_MSG_TOKENIZE || h->type == K3_MSG_DETOKENIZE)) {
		k3_conn_send_error(c, h->request_id, K3_STATUS_UNSUPPORTED, NULL,
				   "this model has no tokenizer (tiktoken.model)");
		return -ENOTSUP;
	}
	switch (h->type) {
	case K3_MSG_GENERATE:
		handle_generate(s, c, h->request_id, &body->generate);
		return 0;
	case K3_MSG_WARM_EXPERTS:
		handle_warm(s, c, h->request_id, &body->warm_experts);
		return 0;
	case K3_MSG_CANCEL: {
		const struct k3_msg_cancel *m = &body->cancel;
		unsigned n = cancel_where(s, c, true, h->request_id, m->has_job_id ? m->job_id : 0);
		struct k3_msg_ok ok;

		if (n == 0) {
			k3_conn_send_error(c, h->request_id, K3_STATUS_NOT_FOUND, "job_id",
					   "no queued or running generation matches");
			return -ENOENT;
		}
		memset(&ok, 0, sizeof(ok));
		k3_conn_send(c, K3_MSG_OK, h->request_id, &ok);
		return 0;
	}
	case K3_MSG_TOKENIZE:
		handle_tokenize(s, c, h->request_id, &body->tokenize);
		return 0;
	case K3_MSG_DETOKENIZE: {
		const struct k3_msg_detokenize *m = &body->detokenize;
		uint32_t *ids = malloc((m->ids.n ? m->ids.n : 1) * sizeof(uint32_t));
		struct k3_msg_detokenize_reply r;
		struct k3_err err = { 0, "" };
		char *text = NULL;
		size_t len = 0;
		int rc = ids ? 0 : -ENOMEM;

		for (uint32_t i = 0; ids && i < m->ids.n; i++)
			ids[i] = k3_proto_ids_at(&m->ids, i);
		if (rc == 0)
			rc = k3_tok_decode(s->tok, ids, m->ids.n, &text, &len, &err);
		if (rc < 0) {
			k3_conn_send_error(c, h->request_id, K3_STATUS_INVALID_ARGUMENT, "ids", "%s",
					   err.msg[0] ? err.msg : "out of memory");
		} else {
			memset(&r, 0, sizeof(r));
			r.bytes.p = text;
			r.bytes.len = (uint32_t)len;
			r.has_bytes = true;
			k3_conn_send(c, K3_MSG_DETOKENIZE_REPLY, h->request_id, &r);
		}
		free(text);
		free(ids);
		return rc;
	}
	case K3_MSG_MODEL_INFO: {
		const struct k3_model_config *mc = k3_model_config(s->model);
		struct k3_msg_model_info_reply r;

		memset(&r, 0, sizeof(r));
		r.id = k3_proto_str_of(s->model_id); r.has_id = true;
		r.path = k3_proto_str_of(s->opts->model_dir); r.has_path = true;
		r.provider = k3_proto_str_of("cpu"); r.has_provider = true;
		r.context_length = (uint32_t)(mc->max_position_embeddings > UINT32_MAX ? UINT32_MAX :
					      mc->max_position_embeddings);
		r.has_context_length = true;
		r.vocab_size = k3_engine_vocab(s->engine); r.has_vocab_size = true;
		r.n_layers = mc->num_hidden_layers; r.has_n_layers = true;
		r.hidden_size = mc->hidden_size; r.has_hidden_size = true;
		r.n_experts = mc->num_experts; r.has_n_experts = true;
		r.experts_per_token = mc->num_experts_per_token; r.has_experts_per_token = true;
		k3_conn_send(c, K3_MSG_MODEL_INFO_REPLY, h->request_id, &r);
		return 0;
	}
	default:
		return -EINVAL;
	}
}

/* The peer is gone: its queued jobs go now, its running job stops at the
 * next layer. The running job keeps its connection reference until it
 * finishes; frames for a closed connection are dropped. */
static void hook_conn_closed(void *ctx, struct k3_conn *c)
{
	cancel_where(ctx, c, false, 0, 0);
}

static void hook_status(void *ctx, struct k3_server_info *info, struct k3_msg_status_reply *r)
{
	struct k3_sched *s = ctx;

	pthread_mutex_lock(&s->lock);
	info->running = s->running ? 1 : 0;
	info->queued = s->n_queued;
	pthread_mutex_unlock(&s->lock);
	r->requests_total = s->totals.requests_total; r->has_requests_total = true;
	r->prompt_tokens_total = s->totals.prompt_tokens_total; r->has_prompt_tokens_total = true;
	r->completion_tokens_total = s->totals.completion_tokens_total;
	r->has_completion_tokens_total = true;
	r->reasoning_tokens_total = s->totals.reasoning_tokens_total;
	r->has_reasoning_tokens_total = true;
	r->positions_total = s->totals.positions_total; r->has_positions_total = true;
	r->prefill_s_total = s->totals.prefill_s_total; r->has_prefill_s_total = true;
	r->decode_s_total = s->totals.decode_s_total; r->has_decode_s_total = true;
	/* honest split of the engine's time (DONE io_wait_s / compute_s, summed) */
	r->io_wait_s_total = s->totals.io_wait_s_total; r->has_io_wait_s_total = true;
	r->compute_s_total = s->totals.compute_s_total; r->has_compute_s_total = true;
	/* s->store is set before MSG_LOADED and never changes; its stats are
	 * mutex-protected and monotonic since start. */
	if (s->ready && s->store) {
		struct k3_store_stats st;
		struct k3_store_info in;
		k3_store_stats_get(s->store, &st);
		k3_store_info_get(s->store, &in);
		r->expert_bytes_read = st.bytes_read; r->has_expert_bytes_read = true;
		r->expert_hits = st.demand_hits; r->has_expert_hits = true;
		r->expert_misses = st.demand_misses; r->has_expert_misses = true;
		r->prefetch_issued = st.prefetch_issued; r->has_prefetch_issued = true;
		r->prefetch_issued_bytes = st.prefetch_issued_bytes; r->has_prefetch_issued_bytes = true;
		r->prefetch_used = st.prefetch_used; r->has_prefetch_used = true;
		r->prefetch_wasted_bytes = st.prefetch_wasted_bytes; r->has_prefetch_wasted_bytes = true;
		r->expert_cache_bytes = (uint64_t)in.n_slots * in.slot_bytes;
		r->has_expert_cache_bytes = true;
	}
}

static unsigned hook_drain(void *ctx)
{
	struct k3_sched *s = ctx;
	struct job *gone;
	unsigned running;

	s->draining = true;
	pthread_mutex_lock(&s->lock);
	gone = s->queue_head;
	s->queue_head = s->queue_tail = NULL;
	s->n_queued = 0;
	running = s->running ? 1 : 0;
	pthread_mutex_unlock(&s->lock);
	while (gone) {
		struct job *j = gone;

		gone = j->next;
		if (k3_conn_is_open(j->conn))
			k3_conn_send_error(j->conn, j->rid, K3_STATUS_SHUTTING_DOWN, NULL,
					   "k3d is shutting down");
		job_free(j);
	}
	return running;
}

static void hook_cancel_running(void *ctx)
{
	struct k3_sched *s = ctx;

	pthread_mutex_lock(&s->lock);
	if (s->running) {
		atomic_store(&s->running->cancel_reason, K3_CANCEL_SHUTDOWN);
		atomic_store(&s->running->cancel, true);
	}
	pthread_mutex_unlock(&s->lock);
}

struct k3_server_hooks k3_sched_hooks(struct k3_sched *s)
{
	struct k3_server_hooks h = { s, hook_request, hook_conn_closed, hook_status, hook_drain,
				     hook_cancel_running };

	return h;
}

int k3_sched_new(struct event_base *base, struct k3_server *srv, const struct k3_options *opts,
		 void (*on_ready)(void *ctx, bool ok, const char *message), void *ctx,
		 struct k3_sched **out, struct k3_err *err)
{
	struct k3_sched *s = calloc(1, sizeof(*s));
	int r;

	if (!s)
		return k3_err_set(err, -ENOMEM, "out of memory");
	s->base = base;
	s->srv = srv;
	s->opts = opts;
	s->on_ready = on_ready;
	s->ready_ctx = ctx;
	pthread_mutex_init(&s->lock, NULL);
	pthread_cond_init(&s->cond, NULL);
	pthread_cond_init(&s->prep_cond, NULL);
	s->wake = event_new(base, -1, EV_READ, wake_cb, s);
	if (!s->wake) {
		k3_sched_free(s);
		return k3_err_set(err, -ENOMEM, "cannot create the engine wake-up event");
	}
	r = pthread_create(&s->thread, NULL, engine_main, s);
	if (r != 0) {
		k3_sched_free(s);
		return k3_err_set(err, -r, "cannot start the engine thread: %s", strerror(r));
	}
	s->thread_started = true;
	r = pthread_create(&s->prep_thread, NULL, prep_main, s);
	if (r != 0) {
		k3_sched_free(s);
		return k3_err_set(err, -r, "cannot start the prep thread: %s", strerror(r));
	}
	s->prep_started = true;
	*out = s;
	return 0;
}

struct k3_sched *k3_sched_free(struct k3_sched *s)
{
	struct sched_msg *m, *next;

	if (!s)
		return NULL;
	pthread_mutex_lock(&s->lock);
	s->stopping = true;
	if (s->running)
		atomic_store(&s->running->cancel, true);
	pthread_cond_broadcast(&s->cond);
	pthread_cond_broadcast(&s->prep_cond);
	pthread_mutex_unlock(&s->lock);
	if (s->thread_started)
		pthread_join(s->thread, NULL);
	if (s->prep_started)
		pthread_join(s->prep_thread, NULL);
	while (s->prep_head) {
		struct prep_task *t = s->prep_head;

		s->prep_head = t->next;
		prep_task_free(t);
	}
	for (m = s->msgs; m; m = next) {
		next = m->next;
		if (m->kind == MSG_FINISHED)
			job_free(m->job);
		if (m->kind == MSG_PREPARED)
			prep_task_free(m->task);
		free(m->bytes);
		free(m);
	}
	while (s->queue_head) {
		struct job *j = s->queue_head;

		s->queue_head = j->next;
		job_free(j);
	}
	conv_state_release(&s->pub[0]);
	conv_state_release(&s->pub[1]);
	k3_engine_free(s->engine);
	if (s->store)
		k3_store_engine_src_release(&s->xctx);
	k3_store_free(s->store);
	k3_store_source_free(s->xsrc);
	k3_store_trace_close(s->trace, NULL);
	free(s->route_ids);
	free(s->route_w);
	k3_tok_free(s->tok);
	k3_model_free(s->model);
	if (s->wake)
		event_free(s->wake);
	pthread_mutex_destroy(&s->lock);
	pthread_cond_destroy(&s->cond);
	pthread_cond_destroy(&s->prep_cond);
	free(s);
	return NULL;
}

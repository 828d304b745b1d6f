/*
 * sched.c - the scheduler's core (see sched.h; the other files are listed
 * in sched_internal.h): the engine thread's loop over the job queue, the
 * engine -> loop inbox, what happens to a job after it ran (totals, and
 * publishing its state once its DONE reached the kernel), CANCEL, and the
 * hooks through which server*.c hands over requests, STATUS and the drain.
 *
 * Ownership. A job is created and freed on the loop thread. The engine
 * thread reads its inputs and writes its results (finish reason, counters,
 * the state branch) before posting MSG_FINISHED, after which it never
 * touches the job again. Frames travel engine -> loop as encoded bytes in
 * struct sched_msg; the loop writes them if the job's connection is still
 * open. Cancellation is one atomic flag per job, polled by the engine
 * thread between prefill chunks and decode steps.
 *
 * With --parallel 1 the engine thread runs one job at a time
 * (s->running[0]); with N > 1 it keeps up to N generations in seats and
 * advances them together, one batched pass at a time (sched_seats.c).
 */
#include "server/sched_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "base/log.h"
#include "model/model.h"
#include "store/store_model.h"
#include "store/store_trace.h"

/* ---- small shared pieces -------------------------------------------------- */

void sched_conv_release(struct sched_conv *c)
{
	k3_engine_seq_free(c->seq);
	c->seq = NULL;
	k3_tok_ids_release(&c->ids);
}

double sched_since(const struct timespec *t0)
{
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	return (double)(now.tv_sec - t0->tv_sec) + (double)(now.tv_nsec - t0->tv_nsec) * 1e-9;
}

struct sched_job *sched_job_new(struct k3_sched *s, enum k3_proto_job_kind kind, uint32_t rid)
{
	struct sched_job *j = calloc(1, sizeof(*j));

	if (!j)
		return NULL;
	j->s = s;
	j->kind = kind;
	j->rid = rid;
	k3_tok_ids_init(&j->prompt);
	return j;
}

void sched_job_free(struct sched_job *j)
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
	sched_conv_release(&j->branch[0]);
	sched_conv_release(&j->branch[1]);
	free(j);
}

/* Job ids are sequential, so without this any group member could stop
 * (or list) everyone's work. */
bool sched_job_visible(const struct k3_conn *c, const struct sched_job *j)
{
	return k3_conn_is_admin(c) || (j->conn && k3_conn_uid(j->conn) == k3_conn_uid(c));
}

/* ---- messages engine/prep -> loop -------------------------------------------- */

void sched_post_locked(struct k3_sched *s, struct sched_msg *m)
{
	sched_fifo_push(&s->inbox, &m->link);
	event_active(s->wake, EV_READ, 0);
}

void sched_post(struct k3_sched *s, struct sched_msg *m)
{
	pthread_mutex_lock(&s->lock);
	sched_post_locked(s, m);
	pthread_mutex_unlock(&s->lock);
}

struct sched_msg *sched_encode_frame(struct sched_job *j, uint32_t type, const void *body)
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

void sched_post_frame(struct sched_job *j, uint32_t type, const void *body)
{
	struct sched_msg *m = sched_encode_frame(j, type, body);

	if (m)
		sched_post(j->s, m);
}

void sched_post_kind(struct k3_sched *s, enum sched_msg_kind kind, struct sched_job *j, bool ok,
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
	sched_post(s, m);
}

/* ---- the engine thread ----------------------------------------------------------- */

void sched_count_pass(struct k3_sched *s, unsigned width)
{
	atomic_fetch_add(&s->passes_total, 1);
	atomic_fetch_add(&s->pass_width_total, width);
	atomic_store(&s->pass_width_last, width);
}

void sched_job_leaves_locked(struct k3_sched *s, struct sched_job *j, struct sched_msg *fin)
{
	for (unsigned i = 0; i < s->n_running; i++)
		if (s->running[i] == j) {
			memmove(&s->running[i], &s->running[i + 1],
				(s->n_running - i - 1) * sizeof(s->running[0]));
			s->n_running--;
			break;
		}
	if (j->final)
		sched_post_locked(s, j->final);
	j->final = NULL;
	if (fin) {
		fin->kind = MSG_FINISHED;
		fin->job = j;
		sched_post_locked(s, fin);
	}
}

/* Loads the model, then runs queued jobs in FIFO order: one at a time, or
 * in seats (--parallel > 1). */
static void *engine_main(void *arg)
{
	struct k3_sched *s = arg;

	sched_load(s);
	pthread_mutex_lock(&s->lock);
	if (s->loaded && s->parallel > 1) {
		sched_seats_main(s);
		pthread_mutex_unlock(&s->lock);
		return NULL;
	}
	while (!s->stopping) {
		struct sched_job *j = s->loaded ? sched_entry(sched_fifo_pop(&s->queue),
							      struct sched_job, link) : NULL;

		if (!j) {
			pthread_cond_wait(&s->cond, &s->lock);
			continue;
		}
		s->running[0] = j;
		s->n_running = 1;
		pthread_mutex_unlock(&s->lock);
		sched_post_kind(s, MSG_STARTED, j, true, NULL);
		if (j->kind == K3_JOB_WARM_EXPERTS)
			sched_warm_run(s, j);
		else
			sched_job_run(s, j);
		/* The slot frees in the same step that queues the final frame, so
		 * a client that reacts to DONE at once never sees a stale BUSY. */
		struct sched_msg *fin = calloc(1, sizeof(*fin));
		pthread_mutex_lock(&s->lock);
		sched_job_leaves_locked(s, j, fin);
	}
	pthread_mutex_unlock(&s->lock);
	return NULL;
}

/* ---- a job after it ran (loop thread) ----------------------------------------------- */

/* DONE reached the kernel (or not): publish the branch, or drop it. */
static void job_flushed(void *arg, bool written)
{
	struct sched_job *j = arg;
	struct k3_sched *s = j->s;

	if (written && j->branch[1].seq) {
		pthread_mutex_lock(&s->lock);
		for (int k = 0; k < 2; k++) {
			sched_conv_release(&s->pub[k]);
			s->pub[k] = j->branch[k];
			memset(&j->branch[k], 0, sizeof(j->branch[k]));
		}
		pthread_mutex_unlock(&s->lock);
	}
	sched_job_free(j);
}

/* The client has not taken its DONE in time: drop the branch states now
 * rather than pin them until it reads or goes away; job_flushed then
 * finds nothing to publish. */
static void job_publish_late(evutil_socket_t fd, short what, void *arg)
{
	struct sched_job *j = arg;

	(void)fd; (void)what;
	k3_log_debug("job %llu: DONE unread after %d s; its state will not be published",
		     (unsigned long long)j->id, SCHED_PUBLISH_DEADLINE_S);
	sched_conv_release(&j->branch[0]);
	sched_conv_release(&j->branch[1]);
}

/* MSG_FINISHED: count a generation in the totals, and publish its branch
 * once its DONE is written (or free it now). */
static void job_finished(struct k3_sched *s, struct sched_job *j)
{
	if (j->kind == K3_JOB_WARM_EXPERTS) {
		sched_job_free(j);
		return;
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
	s->totals.spine_io_wait_s_total += j->spine_io_wait_s;
	s->totals.draft_proposed_total += j->draft.proposed;
	s->totals.draft_accepted_total += j->draft.accepted;
	s->totals.decode_passes_total += j->decode_passes;
	s->totals.draft_s_total += j->draft.draft_s;
	s->totals.verify_s_total += j->draft.verify_s;
	if (j->conn && j->done_sent) {
		struct timeval tv = { SCHED_PUBLISH_DEADLINE_S, 0 };

		/* Armed first: a synchronous job_flushed frees it with j. */
		j->publish_timer = evtimer_new(s->base, job_publish_late, j);
		if (j->publish_timer)
			evtimer_add(j->publish_timer, &tv);
		if (k3_conn_when_flushed(j->conn, job_flushed, j) == 0)
			return;
	}
	sched_job_free(j);
}

/* The loop's side of the inbox: writes frames, and acts on what the
 * engine and prep threads report. */
static void wake_cb(evutil_socket_t fd, short what, void *arg)
{
	struct k3_sched *s = arg;
	struct sched_fifo batch = { NULL, NULL, 0 };
	struct sched_msg *m;

	(void)fd; (void)what;
	pthread_mutex_lock(&s->lock);
	sched_fifo_move_if(&s->inbox, &batch, NULL, NULL);
	pthread_mutex_unlock(&s->lock);
	while ((m = sched_entry(sched_fifo_pop(&batch), struct sched_msg, link))) {
		struct sched_job *j = m->job;

		switch (m->kind) {
		case MSG_FRAME:
			if (j->conn && k3_conn_send_raw(j->conn, m->bytes, m->len) < 0)
				atomic_store(&j->cancel, true);   /* nobody is listening */
			break;
		case MSG_STARTED:
			sched_send_positions(s);
			break;
		case MSG_FINISHED:
			job_finished(s, j);
			break;
		case MSG_PREPARED:
			sched_prep_done(s, m->task);
			break;
		case MSG_LOADED:
			if (m->ok)
				k3_log_notice("model '%s' loaded (%u layers, vocab %u)%s", s->model_id,
					      k3_model_config(s->model)->num_hidden_layers,
					      k3_engine_vocab(s->engine),
					      s->spine_kind == K3_SPINE_INT8 ? ": " K3_PROTO_SPINE_INT8_LABEL : "");
			s->ready = m->ok;
			s->on_ready(s->ready_ctx, m->ok, m->ok ? s->model_id : m->text);
			break;
		}
		if (m->kind == MSG_FINISHED && s->draining) {
			pthread_mutex_lock(&s->lock);
			bool idle = !s->n_running;
			pthread_mutex_unlock(&s->lock);
			if (idle)
				k3_server_drain_done(s->srv);
		}
		free(m->bytes);
		free(m);
	}
}

/* ---- CANCEL ---------------------------------------------------------------------------- */

struct cancel_match {
	const struct k3_conn *c;
	bool by_rid;
	uint32_t rid;
	uint64_t job_id;               /* 0: match by connection (and rid) */
};

static bool cancel_matches(const struct cancel_match *cm, const struct sched_job *j)
{
	if (cm->job_id)
		return j->id == cm->job_id && sched_job_visible(cm->c, j);
	return j->conn == cm->c && (!cm->by_rid || j->rid == cm->rid);
}

static bool cancel_matches_link(const struct sched_link *l, const void *ctx)
{
	return cancel_matches(ctx, sched_entry(l, const struct sched_job, link));
}

/* Marks matching jobs cancelled; queued ones are removed and answered at
 * once, the running one stops at its next step. Returns how many matched. */
static unsigned cancel_where(struct k3_sched *s, const struct k3_conn *c, bool by_rid, uint32_t rid,
			     uint64_t job_id)
{
	const struct cancel_match cm = { c, by_rid, rid, job_id };
	struct sched_fifo gone = { NULL, NULL, 0 };
	struct sched_job *j;
	unsigned n;

	pthread_mutex_lock(&s->lock);
	sched_fifo_move_if(&s->queue, &gone, cancel_matches_link, &cm);
	n = gone.n;
	for (unsigned i = 0; i < s->n_running; i++) {
		j = s->running[i];
		if (!cancel_matches(&cm, j))
			continue;
		atomic_store(&j->cancel_reason, j->conn == c ? K3_CANCEL_CLIENT : K3_CANCEL_BY_ID);
		atomic_store(&j->cancel, true);
		n++;
	}
	pthread_mutex_unlock(&s->lock);
	/* Still being prepared: answered DONE{cancelled} when it comes back
	 * (it has no job id yet, so only its own connection can name it). */
	if (!job_id)
		n += sched_prep_cancel(s, c, by_rid, rid);
	while ((j = sched_entry(sched_fifo_pop(&gone), struct sched_job, link))) {
		struct k3_msg_done d;

		memset(&d, 0, sizeof(d));
		k3_msg_done_set_finish(&d, K3_FINISH_CANCELLED);
		k3_msg_done_set_cancel_reason(&d, j->conn == c ? K3_CANCEL_CLIENT : K3_CANCEL_BY_ID);
		k3_msg_done_set_prompt_tokens(&d, (uint32_t)j->prompt.n);
		k3_msg_done_set_completion_tokens(&d, 0);
		k3_msg_done_set_queued_s(&d, sched_since(&j->t_submit));
		sched_done_spine(s, &d);
		if (j->kind == K3_JOB_WARM_EXPERTS && k3_conn_is_open(j->conn))
			k3_conn_send_error(j->conn, j->rid, K3_STATUS_CANCELLED, NULL,
					   "expert preload cancelled before it started");
		else if (k3_conn_is_open(j->conn))
			k3_conn_send(j->conn, K3_MSG_DONE, j->rid, &d);
		sched_job_free(j);
	}
	sched_send_positions(s);
	return n;
}

/* ---- requests that need no job --------------------------------------------------------- */

static int detokenize(struct k3_sched *s, struct k3_conn *c, uint32_t rid,
		      const struct k3_msg_detokenize *m)
{
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
		k3_conn_send_error(c, rid, K3_STATUS_INVALID_ARGUMENT, "ids", "%s",
				   err.msg[0] ? err.msg : "out of memory");
	} else {
		memset(&r, 0, sizeof(r));
		k3_msg_detokenize_reply_set_bytes(&r, (struct k3_proto_str){ text, (uint32_t)len });
		k3_conn_send(c, K3_MSG_DETOKENIZE_REPLY, rid, &r);
	}
	free(text);
	free(ids);
	return rc;
}

static void model_info(struct k3_sched *s, struct k3_conn *c, uint32_t rid)
{
	const struct k3_model_config *mc = k3_model_config(s->model);
	struct k3_msg_model_info_reply r;

	memset(&r, 0, sizeof(r));
	k3_msg_model_info_reply_set_id(&r, k3_proto_str_of(s->model_id));
	k3_msg_model_info_reply_set_path(&r, k3_proto_str_of(s->opts->model_dir));
	k3_prov_model *pm;
	k3_msg_model_info_reply_set_provider(&r, k3_proto_str_of(k3_engine_provider(s->engine, &pm)->name));
	uint64_t ctx = sched_context_tokens(s);
	k3_msg_model_info_reply_set_context_length(&r, (uint32_t)(ctx > UINT32_MAX ? UINT32_MAX : ctx));
	k3_msg_model_info_reply_set_vocab_size(&r, k3_engine_vocab(s->engine));
	k3_msg_model_info_reply_set_n_layers(&r, mc->num_hidden_layers);
	k3_msg_model_info_reply_set_hidden_size(&r, mc->hidden_size);
	k3_msg_model_info_reply_set_n_experts(&r, mc->num_experts);
	k3_msg_model_info_reply_set_experts_per_token(&r, mc->num_experts_per_token);
	k3_msg_model_info_reply_set_spine(&r, s->spine_kind);
	if (s->spine_kind == K3_SPINE_INT8)
		k3_msg_model_info_reply_set_spine_label(&r, k3_proto_str_of(K3_PROTO_SPINE_INT8_LABEL));
	k3_conn_send(c, K3_MSG_MODEL_INFO_REPLY, rid, &r);
}

/* ---- hooks into server*.c ---------------------------------------------------------------- */

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
		sched_prep_generate(s, c, h->request_id, &body->generate);
		return 0;
	case K3_MSG_WARM_EXPERTS:
		sched_warm_request(s, c, h->request_id, &body->warm_experts);
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
		sched_prep_tokenize(s, c, h->request_id, &body->tokenize);
		return 0;
	case K3_MSG_DETOKENIZE:
		return detokenize(s, c, h->request_id, &body->detokenize);
	case K3_MSG_MODEL_INFO:
		model_info(s, c, h->request_id);
		return 0;
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

/* Appends job j in state to the STATUS job list if peer c may see it. */
static void status_job(struct sched_status_jobs *t, const struct k3_conn *c,
		       const struct sched_job *j, enum k3_proto_job_state state)
{
	uint32_t i = t->n;

	if (i == K3_LIM_STATUS_JOBS || !j->conn || !sched_job_visible(c, j))
		return;
	t->ids[i] = j->id;
	t->states[i] = state;
	t->kinds[i] = j->kind;
	t->uids[i] = (uint32_t)k3_conn_uid(j->conn);
	t->pids[i] = (uint32_t)k3_conn_pid(j->conn);
	t->ages_ms[i] = (uint64_t)(sched_since(&j->t_submit) * 1e3);
	t->n = i + 1;
}

/* STATUS_REPLY's job list for peer c (the running job, then the queue in
 * order), in s->status_jobs, which r points into. */
static void status_jobs(struct k3_sched *s, const struct k3_conn *c, struct k3_msg_status_reply *r)
{
	struct sched_status_jobs *t = &s->status_jobs;

	t->n = 0;
	pthread_mutex_lock(&s->lock);
	for (unsigned i = 0; i < s->n_running; i++)
		status_job(t, c, s->running[i], K3_JOB_RUNNING);
	for (const struct sched_link *l = s->queue.head; l; l = l->next)
		status_job(t, c, sched_entry(l, const struct sched_job, link), K3_JOB_QUEUED);
	pthread_mutex_unlock(&s->lock);
	k3_msg_status_reply_set_job_ids(r, (struct k3_proto_u64s){ .n = t->n, .v = t->ids });
	k3_msg_status_reply_set_job_states(r, (struct k3_proto_ids){ .n = t->n, .v = t->states });
	k3_msg_status_reply_set_job_kinds(r, (struct k3_proto_ids){ .n = t->n, .v = t->kinds });
	k3_msg_status_reply_set_job_uids(r, (struct k3_proto_ids){ .n = t->n, .v = t->uids });
	k3_msg_status_reply_set_job_pids(r, (struct k3_proto_ids){ .n = t->n, .v = t->pids });
	k3_msg_status_reply_set_job_ages_ms(r, (struct k3_proto_u64s){ .n = t->n, .v = t->ages_ms });
}

static void hook_status(void *ctx, const struct k3_conn *c, struct k3_server_info *info,
			struct k3_msg_status_reply *r)
{
	struct k3_sched *s = ctx;

	pthread_mutex_lock(&s->lock);
	info->running = s->n_running;
	info->queued = s->queue.n;
	pthread_mutex_unlock(&s->lock);
	/* Only a peer that said it decodes the list gets it (docs/protocol.md). */
	if (k3_conn_caps(c) & K3_PROTO_CAP_JOBS)
		status_jobs(s, c, r);
	/* The totals of finished jobs, io_wait_s / compute_s being the honest
	 * split of the engine's time and the draft ones speculative decoding's
	 * (docs/draft.md). */
#define SCHED_TOTALS_(X) \
	X(requests_total) X(prompt_tokens_total) X(completion_tokens_total) \
	X(reasoning_tokens_total) X(positions_total) X(prefill_s_total) X(decode_s_total) \
	X(io_wait_s_total) X(compute_s_total) X(draft_proposed_total) X(draft_accepted_total) \
	X(decode_passes_total) X(draft_s_total) X(verify_s_total)
#define SET_TOTAL_(f) k3_msg_status_reply_set_##f(r, s->totals.f);
	SCHED_TOTALS_(SET_TOTAL_)
#undef SET_TOTAL_
#undef SCHED_TOTALS_
	if (s->ready) {
		k3_msg_status_reply_set_spine(r, s->spine_kind);
		if (s->spine_kind == K3_SPINE_INT8)
			k3_msg_status_reply_set_spine_label(r, k3_proto_str_of(K3_PROTO_SPINE_INT8_LABEL));
	}
	/* several sequences in one pass (docs/scheduler.md) */
	if (s->ready) {
		uint64_t passes = atomic_load(&s->passes_total);
		k3_msg_status_reply_set_parallel(r, s->parallel);
		k3_msg_status_reply_set_pass_width(r, atomic_load(&s->pass_width_last));
		k3_msg_status_reply_set_pass_width_mean(r, passes ? (double)atomic_load(&s->pass_width_total) /
								(double)passes : 0);
		k3_msg_status_reply_set_passes_total(r, passes);
	}
	/* s->store is set before MSG_LOADED and never changes; its stats are
	 * mutex-protected and monotonic since start. */
	if (s->ready && s->store) {
		struct k3_store_stats st;
		struct k3_store_info in;
		k3_store_stats_get(s->store, &st);
		k3_store_info_get(s->store, &in);
		k3_msg_status_reply_set_expert_bytes_read(r, st.bytes_read);
		k3_msg_status_reply_set_expert_hits(r, st.demand_hits);
		k3_msg_status_reply_set_expert_misses(r, st.demand_misses);
		k3_msg_status_reply_set_prefetch_issued(r, st.prefetch_issued);
		k3_msg_status_reply_set_prefetch_issued_bytes(r, st.prefetch_issued_bytes);
		k3_msg_status_reply_set_prefetch_used(r, st.prefetch_used);
		k3_msg_status_reply_set_prefetch_wasted_bytes(r, st.prefetch_wasted_bytes);
		k3_msg_status_reply_set_expert_cache_bytes(r, (uint64_t)in.n_slots * in.slot_bytes);
	}
	/* s->spine likewise; its counters are under the reader pool's lock. */
	if (s->ready && s->spine) {
		struct k3_store_spine_stats st;
		struct k3_store_spine_info in;
		k3_store_spine_stats_get(s->spine, &st);
		k3_store_spine_info_get(s->spine, &in);
		r->spine_bytes_read = st.bytes_read; r->has_spine_bytes_read = true;
		r->spine_loads = st.loads; r->has_spine_loads = true;
		r->spine_memory_bytes = in.memory_bytes; r->has_spine_memory_bytes = true;
		r->spine_io_wait_s_total = s->totals.spine_io_wait_s_total;
		r->has_spine_io_wait_s_total = true;
	}
	if (s->ready)
		sched_status_drives(s, r);
	sched_status_memory(s, r);
	if (s->ready && s->remote) {
		/* a streaming install says how far its experts have come */
		char d[200];
		k3_setup_remote_describe(s->remote, d, sizeof(d));
		snprintf(s->stream_text, sizeof(s->stream_text), "%s; %s",
			 info->status_text ? info->status_text : "ready", d);
		info->status_text = s->stream_text;
	}
}

static unsigned hook_drain(void *ctx)
{
	struct k3_sched *s = ctx;
	struct sched_fifo gone = { NULL, NULL, 0 };
	struct sched_job *j;
	unsigned running;

	s->draining = true;
	pthread_mutex_lock(&s->lock);
	sched_fifo_move_if(&s->queue, &gone, NULL, NULL);
	running = s->n_running;
	pthread_mutex_unlock(&s->lock);
	while ((j = sched_entry(sched_fifo_pop(&gone), struct sched_job, link))) {
		if (k3_conn_is_open(j->conn))
			k3_conn_send_error(j->conn, j->rid, K3_STATUS_SHUTTING_DOWN, NULL,
					   "k3d is shutting down");
		sched_job_free(j);
	}
	return running;
}

static void hook_cancel_running(void *ctx)
{
	struct k3_sched *s = ctx;

	pthread_mutex_lock(&s->lock);
	for (unsigned i = 0; i < s->n_running; i++) {
		atomic_store(&s->running[i]->cancel_reason, K3_CANCEL_SHUTDOWN);
		atomic_store(&s->running[i]->cancel, true);
	}
	pthread_mutex_unlock(&s->lock);
}

struct k3_server_hooks k3_sched_hooks(struct k3_sched *s)
{
	struct k3_server_hooks h = { s, hook_request, hook_conn_closed, hook_status, hook_drain,
				     hook_cancel_running };

	return h;
}

/* ---- lifecycle ---------------------------------------------------------------------------- */

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
	r = pthread_create(&s->prep_thread, NULL, sched_prep_main, s);
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
	struct sched_msg *m;
	struct sched_prep *t;
	struct sched_job *j;

	if (!s)
		return NULL;
	pthread_mutex_lock(&s->lock);
	s->stopping = true;
	for (unsigned i = 0; i < s->n_running; i++)
		atomic_store(&s->running[i]->cancel, true);
	pthread_cond_broadcast(&s->cond);
	pthread_cond_broadcast(&s->prep_cond);
	pthread_mutex_unlock(&s->lock);
	if (s->thread_started)
		pthread_join(s->thread, NULL);
	if (s->prep_started)
		pthread_join(s->prep_thread, NULL);
	while ((t = sched_entry(sched_fifo_pop(&s->prep_queue), struct sched_prep, link)))
		sched_prep_free(t);
	while ((m = sched_entry(sched_fifo_pop(&s->inbox), struct sched_msg, link))) {
		if (m->kind == MSG_FINISHED)
			sched_job_free(m->job);
		if (m->kind == MSG_PREPARED)
			sched_prep_free(m->task);
		free(m->bytes);
		free(m);
	}
	while ((j = sched_entry(sched_fifo_pop(&s->queue), struct sched_job, link)))
		sched_job_free(j);
	sched_conv_release(&s->pub[0]);
	sched_conv_release(&s->pub[1]);
	k3_draft_free(s->draft_ngram);
	k3_draft_free(s->draft_dspark);
	k3_engine_free(s->engine);
	if (s->store)
		k3_store_engine_src_release(&s->xctx);
	k3_store_spine_free(s->spine);   /* before the pool it borrows */
	k3_store_free(s->store);
	k3_setup_remote_close(s->remote);   /* after the readers that call it */
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

/*
 * sched_seats.c - several generations in one pass (issue 21,
 * docs/scheduler.md "Several sequences in one pass"): with --parallel N >
 * 1 the engine thread keeps up to N generations in seats and advances
 * them together.
 *
 * Between passes: seats whose job finished or was cancelled end
 * (sched_seq_end: DONE, accounting, the branch to publish, each as it
 * finishes), then queued jobs take the free seats in FIFO order
 * (sched_seq_prepare), except that one uid holds at most max(1, N - 1)
 * seats while a job of another uid waits. An expert preload (WARM_EXPERTS)
 * at the head of the queue waits for every seat to empty and runs alone.
 *
 * A pass: one decode position of every decoding seat plus at most one
 * prefill chunk (of the seat still prefilling that was served longest
 * ago, so prompts take turns; at most its planned chunk and what the
 * pass has left after the decode rows), in ONE
 * k3_engine_forward_batch: one spine sweep, each routed expert read once
 * for the union of the positions, every sequence's logits bit-identical to
 * its solo run. A seat alone runs exactly --parallel 1's steps (drafting,
 * per-layer cancel); in a shared pass drafting is off for that pass, and
 * a draft that needs target rows (DSpark) is switched off for the job once
 * another seat joins it, because shared passes do not capture them.
 *
 * Cancellation: with several seats the engine's per-layer flag is off (a
 * job's flag must not poison the others' sequences); each job's flag is
 * polled at every pass boundary. Counters: the expert store's and the
 * spine loader's counters are taken per pass and split among its seats by
 * positions (the remainder to the last part), so the DONEs of jobs that
 * shared passes add up to what the store did; the last seat to end
 * settles the store (drain, idle) and takes what that adds.
 */
#include "server/sched_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"

struct seats {
	struct sched_seq *q[SCHED_MAX_SEATS];    /* in the order they started */
	unsigned n;
	struct k3_store_stats x_last;            /* counters at the last charge */
	struct k3_store_spine_stats s_last;
	uint64_t turn;                           /* prefill turns handed out */
};

/* ---- counters --------------------------------------------------------------- */

/* All-uint64 structs (store.h, store_spine.h contracts) viewed as arrays. */
enum {
	XN = sizeof(struct k3_store_stats) / sizeof(uint64_t),
	SN = sizeof(struct k3_store_spine_stats) / sizeof(uint64_t),
};
_Static_assert(sizeof(struct k3_store_stats) % sizeof(uint64_t) == 0, "store stats are uint64");
_Static_assert(sizeof(struct k3_store_spine_stats) % sizeof(uint64_t) == 0, "spine stats are uint64");

static void snap(struct k3_sched *s, struct seats *t)
{
	if (s->store)
		k3_store_stats_get(s->store, &t->x_last);
	if (s->spine)
		k3_store_spine_stats_get(s->spine, &t->s_last);
}

/* Adds the counters since the last charge to qs[0..n), in shares of
 * w[i] / sum(w) (floor; the remainder to the last), so the shares add up
 * to the difference exactly. */
static void charge(struct k3_sched *s, struct seats *t, struct sched_seq *const *qs,
		   const uint32_t *w, unsigned n)
{
	struct k3_store_stats xn, xd;
	struct k3_store_spine_stats sn, sd;
	uint64_t W = 0;

	memset(&xd, 0, sizeof(xd));
	memset(&sd, 0, sizeof(sd));
	if (s->store) {
		k3_store_stats_get(s->store, &xn);
		k3_store_stats_sub(&xn, &t->x_last, &xd);
		t->x_last = xn;
	}
	if (s->spine) {
		k3_store_spine_stats_get(s->spine, &sn);
		k3_store_spine_stats_sub(&sn, &t->s_last, &sd);
		t->s_last = sn;
	}
	for (unsigned i = 0; i < n; i++)
		W += w[i];
	const uint64_t *dx = (const uint64_t *)&xd, *ds = (const uint64_t *)&sd;
	for (size_t f = 0; f < XN + SN; f++) {
		uint64_t total = f < XN ? dx[f] : ds[f - XN], given = 0;

		for (unsigned i = 0; i < n; i++) {
			uint64_t *acc = f < XN ? (uint64_t *)&qs[i]->xacc + f : (uint64_t *)&qs[i]->sacc + (f - XN);
			uint64_t part = i + 1 == n ? total - given
				      : total <= UINT64_MAX / (w[i] ? w[i] : 1) ? total * w[i] / W
				      : total / W * w[i];
			*acc += part;
			given += part;
		}
	}
}

/* ---- seats ---------------------------------------------------------------- */

/* The next queued job that may take a free seat (under s->lock), removed
 * from the queue: FIFO, skipping the jobs of a uid that holds its share
 * while a job of another uid waits. An expert preload only from the head,
 * and only when no seat is taken. NULL: none now. */
static struct sched_job *pick(struct k3_sched *s)
{
	const unsigned share = s->parallel > 1 ? s->parallel - 1 : 1;
	struct sched_link *head = s->queue.head;

	if (!head)
		return NULL;
	struct sched_job *h = sched_entry(head, struct sched_job, link);
	if (h->kind == K3_JOB_WARM_EXPERTS) {
		if (s->n_running)
			return NULL;
		sched_fifo_remove(&s->queue, head);
		return h;
	}
	for (struct sched_link *l = head; l; l = l->next) {
		struct sched_job *j = sched_entry(l, struct sched_job, link);
		unsigned held = 0;
		bool other = false;

		if (j->kind == K3_JOB_WARM_EXPERTS)
			break;   /* nothing passes a preload */
		for (unsigned i = 0; i < s->n_running; i++)
			held += s->running[i]->uid == j->uid;
		for (const struct sched_link *o = head; o && !other && held >= share; o = o->next)
			other = sched_entry(o, const struct sched_job, link)->uid != j->uid;
		if (held >= share && other)
			continue;
		sched_fifo_remove(&s->queue, l);
		return j;
	}
	return NULL;
}

/* A job left the engine: its final frame and MSG_FINISHED, and its seat
 * freed in the same step (under s->lock, as engine_main does). */
static void job_leaves(struct k3_sched *s, struct sched_job *j)
{
	struct sched_msg *fin = calloc(1, sizeof(*fin));

	pthread_mutex_lock(&s->lock);
	sched_job_leaves_locked(s, j, fin);
	pthread_mutex_unlock(&s->lock);
}

/* Drafts that need the target's rows cannot follow shared passes: such a
 * seat decodes plainly from now on (its statistics so far are kept). */
static void untap(struct k3_sched *s, struct sched_seq *q)
{
	struct k3_draft_run_opts o = { .cost = &s->draft_cost };
	struct k3_draft_run *plain = NULL;
	struct k3_err e = { 0, "" };
	const struct k3_draft_stats *st;

	if (q->untapped || !q->run || q->job->draft_policy == K3_DRAFT_POLICY_OFF)
		return;
	if (!(q->job->draft_policy == K3_DRAFT_POLICY_DSPARK ||
	      (q->job->draft_policy == K3_DRAFT_POLICY_AUTO && s->draft_dspark)))
		return;
	if (k3_draft_run_new(s->engine, &o, &plain, &e) < 0) {
		k3_log_warning("job %llu: cannot switch its draft off: %s", (unsigned long long)q->job->id,
			       e.msg);
		return;
	}
	st = k3_draft_run_stats(q->run);
	sched_draft_stats_add(&q->job->draft, st);
	k3_draft_run_free(q->run);
	q->run = plain;
	q->untapped = true;
}

/* Takes job j into a seat (prepare, plan the prefill). A job that cannot
 * start ends at once. */
static void seat_open(struct k3_sched *s, struct seats *t, struct sched_job *j)
{
	struct sched_seq *q = calloc(1, sizeof(*q));
	int r;

	sched_post_kind(s, MSG_STARTED, j, true, NULL);
	if (!q) {
		struct k3_msg_error e;
		memset(&e, 0, sizeof(e));
		k3_msg_error_set_status(&e, K3_STATUS_INTERNAL);
		k3_msg_error_set_message(&e, k3_proto_str_of("out of memory"));
		j->finish = K3_FINISH_ERROR;
		j->final = sched_encode_frame(j, K3_MSG_ERROR, &e);
		job_leaves(s, j);
		return;
	}
	if (t->n == 0)
		snap(s, t);   /* nothing ran since the last settle */
	r = sched_seq_prepare(s, j, q);
	/* charged per pass from zero (charge), not as differences */
	q->split = true;
	q->prefill_turn = t->turn;
	memset(&q->xs0, 0, sizeof(q->xs0));
	memset(&q->ss0, 0, sizeof(q->ss0));
	if (r == 0) {
		sched_seq_prefill_begin(s, q);
		if (q->start == q->n_prompt)
			r = sched_seq_prefill_advanced(s, q, 0);
	}
	if (r < 0) {
		q->finished = true;
		q->end_r = r;
	}
	t->q[t->n++] = q;
}

/* Ends the seats that finished, in seat order; the last one to leave an
 * empty engine settles the store first and takes what that adds. */
static void seats_reap(struct k3_sched *s, struct seats *t)
{
	unsigned live = 0;

	for (unsigned i = 0; i < t->n; i++)
		live += !t->q[i]->finished;
	for (unsigned i = 0; i < t->n;) {
		struct sched_seq *q = t->q[i];

		if (!q->finished) {
			i++;
			continue;
		}
		if (live == 0 && i + 1 == t->n) {
			/* as seq_store_settle does for one job */
			if (s->spine)
				k3_store_spine_drain(s->spine);
			if (s->store) {
				k3_store_prefetch_cancel(s->store, UINT32_MAX);
				k3_store_drain(s->store);
				k3_store_idle(s->store);
			}
			uint32_t w = 1;
			charge(s, t, &q, &w, 1);
		}
		struct sched_job *j = q->job;
		sched_seq_end(s, q, q->end_r);
		free(q);
		memmove(&t->q[i], &t->q[i + 1], (t->n - i - 1) * sizeof(t->q[0]));
		t->n--;
		job_leaves(s, j);
	}
}

/* q's decoding ended with rc (0 ended, < 0 error). */
static void seat_decoded(struct sched_seq *q, int rc)
{
	q->decoding = false;
	q->finished = true;
	q->end_r = rc < 0 ? rc : sched_seq_decode_end(q);
}

/* A job told to stop between passes: DONE{cancelled}. */
static bool seat_cancelled(struct sched_seq *q)
{
	if (!atomic_load(&q->job->cancel))
		return false;
	q->job->finish = K3_FINISH_CANCELLED;
	q->decoding = false;
	q->finished = true;
	q->end_r = 0;
	return true;
}

/* After the prefill's last chunk: decoding starts (or ends at once for
 * max_new == 0). */
static void seat_prefilled(struct sched_seq *q)
{
	sched_seq_decode_begin(q);
	if (!q->decoding)
		seat_decoded(q, 0);
}

/* The step after a prefill chunk of c positions whose pass returned r:
 * the prompt advances, then the seat ends on an error or starts decoding
 * once its whole prompt is in. Both pass kinds take it. */
static void seat_prefill_done(struct k3_sched *s, struct sched_seq *q, uint32_t c, int r)
{
	if (r == 0)
		r = sched_seq_prefill_advanced(s, q, c);
	if (r < 0) {
		q->finished = true;
		q->end_r = r;
	} else if (q->prefilled) {
		seat_prefilled(q);
	}
}

/* One pass of a seat alone: exactly --parallel 1's steps. */
static void pass_alone(struct k3_sched *s, struct seats *t, struct sched_seq *q)
{
	struct sched_job *j = q->job;
	int r;

	k3_engine_set_cancel(s->engine, &j->cancel);
	if (!q->prefilled) {
		uint32_t left = q->n_prompt - q->prefill_end, c = left < q->chunk ? left : q->chunk;

		if (seat_cancelled(q))
			return;
		r = sched_seq_prefill_chunk(s, q, c);
		sched_count_pass(s, 1);
		j->passes++;
		j->pass_width_sum++;
		uint32_t w = 1;
		charge(s, t, &q, &w, 1);
		seat_prefill_done(s, q, c, r);
		return;
	}
	r = sched_seq_step(s, q);
	uint32_t w = 1;
	charge(s, t, &q, &w, 1);
	if (r <= 0)
		seat_decoded(q, r);
}

/* Appends the routes of a part (c positions from pos, at slice `off` of
 * the shared route buffers) to the router trace. */
static void trace_part(struct k3_sched *s, struct sched_job *j, uint32_t off, uint32_t pos, uint32_t c)
{
	size_t per = (size_t)k3_engine_n_moe(s->engine) * k3_engine_top_k(s->engine);

	if (!s->trace || !s->route_ids)
		return;
	memmove(s->route_ids, s->route_ids + off * per, c * per * sizeof(uint32_t));
	memmove(s->route_w, s->route_w + off * per, c * per * sizeof(float));
	sched_trace_routes(s, j, pos, c);
}

/* One shared pass over every live seat. */
static void pass_shared(struct k3_sched *s, struct seats *t)
{
	struct k3_engine_part parts[SCHED_MAX_SEATS];
	struct k3_engine_out outs[SCHED_MAX_SEATS];
	struct sched_seq *pq[SCHED_MAX_SEATS];
	uint32_t w[SCHED_MAX_SEATS], anchor[SCHED_MAX_SEATS], off[SCHED_MAX_SEATS];
	const uint32_t max = k3_engine_max_chunk(s->engine);
	size_t per = (size_t)k3_engine_n_moe(s->engine) * k3_engine_top_k(s->engine);
	unsigned np = 0, pre = SCHED_MAX_SEATS;
	uint32_t rows = 0;
	struct k3_err err = { 0, "" };
	int r;

	k3_engine_set_cancel(s->engine, NULL);
	for (unsigned i = 0; i < t->n; i++) {
		struct sched_seq *q = t->q[i];
		struct sched_job *j = q->job;

		if (q->finished || !q->prefilled || seat_cancelled(q))
			continue;
		/* as sched_seq_step: emit the anchor, then run it */
		if ((r = sched_seq_emit(q, q->anchor)) != 0) {
			seat_decoded(q, r < 0 ? r : 0);
			continue;
		}
		if ((r = k3_tok_ids_push(&j->branch[1].ids, q->anchor)) < 0) {
			seat_decoded(q, k3_err_set(&q->err, r, "out of memory"));
			continue;
		}
		anchor[np] = q->anchor;
		off[np] = rows;
		outs[np] = q->out_last;
		pq[np] = q;
		w[np] = 1;
		np++;
		rows++;
	}
	/* The prefill chunk goes to the prompt served longest ago (a seat that
	 * joins waits one turn at most): prompts take turns, so a short one
	 * beside a long one starts decoding after a chunk or two, not after
	 * the whole long prompt. Every waiting seat's cancel is seen here. */
	struct sched_seq *next = NULL;
	for (unsigned i = 0; i < t->n && rows < max; i++) {
		struct sched_seq *q = t->q[i];

		if (q->finished || q->prefilled || seat_cancelled(q))
			continue;
		if (!next || q->prefill_turn < next->prefill_turn)
			next = q;
	}
	if (next) {
		struct sched_seq *q = next;
		q->prefill_turn = ++t->turn;
		uint32_t left = q->n_prompt - q->prefill_end, c = left < q->chunk ? left : q->chunk;
		if (c > max - rows)
			c = max - rows;
		pre = np;
		off[np] = rows;
		outs[np] = q->prefill_end + c == q->n_prompt ? q->out_last : q->out_none;
		pq[np] = q;
		w[np] = c;
		np++;
		rows += c;
	}
	if (np == 0)
		return;
	for (unsigned i = 0; i < np; i++) {
		struct sched_seq *q = pq[i];

		if (outs[i].route_ids) {
			outs[i].route_ids = s->route_ids + off[i] * per;
			outs[i].route_weights = s->route_w + off[i] * per;
		}
		parts[i] = (struct k3_engine_part){
			.seq = q->seq,
			.ids = i == pre ? (const int32_t *)q->job->prompt.v + q->prefill_end
					: (const int32_t *)&anchor[i],
			.n = w[i], .out = &outs[i], .taps = NULL,
		};
	}
	r = k3_engine_forward_batch(s->engine, parts, np, &err);
	sched_count_pass(s, np);
	charge(s, t, pq, w, np);
	for (unsigned i = 0; i < np; i++) {
		struct sched_seq *q = pq[i];
		struct sched_job *j = q->job;

		j->passes++;
		j->pass_width_sum += np;
		j->shared_passes += np > 1;
		if (r < 0) {
			q->err = err;
			q->decoding = false;
			q->finished = true;
			q->end_r = r;
			continue;
		}
		if (i == pre) {
			trace_part(s, j, off[i], q->prefill_end, w[i]);
			/* the routes are traced: advance without tracing again */
			struct k3_store_trace *tr = s->trace;
			s->trace = NULL;
			seat_prefill_done(s, q, w[i], 0);
			s->trace = tr;
			continue;
		}
		j->decode_passes++;
		j->positions++;
		trace_part(s, j, off[i], q->n_prompt + j->n_gen - 1, 1);
		q->anchor = k3_engine_argmax(q->logits, k3_engine_vocab(s->engine));
	}
}

void sched_seats_main(struct k3_sched *s)
{
	struct seats t;

	memset(&t, 0, sizeof(t));
	k3_log_info("scheduler: %u seats (one pass advances every running generation)", s->parallel);
	while (!s->stopping || t.n) {
		struct sched_job *add[SCHED_MAX_SEATS], *warm = NULL;
		unsigned na = 0;

		while (!s->stopping && s->n_running < s->parallel) {
			struct sched_job *j = pick(s);

			if (!j)
				break;
			s->running[s->n_running++] = j;
			if (j->kind == K3_JOB_WARM_EXPERTS) {
				warm = j;
				break;
			}
			add[na++] = j;
		}
		if (!warm && !na && !t.n) {
			pthread_cond_wait(&s->cond, &s->lock);
			continue;
		}
		if (s->stopping)
			for (unsigned i = 0; i < s->n_running; i++)
				atomic_store(&s->running[i]->cancel, true);
		pthread_mutex_unlock(&s->lock);
		if (warm) {
			sched_post_kind(s, MSG_STARTED, warm, true, NULL);
			sched_warm_run(s, warm);
			job_leaves(s, warm);
			pthread_mutex_lock(&s->lock);
			continue;
		}
		for (unsigned i = 0; i < na; i++)
			seat_open(s, &t, add[i]);
		if (t.n > 1)
			for (unsigned i = 0; i < t.n; i++)
				untap(s, t.q[i]);
		unsigned live = 0;
		struct sched_seq *one = NULL;
		for (unsigned i = 0; i < t.n; i++)
			if (!t.q[i]->finished) {
				live++;
				one = t.q[i];
			}
		if (live == 1)
			pass_alone(s, &t, one);
		else if (live)
			pass_shared(s, &t);
		seats_reap(s, &t);
		pthread_mutex_lock(&s->lock);
	}
}

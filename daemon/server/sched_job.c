/*
 * sched_job.c - running one generation on the engine thread, in named
 * steps: prepare (output stage, logits, the sequence: a clone of the
 * published conversation when the prompt extends it), prefill (the prompt
 * in the fewest passes of at most s->prefill_chunk positions, PROGRESS
 * after each), the decode loop
 * (one pass per position: pick the id, stage it, compute the next
 * position), and the end (store accounting, DONE or ERROR, the branch
 * that may be published). Everything a running generation owns is in its
 * struct sched_seq; the job keeps only its inputs and results.
 *
 * Cancellation: the job's atomic flag is polled between prefill chunks
 * and decode steps, and the engine polls it between layers (then a
 * forward call returns -ECANCELED and the half-advanced branch is
 * dropped). Greedy only: the next id is the argmax of the logits.
 *
 * Several sequences in one pass (issue 21): with --parallel N > 1 the
 * seats (sched_seats.c) drive these same steps (sched_seq_*) one pass at a
 * time for up to N jobs; a job alone in its seats runs exactly the steps
 * below. sched_job_run is --parallel 1: one job from start to end.
 *
 * Draft, verify, commit (issue 18, docs/draft.md): seq_step() is the one
 * place that commits ids. Each pass goes through the request's draft run
 * (daemon/draft/draft_run.h): the draft proposes N ids (N from the width
 * policy; 0 = a plain decode pass), the target runs the anchor and the
 * proposals in one verification pass, and seq_step feeds the matching
 * proposals to the output stage in order, exactly as plain decoding
 * would feed them, then commits only what the stage took: a stop string,
 * end id or max_new inside an accepted run commits exactly the ids
 * emitted, so the published conversation equals a run without drafting.
 */
#include "server/sched_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/log.h"
#include "draft/draft_dspark.h"
#include "draft/draft_ngram.h"
#include "draft/draft_test.h"

/* --draft-oracle FILE: the ids (decimal, any separators) of a reference
 * run, which the oracle test draft proposes (tests only). */
static int oracle_load(struct k3_sched *s, struct k3_err *err)
{
	char *text = NULL;
	size_t len, n = 0;
	int r = k3_file_read(s->opts->draft_oracle, 64u << 20, 0, &text, &len, err);
	uint32_t *ids = r ? NULL : malloc((len / 2 + 1) * sizeof(uint32_t));

	if (!r && !ids)
		r = k3_err_set(err, -ENOMEM, "out of memory");
	for (size_t i = 0; !r && i < len;) {
		if (text[i] < '0' || text[i] > '9') {
			i++;
			continue;
		}
		uint64_t v = 0;
		for (; i < len && text[i] >= '0' && text[i] <= '9' && v <= UINT32_MAX; i++)
			v = v * 10 + (uint64_t)(text[i] - '0');
		if (v >= k3_engine_vocab(s->engine))
			r = k3_err_set(err, -EINVAL, "--draft-oracle: id %llu outside the vocabulary",
				       (unsigned long long)v);
		else
			ids[n++] = (uint32_t)v;
	}
	if (!r)
		r = k3_draft_oracle_new(ids, n, k3_engine_vocab(s->engine), s->opts->draft_oracle_spoil,
					1, &s->draft_ngram, err);
	if (!r)
		k3_log_warning("draft: --draft-oracle '%s' (%zu ids, %.0f %% spoiled) replaces the n-gram "
			       "draft: a test setup", s->opts->draft_oracle, n,
			       100.0 * s->opts->draft_oracle_spoil);
	free(ids);
	free(text);
	return r;
}

int sched_draft_load(struct k3_sched *s, struct k3_err *err)
{
	int r = s->opts->draft_oracle ? oracle_load(s, err)
				      : k3_draft_ngram_new(NULL, &s->draft_ngram, err);

	k3_draft_cost_init(&s->draft_cost);
	if (r < 0 || !s->opts->draft_model)
		return r;
	r = k3_draft_dspark_open(s->opts->draft_model, s->engine, &s->draft_dspark, err);
	if (r < 0)
		return k3_err_prefix(err, "--draft-model '%s'", s->opts->draft_model);
	k3_log_info("draft: DSpark '%s' loaded (%s)", s->opts->draft_model,
		    k3_draft_dspark_describe(s->draft_dspark));
	return 0;
}

/* The request's draft run: the draft its policy names (reset for this
 * request), or none. Returns 0 or a negative errno with q->err. */
static int seq_draft_open(struct k3_sched *s, struct sched_seq *q)
{
	struct sched_job *j = q->job;
	struct k3_draft *d = NULL;
	struct k3_draft_run_opts o = { .cost = &s->draft_cost, .max_width = s->opts->draft_max,
				       .fixed_width = s->opts->draft_width };

	switch (j->draft_policy) {
	case K3_DRAFT_POLICY_AUTO:
		d = s->draft_dspark ? s->draft_dspark : s->draft_ngram;
		break;
	case K3_DRAFT_POLICY_NGRAM:
		d = s->draft_ngram;
		break;
	case K3_DRAFT_POLICY_DSPARK:
		d = s->draft_dspark;
		break;
	default:
		break;
	}
	if (d)
		k3_draft_reset(d);
	o.draft = d;
	return k3_draft_run_new(s->engine, &o, &q->run, &q->err);
}

/* Output stage, logits buffer and the sequence to advance. j->finish is
 * ERROR until a later step says otherwise. Returns 0 or a negative errno
 * with q->err. */
int sched_seq_prepare(struct k3_sched *s, struct sched_job *j, struct sched_seq *q)
{
	const uint32_t V = k3_engine_vocab(s->engine);
	const uint32_t n = (uint32_t)j->prompt.n;
	int r;

	memset(q, 0, sizeof(*q));
	q->job = j;
	q->n_prompt = n;
	q->queued_s = sched_since(&j->t_submit);
	if (s->store)
		k3_store_stats_get(s->store, &q->xs0);
	if (s->spine)
		k3_store_spine_stats_get(s->spine, &q->ss0);
	clock_gettime(CLOCK_MONOTONIC, &q->t_prefill);
	q->t_decode = q->t_prefill;
	q->logits = malloc((size_t)V * sizeof(float));
	q->out_last = (struct k3_engine_out){ K3_ENGINE_LOGITS_LAST, q->logits, s->route_ids, s->route_w };
	q->out_none = (struct k3_engine_out){ K3_ENGINE_LOGITS_NONE, NULL, s->route_ids, s->route_w };
	j->finish = K3_FINISH_ERROR;
	r = sched_stage_init(&q->stage, j, &q->err);
	if (r == 0 && !q->logits)
		r = k3_err_set(&q->err, -ENOMEM, "out of memory");
	if (r < 0)
		return r;
	/* Reuse the published conversation when the prompt strictly extends it. */
	pthread_mutex_lock(&s->lock);
	for (int k = 0; j->chat && k < 2; k++) {
		const struct sched_conv *p = &s->pub[k];

		if (p->seq && p->ids.n > q->start && p->ids.n < n &&
		    memcmp(p->ids.v, j->prompt.v, p->ids.n * sizeof(uint32_t)) == 0) {
			k3_engine_seq_free(q->seq);
			q->seq = NULL;
			r = k3_engine_seq_clone(s->engine, p->seq, &q->seq, &q->err);
			if (r < 0)
				break;
			q->start = (uint32_t)p->ids.n;
		}
	}
	pthread_mutex_unlock(&s->lock);
	if (r < 0)
		return r;
	/* The capacity is a hint (MLA caches grow past it): do not reserve a
	 * whole context for a request that may stop early. */
	if (!q->seq && (r = k3_engine_seq_new(s->engine, n + (j->max_new < 4096 ? j->max_new : 4096) + 1,
					      &q->seq, &q->err)) < 0)
		return r;
	/* Several seats share a pass: one job's flag must not stop the
	 * others', so they poll theirs between passes (sched_seats.c). */
	k3_engine_set_cancel(s->engine, s->n_running > 1 ? NULL : &j->cancel);
	j->n_cached = q->start;
	return seq_draft_open(s, q);
}

/* The prompt positions not served by a published state, in the fewest
 * passes of at most s->prefill_chunk positions, of equal length (each pass
 * reads every expert its positions route to once, docs/store.md,
 * "Expert-major prefill"): q->chunk. */
void sched_seq_prefill_begin(struct k3_sched *s, struct sched_seq *q)
{
	uint32_t todo = q->n_prompt - q->start, passes = (todo + s->prefill_chunk - 1) / s->prefill_chunk;

	q->chunk = passes ? (todo + passes - 1) / passes : 0;
	clock_gettime(CLOCK_MONOTONIC, &q->t_prefill);
	q->prefill_end = q->start;
	if (s->store && !q->split)
		k3_store_epoch_begin(s->store);
}

/* The next c prompt positions through q's draft run (the last chunk
 * leaves the logits of the last prompt position). */
int sched_seq_prefill_chunk(struct k3_sched *s, struct sched_seq *q, uint32_t c)
{
	const uint32_t pos = q->prefill_end, n = q->n_prompt;

	(void)s;
	return k3_draft_run_prefill(q->run, q->seq, (const int32_t *)q->job->prompt.v + pos, c,
				    pos + c == n ? &q->out_last : &q->out_none, &q->err);
}

/* The prompt is in q's sequence: the branches, the first id. */
static int seq_prefill_end(struct k3_sched *s, struct sched_seq *q)
{
	struct sched_job *j = q->job;
	const uint32_t n = q->n_prompt;
	int r;

	for (uint32_t i = 0; i < n; i++)
		if ((r = k3_tok_ids_push(&j->branch[1].ids, j->prompt.v[i])) < 0 ||
		    (j->chat && (r = k3_tok_ids_push(&j->branch[0].ids, j->prompt.v[i])) < 0))
			return r;
	if (j->chat && (r = k3_engine_seq_clone(s->engine, q->seq, &j->branch[0].seq, &q->err)) < 0)
		return r;
	q->prefill_s = sched_since(&q->t_prefill);
	q->prefilled = true;
	if (q->split)
		q->xs_prefilled = q->xacc;   /* xs0 stays zero: the split's own sums */
	else if (s->store)
		k3_store_stats_get(s->store, &q->xs_prefilled);
	q->anchor = k3_engine_argmax(q->logits, k3_engine_vocab(s->engine));
	q->ttft_s = sched_since(&j->t_submit);
	j->decode_passes = 1;          /* the last chunk's logits give the first id */
	return 0;
}

/* A chunk of c positions at q->prefill_end ran: its routes, PROGRESS, and
 * the prefill's end after the last. */
int sched_seq_prefill_advanced(struct k3_sched *s, struct sched_seq *q, uint32_t c)
{
	struct sched_job *j = q->job;
	struct k3_msg_progress p;
	uint32_t pos = q->prefill_end;

	j->positions += c;
	sched_trace_routes(s, j, pos, c);
	pos += c;
	q->prefill_end = pos;
	memset(&p, 0, sizeof(p));
	k3_msg_progress_set_done(&p, pos);
	k3_msg_progress_set_total(&p, q->n_prompt);
	sched_post_frame(j, K3_MSG_PROGRESS, &p);
	return pos == q->n_prompt ? seq_prefill_end(s, q) : 0;
}

/* The whole prefill, one chunk per pass. Returns 0 when prefilled, 1 when
 * cancelled between passes (j->finish says so), or a negative errno. */
static int seq_prefill(struct k3_sched *s, struct sched_seq *q)
{
	struct sched_job *j = q->job;
	int r;

	sched_seq_prefill_begin(s, q);
	if (q->start == q->n_prompt)
		return seq_prefill_end(s, q);
	while (!q->prefilled) {
		uint32_t left = q->n_prompt - q->prefill_end, c = left < q->chunk ? left : q->chunk;

		if (atomic_load(&j->cancel)) {
			j->finish = K3_FINISH_CANCELLED;
			return 1;
		}
		if ((r = sched_seq_prefill_chunk(s, q, c)) < 0)
			return r;
		sched_count_pass(s, 1);
		j->passes++;
		j->pass_width_sum++;
		if ((r = sched_seq_prefill_advanced(s, q, c)) < 0)
			return r;
	}
	return 0;
}

/* Feeds one committed id to the output stage. Returns 1 when generation
 * ends with it (end id, stop string, end of message: j->finish = stop;
 * max_new: finish stays length), 0 to go on, or a negative errno. */
int sched_seq_emit(struct sched_seq *q, uint32_t tok)
{
	struct sched_job *j = q->job;
	int r;

	j->n_gen++;
	r = sched_stage_feed(&q->stage, tok);
	if (r < 0)
		return k3_err_set(&q->err, r, "output stage failed on id %u", tok);
	if (r == 1) {
		j->finish = K3_FINISH_STOP;
		return 1;
	}
	return j->n_gen == j->max_new;
}

/* Appends the routes of positions [0..n) of the last pass to the router
 * trace (positions pos..). */
static void seq_trace(struct k3_sched *s, const struct sched_seq *q, const struct k3_draft_pass *p,
		      uint32_t pos, uint32_t n)
{
	size_t per = (size_t)k3_engine_n_moe(s->engine) * k3_engine_top_k(s->engine);

	if (!s->trace || !s->route_ids)
		return;
	memcpy(s->route_ids, p->route_ids, n * per * sizeof(uint32_t));
	memcpy(s->route_w, p->route_w, n * per * sizeof(float));
	sched_trace_routes(s, q->job, pos, n);
}

/*
 * One pass of one sequence: emit the anchor (the id chosen last), and
 * unless that ended the generation, run one pass through the draft run:
 * the anchor and the draft's proposals (none when the policy is off or the
 * draft has nothing), then emit the proposals that match the target's
 * own choices, in order, and commit the anchor and the emitted ones. The
 * next anchor is the target's own id after them. Returns 1 to go on, 0
 * when the generation ended (j->finish: stop, cancelled; length stays as
 * set), or a negative errno with q->err. The seam for drafting (file
 * comment): each call commits >= 1 ids.
 */
int sched_seq_step(struct k3_sched *s, struct sched_seq *q)
{
	struct sched_job *j = q->job;
	struct k3_draft_pass p;
	uint32_t pos0 = q->n_prompt + j->n_gen, keep = 1;
	int r;

	if (atomic_load(&j->cancel)) {
		j->finish = K3_FINISH_CANCELLED;
		return 0;
	}
	if ((r = sched_seq_emit(q, q->anchor)) != 0)
		return r < 0 ? r : 0;
	/* the context the draft sees: every id the branch consumed, then the
	 * anchor (pushed now: it is consumed by this pass whatever happens) */
	if ((r = k3_tok_ids_push(&j->branch[1].ids, q->anchor)) < 0)
		return k3_err_set(&q->err, r, "out of memory");
	r = k3_draft_run_pass(q->run, q->seq, j->branch[1].ids.v, j->branch[1].ids.n,
			      j->max_new - j->n_gen - 1, &p, &q->err);
	if (r < 0)
		return r;
	j->decode_passes++;
	j->passes++;
	j->pass_width_sum++;
	sched_count_pass(s, 1);
	bool ended = false;
	for (uint32_t i = 0; i < p.accepted && !ended; i++) {
		if ((r = sched_seq_emit(q, p.drafts[i])) < 0)
			return r;
		/* an id that ends the generation is emitted, not run (as plain
		 * decoding never runs its last id) */
		if (r == 1)
			ended = true;
		else
			keep++;
	}
	if ((r = k3_draft_run_commit(q->run, q->seq, keep, &q->err)) < 0)
		return r;
	j->positions += keep;
	seq_trace(s, q, &p, pos0, keep);
	for (uint32_t i = 0; i + 1 < keep; i++)
		if ((r = k3_tok_ids_push(&j->branch[1].ids, p.drafts[i])) < 0)
			return k3_err_set(&q->err, r, "out of memory");
	if (ended)
		return 0;
	q->anchor = p.next[keep - 1];
	return 1;
}

/*
 * One pass of the engine: each of the n sequences still decoding advances
 * by one position; a sequence's outcome is in its rc (seq_step's return)
 * and decoding flag. Returns how many still decode. The seam for several
 * sequences in one pass (file comment); today n is 1.
 */
static unsigned sched_pass(struct k3_sched *s, struct sched_seq *const *seqs, unsigned n)
{
	unsigned live = 0;

	for (unsigned i = 0; i < n; i++) {
		struct sched_seq *q = seqs[i];

		if (!q->decoding)
			continue;
		q->rc = sched_seq_step(s, q);
		q->decoding = q->rc > 0;
		live += q->decoding;
	}
	return live;
}

void sched_seq_decode_begin(struct sched_seq *q)
{
	struct sched_job *j = q->job;

	clock_gettime(CLOCK_MONOTONIC, &q->t_decode);
	j->finish = K3_FINISH_LENGTH;
	q->rc = 0;
	q->decoding = j->n_gen < j->max_new;
}

int sched_seq_decode_end(struct sched_seq *q)
{
	struct sched_job *j = q->job;
	int r = sched_stage_finish(&q->stage);

	if (q->stage.any_tool && j->finish == K3_FINISH_STOP)
		j->finish = K3_FINISH_TOOL_CALLS;
	q->decode_s = sched_since(&q->t_decode);
	return r;
}

/* Decodes until an end id, a stop string, max_new or cancel, then flushes
 * the output stage. Returns 0 or a negative errno with q->err. */
static int seq_decode(struct k3_sched *s, struct sched_seq *q)
{
	sched_seq_decode_begin(q);
	while (sched_pass(s, &q, 1))
		;
	if (q->rc < 0)
		return q->rc;
	return sched_seq_decode_end(q);
}

/* Lets the expert store and the spine loader settle and returns in d and
 * sd what this job cost them. */
static void seq_store_settle(struct k3_sched *s, const struct sched_seq *q, struct k3_store_stats *d,
			     struct k3_store_spine_stats *sd)
{
	struct k3_store_stats now;

	memset(d, 0, sizeof(*d));
	memset(sd, 0, sizeof(*sd));
	if (q->split) {
		/* the seats charged every pass already (sched_seats.c) */
		*d = q->xacc;
		*sd = q->sacc;
		return;
	}
	if (s->spine) {
		/* The read-ahead into the next pass lands and is charged here. */
		struct k3_store_spine_stats snow;
		k3_store_spine_drain(s->spine);
		k3_store_spine_stats_get(s->spine, &snow);
		k3_store_spine_stats_sub(&snow, &q->ss0, sd);
	}
	if (!s->store)
		return;
	/* Guesses still queued are for layers this request has passed: drop
	 * them, and let reads in flight land, so every byte is charged to the
	 * request that caused it. */
	k3_store_prefetch_cancel(s->store, UINT32_MAX);
	k3_store_drain(s->store);
	k3_store_idle(s->store);
	k3_store_stats_get(s->store, &now);
	k3_store_stats_sub(&now, &q->xs0, d);
}

/* The DONE frame of a generation that ended without an engine error. */
static struct sched_msg *seq_done_frame(struct k3_sched *s, const struct sched_seq *q,
					const struct k3_store_stats *xd,
					const struct k3_store_spine_stats *sd)
{
	struct sched_job *j = q->job;
	const double prefill_s = q->prefill_s, decode_s = q->decode_s;
	struct k3_msg_done done;
	uint64_t drive_buf[K3_STORE_MAX_DRIVES * 7];
	double compute_s;

	memset(&done, 0, sizeof(done));
	k3_msg_done_set_finish(&done, j->finish);
	if (j->finish == K3_FINISH_CANCELLED && atomic_load(&j->cancel_reason))
		k3_msg_done_set_cancel_reason(&done, atomic_load(&j->cancel_reason));
	k3_msg_done_set_prompt_tokens(&done, q->n_prompt);
	k3_msg_done_set_completion_tokens(&done, j->n_gen);
	k3_msg_done_set_reasoning_tokens(&done, j->n_reasoning);
	k3_msg_done_set_cached_tokens(&done, j->n_cached);
	k3_msg_done_set_queued_s(&done, q->queued_s);
	k3_msg_done_set_prefill_s(&done, prefill_s);
	k3_msg_done_set_decode_s(&done, decode_s);
	k3_msg_done_set_prefill_tps(&done, prefill_s > 0 ? (double)(q->prefill_end - q->start) / prefill_s
						       : 0);
	k3_msg_done_set_decode_tps(&done, decode_s > 0 ? (double)j->n_gen / decode_s : 0);
	/* Honest split of the engine's time: waiting for expert and spine
	 * reads vs everything else (compute_s + io_wait_s = prefill + decode). */
	k3_msg_done_set_io_wait_s(&done, (double)(xd->io_wait_ns + sd->io_wait_ns) * 1e-9);
	compute_s = prefill_s + decode_s - done.io_wait_s;
	k3_msg_done_set_compute_s(&done, compute_s < 0 ? 0 : compute_s);
	/* speculative decoding (docs/draft.md); tokens per pass is 1.0 with
	 * the policy off */
	k3_msg_done_set_draft_policy(&done, j->draft_policy);
	k3_msg_done_set_draft_proposed(&done, j->draft.proposed);
	k3_msg_done_set_draft_accepted(&done, j->draft.accepted);
	k3_msg_done_set_decode_passes(&done, j->decode_passes);
	k3_msg_done_set_tokens_per_pass(&done, j->decode_passes ? (double)j->n_gen /
					       (double)j->decode_passes : 0);
	k3_msg_done_set_draft_s(&done, j->draft.draft_s);
	k3_msg_done_set_verify_s(&done, j->draft.verify_s);
	/* several sequences in one pass (docs/scheduler.md) */
	k3_msg_done_set_ttft_s(&done, q->ttft_s);
	k3_msg_done_set_shared_passes(&done, j->shared_passes);
	k3_msg_done_set_pass_width_mean(&done, j->passes ? (double)j->pass_width_sum / (double)j->passes
							: 0);
	if (s->store) {
		/* hits exclude same-step prefetches (docs/store.md, counters) */
		k3_msg_done_set_expert_bytes_read(&done, xd->bytes_read);
		k3_msg_done_set_expert_hits(&done, xd->demand_hits);
		k3_msg_done_set_expert_misses(&done, xd->demand_misses);
		k3_msg_done_set_prefetch_issued(&done, xd->prefetch_issued);
		k3_msg_done_set_prefetch_issued_bytes(&done, xd->prefetch_issued_bytes);
		k3_msg_done_set_prefetch_used(&done, xd->prefetch_used);
		k3_msg_done_set_prefetch_wasted_bytes(&done, xd->prefetch_wasted_bytes);
	}
	if (s->spine) {
		k3_msg_done_set_spine_bytes_read(&done, sd->bytes_read);
		k3_msg_done_set_spine_loads(&done, sd->loads);
		k3_msg_done_set_spine_rows_read(&done, sd->rows_read);
		k3_msg_done_set_spine_io_wait_s(&done, (double)sd->io_wait_ns * 1e-9);
	}
	sched_done_drives(s, q, xd, sd, &done, drive_buf);
	sched_done_spine(s, &done);
	return sched_encode_frame(j, K3_MSG_DONE, &done);
}

/* The end of a generation, however it ended (r: 0 or the negative errno
 * that stopped it): frees what the sequence owned, charges the store's
 * work, leaves DONE or ERROR in j->final and keeps the branch only when
 * the answer is complete. */
void sched_seq_end(struct k3_sched *s, struct sched_seq *q, int r)
{
	struct sched_job *j = q->job;
	struct k3_store_stats xd;
	struct k3_store_spine_stats sd;

	sched_stage_release(&q->stage);
	free(q->logits);
	q->logits = NULL;
	if (q->run)
		sched_draft_stats_add(&j->draft, k3_draft_run_stats(q->run));
	k3_draft_run_free(q->run);
	q->run = NULL;
	k3_engine_set_cancel(s->engine, NULL);
	sched_trace_flush(s);
	seq_store_settle(s, q, &xd, &sd);
	if (r == -ECANCELED) {
		/* Stopped between layers: the branch is half-advanced, drop it. */
		r = 0;
		j->finish = K3_FINISH_CANCELLED;
		q->decode_s = sched_since(&q->t_decode);
	}
	if (!q->prefilled && j->finish == K3_FINISH_CANCELLED) {
		/* Cancelled during prefill: that time was prefill, none was decode. */
		q->prefill_s = sched_since(&q->t_prefill);
		q->decode_s = 0;
	}
	j->prefill_s = q->prefill_s;
	j->decode_s = q->decode_s;
	j->io_wait_s = (double)(xd.io_wait_ns + sd.io_wait_ns) * 1e-9;
	j->spine_io_wait_s = (double)sd.io_wait_ns * 1e-9;
	j->compute_s = q->prefill_s + q->decode_s > j->io_wait_s ?
		       q->prefill_s + q->decode_s - j->io_wait_s : 0;
	if (r < 0) {
		struct k3_msg_error e;

		k3_log_err("job %llu failed: %s", (unsigned long long)j->id, q->err.msg);
		memset(&e, 0, sizeof(e));
		k3_msg_error_set_status(&e, K3_STATUS_INTERNAL);
		k3_msg_error_set_message(&e, k3_proto_str_of(q->err.msg[0] ? q->err.msg
									  : "engine failure"));
		j->final = sched_encode_frame(j, K3_MSG_ERROR, &e);
		k3_engine_seq_free(q->seq);
		q->seq = NULL;
		j->finish = K3_FINISH_ERROR;
	} else {
		j->final = seq_done_frame(s, q, &xd, &sd);
		j->done_sent = j->final != NULL;
	}
	/* Only a complete answer becomes publishable state. */
	if (q->seq && (j->finish == K3_FINISH_STOP || j->finish == K3_FINISH_LENGTH ||
		       j->finish == K3_FINISH_TOOL_CALLS)) {
		j->branch[1].seq = q->seq;
	} else {
		k3_engine_seq_free(q->seq);
		sched_conv_release(&j->branch[0]);
		sched_conv_release(&j->branch[1]);
	}
	q->seq = NULL;
}

void sched_job_run(struct k3_sched *s, struct sched_job *j)
{
	struct sched_seq q;
	int r = sched_seq_prepare(s, j, &q);

	if (r == 0)
		r = seq_prefill(s, &q);
	if (r == 0)
		r = seq_decode(s, &q);
	else if (r == 1)
		r = 0;   /* cancelled during prefill: DONE{cancelled} */
	sched_seq_end(s, &q, r);
}

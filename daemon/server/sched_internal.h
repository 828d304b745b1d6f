/*
 * sched_internal.h - what the scheduler's files share (sched.h is the
 * public contract; nothing outside daemon/server/sched*.c includes this).
 *
 * Where each behaviour lives:
 *   sched.c        the engine thread, the engine -> loop inbox, a job's
 *                  life after it ran (publishing its state), CANCEL, and
 *                  the hooks server*.c calls (requests, STATUS, drain)
 *   sched_queue.c  the one queue type (struct sched_fifo)
 *   sched_admit.c  the one admission decision (BUSY, duplicate request
 *                  id, draining) for every kind of job, and ACCEPTED
 *   sched_prep.c   GENERATE -> job: validate, render the chat, tokenize
 *                  (inline, or on the prep thread for big requests);
 *                  TOKENIZE the same way
 *   sched_job.c    running one generation: prepare, prefill, the decode
 *                  loop (per-pass step), the final DONE
 *   sched_seats.c  --parallel N > 1: up to N generations on the engine
 *                  thread at once (seats), advanced by one batched pass
 *                  (docs/scheduler.md, "Several sequences in one pass")
 *   sched_stage.c  output staging: end ids, stop-string holdback, the
 *                  chat output parser, tool-call events
 *   sched_load.c   loading the model, the expert store and the router
 *                  trace; WARM_EXPERTS
 *
 * Threads and locks. Three threads touch this state: the loop thread
 * (libevent; every connection and frame), the engine thread (the model)
 * and the prep thread (tokenizing big requests). In struct k3_sched,
 * s->lock guards the fields from `lock` down to "loop thread only"; the
 * others have one owner each, or are set once before MSG_LOADED. A job's fields are written by the
 * loop thread until it is queued, by the engine thread while it runs, and
 * read by the loop thread again after MSG_FINISHED.
 */
#ifndef K3_SERVER_SCHED_INTERNAL_H
#define K3_SERVER_SCHED_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "server/options.h"
#include "server/sched.h"
#include "draft/draft.h"
#include "draft/draft_ctl.h"
#include "draft/draft_run.h"
#include "engine/engine.h"
#include "setup/setup_remote.h"
#include "store/store.h"
#include "store/store_engine.h"
#include "store/store_plan.h"
#include "store/store_spine.h"
#include "text/text_detok.h"
#include "text/text_parse.h"
#include "text/text_tok.h"

/* SCHED_PREFILL_CHUNK_MIN / _MAX: the bounds of the prompt positions per
 * forward call during prefill (a PROGRESS event and a cancel check after
 * each; s->prefill_chunk, chosen at load, sched_load.c): each pass reads
 * a layer's experts once for all its positions, so the longest the memory
 * allows. The engine takes at most 4096.
 * SCHED_PUBLISH_DEADLINE_S: how long a finished job's branch states wait
 * for its client to take the DONE frame; later they are dropped,
 * unpublished (a slow reader only loses conversation reuse;
 * tests/integration/test_generate.py knows this value).
 * SCHED_PREP_INLINE_BYTES: requests with less text than this are
 * prepared on the loop thread; bigger ones go to the prep thread. */
enum {
	SCHED_PREFILL_CHUNK_MIN = 64,
	SCHED_PREFILL_CHUNK_MAX = 4096,
	SCHED_N_END_IDS = 2 + K3_LIM_STOP_IDS,
	SCHED_PUBLISH_DEADLINE_S = 5,
	SCHED_PREP_INLINE_BYTES = 64 << 10,
	SCHED_MAX_SEATS = K3_OPTIONS_PARALLEL_MAX,
};

/* ---- the one queue type (sched_queue.c) -------------------------------- */

/*
 * An intrusive FIFO: the element embeds a struct sched_link and the queue
 * never allocates. It has no lock of its own: each queue's owner says
 * which lock (or thread) guards it. Used for the job queue, the prep
 * thread's queue, the prep tasks in flight and the engine -> loop inbox.
 */
struct sched_link {
	struct sched_link *next;
};

struct sched_fifo {
	struct sched_link *head, *tail;
	unsigned n;                     /* elements queued */
};

/* The element that embeds link l as member; NULL for a NULL l (l is
 * evaluated once, so sched_entry(sched_fifo_pop(q), ...) pops one). */
#define sched_entry(l, type, member) ((type *)sched_entry_((l), offsetof(type, member)))
static inline void *sched_entry_(const struct sched_link *l, size_t off)
{
	return l ? (void *)((uintptr_t)l - off) : NULL;
}

/* Appends l (not in any queue) at the tail. */
void sched_fifo_push(struct sched_fifo *q, struct sched_link *l);
/* Removes and returns the head, or NULL when q is empty. */
struct sched_link *sched_fifo_pop(struct sched_fifo *q);
/* Unlinks l from q; false when l is not in q. O(n). */
bool sched_fifo_remove(struct sched_fifo *q, struct sched_link *l);
/* Moves the elements for which match(l, ctx) is true (every element when
 * match is NULL) from q to the tail of out, keeping their order. */
void sched_fifo_move_if(struct sched_fifo *q, struct sched_fifo *out,
			bool (*match)(const struct sched_link *l, const void *ctx), const void *ctx);

/* ---- jobs ------------------------------------------------------------- */

/* A sequence state and the ids it has consumed. */
struct sched_conv {
	struct k3_engine_seq *seq;
	struct k3_tok_ids ids;
};

void sched_conv_release(struct sched_conv *c);

/*
 * One unit of engine work: a generation (GENERATE) or an expert preload
 * (WARM_EXPERTS). Created on the loop thread (or filled on the prep
 * thread before it is queued), run on the engine thread, freed on the
 * loop thread after MSG_FINISHED.
 */
struct sched_job {
	struct k3_sched *s;
	enum k3_proto_job_kind kind;
	uint64_t id;                    /* 0 until admitted */
	uint32_t rid;                   /* the request id its frames echo */
	uint32_t uid;                   /* its peer's uid (the per-uid seat share) */
	struct k3_conn *conn;           /* ref held once admitted; loop thread only */
	struct timespec t_submit;
	struct sched_link link;         /* in s->queue while queued (under lock) */
	uint32_t queue_pos_sent;        /* last queue position told by ACCEPTED */
	atomic_bool cancel;             /* polled between prefill chunks and decode steps */
	atomic_uint cancel_reason;      /* enum k3_proto_cancel_reason, set before cancel */

	/* WARM_EXPERTS: preload these (layer, expert) pairs (owned arrays,
	 * n_warm entries, best first) */
	uint32_t *warm_layer, *warm_expert;
	uint32_t n_warm, warm_requested;

	/* GENERATE inputs, set by sched_prep.c (stop and end ids: sched_stage_prepare) */
	bool chat;
	bool thinking;                  /* chat prompt ends inside the think channel */
	struct k3_tok_ids prompt;       /* prompt ids (owned) */
	uint32_t max_new;
	uint32_t n_stop;
	char *stop[K3_LIM_STOP_COUNT];  /* owned copies */
	uint32_t n_end;
	uint32_t end_ids[SCHED_N_END_IDS];  /* ids that end generation */
	uint32_t draft_policy;          /* enum k3_draft_policy, resolved (never UNSET) */
	/* set by sched_prep_fail when the request cannot run */
	uint32_t err_status;            /* enum k3_proto_status; 0 = none */
	const char *err_param;
	char err_msg[K3_LIM_MESSAGE_MAX];

	/* results, written by the engine thread before MSG_FINISHED */
	uint32_t finish;                /* enum k3_proto_finish */
	/* Publishable branches: [0] the state right after the prompt, [1] after
	 * prompt + generated[:-1]. Both are kept because a chat client sends
	 * the answer back as text, whose re-tokenization may differ from the
	 * ids the model produced; the prompt-end state still matches then. */
	struct sched_conv branch[2];
	bool done_sent;
	struct sched_msg *final;        /* DONE or ERROR, posted with the slot's release */
	uint32_t n_gen, n_reasoning, n_cached;
	uint64_t positions;             /* positions the engine committed (verified
					 * proposals it rejected are draft.proposed -
					 * draft.accepted) */
	double prefill_s, decode_s, io_wait_s, compute_s;
	double spine_io_wait_s;         /* the spine's part of io_wait_s */
	struct k3_draft_stats draft;    /* drafting (all zero with the policy off) */
	uint64_t decode_passes;         /* passes that produced ids: the last prefill
					 * chunk, then every decode or verification pass */
	uint64_t shared_passes;         /* passes it shared with other sequences */
	uint64_t pass_width_sum;        /* sequences in every pass it ran in, summed */
	uint64_t passes;                /* passes it ran in (prefill chunks included) */

	struct event *publish_timer;    /* SCHED_PUBLISH_DEADLINE_S while DONE is unflushed; loop thread */
};

/* A zeroed job of kind for request rid, or NULL without memory. */
struct sched_job *sched_job_new(struct k3_sched *s, enum k3_proto_job_kind kind, uint32_t rid);
/* NULL-safe; drops the connection reference and the branch states. */
void sched_job_free(struct sched_job *j);

/* Whether connection c may cancel job j by its job id, and see it in
 * STATUS: its own uid's jobs, or any job for an admin peer. */
bool sched_job_visible(const struct k3_conn *c, const struct sched_job *j);

/* ---- messages engine/prep -> loop (sched.c) ----------------------------- */

enum sched_msg_kind { MSG_FRAME, MSG_STARTED, MSG_FINISHED, MSG_LOADED, MSG_PREPARED };

struct sched_msg {
	enum sched_msg_kind kind;
	struct sched_job *job;
	struct sched_prep *task;        /* MSG_PREPARED */
	uint8_t *bytes;                 /* MSG_FRAME: one encoded frame (owned) */
	size_t len;
	bool ok;
	char text[K3_ERR_MSG_MAX + 128];
	struct sched_link link;         /* in s->inbox (under lock) */
};

/* Appends m to the loop's inbox; sched_post_locked needs s->lock held,
 * sched_post takes it. Both wake the loop. Any thread. */
void sched_post_locked(struct k3_sched *s, struct sched_msg *m);
/* A job left the engine (s->lock held): its seat in s->running freed in
 * the same step that queues its final frame and MSG_FINISHED (fin, may be
 * NULL when it could not be allocated), so a client that reacts to DONE at
 * once never sees a stale BUSY. */
void sched_job_leaves_locked(struct k3_sched *s, struct sched_job *j, struct sched_msg *fin);
void sched_post(struct k3_sched *s, struct sched_msg *m);
/* Encodes a frame for job j; NULL when it cannot (logged). Any thread. */
struct sched_msg *sched_encode_frame(struct sched_job *j, uint32_t type, const void *body);
/* Encodes a frame for job j and posts it. Engine thread. */
void sched_post_frame(struct sched_job *j, uint32_t type, const void *body);
/* Posts a message without frame bytes (text may be NULL). */
void sched_post_kind(struct k3_sched *s, enum sched_msg_kind kind, struct sched_job *j, bool ok,
		     const char *text);

/* Seconds since t0 (CLOCK_MONOTONIC). */
double sched_since(const struct timespec *t0);

/* ---- the scheduler ------------------------------------------------------ */

/* STATUS_REPLY's job list, assembled on the loop thread right before the
 * reply is encoded (the reply points into these arrays). */
struct sched_status_jobs {
	uint64_t ids[K3_LIM_STATUS_JOBS];
	uint32_t states[K3_LIM_STATUS_JOBS];
	uint32_t kinds[K3_LIM_STATUS_JOBS];
	uint32_t uids[K3_LIM_STATUS_JOBS];
	uint32_t pids[K3_LIM_STATUS_JOBS];
	uint64_t ages_ms[K3_LIM_STATUS_JOBS];
	uint32_t n;
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
	uint32_t spine_kind;             /* enum k3_proto_spine the model runs */
	bool loaded;
	/* the expert store (NULL: experts from the mmapped shards) */
	struct k3_store_source *xsrc;
	struct k3_store *store;
	struct k3_store_engine_src xctx;
	/* the memory plan (store_plan.h); valid when have_plan */
	struct k3_store_plan_out plan;
	bool have_plan;
	/* the spine loader (NULL: the spine is the mmapped shards) */
	struct k3_store_spine *spine;
	uint32_t prefill_chunk;         /* positions per prefill pass, the engine's max_chunk */
	uint32_t parallel;              /* seats: --parallel, or the plan's choice for auto */
	/* passes of the engine (any thread reads them): how many, the
	 * sequences in them summed, and in the latest one */
	atomic_uint_fast64_t passes_total, pass_width_total;
	atomic_uint pass_width_last;
	/* a streaming install's expert fetcher (--fetch-experts), or NULL */
	struct k3_setup_remote *remote;
	struct k3_setup_remote_reader remote_reader;
	char stream_text[256];          /* STATUS text, loop thread only */
	/* speculative decoding (docs/draft.md), engine thread only: the
	 * drafts k3d offers and the measured cost of a pass of T positions */
	struct k3_draft *draft_ngram;
	struct k3_draft *draft_dspark;  /* NULL without --draft-model */
	struct k3_draft_cost draft_cost;
	/* --router-trace, engine thread only */
	struct k3_store_trace *trace;
	uint32_t *route_ids;            /* [prefill_chunk][n_moe][K] */
	float *route_w;

	pthread_mutex_t lock;           /* guards everything down to "loop thread only" */
	pthread_cond_t cond;            /* engine thread: a job was queued, or stopping */
	struct sched_fifo queue;        /* struct sched_job, FIFO order */
	/* the jobs on the engine thread (seats), in the order they started */
	struct sched_job *running[SCHED_MAX_SEATS];
	unsigned n_running;
	bool stopping;
	struct sched_fifo inbox;        /* struct sched_msg for the loop thread */
	struct sched_fifo prep_queue;   /* struct sched_prep for the prep thread */
	pthread_cond_t prep_cond;
	/* the published conversation */
	struct sched_conv pub[2];

	/* loop thread only */
	struct sched_fifo prep_inflight; /* struct sched_prep handed to the prep thread */
	unsigned n_prepping;            /* GENERATEs among them */
	bool ready;                     /* MSG_LOADED arrived with success */
	uint64_t next_job_id;
	bool draining;
	struct k3_msg_status_reply totals;
	/* what STATUS_REPLY's drive arrays point at (sched_status_drives) */
	uint64_t status_u64[K3_STORE_MAX_DRIVES * 9];
	uint32_t status_u32[K3_STORE_MAX_DRIVES * 2];
	struct sched_status_jobs status_jobs;
};

/* ---- admission (sched_admit.c) ------------------------------------------- */

/*
 * The one admission decision, the same for every kind of job (GENERATE,
 * WARM_EXPERTS), taken before any work is done for the request:
 *   - ERROR{shutting_down} while draining;
 *   - ERROR{bad_request} when request id rid already names a running,
 *     queued or preparing job of connection c;
 *   - ERROR{busy} when running + waiting > --queue, where running is 1
 *     while a job runs that was not told to stop, and waiting counts the
 *     queued jobs and the GENERATEs still being prepared.
 * Returns 0 when the job may enter, else a negative errno (-ESHUTDOWN,
 * -EEXIST, -EBUSY) after sending the ERROR. Loop thread.
 */
int sched_admit(struct k3_sched *s, struct k3_conn *c, uint32_t rid);

/*
 * Queues an admitted job (taking ownership of j): a job whose preparation
 * failed (j->err_status) is answered with its ERROR and freed instead.
 * Assigns the job id; a GENERATE gets ACCEPTED{job_id, queue_position}.
 * Loop thread.
 */
void sched_enqueue(struct k3_sched *s, struct k3_conn *c, struct sched_job *j);

/* Sends ACCEPTED to every queued GENERATE whose position changed. */
void sched_send_positions(struct k3_sched *s);

/* ---- preparation (sched_prep.c) -------------------------------------------- */

/*
 * A GENERATE or TOKENIZE carrying more text than the loop thread should
 * render or tokenize itself (a 128 MiB prompt takes seconds): the prep
 * thread does that work on a private copy of the request and posts the
 * result back, so every other client stays served meanwhile.
 */
struct sched_prep {
	bool tokenize;
	struct k3_conn *conn;           /* ref held; loop thread only */
	uint32_t rid;
	struct sched_job *job;          /* GENERATE */
	struct k3_msg_generate g;       /* GENERATE, strings and ids in payload */
	char *text;                     /* TOKENIZE, in payload */
	size_t text_len;
	bool special;
	uint8_t *frame;                 /* TOKENIZE: reply or ERROR, encoded */
	size_t frame_len;
	bool cancel;                    /* loop thread only */
	struct sched_link link;         /* in s->prep_queue (under lock) */
	struct sched_link inflight;     /* in s->prep_inflight (loop thread) */
	uint32_t payload[];             /* the request's bytes, copied: one allocation */
};

/* GENERATE: admission, then the job's preparation (inline or on the prep
 * thread) and sched_enqueue. Answers on c. Loop thread. */
void sched_prep_generate(struct k3_sched *s, struct k3_conn *c, uint32_t rid,
			 const struct k3_msg_generate *g);
/* TOKENIZE: answers on c, inline or from the prep thread. Loop thread. */
void sched_prep_tokenize(struct k3_sched *s, struct k3_conn *c, uint32_t rid,
			 const struct k3_msg_tokenize *m);
/* The prep thread's body (arg: the scheduler). */
void *sched_prep_main(void *arg);
/* A task came back from the prep thread (MSG_PREPARED). Loop thread. */
void sched_prep_done(struct k3_sched *s, struct sched_prep *t);
/* Whether a GENERATE with request id rid from c is being prepared. */
bool sched_prep_has_rid(const struct k3_sched *s, const struct k3_conn *c, uint32_t rid);
/* Marks c's GENERATEs being prepared (only rid's when by_rid) cancelled:
 * they are answered DONE{cancelled} when they come back. Returns how many. */
unsigned sched_prep_cancel(struct k3_sched *s, const struct k3_conn *c, bool by_rid, uint32_t rid);
/* NULL-safe. */
void sched_prep_free(struct sched_prep *t);

/* Records why a request cannot run (sent as ERROR by the loop thread);
 * returns code. */
int sched_prep_fail(struct sched_job *j, uint32_t status, const char *param, int code,
		    const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* ---- output staging (sched_stage.c) ---------------------------------------- */

/*
 * Turns generated ids into protocol events. Raw mode: the detokenizer
 * (special ids skipped, stop strings held back). Chat mode: the output
 * parser splits reasoning, content and tool calls; content then passes
 * through the detokenizer's stop-string matcher, so stop strings apply to
 * the answer only and are never partly emitted.
 */
struct sched_stage {
	struct sched_job *j;
	struct k3_detok *detok;
	struct k3_parse *parse;
	struct k3_sbuf reasoning, content;   /* text produced by the current id */
	enum k3_proto_channel channel;       /* channel of the latest text */
	bool stopped;                        /* a stop string or END arrived */
	bool any_tool;
};

/* Fills j's end ids and stop strings from the GENERATE; on failure records
 * the ERROR in j (sched_prep_fail) and returns < 0. Any thread. */
int sched_stage_prepare(const struct k3_sched *s, const struct k3_msg_generate *g,
			struct sched_job *j);
/* Sets up staging for j (engine thread). 0 or a negative errno with err. */
int sched_stage_init(struct sched_stage *st, struct sched_job *j, struct k3_err *err);
/*
 * Feeds one generated id: an end id stops without output; otherwise its
 * text (if any) is posted as TOKEN / TOOL_CALL events and reasoning ids are
 * counted in j->n_reasoning. Returns 1 when generation should stop (end
 * id, stop string, end of the chat message), 0 to go on, or a negative
 * errno.
 */
int sched_stage_feed(struct sched_stage *st, uint32_t id);
/* End of generation: posts what parser and detokenizer still hold. */
int sched_stage_finish(struct sched_stage *st);
void sched_stage_release(struct sched_stage *st);

/* ---- running one generation (sched_job.c) ---------------------------------- */

/*
 * What one running generation owns while the engine advances it. Today
 * the engine thread runs one at a time; "several sequences in one pass"
 * (issue 21) keeps an array of these and advances each by one decode
 * position per pass (sched_job.c, "Seams").
 */
struct sched_seq {
	struct sched_job *job;
	struct k3_engine_seq *seq;      /* the private branch being advanced (owned) */
	float *logits;                  /* [vocab] of the last computed position (owned) */
	struct k3_engine_out out_last;  /* logits of the last position + routes */
	struct k3_engine_out out_none;  /* routes only (prefill chunks but the last) */
	uint64_t prefill_turn;          /* seats: the prefill turn it last had */
	struct k3_draft_run *run;       /* the draft/verify/commit loop (policy off: plain) */
	uint32_t anchor;                /* the next id to emit (chosen, not yet run) */
	struct sched_stage stage;
	uint32_t n_prompt;              /* prompt positions */
	uint32_t start;                 /* prompt positions served from a published state */
	uint32_t prefill_end;           /* prompt position prefill reached */
	bool prefilled;
	bool decoding;                  /* sched_pass advances it */
	int rc;                         /* its last decode step's result */
	struct timespec t_prefill, t_decode;
	double queued_s, prefill_s, decode_s;
	struct k3_store_stats xs0;      /* store counters when the job started */
	struct k3_store_stats xs_prefilled;   /* ... and when its prefill ended */
	struct k3_store_spine_stats ss0;   /* spine loader counters then */
	uint32_t chunk;                 /* positions per prefill pass for this prompt */
	double ttft_s;                  /* submit to the first id chosen */
	/* seats (sched_seats.c): the store and spine counters are charged per
	 * pass, split among the pass's sequences by positions, into these */
	bool split;
	struct k3_store_stats xacc;
	struct k3_store_spine_stats sacc;
	bool untapped;                  /* its tapped draft was switched off (seats) */
	bool finished;                  /* ready for its end (sched_seq_end) */
	int end_r;                      /* ... with this result */
	struct k3_err err;
};

/* *d += *a, field by field (a job's drafting over several draft runs). */
static inline void sched_draft_stats_add(struct k3_draft_stats *d, const struct k3_draft_stats *a)
{
	d->proposed += a->proposed;
	d->accepted += a->accepted;
	d->passes += a->passes;
	d->verify_passes += a->verify_passes;
	d->draft_s += a->draft_s;
	d->verify_s += a->verify_s;
	d->decode_s += a->decode_s;
	d->switched_off += a->switched_off;
}

/* Creates the drafts k3d offers (n-gram; DSpark from --draft-model,
 * validated against the engine's model) and the pass-cost fit. Engine
 * thread, before MSG_LOADED. Returns 0 or a negative errno with err. */
int sched_draft_load(struct k3_sched *s, struct k3_err *err);

/* Runs generation j to its end on the engine thread and leaves its final
 * frame (DONE or ERROR) in j->final and its publishable branch in
 * j->branch. */
void sched_job_run(struct k3_sched *s, struct sched_job *j);

/* The steps of sched_job_run, which the seats (sched_seats.c) drive one
 * pass at a time. Engine thread. Returns are as documented in sched_job.c:
 *  prepare: 0 or a negative errno with q->err;
 *  prefill_begin: plans q's chunks (no engine work);
 *  prefill_chunk: the next chunk of at most c positions through q's draft
 *    run: 0, or a negative errno with q->err;
 *  prefill_advanced: bookkeeping after a chunk of c positions ran
 *    (positions, trace, PROGRESS; the prefill's end when it was the last):
 *    0 or a negative errno;
 *  decode_begin / decode_end: around the decode loop (decode_end flushes
 *    the output stage: 0 or a negative errno);
 *  step: one pass of q alone (drafting as its policy says): 1 to go on, 0
 *    ended, < 0 error;
 *  emit: one committed id to the output stage: 1 ends, 0 goes on, < 0;
 *  end: DONE or ERROR into j->final, the branch (r: 0 or the errno). */
int sched_seq_prepare(struct k3_sched *s, struct sched_job *j, struct sched_seq *q);
void sched_seq_prefill_begin(struct k3_sched *s, struct sched_seq *q);
int sched_seq_prefill_chunk(struct k3_sched *s, struct sched_seq *q, uint32_t c);
int sched_seq_prefill_advanced(struct k3_sched *s, struct sched_seq *q, uint32_t c);
void sched_seq_decode_begin(struct sched_seq *q);
int sched_seq_decode_end(struct sched_seq *q);
int sched_seq_step(struct k3_sched *s, struct sched_seq *q);
int sched_seq_emit(struct sched_seq *q, uint32_t tok);
void sched_seq_end(struct k3_sched *s, struct sched_seq *q, int r);

/* --parallel > 1: the engine thread's loop over seats until stopping
 * (sched_seats.c). Called with s->lock held; returns with it held. */
void sched_seats_main(struct k3_sched *s);
/* Counts one engine pass of width sequences (STATUS pass_width*). */
void sched_count_pass(struct k3_sched *s, unsigned width);

/* ---- loading and WARM_EXPERTS (sched_load.c) -------------------------------- */

/* Loads the model, tokenizer, engine, router trace and expert store, then
 * posts MSG_LOADED (ok, or the error text). Engine thread. */
void sched_load(struct k3_sched *s);
/* STATUS_REPLY's drive and counter fields (several drives, the sums that
 * add up: store totals since start); arrays point into s. Loop thread. */
void sched_status_drives(struct k3_sched *s, struct k3_msg_status_reply *r);
/* DONE's: the request's counter differences xd (experts) and sd (spine),
 * its prefill's cost; arrays point into buf (K3_STORE_MAX_DRIVES x 7
 * entries), which must outlive the encoding. Engine thread. */
void sched_done_drives(const struct k3_sched *s, const struct sched_seq *q,
		       const struct k3_store_stats *xd, const struct k3_store_spine_stats *sd,
		       struct k3_msg_done *done, uint64_t *buf);
/* Tokens one conversation may hold: the model's max_position_embeddings,
 * capped at --context when it is given (the plan then reserves state for
 * exactly that). Any thread. */
uint64_t sched_context_tokens(const struct k3_sched *s);
/* STATUS_REPLY's memory fields: peak RSS (VmHWM of this process) and,
 * once loaded, the memory plan's split. Loop thread. */
void sched_status_memory(const struct k3_sched *s, struct k3_msg_status_reply *r);
/* Appends the routes of the last forward call (c positions from pos) to
 * --router-trace; a write error stops tracing with one log line. */
void sched_trace_routes(struct k3_sched *s, const struct sched_job *j, uint32_t pos, uint32_t c);
/* End of a job: the trace is flushed (a crash loses at most one job). */
void sched_trace_flush(struct k3_sched *s);
/* WARM_EXPERTS: validation, the job, admission. Loop thread. */
void sched_warm_request(struct k3_sched *s, struct k3_conn *c, uint32_t rid,
			const struct k3_msg_warm_experts *m);
/* Runs a WARM_EXPERTS job; leaves its reply or ERROR in j->final. Engine
 * thread. */
void sched_warm_run(struct k3_sched *s, struct sched_job *j);

/* Says on a DONE which spine produced it: every DONE carries `spine`, and
 * one from a spine that is not the checkpoint's weights also its label
 * (docs/protocol.md, DONE). */
static inline void sched_done_spine(const struct k3_sched *s, struct k3_msg_done *d)
{
	k3_msg_done_set_spine(d, s->spine_kind);
	if (s->spine_kind == K3_SPINE_INT8)
		k3_msg_done_set_spine_label(d, k3_proto_str_of(K3_PROTO_SPINE_INT8_LABEL));
}

#endif

/*
 * draft_run.h - one request's draft, verify, commit loop (docs/draft.md):
 * what k3d's scheduler (daemon/server/sched_job.c) and the benchmarks
 * run, so both measure the same thing.
 *
 * A pass starts from the anchor (the target's newest id, already chosen
 * and emitted, not yet run). The draft proposes up to N ids (N from the
 * width policy, draft_ctl.h); the target runs the anchor and the N
 * proposals in one verification pass (k3_engine_verify); the run reports
 * the target's own greedy id after every input and how many proposals
 * matched. The caller then emits the matching proposals in order (its
 * stop conditions may cut them short) and commits exactly what it
 * emitted: the anchor and the emitted proposals (k3_draft_run_commit).
 * With N = 0 (policy off, the draft has nothing, or it stopped paying) the
 * pass is a plain decode step. Either way the committed state, the ids and
 * the next logits are those of plain greedy decoding.
 */
#ifndef K3_DRAFT_DRAFT_RUN_H
#define K3_DRAFT_DRAFT_RUN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "draft/draft.h"
#include "draft/draft_ctl.h"
#include "engine/engine.h"

/* What a request's drafting did (DONE fields, docs/protocol.md). */
struct k3_draft_stats {
	uint64_t proposed;           /* proposals verified by the target */
	uint64_t accepted;           /* of those, equal to the target's greedy id */
	uint64_t passes;             /* decode passes (plain and verification) */
	uint64_t verify_passes;      /* of those, with at least one proposal */
	double draft_s;              /* time in the draft (propose, accept) */
	double verify_s;             /* time in verification passes, commit included */
	double decode_s;             /* time in plain decode passes */
	uint32_t switched_off;       /* times the policy switched the draft off */
};

struct k3_draft_run_opts {
	struct k3_draft *draft;      /* NULL: drafting off (every pass plain) */
	struct k3_draft_cost *cost;  /* the engine's pass-cost fit; NULL: a private one */
	uint32_t max_width;          /* proposals per pass at most (0 = 7); capped at
				      * the engine's max_chunk - 1 and the draft's block */
	uint32_t fixed_width;        /* tests, benchmarks: always this many (no policy) */
};

/* One pass's outcome; the arrays live until the next pass. */
struct k3_draft_pass {
	uint32_t n_drafts;           /* proposals verified (0 = plain decode pass) */
	uint32_t accepted;           /* the first `accepted` of them matched */
	const uint32_t *drafts;      /* [n_drafts] */
	const uint32_t *next;        /* [n_drafts + 1]: the target's greedy id after
				      * the anchor and drafts[0..i); next[accepted] is
				      * its own id after the matching prefix */
	const float *logits;         /* [n_drafts + 1][vocab] */
	const uint32_t *route_ids;   /* [n_drafts + 1][n_moe][top_k] */
	const float *route_w;
};

struct k3_draft_run;

/* A run over engine e (which must outlive it). Sets the engine's tap
 * layers to the draft's (cleared by free). Returns 0, -EINVAL or -ENOMEM
 * with err. */
int k3_draft_run_new(struct k3_engine *e, const struct k3_draft_run_opts *o,
		     struct k3_draft_run **out, struct k3_err *err);
/* NULL-safe; does not free the draft. */
void k3_draft_run_free(struct k3_draft_run *r);

/*
 * A prefill chunk: k3_engine_forward(ids[0..n), out) on s, capturing the
 * target rows the draft wants and handing them to it (k3_draft_accept at
 * position len(s)); the pass also feeds the cost fit. n <= max_chunk.
 */
int k3_draft_run_prefill(struct k3_draft_run *r, struct k3_engine_seq *s, const int32_t *ids,
			 uint32_t n, const struct k3_engine_out *out, struct k3_err *err);

/*
 * One pass after ctx[0..n) (every id s consumed, then the anchor
 * ctx[n-1]; n == len(s) + 1). limit: the most proposals worth verifying
 * (the ids the request may still emit after the anchor, minus one).
 * Returns 0 with *p filled, or a negative errno with err (the state of s
 * is then as before the pass, or poisoned: see k3_engine_verify).
 */
int k3_draft_run_pass(struct k3_draft_run *r, struct k3_engine_seq *s, const uint32_t *ctx,
		      size_t n, uint32_t limit, struct k3_draft_pass *p, struct k3_err *err);

/* Keeps the first keep positions of the last pass (1 .. accepted + 1: the
 * anchor and keep - 1 matching proposals) and gives their rows to the
 * draft. After a plain pass keep is 1. Returns 0 or a negative errno. */
int k3_draft_run_commit(struct k3_draft_run *r, struct k3_engine_seq *s, uint32_t keep,
			struct k3_err *err);

const struct k3_draft_stats *k3_draft_run_stats(const struct k3_draft_run *r);
const struct k3_draft_ctl *k3_draft_run_ctl(const struct k3_draft_run *r);

#endif

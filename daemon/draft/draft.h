/*
 * draft.h - the draft interface of speculative decoding (docs/draft.md):
 * a draft proposes up to N ids to follow the accepted context; K3
 * verifies all of them plus the anchor in one pass (k3_engine_verify) and
 * only the prefix equal to its own greedy choice, plus its next id, is
 * committed. A draft only ever proposes: whatever it does, the output ids
 * are those of plain greedy decoding (docs/architecture.md, "Generation").
 *
 * Drafts here: n-gram/suffix matching over the request's own context
 * (draft_ngram.h), the DSpark checkpoint format (draft_dspark.h), and the
 * test drafts "oracle" and "random" (draft_test.h). The per-request loop
 * that proposes, verifies and commits is draft_run.h; the width policy is
 * draft_ctl.h.
 *
 * Threads: a draft is used by one thread at a time (the engine thread).
 */
#ifndef K3_DRAFT_DRAFT_H
#define K3_DRAFT_DRAFT_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "engine/engine.h"

/* The policy a request asks for (k3d --draft, GENERATE.draft_policy, the
 * gateway's "draft" field): the values of GENERATE.draft_policy (UNSET =
 * k3d's default), whose names are proto's (k3_proto_draft_policy_name). */
enum k3_draft_policy {
	K3_DRAFT_POLICY_UNSET = 0,
	K3_DRAFT_POLICY_OFF = 1,     /* plain decoding */
	K3_DRAFT_POLICY_AUTO = 2,    /* DSpark when k3d loaded one, else n-gram */
	K3_DRAFT_POLICY_NGRAM = 3,   /* suffix matching over the context */
	K3_DRAFT_POLICY_DSPARK = 4,  /* the DSpark draft model (--draft-model) */
	K3_DRAFT_POLICY_COUNT
};

struct k3_draft;

/* One draft's behaviour. Every function but free may be called many times
 * per request; propose and accept alternate as the run goes. */
struct k3_draft_ops {
	const char *name;
	/*
	 * Proposes up to max ids to follow ctx[0..n): every id the target has
	 * consumed for this request (positions 0..n-2) and, last, the anchor
	 * ctx[n-1] (the target's newest id, not yet run through it). Within
	 * one request each call's ctx extends the previous call's (rejected
	 * proposals never enter it). Writes out[0..r) and returns r (0..max:
	 * 0 = nothing worth verifying) or a negative errno with err.
	 */
	int (*propose)(struct k3_draft *d, const uint32_t *ctx, size_t n, uint32_t max,
		       uint32_t *out, struct k3_err *err);
	/*
	 * Optional: the target committed n positions starting at position
	 * pos0 (ids[0..n)); taps holds their target rows [n][n_taps][hidden]
	 * at the layers the draft asked for (NULL when it asked for none).
	 * Only committed rows arrive here: rows of rejected proposals never
	 * become draft context. Returns 0 or a negative errno with err.
	 */
	int (*accept)(struct k3_draft *d, uint32_t pos0, const uint32_t *ids, uint32_t n,
		      const float *taps, struct k3_err *err);
	/* Forget the request's context (the next propose starts a new one). */
	void (*reset)(struct k3_draft *d);
	void (*free)(struct k3_draft *d);
};

/* The common head of every draft (drafts embed it first). */
struct k3_draft {
	const struct k3_draft_ops *ops;
	/* the target layers (0-based, ascending) whose rows accept() wants;
	 * the run sets them on the engine (k3_engine_set_taps) */
	uint32_t n_taps;
	uint32_t tap_layers[K3_ENGINE_MAX_TAPS];
	/* the most ids one propose() can return usefully (DSpark: its block) */
	uint32_t max_block;
};

/* Dispatchers (NULL-safe where noted). */
int k3_draft_propose(struct k3_draft *d, const uint32_t *ctx, size_t n, uint32_t max,
		     uint32_t *out, struct k3_err *err);
int k3_draft_accept(struct k3_draft *d, uint32_t pos0, const uint32_t *ids, uint32_t n,
		    const float *taps, struct k3_err *err);
void k3_draft_reset(struct k3_draft *d);
/* NULL-safe. */
void k3_draft_free(struct k3_draft *d);

#endif

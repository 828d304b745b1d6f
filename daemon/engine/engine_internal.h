/*
 * engine_internal.h - what the engine's files share (not a public
 * contract): the engine and sequence structs, the pass's parts, and the
 * steps one file calls in another. engine.c opens, frees and describes;
 * engine_moe.c routes and runs a MoE layer (grouping, tiering, lookahead);
 * engine_pass.c runs a pass (spine binding, attention per sequence,
 * logits) and k3_engine_forward / _batch; engine_verify.c verify and
 * commit.
 */
#ifndef K3_ENGINE_ENGINE_INTERNAL_H
#define K3_ENGINE_ENGINE_INTERNAL_H

#include "engine/engine.h"

#include <errno.h>

#include "model/model.h"

struct k3_engine {
	const struct k3_model *model;
	const struct k3_provider *prov;
	bool prov_pieces;            /* prov has routed_begin/expert/end */
	bool prov_partial;           /* ... and routed_partial */
	bool prov_verify;            /* prov has kda_record_new/free, kda_verify, kda_replay */
	bool prov_export;            /* prov has kda_state_export, mla_cache_export */
	bool prov_resident;          /* ... and experts_resident (a device tier) */
	k3_prov_model *pm;
	struct k3_prov_config cfg;
	struct k3_prov_weights weights;
	struct k3_prov_layer_weights *lw;
	struct k3_expert_source src;
	/* the spine source (has_spine), what open acquired of it, and the
	 * streamed layer (UINT32_MAX: none) and head bound right now */
	struct k3_spine_source spine;
	bool has_spine, prov_bind;
	uint32_t spine_opened;       /* resident layers acquired at open */
	bool head_opened;            /* resident head acquired at open */
	uint32_t bound;
	bool head_bound;
	void *rows;                  /* [chunk][D] embedding rows, up to 4 bytes each */
	const atomic_bool *cancel;   /* polled between layers; may be NULL */
	uint32_t chunk, n_blocks, n_moe, K, D, V;
	uint32_t moe_layers[K3_PROV_MAX_LAYERS];
	int32_t moe_index[K3_PROV_MAX_LAYERS];   /* layer -> MoE ordinal, -1 */
	/* chunk scratch, all in one allocation (alloc_scratch, engine.c) */
	void *scratch;
	float **pool;                /* [n_blocks + 1] of [chunk][D] */
	const float **cands;         /* [n_blocks + 1] */
	float *h, *x, *mb, *z;       /* [chunk][D] */
	float *part;                 /* [chunk][D]: the partial lookahead's residual */
	/* the MoE layer being run: its AttnRes block count and the next MoE
	 * layer (UINT32_MAX: none), for the partial lookahead */
	uint32_t cur_nB, next_moe;
	uint32_t *ids;               /* [chunk][K] */
	float *w;                    /* [chunk][K] */
	struct k3_prov_expert *spans;  /* [chunk][K] */
	/* layer-wide sources: grouping and lookahead scratch */
	uint32_t *stamp;             /* [n_experts]: last group that counted it */
	uint32_t stamp_gen;
	uint32_t *pids;              /* [chunk][K] predicted ids */
	float *pw;                   /* [chunk][K] */
	uint32_t *guess;             /* [chunk][K] deduplicated guesses */
	uint32_t *guess_rank;        /* [chunk][K] each guess's rank (0 = most confident) */
	/* target-row capture (k3_engine_set_taps) */
	uint32_t n_taps;
	int32_t tap_index[K3_PROV_MAX_LAYERS];   /* layer -> tap ordinal, -1 */
	float *tap_out;              /* [T][n_taps][D] of the next calls; NULL = none */
	/* batched passes (k3_engine_forward_batch) */
	int32_t *pass_ids;           /* [chunk]: the parts' ids, end to end */
	float *blog;                 /* [blog_rows][V]: LAST logits of several parts */
	uint32_t blog_rows;
	/* verification (k3_engine_verify / commit); at most one pending per
	 * engine, its records sized for vcap positions (grown on demand) */
	struct k3_engine_seq *pending;
	uint32_t pending_T;
	uint32_t vcap;
	uint32_t v_layers;           /* snapshot path: layers whose snapshot this pass took */
	k3_prov_kda_record **vrec;   /* [L] with prov_verify, NULL for MLA layers */
	k3_prov_kda_state **vsnap;   /* [L] without: the state before the pass */
	float **vh;                  /* [L] without: [vcap][D] the pass's KDA inputs */
	/* experts_resident: a chunk's distinct experts, residency, misses */
	uint32_t *tier_ids, *tier_miss;      /* [chunk][K] */
	uint8_t *tier_res;                   /* [chunk][K] */
};

struct k3_engine_seq {
	struct k3_engine *e;
	uint32_t len;
	bool poisoned;
	k3_prov_kda_state **kda;     /* [L], NULL for MLA layers */
	k3_prov_mla_cache **mla;     /* [L], NULL for KDA layers */
};

/* One sequence's rows of a pass: rows [row0, row0 + n) of the pass's
 * activations; pos0 = where its first position goes in out and taps;
 * last = its call's final chunk (LAST logits come from it). */
struct pass_part {
	struct k3_engine_seq *s;
	uint32_t row0, n, pos0;
	bool last;
	const struct k3_engine_out *out;
	float *taps;
};

static inline int prov_err(const struct k3_engine *e, struct k3_err *err, int rc,
		    const struct k3_prov_status *st)
{
	return k3_err_set(err, rc ? rc : -EIO, "provider '%s': %s", e->prov->name,
			  st->msg[0] ? st->msg : "failed");
}

/* Layer l's weights stream from the spine source (bound per pass). */
static inline bool streamed(const struct k3_engine *e, uint32_t l)
{
	return e->has_spine && l < e->cfg.n_layers && l >= e->spine.resident_layers;
}

/* Returns a provider failure through err (its status message). */
#define PCALL(call) do { rc = (call); if (rc) return prov_err(e, err, rc, &st); } while (0)

/* engine_moe.c: MoE layer l over the pass's n rows (router, the experts
 * for the union of the rows, routes copied into each part's out); the
 * router lookahead for MoE layer next (engine.h, prefetch). */
int engine_moe_layer(struct k3_engine *e, uint32_t l, uint32_t n, const struct pass_part *pp,
		     uint32_t np, struct k3_err *err);
void engine_lookahead(struct k3_engine *e, uint32_t next, uint32_t nB, uint32_t n,
		      const float *last, uint32_t per);

/* engine_pass.c: one pass of n rows (ids end to end) over the parts; the
 * checks forward and verify make before touching s; binding a streamed
 * layer and releasing the bound one. */
int engine_run_chunk(struct k3_engine *e, const int32_t *ids, uint32_t n,
		     const struct pass_part *pp, uint32_t np, bool verify, struct k3_err *err);
int engine_check_call(struct k3_engine *e, const struct k3_engine_seq *s, const int32_t *ids,
		      uint32_t T, struct k3_err *err);
int engine_spine_bind(struct k3_engine *e, uint32_t l, struct k3_err *err);
void engine_spine_unbind(struct k3_engine *e);

/* engine_verify.c: a verification pass's KDA layer without the
 * provider's verify op; the verification buffers' release. */
int engine_verify_kda_snapshot(struct k3_engine *e, struct k3_engine_seq *s, uint32_t l,
			       const float *hin, uint32_t n, float *P, uint32_t flags,
			       struct k3_prov_status *st);
void engine_verify_free(struct k3_engine *e);

#endif

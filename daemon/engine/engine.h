/*
 * engine.h - the Kimi K3 layer program (docs/model.md §4.3) driving a
 * provider (providers/k3_provider.h), and the per-sequence state it
 * advances.
 *
 * The engine does no arithmetic: it decides the schedule (which layer,
 * which AttnRes candidates, which experts, which state) and asks the
 * provider to compute. It returns the logits and, for every MoE layer and
 * position, the route (expert ids in selection order + fp32 weights).
 *
 * Threads: an engine and its sequences are used by one thread at a time
 * (the engine thread); the provider parallelizes inside each op.
 *
 * Determinism: the logits and route of a position are bit-identical
 * whether it runs alone, inside a prefill chunk, or in a multi-token batch,
 * and for any thread count (providers fix reduction orders; the engine
 * never makes a result depend on the batch). Verified by tests/engine.
 */
#ifndef K3_ENGINE_ENGINE_H
#define K3_ENGINE_ENGINE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "k3_provider.h"

struct k3_model;
struct k3_model_config;
struct k3_model_plan;
struct k3_layer_plan;
struct k3_tensor;
struct k3_engine;
struct k3_engine_seq;

/*
 * Where the spine's bytes come from when they are not the model's mmapped
 * tensors (docs/engine.md, "Spine streaming"). Layers 0..resident_layers-1
 * (an immutable prefix) and, when head_resident, the head are resident:
 * the engine acquires them once when it opens (they return at once) and
 * releases them when it is freed. Every later layer, and a streamed head,
 * is acquired in each pass (one chunk of positions) that uses it right
 * before its ops, bound to the provider, and unbound and released right
 * after them, so the source may reuse its memory: a layer streams once per
 * pass, whatever the number of positions in it. The embedding is always
 * gathered row by row for the tokens of the pass. Without a source
 * (engine opts spine == NULL) everything is the model's mmapped tensors,
 * as before spine streaming existed.
 */
struct k3_spine_source {
	void *ctx;
	uint32_t resident_layers;    /* R <= n_layers */
	bool head_resident;
	/* A pass starts (before its embed_rows): the layers come next, in
	 * order, then the head when `logits` (a pass that computes no logits
	 * never acquires the head). Lets a source read the pass's first
	 * streamed layers now and know whether the head belongs to this pass
	 * before it reads past the last layer into the next pass. */
	void (*begin_pass)(void *ctx, bool logits);
	/*
	 * Starts loading `layer` (n_layers: the head) without waiting: the
	 * engine calls it for layer l + 1 when layer l starts, and for the
	 * head when the last layer of a pass that computes logits starts, so
	 * reads overlap compute. A hint: a source may read further ahead on
	 * its own.
	 */
	void (*prefetch_layer)(void *ctx, uint32_t layer);
	/* Waits until `layer` is in memory; *w := its tensors (every field
	 * k3_engine_layer_tensors names, with data), valid until
	 * release_layer. Resident layers return at once. Returns 0 or a
	 * negative errno (a failed read; the message names the layer). */
	int (*acquire_layer)(void *ctx, uint32_t layer, struct k3_prov_layer_weights *w,
			     struct k3_err *err);
	void (*release_layer)(void *ctx, uint32_t layer);
	/* rows[T][D] := the embedding rows of ids[0..T) (each < vocab; T <=
	 * the engine's max_chunk), in the embedding tensor's dtype. */
	int (*embed_rows)(void *ctx, const int32_t *ids, uint32_t T, void *rows,
			  struct k3_err *err);
	/* The head as a layer: fills w's lm_head, norm, out_res_norm and
	 * out_res_proj (k3_engine_head_tensors), valid until release_head. */
	int (*acquire_head)(void *ctx, struct k3_prov_weights *w, struct k3_err *err);
	void (*release_head)(void *ctx);
};

struct k3_engine_opts {
	const char *provider;        /* "cpu" when NULL */
	uint32_t threads;            /* compute threads; 0 = online cores */
	uint32_t max_chunk;          /* positions per provider call; 0 = 64 */
	bool reference;              /* provider's scalar reference path */
	bool split_all;              /* split even tiny ops across threads (tests) */
	bool kda_snapshot;           /* verification snapshots KDA states even when the
				      * provider has kda_verify (tests of the fallback) */
	/* The spine source (copied; its ctx must outlive the engine), or NULL
	 * for the model's mmapped tensors. An open-time choice: the provider
	 * converts a resident layer's small vectors when it opens, and a
	 * streamed tensor's mmapped pages must never be read (they would
	 * count in the process's resident memory). */
	const struct k3_spine_source *spine;
	/* Device expert tier of the provider (k3_prov_open_args,
	 * expert_tier_bytes): 0 = auto, UINT64_MAX = none. */
	uint64_t vram_cache_bytes;
};

/* Fields of struct k3_prov_layer_weights, all struct k3_prov_tensor, in
 * declaration order; k3_engine_layer_field(w, i) is field i. */
enum { K3_ENGINE_LAYER_FIELDS =
	(int)(sizeof(struct k3_prov_layer_weights) / sizeof(struct k3_prov_tensor)) };
/* The head's fields of struct k3_prov_weights: lm_head, norm,
 * out_res_norm, out_res_proj (k3_engine_head_field). */
enum { K3_ENGINE_HEAD_FIELDS = 4 };

/* f[i] := the model tensor behind field i of layer p's provider weights,
 * NULL for fields the layer's kinds do not use: exactly the tensors the
 * engine hands the provider for the layer, i.e. the layer's spine (every
 * tensor it needs but its routed experts). Spine packs and the spine
 * loader (daemon/store/store_spine.h) enumerate layers with it. */
void k3_engine_layer_tensors(const struct k3_layer_plan *p,
			     const struct k3_tensor *f[K3_ENGINE_LAYER_FIELDS]);
/* The same for the head, in K3_ENGINE_HEAD_FIELDS order. */
void k3_engine_head_tensors(const struct k3_model_plan *p,
			    const struct k3_tensor *f[K3_ENGINE_HEAD_FIELDS]);
struct k3_prov_tensor *k3_engine_layer_field(struct k3_prov_layer_weights *w, unsigned i);
struct k3_prov_tensor *k3_engine_head_field(struct k3_prov_weights *w, unsigned i);
/* t as the provider ABI sees it (dtype, ndim, shape) with its bytes at
 * data (NULL: a tensor bound later). A dtype or rank the ABI cannot carry
 * gives K3_PROV_DTYPE_NONE, which the provider refuses. */
struct k3_prov_tensor k3_engine_prov_tensor(const struct k3_tensor *t, const void *data);

/*
 * Where routed-expert bytes come from. The engine decides which experts
 * run (the router's ids) and asks the source for their spans; the provider
 * only computes. acquire fills *out with the six MXFP4 arrays of expert
 * `expert` of layer `layer`, valid until the matching release (called
 * after the layer's routed_experts op). Default: the model's mmapped
 * tensors. The store (RAM cache via pread) supplies its own.
 */
struct k3_expert_source {
	void *ctx;
	int (*acquire)(void *ctx, uint32_t layer, uint32_t expert,
		       struct k3_prov_expert *out, struct k3_err *err);
	void (*release)(void *ctx, uint32_t layer, uint32_t expert);
	/*
	 * Optional layer-wide form, used instead of acquire/release when set:
	 * one call gets every expert a layer needs for a whole chunk,
	 * ids[0..n) = the router's [positions][top_k] ids (duplicates across
	 * positions allowed; a source reads each once), out[i] the spans of
	 * ids[i]. This is what lets a streaming source pin the whole set,
	 * issue its misses together sorted by offset and keep several reads in
	 * flight. release_layer unpins everything the last acquire_layer got;
	 * it is called after the layer's routed_experts op (also on error
	 * paths, only when acquire_layer returned 0).
	 */
	int (*acquire_layer)(void *ctx, uint32_t layer, const uint32_t *ids, size_t n,
			     struct k3_prov_expert *out, struct k3_err *err);
	void (*release_layer)(void *ctx, uint32_t layer);
	/*
	 * Optional, with acquire_layer: starts getting what the next
	 * acquire_layer(ctx, layer, ids, n) will ask for without waiting, so
	 * a streaming source's reads run while the engine computes the shared
	 * experts (called right after the router). After a 0 return the engine
	 * calls either that acquire_layer (same layer and ids, which then only
	 * waits) or, on an error in between, release_layer(layer). These are
	 * demand reads: the real routing, not a guess.
	 */
	int (*request_layer)(void *ctx, uint32_t layer, const uint32_t *ids, size_t n,
			     struct k3_err *err);
	/*
	 * Optional, with request_layer: instead of the acquire_layer after a
	 * request, hands the requested experts out one at a time in the order
	 * they become readable, so the engine computes each as it arrives.
	 * Returns 1 with *expert and *out (its spans, valid until
	 * release_layer), 0 once every distinct expert of the request was
	 * handed out (release_layer follows, as after acquire_layer), or a
	 * negative errno (the source then holds nothing of the request and
	 * release_layer is not called).
	 */
	int (*await_expert)(void *ctx, uint32_t layer, uint32_t *expert,
			    struct k3_prov_expert *out, struct k3_err *err);
	/*
	 * Optional, with await_expert and prefetch: true when the next
	 * await_expert would block (every expert not yet handed out is still
	 * being read). Once at least half of a layer's experts were computed
	 * and this says the rest are not readable yet, the engine runs the
	 * partial lookahead (the next MoE layer's router on the residual
	 * with the experts computed so far; provider routed_partial) and
	 * passes its top guesses to prefetch, so reads of the next layer
	 * queue up before this layer's last reads end instead of after its
	 * compute. Must not block; a wrong answer only moves that lookahead.
	 */
	bool (*would_block)(void *ctx, uint32_t layer);
	/* With acquire_layer: the most distinct experts one acquire_layer may
	 * hold (a RAM cache's slots); 0 = no limit. The engine splits a chunk's
	 * positions into consecutive groups that each fit (results are
	 * identical: routed experts are computed per position). */
	uint32_t max_experts;
	/*
	 * Optional router lookahead: when set, after each MoE layer the engine
	 * runs the NEXT MoE layer's router on the current hidden state (the
	 * residual after this layer, mixed and normed with the next layer's
	 * weights, skipping its attention) and passes the predicted ids,
	 * deduplicated, most confident first, at most prefetch_max of them per
	 * position; and after the embedding, the first MoE layer's router on
	 * it (so its reads overlap the dense layers before it). Guesses only:
	 * the ids that run always come from the real router at that layer.
	 * ranks[i] is ids[i]'s rank in the router order of the first position
	 * that predicted it (0 = most confident); positions = how many
	 * positions the guesses were pooled from (1 in decode); partial: the
	 * guesses come from the partial lookahead (would_block), on a
	 * residual with only part of the previous layer's experts.
	 */
	void (*prefetch)(void *ctx, uint32_t layer, const uint32_t *ids, const uint32_t *ranks,
			 size_t n, uint32_t positions, bool partial);
	uint32_t prefetch_max;       /* guesses per position; 0 = top_k */
};

/* Opens a provider over model (which must outlive the engine) and sizes
 * its scratch; with opts->spine, acquires the source's resident layers
 * (and head) and opens the provider with the streamed ones without data.
 * Returns 0, -ENOENT (unknown provider), -EINVAL (the model uses a
 * feature the provider lacks, or a spine source with a provider that
 * cannot bind layers; message says which), -ENOMEM, or the source's
 * error. */
int k3_engine_open(const struct k3_model *model, const struct k3_engine_opts *opts,
		   struct k3_engine **out, struct k3_err *err);
void k3_engine_free(struct k3_engine *e);

/* Replaces the expert source (NULL restores the model's mmapped tensors).
 * src is copied; src->ctx must outlive its use. */
void k3_engine_set_expert_source(struct k3_engine *e, const struct k3_expert_source *src);

/* Polls *flag (may be NULL: never) before every layer of later forward
 * calls; when it is set, the call returns -ECANCELED and poisons its
 * sequence. The flag must outlive its use. */
void k3_engine_set_cancel(struct k3_engine *e, const atomic_bool *flag);

/* Compute threads for later calls (1..256). */
int k3_engine_set_threads(struct k3_engine *e, uint32_t threads, struct k3_err *err);

/* The provider the engine opened and its model handle (owned by the
 * engine): tests drive single ops of two providers through them. */
const struct k3_provider *k3_engine_provider(const struct k3_engine *e, k3_prov_model **pm);

/* Whether the provider called name can run here (k3d --provider: "cpu",
 * "torch" when built, "auto"): 0, or -ENOENT / -EPROTO with the known
 * names in err (the registry's k3_provider_find). */
int k3_engine_provider_check(const char *name, struct k3_err *err);

/* The provider "auto" picks on this machine ("torch" with a CUDA device,
 * else "cpu"); a static string. */
const char *k3_engine_provider_auto(void);

uint32_t k3_engine_vocab(const struct k3_engine *e);
uint32_t k3_engine_top_k(const struct k3_engine *e);
/* Number of MoE layers and their 0-based layer indices, ascending. */
uint32_t k3_engine_n_moe(const struct k3_engine *e);
const uint32_t *k3_engine_moe_layers(const struct k3_engine *e);

/* A fresh sequence (zero KDA state, empty MLA caches) with room for
 * `capacity` tokens before an MLA cache reallocates. */
int k3_engine_seq_new(struct k3_engine *e, uint32_t capacity,
		      struct k3_engine_seq **out, struct k3_err *err);
/* NULL-safe. */
void k3_engine_seq_free(struct k3_engine_seq *s);
/* *out := an independent copy of src (for branching). */
int k3_engine_seq_clone(struct k3_engine *e, const struct k3_engine_seq *src,
			struct k3_engine_seq **out, struct k3_err *err);
/* Tokens consumed so far. */
uint32_t k3_engine_seq_len(const struct k3_engine_seq *s);

enum k3_engine_logits {
	K3_ENGINE_LOGITS_NONE = 0,   /* no logits (prefill of a prefix) */
	K3_ENGINE_LOGITS_LAST = 1,   /* logits[V] of the last position */
	K3_ENGINE_LOGITS_ALL = 2,    /* logits[T][V], one row per position */
};

/* Caller-owned outputs of one forward call (any pointer may be NULL). */
struct k3_engine_out {
	enum k3_engine_logits logits_mode;
	float *logits;               /* see logits_mode */
	uint32_t *route_ids;         /* [T][n_moe][top_k], selection order */
	float *route_weights;        /* [T][n_moe][top_k] */
};

/*
 * Runs T >= 1 tokens through the model after the s's tokens (prefill when
 * T > 1, decode when T == 1), in chunks of max_chunk, advancing s.
 * Returns 0; -EINVAL (bad id, T == 0, or s failed earlier), -ENOMEM, or a
 * provider/expert-source error. After a failure s is poisoned (every later
 * call returns -EINVAL) because its state may be partly advanced: free it.
 * Allocates nothing once the sequence's MLA caches hold its length.
 */
int k3_engine_forward(struct k3_engine *e, struct k3_engine_seq *s,
		      const int32_t *ids, uint32_t T, const struct k3_engine_out *out,
		      struct k3_err *err);

/*
 * Several sequences in one pass (docs/engine.md, "Batched passes"): one
 * part per sequence, its ids run after that sequence's tokens.
 * out (may be NULL) is indexed from the part's own position 0 exactly as
 * k3_engine_forward's would be for a call with these ids (LOGITS_LAST =
 * the part's last position); taps (may be NULL) is [n][n_taps][hidden]
 * for the part's positions when taps are set (k3_engine_set_taps).
 */
struct k3_engine_part {
	struct k3_engine_seq *seq;
	const int32_t *ids;          /* [n] */
	uint32_t n;                  /* >= 1 */
	const struct k3_engine_out *out;
	float *taps;
};

/*
 * Runs n_parts (1..K3_ENGINE_MAX_PARTS) parts of distinct sequences in
 * ONE pass: one sweep over the layers (a streamed spine layer is read
 * once), each routed expert acquired once for the union of every part's
 * positions; only attention runs per sequence (its own KDA state, its
 * own MLA cache). Every part's logits, routes and taps are bit-identical
 * to running that part alone with k3_engine_forward (the row-invariant
 * kernels, engine.h's Determinism). The parts' positions together must
 * fit one pass: sum n <= k3_engine_max_chunk (-E2BIG otherwise). Errors
 * before anything runs (-EINVAL: a bad id, a poisoned or repeated
 * sequence, one of another engine; -EBUSY: a verification pending on
 * one) leave every sequence as it was; a failure during the pass
 * (-ECANCELED when the engine's cancel flag is set, -ENOMEM, a provider
 * or source error) poisons every part's sequence. Allocates nothing once
 * the caches hold the lengths, except the first time more than one part
 * wants LAST logits at a new width (a buffer of that many rows of vocab
 * floats, kept: the head runs once over the gathered last rows).
 */
enum { K3_ENGINE_MAX_PARTS = 64 };
int k3_engine_forward_batch(struct k3_engine *e, const struct k3_engine_part *parts,
			    uint32_t n_parts, struct k3_err *err);

/* The activation memory a pass of T positions costs, bytes: what an
 * engine opened with max_chunk T allocates per position, and the cpu
 * provider with max_batch T (its rows of the widest operand and four rows
 * per routed slot), without the parts that do not grow with T. K3: about
 * 1.9 MB per position. The daemon sizes its prefill chunk with it (the
 * largest chunk whose scratch fits the budget). */
uint64_t k3_engine_scratch_bytes(const struct k3_model_config *mc, uint32_t T);

/* The share of the memory limit a prefill pass's activations may take by
 * default (k3d --prefill-chunk auto, k3ctl bench): a sixteenth. */
enum { K3_ENGINE_SCRATCH_SHARE = 16 };

/* The longest pass, in [lo, hi] positions, whose k3_engine_scratch_bytes
 * fit scratch_bytes (lo when none does). */
uint32_t k3_engine_chunk_for(const struct k3_model_config *mc, uint64_t scratch_bytes,
			     uint32_t lo, uint32_t hi);
/*
 * Verify and commit (docs/engine.md, "Verify and commit"): speculative
 * decoding's target pass.
 *
 * k3_engine_verify runs ids[0..T) (1 <= T <= the engine's max_chunk) after
 * s's tokens in ONE pass (one sweep over the layers, each routed expert
 * read once for the union of the positions) and fills out exactly as
 * k3_engine_forward would: every position's logits, route and taps are
 * bit-identical to decoding the ids one by one. It publishes nothing:
 * s's length stays, its KDA states are not advanced (the provider runs
 * the recurrence on scratch and records each position's inputs; without
 * that op the engine snapshots each KDA state), and its MLA caches hold
 * the T rows provisionally. Until k3_engine_commit, s refuses forward,
 * verify and clone (-EBUSY), and no other sequence of e may verify. On a
 * failure (cancel included) the provisional rows are dropped and s is as
 * before the call, still usable.
 *
 * k3_engine_commit keeps the first m (0..T) positions: the MLA caches are
 * truncated to len + m and every KDA state gets the first m recorded
 * positions replayed with the per-token routine decode uses, so s then
 * equals, bit for bit, a sequence that decoded exactly those m ids
 * (tests/engine/test_engine_verify.c). m = 0 leaves s as it was. Errors:
 * -EINVAL (no verification pending on s, m > T); a provider failure
 * poisons s.
 *
 * Memory: the records are allocated on the first pass of a new width and
 * kept (k3_engine_verify_record_bytes says how much).
 */
int k3_engine_verify(struct k3_engine *e, struct k3_engine_seq *s, const int32_t *ids,
		     uint32_t T, const struct k3_engine_out *out, struct k3_err *err);
int k3_engine_commit(struct k3_engine *e, struct k3_engine_seq *s, uint32_t m,
		     struct k3_err *err);
/* Whether s has a verification waiting for its commit. */
bool k3_engine_verify_pending(const struct k3_engine *e, const struct k3_engine_seq *s);
/* Bytes the verification buffers of a T-position pass hold: with the
 * provider's verify op, the per-position records ((4 P + H) floats per KDA
 * layer and position for the cpu provider; K3: 13.0 MiB per position);
 * without it, one state snapshot and T input rows per KDA layer. */
size_t k3_engine_verify_record_bytes(const struct k3_engine *e, uint32_t T);

enum { K3_ENGINE_MAX_TAPS = 16 };

/* Target-row capture for drafts (docs/text-and-draft.md §4.4): after each
 * of the n (<= K3_ENGINE_MAX_TAPS) layers (0-based, strictly ascending),
 * later forward and verify calls write the residual stream B[0] + ... +
 * P of every position into the buffer of k3_engine_set_tap_out. n = 0
 * turns it off. -EINVAL for a layer out of range or out of order. */
int k3_engine_set_taps(struct k3_engine *e, const uint32_t *layers, uint32_t n,
		       struct k3_err *err);
/* Where the next forward / verify calls put the taps: dst[T][n_taps][hidden]
 * for the call's positions 0..T-1 (caller-owned, big enough for the
 * call's T); NULL = capture nothing. */
void k3_engine_set_tap_out(struct k3_engine *e, float *dst);
uint32_t k3_engine_n_taps(const struct k3_engine *e);
uint32_t k3_engine_hidden(const struct k3_engine *e);
uint32_t k3_engine_n_layers(const struct k3_engine *e);
/* The most positions one pass (a prefill chunk, a verification) holds. */
uint32_t k3_engine_max_chunk(const struct k3_engine *e);
const struct k3_model *k3_engine_model(const struct k3_engine *e);

/* The bytes of layer `layer`'s state of s (its KDA state or its MLA
 * cache rows), for tests comparing states bit for bit: *n := the size;
 * copied into dst when cap >= *n. -ENOTSUP when the provider cannot
 * export, -ENOSPC when cap is short (*n set), -EINVAL for a bad layer. */
int k3_engine_seq_export(struct k3_engine *e, const struct k3_engine_seq *s, uint32_t layer,
			 void *dst, size_t cap, size_t *n, struct k3_err *err);

/* Index of the largest of n logits, lowest index on ties (greedy). */
uint32_t k3_engine_argmax(const float *logits, uint32_t n);

#endif

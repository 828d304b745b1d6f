/*
 * store_plan.h - the memory planner: one limit, split between every tier
 * that holds bytes (docs/plan.md). Pure arithmetic over the model's
 * config.json (or the bytes an opened checkpoint measured): no I/O but the
 * optional detection of RAM and the cgroup limit.
 *
 *   limit    = min(physical RAM, cgroup memory.max / memory.high,
 *                  --memory-limit)
 *   headroom = max(2 GiB, limit / 10)   (limit from RAM or a cgroup:
 *              allocator slack, page tables, the tokenizer and tensor
 *              table, the kernel's page cache charged to the cgroup)
 *              max(32 MiB, limit / 10)  (limit from --memory-limit: a
 *              target for k3d's own peak RSS, the machine's rest outside)
 *   state    = per sequence: KDA recurrent state and conv window of every
 *              KDA layer + MLA latent cache of every MLA layer for the
 *              configured context (docs/model.md §12)
 *   scratch  = the engine's and the provider's activation buffers for one
 *              pass of max_chunk positions
 *   floor    = the memory one pass needs: headroom + state + scratch +
 *              a ring of two arenas (the largest streamed layer) + top-k
 *              expert slots (one MoE layer's experts pinned at once)
 *
 * Policy (which tier gets memory first; the measurement behind it is in
 * docs/plan.md): a byte of spine kept resident saves one byte read every
 * pass, since a streamed layer is read in full each pass; a byte of expert
 * cache saves hit-rate-gain x expert bytes per token, about 1/(the expert
 * pool's size) of a token's 25.8 GB on K3 under uniform routing (0.018
 * bytes per byte). So, above the floor:
 *   1. everything (every layer, the head, the embedding) resident when it
 *      fits with the expert floor: no ring, the rest to the expert cache
 *      (today's auto budget; the embedding counts only where the spine is
 *      mapped: the spine loader gathers its rows);
 *   2. otherwise the embedding is gathered row by row (T x D x 2 bytes a
 *      pass), and the resident set is the head (lm_head, final norms: read
 *      every pass) and/or the longest prefix of layers 0..R-1 that
 *      maximises the resident spine bytes together with the ring the rest
 *      needs (ties to keeping the head);
 *   3. the expert cache gets what is left, at least the floor, at most the
 *      whole expert pool.
 * --spine-resident N|none|all fixes the spine part instead of 2.
 */
#ifndef K3_STORE_PLAN_H
#define K3_STORE_PLAN_H

#include <stdbool.h>
#include <stdint.h>

#include "base/err.h"
#include "model/inspect.h"
#include "model/model.h"

/* --spine-resident: a layer count N >= 0, or one of these. Every value but
 * DEFAULT means the spine loader serves the spine (store_spine.h), so the
 * embedding is gathered row by row, never held. */
enum {
	K3_STORE_PLAN_RESIDENT_AUTO = -1,    /* the policy above */
	K3_STORE_PLAN_RESIDENT_ALL = -2,     /* every layer and the head, or refuse */
	K3_STORE_PLAN_RESIDENT_NONE = -3,    /* nothing: every layer and the head streamed */
	/* not given: the policy above, and when everything fits (the
	 * embedding too) the spine stays mapped as it always has */
	K3_STORE_PLAN_RESIDENT_DEFAULT = -4,
};

/* Arenas of the spine ring when anything is streamed: layer L+1 is read
 * while layer L computes. */
enum { K3_STORE_PLAN_RING_ARENAS = 2 };

/* k3d's default --context: MLA latent cache reserved per sequence, tokens
 * (capped at the model's max_position_embeddings). */
enum { K3_STORE_PLAN_DEFAULT_CONTEXT = 32768 };

struct k3_store_plan_in {
	const struct k3_model_config *cfg;  /* from config.json alone; required */
	/* Measured bytes of an opened checkpoint (k3_model_bytes); NULL = from
	 * cfg with the release's dtypes (BF16 matrices and norms, F32 conv
	 * taps, A_log, dt_bias, o_norm and routing bias, MXFP4 experts). */
	const struct k3_model_bytes *bytes;
	/* The spine's units as the spine loader holds them in memory (the
	 * aligned extents it reads), overriding cfg and bytes for the spine:
	 * layer_bytes[num_hidden_layers], the head, the embedding, one
	 * embedding row as read. NULL = from bytes or cfg. */
	const uint64_t *layer_bytes;
	uint64_t head_bytes, embed_bytes, embed_row_bytes;
	uint64_t ram_bytes;          /* 0 = detect (sysconf) */
	uint64_t cgroup_bytes;       /* 0 = detect (memory.max and memory.high); UINT64_MAX = none */
	uint64_t memory_limit_bytes; /* --memory-limit; 0 = none */
	uint32_t context_tokens;     /* MLA cache per sequence; 0 = K3_STORE_PLAN_DEFAULT_CONTEXT */
	uint32_t sequences;          /* 0 = 1 (one today; issue 21 raises it) */
	int32_t spine_resident;      /* K3_STORE_PLAN_RESIDENT_* or N layers */
	bool spine_int8;             /* row-wise int8 matrices (an estimate: 1 byte a weight
				      * plus a fp32 scale a row) */
	uint64_t expert_cache_bytes; /* explicit --expert-cache-gb; 0 = auto */
	uint32_t max_chunk;          /* positions per pass (scratch); 0 = 64 */
	uint64_t slot_bytes;         /* one expert cache slot; 0 = the expert's span
				      * rounded up to 4 KiB (a pack's) */
};

struct k3_store_plan_out {
	uint64_t limit_bytes;
	const char *limited_by;      /* "RAM", "cgroup memory.max", "cgroup memory.high",
				      * "--memory-limit" (static string) */
	uint32_t context_tokens, sequences;
	uint32_t n_layers;
	uint32_t resident_layers;    /* the resident prefix 0..R-1 */
	bool head_resident;          /* lm_head, model.norm, output AttnRes norm/proj */
	bool embed_resident;         /* else gathered row by row */
	uint32_t ring_arenas;        /* 0 when nothing is streamed */
	uint64_t arena_bytes;        /* the largest streamed layer (or head), 4 KiB-rounded */
	uint64_t spine_resident_bytes, spine_ring_bytes;
	uint64_t spine_total_bytes;  /* every layer + head + embedding */
	uint64_t expert_cache_bytes; /* expert_slots x slot_bytes */
	uint32_t expert_slots;
	uint64_t slot_bytes;
	uint64_t expert_floor_bytes; /* top_k x slot_bytes */
	uint64_t expert_pool;        /* routed experts in all MoE layers */
	uint64_t state_bytes;        /* KDA state + MLA cache, all sequences */
	uint64_t kda_state_bytes, mla_cache_bytes;   /* its two parts */
	uint64_t scratch_bytes, headroom_bytes, floor_bytes;
	uint64_t unused_bytes;       /* limit minus everything planned (>= 0) */
	/* Bytes one pass reads for the spine when no page is cached: the
	 * streamed layers (and head) in full plus, unless resident, one
	 * embedding row per position (4 KiB-aligned, as O_DIRECT reads it). */
	uint64_t cold_spine_bytes_per_pass;
	uint64_t embed_row_bytes;    /* the embedding part of it, per position */
	/* Routed-expert bytes of a token none of whose experts is cached:
	 * n_moe x top_k x slot_bytes (K3: 92 x 16 x 17,547,264 = 25.8 GB). */
	uint64_t cold_expert_bytes_per_token;
	/* The same with the cache holding expert_slots of expert_pool experts
	 * and routing uniform (the hit rate is slots / pool). */
	uint64_t uniform_expert_bytes_per_token;
	uint64_t layer_spine_bytes[K3_MODEL_MAX_LAYERS];  /* per layer */
	uint64_t embed_bytes, head_bytes;
	bool int8_estimate;          /* spine_int8: matrix bytes estimated */
};

/* Splits the limit (see the top of this file). Returns 0; -EINVAL for a
 * bad input (no cfg, --spine-resident N above the layer count, a model
 * without MoE layers is fine: no expert tier); -ENOMEM below the floor, or
 * when --spine-resident / --expert-cache-gb ask for more than the limit
 * holds, with every number in err (what the limit is and who set it, each
 * tier, the floor). *out is filled as far as it was computed either way. */
int k3_store_plan_compute(const struct k3_store_plan_in *in, struct k3_store_plan_out *out,
			  struct k3_err *err);

/* The plan of an opened checkpoint (k3d and k3ctl bench): in->cfg and
 * in->bytes from m (its measured bytes), then, when the plan needs the
 * spine loader (in->spine_resident given, or a spine that does not all
 * stay resident), again with the loader's own unit sizes
 * (k3_store_spine_sizes), so the split holds exactly what the loader will.
 * *streams says whether the spine loader serves the spine. The other
 * fields of *in are the caller's. Returns as k3_store_plan_compute, or
 * -ENOMEM / -EINVAL from measuring. */
struct k3_model;
int k3_store_plan_model(const struct k3_model *m, struct k3_store_plan_in *in,
			struct k3_store_plan_out *out, bool *streams, struct k3_err *err);

/* Bytes of layer l's spine tensors (everything but routed experts), of
 * the embedding, of the head, and of one routed expert (the six MXFP4
 * arrays, or the three BF16 matrices of an unquantized model), from cfg
 * with the release's dtypes; int8 estimates row-wise int8 matrices. */
uint64_t k3_store_plan_layer_bytes(const struct k3_model_config *cfg, uint32_t l, bool int8);
uint64_t k3_store_plan_embed_bytes(const struct k3_model_config *cfg);
uint64_t k3_store_plan_head_bytes(const struct k3_model_config *cfg, bool int8);
uint64_t k3_store_plan_expert_bytes(const struct k3_model_config *cfg);

/* Parses a --spine-resident value: "auto", "all", "none" or a layer count
 * (0..K3_MODEL_MAX_LAYERS; "0" keeps the head when it fits, "none" does
 * not). Returns 0 or -EINVAL with the reason. */
int k3_store_plan_parse_resident(const char *s, int32_t *out, struct k3_err *err);

/* "auto", "all", "none", "default" or the number, into buf (>= 16 bytes). */
const char *k3_store_plan_resident_name(int32_t v, char *buf, unsigned n);

#endif

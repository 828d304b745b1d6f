/*
 * store_plan.c - the memory planner (see store_plan.h): tier sizes from
 * the config (or measured bytes), the fixed reserves, the policy's choice
 * of resident spine, the expert cache from the rest, and the floor with
 * every number when the limit is below it.
 */
#include "store/store_plan.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/parse.h"
#include "store/store_budget.h"
#include "store/store_spine.h"

#define KIB ((uint64_t)1 << 10)
#define MIB ((uint64_t)1 << 20)
#define GIB ((uint64_t)1 << 30)
#define ALIGN 4096u

static uint64_t round_up(uint64_t v, uint64_t a)
{
	return (v + a - 1) / a * a;
}

static uint64_t max_u64(uint64_t a, uint64_t b)
{
	return a > b ? a : b;
}

/* ---- bytes from the config (docs/model.md §2, the release's dtypes) ---- */

/* A [rows, cols] matrix: BF16, or (int8) one byte a weight, the per-row
 * fp32 scales at the next 64-byte boundary. A [1, D] row (the AttnRes
 * projections) is no linear operand and stays BF16. */
static uint64_t mat(uint64_t rows, uint64_t cols, bool int8)
{
	if (int8 && rows > 1)
		return round_up(rows * cols, 64) + rows * 4;
	return rows * cols * 2;
}

uint64_t k3_store_plan_layer_bytes(const struct k3_model_config *c, uint32_t l, bool int8)
{
	uint64_t D = c->hidden_size, b = 2 * D * 2;   /* input / post-attention norms */

	if (l >= c->num_hidden_layers)
		return 0;
	if (c->attn_res_block_size)
		b += 2 * D * 2 + 2 * mat(1, D, int8);
	if (c->is_kda[l]) {
		uint64_t P = c->kda_width, dk = c->kda_head_dim, H = c->kda_num_heads;
		b += 3 * mat(P, D, int8) + mat(D, P, int8);          /* q, k, v; o */
		b += c->use_full_rank_gate ? mat(P, D, int8) : mat(dk, D, int8) + mat(P, dk, int8);
		b += 3 * P * c->short_conv_kernel_size * 4;          /* conv taps, F32 */
		b += mat(dk, D, int8) + mat(P, dk, int8);            /* f_a, f_b */
		b += max_u64(dk, H) * 4 + P * 4 + dk * 4;             /* A_log (padded), dt_bias, o_norm */
		b += mat(H, D, int8);                                 /* b_proj */
	} else {
		uint64_t H = c->num_attention_heads, q = c->mla_q_head_dim;
		if (c->q_lora_rank)
			b += mat(c->q_lora_rank, D, int8) + (uint64_t)c->q_lora_rank * 2 +
			     mat(H * q, c->q_lora_rank, int8);
		else
			b += mat(H * q, D, int8);
		b += mat(c->mla_kv_a_width, D, int8) + (uint64_t)c->kv_lora_rank * 2;
		b += mat(H * (c->qk_nope_head_dim + c->v_head_dim), c->kv_lora_rank, int8);
		if (c->mla_use_output_gate)
			b += mat(c->mla_attn_width, D, int8);
		b += mat(D, c->mla_attn_width, int8);
	}
	if (c->is_moe[l]) {
		uint64_t E = c->num_experts, lat = c->routed_expert_hidden_size, sw = c->shared_width;
		b += mat(E, D, int8) + E * 4;                         /* router, F32 bias */
		if (lat)
			b += 2 * mat(lat, D, int8) + (c->latent_moe_use_norm ? lat * 2 : 0);
		if (sw)
			b += 2 * mat(sw, D, int8) + mat(D, sw, int8);
	} else {
		b += 2 * mat(c->intermediate_size, D, int8) + mat(D, c->intermediate_size, int8);
	}
	return b;
}

uint64_t k3_store_plan_embed_bytes(const struct k3_model_config *c)
{
	/* Rows are gathered, not multiplied: never int8. */
	return (uint64_t)c->vocab_size * c->hidden_size * 2;
}

uint64_t k3_store_plan_head_bytes(const struct k3_model_config *c, bool int8)
{
	uint64_t D = c->hidden_size;

	return mat(c->vocab_size, D, int8) + D * 2 + (c->attn_res_block_size ? 2 * D * 2 : 0);
}

uint64_t k3_store_plan_expert_bytes(const struct k3_model_config *c)
{
	uint64_t in = c->expert_in, w = c->moe_intermediate_size;

	if (!c->num_experts)
		return 0;
	if (!c->quant_mxfp4)
		return 3 * in * w * 2;
	/* w1, w3 [w, in] and w2 [in, w]: packed nibbles + one E8M0 byte per 32 */
	return 2 * (w * in / 2 + w * in / 32) + (in * w / 2 + in * w / 32);
}

/* ---- reserves ---- */

/* KDA state and MLA cache (docs/model.md §12) as the cpu provider
 * allocates them: a KDA layer holds its conv window (the last K-1 raw
 * q, k, v projections) and the fp32 recurrent state; an MLA layer's cache
 * grows by doubling, so `context` tokens cost the next power of two of
 * latent rows (kv_lora + rope floats) and scores, plus the provider's one
 * score row per head of that length. */
static void state_bytes(const struct k3_model_config *c, uint32_t context, uint32_t seqs,
			uint64_t *kda, uint64_t *mla)
{
	uint64_t cap = 16;

	while (cap < context)
		cap *= 2;
	*kda = (uint64_t)seqs * c->n_kda *
	       ((uint64_t)3 * (c->short_conv_kernel_size - 1) * c->kda_width +
		(uint64_t)c->kda_num_heads * c->kda_head_dim * c->kda_head_dim) * 4;
	*mla = c->n_mla ? (uint64_t)seqs * c->n_mla * cap * (c->mla_kv_a_width + 1) * 4 +
			  (uint64_t)c->num_attention_heads * cap * 4 : 0;
}

/* Activation buffers of one pass of B positions, as daemon/engine/engine.c
 * (the residual rows and AttnRes block pool) and providers/cpu (cpu_open:
 * eight rows of the widest operand, the experts' four rows per routed
 * slot, the MLA and KDA work rows) allocate them, plus the logits row and
 * the spine loader's buffer of B embedding rows (row_bytes each, as an
 * O_DIRECT read of a row spans). */
static uint64_t scratch_bytes(const struct k3_model_config *c, uint64_t B, uint64_t row_bytes)
{
	uint64_t D = c->hidden_size, H = c->num_attention_heads, K = c->num_experts_per_token;
	uint64_t blocks = c->n_attn_res_blocks ? c->n_attn_res_blocks : 1;
	uint64_t wide = D;
	uint64_t w[] = { c->kda_width, H * c->mla_q_head_dim, c->mla_attn_width,
			 H * (c->qk_nope_head_dim + c->v_head_dim), c->intermediate_size,
			 c->shared_width, c->q_lora_rank, c->mla_kv_a_width, c->expert_in,
			 c->moe_intermediate_size, c->num_experts };
	for (size_t i = 0; i < sizeof(w) / sizeof(w[0]); i++)
		wide = max_u64(wide, w[i]);
	uint64_t ew = max_u64(c->expert_in, c->moe_intermediate_size);
	uint64_t engine = (5 + blocks + 1) * B * D * 4 + B * (K ? K : 1) * 32;
	uint64_t prov = B * D * 4 + 8 * B * wide * 4 + 2 * wide * 4 +
			4 * B * (K ? K : 1) * ew * 4 +
			H * (c->mla_kv_a_width + 1) * 4 + H * (c->kv_lora_rank + 1) * 4 +
			6 * (uint64_t)c->kda_head_dim * c->kda_num_heads * 4;
	uint64_t out = 2 * (uint64_t)c->vocab_size * 4 + B * row_bytes;
	return engine + prov + out;
}

/* ---- the limit ---- */

/* The smallest headroom: the machine's limit also covers the kernel's and
 * the system's own use; --memory-limit is a target for k3d's peak RSS. */
static uint64_t least_headroom(const char *limited_by)
{
	return strcmp(limited_by, "--memory-limit") == 0 ? 32 * MIB : 2 * GIB;
}

static int find_limit(const struct k3_store_plan_in *in, struct k3_store_plan_out *o,
		      struct k3_err *err)
{
	uint64_t ram = in->ram_bytes, max = UINT64_MAX, high = UINT64_MAX;

	if (ram == 0) {
		long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
		if (pages <= 0 || page <= 0)
			return k3_err_set(err, -EINVAL, "cannot read the physical memory size");
		ram = (uint64_t)pages * (uint64_t)page;
	}
	if (in->cgroup_bytes == 0) {
		struct k3_store_budget_cgroup cg;
		int rc = k3_store_budget_cgroup_limits("/proc/self/cgroup", "/sys/fs/cgroup", &cg, err);
		if (rc)
			return rc;
		max = cg.max_bytes;
		high = cg.high_bytes;
	} else {
		max = in->cgroup_bytes;
	}
	o->limit_bytes = ram;
	o->limited_by = "RAM";
	if (max < o->limit_bytes) {
		o->limit_bytes = max;
		o->limited_by = "cgroup memory.max";
	}
	if (high < o->limit_bytes) {
		o->limit_bytes = high;
		o->limited_by = "cgroup memory.high";
	}
	if (in->memory_limit_bytes && in->memory_limit_bytes < o->limit_bytes) {
		o->limit_bytes = in->memory_limit_bytes;
		o->limited_by = "--memory-limit";
	}
	o->headroom_bytes = max_u64(least_headroom(o->limited_by), o->limit_bytes / 10);
	return 0;
}

/* ---- the spine's resident set ---- */

struct spine {
	const uint64_t *layer;   /* [L] */
	uint32_t L;
	uint64_t head, embed;
	uint64_t prefix[K3_MODEL_MAX_LAYERS + 1];   /* prefix[R] = bytes of layers 0..R-1 */
	uint64_t suffix_max[K3_MODEL_MAX_LAYERS + 1];   /* largest of layers R..L-1 */
};

static void spine_init(struct spine *s, const uint64_t *layer, uint32_t L, uint64_t head,
		       uint64_t embed)
{
	s->layer = layer;
	s->L = L;
	s->head = head;
	s->embed = embed;
	s->prefix[0] = 0;
	for (uint32_t l = 0; l < L; l++)
		s->prefix[l + 1] = s->prefix[l] + layer[l];
	s->suffix_max[L] = 0;
	for (uint32_t l = L; l-- > 0;)
		s->suffix_max[l] = max_u64(layer[l], s->suffix_max[l + 1]);
}

/* The ring streaming layers R..L-1 (and the head unless resident) needs:
 * K3_STORE_PLAN_RING_ARENAS arenas of the largest of them, 0 when nothing
 * streams. */
static uint64_t ring_of(const struct spine *s, uint32_t R, bool head, uint64_t *arena)
{
	*arena = 0;
	if (R >= s->L && head)
		return 0;
	*arena = round_up(max_u64(s->suffix_max[R], head ? 0 : s->head), ALIGN);
	return K3_STORE_PLAN_RING_ARENAS * *arena;
}

static uint64_t resident_of(const struct spine *s, uint32_t R, bool head)
{
	return s->prefix[R] + (head ? s->head : 0);
}

/* Picks R and the head for `avail` bytes: the most resident bytes whose
 * ring still fits (ties to the head). Returns false when even nothing
 * resident does not fit. R_fixed >= 0 fixes the prefix (the head is then
 * kept when it fits). */
static bool choose(const struct spine *s, uint64_t avail, int64_t R_fixed, uint32_t *R_out,
		   bool *head_out)
{
	bool found = false;
	uint64_t best = 0, arena;

	for (int h = 1; h >= 0; h--) {
		uint32_t lo = R_fixed >= 0 ? (uint32_t)R_fixed : 0;
		uint32_t hi = R_fixed >= 0 ? (uint32_t)R_fixed : s->L;
		for (uint32_t R = lo; R <= hi; R++) {
			uint64_t need = resident_of(s, R, h) + ring_of(s, R, h, &arena);
			if (need > avail)
				continue;
			if (!found || resident_of(s, R, h) > best) {
				found = true;
				best = resident_of(s, R, h);
				*R_out = R;
				*head_out = h;
			}
		}
	}
	return found;
}

/* ---- the plan ---- */

static void fill_tiers(const struct k3_store_plan_in *in, struct k3_store_plan_out *o)
{
	const struct k3_model_config *c = in->cfg;
	const struct k3_model_bytes *b = in->bytes;

	o->n_layers = c->num_hidden_layers;
	for (uint32_t l = 0; l < o->n_layers; l++)
		o->layer_spine_bytes[l] = in->layer_bytes ? in->layer_bytes[l]
					  : b ? b->layer[l].attn + b->layer[l].norms + b->layer[l].mlp +
						b->layer[l].moe_spine
					  : k3_store_plan_layer_bytes(c, l, in->spine_int8);
	o->embed_bytes = in->layer_bytes ? in->embed_bytes : b ? b->embed : k3_store_plan_embed_bytes(c);
	o->head_bytes = in->layer_bytes ? in->head_bytes : b ? b->lm_head + b->final
							  : k3_store_plan_head_bytes(c, in->spine_int8);
	o->int8_estimate = in->spine_int8 && !b && !in->layer_bytes;
	o->spine_total_bytes = o->embed_bytes + o->head_bytes;
	for (uint32_t l = 0; l < o->n_layers; l++)
		o->spine_total_bytes += o->layer_spine_bytes[l];
	o->slot_bytes = in->slot_bytes ? in->slot_bytes
				       : round_up(b && b->expert_span ? b->expert_span
								      : k3_store_plan_expert_bytes(c),
						  ALIGN);
	o->expert_pool = (uint64_t)c->n_moe * c->num_experts;
	o->expert_floor_bytes = c->n_moe ? (uint64_t)c->num_experts_per_token * o->slot_bytes : 0;
	/* One embedding row per position, as an O_DIRECT read of it touches
	 * at most: the row's 4 KiB pages plus one for an unaligned start. */
	o->embed_row_bytes = in->layer_bytes && in->embed_row_bytes
			     ? in->embed_row_bytes
			     : round_up((uint64_t)c->hidden_size * 2, ALIGN) + ALIGN;
}

static void fill_traffic(const struct k3_model_config *c, struct k3_store_plan_out *o)
{
	o->cold_spine_bytes_per_pass = o->head_resident ? 0 : o->head_bytes;
	for (uint32_t l = o->resident_layers; l < o->n_layers; l++)
		o->cold_spine_bytes_per_pass += o->layer_spine_bytes[l];
	if (!o->embed_resident)
		o->cold_spine_bytes_per_pass += o->embed_row_bytes;
	o->cold_expert_bytes_per_token = (uint64_t)c->n_moe * c->num_experts_per_token * o->slot_bytes;
	double miss = o->expert_pool ? 1.0 - (double)o->expert_slots / (double)o->expert_pool : 0;
	o->uniform_expert_bytes_per_token = (uint64_t)((double)o->cold_expert_bytes_per_token *
						       (miss > 0 ? miss : 0));
}

/* Bytes in GB (10^9) for messages, three decimals. */
#define GB(x) ((double)(x) / 1e9)

static int below(struct k3_err *err, const struct k3_store_plan_out *o, const char *what,
		 uint64_t need)
{
	return k3_err_set(err, -ENOMEM,
			  "%s: the memory limit is %" PRIu64 " bytes (%.3f GB, %s); this needs %" PRIu64
			  " bytes (%.3f GB): headroom %.3f GB, state %.3f GB (KDA %.3f + MLA %.3f for %u"
			  " tokens, %u sequence(s)), scratch %.3f GB, spine ring %u x %.3f GB, "
			  "resident spine %.3f GB, expert cache %.3f GB (floor %.3f GB: %" PRIu64
			  " experts of %" PRIu64 " bytes); the floor, the smallest limit one pass fits "
			  "in, is %" PRIu64 " bytes (%.3f GB)",
			  what, o->limit_bytes, GB(o->limit_bytes), o->limited_by, need, GB(need),
			  GB(o->headroom_bytes), GB(o->state_bytes), GB(o->kda_state_bytes),
			  GB(o->mla_cache_bytes), o->context_tokens, o->sequences, GB(o->scratch_bytes),
			  o->ring_arenas, GB(o->arena_bytes), GB(o->spine_resident_bytes),
			  GB(o->expert_cache_bytes), GB(o->expert_floor_bytes),
			  o->slot_bytes ? o->expert_floor_bytes / o->slot_bytes : 0, o->slot_bytes,
			  o->floor_bytes, GB(o->floor_bytes));
}

int k3_store_plan_compute(const struct k3_store_plan_in *in, struct k3_store_plan_out *o,
			  struct k3_err *err)
{
	const struct k3_model_config *c = in->cfg;
	struct spine sp;
	int rc;

	memset(o, 0, sizeof(*o));
	if (!c)
		return k3_err_set(err, -EINVAL, "the planner needs the model's config");
	if (in->spine_resident < K3_STORE_PLAN_RESIDENT_DEFAULT ||
	    (in->spine_resident >= 0 && (uint32_t)in->spine_resident > c->num_hidden_layers))
		return k3_err_set(err, -EINVAL, "--spine-resident %" PRId32 ": the model has %u layers",
				  in->spine_resident, c->num_hidden_layers);
	if ((rc = find_limit(in, o, err)))
		return rc;
	fill_tiers(in, o);
	o->context_tokens = in->context_tokens ? in->context_tokens : K3_STORE_PLAN_DEFAULT_CONTEXT;
	o->sequences = in->sequences ? in->sequences : 1;
	state_bytes(c, o->context_tokens, o->sequences, &o->kda_state_bytes, &o->mla_cache_bytes);
	o->state_bytes = o->kda_state_bytes + o->mla_cache_bytes;
	o->scratch_bytes = scratch_bytes(c, in->max_chunk ? in->max_chunk : 64, o->embed_row_bytes);
	spine_init(&sp, o->layer_spine_bytes, o->n_layers, o->head_bytes, o->embed_bytes);

	/* The floor: the smallest limit one pass fits in: the reserves, one
	 * MoE layer's experts, the cheaper of everything resident or
	 * everything streamed, and the headroom that limit itself implies. */
	uint64_t arena0, fixed = o->headroom_bytes + o->state_bytes + o->scratch_bytes;
	uint64_t ring0 = ring_of(&sp, 0, false, &arena0);
	/* The spine loader gathers embedding rows; a mapped spine holds them. */
	bool gather = in->spine_resident != K3_STORE_PLAN_RESIDENT_DEFAULT;
	uint64_t all_bytes = o->spine_total_bytes - (gather ? o->embed_bytes : 0);
	uint64_t spine_min = all_bytes < ring0 ? all_bytes : ring0;
	uint64_t need = o->state_bytes + o->scratch_bytes + o->expert_floor_bytes + spine_min;
	uint64_t least = least_headroom(o->limited_by);
	o->floor_bytes = need + least > 10 * least ? (need * 10 + 8) / 9 : need + least;

	uint64_t experts = o->expert_floor_bytes;
	if (in->expert_cache_bytes && c->n_moe) {
		uint64_t slots = in->expert_cache_bytes / o->slot_bytes;
		/* More than every expert buys nothing. */
		if (slots > o->expert_pool)
			slots = o->expert_pool;
		experts = slots * o->slot_bytes;
		if (experts < o->expert_floor_bytes) {
			o->expert_cache_bytes = experts;
			return k3_err_set(err, -ENOMEM, "--expert-cache-gb: an expert cache of %" PRIu64
					  " bytes (%" PRIu64 " slots) is below the floor of %" PRIu64
					  " bytes: one token pins %u experts of %" PRIu64 " bytes in each "
					  "MoE layer", in->expert_cache_bytes, slots, o->expert_floor_bytes,
					  c->num_experts_per_token, o->slot_bytes);
		}
	}
	o->expert_cache_bytes = experts;
	if (o->limit_bytes < o->floor_bytes || o->limit_bytes < fixed + experts + spine_min) {
		o->ring_arenas = ring0 ? K3_STORE_PLAN_RING_ARENAS : 0;
		o->arena_bytes = arena0;
		return below(err, o, in->expert_cache_bytes ? "--expert-cache-gb" : "below the floor",
			     fixed + experts + spine_min);
	}
	uint64_t avail = o->limit_bytes - fixed - experts;   /* for the spine and more cache */

	/* The spine's resident set. */
	uint32_t R = 0;
	bool head = false, embed = false;
	int32_t want = in->spine_resident == K3_STORE_PLAN_RESIDENT_DEFAULT
		       ? K3_STORE_PLAN_RESIDENT_AUTO : in->spine_resident;
	if ((want == K3_STORE_PLAN_RESIDENT_AUTO || want == K3_STORE_PLAN_RESIDENT_ALL ||
	     (want >= 0 && (uint32_t)want == o->n_layers)) &&
	    all_bytes <= avail) {
		R = o->n_layers;
		head = true;
		embed = !gather;
	} else if (want == K3_STORE_PLAN_RESIDENT_ALL) {
		o->spine_resident_bytes = all_bytes;
		return below(err, o, "--spine-resident all", fixed + experts + all_bytes);
	} else if (want == K3_STORE_PLAN_RESIDENT_NONE) {
		if (ring0 > avail) {
			o->spine_ring_bytes = ring0;
			o->arena_bytes = arena0;
			o->ring_arenas = K3_STORE_PLAN_RING_ARENAS;
			return below(err, o, "--spine-resident none", fixed + experts + ring0);
		}
	} else if (!choose(&sp, avail, want >= 0 ? want : -1, &R, &head)) {
		/* Only a fixed prefix can fail here: R = 0 fits (the floor). */
		o->resident_layers = (uint32_t)want;
		o->spine_resident_bytes = resident_of(&sp, (uint32_t)want, false);
		o->spine_ring_bytes = ring_of(&sp, (uint32_t)want, false, &o->arena_bytes);
		o->ring_arenas = o->spine_ring_bytes ? K3_STORE_PLAN_RING_ARENAS : 0;
		char what[64];
		snprintf(what, sizeof(what), "--spine-resident %" PRId32, want);
		return below(err, o, what, fixed + experts + o->spine_resident_bytes + o->spine_ring_bytes);
	}
	o->resident_layers = R;
	o->head_resident = head;
	o->embed_resident = embed;
	o->spine_resident_bytes = resident_of(&sp, R, head) + (embed ? o->embed_bytes : 0);
	o->spine_ring_bytes = ring_of(&sp, R, head, &o->arena_bytes);
	o->ring_arenas = o->spine_ring_bytes ? K3_STORE_PLAN_RING_ARENAS : 0;
	uint64_t rest = avail - o->spine_resident_bytes - o->spine_ring_bytes;

	/* The expert cache: the rest, in whole slots, at most every expert. */
	if (!in->expert_cache_bytes && c->n_moe) {
		uint64_t slots = (experts + rest) / o->slot_bytes;
		if (slots > o->expert_pool)
			slots = o->expert_pool;
		o->expert_cache_bytes = slots * o->slot_bytes;
	}
	if (o->slot_bytes && o->expert_cache_bytes / o->slot_bytes > UINT32_MAX)
		o->expert_cache_bytes = (uint64_t)UINT32_MAX * o->slot_bytes;
	o->expert_slots = o->slot_bytes ? (uint32_t)(o->expert_cache_bytes / o->slot_bytes) : 0;
	o->unused_bytes = o->limit_bytes - fixed - o->spine_resident_bytes - o->spine_ring_bytes -
			  o->expert_cache_bytes;
	fill_traffic(c, o);
	return 0;
}

/* ---- an opened checkpoint ---- */

int k3_store_plan_model(const struct k3_model *m, struct k3_store_plan_in *in,
			struct k3_store_plan_out *out, bool *streams, struct k3_err *err)
{
	struct k3_model_bytes *b = malloc(sizeof(*b));
	struct k3_store_spine_sizes *z = NULL;
	int rc;

	*streams = false;
	if (!b)
		return k3_err_set(err, -ENOMEM, "out of memory");
	k3_model_bytes(m, b);
	in->cfg = k3_model_config(m);
	in->bytes = b;
	in->layer_bytes = NULL;
	/* By default the mapped spine's bytes decide whether it streams at all;
	 * an explicit --spine-resident is the loader's from the start. */
	if (in->spine_resident == K3_STORE_PLAN_RESIDENT_DEFAULT) {
		rc = k3_store_plan_compute(in, out, err);
		*streams = rc == 0 && (out->resident_layers < out->n_layers || !out->head_resident);
	} else {
		rc = 0;
		*streams = true;
	}
	if (*streams) {
		/* Again with exactly what the loader holds: its units' aligned
		 * extents, and a row buffer of O_DIRECT-aligned rows. */
		if (!(z = malloc(sizeof(*z))))
			rc = k3_err_set(err, -ENOMEM, "out of memory");
		else if ((rc = k3_store_spine_sizes(m, z, err)) == 0) {
			in->layer_bytes = z->layer;
			in->head_bytes = z->head;
			in->embed_bytes = z->embed;
			in->embed_row_bytes = round_up(z->embed_row + ALIGN - 1, ALIGN);
			rc = k3_store_plan_compute(in, out, err);
		}
	}
	in->bytes = NULL;
	in->layer_bytes = NULL;
	free(z);
	free(b);
	return rc;
}

/* ---- spellings ---- */

int k3_store_plan_parse_resident(const char *s, int32_t *out, struct k3_err *err)
{
	uint64_t v;

	if (strcmp(s, "auto") == 0)
		*out = K3_STORE_PLAN_RESIDENT_AUTO;
	else if (strcmp(s, "all") == 0)
		*out = K3_STORE_PLAN_RESIDENT_ALL;
	else if (strcmp(s, "none") == 0)
		*out = K3_STORE_PLAN_RESIDENT_NONE;
	else if (k3_parse_u64(s, 0, K3_MODEL_MAX_LAYERS, &v, NULL) == 0)
		*out = (int32_t)v;
	else
		return k3_err_set(err, -EINVAL, "--spine-resident '%s': expected auto, all, none or a "
				  "layer count (0..%u)", s, K3_MODEL_MAX_LAYERS);
	return 0;
}

const char *k3_store_plan_resident_name(int32_t v, char *buf, unsigned n)
{
	if (v == K3_STORE_PLAN_RESIDENT_AUTO)
		return "auto";
	if (v == K3_STORE_PLAN_RESIDENT_ALL)
		return "all";
	if (v == K3_STORE_PLAN_RESIDENT_NONE)
		return "none";
	if (v == K3_STORE_PLAN_RESIDENT_DEFAULT)
		return "default";
	snprintf(buf, n, "%" PRId32, v);
	return buf;
}

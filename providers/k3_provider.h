/*
 * k3_provider.h - the provider ABI: how the engine (daemon/engine) drives
 * the arithmetic of one Kimi K3 forward pass without doing any itself.
 *
 * The engine owns the schedule (which layer, which experts, which
 * snapshots feed which mix); a provider owns the weights' in-memory form and
 * every floating-point operation, as coarse sub-layer operations
 * (docs/architecture.md, "Providers"). Math references are to
 * docs/model.md ("spec §n").
 *
 * ABI rules (version 1):
 *  - Every struct crossing the ABI starts with its size (struct_size) or is
 *    versioned by K3_PROVIDER_ABI_VERSION; a provider refuses an older or
 *    newer version and a struct shorter than the one it was built with.
 *  - Handles are opaque; each `*_new` has a matching `*_free` that accepts
 *    NULL. Nothing throws or longjmps across the ABI: every fallible call
 *    returns 0 or a negative errno and, on failure, fills
 *    `struct k3_prov_status` (may be NULL) with a message for a person.
 *  - Activations cross as host fp32 arrays, row-major [T][width] for T
 *    positions. A device provider keeps its own mirrors.
 *  - Batch invariance (docs/architecture.md, "Generation"): the result for
 *    position t of every operation is bit-identical whatever T is,
 *    whichever other positions share the call, and whatever the thread
 *    count. Providers fix each output element's reduction order.
 *  - Weights are borrowed: tensors handed to open() must outlive the model
 *    handle (they are normally mmapped checkpoint bytes). Expert spans
 *    handed to routed_experts() need only live for that call. A streamed
 *    spine (bind_layer, bind_head, embed_rows below) hands open() a
 *    layer's, the head's or the embedding's tensors without data; their
 *    bytes are then borrowed only between a bind and the next one.
 */
#ifndef K3_PROVIDER_H
#define K3_PROVIDER_H

#include <stddef.h>
#include <stdint.h>

#define K3_PROVIDER_ABI_VERSION 1u

enum { K3_PROV_MSG_MAX = 256 };

struct k3_prov_status {
	int32_t code;                /* negative errno; 0 when unset */
	char msg[K3_PROV_MSG_MAX];   /* NUL-terminated */
};

enum k3_prov_dtype {
	K3_PROV_DTYPE_NONE = 0,      /* tensor absent */
	K3_PROV_DTYPE_F32 = 1,
	K3_PROV_DTYPE_BF16 = 2,
	K3_PROV_DTYPE_U8 = 3,
	/* A 2-D matrix [rows][cols] stored row-wise int8 with one fp32 scale
	 * per row (the int8 spine: NOT the checkpoint's weights, see
	 * docs/formats.md "int8 spine overlay"): data points at q[rows][cols]
	 * int8, then at data + K3_PROV_I8_SCALE_OFFSET(rows, cols) come
	 * [rows] fp32 scales; value[r][c] = q[r][c] * scale[r]. data must be
	 * 4-byte aligned. Only for matrices that are the operand of a linear
	 * op; a provider refuses it elsewhere (norms, conv taps, A_log,
	 * dt_bias, the router bias stay BF16/F32) and says which tensor. */
	K3_PROV_DTYPE_I8 = 4,
};

/* Byte offset of an I8 tensor's scales from its data: rows * cols rounded
 * up to 64 (the gap is zero); the tensor's bytes are that plus 4 * rows. */
#define K3_PROV_I8_SCALE_OFFSET(rows, cols) \
	((((uint64_t)(rows) * (uint64_t)(cols)) + 63u) & ~(uint64_t)63u)
#define K3_PROV_I8_BYTES(rows, cols) \
	(K3_PROV_I8_SCALE_OFFSET(rows, cols) + 4u * (uint64_t)(rows))

/* A borrowed, dense, row-major tensor. Unused trailing dims are 1. */
struct k3_prov_tensor {
	const void *data;
	uint32_t dtype;              /* enum k3_prov_dtype */
	uint32_t ndim;               /* 1..3 */
	uint64_t shape[3];
};

enum k3_prov_attn_kind { K3_PROV_ATTN_KDA = 1, K3_PROV_ATTN_MLA = 2 };
enum k3_prov_ffn_kind { K3_PROV_FFN_DENSE = 1, K3_PROV_FFN_MOE = 2 };

enum { K3_PROV_MAX_LAYERS = 512 };

/* Model hyper-parameters, already validated by the model loader
 * (spec §1). Only the K3 branches are supported: AttnRes on, latent MoE,
 * lower-bounded full-rank-gated KDA, q_lora MLA with NoPE and output gate,
 * sigmoid router. */
struct k3_prov_config {
	uint32_t struct_size;        /* sizeof(struct k3_prov_config) */
	uint32_t hidden;             /* D */
	uint32_t n_layers;           /* L <= K3_PROV_MAX_LAYERS */
	uint32_t vocab;              /* V */
	uint32_t dense_inter;        /* dense MLP width (intermediate_size) */
	uint32_t shared_inter;       /* moe_intermediate_size * num_shared_experts */
	uint32_t moe_inter;          /* expert width */
	uint32_t latent;             /* routed_expert_hidden_size */
	uint32_t n_experts;
	uint32_t top_k;
	uint32_t attn_res_block;     /* S */
	uint32_t kda_heads, kda_head_dim, conv_kernel;
	uint32_t mla_heads, q_lora, kv_lora, qk_nope, qk_rope, v_head;
	uint32_t moe_renormalize;    /* 0/1 */
	float rms_eps;               /* rms_norm_eps */
	float mla_norm_eps;          /* q_a/kv_a layernorm eps (1e-6, spec §3.1) */
	float situ_beta1;            /* activation_situ_beta (1 when null) */
	float situ_beta2;            /* activation_situ_linear_beta; 0 = no cap */
	float gate_lower_bound;      /* -5 for K3 */
	float routed_scale;          /* routed_scaling_factor */
	uint8_t attn_kind[K3_PROV_MAX_LAYERS];  /* enum k3_prov_attn_kind */
	uint8_t ffn_kind[K3_PROV_MAX_LAYERS];   /* enum k3_prov_ffn_kind */
};

/* Tensors of one layer (spec §2.2-2.6); fields of the other kinds stay
 * K3_PROV_DTYPE_NONE. Routed experts are not here: they arrive per call. */
struct k3_prov_layer_weights {
	struct k3_prov_tensor input_norm, post_attn_norm;
	struct k3_prov_tensor attn_res_norm, attn_res_proj;
	struct k3_prov_tensor mlp_res_norm, mlp_res_proj;
	/* KDA */
	struct k3_prov_tensor q_proj, k_proj, v_proj;
	struct k3_prov_tensor q_conv, k_conv, v_conv;
	struct k3_prov_tensor f_a_proj, f_b_proj, a_log, dt_bias, b_proj;
	struct k3_prov_tensor g_proj, o_norm, o_proj;   /* g_proj/o_proj: MLA too */
	/* MLA */
	struct k3_prov_tensor q_a_proj, q_a_norm, q_b_proj;
	struct k3_prov_tensor kv_a_proj, kv_a_norm, kv_b_proj;
	/* dense MLP (layer 0) or shared experts (MoE layers) */
	struct k3_prov_tensor mlp_gate, mlp_up, mlp_down;
	/* MoE */
	struct k3_prov_tensor router, router_bias;
	struct k3_prov_tensor lat_down, lat_norm, lat_up;
};

struct k3_prov_weights {
	uint32_t struct_size;        /* sizeof(struct k3_prov_weights) */
	uint32_t n_layers;
	struct k3_prov_tensor embed, lm_head, norm, out_res_norm, out_res_proj;
	const struct k3_prov_layer_weights *layers;   /* [n_layers] */
};

/* One routed expert's MXFP4 arrays (spec §9): w1 gate and w3 up
 * [moe_inter][latent/2] packed + [moe_inter][latent/32] E8M0 scales, w2 down
 * [latent][moe_inter/2] + [latent][moe_inter/32]. */
struct k3_prov_expert {
	const uint8_t *w1_packed, *w1_scale;
	const uint8_t *w3_packed, *w3_scale;
	const uint8_t *w2_packed, *w2_scale;
};

struct k3_prov_open_args {
	uint32_t struct_size;        /* sizeof(struct k3_prov_open_args) */
	uint32_t threads;            /* compute threads; 0 = online cores */
	uint32_t max_batch;          /* largest T any op will see (scratch size) */
	uint32_t flags;              /* K3_PROV_OPEN_* */
	const struct k3_prov_config *config;
	const struct k3_prov_weights *weights;
	/* Device expert tier budget in bytes (docs/providers.md, "VRAM expert
	 * tier"; present when struct_size covers it): 0 = auto (free device
	 * memory after the model's allocations minus headroom), UINT64_MAX =
	 * no tier. Providers without a tier ignore it. */
	uint64_t expert_tier_bytes;
};

/* Use the scalar reference kernels for every op (slow; the oracle). */
#define K3_PROV_OPEN_REFERENCE 0x1u
/* Split every product across the threads, even tiny ones a provider would
 * run inline (tests of thread-count invariance on tiny models). */
#define K3_PROV_OPEN_SPLIT_ALL 0x2u

/* AttnRes mix sites (spec §4.2): which layer's norm/proj pair scores. */
enum k3_prov_mix_site {
	K3_PROV_MIX_ATTN = 1,        /* self_attention_res_{norm,proj} of layer */
	K3_PROV_MIX_MLP = 2,         /* mlp_res_{norm,proj} of layer */
	K3_PROV_MIX_OUTPUT = 3,      /* output_attn_res_{norm,proj}; layer ignored */
};

/* Sub-layer output mode: overwrite `out` or add into it (P := P + a). */
#define K3_PROV_OUT_ACCUMULATE 0x1u

typedef struct k3_prov_model k3_prov_model;
typedef struct k3_prov_kda_state k3_prov_kda_state;
typedef struct k3_prov_mla_cache k3_prov_mla_cache;
typedef struct k3_prov_kda_record k3_prov_kda_record;

struct k3_provider {
	uint32_t abi_version;        /* K3_PROVIDER_ABI_VERSION */
	uint32_t struct_size;        /* sizeof(struct k3_provider) */
	const char *name;

	/* Validates every shape and dtype against config and builds the
	 * provider's view. Returns 0, -EINVAL (shape/dtype/unsupported
	 * config, message names the tensor), -ENOMEM, -EPROTO (ABI). */
	int (*open)(const struct k3_prov_open_args *args, k3_prov_model **out,
		    struct k3_prov_status *st);
	void (*close)(k3_prov_model *m);

	/* KDA per-layer sequence state (spec §5.8): conv windows and the
	 * recurrent matrices, zero after new/reset. copy: dst := src, both of
	 * the same layer. */
	int (*kda_state_new)(k3_prov_model *m, uint32_t layer,
			     k3_prov_kda_state **out, struct k3_prov_status *st);
	void (*kda_state_free)(k3_prov_kda_state *s);
	void (*kda_state_reset)(k3_prov_kda_state *s);
	int (*kda_state_copy)(k3_prov_kda_state *dst, const k3_prov_kda_state *src,
			      struct k3_prov_status *st);

	/* MLA latent cache (spec §6.5): 576-style rows (kv_lora normalized
	 * latent + qk_rope raw) per past token. `capacity` tokens are
	 * reserved up front so appends do not allocate; growing past it
	 * reallocates (geometric). truncate keeps the first n tokens. */
	int (*mla_cache_new)(k3_prov_model *m, uint32_t layer, uint32_t capacity,
			     k3_prov_mla_cache **out, struct k3_prov_status *st);
	void (*mla_cache_free)(k3_prov_mla_cache *c);
	uint32_t (*mla_cache_len)(const k3_prov_mla_cache *c);
	void (*mla_cache_truncate)(k3_prov_mla_cache *c, uint32_t n);
	int (*mla_cache_copy)(k3_prov_mla_cache *dst, const k3_prov_mla_cache *src,
			      struct k3_prov_status *st);

	/* out[T][D] := embed_tokens rows (spec §4.1). -EINVAL on an id >= V. */
	int (*embed)(k3_prov_model *m, const int32_t *ids, uint32_t T, float *out,
		     struct k3_prov_status *st);
	/* out[T][D] := AR(cands[0][t], ..., cands[n-1][t]) per position with the
	 * site's norm/proj (spec §4.2). Each cands[j] is [T][D]. */
	int (*attnres_mix)(k3_prov_model *m, uint32_t site, uint32_t layer,
			   const float *const *cands, uint32_t n, uint32_t T,
			   float *out, struct k3_prov_status *st);
	/* KDA sub-layer, including input_layernorm: out[T][D] (:= or +=)
	 * ATTN(RMSNorm(h)) for T consecutive positions of one sequence,
	 * advancing s (spec §5). */
	int (*kda)(k3_prov_model *m, uint32_t layer, const float *h, uint32_t T,
		   k3_prov_kda_state *s, float *out, uint32_t flags,
		   struct k3_prov_status *st);
	/* MLA sub-layer, including input_layernorm: appends the T positions'
	 * latents to c, then attends causally (spec §6). */
	int (*mla)(k3_prov_model *m, uint32_t layer, const float *h, uint32_t T,
		   k3_prov_mla_cache *c, float *out, uint32_t flags,
		   struct k3_prov_status *st);
	/* x[T][D] := RMSNorm(h2; post_attention_layernorm). */
	int (*ffn_norm)(k3_prov_model *m, uint32_t layer, const float *h2,
			uint32_t T, float *x, struct k3_prov_status *st);
	/* Router of a MoE layer (spec §8.1): ids[T][top_k] (selection order:
	 * biased score descending, ties lowest id) and weights[T][top_k]
	 * (renormalized unbiased sigmoid, scaled). */
	int (*router)(k3_prov_model *m, uint32_t layer, const float *x, uint32_t T,
		      uint32_t *ids, float *weights, struct k3_prov_status *st);
	/* Latent routed path (spec §8.2): out[T][D] += Wup(RMSNorm(sum_k
	 * weights[t][k] * E_k(Wdown x))), with experts[t*top_k + k] the span of
	 * expert ids[t][k]. */
	int (*routed_experts)(k3_prov_model *m, uint32_t layer, const float *x,
			      uint32_t T, const uint32_t *ids, const float *weights,
			      const struct k3_prov_expert *experts, float *out,
			      struct k3_prov_status *st);
	/* out[T][D] := SiTU-GLU MLP (spec §7.2): dense MLP on dense layers,
	 * shared experts on MoE layers. */
	int (*mlp)(k3_prov_model *m, uint32_t layer, const float *x, uint32_t T,
		   float *out, struct k3_prov_status *st);
	/* dst[n] += src[n] (P := P + m, spec §4.3). */
	int (*add)(k3_prov_model *m, float *dst, const float *src, size_t n,
		   struct k3_prov_status *st);
	/* logits[T][V] := lm_head RMSNorm(z; model.norm) (spec §10). */
	int (*logits)(k3_prov_model *m, const float *z, uint32_t T, float *out,
		      struct k3_prov_status *st);
	/* Compute threads for later calls (1..256). */
	int (*set_threads)(k3_prov_model *m, uint32_t threads,
			   struct k3_prov_status *st);

	/*
	 * Optional (all three or none; present when struct_size covers them):
	 * routed_experts in pieces, so an engine whose expert spans arrive one
	 * by one (a streaming store) computes each expert as soon as its span
	 * is readable. routed_begin(x, T, ids) starts the call (the down
	 * projection); routed_expert(expert, span) computes every slot of
	 * ids[T][top_k] that holds `expert`, each slot's output in its own
	 * buffer (the span need only live for that call); routed_end adds the
	 * weighted sum over the slots in route order k = 0..top_k-1, then
	 * RMSNorm and Wup, into out, exactly as routed_experts would: the
	 * result is bit-identical whatever order the experts came in. Between
	 * begin and end only routed_expert (and routed_partial with the calls
	 * it allows) may be called on this model handle (the state lives in
	 * the provider's scratch); ids and x must stay
	 * unchanged until end. routed_expert of an expert with no (remaining)
	 * slot, or routed_end before every slot was computed: -EINVAL.
	 */
	int (*routed_begin)(k3_prov_model *m, uint32_t layer, const float *x, uint32_t T,
			    const uint32_t *ids, struct k3_prov_status *st);
	int (*routed_expert)(k3_prov_model *m, uint32_t layer, uint32_t expert,
			     const struct k3_prov_expert *span, struct k3_prov_status *st);
	int (*routed_end)(k3_prov_model *m, uint32_t layer, const float *weights, float *out,
			  struct k3_prov_status *st);

	/*
	 * Optional (with the three above; present when struct_size covers
	 * it): between routed_begin and routed_end, out[T][D] += Wup(RMSNorm(
	 * sum over the slots computed so far of w[t][k] * Y[t][k])), the sum
	 * in route order, slots not computed yet left out (a position with
	 * none adds 0). The same arithmetic as routed_end over fewer terms:
	 * with every slot computed it adds exactly what routed_end adds. The
	 * call changes none of the routed call's state, so routed_expert and
	 * routed_end may follow; attnres_mix, ffn_norm and router may also
	 * be called in between (the engine's lookahead on this partial sum
	 * while it waits for the last experts' reads). Errors: -EINVAL
	 * outside routed_begin..end.
	 */
	int (*routed_partial)(k3_prov_model *m, uint32_t layer, const float *weights, float *out,
			      struct k3_prov_status *st);

	/*
	 * Optional (all three or none; present when struct_size covers them):
	 * the streamed spine (docs/engine.md, "Spine streaming"). open()
	 * accepts a layer whose every tensor has data == NULL (shapes and
	 * dtypes as always: they are validated then), the head (lm_head,
	 * norm, out_res_norm, out_res_proj all without data) and the
	 * embedding without data. Such a layer's (the head's) ops fail with
	 * -EINVAL until it is bound.
	 *
	 * bind_layer: every later op of layer `layer` reads w's tensors until
	 * the next bind_layer of that layer; w must carry the shapes and
	 * dtypes open() validated, with data (borrowed until that next bind).
	 * w == NULL unbinds: the provider forgets the bytes, so their memory
	 * may be reused. The engine binds a streamed layer right before its
	 * ops and unbinds it after them. Never inside that layer's
	 * routed_begin..routed_end. Binding allocates nothing (vectors the
	 * provider keeps in its own form are converted into buffers made at
	 * open). Errors: -EINVAL (shape, dtype or a missing tensor; the layer
	 * is then unbound), message naming the tensor.
	 *
	 * bind_head: the same for w->lm_head, norm, out_res_norm and
	 * out_res_proj (the other fields of w are ignored).
	 *
	 * embed_rows: out[T][D] := rows[T][D] converted to fp32, rows being
	 * the embedding rows of the positions' tokens already gathered (by
	 * the engine's spine source), in the embedding's dtype: the same
	 * values embed() gives for those ids (spec §4.1).
	 */
	int (*bind_layer)(k3_prov_model *m, uint32_t layer, const struct k3_prov_layer_weights *w,
			  struct k3_prov_status *st);
	int (*bind_head)(k3_prov_model *m, const struct k3_prov_weights *w,
			 struct k3_prov_status *st);
	int (*embed_rows)(k3_prov_model *m, const void *rows, uint32_t T, float *out,
			  struct k3_prov_status *st);

	/*
	 * Optional (all four or none; present when struct_size covers them):
	 * KDA verification without a state copy per position, for
	 * speculative decoding (docs/text-and-draft.md §4.8, "Replay";
	 * docs/engine.md, "Verify and commit").
	 *
	 * kda_record_new(m, layer, max_T): a record of up to max_T positions
	 * of KDA layer `layer`: per position whatever the per-token step
	 * consumes (for the cpu provider the raw q/k/v projections, which
	 * also roll the conv windows, the decay logits f and the beta
	 * logits: (4 P + H) floats; K3: 196,992 bytes per layer).
	 * kda_verify(m, layer, h, T, s, rec, out, flags): writes into out
	 * exactly what kda(m, layer, h, T, s, out, flags) would, bit for
	 * bit, but leaves s unchanged: the recurrence runs on the provider's
	 * scratch copy of s (one layer's state in all), and rec keeps the T
	 * positions' inputs (T <= max_T, else -EINVAL).
	 * kda_replay(m, layer, s, rec, n): advances s over the first n
	 * (0..T of the last kda_verify into rec) recorded positions with the
	 * same per-token routine kda uses, so s ends bit-identical to a kda
	 * call over those n positions. n > T: -EINVAL, s unchanged. Neither
	 * kda_record_new nor kda_replay needs the layer bound (a streamed
	 * spine): replay reads only the small vectors the provider keeps of
	 * the layer (conv taps, decay parameters), not its matrices.
	 * Providers without these ops get a state snapshot from the engine
	 * (kda_state_copy): correct, with more memory traffic.
	 */
	int (*kda_record_new)(k3_prov_model *m, uint32_t layer, uint32_t max_T,
			      k3_prov_kda_record **out, struct k3_prov_status *st);
	void (*kda_record_free)(k3_prov_kda_record *r);
	int (*kda_verify)(k3_prov_model *m, uint32_t layer, const float *h, uint32_t T,
			  const k3_prov_kda_state *s, k3_prov_kda_record *rec, float *out,
			  uint32_t flags, struct k3_prov_status *st);
	int (*kda_replay)(k3_prov_model *m, uint32_t layer, k3_prov_kda_state *s,
			  const k3_prov_kda_record *rec, uint32_t n, struct k3_prov_status *st);

	/*
	 * Optional (both or none): the bytes of a sequence state, for tests
	 * that compare states bit for bit (a verified-then-committed
	 * sequence against one that decoded the same ids). *n := the bytes
	 * the state holds (KDA: conv windows then recurrent matrices; MLA:
	 * the rows of its len tokens); when dst is not NULL and cap >= *n
	 * they are copied there, else -ENOSPC (with *n set). The layout is
	 * the provider's own: compare only states of one provider.
	 */
	int (*kda_state_export)(const k3_prov_kda_state *s, void *dst, size_t cap, size_t *n,
				struct k3_prov_status *st);
	int (*mla_cache_export)(const k3_prov_mla_cache *c, void *dst, size_t cap, size_t *n,
				struct k3_prov_status *st);

	/*
	 * Optional (a provider with a device expert tier; present when
	 * struct_size covers it and with the routed pieces above): called
	 * before a MoE layer's expert reads with the distinct experts ids[n]
	 * the coming routed call needs. Sets resident[i] = 1 for those the
	 * provider holds on its device (and keeps them there until that
	 * routed call ends, or the next experts_resident call), else 0. The
	 * engine then reads only the others and passes a NULL span for a
	 * resident expert (routed_expert) or a zeroed span
	 * (routed_experts); the result is the same as with every span
	 * supplied. -EINVAL for a bad layer or id.
	 */
	int (*experts_resident)(k3_prov_model *m, uint32_t layer, const uint32_t *ids, size_t n,
				uint8_t *resident, struct k3_prov_status *st);
};

#endif

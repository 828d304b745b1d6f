/*
 * model.h - the Kimi K3 checkpoint as k3d sees it: the parsed config
 * (docs/model.md §1), every tensor of the safetensors shards (§2), and a typed
 * plan that hands the forward pass one pointer per tensor role.
 *
 * A model is opened from a directory in the Hugging Face layout:
 * config.json (model_type "kimi_k3" with text_config, or a bare
 * "kimi_linear" text config), model.safetensors.index.json (or a single
 * model.safetensors) and the shards it names. Opening reads the config, the
 * index and every shard header, validates all of them and builds the plan;
 * payloads are mapped read-only (PROT_READ, MAP_SHARED) and never copied.
 * The vision tower and mm_projector are ignored on purpose (text only).
 *
 * Lifetime: everything reachable from a struct k3_model (config, tensors,
 * names, plan, mapped payloads) stays valid and immutable until
 * k3_model_free(). A model is safe to read from several threads.
 *
 * Tensor names in the plan are the checkpoint's names with the prefix
 * "language_model." (kimi_k3) or none (bare kimi_linear); k3_model_tensor()
 * takes the full name as stored.
 */
#ifndef K3_MODEL_MODEL_H
#define K3_MODEL_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "model/mxfp4.h"

/* ---- limits (checked before anything is allocated from file input) ---- */

/* Layers in one model. K3 has 93. */
#define K3_MODEL_MAX_LAYERS      256u
/* Routed experts per MoE layer. K3 has 896. */
#define K3_MODEL_MAX_EXPERTS     4096u
/* Tensor rank. safetensors allows more; nothing in K3 exceeds 3. */
#define K3_TENSOR_MAX_DIMS       8u
/* One shard's JSON header, bytes (the safetensors reference caps at 100 MB). */
#define K3_ST_HEADER_MAX         (100u << 20)
/* model.safetensors.index.json and config.json, bytes. */
#define K3_MODEL_INDEX_MAX       (256u << 20)
#define K3_MODEL_CONFIG_MAX      (4u << 20)
/* Shards in one checkpoint, tensors in one checkpoint, bytes of one name. */
#define K3_MODEL_MAX_SHARDS      4096u
#define K3_MODEL_MAX_TENSORS     (4u << 20)
#define K3_TENSOR_NAME_MAX       512u
/* At open, all MXFP4 scale bytes are scanned for the forbidden 255 when they
 * total at most this many bytes (every test and demo model). Above it (the
 * real K3: ~85 GB of scales) the scan is left to whoever reads an expert
 * span: call k3_mxfp4_check_scales() on the bytes read (store's job). */
#define K3_MODEL_SCALE_SCAN_MAX  (256ull << 20)

/* ---- config (docs/model.md §1) ---- */

enum k3_hidden_act {
	K3_ACT_SILU = 0,   /* "silu": plain SwiGLU (Kimi-Linear-48B) */
	K3_ACT_SITU = 1,   /* "situ": SiTU-GLU, §7.1 (K3) */
};

enum k3_router_act {
	K3_ROUTER_SIGMOID = 0,
	K3_ROUTER_SOFTMAX = 1,
};

/* Immutable after parsing. Integer fields that the HF config allows to be
 * null are 0 when null unless a *_set flag says otherwise; §1.2 gives the
 * meaning of null for each. */
struct k3_model_config {
	char model_type[16];              /* "kimi_k3" or "kimi_linear" (top level) */
	bool has_language_model_prefix;   /* names start with "language_model." */

	uint32_t vocab_size;              /* V: embedding and lm_head rows */
	uint32_t hidden_size;             /* D */
	uint32_t num_hidden_layers;       /* L */
	uint32_t intermediate_size;       /* dense MLP width (layers < first_k_dense_replace) */
	enum k3_hidden_act hidden_act;
	float situ_beta;                  /* beta1 = activation_situ_beta; null -> 1.0 */
	bool situ_linear_beta_set;        /* false: up branch not soft-capped */
	float situ_linear_beta;           /* beta2 = activation_situ_linear_beta (25) */
	float rms_norm_eps;               /* 1e-5 in K3; MLA q_a/kv_a norms use 1e-6 (§3.1) */
	bool tie_word_embeddings;         /* must be false for K3 (refused when true) */
	uint32_t attn_res_block_size;     /* S; 0 = null = plain pre-norm residual */

	/* MLA (§6) */
	uint32_t num_attention_heads;     /* Hm */
	uint32_t num_key_value_heads;     /* == Hm (no GQA; null -> heads) */
	uint32_t q_lora_rank;             /* 0 = null: direct q_proj */
	uint32_t kv_lora_rank;
	uint32_t qk_nope_head_dim;
	uint32_t qk_rope_head_dim;        /* plain extra dims, never rotated */
	uint32_t v_head_dim;
	bool mla_use_nope;                /* must be true */
	bool mla_use_output_gate;
	double rope_theta;                /* unused by the text model */
	uint64_t max_position_embeddings; /* informational */

	/* KDA (§5), from linear_attn_config; has_kda false when that is null */
	bool has_kda;
	uint32_t kda_num_heads;           /* Hk */
	uint32_t kda_head_dim;            /* dk = dv */
	uint32_t short_conv_kernel_size;  /* 4 */
	bool gate_lower_bound_set;        /* false: softplus decay form (§1.4) */
	float gate_lower_bound;           /* -5 */
	bool use_full_rank_gate;          /* true: g_proj; false: g_a_proj/g_b_proj */
	uint32_t kda_layers_1based[K3_MODEL_MAX_LAYERS];  /* as written in the file */
	uint32_t n_kda_layers_listed;

	/* MoE (§8) */
	uint32_t num_experts;             /* E; 0 = null = no MoE layers */
	uint32_t num_experts_per_token;   /* top-k */
	uint32_t num_shared_experts;      /* shared MLP width = moe_intermediate * this */
	uint32_t moe_intermediate_size;   /* expert width */
	bool moe_renormalize;
	enum k3_router_act moe_router_activation_func;
	float routed_scaling_factor;
	uint32_t first_k_dense_replace;
	uint32_t moe_layer_freq;
	bool use_grouped_topk;            /* not read by the HF gate */
	uint32_t num_expert_group;
	uint32_t topk_group;
	uint32_t routed_expert_hidden_size; /* latent width; 0 = null = experts run in D */
	bool latent_moe_use_norm;
	uint32_t num_nextn_predict_layers;  /* MTP layers: their tensors are ignored */

	/* special tokens; -1 when absent. Text-config value wins over top level. */
	int64_t bos_token_id;
	int64_t eos_token_id;
	int64_t pad_token_id;
	int64_t media_placeholder_token_id;

	/* quantization_config says mxfp4-pack-quantized (informational: the
	 * loader decides per tensor by suffix, §2.7) */
	bool quant_mxfp4;

	/* ---- derived (§1.3) ---- */
	bool is_kda[K3_MODEL_MAX_LAYERS];          /* (l+1) in kda_layers */
	bool is_moe[K3_MODEL_MAX_LAYERS];          /* num_experts && l >= fkdr && l % freq == 0 */
	bool is_block_start[K3_MODEL_MAX_LAYERS];  /* S && l % S == 0 */
	uint32_t n_kda, n_mla, n_moe, n_dense;
	uint32_t n_attn_res_blocks;                /* ceil(L / S); 0 without AttnRes */
	uint32_t kda_width;               /* P = Hk * dk */
	uint32_t mla_q_head_dim;          /* qk_nope + qk_rope (192) */
	uint32_t mla_kv_a_width;          /* kv_lora + qk_rope (576) */
	uint32_t mla_attn_width;          /* Hm * v_head_dim (12288), gate and o_proj input */
	uint32_t expert_in;               /* routed_expert_hidden_size or D */
	uint32_t shared_width;            /* moe_intermediate * num_shared_experts */
};

/* Parses config.json text (len bytes, need not be NUL-terminated) into
 * *out. Unknown model_type, a missing required field, a wrong JSON type,
 * inconsistent dimensions or an unsupported value -> -EINVAL with a message
 * naming the field and what was expected. Booleans are parsed by value. */
int k3_model_config_parse(const char *json, size_t len,
			  struct k3_model_config *out, struct k3_err *err);

/* Reads dir/config.json (at most K3_MODEL_CONFIG_MAX bytes) and parses it
 * as k3_model_config_parse does: what `k3ctl plan` needs before any shard
 * exists. -ENOENT (and other errnos) naming the file, or -EINVAL. */
int k3_model_config_load(const char *dir, struct k3_model_config *out, struct k3_err *err);

/* ---- tensors ---- */

/* safetensors dtypes. Values are stable (never renumber). */
enum k3_dtype {
	K3_DTYPE_BOOL = 0,
	K3_DTYPE_U8,
	K3_DTYPE_I8,
	K3_DTYPE_U16,
	K3_DTYPE_I16,
	K3_DTYPE_F16,
	K3_DTYPE_BF16,
	K3_DTYPE_U32,
	K3_DTYPE_I32,
	K3_DTYPE_F32,
	K3_DTYPE_U64,
	K3_DTYPE_I64,
	K3_DTYPE_F64,
	K3_DTYPE_F8_E4M3,
	K3_DTYPE_F8_E5M2,
	K3_DTYPE_COUNT
};

/* "BF16" etc. as written in safetensors headers; NULL for a bad value. */
const char *k3_dtype_name(enum k3_dtype t);
/* Bytes per element (1..8). */
size_t k3_dtype_size(enum k3_dtype t);
/* Header spelling -> enum; returns 0 or -EINVAL for an unknown name. */
int k3_dtype_parse(const char *s, enum k3_dtype *out);

struct k3_tensor {
	const char *name;            /* full checkpoint name, NUL-terminated */
	enum k3_dtype dtype;
	uint32_t ndim;               /* 0 (scalar) .. K3_TENSOR_MAX_DIMS */
	uint64_t shape[K3_TENSOR_MAX_DIMS];  /* row-major, [out, in] for linears */
	uint64_t nelem;              /* product of shape (1 for a scalar) */
	uint64_t nbytes;             /* nelem * dtype size == payload length */
	const void *data;            /* read-only mapping of the payload; no
	                              * alignment promise beyond 1 byte for
	                              * third-party files: use memcpy or the
	                              * k3_tensor_read_* helpers */
	uint32_t shard;              /* index for k3_model_shard_path() */
	uint64_t file_offset;        /* absolute byte offset of the payload in
	                              * that shard file (for pread / O_DIRECT) */
};

/* ---- the plan (docs/model.md §2, role names as in the checkpoint) ----
 *
 * dtypes, checked at open: every matrix role (Linear weights, embedding,
 * lm_head, unquantized experts) is BF16, so GEMM kernels may assume it
 * (a model opened with the int8 spine overlay has I8 matrix roles: see
 * "the int8 spine overlay" below);
 * vector roles (norm weights, conv taps, A_log, dt_bias, the routing bias,
 * AttnRes projections) may be BF16, F16 or F32 (the release stores conv
 * taps, A_log, dt_bias, o_norm and the routing bias as F32): read them with
 * k3_tensor_read_f32(); MXFP4 packed/scale tensors are U8. A role whose
 * feature is switched off by the config is NULL. */

/* One projection of a routed expert. MXFP4 (§9): packed U8 [R, C/2] plus
 * scale U8 [R, C/32], weight NULL. Unquantized: weight BF16/F16/F32 [R, C],
 * packed and scale NULL. rows/cols are the logical (unpacked) shape. */
struct k3_expert_proj {
	bool mxfp4;
	const struct k3_tensor *packed;   /* <name>.weight_packed */
	const struct k3_tensor *scale;    /* <name>.weight_scale (E8M0) */
	const struct k3_tensor *weight;   /* <name>.weight */
	uint32_t rows, cols;
};

/* experts.e.{w1 gate, w3 up: [moe_inter, expert_in]; w2 down: [expert_in, moe_inter]} */
struct k3_expert {
	struct k3_expert_proj w1, w2, w3;
	/* The expert's bytes as one span of one shard when all its tensors sit
	 * in the same shard: [span_offset, span_offset + span_bytes) covers all
	 * six (or three) payloads; span_contiguous says nothing else lies in
	 * between (span_bytes == sum of the payloads). Real K3: 17,547,264. */
	uint32_t span_shard;
	uint64_t span_offset;
	uint64_t span_bytes;
	bool span_one_shard;
	bool span_contiguous;
	uint64_t payload_bytes;           /* sum of the payloads, whatever the layout */
};

/* KDA sub-layer, "<layer>.self_attn." prefix (§2.3, §5). */
struct k3_kda_plan {
	const struct k3_tensor *q_proj, *k_proj, *v_proj;        /* [P, D] */
	const struct k3_tensor *q_conv1d, *k_conv1d, *v_conv1d;  /* [P, 1, K] F32, tap K-1 = current token */
	const struct k3_tensor *f_a_proj;                        /* [dk, D] */
	const struct k3_tensor *f_b_proj;                        /* [P, dk] */
	const struct k3_tensor *a_log;    /* "A_log": numel >= Hk; use the first Hk (per head) */
	const struct k3_tensor *dt_bias;  /* [P] F32 */
	const struct k3_tensor *b_proj;   /* [Hk, D] */
	const struct k3_tensor *g_proj;   /* [P, D] when use_full_rank_gate, else NULL */
	const struct k3_tensor *g_a_proj; /* [dk, D] when !use_full_rank_gate, else NULL */
	const struct k3_tensor *g_b_proj; /* [P, dk] when !use_full_rank_gate, else NULL */
	const struct k3_tensor *o_norm;   /* [dk] F32, shared by all heads */
	const struct k3_tensor *o_proj;   /* [D, P] */
};

/* MLA sub-layer, "<layer>.self_attn." prefix (§2.4, §6). */
struct k3_mla_plan {
	const struct k3_tensor *q_proj;             /* [Hm*(nope+rope), D] only when q_lora_rank is null */
	const struct k3_tensor *q_a_proj;           /* [q_lora, D] */
	const struct k3_tensor *q_a_layernorm;      /* [q_lora], eps 1e-6 */
	const struct k3_tensor *q_b_proj;           /* [Hm*(nope+rope), q_lora] */
	const struct k3_tensor *kv_a_proj_with_mqa; /* [kv_lora+rope, D] */
	const struct k3_tensor *kv_a_layernorm;     /* [kv_lora], eps 1e-6 */
	const struct k3_tensor *kv_b_proj;          /* [Hm*(nope+v), kv_lora] */
	const struct k3_tensor *g_proj;             /* [Hm*v, D] when mla_use_output_gate, else NULL */
	const struct k3_tensor *o_proj;             /* [D, Hm*v] */
};

/* Dense MLP ("mlp.") or the shared experts ("block_sparse_moe.shared_experts."). */
struct k3_mlp_plan {
	const struct k3_tensor *gate_proj;  /* [W, D] (SiTU gate, beta1) */
	const struct k3_tensor *up_proj;    /* [W, D] (SiTU up, beta2) */
	const struct k3_tensor *down_proj;  /* [D, W] */
};

/* Latent MoE, "<layer>.block_sparse_moe." prefix (§2.6, §8). */
struct k3_moe_plan {
	const struct k3_tensor *gate;                    /* "gate.weight" [E, D] router */
	const struct k3_tensor *e_score_correction_bias; /* "gate.e_score_correction_bias" [E] */
	const struct k3_tensor *routed_expert_down_proj; /* [latent, D]; NULL without latent */
	const struct k3_tensor *routed_expert_norm;      /* [latent]; NULL unless latent_moe_use_norm */
	const struct k3_tensor *routed_expert_up_proj;   /* [D, latent]; NULL without latent */
	struct k3_mlp_plan shared_experts;               /* all NULL when num_shared_experts == 0 */
	uint32_t n_experts;
	const struct k3_expert *experts;                 /* [n_experts] */
};

struct k3_layer_plan {
	uint32_t index;                  /* 0-based l */
	bool is_kda;                     /* else MLA */
	bool is_moe;                     /* else dense MLP */
	bool is_block_start;             /* AttnRes snapshot before this layer (§4.3) */
	const struct k3_tensor *input_layernorm;          /* [D] */
	const struct k3_tensor *post_attention_layernorm; /* [D] */
	/* AttnRes (§4.2); NULL when attn_res_block_size is null */
	const struct k3_tensor *self_attention_res_norm;  /* [D] */
	const struct k3_tensor *self_attention_res_proj;  /* [1, D] */
	const struct k3_tensor *mlp_res_norm;             /* [D] */
	const struct k3_tensor *mlp_res_proj;             /* [1, D] */
	struct k3_kda_plan kda;          /* valid iff is_kda (else all NULL) */
	struct k3_mla_plan mla;          /* valid iff !is_kda */
	struct k3_mlp_plan mlp;          /* valid iff !is_moe */
	struct k3_moe_plan moe;          /* valid iff is_moe */
};

struct k3_model_plan {
	const struct k3_tensor *embed_tokens;          /* "model.embed_tokens.weight" [V, D] */
	const struct k3_tensor *norm;                  /* "model.norm.weight" [D] */
	const struct k3_tensor *lm_head;               /* "lm_head.weight" [V, D] */
	const struct k3_tensor *output_attn_res_norm;  /* [D]; NULL without AttnRes */
	const struct k3_tensor *output_attn_res_proj;  /* [1, D]; NULL without AttnRes */
	uint32_t n_layers;
	const struct k3_layer_plan *layers;            /* [n_layers] */
};

/* ---- the int8 spine overlay (docs/formats.md, "int8 spine overlay") ----
 *
 * `k3ctl convert-spine-int8` writes, beside a checkpoint (default
 * DIR/spine-int8/), safetensors shards holding a row-wise int8 copy of the
 * spine's linear-op matrices: `<name>.weight_i8` (I8 [rows, cols]) and,
 * at the next 64-byte boundary after it, `<name>.weight_row_scale` (F32
 * [rows]); value = q[r][c] * scale[r]. It is NOT the checkpoint's weights:
 * a model opened with it must say so wherever it reports what it runs.
 *
 * Opened with an overlay, every matrix role of the selected classes points
 * at an I8 tensor view: dtype K3_DTYPE_I8, shape [rows, cols] as the BF16
 * role's, data / shard / file_offset at its q bytes, and nbytes covering q,
 * the zero gap and the scales (K3_MODEL_I8_BYTES(rows, cols), the provider
 * ABI's layout): the one tensor kind whose nbytes is not nelem x element
 * size. Its shard number is past the model's own shards
 * (k3_model_shard_count): k3_model_shard_path() names the overlay file.
 * The embedding and MLA's kv_b_proj are never converted; norms, conv taps,
 * A_log, dt_bias, the routing bias and the AttnRes vectors stay as stored.
 * Which source files an overlay was made from is checked by the store
 * (store/store_int8.h), not here. */

/* Classes of matrices an overlay converts (all of them are written; the
 * caller picks which to run). */
enum k3_model_int8_role {
	K3_MODEL_INT8_KDA = 1u << 0,      /* KDA q/k/v, f_a/f_b, b, g, o projections */
	K3_MODEL_INT8_MLA = 1u << 1,      /* MLA q_a, q_b, kv_a_proj_with_mqa, g, o */
	K3_MODEL_INT8_MLP = 1u << 2,      /* dense MLP and shared experts: gate, up, down */
	K3_MODEL_INT8_LATENT = 1u << 3,   /* routed_expert_down_proj / _up_proj */
	K3_MODEL_INT8_ROUTER = 1u << 4,   /* block_sparse_moe.gate (the router) */
	K3_MODEL_INT8_LM_HEAD = 1u << 5,  /* lm_head */
	K3_MODEL_INT8_ALL = (1u << 6) - 1,
};
/* What `k3d --spine int8` runs: every class but the router, which stays
 * BF16 so that routing (which experts run) stays as close to the exact
 * model as it can (docs/engine.md, "int8 spine", measured). */
#define K3_MODEL_INT8_DEFAULT (K3_MODEL_INT8_ALL & ~(unsigned)K3_MODEL_INT8_ROUTER)
/* The overlay's directory inside a model directory, by default. */
#define K3_MODEL_INT8_SUBDIR "spine-int8"

/* Where an I8 matrix's row scales start, from its q bytes: rows * cols
 * rounded up to 64 (the gap is zero); its bytes are that plus 4 * rows.
 * The same layout as the provider ABI's K3_PROV_DTYPE_I8
 * (K3_PROV_I8_SCALE_OFFSET; the engine, which sees both, checks that they
 * agree). */
#define K3_MODEL_I8_SCALE_OFFSET(rows, cols) \
	((((uint64_t)(rows) * (uint64_t)(cols)) + 63u) & ~(uint64_t)63u)
#define K3_MODEL_I8_BYTES(rows, cols) \
	(K3_MODEL_I8_SCALE_OFFSET(rows, cols) + 4u * (uint64_t)(rows))

/* "kda", "mla", "mlp", "latent", "router", "lm_head" for one bit; NULL
 * otherwise. */
const char *k3_model_int8_role_name(unsigned role);
/* "kda,mla,..." or "all" / "none" / "default" -> bits; 0 or -EINVAL naming
 * the bad word. */
int k3_model_int8_roles_parse(const char *s, unsigned *out, struct k3_err *err);

/* One matrix an overlay converts: its class and the BF16 tensor. */
struct k3_model_int8_matrix {
	unsigned role;                       /* one enum k3_model_int8_role bit */
	const struct k3_tensor *tensor;      /* BF16 [rows, cols], the checkpoint's */
};

/* The overlay's names for matrix `name` ("<base>.weight"): "<base>
 * .weight_i8", "<base>.weight_row_scale" and the zero pads written after
 * each when its bytes are not a multiple of 64 ("<base>.weight_i8_pad",
 * "<base>.weight_row_scale_pad"). suffix is one of those four suffixes
 * (".weight_i8", ...). Returns 0, or -EINVAL when name does not end in
 * ".weight" or the result does not fit in size. */
int k3_model_int8_name(const char *name, const char *suffix, char *buf, size_t size);

struct k3_model_open_opts {
	/* NULL: the checkpoint's BF16 spine (weight-exact). Else the overlay
	 * directory: its matrices of int8_roles replace the BF16 ones. */
	const char *int8_dir;
	unsigned int8_roles;          /* enum k3_model_int8_role bits; 0 = DEFAULT */
};

struct k3_model_int8_info {
	bool on;                      /* the model runs an int8 spine */
	unsigned roles;
	const char *dir;              /* the overlay directory (resolved) */
	uint32_t shards;              /* overlay shards */
	size_t matrices;              /* matrix roles replaced */
	uint64_t int8_bytes;          /* their I8 bytes (q + scales + gaps) */
	uint64_t bf16_bytes;          /* the BF16 bytes they replace */
};

/* ---- opening ---- */

struct k3_model;

/* Opens the checkpoint in directory dir (see the top of this file).
 * On success *out owns everything; free with k3_model_free().
 * Errors (negative errno, message in err):
 *   -ENOENT  config.json / index / a shard missing;
 *   -EINVAL  malformed config (names the field), malformed safetensors
 *            header (names the shard and what is wrong), or a tensor plan
 *            problem (one message listing every missing, mis-shaped or
 *            wrongly typed tensor, truncated if very long);
 *   -EXDEV   a shard resolves (symlinks) outside dir;
 *   -ENOMEM, -EIO and other errnos from the system. */
int k3_model_open(const char *dir, struct k3_model **out, struct k3_err *err);

/* The same without config.json and the tensor plan: any architecture's
 * safetensors directory (index or single file, every header validated,
 * mapped read-only), for readers that check the tensor table themselves
 * (the DSpark draft, daemon/draft). k3_model_config() is then all zero and
 * k3_model_plan() empty; k3_model_tensor() and k3_model_tensors() work. */
int k3_model_open_tensors(const char *dir, struct k3_model **out, struct k3_err *err);

/* k3_model_open, then (opts->int8_dir set) the int8 spine overlay: its
 * index (model.safetensors.index.json) and shards, every I8 tensor checked
 * against the BF16 matrix it replaces (name, shape, the scales' place) and
 * every matrix of the selected classes required. opts NULL = k3_model_open.
 * Errors as k3_model_open, plus for the overlay (the message names the
 * file or tensor and ends with the command that rewrites it): -ENOENT (no
 * overlay there), -EINVAL (malformed, or made for another model). */
int k3_model_open_with(const char *dir, const struct k3_model_open_opts *opts,
		       struct k3_model **out, struct k3_err *err);

/* The matrices an overlay converts, in plan order (layer by layer, then
 * lm_head), of a model opened without the overlay: the first min(n, cap)
 * go to out; returns n. */
size_t k3_model_int8_matrices(const struct k3_model *m, struct k3_model_int8_matrix *out,
			      size_t cap);

/* Quantizes rows [r0, r0 + n) of the BF16 matrix t (docs/formats.md, "int8
 * spine overlay"; kernels: k3_kern_quantize_i8_bf16) into q[n][cols] and
 * scales[n]; w is caller scratch of n * cols uint16 (the mapped bytes have
 * no alignment promise, so they are copied there first). Returns 0,
 * -EINVAL for a NaN or infinite weight (*bad_row = its row in t) or a t
 * that is not a BF16 matrix, -ERANGE for rows past t. */
int k3_model_int8_quantize_rows(const struct k3_tensor *t, size_t r0, size_t n, uint16_t *w,
				int8_t *q, float *scales, size_t *bad_row);

/* What the model runs: info->on is false for the BF16 spine. */
void k3_model_int8_info_get(const struct k3_model *m, struct k3_model_int8_info *info);

/* The I8 tensors an int8 spine runs in place of BF16 matrices, in plan
 * order (named <matrix>.weight_i8, shape [rows, cols], nbytes with the
 * row scales): *n gets the count (0 for the BF16 spine). Valid until
 * k3_model_free(). */
const struct k3_tensor *k3_model_int8_views(const struct k3_model *m, size_t *n);

/* NULL-safe. Unmaps everything. */
void k3_model_free(struct k3_model *m);

/* Never NULL for an open model; valid until k3_model_free(). */
const struct k3_model_config *k3_model_config(const struct k3_model *m);
const struct k3_model_plan *k3_model_plan(const struct k3_model *m);

/* Full stored name -> tensor, or NULL. O(log n). */
const struct k3_tensor *k3_model_tensor(const struct k3_model *m, const char *name);

/* All tensors, sorted by name: *n_out gets the count. */
const struct k3_tensor *k3_model_tensors(const struct k3_model *m, size_t *n_out);

/* The model directory as given (resolved, absolute) and the shards. */
const char *k3_model_dir(const struct k3_model *m);
uint32_t k3_model_shard_count(const struct k3_model *m);
/* Absolute path of shard i (< count, or an int8 overlay shard numbered
 * after them), NULL otherwise. Open it O_RDONLY to pread tensor payloads
 * at k3_tensor.file_offset. */
const char *k3_model_shard_path(const struct k3_model *m, uint32_t i);
/* Size in bytes of shard i, 0 for a bad index. */
uint64_t k3_model_shard_size(const struct k3_model *m, uint32_t i);

/* Converts elements [first, first + n) of t (flattened, row-major) to fp32
 * into out[n]. Accepts BF16 (exact: bits << 16), F16 (exact) and F32.
 * Returns 0, -EINVAL for another dtype, -ERANGE when the range exceeds
 * t->nelem. */
int k3_tensor_read_f32(const struct k3_tensor *t, uint64_t first, size_t n,
		       float *out);

#endif

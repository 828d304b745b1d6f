/*
 * demo.h - synthetic Kimi K3 checkpoints in the exact Hugging Face layout
 * of the release (docs/model.md §1, §2, §9): config.json with text_config,
 * model.safetensors.index.json, >= 2 shards with the release's dtypes (BF16
 * matrices and norms; F32 A_log, dt_bias, conv taps, o_norm and routing
 * bias; U8 MXFP4 experts), tokenizer_config.json and a synthetic
 * tiktoken.model. Used by `k3ctl demo-model`, the tests and the demo.
 *
 * Determinism: every tensor is drawn from its own generator seeded by
 * (seed, tensor name) with integer-only arithmetic, so the same options give
 * the same bytes on every machine. The tokenizer depends on the vocabulary
 * size only (not on the seed).
 *
 * Initialization keeps activations O(1) through every layer: embeddings
 * N(0, 1); norm weights 1 + N(0, 0.05); input projections N(0, 1/in);
 * output projections (o_proj, down projections, routed up-projection)
 * N(0, 0.25/in); KDA decay parameters chosen so alpha spans (e^-5, 1).
 */
#ifndef K3_DEMO_DEMO_H
#define K3_DEMO_DEMO_H

#include <stdbool.h>
#include <stdint.h>

#include "base/err.h"

enum k3_demo_preset {
	K3_DEMO_NANO = 0,    /* a few MB, every path (the default) */
	K3_DEMO_SMALL,       /* tens of MB, speed tests */
	K3_DEMO_BENCH,       /* real K3 expert shapes (17,547,264 B/expert), few layers */
	/* K3's real layout at full size (docs/plan.md, "The full-size
	 * rehearsal"): every tensor name, shape, dtype and offset of the
	 * release in its 96 shards (~1.56 TB apparent), the data regions left
	 * as holes (they read as zeros; the disk holds the headers). Every
	 * weight is zero, so its output is meaningless: a rehearsal of scale,
	 * not of numbers. No overrides, no tokenizer files (k3d serves token
	 * ids; copy the release's tokenizer in for text). */
	K3_DEMO_K3_SPARSE,
	K3_DEMO_PRESET_COUNT
};

/* What a k3-sparse checkpoint's config.json (k3_demo_model.note) and
 * `k3ctl demo-model` say about it. */
#define K3_DEMO_SPARSE_NOTE "k3-sparse: Kimi K3's real layout at full size with every weight " \
	"zero (sparse holes): its output is meaningless; a rehearsal of scale, not of numbers"

/* Options; a 0 override keeps the preset's value. */
struct k3_demo_opts {
	enum k3_demo_preset preset;
	uint64_t seed;
	uint32_t layers, hidden, vocab, intermediate;
	uint32_t experts, top_k, moe_intermediate, latent, shared_experts;
	uint32_t kda_heads, kda_head_dim;
	uint32_t mla_heads, q_lora, kv_lora, nope, rope, v_head;
	uint32_t attn_res_block;
	uint32_t shards;             /* 0: automatic (>= 2) */
};

/* The resolved dimensions the generator will write (preset + overrides). */
struct k3_demo_dims {
	uint32_t layers, hidden, vocab, intermediate;
	uint32_t experts, top_k, moe_intermediate, latent, shared_experts;
	uint32_t kda_heads, kda_head_dim;
	uint32_t mla_heads, q_lora, kv_lora, nope, rope, v_head;
	uint32_t attn_res_block, shards;
	bool random_expert_codes;    /* bench: codes drawn directly, not quantized */
	bool release_layout;         /* k3-sparse: the release's shards (layer l in shard l + 1,
				      * embedding and head in shard L + 1, the vision tower and
				      * projector after), names and headers */
	bool sparse;                 /* k3-sparse: data regions are holes, never written */
};

/* "nano"/"small"/"bench"/"k3-sparse" -> preset; 0 or -EINVAL. */
int k3_demo_preset_parse(const char *s, enum k3_demo_preset *out);

/* Resolves o into *d and checks it: vocab >= 512 (256 byte ranks + 256
 * specials), MXFP4 widths (latent or hidden, moe_intermediate) multiples of
 * 32, top_k <= experts, block size <= layers, every dimension bounded.
 * Returns 0 or -EINVAL naming the option. */
int k3_demo_resolve(const struct k3_demo_opts *o, struct k3_demo_dims *d,
		    struct k3_err *err);

/* Writes the checkpoint into directory out (created if missing; existing
 * files of the same names are replaced). Layer typing: MLA at every 4th
 * layer (1-based) and at the last two, KDA elsewhere (K3's pattern); layer 0
 * dense, the rest MoE; AttnRes blocks of attn_res_block layers. Returns 0 or
 * a negative errno with the path in err. */
int k3_demo_write(const char *out, const struct k3_demo_opts *o, struct k3_err *err);

/* The synthetic DSpark draft (docs/text-and-draft.md §4, docs/draft.md)
 * written for a demo target: small MLA layers over the target's hidden
 * size and vocabulary, K3DSparkModel's tensor names, YaRN RoPE, taps
 * spread over the target's layers (at most K3_DEMO_DRAFT_TAPS). */
enum { K3_DEMO_DRAFT_TAPS = 5 };

struct k3_demo_draft_dims {
	uint32_t layers, heads, q_lora, kv_lora, nope, rope, v_head, inter, markov_rank;
};

struct k3_model;

/* The draft's own dimensions for a target (today the same for every one). */
void k3_demo_draft_dims(const struct k3_model *target, struct k3_demo_draft_dims *out);

/* Writes config.json and model.safetensors of a DSpark-format draft for
 * the open checkpoint target (any demo preset, trained included: its
 * hidden size, vocabulary and layer count; its embed_tokens copied byte
 * for byte, as the release ships K3's) into directory out, weights drawn
 * from seed. Weights are random: the draft loads, runs and proposes, and
 * the target rejects nearly everything. Returns 0 or a negative errno
 * with the path in err. */
int k3_demo_write_draft(const char *out, const struct k3_model *target, uint64_t seed,
			struct k3_err *err);

/* Writes tiktoken.model and tokenizer_config.json for vocab_size ids
 * (vocab_size - 256 BPE ranks, then the 256 specials) into dir. Also used
 * alone by the text tests. Returns 0 or a negative errno. */
int k3_demo_write_tokenizer(const char *dir, uint32_t vocab_size, struct k3_err *err);

/* Name of the special token at offset k (0..255) after the ranks, as in
 * the real K3 tokenizer (docs/text-and-draft.md §1.6), or NULL for a
 * reserved slot (<|reserved_token_ID|>). */
const char *k3_demo_special_name(uint32_t k);

#endif

/*
 * draft_dspark.h - the DSpark draft format (docs/text-and-draft.md §4;
 * Inferact/Kimi-K3-DSpark, vLLM's K3DSparkModel): a few dense MLA layers
 * with RoPE (YaRN) over context rows built from the target's hidden rows
 * at its tap layers, a non-causal block of `block` queries ([anchor, mask,
 * mask, ...]) checked block + 1 wide, a low-rank Markov head, and the
 * TARGET's embedding and lm_head (the checkpoint's own copies are never
 * read).
 *
 * Loading validates everything before any use (docs/draft.md, "DSpark"):
 * config.json (every field the forward needs, its RoPE/YaRN parameters and
 * its rms_norm_eps, taken from the file, never assumed), the tensor table
 * (every expected tensor present with its dtype and shape; tensors the
 * draft does not use are named in a list and skipped; any other tensor is
 * refused by name), and the fit to the target (hidden size, vocabulary,
 * layer count, tap layers). Errors name the file, the field or tensor, and
 * what was expected.
 */
#ifndef K3_DRAFT_DRAFT_DSPARK_H
#define K3_DRAFT_DRAFT_DSPARK_H

#include <stdbool.h>
#include <stdint.h>

#include "draft/draft.h"
#include "engine/engine.h"

/* config.json of a DSpark draft (docs/text-and-draft.md §4.2). */
struct k3_dspark_config {
	uint32_t hidden, inter, layers, heads;
	uint32_t q_lora, kv_lora, nope, rope, v_head;
	uint32_t vocab;
	float rms_eps;               /* every norm of the draft (vLLM's convention) */
	double rope_theta;
	bool yarn;                   /* rope_parameters / rope_scaling type "yarn" */
	double yarn_factor, yarn_orig_max, beta_fast, beta_slow, mscale, mscale_all_dim;
	uint64_t max_pos;
	uint32_t n_taps;
	uint32_t taps[K3_ENGINE_MAX_TAPS];   /* target_layer_ids */
	uint32_t target_hidden, target_layers;
	uint32_t mask_id, markov_rank;
	uint32_t block;              /* proposals per step (7; "block_size" if given) */
};

/* Parses and checks config.json text (len bytes). -EINVAL with a message
 * naming the field; -ENOMEM. */
int k3_dspark_config_parse(const char *json, size_t len, struct k3_dspark_config *out,
			   struct k3_err *err);

/*
 * Opens the DSpark draft in dir for the target engine e (whose model must
 * outlive the draft: its embedding and lm_head are borrowed): config,
 * tensor table and the fit to the target, as above. The forward runs on
 * the calling thread. Returns 0, or
 * -ENOENT (no config.json / safetensors), -EINVAL (the message says what
 * is wrong), -ENOMEM.
 */
int k3_draft_dspark_open(const char *dir, struct k3_engine *e, struct k3_draft **out,
			 struct k3_err *err);

/* A one-line summary ("5 layers, 64 heads, taps 2,23,47,71,89, block 7,
 * YaRN x32"); the string lives as long as d. */
const char *k3_draft_dspark_describe(const struct k3_draft *d);

/* The positions whose target rows are the draft's context now: first
 * and count (tests: only committed rows may be there). */
void k3_draft_dspark_context(const struct k3_draft *d, uint32_t *first, uint32_t *n);

#endif

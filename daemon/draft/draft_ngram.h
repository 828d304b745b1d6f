/*
 * draft_ngram.h - n-gram / suffix drafting (docs/draft.md, "n-gram"): the
 * proposal is what followed the most recent earlier occurrence of the
 * context's longest recurring suffix (the "prompt lookup" draft). Free
 * (no model), works for any target, strong wherever the output repeats
 * its input: code edits, tool calls, quoted text, structured data. The
 * context is the request's own: the rendered conversation (every earlier
 * turn is in the prompt) plus what was generated so far.
 *
 * Cost: an index of every n-gram end (n = min_n..max_n) by hash, updated
 * incrementally as the context grows: O(max_n) per new id, O(max_n +
 * proposal) per propose. Memory: about 16 bytes per context position and
 * n.
 */
#ifndef K3_DRAFT_DRAFT_NGRAM_H
#define K3_DRAFT_DRAFT_NGRAM_H

#include "draft/draft.h"

struct k3_draft_ngram_opts {
	uint32_t min_n;              /* shortest suffix that may match (0 = 2) */
	uint32_t max_n;              /* longest suffix looked up (0 = 4; <= 8) */
};

/* A new n-gram draft. Returns 0, -EINVAL (min_n > max_n, max_n > 8) or
 * -ENOMEM, with err. */
int k3_draft_ngram_new(const struct k3_draft_ngram_opts *o, struct k3_draft **out,
		       struct k3_err *err);

#endif

/*
 * draft_test.h - drafts for tests and benchmarks (docs/draft.md, "Test
 * drafts"), never offered to requests:
 *   - oracle: proposes the known continuation of a reference run (the ids
 *     plain greedy decoding produced), optionally spoiled so that a chosen
 *     share of its proposals is wrong: proves full acceptance and the
 *     pass count, and sets an acceptance rate for the benchmarks;
 *   - random: uniform random ids (acceptance ~0): proves that a draft that
 *     never pays costs at most one wider pass per token, and that the
 *     width policy switches it off.
 */
#ifndef K3_DRAFT_DRAFT_TEST_H
#define K3_DRAFT_DRAFT_TEST_H

#include <stdbool.h>

#include "draft/draft.h"

/*
 * The oracle: truth[0..n) is the whole reference sequence (prompt, then
 * the greedy ids). When the context is a prefix of truth it proposes
 * truth's next ids (as many as there are, at most max); else nothing.
 * Each proposed position is replaced by a wrong id (truth + 1 mod vocab)
 * with probability spoil (0 = always right, 1 = always wrong), decided by a
 * hash of (seed, position) so runs repeat. truth is copied.
 */
int k3_draft_oracle_new(const uint32_t *truth, size_t n, uint32_t vocab, double spoil,
			uint64_t seed, struct k3_draft **out, struct k3_err *err);

/* Uniform random ids in 0..vocab-1 from a generator seeded by seed. */
int k3_draft_random_new(uint32_t vocab, uint64_t seed, struct k3_draft **out, struct k3_err *err);

#endif

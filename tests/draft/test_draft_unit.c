/*
 * test_draft_unit.c - the pieces of drafting without a model:
 *   - n-gram: the proposal is what followed the latest earlier occurrence
 *     of the longest recurring suffix, continuing through its own output
 *     (loops), longer suffixes win, nothing for a suffix never seen, the
 *     index follows a growing context and starts over on a new one;
 *   - the oracle: the reference continuation, spoiled at the asked rate;
 *   - the pass-cost fit recovers a + b T from exact samples and keeps b
 *     at a/10 while only one width was seen;
 *   - the width policy: wide for a draft that is always right on a
 *     memory-bound target, off (then a probe after the back-off, which
 *     doubles) for one that is always wrong, and never wider than asked.
 */
#include <errno.h>

#include "t.h"

#include "draft/draft_ctl.h"
#include "draft/draft_ngram.h"
#include "draft/draft_test.h"

static void ngram(void)
{
	struct k3_err err = { 0 };
	struct k3_draft *d = NULL;
	uint32_t out[8];

	T_OK(k3_draft_ngram_new(NULL, &d, &err) == 0);
	/* "a b c d e" then "x b c": the suffix "b c" -> "d e x b c d e x" */
	uint32_t c1[] = { 1, 2, 3, 4, 5, 9, 2, 3 };
	T_EQ_INT(k3_draft_propose(d, c1, 8, 8, out, &err), 8);
	uint32_t w1[] = { 4, 5, 9, 2, 3, 4, 5, 9 };
	T_EQ_MEM(out, w1, sizeof(w1));
	/* the context grows (as a run extends it): the longest suffix wins,
	 * "3 4 5" recurs later than "5" alone */
	uint32_t c2[] = { 1, 2, 3, 4, 5, 9, 2, 3, 4, 5, 7, 7, 3, 4, 5 };
	T_EQ_INT(k3_draft_propose(d, c2, 15, 3, out, &err), 3);
	uint32_t w2[] = { 7, 7, 3 };
	T_EQ_MEM(out, w2, sizeof(w2));
	/* nothing recurs: nothing proposed */
	uint32_t c3[] = { 1, 2, 3, 4, 5, 9, 2, 3, 4, 5, 7, 7, 3, 4, 5, 8 };
	T_EQ_INT(k3_draft_propose(d, c3, 16, 4, out, &err), 0);
	/* a shorter context is a new one (reset): "6 6" -> 6 6 6 */
	uint32_t c4[] = { 6, 6, 6 };
	T_EQ_INT(k3_draft_propose(d, c4, 3, 3, out, &err), 3);
	T_OK(out[0] == 6 && out[1] == 6 && out[2] == 6);
	/* after reset the index is empty: a fresh context proposes from itself */
	k3_draft_reset(d);
	uint32_t c5[] = { 11, 12, 11, 12, 11 };
	T_EQ_INT(k3_draft_propose(d, c5, 5, 4, out, &err), 4);
	uint32_t w5[] = { 12, 11, 12, 11 };
	T_EQ_MEM(out, w5, sizeof(w5));
	/* a long context: the index grows past its first table */
	uint32_t *big = malloc(5000 * sizeof(uint32_t));
	for (uint32_t i = 0; i < 5000; i++)
		big[i] = i < 4990 ? i : i - 4000;     /* the tail repeats 990.. */
	k3_draft_reset(d);
	T_EQ_INT(k3_draft_propose(d, big, 5000, 5, out, &err), 5);
	T_OK(out[0] == 1000 && out[4] == 1004);
	free(big);
	k3_draft_free(d);
	/* options */
	struct k3_draft_ngram_opts bad = { .min_n = 5, .max_n = 3 };
	T_EQ_INT(k3_draft_ngram_new(&bad, &d, &err), -EINVAL);
	struct k3_draft_ngram_opts one = { .min_n = 1, .max_n = 1 };
	T_OK(k3_draft_ngram_new(&one, &d, &err) == 0);
	uint32_t c6[] = { 4, 8, 1, 4 };
	T_EQ_INT(k3_draft_propose(d, c6, 4, 2, out, &err), 2);
	T_OK(out[0] == 8 && out[1] == 1);
	k3_draft_free(d);
}

static void oracle(void)
{
	struct k3_err err = { 0 };
	struct k3_draft *d = NULL;
	uint32_t truth[400], out[8];
	for (uint32_t i = 0; i < 400; i++)
		truth[i] = (i * 31) % 100;
	T_OK(k3_draft_oracle_new(truth, 400, 100, 0.0, 1, &d, &err) == 0);
	T_EQ_INT(k3_draft_propose(d, truth, 10, 8, out, &err), 8);
	T_EQ_MEM(out, truth + 10, sizeof(out));
	T_EQ_INT(k3_draft_propose(d, truth, 398, 8, out, &err), 2);   /* the end of truth */
	uint32_t off[3] = { 5, 6, 8 };
	T_EQ_INT(k3_draft_propose(d, off, 3, 8, out, &err), 0);      /* not a prefix */
	k3_draft_free(d);
	/* spoiled half the time: about half of the positions wrong */
	T_OK(k3_draft_oracle_new(truth, 400, 100, 0.5, 7, &d, &err) == 0);
	uint32_t wrong = 0;
	for (uint32_t n = 1; n < 392; n += 8) {
		T_EQ_INT(k3_draft_propose(d, truth, n, 8, out, &err), 8);
		for (uint32_t i = 0; i < 8; i++)
			wrong += out[i] != truth[n + i];
	}
	T_OK(wrong > 392 * 4 / 10 && wrong < 392 * 6 / 10);
	k3_draft_free(d);
	T_EQ_INT(k3_draft_oracle_new(truth, 400, 100, 1.5, 7, &d, &err), -EINVAL);
}

static void cost_fit(void)
{
	struct k3_draft_cost c;
	k3_draft_cost_init(&c);
	T_OK(k3_draft_cost_predict(&c, 1) == 0);
	for (int i = 0; i < 10; i++)
		k3_draft_cost_add(&c, 1, 0.11);
	/* one width: b = a / 10 */
	T_NEAR(c.a, 0.1, 1e-9);
	T_NEAR(c.b, 0.01, 1e-9);
	for (int i = 0; i < 100; i++) {
		uint32_t T = 1 + (uint32_t)(i % 8);
		k3_draft_cost_add(&c, T, 0.2 + 0.03 * T);   /* a = 0.2, b = 0.03 */
	}
	/* older samples fade: the fit is close to the new line */
	T_NEAR(c.b, 0.03, 0.01);
	T_NEAR(k3_draft_cost_predict(&c, 8), 0.44, 0.03);
	k3_draft_cost_add(&c, 3, -1.0);                     /* ignored */
	k3_draft_cost_add(&c, 0, 1.0);
	T_NEAR(k3_draft_cost_predict(&c, 8), 0.44, 0.03);
}

/* Drives a controller with a draft whose proposals are right with
 * probability `right` on a target with pass cost a + b T; returns passes
 * with a draft in the first n. */
static uint32_t drive(struct k3_draft_ctl *ctl, struct k3_draft_cost *cost, bool right,
		      uint32_t n, uint32_t *widest)
{
	uint32_t drafted = 0;
	*widest = 0;
	for (uint32_t i = 0; i < n; i++) {
		uint32_t w = k3_draft_ctl_width(ctl, cost, 100);
		if (w > *widest)
			*widest = w;
		k3_draft_cost_add(cost, w + 1, 0.1 + 0.002 * (w + 1));
		if (w) {
			drafted++;
			k3_draft_ctl_observe(ctl, w, right ? w : 0, 0.0001);
		}
	}
	return drafted;
}

static void policy(void)
{
	struct k3_draft_cost cost;
	struct k3_draft_ctl ctl;
	uint32_t widest;

	/* memory-bound target (b << a), a draft always right: always wide */
	k3_draft_cost_init(&cost);
	k3_draft_ctl_init(&ctl, 7);
	T_EQ_INT(drive(&ctl, &cost, true, 100, &widest), 100);
	T_EQ_INT(widest, 7);
	T_EQ_INT(ctl.switched_off, 0);
	/* a draft always wrong: off after its first passes, probes between
	 * back-offs of 16, 32, 64, 128 passes ... */
	k3_draft_cost_init(&cost);
	k3_draft_ctl_init(&ctl, 7);
	uint32_t drafted = drive(&ctl, &cost, false, 500, &widest);
	T_OK(drafted <= 20);            /* < 4 % of the passes */
	T_OK(ctl.switched_off >= 3);
	T_OK(ctl.backoff >= 64);
	printf("always wrong: %u of 500 passes drafted, off %u times, back-off now %u\n", drafted,
	       ctl.switched_off, ctl.backoff);
	/* compute-bound target (b = a): a 50 % draft does not pay */
	k3_draft_cost_init(&cost);
	for (uint32_t T = 1; T <= 8; T++)
		k3_draft_cost_add(&cost, T, 0.1 * T);
	k3_draft_ctl_init(&ctl, 7);
	ctl.hits = 50;
	ctl.tries = 100;
	ctl.observed = true;
	T_EQ_INT(k3_draft_ctl_width(&ctl, &cost, 100), 0);
	/* a request's first call is a probe, whatever the prior says */
	k3_draft_ctl_init(&ctl, 7);
	T_EQ_INT(k3_draft_ctl_width(&ctl, &cost, 100), K3_DRAFT_CTL_PROBE_WIDTH);
	T_OK(ctl.probing);
	/* never wider than the limit */
	k3_draft_ctl_init(&ctl, 7);
	k3_draft_cost_init(&cost);
	T_OK(k3_draft_ctl_width(&ctl, &cost, 2) <= 2);
	T_EQ_INT(k3_draft_ctl_width(&ctl, &cost, 0), 0);
}

int main(void)
{
	ngram();
	oracle();
	cost_fit();
	policy();
	return t_done();
}

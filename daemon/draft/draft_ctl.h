/*
 * draft_ctl.h - how wide to draft (docs/draft.md, "Width"): the measured
 * cost of a target pass of T positions fitted online as t(T) = a + b T
 * (k3_draft_cost, one per engine: it is a property of the machine and the
 * model, shared by every request), and per request the acceptance rate p
 * of proposals and the draft's own cost (k3_draft_ctl). The width N of
 * the next pass maximises the expected tokens per second
 *
 *     E(N) / (t(N + 1) + c_draft),   E(N) = 1 + p + p^2 + ... + p^N
 *
 * (a pass yields the accepted prefix plus the target's own next id), with
 * N = 0 meaning a plain decode pass at rate 1 / t(1) (drafting must beat
 * it by 3 %: the estimates are noisy). A request's first drafted pass is
 * a probe at a small width, so its own acceptance decides. When N = 0 wins the
 * draft has stopped paying: it switches itself off for the request and
 * probes again (one pass at a small width) after a back-off of passes
 * that doubles each time the probe fails to pay (16 .. 256).
 */
#ifndef K3_DRAFT_DRAFT_CTL_H
#define K3_DRAFT_DRAFT_CTL_H

#include <stdbool.h>
#include <stdint.h>

/* t(T) = a + b T in seconds, a weighted least-squares fit over the passes
 * seen, older ones weighing less (forgetting factor 0.98 per pass). Until
 * passes of two widths were seen, b = a / 10 (an optimistic guess for a
 * memory-bound target: the first drafted pass then measures it). */
struct k3_draft_cost {
	double sw, sT, sTT, st, sTt; /* weighted sums of 1, T, T^2, t, T t */
	uint64_t n;                  /* passes seen */
	double a, b;                 /* the fit, seconds and seconds per position */
};

void k3_draft_cost_init(struct k3_draft_cost *c);
/* Adds a pass of T >= 1 positions that took seconds (> 0; others are
 * ignored) and refits. */
void k3_draft_cost_add(struct k3_draft_cost *c, uint32_t T, double seconds);
/* Predicted seconds of a T-position pass (0 before any pass). */
double k3_draft_cost_predict(const struct k3_draft_cost *c, uint32_t T);

struct k3_draft_ctl {
	uint32_t max_width;          /* proposals per pass at most */
	double hits, tries;          /* decayed accepted / tested proposals */
	double draft_s;              /* mean seconds per propose call (decayed) */
	uint64_t draft_calls;
	bool probing;                /* the pass being decided is a probe */
	bool observed;               /* a verification of this request was seen */
	uint32_t off_left;           /* passes left with the draft off; 0 = on */
	uint32_t backoff;            /* length of the next off period */
	uint32_t switched_off;       /* how often it switched itself off */
	uint32_t last_width;         /* the width the last call chose */
};

enum { K3_DRAFT_CTL_BACKOFF_MIN = 16, K3_DRAFT_CTL_BACKOFF_MAX = 256,
       K3_DRAFT_CTL_PROBE_WIDTH = 4 };

/* A request's controller: on, acceptance prior 1/2, at most max_width. */
void k3_draft_ctl_init(struct k3_draft_ctl *c, uint32_t max_width);
/* The acceptance estimate, (hits + 1/2) / (tries + 1) (the Jeffreys
 * prior), over proposals whose weight halves every ~35 passes. */
double k3_draft_ctl_acceptance(const struct k3_draft_ctl *c);
/* Proposals to ask for in the next pass, at most limit (the ids the
 * request may still emit after the anchor): 0 = a plain decode pass. */
uint32_t k3_draft_ctl_width(struct k3_draft_ctl *c, const struct k3_draft_cost *cost,
			    uint32_t limit);
/* After a pass that verified n >= 1 proposals of which the first m
 * matched (m <= n), whose propose call took draft_s seconds. A pass whose
 * draft proposed nothing counts only its draft time (n = 0). */
void k3_draft_ctl_observe(struct k3_draft_ctl *c, uint32_t n, uint32_t m, double draft_s);

#endif

/*
 * draft_ctl.c - the pass-cost fit and the width policy (see draft_ctl.h).
 */
#include "draft/draft_ctl.h"

#include <math.h>

enum { COST_PRIOR_DIV = 10 };
static const double cost_forget = 0.98, acc_decay = 0.98, draft_decay = 0.8;
/* Drafting must beat a plain pass by this factor to be chosen: the
 * estimates are noisy, and a draft that is nearly always wrong must go
 * off even where a wider pass costs almost nothing extra. */
static const double pay_margin = 1.03;

void k3_draft_cost_init(struct k3_draft_cost *c)
{
	*c = (struct k3_draft_cost){ 0 };
}

void k3_draft_cost_add(struct k3_draft_cost *c, uint32_t T, double seconds)
{
	if (T == 0 || !(seconds > 0) || !isfinite(seconds))
		return;
	double x = T;
	c->sw = c->sw * cost_forget + 1.0;
	c->sT = c->sT * cost_forget + x;
	c->sTT = c->sTT * cost_forget + x * x;
	c->st = c->st * cost_forget + seconds;
	c->sTt = c->sTt * cost_forget + x * seconds;
	c->n++;
	double mT = c->sT / c->sw, mt = c->st / c->sw;
	double varT = c->sTT / c->sw - mT * mT;
	if (varT < 0.05) {
		/* one width seen: a + b mT = mt with b = a / 10 */
		c->a = mt / (1.0 + mT / COST_PRIOR_DIV);
		c->b = c->a / COST_PRIOR_DIV;
		return;
	}
	double b = (c->sTt / c->sw - mT * mt) / varT;
	double a = mt - b * mT;
	if (b < 0) {                 /* wider passes measured faster: noise */
		b = 0;
		a = mt;
	}
	if (a < 0) {                 /* through the origin */
		a = 0;
		b = c->sTt / c->sTT;
	}
	c->a = a;
	c->b = b;
}

double k3_draft_cost_predict(const struct k3_draft_cost *c, uint32_t T)
{
	return c->a + c->b * T;
}

void k3_draft_ctl_init(struct k3_draft_ctl *c, uint32_t max_width)
{
	*c = (struct k3_draft_ctl){ .max_width = max_width, .backoff = K3_DRAFT_CTL_BACKOFF_MIN };
}

double k3_draft_ctl_acceptance(const struct k3_draft_ctl *c)
{
	return (c->hits + 0.5) / (c->tries + 1.0);
}

/* The width with the best expected tokens per second, 0..max. */
static uint32_t best_width(const struct k3_draft_ctl *c, const struct k3_draft_cost *cost,
			   uint32_t max)
{
	double p = k3_draft_ctl_acceptance(c);
	double t1 = k3_draft_cost_predict(cost, 1);
	double best = t1 > 0 ? pay_margin / t1 : 0.0, e = 1.0, pk = 1.0;
	uint32_t w = 0;

	if (cost->n == 0)            /* nothing measured yet: try a probe's width */
		return max < K3_DRAFT_CTL_PROBE_WIDTH ? max : K3_DRAFT_CTL_PROBE_WIDTH;
	for (uint32_t n = 1; n <= max; n++) {
		pk *= p;
		e += pk;
		double t = k3_draft_cost_predict(cost, n + 1) + c->draft_s;
		if (t > 0 && e / t > best) {
			best = e / t;
			w = n;
		}
	}
	return w;
}

uint32_t k3_draft_ctl_width(struct k3_draft_ctl *c, const struct k3_draft_cost *cost,
			    uint32_t limit)
{
	uint32_t max = c->max_width < limit ? c->max_width : limit;

	c->probing = false;
	c->last_width = 0;
	if (max == 0)
		return 0;
	if (c->off_left > 0) {
		if (--c->off_left > 0)
			return 0;
		/* back-off over: one probe pass to measure the acceptance again */
		c->probing = true;
		c->last_width = max < K3_DRAFT_CTL_PROBE_WIDTH ? max : K3_DRAFT_CTL_PROBE_WIDTH;
		return c->last_width;
	}
	if (!c->observed) {
		/* a request starts with a probe: its own acceptance, not the
		 * prior, decides (the prior alone never pays on a target whose
		 * wider passes cost nearly as much as that many plain ones) */
		c->probing = true;
		c->last_width = max < K3_DRAFT_CTL_PROBE_WIDTH ? max : K3_DRAFT_CTL_PROBE_WIDTH;
		return c->last_width;
	}
	c->last_width = best_width(c, cost, max);
	if (c->last_width == 0) {
		/* the draft stopped paying: off for this request, for a while */
		c->off_left = c->backoff;
		c->switched_off++;
		if (c->backoff < K3_DRAFT_CTL_BACKOFF_MAX)
			c->backoff *= 2;
	}
	return c->last_width;
}

void k3_draft_ctl_observe(struct k3_draft_ctl *c, uint32_t n, uint32_t m, double draft_s)
{
	if (draft_s >= 0) {
		c->draft_s = c->draft_calls ? c->draft_s * draft_decay + draft_s * (1 - draft_decay)
					    : draft_s;
		c->draft_calls++;
	}
	if (n == 0)
		return;
	c->observed = true;
	/* m successes, then one failure unless every proposal matched */
	c->hits = c->hits * acc_decay + m;
	c->tries = c->tries * acc_decay + m + (m < n);
	if (c->probing && m > 0)
		c->backoff = K3_DRAFT_CTL_BACKOFF_MIN;   /* it pays again: forget the back-off */
}

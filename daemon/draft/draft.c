/*
 * draft.c - the draft interface's dispatchers and the policy names (see
 * draft.h).
 */
#include "draft/draft.h"

#include <errno.h>
#include <string.h>

static const char *const policy_names[K3_DRAFT_POLICY_COUNT] = {
	"unset", "off", "auto", "ngram", "dspark",
};

int k3_draft_policy_parse(const char *s, enum k3_draft_policy *out, struct k3_err *err)
{
	for (int i = K3_DRAFT_POLICY_OFF; i < K3_DRAFT_POLICY_COUNT; i++)
		if (strcmp(s, policy_names[i]) == 0) {
			*out = (enum k3_draft_policy)i;
			return 0;
		}
	return k3_err_set(err, -EINVAL, "'%s' is not a draft policy (off, auto, ngram, dspark)", s);
}

const char *k3_draft_policy_name(enum k3_draft_policy p)
{
	return (unsigned)p < K3_DRAFT_POLICY_COUNT ? policy_names[p] : "?";
}

int k3_draft_propose(struct k3_draft *d, const uint32_t *ctx, size_t n, uint32_t max,
		     uint32_t *out, struct k3_err *err)
{
	if (n == 0)
		return k3_err_set(err, -EINVAL, "draft: empty context");
	if (max == 0)
		return 0;
	return d->ops->propose(d, ctx, n, max, out, err);
}

int k3_draft_accept(struct k3_draft *d, uint32_t pos0, const uint32_t *ids, uint32_t n,
		    const float *taps, struct k3_err *err)
{
	return d->ops->accept && n ? d->ops->accept(d, pos0, ids, n, taps, err) : 0;
}

void k3_draft_reset(struct k3_draft *d)
{
	if (d->ops->reset)
		d->ops->reset(d);
}

void k3_draft_free(struct k3_draft *d)
{
	if (d)
		d->ops->free(d);
}

/*
 * draft.c - the draft interface's dispatchers (see draft.h).
 */
#include "draft/draft.h"

#include <errno.h>

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

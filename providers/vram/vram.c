/*
 * vram.c - the VRAM expert tier's host logic (see vram.h): slot table,
 * global LRU eviction with pins, staging double buffer, shrink-and-retry,
 * failure latch.
 *
 * Slots 0..max_slots-1 are resident slots (device memory allocated on
 * first use, up to cap, which a recoverable allocation failure lowers to
 * what is allocated); the K3_VRAM_TRANSIENT slots after them are
 * allocated at creation and never enter the lookup table. Eviction is
 * least recently used across all layers: one expert costs the same
 * upload wherever it lives, so recency alone decides.
 */
#include "vram/vram.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct vram_slot {
	void *mem;                   /* device memory, NULL until allocated */
	int64_t key;                 /* layer * n_experts + expert, -1 when empty */
	bool pinned;                 /* used by the current step */
	int pend_buf;                /* staging buffer of its pending upload, -1 none */
	uint64_t pend_seq;           /* that buffer's upload number */
	uint64_t last_use;           /* tick of the last plan/load that pinned it */
	uint64_t use_epoch;          /* fence epoch in which the device last read it */
};

struct k3_vram {
	struct k3_vram_dev dev;
	struct k3_vram_config cfg;
	uint64_t off[K3_VRAM_ARRAYS];
	uint64_t slot_bytes, budget;
	uint32_t max_slots;          /* resident slots the budget allows at creation */
	uint32_t cap;                /* resident slots allowed now (<= max_slots) */
	uint32_t n_alloc;            /* resident slots with memory */
	uint32_t n_resident;
	struct vram_slot *slots;     /* [max_slots + K3_VRAM_TRANSIENT] */
	int32_t *slot_of;            /* [n_layers * n_experts] */
	uint32_t *seen;              /* [n_layers * n_experts]: plan stamp */
	uint32_t seen_gen;
	int32_t *pinned;             /* [max_slots + K3_VRAM_TRANSIENT] */
	uint32_t n_pinned;
	void *stage[K3_VRAM_STAGING];
	uint64_t stage_seq[K3_VRAM_STAGING];    /* uploads queued from each buffer */
	uint64_t stage_done[K3_VRAM_STAGING];   /* of which known complete */
	unsigned next_stage, next_transient;
	uint64_t tick, epoch;
	bool failed;
	int fail_code;
	struct k3_err fail_err;
	struct k3_vram_stats st;
};

uint64_t k3_vram_layout(const uint64_t array_bytes[K3_VRAM_ARRAYS], uint64_t off[K3_VRAM_ARRAYS])
{
	uint64_t at = 0;
	for (int i = 0; i < K3_VRAM_ARRAYS; i++) {
		if (array_bytes[i] > (UINT64_MAX >> 2) || at > (UINT64_MAX >> 2))
			return 0;
		off[i] = at;
		at += (array_bytes[i] + K3_VRAM_ALIGN - 1) / K3_VRAM_ALIGN * K3_VRAM_ALIGN;
	}
	return at;
}

uint64_t k3_vram_budget(uint64_t cfg_budget, uint64_t free_b, uint64_t total_b)
{
	if (cfg_budget)
		return cfg_budget;
	uint64_t head = total_b / 100 * K3_VRAM_HEADROOM_PCT +
			total_b % 100 * K3_VRAM_HEADROOM_PCT / 100;
	if (head < K3_VRAM_HEADROOM_MIN)
		head = K3_VRAM_HEADROOM_MIN;
	return free_b > head ? free_b - head : 0;
}

/* Latches an unrecoverable error: the tier is off from now on. */
static int vram_fail(struct k3_vram *v, int code, const struct k3_err *why, struct k3_err *err)
{
	if (!v->failed) {
		v->failed = true;
		v->fail_code = code;
		v->fail_err = *why;
		if (!v->fail_err.msg[0])
			k3_err_set(&v->fail_err, code, "device error %d", code);
	}
	if (err)
		*err = *why;
	return code;
}

static int wait_stage(struct k3_vram *v, unsigned b, struct k3_err *err)
{
	if (v->stage_done[b] == v->stage_seq[b])
		return 0;
	struct k3_err e = { 0 };
	int rc = v->dev.wait(v->dev.ctx, b, &e);
	if (rc)
		return vram_fail(v, rc, &e, err);
	v->stage_done[b] = v->stage_seq[b];
	return 0;
}

int k3_vram_drain(struct k3_vram *v, struct k3_err *err)
{
	for (unsigned b = 0; b < K3_VRAM_STAGING; b++) {
		int rc = wait_stage(v, b, err);
		if (rc)
			return rc;
	}
	return 0;
}

void k3_vram_free(struct k3_vram *v)
{
	if (!v)
		return;
	if (!v->failed)
		(void)k3_vram_drain(v, NULL);
	if (v->slots)
		for (uint32_t i = 0; i < v->max_slots + K3_VRAM_TRANSIENT; i++)
			if (v->slots[i].mem)
				v->dev.free(v->dev.ctx, v->slots[i].mem);
	for (unsigned b = 0; b < K3_VRAM_STAGING; b++)
		if (v->stage[b])
			v->dev.host_free(v->dev.ctx, v->stage[b]);
	free(v->slots);
	free(v->slot_of);
	free(v->seen);
	free(v->pinned);
	free(v);
}

int k3_vram_new(const struct k3_vram_dev *dev, const struct k3_vram_config *cfg,
		struct k3_vram **out, struct k3_err *err)
{
	*out = NULL;
	if (!dev || !dev->mem_info || !dev->alloc || !dev->free || !dev->host_alloc ||
	    !dev->host_free || !dev->upload || !dev->wait || !dev->fence)
		return k3_err_set(err, -EINVAL, "VRAM tier: incomplete device interface");
	if (!cfg->n_layers || cfg->n_layers > K3_PROV_MAX_LAYERS || !cfg->n_experts ||
	    cfg->n_experts > 1024)
		return k3_err_set(err, -EINVAL, "VRAM tier: %u layers x %u experts not supported",
				  cfg->n_layers, cfg->n_experts);
	struct k3_vram *v = calloc(1, sizeof(*v));
	if (!v)
		return k3_err_set(err, -ENOMEM, "out of memory");
	v->dev = *dev;
	v->cfg = *cfg;
	v->slot_bytes = k3_vram_layout(cfg->array_bytes, v->off);
	int rc = 0;
	if (!v->slot_bytes) {
		rc = k3_err_set(err, -EINVAL, "VRAM tier: bad expert array sizes");
		goto fail;
	}
	uint64_t free_b = 0, total_b = 0;
	rc = dev->mem_info(dev->ctx, &free_b, &total_b, err);
	if (rc)
		goto fail;
	v->budget = k3_vram_budget(cfg->budget_bytes, free_b, total_b);
	uint64_t need = (uint64_t)K3_VRAM_TRANSIENT * v->slot_bytes;
	if (v->budget < need) {
		rc = k3_err_set(err, -ENOSPC,
				"VRAM tier: budget %llu bytes (%llu free of %llu) below the %llu its "
				"%d transient expert slots need",
				(unsigned long long)v->budget, (unsigned long long)free_b,
				(unsigned long long)total_b, (unsigned long long)need, K3_VRAM_TRANSIENT);
		goto fail;
	}
	uint64_t n = (v->budget - need) / v->slot_bytes;
	/* more slots than experts exist would only waste the table */
	uint64_t n_keys = (uint64_t)cfg->n_layers * cfg->n_experts;
	v->max_slots = (uint32_t)(n < n_keys ? n : n_keys);
	v->cap = v->max_slots;
	size_t n_all = (size_t)v->max_slots + K3_VRAM_TRANSIENT;
	v->slots = calloc(n_all, sizeof(*v->slots));
	v->pinned = calloc(n_all, sizeof(*v->pinned));
	v->slot_of = malloc(n_keys * sizeof(*v->slot_of));
	v->seen = calloc(n_keys, sizeof(*v->seen));
	if (!v->slots || !v->pinned || !v->slot_of || !v->seen) {
		rc = k3_err_set(err, -ENOMEM, "out of memory for a VRAM tier of %u slots", v->max_slots);
		goto fail;
	}
	for (uint64_t k = 0; k < n_keys; k++)
		v->slot_of[k] = -1;
	for (size_t i = 0; i < n_all; i++) {
		v->slots[i].key = -1;
		v->slots[i].pend_buf = -1;
	}
	for (unsigned b = 0; b < K3_VRAM_STAGING; b++) {
		rc = dev->host_alloc(dev->ctx, v->slot_bytes, &v->stage[b], err);
		if (rc) {
			k3_err_prefix(err, "VRAM tier: pinned staging buffer of %llu bytes",
				      (unsigned long long)v->slot_bytes);
			goto fail;
		}
	}
	for (uint32_t t = 0; t < K3_VRAM_TRANSIENT; t++) {
		rc = dev->alloc(dev->ctx, v->slot_bytes, &v->slots[v->max_slots + t].mem, err);
		if (rc) {
			k3_err_prefix(err, "VRAM tier: transient slot of %llu bytes",
				      (unsigned long long)v->slot_bytes);
			goto fail;
		}
	}
	v->epoch = 1;
	*out = v;
	return 0;
fail:
	k3_vram_free(v);
	return rc;
}

static int check_id(const struct k3_vram *v, uint32_t layer, uint32_t expert, struct k3_err *err)
{
	if (layer >= v->cfg.n_layers || expert >= v->cfg.n_experts)
		return k3_err_set(err, -EINVAL, "VRAM tier: no expert %u in layer %u", expert, layer);
	return 0;
}

static void pin(struct k3_vram *v, int32_t i)
{
	struct vram_slot *s = &v->slots[i];
	if (!s->pinned) {
		s->pinned = true;
		v->pinned[v->n_pinned++] = i;
	}
	s->last_use = ++v->tick;
	s->use_epoch = v->epoch;
}

void k3_vram_step_end(struct k3_vram *v)
{
	for (uint32_t i = 0; i < v->n_pinned; i++)
		v->slots[v->pinned[i]].pinned = false;
	v->n_pinned = 0;
}

void k3_vram_note_fence(struct k3_vram *v)
{
	v->epoch++;
}

/* Before slot i is rewritten: the device must not be reading it. */
static int fence_for(struct k3_vram *v, int32_t i, struct k3_err *err)
{
	if (v->slots[i].use_epoch < v->epoch)
		return 0;
	struct k3_err e = { 0 };
	int rc = v->dev.fence(v->dev.ctx, &e);
	if (rc)
		return vram_fail(v, rc, &e, err);
	v->epoch++;
	return 0;
}

int k3_vram_plan(struct k3_vram *v, uint32_t layer, const uint32_t *ids, size_t n,
		 uint8_t *resident, struct k3_err *err)
{
	k3_vram_step_end(v);
	if (v->failed)
		return k3_err_set(err, -ENODEV, "VRAM tier is off: %s", v->fail_err.msg);
	for (size_t i = 0; i < n; i++)
		if (check_id(v, layer, ids[i], err))
			return -EINVAL;
	if (++v->seen_gen == 0) {
		memset(v->seen, 0, (size_t)v->cfg.n_layers * v->cfg.n_experts * sizeof(*v->seen));
		v->seen_gen = 1;
	}
	int misses = 0;
	for (size_t i = 0; i < n; i++) {
		int64_t key = (int64_t)layer * v->cfg.n_experts + ids[i];
		int32_t s = v->slot_of[key];
		bool first = v->seen[key] != v->seen_gen;
		v->seen[key] = v->seen_gen;
		resident[i] = s >= 0;
		if (s >= 0) {
			pin(v, s);
			if (first)
				v->st.hits++;
		} else if (first) {
			misses++;
		}
	}
	return misses;
}

int k3_vram_find(const struct k3_vram *v, uint32_t layer, uint32_t expert)
{
	if (layer >= v->cfg.n_layers || expert >= v->cfg.n_experts)
		return -1;
	int32_t s = v->slot_of[(int64_t)layer * v->cfg.n_experts + expert];
	return s >= 0 && v->slots[s].pinned ? s : -1;
}

/* A resident slot for a miss: a free allocated one, a new one within
 * cap, or the least recently used unpinned one; -1 when none (every slot
 * is pinned or the cap is 0). A recoverable allocation failure drains
 * and lowers cap to the slots allocated, then eviction is tried. */
static int32_t pick_resident(struct k3_vram *v, struct k3_err *err, int *rc)
{
	*rc = 0;
	for (uint32_t i = 0; i < v->n_alloc; i++)
		if (v->slots[i].key < 0 && !v->slots[i].pinned)
			return (int32_t)i;
	if (v->n_alloc < v->cap) {
		struct k3_err e = { 0 };
		int32_t i = (int32_t)v->n_alloc;
		int r = v->dev.alloc(v->dev.ctx, v->slot_bytes, &v->slots[i].mem, &e);
		if (r == 0) {
			v->n_alloc++;
			return i;
		}
		v->slots[i].mem = NULL;
		if (r != -ENOMEM) {
			*rc = vram_fail(v, r, &e, err);
			return -1;
		}
		/* the framework or another process took the memory: stop
		 * growing, let queued uploads finish, then evict instead */
		v->st.alloc_failures++;
		v->cap = v->n_alloc;
		if ((*rc = k3_vram_drain(v, err)) != 0)
			return -1;
	}
	int32_t best = -1;
	for (uint32_t i = 0; i < v->n_alloc; i++) {
		const struct vram_slot *s = &v->slots[i];
		if (s->pinned || s->key < 0)
			continue;
		if (best < 0 || s->last_use < v->slots[best].last_use)
			best = (int32_t)i;
	}
	if (best >= 0) {
		v->slot_of[v->slots[best].key] = -1;
		v->slots[best].key = -1;
		v->n_resident--;
		v->st.evictions++;
	}
	return best;
}

enum { COPY_PIECE = 1 << 20 };

/* The span's arrays into a staging buffer, in COPY_PIECE pieces that the
 * copy pool's threads take. */
struct stage_copy {
	const struct k3_vram *v;
	const uint8_t *const *src;
	uint8_t *dst;
	size_t first[K3_VRAM_ARRAYS + 1];   /* first piece of each array; [6] = total */
};

static void stage_copy_task(void *arg, size_t begin, size_t end)
{
	const struct stage_copy *c = arg;
	for (size_t p = begin; p < end; p++) {
		int a = 0;
		while (p >= c->first[a + 1])
			a++;
		uint64_t off = (uint64_t)(p - c->first[a]) * COPY_PIECE;
		uint64_t n = c->v->cfg.array_bytes[a] - off;
		if (n > COPY_PIECE)
			n = COPY_PIECE;
		memcpy(c->dst + c->v->off[a] + off, c->src[a] + off, n);
	}
}

static void stage_copy(const struct k3_vram *v, const uint8_t *const src[K3_VRAM_ARRAYS],
		       uint8_t *dst)
{
	struct stage_copy c = { .v = v, .src = src, .dst = dst };
	for (int a = 0; a < K3_VRAM_ARRAYS; a++)
		c.first[a + 1] = c.first[a] + (v->cfg.array_bytes[a] + COPY_PIECE - 1) / COPY_PIECE;
	k3_kern_pool_for(v->cfg.copy_pool, c.first[K3_VRAM_ARRAYS], 1, stage_copy_task, &c);
}

int k3_vram_load(struct k3_vram *v, uint32_t layer, uint32_t expert,
		 const struct k3_prov_expert *span, int *slot, struct k3_err *err)
{
	*slot = -1;
	if (v->failed)
		return k3_err_set(err, -ENODEV, "VRAM tier is off: %s", v->fail_err.msg);
	if (check_id(v, layer, expert, err))
		return -EINVAL;
	const uint8_t *src[K3_VRAM_ARRAYS] = { span->w1_packed, span->w1_scale, span->w3_packed,
					       span->w3_scale, span->w2_packed, span->w2_scale };
	for (int a = 0; a < K3_VRAM_ARRAYS; a++)
		if (!src[a])
			return k3_err_set(err, -EINVAL, "VRAM tier: layer %u expert %u has no span",
					  layer, expert);
	int64_t key = (int64_t)layer * v->cfg.n_experts + expert;
	if (v->slot_of[key] >= 0) {
		pin(v, v->slot_of[key]);
		*slot = v->slot_of[key];
		return 0;
	}
	int rc;
	int32_t i = pick_resident(v, err, &rc);
	if (rc)
		return rc;
	bool transient = i < 0;
	if (transient) {
		i = (int32_t)(v->max_slots + v->next_transient);
		v->next_transient = (v->next_transient + 1) % K3_VRAM_TRANSIENT;
		v->st.transient++;
	}
	if ((rc = fence_for(v, i, err)) != 0)
		return rc;
	/* the staging buffer is rewritten only once its last upload is done */
	unsigned b = v->next_stage;
	v->next_stage = (b + 1) % K3_VRAM_STAGING;
	if ((rc = wait_stage(v, b, err)) != 0)
		return rc;
	uint8_t *stage = v->stage[b];
	stage_copy(v, src, stage);
	struct vram_slot *s = &v->slots[i];
	struct k3_err e = { 0 };
	rc = v->dev.upload(v->dev.ctx, b, s->mem, stage, v->slot_bytes, &e);
	if (rc)
		return vram_fail(v, rc, &e, err);
	v->stage_seq[b]++;
	s->pend_buf = (int)b;
	s->pend_seq = v->stage_seq[b];
	if (!transient) {
		s->key = key;
		v->slot_of[key] = i;
		v->n_resident++;
	}
	pin(v, i);
	v->st.misses++;
	v->st.upload_bytes += v->slot_bytes;
	*slot = i;
	return 0;
}

int k3_vram_wait_slot(struct k3_vram *v, int slot, struct k3_err *err)
{
	if (slot < 0 || (uint32_t)slot >= v->max_slots + K3_VRAM_TRANSIENT)
		return k3_err_set(err, -EINVAL, "VRAM tier: no slot %d", slot);
	struct vram_slot *s = &v->slots[slot];
	if (s->pend_buf < 0)
		return 0;
	unsigned b = (unsigned)s->pend_buf;
	if (v->stage_done[b] < s->pend_seq) {
		int rc = wait_stage(v, b, err);
		if (rc)
			return rc;
	}
	s->pend_buf = -1;
	return 0;
}

void *k3_vram_slot_mem(const struct k3_vram *v, int slot)
{
	if (slot < 0 || (uint32_t)slot >= v->max_slots + K3_VRAM_TRANSIENT)
		return NULL;
	return v->slots[slot].mem;
}

bool k3_vram_failed(const struct k3_vram *v, int *code, const char **msg)
{
	if (code)
		*code = v->fail_code;
	if (msg)
		*msg = v->fail_err.msg;
	return v->failed;
}

void k3_vram_stats_get(const struct k3_vram *v, struct k3_vram_stats *st)
{
	*st = v->st;
	st->slots_cap = v->cap;
	st->slots_allocated = v->n_alloc;
	st->resident = v->n_resident;
	st->budget_bytes = v->budget;
	st->slot_bytes = v->slot_bytes;
}

/*
 * test_vram.c - the VRAM expert tier's host logic (providers/vram/vram.h)
 * on the CPU, driven through a fake device allocator:
 *   - the budget: auto = free - max(2 GiB, 20 % of the total), an explicit
 *     one as given, too small for the transient slots -> -ENOSPC;
 *   - plan -> hits and distinct misses, load -> upload, pins across the
 *     step, global LRU eviction across layers, transient slots once every
 *     resident slot is pinned (and with a zero resident budget);
 *   - staging double buffering: the fake performs each copy only when its
 *     buffer is waited for (as a real asynchronous copy may), so a staging
 *     buffer rewritten before its upload completed corrupts a slot: every
 *     slot's bytes are compared with the expert it claims to hold;
 *   - a transient slot rewritten while the device may read it is fenced
 *     first; a slot read in an earlier, finished epoch is not;
 *   - a recoverable allocation failure (-ENOMEM at the n-th allocation)
 *     drains both staging buffers, caps the slots at those allocated and
 *     the load still succeeds by eviction, with no further allocation;
 *   - an unrecoverable device error (-EIO from alloc, upload or wait)
 *     latches the tier off: later plans and loads return -ENODEV with the
 *     first message;
 *   - failures inside k3_vram_new leak nothing (the fake counts);
 *   - the staging copy split over a thread pool in 1 MiB pieces puts
 *     every byte of arrays of odd sizes where the layout says.
 */
#include "t.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "vram/vram.h"

enum { MAXQ = 64, NL = 4, NE = 8 };

/* The fake device: memory is host memory; an upload is queued and copied
 * only at the wait for its buffer (or when a later upload needs... never:
 * strictly at wait), so early staging reuse shows as wrong slot bytes. */
struct fake {
	uint64_t total, free;
	int allocs_live, host_live;
	int alloc_calls, fail_alloc_at, fail_alloc_code;
	int fail_upload_at, uploads, fail_wait;
	int waits[K3_VRAM_STAGING], fences, host_fail;
	struct { void *dst; const void *src; uint64_t bytes; unsigned buf; bool done; } q[MAXQ];
	int nq;
};

static int f_mem_info(void *c, uint64_t *fr, uint64_t *tot, struct k3_err *err)
{
	struct fake *f = c;
	(void)err;
	*fr = f->free;
	*tot = f->total;
	return 0;
}

static int f_alloc(void *c, uint64_t bytes, void **p, struct k3_err *err)
{
	struct fake *f = c;
	f->alloc_calls++;
	if (f->fail_alloc_at && f->alloc_calls == f->fail_alloc_at)
		return k3_err_set(err, f->fail_alloc_code, "fake alloc %d fails", f->alloc_calls);
	*p = malloc(bytes);
	f->allocs_live++;
	return 0;
}

static void f_free(void *c, void *p)
{
	struct fake *f = c;
	if (p)
		f->allocs_live--;
	free(p);
}

static int f_host_alloc(void *c, uint64_t bytes, void **p, struct k3_err *err)
{
	struct fake *f = c;
	if (f->host_fail)
		return k3_err_set(err, -ENOMEM, "fake pinned alloc fails");
	*p = malloc(bytes);
	f->host_live++;
	return 0;
}

static void f_host_free(void *c, void *p)
{
	struct fake *f = c;
	if (p)
		f->host_live--;
	free(p);
}

static int f_upload(void *c, unsigned buf, void *dst, const void *src, uint64_t bytes,
		    struct k3_err *err)
{
	struct fake *f = c;
	f->uploads++;
	if (f->fail_upload_at && f->uploads == f->fail_upload_at)
		return k3_err_set(err, -EIO, "fake upload %d fails", f->uploads);
	if (f->nq == MAXQ) {   /* keep the queue bounded: complete the oldest */
		memmove(f->q, f->q + 1, (MAXQ - 1) * sizeof(f->q[0]));
		f->nq--;
	}
	f->q[f->nq].dst = dst;
	f->q[f->nq].src = src;
	f->q[f->nq].bytes = bytes;
	f->q[f->nq].buf = buf;
	f->q[f->nq].done = false;
	f->nq++;
	return 0;
}

static int f_wait(void *c, unsigned buf, struct k3_err *err)
{
	struct fake *f = c;
	if (f->fail_wait)
		return k3_err_set(err, -EIO, "fake wait fails");
	f->waits[buf]++;
	for (int i = 0; i < f->nq; i++)
		if (f->q[i].buf == buf && !f->q[i].done) {
			memcpy(f->q[i].dst, f->q[i].src, f->q[i].bytes);
			f->q[i].done = true;
		}
	return 0;
}

static int f_fence(void *c, struct k3_err *err)
{
	struct fake *f = c;
	(void)err;
	f->fences++;
	return 0;
}

static struct k3_vram_dev dev_of(struct fake *f)
{
	return (struct k3_vram_dev){ K3_VRAM_DEV_INIT(f, f) };
}

/* Array sizes that need padding to K3_VRAM_ALIGN. */
static const uint64_t AB[K3_VRAM_ARRAYS] = { 1000, 40, 1000, 40, 900, 36 };

/* Host bytes of expert (l, e): every byte tells who it belongs to. */
static uint8_t host[NL][NE][K3_VRAM_ARRAYS][1000];

static struct k3_prov_expert span_of(uint32_t l, uint32_t e)
{
	return (struct k3_prov_expert){ host[l][e][0], host[l][e][1], host[l][e][2], host[l][e][3],
					host[l][e][4], host[l][e][5] };
}

static uint64_t OFF[K3_VRAM_ARRAYS], SLOT;

/* Slot `slot` holds exactly the bytes of (l, e). */
static bool slot_holds(struct k3_vram *v, int slot, uint32_t l, uint32_t e)
{
	const uint8_t *m = k3_vram_slot_mem(v, slot);
	for (int a = 0; a < K3_VRAM_ARRAYS; a++)
		if (memcmp(m + OFF[a], host[l][e][a], AB[a]) != 0)
			return false;
	return true;
}

static struct k3_vram *make(struct fake *f, struct k3_vram_dev *d, uint64_t budget, int *rc)
{
	struct k3_vram_config cfg = { .budget_bytes = budget, .n_layers = NL, .n_experts = NE };
	memcpy(cfg.array_bytes, AB, sizeof(AB));
	struct k3_vram *v = NULL;
	struct k3_err err = { 0 };
	*d = dev_of(f);
	*rc = k3_vram_new(d, &cfg, &v, &err);
	if (*rc)
		printf("     k3_vram_new: %s\n", err.msg);
	return v;
}

static int load(struct k3_vram *v, uint32_t l, uint32_t e, int *slot)
{
	struct k3_prov_expert sp = span_of(l, e);
	struct k3_err err = { 0 };
	int rc = k3_vram_load(v, l, e, &sp, slot, &err);
	if (rc == 0)
		rc = k3_vram_wait_slot(v, *slot, &err);
	return rc;
}

static void test_budget(void)
{
	const uint64_t G = 1ull << 30;
	/* 80 GiB device, 60 free: headroom 16 GiB (20 %) */
	T_EQ_U64(k3_vram_budget(0, 60 * G, 80 * G), 60 * G - 16 * G);
	/* 8 GiB device: 20 % is 1.6 GiB, below the 2 GiB floor */
	T_EQ_U64(k3_vram_budget(0, 6 * G, 8 * G), 4 * G);
	T_EQ_U64(k3_vram_budget(0, G, 8 * G), 0);
	T_EQ_U64(k3_vram_budget(5 * G, G, 8 * G), 5 * G);   /* explicit wins */

	SLOT = k3_vram_layout(AB, OFF);
	T_EQ_U64(SLOT, 3 * 1024 + 3 * 256);   /* 1000 -> 1024, 40 -> 256, 900 -> 1024, 36 -> 256 */
	T_EQ_U64(OFF[1], 1024);
	T_EQ_U64(OFF[5], 3 * 1024 + 2 * 256);

	struct fake f = { .total = 1 << 20, .free = 1 << 20 };
	struct k3_vram_dev d;
	int rc;
	struct k3_vram *v = make(&f, &d, 2 * SLOT - 1, &rc);
	T_EQ_INT(rc, -ENOSPC);
	T_OK(v == NULL);
	T_EQ_INT(f.allocs_live + f.host_live, 0);
	/* auto: 1 MiB free is all headroom -> too small */
	v = make(&f, &d, 0, &rc);
	T_EQ_INT(rc, -ENOSPC);
	/* pinned staging fails: nothing left behind */
	f.host_fail = 1;
	v = make(&f, &d, 10 * SLOT, &rc);
	T_EQ_INT(rc, -ENOMEM);
	T_EQ_INT(f.allocs_live + f.host_live, 0);
	f.host_fail = 0;
	/* the transient slots cannot be allocated */
	f.fail_alloc_at = 2;
	f.fail_alloc_code = -ENOMEM;
	v = make(&f, &d, 10 * SLOT, &rc);
	T_EQ_INT(rc, -ENOMEM);
	T_EQ_INT(f.allocs_live + f.host_live, 0);
}

static void test_plan_evict(void)
{
	struct fake f = { .total = 1 << 30, .free = 1 << 30 };
	struct k3_vram_dev d;
	int rc, s[8];
	/* 3 resident slots + 2 transient */
	struct k3_vram *v = make(&f, &d, 5 * SLOT, &rc);
	if (!T_OK(v != NULL))
		return;
	struct k3_vram_stats st;
	k3_vram_stats_get(v, &st);
	T_EQ_INT(st.slots_cap, 3);
	T_EQ_INT(st.slots_allocated, 0);    /* lazily, as they fill */

	uint32_t ids[4] = { 1, 2, 1, 3 };
	uint8_t res[4];
	struct k3_err err = { 0 };
	T_EQ_INT(k3_vram_plan(v, 0, ids, 4, res, &err), 3);    /* distinct misses */
	T_OK(!res[0] && !res[1] && !res[2] && !res[3]);
	T_EQ_INT(load(v, 0, 1, &s[0]), 0);
	T_EQ_INT(load(v, 0, 2, &s[1]), 0);
	T_EQ_INT(load(v, 0, 3, &s[2]), 0);
	T_OK(s[0] != s[1] && s[1] != s[2] && s[0] < 3 && s[2] < 3);
	T_OK(slot_holds(v, s[0], 0, 1) && slot_holds(v, s[1], 0, 2) && slot_holds(v, s[2], 0, 3));
	int again;
	T_EQ_INT(load(v, 0, 1, &again), 0);         /* resident: same slot, no upload */
	T_EQ_INT(again, s[0]);
	T_EQ_INT(f.uploads, 3);
	k3_vram_step_end(v);
	k3_vram_note_fence(v);

	/* the next step of another layer: hits stay pinned */
	T_EQ_INT(k3_vram_plan(v, 0, ids, 4, res, &err), 0);
	T_OK(res[0] && res[1] && res[2] && res[3]);
	T_EQ_INT(k3_vram_find(v, 0, 2), s[1]);
	k3_vram_step_end(v);
	T_EQ_INT(k3_vram_find(v, 0, 2), -1);        /* not pinned outside a step */
	k3_vram_note_fence(v);

	/* plan pins (0,3) and (0,1); a miss of layer 2 evicts the LRU
	 * unpinned one: (0,2), used before the other two */
	uint32_t keep[2] = { 3, 1 };
	T_EQ_INT(k3_vram_plan(v, 0, keep, 2, res, &err), 0);
	T_EQ_INT(load(v, 2, 5, &s[3]), 0);
	T_EQ_INT(s[3], s[1]);
	T_OK(slot_holds(v, s[3], 2, 5));
	k3_vram_stats_get(v, &st);
	T_EQ_U64(st.evictions, 1);
	T_EQ_INT(k3_vram_find(v, 0, 2), -1);
	/* every resident slot pinned now: the next misses go transient,
	 * alternating, and the second use of a transient slot in the same
	 * epoch is fenced first */
	T_EQ_INT(load(v, 3, 6, &s[4]), 0);
	T_EQ_INT(load(v, 3, 7, &s[5]), 0);
	T_OK(s[4] >= 3 && s[5] >= 3 && s[4] != s[5]);
	T_OK(slot_holds(v, s[4], 3, 6) && slot_holds(v, s[5], 3, 7));
	int fences = f.fences;
	T_EQ_INT(load(v, 1, 0, &s[6]), 0);
	T_EQ_INT(s[6], s[4]);
	T_EQ_INT(f.fences, fences + 1);
	T_OK(slot_holds(v, s[6], 1, 0));
	T_EQ_INT(k3_vram_find(v, 3, 6), -1);        /* transient: never resident */
	k3_vram_stats_get(v, &st);
	T_EQ_U64(st.transient, 3);
	T_EQ_INT(st.resident, 3);
	k3_vram_step_end(v);
	/* with the device known idle, no fence before reuse */
	k3_vram_note_fence(v);
	fences = f.fences;
	T_EQ_INT(k3_vram_plan(v, 1, keep, 0, res, &err), 0);
	T_EQ_INT(load(v, 1, 1, &s[7]), 0);
	T_EQ_INT(f.fences, fences);
	/* every slot still holds the bytes of what it claims */
	T_OK(slot_holds(v, k3_vram_find(v, 1, 1), 1, 1));
	k3_vram_step_end(v);
	/* that load evicted the least recent of (0,3) (0,1) (2,5): (0,3) */
	uint32_t all[2] = { 3, 1 };
	T_EQ_INT(k3_vram_plan(v, 0, all, 2, res, &err), 1);
	T_OK(!res[0] && res[1]);
	T_OK(slot_holds(v, k3_vram_find(v, 0, 1), 0, 1));
	k3_vram_step_end(v);
	/* bad ids change nothing */
	uint32_t bad = NE;
	T_EQ_INT(k3_vram_plan(v, 0, &bad, 1, res, &err), -EINVAL);
	T_EQ_INT(k3_vram_plan(v, NL, all, 1, res, &err), -EINVAL);
	T_OK(!k3_vram_failed(v, NULL, NULL));
	k3_vram_free(v);
	T_EQ_INT(f.allocs_live + f.host_live, 0);
}

/* Many loads through two staging buffers, each upload deferred to its
 * buffer's wait: a buffer reused early would corrupt a slot. */
static void test_staging(void)
{
	struct fake f = { .total = 1 << 30, .free = 1 << 30 };
	struct k3_vram_dev d;
	int rc, s[NE];
	struct k3_vram *v = make(&f, &d, (NE + 2) * SLOT, &rc);
	if (!T_OK(v != NULL))
		return;
	uint8_t res[NE];
	struct k3_err err = { 0 };
	uint32_t ids[NE];
	for (uint32_t e = 0; e < NE; e++)
		ids[e] = e;
	T_EQ_INT(k3_vram_plan(v, 1, ids, NE, res, &err), NE);
	/* queue all loads first, wait only at the end (hits compute while
	 * misses upload) */
	for (uint32_t e = 0; e < NE; e++) {
		struct k3_prov_expert sp = span_of(1, e);
		T_EQ_INT(k3_vram_load(v, 1, e, &sp, &s[e], &err), 0);
	}
	T_OK(f.waits[0] >= NE / 2 - 1 && f.waits[1] >= NE / 2 - 1);
	for (uint32_t e = 0; e < NE; e++) {
		T_EQ_INT(k3_vram_wait_slot(v, s[e], &err), 0);
		T_OK(slot_holds(v, s[e], 1, e));
	}
	k3_vram_free(v);
	T_EQ_INT(f.allocs_live + f.host_live, 0);
}

static void test_enomem_shrink(void)
{
	struct fake f = { .total = 1 << 30, .free = 1 << 30 };
	struct k3_vram_dev d;
	int rc, s;
	/* room for 4 resident slots; the 5th allocation (2 transient + the
	 * 3rd resident) fails as if the framework took the memory */
	f.fail_alloc_at = 5;
	f.fail_alloc_code = -ENOMEM;
	struct k3_vram *v = make(&f, &d, 6 * SLOT, &rc);
	if (!T_OK(v != NULL))
		return;
	struct k3_err err = { 0 };
	uint8_t res[1];
	int s0, s1;
	uint32_t e0 = 0, e1 = 1;
	T_EQ_INT(k3_vram_plan(v, 0, &e0, 1, res, &err), 1);
	T_EQ_INT(load(v, 0, 0, &s0), 0);
	k3_vram_step_end(v);
	/* an upload still pending (in buffer 1) when the failure comes */
	T_EQ_INT(k3_vram_plan(v, 0, &e1, 1, res, &err), 1);
	struct k3_prov_expert sp1 = span_of(0, 1);
	T_EQ_INT(k3_vram_load(v, 0, 1, &sp1, &s1, &err), 0);
	k3_vram_step_end(v);
	int w0 = f.waits[0], w1 = f.waits[1];
	uint32_t e2 = 2;
	T_EQ_INT(k3_vram_plan(v, 0, &e2, 1, res, &err), 1);
	struct k3_prov_expert sp = span_of(0, 2);
	T_EQ_INT(k3_vram_load(v, 0, 2, &sp, &s, &err), 0);
	T_OK(f.waits[1] > w1);                       /* drained */
	(void)w0;
	T_EQ_INT(k3_vram_wait_slot(v, s, &err), 0);
	T_EQ_INT(s, s0);                             /* evicted the LRU one, not transient */
	T_OK(slot_holds(v, s, 0, 2));
	T_OK(slot_holds(v, s1, 0, 1));               /* the drained upload landed */
	struct k3_vram_stats st;
	k3_vram_stats_get(v, &st);
	T_EQ_U64(st.alloc_failures, 1);
	T_EQ_INT(st.slots_cap, 2);
	T_EQ_U64(st.evictions, 1);
	int calls = f.alloc_calls;
	k3_vram_step_end(v);
	for (uint32_t e = 3; e < 6; e++) {
		T_EQ_INT(k3_vram_plan(v, 0, &e, 1, res, &err), 1);
		T_EQ_INT(load(v, 0, e, &s), 0);
		T_OK(slot_holds(v, s, 0, e));
		k3_vram_step_end(v);
	}
	T_EQ_INT(f.alloc_calls, calls);              /* capped: no more tries */
	T_OK(!k3_vram_failed(v, NULL, NULL));
	k3_vram_free(v);
	T_EQ_INT(f.allocs_live + f.host_live, 0);
}

static void test_unrecoverable(void)
{
	for (int mode = 0; mode < 3; mode++) {
		struct fake f = { .total = 1 << 30, .free = 1 << 30 };
		struct k3_vram_dev d;
		int rc, s;
		if (mode == 0) {
			f.fail_alloc_at = 3;       /* the first resident slot */
			f.fail_alloc_code = -EIO;
		} else if (mode == 1) {
			f.fail_upload_at = 1;
		}
		struct k3_vram *v = make(&f, &d, 6 * SLOT, &rc);
		if (!T_OK(v != NULL))
			continue;
		struct k3_err err = { 0 };
		uint8_t res[1];
		uint32_t e = 0;
		T_EQ_INT(k3_vram_plan(v, 0, &e, 1, res, &err), 1);
		struct k3_prov_expert sp = span_of(0, 0);
		rc = k3_vram_load(v, 0, 0, &sp, &s, &err);
		if (mode == 2) {
			T_EQ_INT(rc, 0);
			f.fail_wait = 1;
			rc = k3_vram_wait_slot(v, s, &err);
		}
		T_EQ_INT(rc, -EIO);
		const char *msg = NULL;
		int code = 0;
		T_OK(k3_vram_failed(v, &code, &msg));
		T_EQ_INT(code, -EIO);
		T_OK(msg && strstr(msg, "fake") != NULL);
		T_EQ_INT(k3_vram_plan(v, 0, &e, 1, res, &err), -ENODEV);
		T_OK(strstr(err.msg, "fake") != NULL);
		T_EQ_INT(k3_vram_load(v, 0, 1, &sp, &s, &err), -ENODEV);
		k3_vram_free(v);
		T_EQ_INT(f.allocs_live + f.host_live, 0);
	}
}

/* Arrays of several 1 MiB pieces copied into staging by a 3-thread pool:
 * every byte lands where the layout says. */
static void test_copy_pool(void)
{
	static const uint64_t big[K3_VRAM_ARRAYS] = { (3 << 20) + 17, 5, 1 << 20, 0, (2 << 20) - 1, 300 };
	struct fake f = { .total = 1ull << 40, .free = 1ull << 40 };
	struct k3_vram_dev d = dev_of(&f);
	struct k3_err err = { 0 };
	struct k3_kern_pool *pool = k3_kern_pool_new(3, &err);
	struct k3_vram_config cfg = { .budget_bytes = 64 << 20, .n_layers = 1, .n_experts = 2,
				      .copy_pool = pool };
	memcpy(cfg.array_bytes, big, sizeof(big));
	uint64_t off[K3_VRAM_ARRAYS];
	k3_vram_layout(big, off);
	uint8_t *src[K3_VRAM_ARRAYS];
	for (int a = 0; a < K3_VRAM_ARRAYS; a++) {
		src[a] = malloc(big[a] + 1);
		for (uint64_t i = 0; i < big[a]; i++)
			src[a][i] = (uint8_t)(i * 7 + a * 31 + (i >> 20));
	}
	struct k3_vram *v = NULL;
	if (T_OK(pool && k3_vram_new(&d, &cfg, &v, &err) == 0)) {
		struct k3_prov_expert sp = { src[0], src[1], src[2], src[3], src[4], src[5] };
		int slot;
		uint8_t res;
		uint32_t e = 1;
		T_EQ_INT(k3_vram_plan(v, 0, &e, 1, &res, &err), 1);
		T_EQ_INT(k3_vram_load(v, 0, 1, &sp, &slot, &err), 0);
		T_EQ_INT(k3_vram_wait_slot(v, slot, &err), 0);
		const uint8_t *m = k3_vram_slot_mem(v, slot);
		bool ok = true;
		for (int a = 0; a < K3_VRAM_ARRAYS; a++)
			ok = ok && memcmp(m + off[a], src[a], big[a]) == 0;
		T_OK(ok);
	}
	k3_vram_free(v);
	k3_kern_pool_free(pool);
	for (int a = 0; a < K3_VRAM_ARRAYS; a++)
		free(src[a]);
	T_EQ_INT(f.allocs_live + f.host_live, 0);
}

int main(void)
{
	for (uint32_t l = 0; l < NL; l++)
		for (uint32_t e = 0; e < NE; e++)
			for (int a = 0; a < K3_VRAM_ARRAYS; a++)
				for (int i = 0; i < 1000; i++)
					host[l][e][a][i] = (uint8_t)(l * 131 + e * 17 + a * 5 + i * 3);
	test_budget();
	test_plan_evict();
	test_staging();
	test_enomem_shrink();
	test_unrecoverable();
	test_copy_pool();
	return t_done();
}

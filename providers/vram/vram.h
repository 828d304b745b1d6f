/*
 * vram.h - the VRAM expert tier: routed experts kept in device memory
 * across steps, above the store's RAM cache (docs/providers.md, "VRAM
 * expert tier"). Device-agnostic host logic in C: the budget, the slot
 * table, eviction across all layers with the experts of the running step
 * pinned, the plan "resident set -> misses", double-buffered pinned staging
 * with completion waits, shrink-and-retry on a recoverable allocation
 * failure, and the fall-back decision on an unrecoverable one. The device
 * itself is behind struct k3_vram_dev (a real one over kernels/cuda in
 * vram_cuda.h, a host-memory one in vram_host.h, fakes in the tests).
 *
 * One step = one routed call of one MoE layer:
 *
 *   k3_vram_plan(v, L, ids, n, resident)   pins the resident ones (hits)
 *   ... the device computes the hits (k3_vram_slot_mem) ...
 *   k3_vram_load(v, L, e, span, &slot)     each miss: a slot (free, newly
 *                                          allocated, evicted, or transient),
 *                                          span -> staging buffer -> upload
 *   k3_vram_wait_slot(v, slot)             before computing on that slot
 *   k3_vram_step_end(v)                    unpins the step's experts
 *
 * Invariants: a pinned slot is never evicted or overwritten; a miss always
 * gets a slot (a transient one when every resident slot is pinned or the
 * budget is spent), so every expert of a step runs on the device whatever
 * the budget; a staging buffer is rewritten only after the uploads from it
 * completed (dev->wait); a transient slot is rewritten only after the
 * device finished reading it (dev->fence).
 *
 * Not thread-safe: one caller (the engine thread, inside the provider).
 */
#ifndef K3_VRAM_H
#define K3_VRAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "k3_provider.h"
#include "kern_pool.h"

enum {
	K3_VRAM_ARRAYS = 6,          /* w1 packed/scale, w3 packed/scale, w2 packed/scale */
	K3_VRAM_ALIGN = 256,         /* device offset alignment of each array */
	K3_VRAM_STAGING = 2,         /* pinned staging buffers (double buffering) */
	K3_VRAM_TRANSIENT = 2,       /* device slots for misses that cannot stay */
};

/* Headroom the automatic budget leaves free: max(2 GiB, 20 % of the
 * device), so the framework's own allocations (activations, workspaces)
 * keep room after the tier filled up. */
#define K3_VRAM_HEADROOM_MIN ((uint64_t)2 << 30)
#define K3_VRAM_HEADROOM_PCT 20

/*
 * The device, as the tier needs it. Every fallible op returns 0 or a
 * negative errno with err filled: -ENOMEM from alloc/host_alloc is
 * recoverable (the device stays usable); any other error is unrecoverable
 * and turns the tier off (k3_vram_failed).
 */
struct k3_vram_dev {
	void *ctx;
	/* Free and total device memory now, bytes. */
	int (*mem_info)(void *ctx, uint64_t *free_bytes, uint64_t *total_bytes, struct k3_err *err);
	/* Device memory of `bytes` (K3_VRAM_ALIGN-aligned). */
	int (*alloc)(void *ctx, uint64_t bytes, void **dev, struct k3_err *err);
	void (*free)(void *ctx, void *dev);
	/* Page-locked host memory (staging). */
	int (*host_alloc)(void *ctx, uint64_t bytes, void **host, struct k3_err *err);
	void (*host_free)(void *ctx, void *host);
	/* Queues a copy of `bytes` from staging buffer number `buf` (its
	 * memory is `src`) to device `dst` and marks its completion for wait;
	 * may return before the copy ran. */
	int (*upload)(void *ctx, unsigned buf, void *dst, const void *src, uint64_t bytes,
		      struct k3_err *err);
	/* Blocks until every upload queued from staging buffer `buf` completed
	 * (its event). */
	int (*wait)(void *ctx, unsigned buf, struct k3_err *err);
	/* Blocks until every computation the caller queued on the device
	 * finished (before a transient slot it may be reading is rewritten). */
	int (*fence)(void *ctx, struct k3_err *err);
};

/* The callbacks of a device whose functions are named P_mem_info, P_alloc,
 * ... P_fence (every slot, in struct order), as a designated initializer
 * list for a struct k3_vram_dev with context CTX. */
#define K3_VRAM_DEV_INIT(CTX, P)                                              \
	.ctx = (CTX), .mem_info = P##_mem_info, .alloc = P##_alloc,               \
	.free = P##_free, .host_alloc = P##_host_alloc,                           \
	.host_free = P##_host_free, .upload = P##_upload, .wait = P##_wait,       \
	.fence = P##_fence

struct k3_vram_config {
	/* Device bytes for resident experts, transient slots included;
	 * 0 = auto: free memory now minus max(K3_VRAM_HEADROOM_MIN,
	 * K3_VRAM_HEADROOM_PCT % of the total). Create the tier after the
	 * model's own device allocations, so "free" means what is left. */
	uint64_t budget_bytes;
	/* Host bytes of each of the six arrays of one expert, in
	 * struct k3_prov_expert order (w1 packed, w1 scale, w3 packed, w3
	 * scale, w2 packed, w2 scale); the same for every expert. */
	uint64_t array_bytes[K3_VRAM_ARRAYS];
	uint32_t n_layers, n_experts;
	/* Threads for the copy of a span into a staging buffer (borrowed;
	 * NULL = the calling thread): one thread's memcpy is slower than a
	 * PCIe 5 upload, so the copy is split in 1 MiB pieces. */
	struct k3_kern_pool *copy_pool;
};

struct k3_vram_stats {
	uint64_t hits;                /* experts a plan found resident */
	uint64_t misses;              /* experts loaded */
	uint64_t upload_bytes;
	uint64_t evictions;           /* resident experts dropped for a miss */
	uint64_t transient;           /* misses computed from a transient slot */
	uint64_t alloc_failures;      /* recoverable allocation failures (each drained and shrank) */
	uint32_t slots_cap;           /* resident slots the budget allows now */
	uint32_t slots_allocated;     /* resident slots holding device memory */
	uint32_t resident;            /* slots holding an expert */
	uint64_t budget_bytes;        /* the budget in force (auto resolved) */
	uint64_t slot_bytes;          /* device bytes of one expert */
};

struct k3_vram;

/* Device layout of one expert: array i at offset off[i] of its slot
 * (each K3_VRAM_ALIGN-aligned, in k3_prov_expert order); returns the slot
 * size in bytes, 0 when a size overflows. */
uint64_t k3_vram_layout(const uint64_t array_bytes[K3_VRAM_ARRAYS], uint64_t off[K3_VRAM_ARRAYS]);

/* The budget `cfg_budget` resolves to with `free_b` of `total_b` device
 * bytes free (auto when cfg_budget is 0); 0 when nothing fits. */
uint64_t k3_vram_budget(uint64_t cfg_budget, uint64_t free_b, uint64_t total_b);

/*
 * Creates the tier over dev (borrowed; must outlive it): resolves the
 * budget, allocates the two pinned staging buffers and the transient
 * slots (resident slots are allocated as they fill). Returns 0; -EINVAL
 * (bad config); -ENOSPC (the budget does not hold the transient slots;
 * the message gives the bytes needed); -ENOMEM or a device error. On any
 * error nothing stays allocated and the caller computes experts without
 * the tier.
 */
int k3_vram_new(const struct k3_vram_dev *dev, const struct k3_vram_config *cfg,
		struct k3_vram **out, struct k3_err *err);
/* Frees every slot and staging buffer (after dev->wait on both). NULL ok. */
void k3_vram_free(struct k3_vram *v);

/*
 * The plan of one step: ends the previous step (k3_vram_step_end), then
 * for each of ids[0..n) (experts of `layer`; duplicates allowed) sets
 * resident[i] = 1 and pins the expert when its device copy is complete,
 * else 0. Returns the number of distinct misses, or -EINVAL (layer or id
 * out of range; nothing pinned) / -ENODEV (the tier failed earlier).
 */
int k3_vram_plan(struct k3_vram *v, uint32_t layer, const uint32_t *ids, size_t n,
		 uint8_t *resident, struct k3_err *err);

/* The slot of a resident expert pinned by this step's plan or load; -1
 * when it is not. */
int k3_vram_find(const struct k3_vram *v, uint32_t layer, uint32_t expert);

/*
 * Puts a miss on the device for this step: picks a slot (a free one, a new
 * one within the budget, the least recently used unpinned one, or a
 * transient one), copies the six arrays of `span` into the next staging
 * buffer (after the uploads from it completed) and queues the upload.
 * *slot = the slot (pinned until step_end). Wait for the upload with
 * k3_vram_wait_slot before the device reads the slot. An expert already
 * resident returns its slot with nothing uploaded. A recoverable
 * allocation failure drains the uploads, caps the budget at the slots
 * already allocated and retries with eviction or a transient slot.
 * Returns 0; -EINVAL (bad ids or span); -ENODEV (failed earlier); a device
 * error (the tier is failed from then on: k3_vram_failed).
 */
int k3_vram_load(struct k3_vram *v, uint32_t layer, uint32_t expert,
		 const struct k3_prov_expert *span, int *slot, struct k3_err *err);

/* Blocks until the upload into `slot` (if any is pending) completed. */
int k3_vram_wait_slot(struct k3_vram *v, int slot, struct k3_err *err);

/* Device memory of slot `slot` (layout of k3_vram_layout). */
void *k3_vram_slot_mem(const struct k3_vram *v, int slot);

/* Unpins every expert of the current step. The device may still be
 * reading them: a slot read since the last fence is fenced (dev->fence)
 * before it is rewritten. */
void k3_vram_step_end(struct k3_vram *v);

/* Tells the tier the caller waited for every device computation (so no
 * slot is being read and no fence is needed before rewriting one). */
void k3_vram_note_fence(struct k3_vram *v);

/* Waits for every upload (both staging buffers). */
int k3_vram_drain(struct k3_vram *v, struct k3_err *err);

/* True once an unrecoverable error turned the tier off; *code and the
 * message of the first such error (either may be NULL). */
bool k3_vram_failed(const struct k3_vram *v, int *code, const char **msg);

void k3_vram_stats_get(const struct k3_vram *v, struct k3_vram_stats *st);

#endif

/*
 * vram_host.c - the VRAM tier's device interface over host memory (see
 * vram_host.h).
 */
#include "vram/vram_host.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* Allocation header: the size, so free can give the bytes back. */
struct host_block {
	uint64_t bytes;
	uint64_t pad[K3_VRAM_ALIGN / sizeof(uint64_t) - 1];
};

static int host_mem_info(void *ctx, uint64_t *free_b, uint64_t *total_b, struct k3_err *err)
{
	struct k3_vram_host *h = ctx;
	(void)err;
	*total_b = h->total_bytes;
	*free_b = h->total_bytes > h->used_bytes ? h->total_bytes - h->used_bytes : 0;
	return 0;
}

static int host_alloc(void *ctx, uint64_t bytes, void **out, struct k3_err *err)
{
	struct k3_vram_host *h = ctx;
	struct host_block *b = NULL;
	if (bytes > SIZE_MAX - sizeof(*b) ||
	    posix_memalign((void **)&b, K3_VRAM_ALIGN, sizeof(*b) + bytes) != 0)
		return k3_err_set(err, -ENOMEM, "host device: cannot allocate %llu bytes",
				  (unsigned long long)bytes);
	b->bytes = bytes;
	h->used_bytes += bytes;
	*out = b + 1;
	return 0;
}

static void host_free(void *ctx, void *mem)
{
	struct k3_vram_host *h = ctx;
	if (!mem)
		return;
	struct host_block *b = (struct host_block *)mem - 1;
	h->used_bytes -= b->bytes;
	free(b);
}

static int host_upload(void *ctx, unsigned buf, void *dst, const void *src, uint64_t bytes,
		       struct k3_err *err)
{
	(void)ctx;
	(void)buf;
	(void)err;
	memcpy(dst, src, bytes);
	return 0;
}

static int host_wait(void *ctx, unsigned buf, struct k3_err *err)
{
	(void)ctx;
	(void)buf;
	(void)err;
	return 0;
}

static int host_fence(void *ctx, struct k3_err *err)
{
	(void)ctx;
	(void)err;
	return 0;
}

void k3_vram_host_dev(struct k3_vram_host *ctx, struct k3_vram_dev *dev)
{
	*dev = (struct k3_vram_dev){
		.ctx = ctx,
		.mem_info = host_mem_info,
		.alloc = host_alloc,
		.free = host_free,
		/* staging is ordinary memory too (nothing to pin) */
		.host_alloc = host_alloc,
		.host_free = host_free,
		.upload = host_upload,
		.wait = host_wait,
		.fence = host_fence,
	};
}

/*
 * vram_cuda.c - the VRAM tier's device interface over kernels/cuda (see
 * vram_cuda.h). k3_cuda's -ENOMEM is recoverable (the tier shrinks); any
 * other error is the tier's unrecoverable one.
 */
#include "vram/vram_cuda.h"

#include <errno.h>

static int from_cuda(int rc, const struct k3_cuda_status *cs, struct k3_err *err)
{
	if (rc)
		k3_err_set(err, rc, "%s", cs->msg[0] ? cs->msg : "CUDA call failed");
	return rc;
}

static int c_mem_info(void *ctx, uint64_t *free_b, uint64_t *total_b, struct k3_err *err)
{
	struct k3_vram_cuda *c = ctx;
	struct k3_cuda_info info;
	struct k3_cuda_status cs = { 0 };
	int rc = k3_cuda_query(c->up, &info, &cs);
	if (rc)
		return from_cuda(rc, &cs, err);
	*free_b = info.mem_free;
	*total_b = info.mem_total;
	return 0;
}

static int c_alloc(void *ctx, uint64_t bytes, void **dev, struct k3_err *err)
{
	struct k3_vram_cuda *c = ctx;
	struct k3_cuda_status cs = { 0 };
	return from_cuda(k3_cuda_alloc(c->up, (size_t)bytes, dev, &cs), &cs, err);
}

static void c_free(void *ctx, void *dev)
{
	struct k3_vram_cuda *c = ctx;
	k3_cuda_free(c->up, dev);
}

static int c_host_alloc(void *ctx, uint64_t bytes, void **host, struct k3_err *err)
{
	struct k3_vram_cuda *c = ctx;
	struct k3_cuda_status cs = { 0 };
	return from_cuda(k3_cuda_host_alloc(c->up, (size_t)bytes, host, &cs), &cs, err);
}

static void c_host_free(void *ctx, void *host)
{
	struct k3_vram_cuda *c = ctx;
	k3_cuda_host_free(c->up, host);
}

static int c_upload(void *ctx, unsigned buf, void *dst, const void *src, uint64_t bytes,
		    struct k3_err *err)
{
	struct k3_vram_cuda *c = ctx;
	struct k3_cuda_status cs = { 0 };
	(void)buf;   /* one upload stream serves both staging buffers */
	return from_cuda(k3_cuda_upload(c->up, dst, src, (size_t)bytes, &cs), &cs, err);
}

static int c_wait(void *ctx, unsigned buf, struct k3_err *err)
{
	struct k3_vram_cuda *c = ctx;
	struct k3_cuda_status cs = { 0 };
	(void)buf;
	return from_cuda(k3_cuda_sync(c->up, &cs), &cs, err);
}

static int c_fence(void *ctx, struct k3_err *err)
{
	struct k3_vram_cuda *c = ctx;
	struct k3_cuda_status cs = { 0 };
	return from_cuda(k3_cuda_sync(c->compute, &cs), &cs, err);
}

void k3_vram_cuda_dev(struct k3_vram_cuda *ctx, struct k3_vram_dev *dev)
{
	*dev = (struct k3_vram_dev){ K3_VRAM_DEV_INIT(ctx, c) };
}

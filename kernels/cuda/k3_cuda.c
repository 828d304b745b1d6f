/*
 * k3_cuda.c - the host side of k3_cuda.h: device handle, memory, expert
 * upload, argument checks and launch set-up, and the error model (every
 * CUDA runtime call goes through K3_CUDA_TRY, which records the call,
 * file and line, clears recoverable errors and marks the handle dead on
 * sticky ones). Plain C over the CUDA runtime's C API; the kernels are in
 * mxfp4.cu and bf16.cu.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuda_launch.h"

struct k3_cuda_dev {
	int device;
	cudaStream_t stream;
	int dead;                          /* -EIO once a sticky error hit */
	char dead_msg[K3_CUDA_MSG_MAX];    /* the first sticky error */
};

__attribute__((format(printf, 3, 4)))
static int set_status(struct k3_cuda_status *st, int code, const char *fmt, ...)
{
	va_list ap;

	if (st) {
		st->code = code;
		va_start(ap, fmt);
		vsnprintf(st->msg, sizeof(st->msg), fmt, ap);
		va_end(ap);
	}
	return code;
}

/* Errors that leave the context usable once cleared. */
static bool recoverable(cudaError_t e)
{
	switch (e) {
	case cudaErrorMemoryAllocation:
	case cudaErrorInvalidValue:
	case cudaErrorInvalidDevicePointer:
	case cudaErrorInvalidConfiguration:
	case cudaErrorInvalidDevice:
	case cudaErrorNoDevice:
	case cudaErrorInsufficientDriver:
	case cudaErrorNotReady:
		return true;
	default:
		return false;
	}
}

static int errno_of(cudaError_t e)
{
	switch (e) {
	case cudaErrorMemoryAllocation:
		return -ENOMEM;
	case cudaErrorInvalidValue:
	case cudaErrorInvalidDevicePointer:
	case cudaErrorInvalidConfiguration:
		return -EINVAL;
	case cudaErrorInvalidDevice:
	case cudaErrorNoDevice:
	case cudaErrorInsufficientDriver:
		return -ENODEV;
	default:
		return -EIO;
	}
}

/* The failure path of K3_CUDA_TRY. Recoverable: clear the runtime's
 * last-error slot so the next call does not see it. Sticky: the context is
 * gone; remember the first message and refuse everything from now on. */
static int cuda_fail(struct k3_cuda_dev *d, struct k3_cuda_status *st,
	cudaError_t e, const char *call, const char *file, int line)
{
	int code = errno_of(e);

	if (recoverable(e)) {
		(void)cudaGetLastError();
		return set_status(st, code, "cuda: %s: %s (%s at %s:%d)", cudaGetErrorName(e),
			cudaGetErrorString(e), call, file, line);
	}
	set_status(st, -EIO, "cuda: sticky error %s: %s (%s at %s:%d); the device "
		"context is lost, restart the process", cudaGetErrorName(e),
		cudaGetErrorString(e), call, file, line);
	if (d && !d->dead) {
		d->dead = -EIO;
		snprintf(d->dead_msg, sizeof(d->dead_msg), "%s", st ? st->msg :
			cudaGetErrorName(e));
	}
	return -EIO;
}

#define K3_CUDA_TRY(d, st, call) do {                                          \
	cudaError_t e_ = (call);                                                   \
	if (e_ != cudaSuccess)                                                     \
		return cuda_fail((d), (st), e_, #call, __FILE__, __LINE__);            \
} while (0)

/* Every entry point that takes a handle starts here. */
static int check_dev(struct k3_cuda_dev *d, struct k3_cuda_status *st)
{
	if (!d)
		return set_status(st, -EINVAL, "cuda: no device handle");
	if (d->dead)
		return set_status(st, -EIO, "cuda device %d is unusable after an earlier "
			"error: %s", d->device, d->dead_msg);
	K3_CUDA_TRY(d, st, cudaSetDevice(d->device));
	return 0;
}

int k3_cuda_device_count(int *count, struct k3_cuda_status *st)
{
	cudaError_t e;
	int n = 0;

	if (!count)
		return set_status(st, -EINVAL, "cuda: count is NULL");
	*count = 0;
	e = cudaGetDeviceCount(&n);
	if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver ||
	    e == cudaErrorInitializationError) {
		(void)cudaGetLastError();
		return 0;
	}
	K3_CUDA_TRY(NULL, st, e);
	*count = n;
	return 0;
}

int k3_cuda_open(int device, struct k3_cuda_dev **out, struct k3_cuda_status *st)
{
	struct k3_cuda_dev *d;
	int n, rc;

	if (!out)
		return set_status(st, -EINVAL, "cuda: out is NULL");
	*out = NULL;
	rc = k3_cuda_device_count(&n, st);
	if (rc)
		return rc;
	if (device < 0 || device >= n)
		return set_status(st, -ENODEV, "cuda: no device %d (%d found)", device, n);
	d = calloc(1, sizeof(*d));
	if (!d)
		return set_status(st, -ENOMEM, "cuda: no host memory for a device handle");
	d->device = device;
	rc = check_dev(d, st);
	if (rc == 0) {
		cudaError_t e = cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking);

		if (e != cudaSuccess)
			rc = cuda_fail(d, st, e, "cudaStreamCreateWithFlags", __FILE__, __LINE__);
	}
	if (rc) {
		free(d);
		return rc;
	}
	*out = d;
	return 0;
}

struct k3_cuda_dev *k3_cuda_close(struct k3_cuda_dev *d)
{
	if (!d)
		return NULL;
	if (!d->dead && cudaSetDevice(d->device) == cudaSuccess) {
		(void)cudaStreamSynchronize(d->stream);
		(void)cudaStreamDestroy(d->stream);
	}
	free(d);
	return NULL;
}

bool k3_cuda_dead(const struct k3_cuda_dev *d)
{
	return d && d->dead;
}

int k3_cuda_query(struct k3_cuda_dev *d, struct k3_cuda_info *info,
	struct k3_cuda_status *st)
{
	struct cudaDeviceProp p;
	int rc = check_dev(d, st);

	if (rc)
		return rc;
	if (!info)
		return set_status(st, -EINVAL, "cuda: info is NULL");
	memset(info, 0, sizeof(*info));
	K3_CUDA_TRY(d, st, cudaGetDeviceProperties(&p, d->device));
	K3_CUDA_TRY(d, st, cudaMemGetInfo(&info->mem_free, &info->mem_total));
	info->device = d->device;
	snprintf(info->name, sizeof(info->name), "%s", p.name);
	info->cc_major = p.major;
	info->cc_minor = p.minor;
	info->sm_count = p.multiProcessorCount;
	return 0;
}

/* ------------------------------------------------------------------ */

/* Device memory (host false) or page-locked host memory into *p, after the
 * checks both entry points make. */
static int alloc_into(struct k3_cuda_dev *d, size_t bytes, void **p, bool host,
	struct k3_cuda_status *st)
{
	int rc = check_dev(d, st);

	if (rc)
		return rc;
	if (!p || bytes == 0)
		return set_status(st, -EINVAL, "cuda: %salloc of %zu bytes into %p",
			host ? "host " : "", bytes, (void *)p);
	*p = NULL;
	if (host)
		K3_CUDA_TRY(d, st, cudaMallocHost(p, bytes));
	else
		K3_CUDA_TRY(d, st, cudaMalloc(p, bytes));
	return 0;
}

int k3_cuda_alloc(struct k3_cuda_dev *d, size_t bytes, void **dptr,
	struct k3_cuda_status *st)
{
	return alloc_into(d, bytes, dptr, false, st);
}

void k3_cuda_free(struct k3_cuda_dev *d, void *dptr)
{
	if (d && dptr && !d->dead && cudaSetDevice(d->device) == cudaSuccess)
		(void)cudaFree(dptr);
}

int k3_cuda_host_alloc(struct k3_cuda_dev *d, size_t bytes, void **hptr,
	struct k3_cuda_status *st)
{
	return alloc_into(d, bytes, hptr, true, st);
}

void k3_cuda_host_free(struct k3_cuda_dev *d, void *hptr)
{
	if (d && hptr && !d->dead)
		(void)cudaFreeHost(hptr);
}

static int copy(struct k3_cuda_dev *d, void *dst, const void *src, size_t bytes,
	enum cudaMemcpyKind kind, struct k3_cuda_status *st)
{
	int rc = check_dev(d, st);

	if (rc)
		return rc;
	if (bytes == 0)
		return 0;
	if (!dst || !src)
		return set_status(st, -EINVAL, "cuda: copy of %zu bytes with a NULL pointer",
			bytes);
	K3_CUDA_TRY(d, st, cudaMemcpyAsync(dst, src, bytes, kind, d->stream));
	return 0;
}

int k3_cuda_upload(struct k3_cuda_dev *d, void *dst_dev, const void *src_host,
	size_t bytes, struct k3_cuda_status *st)
{
	return copy(d, dst_dev, src_host, bytes, cudaMemcpyHostToDevice, st);
}

int k3_cuda_download(struct k3_cuda_dev *d, void *dst_host, const void *src_dev,
	size_t bytes, struct k3_cuda_status *st)
{
	return copy(d, dst_host, src_dev, bytes, cudaMemcpyDeviceToHost, st);
}

int k3_cuda_copy(struct k3_cuda_dev *d, void *dst_dev, const void *src_dev,
	size_t bytes, struct k3_cuda_status *st)
{
	return copy(d, dst_dev, src_dev, bytes, cudaMemcpyDeviceToDevice, st);
}

int k3_cuda_sync(struct k3_cuda_dev *d, struct k3_cuda_status *st)
{
	int rc = check_dev(d, st);

	if (rc)
		return rc;
	K3_CUDA_TRY(d, st, cudaStreamSynchronize(d->stream));
	return 0;
}

/* ------------------------------------------------------------------ */
/* Experts                                                             */

enum { EXPERT_ALIGN = 256 };

static size_t align_up(size_t n)
{
	return (n + EXPERT_ALIGN - 1) / EXPERT_ALIGN * EXPERT_ALIGN;
}

/* Offsets of the six arrays in one allocation: w1 packed, w1 scales, w3
 * packed, w3 scales, w2 packed, w2 scales; off[6] = total. */
static bool expert_layout(uint32_t inter, uint32_t latent, size_t off[7])
{
	size_t gu_p, gu_s, dn_p, dn_s;

	if (inter == 0 || latent == 0 || inter % 32 || latent % 32 ||
	    inter > K3_CUDA_ROWS_MAX || latent > K3_CUDA_COLS_MAX)
		return false;
	gu_p = (size_t)inter * (latent / 2);
	gu_s = (size_t)inter * (latent / 32);
	dn_p = (size_t)latent * (inter / 2);
	dn_s = (size_t)latent * (inter / 32);
	off[0] = 0;
	off[1] = off[0] + align_up(gu_p);
	off[2] = off[1] + align_up(gu_s);
	off[3] = off[2] + align_up(gu_p);
	off[4] = off[3] + align_up(gu_s);
	off[5] = off[4] + align_up(dn_p);
	off[6] = off[5] + align_up(dn_s);
	return true;
}

size_t k3_cuda_expert_bytes(uint32_t inter, uint32_t latent)
{
	size_t off[7];

	return expert_layout(inter, latent, off) ? off[6] : 0;
}

int k3_cuda_expert_upload(struct k3_cuda_dev *d, uint32_t inter, uint32_t latent,
	const struct k3_cuda_expert_src *src, struct k3_cuda_expert *out,
	struct k3_cuda_status *st)
{
	size_t off[7], len[6];
	const uint8_t *from[6];
	uint8_t *mem;
	void *p = NULL;
	int rc;

	if (out)
		memset(out, 0, sizeof(*out));
	if (!out || !src)
		return set_status(st, -EINVAL, "cuda: expert upload without source or output");
	if (!expert_layout(inter, latent, off))
		return set_status(st, -EINVAL, "cuda: expert shape %ux%u (both multiples of "
			"32, at most %d)", inter, latent, K3_CUDA_ROWS_MAX);
	from[0] = src->w1_packed, from[1] = src->w1_scale;
	from[2] = src->w3_packed, from[3] = src->w3_scale;
	from[4] = src->w2_packed, from[5] = src->w2_scale;
	len[0] = len[2] = (size_t)inter * (latent / 2);
	len[1] = len[3] = (size_t)inter * (latent / 32);
	len[4] = (size_t)latent * (inter / 2);
	len[5] = (size_t)latent * (inter / 32);
	for (int i = 0; i < 6; i++)
		if (!from[i])
			return set_status(st, -EINVAL, "cuda: expert upload: source array %d is "
				"NULL", i);
	rc = k3_cuda_alloc(d, off[6], &p, st);
	if (rc)
		return rc;
	mem = p;
	for (int i = 0; i < 6 && rc == 0; i++)
		rc = k3_cuda_upload(d, mem + off[i], from[i], len[i], st);
	if (rc == 0)   /* the spans may be reused (or unmapped) after return */
		rc = k3_cuda_sync(d, st);
	if (rc) {
		k3_cuda_free(d, p);
		return rc;
	}
	out->w1 = (struct k3_cuda_mxfp4){ mem + off[0], mem + off[1], inter, latent };
	out->w3 = (struct k3_cuda_mxfp4){ mem + off[2], mem + off[3], inter, latent };
	out->w2 = (struct k3_cuda_mxfp4){ mem + off[4], mem + off[5], latent, inter };
	out->mem = p;
	out->bytes = off[6];
	return 0;
}

void k3_cuda_expert_free(struct k3_cuda_dev *d, struct k3_cuda_expert *e)
{
	if (!e)
		return;
	k3_cuda_free(d, e->mem);
	memset(e, 0, sizeof(*e));
}

/* ------------------------------------------------------------------ */
/* Products                                                            */

static bool aligned16(const void *p)
{
	return ((uintptr_t)p & 15) == 0;
}

/* Checks the shape rules of k3_cuda.h and fills one descriptor. */
static int check_job(const char *what, size_t j, const void *w, const uint8_t *scales,
	bool mx, uint32_t rows, uint32_t cols, uint32_t ld, uint32_t T,
	const float *x, uint32_t ldx, float *y, uint32_t ldy, struct k3_cuda_desc *out,
	struct k3_cuda_status *st)
{
	if (!w || (mx && !scales) || !x || !y)
		return set_status(st, -EINVAL, "cuda: %s job %zu: NULL weight, x or y", what, j);
	if (rows == 0 || rows > K3_CUDA_ROWS_MAX || cols == 0 || cols > K3_CUDA_COLS_MAX ||
	    cols % (mx ? 32 : 8) || (!mx && (ld < cols || ld % 8)))
		return set_status(st, -EINVAL, "cuda: %s job %zu: bad shape %ux%u ld %u (cols "
			"a multiple of %d)", what, j, rows, cols, ld, mx ? 32 : 8);
	if (T == 0 || T > K3_CUDA_T_MAX)
		return set_status(st, -EINVAL, "cuda: %s job %zu: T %u not in 1..%d", what, j,
			T, K3_CUDA_T_MAX);
	if (ldx < cols || ldx % 4 || (T > 1 && ldy < rows))
		return set_status(st, -EINVAL, "cuda: %s job %zu: ldx %u (>= cols %u, multiple "
			"of 4) or ldy %u (>= rows %u)", what, j, ldx, cols, ldy, rows);
	if (!aligned16(w) || !aligned16(x))
		return set_status(st, -EINVAL, "cuda: %s job %zu: weights and x must be "
			"16-byte aligned", what, j);
	*out = (struct k3_cuda_desc){ .w = w, .scales = scales, .x = x, .y = y,
		.rows = rows, .cols = cols, .ld = ld, .T = T, .ldx = ldx,
		.ldy = T > 1 ? ldy : rows,
		.row_items = (rows + K3_CUDA_RPW - 1) / K3_CUDA_RPW };
	return 0;
}

/* Positions per warp item: the smallest of 1, 4, 8 that covers the
 * largest T (so decode, T = 1, keeps its registers for rows), 8 beyond. */
static uint32_t tokens_per_item(uint32_t t_max)
{
	return t_max == 1 ? 1 : t_max <= 4 ? 4 : 8;
}

static int launch(struct k3_cuda_dev *d, struct k3_cuda_launch *l, bool mx,
	struct k3_cuda_status *st)
{
	uint32_t t_max = 0;
	uint64_t items = 0;

	for (uint32_t j = 0; j < l->n_jobs; j++)
		t_max = l->job[j].T > t_max ? l->job[j].T : t_max;
	l->tt = tokens_per_item(t_max);
	for (uint32_t j = 0; j < l->n_jobs; j++) {
		l->job[j].item0 = (uint32_t)items;
		items += (uint64_t)l->job[j].row_items * ((l->job[j].T + l->tt - 1) / l->tt);
		if (items > (uint64_t)INT32_MAX * K3_CUDA_WARPS / 2)
			return set_status(st, -EINVAL, "cuda: launch of %llu warp items is too "
				"large", (unsigned long long)items);
	}
	l->n_items = (uint32_t)items;
	if (l->n_items == 0)
		return 0;
	K3_CUDA_TRY(d, st, mx ? k3_cuda_launch_mxfp4(l, d->stream) :
		k3_cuda_launch_bf16(l, d->stream));
	return 0;
}

int k3_cuda_mxfp4_matmul_many(struct k3_cuda_dev *d, size_t n_jobs,
	const struct k3_cuda_mxfp4_job *jobs, struct k3_cuda_status *st)
{
	struct k3_cuda_launch *l;
	int rc = check_dev(d, st);

	if (rc)
		return rc;
	if (n_jobs > K3_CUDA_JOBS_MAX || (n_jobs && !jobs))
		return set_status(st, -EINVAL, "cuda: %zu jobs (at most %d)", n_jobs,
			K3_CUDA_JOBS_MAX);
	if (n_jobs == 0)
		return 0;
	l = calloc(1, sizeof(*l));
	if (!l)
		return set_status(st, -ENOMEM, "cuda: no host memory for a launch");
	l->n_jobs = (uint32_t)n_jobs;
	for (size_t j = 0; j < n_jobs && rc == 0; j++) {
		const struct k3_cuda_mxfp4_job *jb = &jobs[j];

		if (!jb->w)
			rc = set_status(st, -EINVAL, "cuda: mxfp4 job %zu: no matrix", j);
		else
			rc = check_job("mxfp4", j, jb->w->packed, jb->w->scales, true,
				jb->w->rows, jb->w->cols, 0, jb->T, jb->x, jb->ldx, jb->y,
				jb->ldy, &l->job[j], st);
	}
	if (rc == 0)
		rc = launch(d, l, true, st);
	free(l);
	return rc;
}

int k3_cuda_mxfp4_matmul(struct k3_cuda_dev *d, const struct k3_cuda_mxfp4 *w,
	uint32_t T, const float *x, uint32_t ldx, float *y, uint32_t ldy,
	struct k3_cuda_status *st)
{
	struct k3_cuda_mxfp4_job j = { .w = w, .T = T, .x = x, .ldx = ldx, .y = y,
		.ldy = ldy };

	return k3_cuda_mxfp4_matmul_many(d, 1, &j, st);
}

int k3_cuda_bf16_matmul(struct k3_cuda_dev *d, const struct k3_cuda_bf16 *w,
	uint32_t T, const float *x, uint32_t ldx, float *y, uint32_t ldy,
	struct k3_cuda_status *st)
{
	struct k3_cuda_launch *l;
	int rc = check_dev(d, st);

	if (rc)
		return rc;
	if (!w)
		return set_status(st, -EINVAL, "cuda: bf16 product without a matrix");
	l = calloc(1, sizeof(*l));
	if (!l)
		return set_status(st, -ENOMEM, "cuda: no host memory for a launch");
	l->n_jobs = 1;
	rc = check_job("bf16", 0, w->data, NULL, false, w->rows, w->cols,
		w->ld ? w->ld : w->cols, T, x, ldx, y, ldy, &l->job[0], st);
	if (rc == 0)
		rc = launch(d, l, false, st);
	free(l);
	return rc;
}

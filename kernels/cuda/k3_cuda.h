/*
 * k3_cuda.h - exact MXFP4 and BF16 matrix products on an NVIDIA GPU: the
 * contract a device provider (torch provider, VRAM expert tier) codes
 * against. Plain C, provider-agnostic: a device handle, device memory,
 * expert upload, batched products, and a status for every failure.
 *
 * Arithmetic is fp32 with the weights decoded in registers (docs/model.md
 * §9: E2M1 codes, E8M0 scales 2^(s-127), subnormal for s = 0, never
 * flushed); no fp16/bf16/tensor-core math, no dequantized copy of W.
 *
 * BATCH INVARIANCE. Each y[t][r] is one warp's reduction in a fixed order
 * (below) that depends only on the row and on cols: never on T, on the
 * other rows or jobs of the call, or on the launch shape. So the T = 1
 * result equals row t of a T = N call bit for bit (tested on the device,
 * tests/kernels/test_cuda.c). The order is not the CPU's: device and CPU
 * results agree within the named tolerance of that test, not bit for bit.
 *
 *   MXFP4 y[t][r]: lane l (0..31) of the row's warp takes groups
 *     g = l, l + 32, l + 64, ... (ascending); per group
 *       p = +0; p = fma(w[c], x[c], p) for its 32 columns ascending;
 *       acc_l = fma(p, 2^(s_g - 127), acc_l)     (acc_l from +0)
 *     then y = butterfly sum over lanes: v += shfl_xor(v, 16), 8, 4, 2, 1.
 *   BF16 y[t][r]: lane l takes the 8-column chunks starting at
 *     c = 256 i + 8 l (i ascending), acc_l = fma(w[c], x[c], acc_l) over
 *     each chunk's columns ascending (from +0); the same butterfly.
 *
 * ERRORS. Every fallible call returns 0 or a negative errno and fills
 * `st` (may be NULL) with a message naming the CUDA call, file and line:
 *   -EINVAL  bad argument (nothing done; the device stays usable)
 *   -ENOMEM  device or pinned memory exhausted: recoverable, the CUDA
 *            error is cleared and the device stays usable (a VRAM tier
 *            evicts and retries)
 *   -ENODEV  no usable device or driver
 *   -EIO     a sticky CUDA error (illegal address, launch failure, ECC,
 *            ...): the context is lost, the handle is dead and every later
 *            call fails with -EIO and the first message. The caller should
 *            fail queued work and exit non-zero so its supervisor restarts
 *            the process (docs/kernels.md, "CUDA kernels").
 * Nothing here aborts, prints or exits.
 *
 * Threads: a handle owns one CUDA stream; calls on one handle must not run
 * concurrently. Products are asynchronous on that stream; k3_cuda_sync
 * waits and reports launch errors.
 */
#ifndef K3_CUDA_H
#define K3_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
	K3_CUDA_MSG_MAX = 256,
	K3_CUDA_T_MAX = 64,        /* positions per product (decode 1, verify, prefill chunks) */
	K3_CUDA_JOBS_MAX = 64,     /* products per k3_cuda_mxfp4_matmul_many call */
	K3_CUDA_ROWS_MAX = 1 << 20,
	K3_CUDA_COLS_MAX = 1 << 20,
};

struct k3_cuda_status {
	int code;                  /* negative errno, 0 when unset */
	char msg[K3_CUDA_MSG_MAX]; /* NUL-terminated */
};

struct k3_cuda_dev;            /* opaque */

struct k3_cuda_info {
	int device;
	char name[256];
	int cc_major, cc_minor;    /* compute capability */
	int sm_count;
	size_t mem_total, mem_free;   /* bytes, at the time of the call */
};

/* Number of CUDA devices; 0 (and return 0) when there is no device or no
 * driver, so callers can skip cleanly. */
int k3_cuda_device_count(int *count, struct k3_cuda_status *st);

/* Opens device `device` (0-based): makes it current on the calling thread
 * and creates the handle's stream. *out is NULL on failure. */
int k3_cuda_open(int device, struct k3_cuda_dev **out, struct k3_cuda_status *st);

/* Destroys the stream (after waiting for it); frees nothing the caller
 * allocated. NULL is fine. Returns NULL. */
struct k3_cuda_dev *k3_cuda_close(struct k3_cuda_dev *d);

int k3_cuda_query(struct k3_cuda_dev *d, struct k3_cuda_info *info,
	struct k3_cuda_status *st);

/* True once a sticky error has killed the handle (see ERRORS). */
bool k3_cuda_dead(const struct k3_cuda_dev *d);

/* ------------------------------------------------------------------ */
/* Memory                                                              */

/* Device memory of `bytes` (> 0), 256-byte aligned, owned by the caller;
 * -ENOMEM is recoverable. k3_cuda_free(NULL) is fine. */
int k3_cuda_alloc(struct k3_cuda_dev *d, size_t bytes, void **dptr,
	struct k3_cuda_status *st);
void k3_cuda_free(struct k3_cuda_dev *d, void *dptr);

/* Page-locked host memory (fast, asynchronous copies). */
int k3_cuda_host_alloc(struct k3_cuda_dev *d, size_t bytes, void **hptr,
	struct k3_cuda_status *st);
void k3_cuda_host_free(struct k3_cuda_dev *d, void *hptr);

/* Copies of `bytes`, queued on the handle's stream (from pageable host
 * memory the upload returns when the source may be reused). */
int k3_cuda_upload(struct k3_cuda_dev *d, void *dst_dev, const void *src_host,
	size_t bytes, struct k3_cuda_status *st);
int k3_cuda_download(struct k3_cuda_dev *d, void *dst_host, const void *src_dev,
	size_t bytes, struct k3_cuda_status *st);
int k3_cuda_copy(struct k3_cuda_dev *d, void *dst_dev, const void *src_dev,
	size_t bytes, struct k3_cuda_status *st);

/* Waits for everything queued on the handle; reports asynchronous
 * (launch) errors. */
int k3_cuda_sync(struct k3_cuda_dev *d, struct k3_cuda_status *st);

/* ------------------------------------------------------------------ */
/* Weights                                                             */

/* A device MXFP4 matrix W[rows][cols] (docs/model.md §9): packed rows x
 * cols/2 bytes (low nibble = even column), scales rows x cols/32 E8M0
 * bytes; cols % 32 == 0; packed 16-byte aligned. */
struct k3_cuda_mxfp4 {
	const uint8_t *packed, *scales;
	uint32_t rows, cols;
};

/* A device BF16 matrix W[rows][cols], row r at data + r * ld (ld 0 means
 * cols); cols and ld multiples of 8, data 16-byte aligned. */
struct k3_cuda_bf16 {
	const uint16_t *data;
	uint32_t rows, cols, ld;
};

/* One routed expert in device memory (one allocation, `mem`): w1 gate and
 * w3 up [inter][latent], w2 down [latent][inter] (docs/model.md §8.2). */
struct k3_cuda_expert {
	struct k3_cuda_mxfp4 w1, w3, w2;
	void *mem;
	size_t bytes;              /* device bytes held (incl. alignment) */
};

/* Host spans of one expert, as stored (k3_prov_expert order). */
struct k3_cuda_expert_src {
	const uint8_t *w1_packed, *w1_scale;
	const uint8_t *w3_packed, *w3_scale;
	const uint8_t *w2_packed, *w2_scale;
};

/* Device bytes one expert of this shape takes (for tier budgets); 0 for a
 * bad shape. */
size_t k3_cuda_expert_bytes(uint32_t inter, uint32_t latent);

/*
 * Allocates and fills *out with one expert (inter = moe_inter 3072 for K3,
 * latent = 3584; both multiples of 32). Blocks until the host spans may be
 * reused. On failure *out is zeroed and nothing stays allocated; -ENOMEM
 * is recoverable.
 */
int k3_cuda_expert_upload(struct k3_cuda_dev *d, uint32_t inter, uint32_t latent,
	const struct k3_cuda_expert_src *src, struct k3_cuda_expert *out,
	struct k3_cuda_status *st);

/* Frees e->mem and zeroes *e (NULL or zeroed e is fine). */
void k3_cuda_expert_free(struct k3_cuda_dev *d, struct k3_cuda_expert *e);

/* ------------------------------------------------------------------ */
/* Products (device pointers; queued on the handle's stream)           */

/* One product y[t * ldy + r] = sum_c W[r][c] x[t * ldx + c], t < T, all
 * rows. x and y are device fp32, 16-byte aligned, ldx % 4 == 0, ldx >=
 * cols, ldy >= rows; 1 <= T <= K3_CUDA_T_MAX; y must not overlap x. */
struct k3_cuda_mxfp4_job {
	const struct k3_cuda_mxfp4 *w;
	uint32_t T;
	const float *x;
	uint32_t ldx;
	float *y;
	uint32_t ldy;
};

/* n_jobs (<= K3_CUDA_JOBS_MAX) products in one launch, e.g. the gate and
 * up of every expert a step selected; each job's y is bit-identical to
 * running it alone. Outputs must not overlap each other or any input.
 * -EINVAL if any job is malformed (nothing launched). */
int k3_cuda_mxfp4_matmul_many(struct k3_cuda_dev *d, size_t n_jobs,
	const struct k3_cuda_mxfp4_job *jobs, struct k3_cuda_status *st);

/* One MXFP4 product (k3_cuda_mxfp4_matmul_many with one job). */
int k3_cuda_mxfp4_matmul(struct k3_cuda_dev *d, const struct k3_cuda_mxfp4 *w,
	uint32_t T, const float *x, uint32_t ldx, float *y, uint32_t ldy,
	struct k3_cuda_status *st);

/* BF16 product with the same argument rules. */
int k3_cuda_bf16_matmul(struct k3_cuda_dev *d, const struct k3_cuda_bf16 *w,
	uint32_t T, const float *x, uint32_t ldx, float *y, uint32_t ldy,
	struct k3_cuda_status *st);

#ifdef __cplusplus
}
#endif

#endif

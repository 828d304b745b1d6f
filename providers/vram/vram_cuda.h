/*
 * vram_cuda.h - the VRAM tier's device (struct k3_vram_dev) over
 * kernels/cuda (k3_cuda.h): device and pinned memory, uploads on their own
 * handle (stream) so they run while the compute handle's products run.
 * Built only with the CUDA kernels (meson: cuda and a CUDA LibTorch).
 *
 * k3_cuda.h has no event API yet, so a staging buffer's wait is a wait for
 * the upload stream (every upload queued so far, both buffers): correct,
 * and on one copy engine the uploads complete in order anyway; a per-buffer
 * event would let the second buffer's copy keep running during the wait.
 */
#ifndef K3_VRAM_CUDA_H
#define K3_VRAM_CUDA_H

#include "k3_cuda.h"
#include "vram/vram.h"

struct k3_vram_cuda {
	struct k3_cuda_dev *up;       /* uploads (borrowed) */
	struct k3_cuda_dev *compute;  /* the products that read slots (borrowed) */
};

/* Fills *dev over ctx, which must outlive the tier. */
void k3_vram_cuda_dev(struct k3_vram_cuda *ctx, struct k3_vram_dev *dev);

#endif

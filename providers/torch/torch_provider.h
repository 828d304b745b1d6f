/*
 * torch_provider.h - the "torch" provider (providers/torch, C++17 over
 * LibTorch's ATen) as the C side sees it: the ABI table and a device probe
 * for `--provider auto`. Everything else is internal to providers/torch.
 *
 * The provider implements providers/k3_provider.h in fp32 through ATen on
 * the CPU or on a CUDA device (docs/providers.md). Every entry point
 * catches every C++ exception and returns the ABI's negative errno with a
 * message; nothing throws across the ABI.
 */
#ifndef K3_TORCH_PROVIDER_H
#define K3_TORCH_PROVIDER_H

#include "k3_provider.h"

#ifdef __cplusplus
extern "C" {
#endif

extern const struct k3_provider k3_provider_torch;

/*
 * Number of CUDA devices the torch provider would compute on: 0 when the
 * LibTorch it was built against has no CUDA, when no device or driver is
 * present, or when K3_TORCH_DEVICE=cpu. Never throws; cheap after the
 * first call.
 */
int k3_torch_cuda_devices(void);

#ifdef __cplusplus
}
#endif

#endif

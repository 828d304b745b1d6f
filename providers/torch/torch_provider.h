/*
 * torch_provider.h - the entry points of the "torch" provider module
 * (providers/torch, C++17 over LibTorch's ATen, built as k3prov_torch.so):
 * the ABI table and a device probe for `--provider auto`, the only symbols
 * the module exports. The registry looks them up with dlsym
 * (provider_registry.c); everything else is internal to providers/torch.
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

#define K3_TORCH_EXPORT __attribute__((visibility("default")))

extern K3_TORCH_EXPORT const struct k3_provider k3_provider_torch;

/*
 * Number of CUDA devices the torch provider would compute on: 0 when the
 * LibTorch it was built against has no CUDA, when no device or driver is
 * present, or when K3_TORCH_DEVICE=cpu. Never throws; cheap after the
 * first call.
 */
K3_TORCH_EXPORT int k3_torch_cuda_devices(void);

#ifdef __cplusplus
}
#endif

#endif

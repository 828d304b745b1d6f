/*
 * vram_host.h - a struct k3_vram_dev over ordinary host memory: "device"
 * allocations are malloc'd, uploads are memcpy done at once, waits and
 * fences return at once. It lets the VRAM tier's whole path (plan, load,
 * eviction, transient slots) run on a machine without a GPU: the torch
 * provider uses it on the CPU when a tier budget is given
 * (docs/providers.md), and the engine tests drive it end to end.
 */
#ifndef K3_VRAM_HOST_H
#define K3_VRAM_HOST_H

#include <stdint.h>

#include "vram/vram.h"

struct k3_vram_host {
	uint64_t total_bytes;        /* what mem_info reports as total */
	uint64_t used_bytes;         /* device bytes allocated now */
};

/* Fills *dev over ctx (which must outlive the tier); mem_info reports
 * total_bytes - used_bytes free of total_bytes. */
void k3_vram_host_dev(struct k3_vram_host *ctx, struct k3_vram_dev *dev);

#endif

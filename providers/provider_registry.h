/*
 * provider_registry.h - opening a provider (providers/k3_provider.h) by
 * name. The table is compiled in: "cpu" always; "torch" when built
 * (meson -Dtorch, docs/providers.md); "auto" picks one of them.
 */
#ifndef K3_PROVIDER_REGISTRY_H
#define K3_PROVIDER_REGISTRY_H

#include "base/err.h"
#include "k3_provider.h"

/* The provider called name ("auto": k3_provider_auto()), checked for ABI
 * compatibility (version and struct size). Returns NULL with -ENOENT
 * (unknown name; the message lists the known ones) or -EPROTO (ABI
 * mismatch) in err. Never free the result. */
const struct k3_provider *k3_provider_find(const char *name, struct k3_err *err);

/* What "auto" means on this machine: "torch" when the torch provider is
 * built with CUDA and a device is present, else "cpu". */
const char *k3_provider_auto(void);

/* Comma-separated names the registry accepts ("cpu, torch, auto"). */
const char *k3_provider_names(void);

#endif

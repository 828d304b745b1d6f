/*
 * provider_registry.h - opening a provider (providers/k3_provider.h) by
 * name. The table is compiled in: "cpu" always; "torch" when built.
 */
#ifndef K3_PROVIDER_REGISTRY_H
#define K3_PROVIDER_REGISTRY_H

#include "base/err.h"
#include "k3_provider.h"

/* The provider called name, checked for ABI compatibility (version and
 * struct size). Returns NULL with -ENOENT (unknown name; the message lists
 * the known ones) or -EPROTO (ABI mismatch) in err. Never free the result. */
const struct k3_provider *k3_provider_find(const char *name, struct k3_err *err);

/* Comma-separated names of the compiled-in providers ("cpu"). */
const char *k3_provider_names(void);

#endif

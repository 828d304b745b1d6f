/*
 * provider_registry.c - the compiled-in provider table, and what "auto"
 * resolves to (see provider_registry.h).
 */
#include "provider_registry.h"

#include <errno.h>
#include <string.h>

#include "k3_provider_config.h"
#if K3_HAVE_TORCH
#include "torch/torch_provider.h"
#endif

extern const struct k3_provider k3_provider_cpu;

static const struct k3_provider *const providers[] = {
	&k3_provider_cpu,
#if K3_HAVE_TORCH
	&k3_provider_torch,
#endif
};

const char *k3_provider_names(void)
{
#if K3_HAVE_TORCH
	return "cpu, torch, auto";
#else
	return "cpu, auto";
#endif
}

const char *k3_provider_auto(void)
{
#if K3_HAVE_TORCH
	/* torch-CPU is never faster than the cpu provider (docs/providers.md,
	 * measured): only a device makes torch the better choice */
	if (k3_torch_cuda_devices() > 0)
		return "torch";
#endif
	return "cpu";
}

const struct k3_provider *k3_provider_find(const char *name, struct k3_err *err)
{
	if (strcmp(name, "auto") == 0)
		name = k3_provider_auto();
	for (size_t i = 0; i < sizeof(providers) / sizeof(providers[0]); i++) {
		const struct k3_provider *p = providers[i];
		if (strcmp(p->name, name) != 0)
			continue;
		if (p->abi_version != K3_PROVIDER_ABI_VERSION ||
		    p->struct_size < sizeof(struct k3_provider)) {
			k3_err_set(err, -EPROTO, "provider '%s' has ABI %u (size %u), want %u (size %zu)",
				   name, p->abi_version, p->struct_size,
				   K3_PROVIDER_ABI_VERSION, sizeof(struct k3_provider));
			return NULL;
		}
		return p;
	}
	k3_err_set(err, -ENOENT, "unknown provider '%s' (known: %s)", name, k3_provider_names());
	return NULL;
}

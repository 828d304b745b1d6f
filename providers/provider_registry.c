/*
 * provider_registry.c - the compiled-in provider table.
 */
#include "provider_registry.h"

#include <errno.h>
#include <string.h>

extern const struct k3_provider k3_provider_cpu;

static const struct k3_provider *const providers[] = {
	&k3_provider_cpu,
};

const char *k3_provider_names(void)
{
	return "cpu";
}

const struct k3_provider *k3_provider_find(const char *name, struct k3_err *err)
{
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

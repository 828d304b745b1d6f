/*
 * provider_registry.c - the provider table and what "auto" resolves to
 * (see provider_registry.h).
 *
 * "cpu" is compiled in. "torch" is a module (providers/meson.build) loaded
 * with dlopen on first use, so that a process that never asks for it does
 * not pay for loading LibTorch (about 2 s with Debian's, measured).
 */
#include "provider_registry.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3_provider_config.h"

extern const struct k3_provider k3_provider_cpu;

#if K3_HAVE_TORCH
static struct {
	pthread_once_t once;
	const struct k3_provider *prov;
	int (*cuda_devices)(void);
	char why[K3_ERR_MSG_MAX];
} torch = { .once = PTHREAD_ONCE_INIT };

/* Loads the torch module once: $K3_PROVIDER_DIR/k3prov_torch.so, the
 * installed module, then the one in the build tree. */
static void torch_load(void)
{
	char env_path[4096];
	const char *dir = getenv("K3_PROVIDER_DIR");
	const char *paths[3] = { NULL, K3_TORCH_MODULE_INSTALL, K3_TORCH_MODULE_BUILD };
	if (dir && *dir && snprintf(env_path, sizeof(env_path), "%s/k3prov_torch.so", dir) <
			       (int)sizeof(env_path))
		paths[0] = env_path;
	size_t off = 0;
	for (int i = 0; i < 3; i++) {
		if (!paths[i])
			continue;
		void *h = dlopen(paths[i], RTLD_NOW | RTLD_LOCAL);
		if (!h) {
			const char *e = dlerror();
			if (off < sizeof(torch.why))
				off += (size_t)snprintf(torch.why + off, sizeof(torch.why) - off, "%s%s",
							off ? "; " : "", e ? e : paths[i]);
			continue;
		}
		torch.prov = dlsym(h, "k3_provider_torch");
		*(void **)&torch.cuda_devices = dlsym(h, "k3_torch_cuda_devices");
		if (torch.prov && torch.cuda_devices)
			return;   /* stays loaded for the process */
		torch.prov = NULL;
		snprintf(torch.why, sizeof(torch.why), "%s lacks the provider's entry points", paths[i]);
		dlclose(h);
		return;
	}
}

static const struct k3_provider *torch_get(struct k3_err *err)
{
	pthread_once(&torch.once, torch_load);
	if (!torch.prov)
		k3_err_set(err, -ENOENT, "provider 'torch' cannot be loaded: %s", torch.why);
	return torch.prov;
}
#endif

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
	if (torch_get(NULL) && torch.cuda_devices() > 0)
		return "torch";
#endif
	return "cpu";
}

const struct k3_provider *k3_provider_find(const char *name, struct k3_err *err)
{
	const struct k3_provider *p = NULL;
	if (strcmp(name, "auto") == 0)
		name = k3_provider_auto();
	if (strcmp(name, "cpu") == 0)
		p = &k3_provider_cpu;
#if K3_HAVE_TORCH
	else if (strcmp(name, "torch") == 0 && !(p = torch_get(err)))
		return NULL;
#endif
	if (!p) {
		k3_err_set(err, -ENOENT, "unknown provider '%s' (known: %s)", name, k3_provider_names());
		return NULL;
	}
	if (p->abi_version != K3_PROVIDER_ABI_VERSION || p->struct_size < sizeof(struct k3_provider)) {
		k3_err_set(err, -EPROTO, "provider '%s' has ABI %u (size %u), want %u (size %zu)",
			   name, p->abi_version, p->struct_size, K3_PROVIDER_ABI_VERSION,
			   sizeof(struct k3_provider));
		return NULL;
	}
	return p;
}

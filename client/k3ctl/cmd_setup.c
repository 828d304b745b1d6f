/*
 * cmd_setup.c - `k3ctl setup [--model-root DIR]`: find or explain how to
 * get the Kimi K3 checkpoint k3d serves by default.
 *
 * k3d never downloads anything itself (the daemon runs without network
 * access under its systemd unit). setup checks the default model location
 * and, when the checkpoint is there, validates every header, dtype, shape
 * and offset the way k3d will; when it is not, it prints the commands that
 * fetch it. Exit 0 when a valid checkpoint is in place, 1 otherwise.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "k3ctl.h"
#include "model/model.h"

int k3ctl_cmd_setup(int argc, char **argv)
{
	const char *root = NULL, *state = getenv("STATE_DIRECTORY");
	char dir[4096];
	struct stat st;
	struct k3_model *m = NULL;
	struct k3_err err = { 0, "" };

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--model-root") == 0 && i + 1 < argc)
			root = argv[++i];
		else
			return k3ctl_usage("setup", "[--model-root DIR]");
	}
	if (!root)
		root = state && *state ? NULL : "/var/lib/k3d/models";
	if (root)
		snprintf(dir, sizeof(dir), "%s/kimi-k3", root);
	else
		snprintf(dir, sizeof(dir), "%s/models/kimi-k3", state);
	if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
		printf("No Kimi K3 checkpoint at %s.\n\n"
		       "k3d does not download models itself. Fetch the release (about 1.5 TB; the\n"
		       "routed experts stream from disk, so a fast NVMe drive matters more than RAM):\n\n"
		       "  python3 -m pip install -U huggingface_hub\n"
		       "  hf download moonshotai/Kimi-K3 --local-dir %s\n\n"
		       "then run 'k3ctl setup' again to validate it, and 'k3ctl pack --model %s'\n"
		       "to write the expert packs k3d reads fastest. To try k3d without the\n"
		       "download: 'k3ctl demo-model --out DIR' and 'k3d --model DIR'.\n", dir, dir, dir);
		return K3CTL_EXIT_ERROR;
	}
	if (k3_model_open(dir, &m, &err) < 0)
		return k3ctl_fail(K3CTL_EXIT_ERROR, "%s is not a usable checkpoint: %s", dir, err.msg);
	printf("%s: valid K3-format checkpoint (%u layers, %u experts per MoE layer, vocab %u).\n"
	       "Start the daemon with 'k3d --model %s' (or 'systemctl start k3d', which uses\n"
	       "this location by default). 'k3ctl inspect %s' shows what fits in RAM.\n",
	       dir, k3_model_config(m)->num_hidden_layers, k3_model_config(m)->num_experts,
	       k3_model_config(m)->vocab_size, dir, dir);
	k3_model_free(m);
	return K3CTL_EXIT_OK;
}

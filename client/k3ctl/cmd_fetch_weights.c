/*
 * cmd_fetch_weights.c - `k3ctl fetch-weights [--spine-only | --experts-only]
 * [--layers 1-40,45,92] [setup's location and transfer options]`: fetch
 * parts of a streaming install (k3ctl setup --stream) ahead of use, by
 * range requests into its sparse shards, verified as setup_remote.h says.
 * Without a selection, everything missing: the spine of any shard not yet
 * present and every routed expert, which makes it a full install.
 * --layers takes model layer numbers (0-based, as in the tensor names).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/parse.h"
#include "k3ctl.h"
#include "model/model.h"
#include "setup/setup_remote.h"
#include "setup_cli.h"

/* "1-40,45,92" into sel[layer]. 0 or -EINVAL. */
static int parse_layers(const char *s, bool *sel, struct k3_err *err)
{
	char buf[4096], *save = NULL;

	if (strlen(s) >= sizeof(buf))
		return k3_err_set(err, -EINVAL, "the list is too long");
	snprintf(buf, sizeof(buf), "%s", s);
	for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		char *dash = strchr(tok, '-');
		uint64_t a, b;
		if (dash)
			*dash = '\0';
		if (k3_parse_u64(tok, 0, K3_MODEL_MAX_LAYERS - 1, &a, err) != 0 ||
		    k3_parse_u64(dash ? dash + 1 : tok, a, K3_MODEL_MAX_LAYERS - 1, &b, err) != 0)
			return -EINVAL;
		for (uint64_t l = a; l <= b; l++)
			sel[l] = true;
	}
	return 0;
}

#define USAGE "[--spine-only | --experts-only] [--layers 1-40,45,92] [--model-root DIR |" \
	" --model DIR] [--from URL] [--cacert FILE] [--workers N]"

int k3ctl_cmd_fetch_weights(int argc, char **argv)
{
	static bool layers[K3_MODEL_MAX_LAYERS];
	struct k3ctl_setup_cli c;
	struct k3_setup_fetch_sel sel = { .spine = true, .experts = true };
	struct k3_err err = { 0, "" };
	bool spine_only = false, experts_only = false, have_layers = false;
	int code;

	k3ctl_setup_cli_init(&c, "fetch-weights", USAGE);
	memset(layers, 0, sizeof(layers));
	for (int i = 0; k3ctl_setup_cli_next(&c, argc, argv, &i);) {
		if (strcmp(argv[i], "--spine-only") == 0) {
			spine_only = true;
		} else if (strcmp(argv[i], "--experts-only") == 0) {
			experts_only = true;
		} else if (strcmp(argv[i], "--layers") == 0 && i + 1 < argc) {
			if (parse_layers(argv[++i], layers, &err) != 0)
				return k3ctl_usage("fetch-weights", "--layers: %s (a list like 1-40,45,92)",
						   err.msg);
			have_layers = true;
		} else {
			return k3ctl_setup_cli_unexpected(&c, argv[i]);
		}
	}
	if (spine_only && (experts_only || have_layers))
		return k3ctl_usage("fetch-weights", "--spine-only excludes --experts-only and --layers");
	if ((code = k3ctl_setup_cli_finish(&c, false)) != 0)
		goto out;
	sel.spine = !experts_only;
	sel.experts = !spine_only;
	sel.layers = have_layers ? layers : NULL;
	code = k3_setup_fetch(&c.o, &sel, NULL, &err) ? k3ctl_setup_cli_fail(&err) : K3CTL_EXIT_OK;
out:
	k3ctl_setup_cli_release(&c);
	return code;
}

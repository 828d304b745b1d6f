/*
 * cmd_inventory.c - `k3ctl inventory DIR [--name N] [--repository R]
 * [--revision REV] [--base-url URL] > FILE`: the inventory of a local model
 * directory (every file's size and SHA-256, each shard's spine bytes, the
 * per-expert table when present), for people who host a mirror
 * (`k3ctl setup --from URL --inventory FILE`) and for tests.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3ctl.h"
#include "setup/setup_inventory.h"

int k3ctl_cmd_inventory(int argc, char **argv)
{
	struct k3_setup_scan_opts so = { 0 };
	struct k3_setup_inventory *inv = NULL;
	struct k3_err err = { 0, "" };
	const char *dir = NULL;
	char *text;

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--name") == 0 && i + 1 < argc)
			so.name = argv[++i];
		else if (strcmp(argv[i], "--repository") == 0 && i + 1 < argc)
			so.repository = argv[++i];
		else if (strcmp(argv[i], "--revision") == 0 && i + 1 < argc)
			so.revision = argv[++i];
		else if (strcmp(argv[i], "--base-url") == 0 && i + 1 < argc)
			so.base_url = argv[++i];
		else if (argv[i][0] != '-' && !dir)
			dir = argv[i];
		else
			return k3ctl_usage("inventory", "usage: k3ctl inventory DIR [--name N] [--repository R]"
					   " [--revision REV] [--base-url URL] (unexpected '%s')", argv[i]);
	}
	if (!dir)
		return k3ctl_usage("inventory", "a model directory is required");
	if (k3_setup_inventory_scan(dir, &so, &inv, &err) != 0)
		return k3ctl_fail(K3CTL_EXIT_ERROR, "%s", err.msg);
	text = k3_setup_inventory_dump(inv);
	k3_setup_inventory_free(inv);
	if (!text)
		return k3ctl_fail(K3CTL_EXIT_ERROR, "out of memory");
	fputs(text, stdout);
	free(text);
	return fflush(stdout) == 0 ? K3CTL_EXIT_OK : k3ctl_fail(K3CTL_EXIT_ERROR, "cannot write stdout");
}

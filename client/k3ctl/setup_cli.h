/*
 * setup_cli.h - the options that k3ctl setup, fetch-weights and
 * warm-expert-cache --fetch share: where the install is (--model-root DIR
 * and the inventory's name, or --model DIR), which inventory (--inventory
 * FILE, else the shipped kimi-k3.json), where from (--from URL, --cacert
 * FILE, a token from $HF_TOKEN or --token-file FILE) and how
 * (--workers N, --idle-timeout S, --retries N, --retry-delay MS,
 * --chunk-mib N, --reserve GB). Documented in k3ctl(1) and docs/setup.md.
 */
#ifndef K3CTL_SETUP_CLI_H
#define K3CTL_SETUP_CLI_H

#include <stdbool.h>

#include "setup/setup_install.h"
#include "setup/setup_inventory.h"

struct k3ctl_setup_cli {
	struct k3_setup_opts o;
	const char *model_root, *model_dir, *inventory_path, *token_file;
	struct k3_setup_inventory *inv;   /* loaded by k3ctl_setup_cli_finish */
	char dir[4096];
	char token[4096];
	const char *cmd, *synopsis;       /* for the usage messages */
	bool bad;                         /* a shared option was refused (usage printed) */
};

/* Sets the defaults; cmd and synopsis (its options, for "usage: k3ctl
 * CMD SYNOPSIS") name the command in usage messages. */
void k3ctl_setup_cli_init(struct k3ctl_setup_cli *c, const char *cmd, const char *synopsis);

/* Steps *i (start: 0) to the command's next argument, taking the shared
 * options (and their values) on the way. True with argv[*i] that
 * argument (a shared option without its value included), or with c->bad
 * set, a shared option refused (usage printed); false at the end of argv.
 * What the command does not take goes to k3ctl_setup_cli_unexpected. */
bool k3ctl_setup_cli_next(struct k3ctl_setup_cli *c, int argc, char **argv, int *i);

/* Refuses arg, an argument the command does not take: prints the usage
 * with it (nothing more after a refused shared option) and returns
 * K3CTL_EXIT_USAGE. */
int k3ctl_setup_cli_unexpected(const struct k3ctl_setup_cli *c, const char *arg);

/* Loads the inventory, decides the model directory and reads the token.
 * need_inventory false: a missing default inventory is fine when --model
 * names the install (its pinned copy is used). Returns 0 or the exit code
 * to use after printing why. */
int k3ctl_setup_cli_finish(struct k3ctl_setup_cli *c, bool need_inventory);

void k3ctl_setup_cli_release(struct k3ctl_setup_cli *c);

/* The exit code for a setup error: 1 (usage errors are found earlier). */
int k3ctl_setup_cli_fail(const struct k3_err *err);

#endif

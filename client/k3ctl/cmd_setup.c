/*
 * cmd_setup.c - `k3ctl setup [--full | --stream] [--plan | --check
 * [--rehash]] [--model-root DIR | --model DIR] [--from URL] [--inventory
 * FILE] [--cacert FILE] [--workers N] ...`: get the Kimi K3 checkpoint k3d
 * serves by default, verified against a pinned inventory (daemon/setup,
 * docs/setup.md).
 *
 * Without --full or --stream nothing is downloaded: an install that is
 * complete is audited (as --check), otherwise the plan is printed with the
 * commands that fetch it. --plan never touches the network or the disk;
 * --check is an offline audit. Exit 0 when the install is complete and
 * verified (or, with --plan, when it fits), 1 otherwise, 2 for usage.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "k3ctl.h"
#include "model/model.h"
#include "setup_cli.h"

/* A checkpoint that k3ctl setup did not install (copied, converted, a
 * demo model, an `hf download`): says whether k3d can open it. Returns
 * true when it handled the directory. */
static bool foreign_checkpoint(const char *dir, int *code)
{
	char path[4200];
	struct stat st;
	struct k3_model *m = NULL;
	struct k3_err err = { 0, "" };

	snprintf(path, sizeof(path), "%s/%s", dir, K3_SETUP_DIR);
	if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode) || stat(path, &st) == 0)
		return false;
	snprintf(path, sizeof(path), "%s/config.json", dir);
	if (stat(path, &st) != 0)
		return false;
	if (k3_model_open(dir, &m, &err) < 0) {
		*code = k3ctl_fail(K3CTL_EXIT_ERROR, "%s is not a usable checkpoint: %s", dir, err.msg);
		return true;
	}
	printf("%s: valid K3-format checkpoint (%u layers, %u experts per MoE layer, vocab %u),\n"
	       "not installed by k3ctl setup, so not verified against the pinned inventory:\n"
	       "'k3ctl setup --check' hashes every file. Start the daemon with 'k3d --model %s'.\n",
	       dir, k3_model_config(m)->num_hidden_layers, k3_model_config(m)->num_experts,
	       k3_model_config(m)->vocab_size, dir);
	k3_model_free(m);
	*code = K3CTL_EXIT_OK;
	return true;
}

#define USAGE "[--full | --stream] [--plan | --check [--rehash]] [--model-root DIR | --model DIR]" \
	" [--from URL] [--inventory FILE] [--cacert FILE] [--token-file FILE] [--workers N]" \
	" [--idle-timeout S] [--retries N] [--retry-delay MS] [--chunk-mib N] [--reserve GB]"

int k3ctl_cmd_setup(int argc, char **argv)
{
	struct k3ctl_setup_cli c;
	struct k3_setup_plan plan;
	struct k3_err err = { 0, "" };
	bool full = false, stream = false, do_plan = false, check = false, rehash = false;
	int rc, code;

	k3ctl_setup_cli_init(&c, "setup", USAGE);
	for (int i = 0; k3ctl_setup_cli_next(&c, argc, argv, &i);) {
		if (strcmp(argv[i], "--full") == 0)
			full = true;
		else if (strcmp(argv[i], "--stream") == 0)
			stream = true;
		else if (strcmp(argv[i], "--plan") == 0)
			do_plan = true;
		else if (strcmp(argv[i], "--check") == 0)
			check = true;
		else if (strcmp(argv[i], "--rehash") == 0)
			rehash = true;
		else
			return k3ctl_setup_cli_unexpected(&c, argv[i]);
	}
	if (full && stream)
		return k3ctl_usage("setup", "--full and --stream exclude each other");
	if (do_plan && check)
		return k3ctl_usage("setup", "--plan and --check exclude each other");
	if (rehash && !check)
		return k3ctl_usage("setup", "--rehash goes with --check");
	if ((code = k3ctl_setup_cli_finish(&c, !check)) != 0)
		goto out;
	c.o.stream = stream;
	if (check) {
		rc = k3_setup_check(c.inv, &c.o, rehash, k3ctl_g.json, &err);
		code = rc ? k3ctl_setup_cli_fail(&err) : K3CTL_EXIT_OK;
		goto out;
	}
	if (!do_plan && !full && !stream && foreign_checkpoint(c.dir, &code))
		goto out;
	if (do_plan || (!full && !stream)) {
		rc = k3_setup_plan_compute(c.inv, &c.o, &plan, &err);
		if (rc) {
			code = k3ctl_setup_cli_fail(&err);
			goto out;
		}
		if (!do_plan && plan.files_to_fetch == 0 && !plan.problem[0]) {
			/* everything is there: audit it as k3d will see it */
			rc = k3_setup_check(c.inv, &c.o, false, k3ctl_g.json, &err);
			if (rc == 0 && !k3ctl_g.json)
				printf("Start the daemon with 'k3d --model %s' (or 'systemctl start k3d', which"
				       " uses\n/var/lib/k3d/models/kimi-k3 by default). 'k3ctl inspect %s' shows"
				       " what fits in RAM.\n", c.dir, c.dir);
			code = rc ? k3ctl_setup_cli_fail(&err) : K3CTL_EXIT_OK;
			goto out;
		}
		k3_setup_plan_print(&plan, c.inv, &c.o, k3ctl_g.json, stdout);
		if (!do_plan) {
			if (!k3ctl_g.json)
				printf("\nNo complete install at %s. To fetch it (verified against the pinned"
				       " inventory, resumable):\n\n  k3ctl setup --full%s%s      # every file, ~1.5 TB"
				       "\n  k3ctl setup --stream%s%s    # metadata and spine now, routed experts"
				       " on demand\n\nthen 'k3ctl pack --model %s' for the fastest expert reads."
				       " (With the Hugging Face\ntools instead: 'hf download %s --revision %s"
				       " --local-dir %s',\nthen 'k3ctl setup --check' to verify it.) To try k3d"
				       " without the download:\n'k3ctl demo-model --out DIR' and 'k3d --model"
				       " DIR'.\n", c.dir, c.model_root ? " --model-root " : "",
				       c.model_root ? c.model_root : "", c.model_root ? " --model-root " : "",
				       c.model_root ? c.model_root : "", c.dir, c.inv->repository,
				       c.inv->revision, c.dir);
			code = K3CTL_EXIT_ERROR;
		} else if (plan.problem[0] || !plan.fits) {
			code = k3ctl_fail(K3CTL_EXIT_ERROR, "%s", plan.problem[0] ? plan.problem :
					  "the install does not fit: see 'result' above");
		} else {
			code = K3CTL_EXIT_OK;
		}
		goto out;
	}
	rc = k3_setup_install(c.inv, &c.o, &err);
	code = rc ? k3ctl_setup_cli_fail(&err) : K3CTL_EXIT_OK;
	if (rc == 0 && !k3ctl_g.json)
		printf("%s: %s install verified against %s@%s. Start k3d with 'k3d --model %s%s'.\n",
		       c.dir, stream ? "streaming" : "full", c.inv->repository, c.inv->revision, c.dir,
		       stream ? " --fetch-experts" : "");
out:
	k3ctl_setup_cli_release(&c);
	return code;
}

/* setup_cli.c - options shared by the commands that fetch the model (see setup_cli.h). */
#include "setup_cli.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/parse.h"
#include "k3_build_config.h"
#include "setup/setup_transfer.h"
#include "k3ctl.h"

#define DEFAULT_INVENTORY "kimi-k3.json"

void k3ctl_setup_cli_init(struct k3ctl_setup_cli *c, const char *cmd, const char *synopsis)
{
	memset(c, 0, sizeof(*c));
	c->cmd = cmd;
	c->synopsis = synopsis;
	k3_setup_opts_default(&c->o);
	c->o.progress = k3ctl_g.json ? K3_SETUP_PROGRESS_JSON : K3_SETUP_PROGRESS_AUTO;
}

/* If argv[*i] is one of the shared options, consumes it (and its value)
 * and returns 1; 0 when it is not one; -1 after printing a usage error. */
static int option(struct k3ctl_setup_cli *c, int argc, char **argv, int *i)
{
	const char *a = argv[*i];
	/* the options whose value is kept as given, and the counts */
	const struct k3ctl_arg_str strs[] = {
		{ "--model-root", &c->model_root }, { "--model", &c->model_dir },
		{ "--inventory", &c->inventory_path }, { "--from", &c->o.from },
		{ "--cacert", &c->o.cacert }, { "--token-file", &c->token_file },
	};
	const struct { const char *name; uint64_t lo, hi; unsigned *to; } counts[] = {
		{ "--workers", 1, K3_SETUP_MAX_WORKERS, &c->o.workers },
		{ "--idle-timeout", 1, 3600, &c->o.idle_timeout_s },
		{ "--retries", 0, 99, &c->o.retries },
		{ "--retry-delay", 0, 60000, &c->o.retry_delay_ms },
	};
	struct k3_err err = { 0, "" };
	uint64_t v;
	double d;

	if (*i + 1 >= argc)
		return 0;   /* every option here takes a value */
	const char *val = argv[*i + 1];
	for (size_t k = 0; k < sizeof(strs) / sizeof(strs[0]); k++) {
		if (strcmp(a, strs[k].name) != 0)
			continue;
		if (strs[k].to == &c->o.from && strncmp(val, "https://", 8) != 0) {
			k3ctl_usage(c->cmd, "--from must be an https:// URL (plain HTTP is never used)");
			return -1;
		}
		*strs[k].to = val;
		++*i;
		return 1;
	}
	for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++) {
		if (strcmp(a, counts[k].name) != 0)
			continue;
		if (k3_parse_u64(val, counts[k].lo, counts[k].hi, &v, &err) != 0)
			goto bad;
		*counts[k].to = (unsigned)v;
		++*i;
		return 1;
	}
	if (strcmp(a, "--chunk-mib") == 0) {
		if (k3_parse_u64(val, 1, 1024, &v, &err) != 0)
			goto bad;
		c->o.chunk = v << 20;
	} else if (strcmp(a, "--reserve") == 0) {
		if (k3_parse_double(val, 0, 1e9, &d, &err) != 0)
			goto bad;
		c->o.reserve = (int64_t)(d * 1e9);
	} else {
		return 0;
	}
	++*i;
	return 1;
bad:
	k3ctl_usage(c->cmd, "%s: %s", a, err.msg);
	return -1;
}

bool k3ctl_setup_cli_next(struct k3ctl_setup_cli *c, int argc, char **argv, int *i)
{
	while (++*i < argc) {
		int r = option(c, argc, argv, i);
		if (r <= 0) {
			c->bad = r < 0;
			return true;
		}
	}
	return false;
}

int k3ctl_setup_cli_unexpected(const struct k3ctl_setup_cli *c, const char *arg)
{
	if (c->bad)
		return K3CTL_EXIT_USAGE;
	return k3ctl_usage(c->cmd, "usage: k3ctl %s %s (unexpected '%s')", c->cmd, c->synopsis, arg);
}

/* The shipped inventory named name: $K3_INVENTORY_DIR, the installed data
 * directory, then the source tree this k3ctl was built from. */
static int find_inventory(const char *name, char *buf, size_t size)
{
	const char *env = getenv("K3_INVENTORY_DIR");
	const char *dirs[] = { env && *env ? env : NULL, K3_INVENTORY_DIR, K3_SOURCE_INVENTORY_DIR };

	for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++) {
		struct stat st;
		if (!dirs[i])
			continue;
		snprintf(buf, size, "%s/%s", dirs[i], name);
		if (stat(buf, &st) == 0 && S_ISREG(st.st_mode))
			return 0;
	}
	return -ENOENT;
}

static int read_token(struct k3ctl_setup_cli *c)
{
	const char *env = getenv("HF_TOKEN"), *home = getenv("HOME"), *hf_home = getenv("HF_HOME");
	char path[4096];
	const char *file = c->token_file;
	ssize_t n;
	int fd;

	if (!file && env && *env) {
		if (strlen(env) >= sizeof(c->token) || strpbrk(env, "\r\n"))
			return k3ctl_fail(K3CTL_EXIT_USAGE, "$HF_TOKEN is not a single line of at most 4 KiB");
		snprintf(c->token, sizeof(c->token), "%s", env);
		c->o.token = c->token;
		return 0;
	}
	if (!file) {
		/* where the Hugging Face tools keep it */
		if (hf_home && *hf_home)
			snprintf(path, sizeof(path), "%s/token", hf_home);
		else if (home && *home)
			snprintf(path, sizeof(path), "%s/.cache/huggingface/token", home);
		else
			return 0;
		if (access(path, R_OK) != 0)
			return 0;
		file = path;
	}
	fd = open(file, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return k3ctl_fail(K3CTL_EXIT_ERROR, "cannot read the token file '%s': %s", file,
				  strerror(errno));
	n = read(fd, c->token, sizeof(c->token) - 1);
	close(fd);
	if (n < 0)
		return k3ctl_fail(K3CTL_EXIT_ERROR, "cannot read the token file '%s'", file);
	c->token[n] = '\0';
	c->token[strcspn(c->token, "\r\n")] = '\0';
	if (c->token[0])
		c->o.token = c->token;
	return 0;
}

int k3ctl_setup_cli_finish(struct k3ctl_setup_cli *c, bool need_inventory)
{
	struct k3_err err = { 0, "" };
	char path[4096];
	int rc;

	if (c->inventory_path) {
		snprintf(path, sizeof(path), "%s", c->inventory_path);
	} else if (find_inventory(DEFAULT_INVENTORY, path, sizeof(path)) != 0) {
		path[0] = '\0';
		if (need_inventory || !c->model_dir)
			return k3ctl_fail(K3CTL_EXIT_ERROR, "cannot find the shipped inventory "
					  DEFAULT_INVENTORY " (looked in $K3_INVENTORY_DIR, " K3_INVENTORY_DIR
					  " and " K3_SOURCE_INVENTORY_DIR "): pass --inventory FILE");
	}
	if (path[0] && (rc = k3_setup_inventory_load(path, &c->inv, &err)) != 0)
		return k3ctl_fail(K3CTL_EXIT_ERROR, "%s", err.msg);
	if (c->model_dir) {
		snprintf(c->dir, sizeof(c->dir), "%s", c->model_dir);
	} else {
		const char *state = getenv("STATE_DIRECTORY");
		if (c->model_root)
			snprintf(c->dir, sizeof(c->dir), "%s/%s", c->model_root, c->inv->name);
		else if (state && *state)
			snprintf(c->dir, sizeof(c->dir), "%s/models/%s", state, c->inv->name);
		else
			snprintf(c->dir, sizeof(c->dir), "/var/lib/k3d/models/%s", c->inv->name);
	}
	c->o.dir = c->dir;
	return read_token(c);
}

void k3ctl_setup_cli_release(struct k3ctl_setup_cli *c)
{
	k3_setup_inventory_free(c->inv);
	memset(c->token, 0, sizeof(c->token));
	c->inv = NULL;
}

int k3ctl_setup_cli_fail(const struct k3_err *err)
{
	return k3ctl_fail(K3CTL_EXIT_ERROR, "%s", err->msg);
}

/*
 * main.c - k3ctl: global options, then one command from the table in
 * k3ctl.h. Global options may appear before or after the command name.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"
#include "k3_build_config.h"
#include "k3_client_socket.h"
#include "k3ctl.h"

struct k3ctl_globals k3ctl_g;

static const struct {
	const char *name;
	int (*run)(int argc, char **argv);
	const char *summary;
} commands[] = {
#define K3CTL_ROW_(name, summary) { #name, k3ctl_cmd_##name, summary },
	K3CTL_COMMANDS(K3CTL_ROW_)
#undef K3CTL_ROW_
};

int k3ctl_usage(const char *cmd, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "k3ctl %s: ", cmd);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	return K3CTL_EXIT_USAGE;
}

int k3ctl_fail(int code, const char *fmt, ...)
{
	va_list ap;

	fputs("k3ctl: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	return code;
}

bool k3ctl_args_next(struct k3ctl_args *a)
{
	const struct k3ctl_args_spec *sp = a->spec;

	if (a->rc && *a->rc) {
		a->stop = true;
		a->code = k3ctl_usage(sp->cmd, "%s: %s", a->opt, a->err->msg);
		return false;
	}
next:
	if (++a->i >= a->argc)
		return false;
	a->opt = a->argv[a->i];
	a->val = NULL;
	if (sp->help && (!strcmp(a->opt, "-h") || !strcmp(a->opt, "--help"))) {
		sp->help();
		a->stop = true;
		a->code = K3CTL_EXIT_OK;
		return false;
	}
	for (const char *const *f = sp->flags; f && *f; f++)
		if (!strcmp(a->opt, *f))
			return true;
	if (a->i + 1 >= a->argc) {
		a->stop = true;
		a->code = k3ctl_usage(sp->cmd, sp->need, a->opt);
		return false;
	}
	a->val = a->argv[++a->i];
	for (size_t k = 0; k < a->n_strs; k++)
		if (!strcmp(a->opt, a->strs[k].name)) {
			*a->strs[k].to = a->val;
			goto next;
		}
	return true;
}

int k3ctl_connect(struct k3ctl_client *c)
{
	struct k3_err err = { 0, "" };
	int r = k3ctl_client_open(c, k3ctl_g.socket_path, &err);

	if (r == 0)
		return 0;
	if (r == -ENOENT || r == -ECONNREFUSED || r == -EACCES || r == -ENOTSOCK ||
	    r == -ECONNRESET || r == -ETIMEDOUT || r == -EPERM || r == -ENAMETOOLONG ||
	    r == -EBUSY || r == -EBADMSG)
		return k3ctl_fail(K3CTL_EXIT_UNAVAILABLE, "%s", err.msg);
	return k3ctl_fail(K3CTL_EXIT_ERROR, "%s", err.msg);
}

int k3ctl_request(struct k3ctl_reply *r, uint32_t type, const void *body)
{
	int rc;

	memset(r, 0, sizeof(*r));
	if ((rc = k3ctl_connect(&r->c)) != 0)
		return rc;
	rc = k3ctl_client_call(&r->c, type, body, 10000, &r->h, &r->body, &r->status, &r->err);
	if (rc < 0)
		k3ctl_client_close(&r->c);
	return rc;
}

/* Synopses for `k3ctl CMD --help` and `k3ctl help CMD` (k3ctl.1 has the
 * full text). A command without a row here still runs; it just has no
 * extra help. */
static const struct {
	const char *name, *text;
} synopses[] = {
	{ "status", "k3ctl status [--json]" },
	{ "ping", "k3ctl ping [--json]" },
	{ "shutdown", "k3ctl shutdown" },
	{ "run", "k3ctl run [PROMPT] [--chat] [--max-new N] [--stop S]... [--reasoning-effort none|low|high|max]\n"
		 "          [--prompt-ids ID,ID,...] [--hide-reasoning] [--draft off|auto|ngram|dspark]\n"
		 "          [--stats] [--ids] [--json]\n"
		 "  PROMPT defaults to 'The capital of France is'; --max-new defaults to 128." },
	{ "chat", "k3ctl chat [--max-new N] [--stop S]... [--reasoning-effort none|low|high|max]\n"
		  "           [--hide-reasoning] [--draft off|auto|ngram|dspark] [--stats] [--ids] [--json]\n"
		  "  One message per line on stdin; Ctrl-C cancels a reply; Ctrl-D or /exit quits." },
	{ "cancel", "k3ctl cancel JOB_ID" },
	{ "demo-model", "k3ctl demo-model --out DIR [--preset nano|small|bench|k3-sparse|trained] [--seed N] [--layers N]\n"
			"  [--hidden N] [--vocab N] [--intermediate N] [--experts N] [--top-k N]\n"
			"  [--moe-intermediate N] [--latent N] [--shared-experts N] [--kda-heads N]\n"
			"  [--kda-head-dim N] [--mla-heads N] [--q-lora N] [--kv-lora N] [--nope N] [--rope N]\n"
			"  [--v-head N] [--attn-res-block N] [--shards N] [--draft DIR]" },
	{ "inspect", "k3ctl inspect DIR [--ram SIZE] [--json]" },
	{ "plan", "k3ctl plan --model DIR [--ram SIZE] [--context N] [--spine-resident auto|all|N|none]\n"
		  "           [--expert-cache-gb auto|G] [--spine bf16|int8] [--disk-gbps G] [--json]" },
	{ "setup", "k3ctl setup [--full | --stream] [--plan | --check [--rehash]]\n"
		   "            [--model-root DIR | --model DIR] [--from URL] [--inventory FILE]\n"
		   "            [--cacert FILE] [--token-file FILE] [--workers N] [--idle-timeout S]\n"
		   "            [--retries N] [--retry-delay MS] [--chunk-mib N] [--reserve GB]\n"
		   "  Without --full or --stream nothing is downloaded: a complete install is checked,\n"
		   "  otherwise the plan is printed. A token comes from $HF_TOKEN or --token-file." },
	{ "fetch-weights", "k3ctl fetch-weights [--spine-only | --experts-only] [--layers 1-40,45,92]\n"
			   "            [--model-root DIR | --model DIR] [setup's transfer options]" },
	{ "inventory", "k3ctl inventory DIR [--name N] [--repository R] [--revision REV]\n"
		       "            [--base-url URL] > FILE" },
	{ "forward", "k3ctl forward --model DIR --ids ID[,ID...] [--steps N] [--json] [--threads N]\n"
		     "  [--chunk N] [--reference] [--provider NAME]" },
	{ "tokenize", "k3ctl tokenize [--special] [--pieces] [--model DIR | --vocab FILE] TEXT|-" },
	{ "detokenize", "k3ctl detokenize [--model DIR | --vocab FILE] IDS...|-" },
	{ "render-chat", "k3ctl render-chat FILE.json [--segments] [--ids [--model DIR | --vocab FILE]]" },
	{ "pack", "k3ctl pack --model DIR [--out DIR] [--verify] [--spine bf16|int8]\n"
		  "            [--spine-int8-dir DIR] [--layers LIST | --hot-experts N --trace FILE]" },
	{ "warm-expert-cache", "k3ctl warm-expert-cache --trace FILE [--show N] [--preload [--top N]]\n"
			       "            [--fetch N [--model DIR | --model-root DIR] [setup's transfer options]]" },
	{ "bench", "k3ctl bench --model DIR [--max-new N] [--prompt-len N] [--expert-cache-gb G]\n"
		   "            [--prefetch auto|N|off] [--prefetch-gate P] [--direct auto|on|off]\n"
		   "            [--io-threads N] [--threads N] [--no-packs] [--disk-mib M]\n"
		   "            [--disk-samples N] [--seed N] [--spine-resident auto|all|N|none]\n"
		   "            [--io-rate GBPS] [--io-latency MS]\n"
		   "   or: k3ctl bench --parallel 1,2,4 (--model DIR | --preset trained) [--reps R] ..." },
};

static int command_help(const char *name)
{
	for (size_t i = 0; i < sizeof(synopses) / sizeof(synopses[0]); i++)
		if (strcmp(synopses[i].name, name) == 0) {
			printf("usage: %s\n\nSee k3ctl(1) for details.\n", synopses[i].text);
			return K3CTL_EXIT_OK;
		}
	return k3ctl_fail(K3CTL_EXIT_USAGE, "no help for '%s'; see k3ctl(1)", name);
}

static void usage(FILE *f)
{
	fprintf(f, "usage: k3ctl [--socket PATH] [--json] COMMAND [ARGS]\n\nCommands:\n");
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++) {
		char name[32];

		snprintf(name, sizeof(name), "%s", commands[i].name);
		for (char *p = name; *p; p++)
			if (*p == '_')
				*p = '-';
		fprintf(f, "  %-20s %s\n", name, commands[i].summary);
	}
	fprintf(f, "\nThe socket is --socket, else $K3D_SOCKET, else $XDG_RUNTIME_DIR/k3d.sock\n"
		   "when it exists, else " K3_CLIENT_SYSTEMD_SOCKET ". Exit codes: 0 ok, 1 error,\n"
		   "2 usage, 3 daemon unavailable. See k3ctl(1).\n");
}

int main(int argc, char **argv)
{
	char *args[256];
	int n = 0;
	bool dashdash = false;

	k3ctl_g.socket_path = NULL;
	if (argc > (int)(sizeof(args) / sizeof(args[0])) - 1)
		return k3ctl_fail(K3CTL_EXIT_USAGE, "too many arguments");
	/* Pull the global options out wherever they are (before "--"). */
	for (int i = 1; i < argc; i++) {
		if (!dashdash && strcmp(argv[i], "--") == 0) {
			dashdash = true;
			args[n++] = argv[i];
		} else if (!dashdash && strcmp(argv[i], "--socket") == 0) {
			if (i + 1 >= argc)
				return k3ctl_fail(K3CTL_EXIT_USAGE, "--socket needs a path");
			k3ctl_g.socket_path = argv[++i];
		} else if (!dashdash && strncmp(argv[i], "--socket=", 9) == 0) {
			k3ctl_g.socket_path = argv[i] + 9;
		} else if (!dashdash && strcmp(argv[i], "--json") == 0) {
			k3ctl_g.json = true;
		} else {
			args[n++] = argv[i];
		}
	}
	args[n] = NULL;
	if (!k3ctl_g.socket_path)
		k3ctl_g.socket_path = k3_client_default_socket();
	if (n == 0) {
		usage(stderr);
		return K3CTL_EXIT_USAGE;
	}
	if (strcmp(args[0], "-h") == 0 || strcmp(args[0], "--help") == 0 || strcmp(args[0], "help") == 0) {
		if (n > 1 && strcmp(args[0], "help") == 0)
			return command_help(args[1]);
		usage(stdout);
		return K3CTL_EXIT_OK;
	}
	for (int i = 1; i < n && strcmp(args[i], "--") != 0; i++)
		if (strcmp(args[i], "--help") == 0 || strcmp(args[i], "-h") == 0)
			return command_help(args[0]);
	if (strcmp(args[0], "--version") == 0 || strcmp(args[0], "version") == 0) {
		printf("k3ctl %s (protocol %u)\n", K3_VERSION, K3_PROTO_VERSION);
		return K3CTL_EXIT_OK;
	}
	{
		/* An empty --socket is a usage error (exit 2), not "cannot reach
		 * k3d at ''" (exit 3). A too-long path is left to the connect
		 * (offline commands need no socket), which gives the same exit
		 * code the gateway gives, k3_client_socket_exit_code's. */
		char why[512];
		int r = k3_client_socket_check(k3ctl_g.socket_path, why, sizeof(why));

		if (r == -EINVAL)
			return k3ctl_fail(k3_client_socket_exit_code(r), "%s", why);
	}
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++) {
		char name[32];

		snprintf(name, sizeof(name), "%s", commands[i].name);
		for (char *p = name; *p; p++)
			if (*p == '_')
				*p = '-';
		if (strcmp(args[0], name) == 0)
			return commands[i].run(n, args);
	}
	fprintf(stderr, "k3ctl: unknown command '%s'\n\n", args[0]);
	usage(stderr);
	return K3CTL_EXIT_USAGE;
}

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

int k3ctl_connect(struct k3ctl_client *c)
{
	struct k3_err err = { 0, "" };
	int r = k3ctl_client_open(c, k3ctl_g.socket_path, &err);

	if (r == 0)
		return 0;
	if (r == -ENOENT || r == -ECONNREFUSED || r == -EACCES || r == -ENOTSOCK ||
	    r == -ECONNRESET || r == -ETIMEDOUT || r == -EPERM)
		return k3ctl_fail(K3CTL_EXIT_UNAVAILABLE, "%s", err.msg);
	return k3ctl_fail(K3CTL_EXIT_ERROR, "%s", err.msg);
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
	fprintf(f, "\nThe socket is --socket, else $K3D_SOCKET, else $XDG_RUNTIME_DIR/k3d.sock,\n"
		   "else /run/k3d/k3d.sock. Exit codes: 0 ok, 1 error, 2 usage, 3 daemon\n"
		   "unavailable. See k3ctl(1).\n");
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
		k3ctl_g.socket_path = k3ctl_client_default_socket();
	if (n == 0) {
		usage(stderr);
		return K3CTL_EXIT_USAGE;
	}
	if (strcmp(args[0], "-h") == 0 || strcmp(args[0], "--help") == 0 || strcmp(args[0], "help") == 0) {
		usage(stdout);
		return K3CTL_EXIT_OK;
	}
	if (strcmp(args[0], "--version") == 0 || strcmp(args[0], "version") == 0) {
		printf("k3ctl %s (protocol %u)\n", K3_VERSION, K3_PROTO_VERSION);
		return K3CTL_EXIT_OK;
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

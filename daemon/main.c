/*
 * main.c - k3d: options -> listeners -> event loop. The only place that
 * exits. Exit codes: 0 clean stop, 1 start-up failure, 2 bad usage.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <event2/event.h>
#include <systemd/sd-daemon.h>

#include "base/log.h"
#include "server/options.h"
#include "server/server.h"

static void signal_cb(evutil_socket_t sig, short what, void *arg)
{
	struct k3_server *s = arg;

	(void)what;
	k3_log_notice("received %s", sig == SIGTERM ? "SIGTERM" : "SIGINT");
	k3_server_drain(s);
}

int main(int argc, char **argv)
{
	struct k3_options opts;
	struct k3_err err = { 0, "" };
	struct event_base *base = NULL;
	struct k3_server *srv = NULL;
	struct event *sigterm = NULL, *sigint = NULL;
	char status[256];
	int r, rc = 1;

	r = k3_options_parse(&opts, argc, argv, &err);
	if (r == 1)
		return 0;
	if (r < 0) {
		fprintf(stderr, "k3d: %s\n", err.msg);
		return 2;
	}
	k3_log_setup((enum k3_log_level)opts.log_level, !isatty(2));
	opts.socket_from_systemd = sd_listen_fds(0) > 0;
	if (!opts.socket_from_systemd && k3_options_default_socket(&opts, &err) < 0) {
		k3_log_err("%s", err.msg);
		return 1;
	}
	signal(SIGPIPE, SIG_IGN);

	base = event_base_new();
	if (!base) {
		k3_log_err("cannot create the event loop");
		goto out;
	}
	srv = k3_server_new(base, &opts, &err);
	if (!srv) {
		k3_log_err("%s", err.msg);
		goto out;
	}
	k3_options_log(&opts);
	if (k3_server_listen(srv, &err) < 0) {
		k3_log_err("%s", err.msg);
		sd_notifyf(0, "STATUS=Failed: %s", err.msg);
		goto out;
	}
	sigterm = evsignal_new(base, SIGTERM, signal_cb, srv);
	sigint = evsignal_new(base, SIGINT, signal_cb, srv);
	if (!sigterm || !sigint || evsignal_add(sigterm, NULL) || evsignal_add(sigint, NULL)) {
		k3_log_err("cannot install signal handlers");
		goto out;
	}
	snprintf(status, sizeof(status), "STATUS=Serving on %s (no model loaded)\nREADY=1",
		 k3_server_socket_path(srv)[0] ? k3_server_socket_path(srv) : "systemd sockets");
	sd_notify(0, status);
	k3_log_notice("ready");
	event_base_dispatch(base);
	k3_log_notice("stopped");
	rc = 0;
out:
	if (sigterm)
		event_free(sigterm);
	if (sigint)
		event_free(sigint);
	k3_server_free(srv);
	if (base)
		event_base_free(base);
	return rc;
}

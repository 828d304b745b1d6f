/*
 * main.c - k3d: options -> listeners -> engine thread (loads the model) ->
 * event loop. The only place that exits. READY=1 goes to systemd only once
 * the model is loaded; meanwhile STATUS says what is loading and clients
 * that connect get state "loading".
 * Exit codes: 0 clean stop, 1 start-up failure, 2 bad usage.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/thread.h>
#include <systemd/sd-daemon.h>

#include "base/log.h"
#include "server/options.h"
#include "server/sched.h"
#include "server/server.h"

struct k3d {
	struct event_base *base;
	struct k3_server *srv;
	char where[256];
	int rc;
};

static void on_ready(void *ctx, bool ok, const char *text)
{
	struct k3d *d = ctx;
	struct k3_server_info info = { K3_STATE_READY, text, "ready", 0, 0, 0 };

	if (!ok) {
		k3_log_err("%s", text);
		sd_notifyf(0, "STATUS=Failed: %s", text);
		d->rc = 1;
		event_base_loopexit(d->base, NULL);
		return;
	}
	k3_server_set_info(d->srv, &info);
	sd_notifyf(0, "READY=1\nSTATUS=Serving model '%s' on %s", text, d->where);
	k3_log_notice("ready: model '%s' on %s", text, d->where);
}

static void signal_cb(evutil_socket_t sig, short what, void *arg)
{
	struct k3d *d = arg;

	(void)what;
	k3_log_notice("received %s", sig == SIGTERM ? "SIGTERM" : "SIGINT");
	k3_server_drain(d->srv);
}

/* The weights are mapped read-only; a model file truncated (or rewritten
 * in place) under a running k3d turns the next access into SIGBUS, which
 * otherwise kills it without a word. Say what most likely happened, then
 * die of the signal as before (SA_RESETHAND: returning re-runs the faulting
 * access with the default action), so systemd's restart logic is unchanged.
 * Only write(2): async-signal-safe. */
static void sigbus_handler(int sig)
{
	static const char msg[] =
		"k3d: SIGBUS: a mapped model file shrank or became unreadable under k3d (truncated "
		"or rewritten in place?); exiting. Put new model files in place with a rename, "
		"never by rewriting them, and restart k3d.\n";
	ssize_t w = write(2, msg, sizeof(msg) - 1);

	(void)w;
	(void)sig;
}

static void install_sigbus_handler(void)
{
	struct sigaction sa;

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = sigbus_handler;
	sa.sa_flags = SA_RESETHAND;
	sigemptyset(&sa.sa_mask);
	(void)sigaction(SIGBUS, &sa, NULL);
}

/* The model to load: --model, else the default model root when present. */
static const char *pick_model(struct k3_options *opts, char *buf, size_t size)
{
	const char *state = getenv("STATE_DIRECTORY");
	struct stat st;

	if (opts->model_dir)
		return opts->model_dir;
	snprintf(buf, size, "%s/models/kimi-k3", state && *state ? state : "/var/lib/k3d");
	if (stat(buf, &st) == 0 && S_ISDIR(st.st_mode))
		return buf;
	return NULL;
}

int main(int argc, char **argv)
{
	struct k3_options opts;
	struct k3_err err = { 0, "" };
	struct k3d d = { NULL, NULL, "", 1 };
	struct k3_sched *sched = NULL;
	struct event *sigterm = NULL, *sigint = NULL;
	struct k3_server_info info = { K3_STATE_LOADING, NULL, "loading the model", 0, 0, 0 };
	struct k3_server_hooks hooks;
	char model_buf[4096];
	int r;

	r = k3_options_parse(&opts, argc, argv, &err);
	if (r == 1)
		return 0;
	if (r < 0) {
		fprintf(stderr, "k3d: %s\n", err.msg);
		return 2;
	}
	k3_log_setup((enum k3_log_level)opts.log_level, !isatty(2));
	opts.model_dir = pick_model(&opts, model_buf, sizeof(model_buf));
	if (!opts.model_dir) {
		k3_log_err("no model: pass --model DIR (no model at the default '%s'). For a small "
			   "synthetic model run 'k3ctl demo-model --out DIR'; to fetch Kimi K3 run "
			   "'k3ctl setup'", model_buf);
		return 1;
	}
	opts.socket_from_systemd = sd_listen_fds(0) > 0;
	if (!opts.socket_from_systemd && k3_options_default_socket(&opts, &err) < 0) {
		k3_log_err("%s", err.msg);
		return 1;
	}
	signal(SIGPIPE, SIG_IGN);
	install_sigbus_handler();
	if (evthread_use_pthreads() != 0) {
		k3_log_err("libevent lacks pthread support");
		return 1;
	}
	d.base = event_base_new();
	if (!d.base) {
		k3_log_err("cannot create the event loop");
		goto out;
	}
	d.srv = k3_server_new(d.base, &opts, &err);
	if (!d.srv) {
		k3_log_err("%s", err.msg);
		goto out;
	}
	k3_options_log(&opts);
	if (k3_server_listen(d.srv, &err) < 0) {
		k3_log_err("%s", err.msg);
		sd_notifyf(0, "STATUS=Failed: %s", err.msg);
		goto out;
	}
	snprintf(d.where, sizeof(d.where), "%s",
		 k3_server_socket_path(d.srv)[0] ? k3_server_socket_path(d.srv) : "systemd sockets");
	k3_server_set_info(d.srv, &info);
	sigterm = evsignal_new(d.base, SIGTERM, signal_cb, &d);
	sigint = evsignal_new(d.base, SIGINT, signal_cb, &d);
	if (!sigterm || !sigint || evsignal_add(sigterm, NULL) || evsignal_add(sigint, NULL)) {
		k3_log_err("cannot install signal handlers");
		goto out;
	}
	sd_notifyf(0, "STATUS=Loading model '%s'", opts.model_dir);
	k3_log_info("loading model '%s'", opts.model_dir);
	if (k3_sched_new(d.base, d.srv, &opts, on_ready, &d, &sched, &err) < 0) {
		k3_log_err("%s", err.msg);
		goto out;
	}
	hooks = k3_sched_hooks(sched);
	k3_server_set_hooks(d.srv, &hooks);
	d.rc = 0;
	event_base_dispatch(d.base);
	k3_log_notice(d.rc ? "stopped after a failure" : "stopped");
out:
	if (sigterm)
		event_free(sigterm);
	if (sigint)
		event_free(sigint);
	/* Connections go first: their close hooks talk to the scheduler. */
	k3_server_free(d.srv);
	k3_sched_free(sched);
	if (d.base)
		event_base_free(d.base);
	return d.rc;
}

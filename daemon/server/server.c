/*
 * server.c - k3d's listening sockets and the server's life (see server.h;
 * server_internal.h says which server file does what): sockets passed by
 * systemd or bound by k3d in a directory nobody else can write, creating
 * and freeing the server, the systemd watchdog, and the graceful drain
 * (running work finishes, or is cancelled when out of time, while the
 * listeners stay open; then every client is flushed and the loop ends).
 */
#include "server/server_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <systemd/sd-daemon.h>

#include "base/log.h"
#include "base/sockact.h"

enum {
	DRAIN_GRACE_S = 5,
	/* fds k3d keeps for itself beyond its connections: listeners, model
	 * shards and packs, the router trace, libevent and thread wakeups */
	OWN_FDS = 256,
};

/* ---- listening ------------------------------------------------------------ */

static void listener_error_cb(struct evconnlistener *l, void *arg)
{
	int e = EVUTIL_SOCKET_ERROR();

	(void)l; (void)arg;
	/* EMFILE and friends: keep serving existing clients. */
	k3_log_warning("accept failed: %s", evutil_socket_error_to_string(e));
}

static int add_listener(struct k3_server *s, int fd, struct k3_err *err)
{
	struct evconnlistener *l;

	if (s->n_listeners == MAX_LISTENERS)
		return k3_err_set(err, -EMFILE, "more than %d listening sockets", MAX_LISTENERS);
	l = evconnlistener_new(s->base, server_accept_cb, s, LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC,
			       -1, fd);
	if (!l)
		return k3_err_set(err, -ENOMEM, "cannot watch listening socket %d", fd);
	evconnlistener_set_error_cb(l, listener_error_cb);
	s->listeners[s->n_listeners++] = l;
	return 0;
}

/* The socket's directory must not let anyone else swap the socket. */
static int check_socket_dir(const char *path, struct k3_err *err)
{
	char dir[sizeof(((struct sockaddr_un *)0)->sun_path)];
	char *slash;
	struct stat st;

	snprintf(dir, sizeof(dir), "%s", path);
	slash = strrchr(dir, '/');
	if (!slash)
		snprintf(dir, sizeof(dir), ".");
	else if (slash == dir)
		dir[1] = '\0';
	else
		*slash = '\0';
	if (lstat(dir, &st) != 0)
		return k3_err_set(err, -errno, "socket directory '%s': %s (create it with mode 0700 "
				  "or pick another --socket)", dir, strerror(errno));
	if (!S_ISDIR(st.st_mode))
		return k3_err_set(err, -ENOTDIR, "socket directory '%s' is not a directory "
				  "(symbolic links are refused)", dir);
	if (st.st_uid != getuid() && st.st_uid != 0)
		return k3_err_set(err, -EPERM, "socket directory '%s' belongs to uid %u, not to us or root",
				  dir, (unsigned)st.st_uid);
	if ((st.st_mode & (S_IWGRP | S_IWOTH)) && !(st.st_mode & S_ISVTX))
		return k3_err_set(err, -EPERM, "socket directory '%s' is writable by others (mode %03o); "
				  "use a private directory", dir, (unsigned)(st.st_mode & 0777));
	return 0;
}

/* Removes a stale socket left by a crashed k3d; refuses a live one. */
static int clear_stale_socket(const struct sockaddr_un *sun, struct k3_err *err)
{
	struct stat st;
	int fd, r;

	if (lstat(sun->sun_path, &st) != 0)
		return errno == ENOENT ? 0 : k3_err_set(err, -errno, "'%s': %s", sun->sun_path, strerror(errno));
	if (!S_ISSOCK(st.st_mode))
		return k3_err_set(err, -EEXIST, "'%s' exists and is not a socket; refusing to replace it",
				  sun->sun_path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return k3_err_set(err, -errno, "socket: %s", strerror(errno));
	r = connect(fd, (const struct sockaddr *)sun, sizeof(*sun));
	close(fd);
	if (r == 0)
		return k3_err_set(err, -EADDRINUSE, "another k3d is already serving '%s'", sun->sun_path);
	if (unlink(sun->sun_path) != 0)
		return k3_err_set(err, -errno, "cannot remove stale socket '%s': %s", sun->sun_path,
				  strerror(errno));
	return 0;
}

static int bind_own(struct k3_server *s, struct k3_err *err)
{
	struct sockaddr_un sun;
	mode_t old;
	int fd, r;

	memset(&sun, 0, sizeof(sun));
	sun.sun_family = AF_UNIX;
	if (strlen(s->opts->socket_path) >= sizeof(sun.sun_path))
		return k3_err_set(err, -ENAMETOOLONG, "socket path '%s' is too long", s->opts->socket_path);
	strcpy(sun.sun_path, s->opts->socket_path);
	if ((r = check_socket_dir(sun.sun_path, err)) < 0 || (r = clear_stale_socket(&sun, err)) < 0)
		return r;
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return k3_err_set(err, -errno, "socket: %s", strerror(errno));
	/* The socket is born with its final mode: no window where others can connect. */
	old = umask(s->opts->n_allow_gid ? 0117 : 0177);
	r = bind(fd, (struct sockaddr *)&sun, sizeof(sun));
	umask(old);
	if (r != 0) {
		r = -errno;
		close(fd);
		return k3_err_set(err, r, "cannot bind '%s': %s", sun.sun_path, strerror(-r));
	}
	if (listen(fd, 64) != 0) {
		r = -errno;
		close(fd);
		unlink(sun.sun_path);
		return k3_err_set(err, r, "cannot listen on '%s': %s", sun.sun_path, strerror(-r));
	}
	strcpy(s->own_path, sun.sun_path);
	return add_listener(s, fd, err);
}

int k3_server_listen(struct k3_server *s, struct k3_err *err)
{
	int n = k3_sockact_listen_fds(AF_UNIX, "k3d.socket", err), r;

	if (n < 0)
		return n;
	for (int i = 0; i < n; i++)
		if ((r = add_listener(s, K3_SOCKACT_FIRST_FD + i, err)) < 0)
			return r;
	if (n > 0) {
		k3_log_info("serving %d socket(s) passed by systemd", n);
		return 0;
	}
	if ((r = bind_own(s, err)) < 0)
		return r;
	k3_log_info("listening on %s", s->own_path);
	return 0;
}

const char *k3_server_socket_path(const struct k3_server *s)
{
	return s->own_path;
}

/* ---- lifecycle ------------------------------------------------------------ */

static void watchdog_cb(evutil_socket_t fd, short what, void *arg)
{
	(void)fd; (void)what; (void)arg;
	sd_notify(0, "WATCHDOG=1");
}

/* --max-connections needs that many fds and k3d's own: raise the soft
 * open-file limit up to the hard one if it is short (systemd's
 * LimitNOFILE= sets both), and say so when even that is not enough, since
 * accept() would then fail with EMFILE before the connection limits
 * apply. */
static void raise_fd_limit(rlim_t want)
{
	struct rlimit rl;
	rlim_t was;

	if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= want)
		return;
	was = rl.rlim_cur;
	rl.rlim_cur = rl.rlim_max < want ? rl.rlim_max : want;
	if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
		rl.rlim_cur = was;
	if (rl.rlim_cur < want)
		k3_log_warning("open-file limit %llu is below --max-connections plus %d for k3d's own "
			       "files; raise it (ulimit -n, LimitNOFILE=) or lower --max-connections",
			       (unsigned long long)rl.rlim_cur, OWN_FDS);
}

struct k3_server *k3_server_new(struct event_base *base, const struct k3_options *opts,
				struct k3_err *err)
{
	struct k3_server *s = calloc(1, sizeof(*s));
	uint64_t usec = 0;

	if (!s) {
		k3_err_set(err, -ENOMEM, "out of memory");
		return NULL;
	}
	s->base = base;
	s->opts = opts;
	s->info.state = K3_STATE_NO_MODEL;
	s->info.status_text = "no model loaded";
	k3_proto_buf_init(&s->scratch, K3_LIM_PAYLOAD_MAX + K3_PROTO_HEADER_SIZE);
	clock_gettime(CLOCK_MONOTONIC, &s->started);
	raise_fd_limit(opts->max_connections + OWN_FDS);
	if (sd_watchdog_enabled(0, &usec) > 0 && usec > 0) {
		struct timeval tv = { (time_t)(usec / 2 / 1000000), (suseconds_t)(usec / 2 % 1000000) };

		s->watchdog = event_new(base, -1, EV_PERSIST, watchdog_cb, s);
		if (s->watchdog)
			event_add(s->watchdog, &tv);
		k3_log_info("systemd watchdog: pinging every %.1f s", (double)usec / 2e6);
	}
	return s;
}

struct k3_server *k3_server_free(struct k3_server *s)
{
	if (!s)
		return NULL;
	while (s->conns)
		server_conn_close(s->conns);
	for (unsigned i = 0; i < s->n_listeners; i++)
		evconnlistener_free(s->listeners[i]);
	if (s->own_path[0])
		unlink(s->own_path);
	if (s->drain_timer)
		event_free(s->drain_timer);
	if (s->watchdog)
		event_free(s->watchdog);
	k3_proto_buf_release(&s->scratch);
	free(s);
	return NULL;
}

void k3_server_set_hooks(struct k3_server *s, const struct k3_server_hooks *hooks)
{
	s->hooks = *hooks;
}

void k3_server_set_info(struct k3_server *s, const struct k3_server_info *info)
{
	s->info = *info;
}

void server_maybe_exit(struct k3_server *s)
{
	if (s->draining && !s->drain_waiting && s->n_conns == 0)
		event_base_loopexit(s->base, NULL);
}

/* Stops accepting and removes the socket file we bound (a systemd socket
 * is systemd's to keep). */
static void close_listeners(struct k3_server *s)
{
	for (unsigned i = 0; i < s->n_listeners; i++)
		evconnlistener_free(s->listeners[i]);
	s->n_listeners = 0;
	if (s->own_path[0]) {
		unlink(s->own_path);
		s->own_path[0] = '\0';
	}
}

/* Running work is done (or out of time): flush every client and go. */
static void drain_finish(struct k3_server *s)
{
	struct k3_conn *c = s->conns, *next;

	s->drain_waiting = false;
	close_listeners(s);
	for (; c; c = next) {
		next = c->next;
		server_conn_close_after_write(c);
	}
	server_maybe_exit(s);
}

static void drain_timer_cb(evutil_socket_t fd, short what, void *arg)
{
	struct k3_server *s = arg;
	struct timeval grace = { DRAIN_GRACE_S, 0 };

	(void)fd; (void)what;
	if (s->drain_waiting && !s->drain_cancelled && s->hooks.cancel_running) {
		/* Cancelled work stops within one layer step and still sends its
		 * client DONE{cancelled}; closing now would cut the stream off
		 * without a terminal frame. */
		k3_log_warning("%s: cancelling the running generation",
			       s->drain_hurried ? "asked to stop again" : "drain timeout");
		s->drain_cancelled = true;
		evtimer_add(s->drain_timer, &grace);
		s->hooks.cancel_running(s->hooks.ctx);
		return;
	}
	if (s->drain_waiting) {
		k3_log_warning("drain timeout: stopping with work still running");
		drain_finish(s);
		/* One more grace period for clients to read their last bytes. */
		evtimer_add(s->drain_timer, &grace);
		return;
	}
	/* Clients that do not read their last bytes do not hold us up. */
	k3_log_warning("clients did not read their last replies, exiting");
	event_base_loopexit(s->base, NULL);
}

void k3_server_drain(struct k3_server *s)
{
	double t = s->opts->drain_timeout_s;
	struct timeval tv = server_timeval_of(t);
	unsigned running = 0;

	if (s->draining) {
		/* Asked again (a second Ctrl-C, SIGTERM or shutdown): the user
		 * does not want to wait for the drain timeout. */
		if (s->drain_waiting && !s->drain_cancelled && s->drain_timer) {
			s->drain_hurried = true;
			drain_timer_cb(-1, 0, s);
		}
		return;
	}
	s->draining = true;
	sd_notify(0, "STOPPING=1\nSTATUS=Draining");
	k3_log_notice("draining: no new work");
	/* The listeners stay open while running work finishes (drain_finish
	 * closes them): a client that connects now, such as k3-gateway's
	 * /health, gets HELLO_OK{DRAINING} and GENERATE gets SHUTTING_DOWN,
	 * instead of a missing socket that reads as "k3d is not running". */
	if (s->hooks.drain)
		running = s->hooks.drain(s->hooks.ctx);
	s->drain_timer = evtimer_new(s->base, drain_timer_cb, s);
	if (s->drain_timer)
		evtimer_add(s->drain_timer, &tv);
	if (running) {
		k3_log_notice("waiting up to %g s for %u running generation(s)", t, running);
		s->drain_waiting = true;
		return;
	}
	drain_finish(s);
}

void k3_server_drain_done(struct k3_server *s)
{
	if (s->draining && s->drain_waiting)
		drain_finish(s);
}

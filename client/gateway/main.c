/*
 * k3-gateway - OpenAI-compatible HTTP front end of k3d (docs/k3-gateway.8).
 * Speaks HTTP on one side and the k3 protocol to k3d's Unix socket on the
 * other. It links only libk3proto, libevent and jansson: a web-facing bug
 * cannot touch model state.
 */
#include <errno.h>
#include <getopt.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <event2/event.h>
#include <event2/http.h>

#include "base/parse.h"
#include "base/sockact.h"
#include "gw.h"
#include "k3_build_config.h"
#include "k3_client_socket.h"
#include "k3_limits.h"

static void usage(FILE *f)
{
	fprintf(f,
		"usage: k3-gateway [options]\n"
		"  --listen HOST:PORT     address to serve HTTP on (default 127.0.0.1:8000;\n"
		"                         port 0 picks a free one); ignored under systemd\n"
		"                         socket activation\n"
		"  --allow-remote         allow a non-loopback --listen address\n"
		"  --socket PATH          k3d's Unix socket (default $K3D_SOCKET, else\n"
		"                         $XDG_RUNTIME_DIR/k3d.sock when it exists, else\n"
		"                         " K3_CLIENT_SYSTEMD_SOCKET ")\n"
		"  --api-key-file PATH    require 'Authorization: Bearer KEY' (KEY = the file's\n"
		"                         first line) on every endpoint but /health and OPTIONS\n"
		"  --cors ORIGIN          answer CORS for ORIGIN ('*' = any; repeatable, %d at most)\n"
		"  --max-body BYTES       largest request body (default %u)\n"
		"  --read-timeout SEC     limit for reading a request's headers and body, for\n"
		"                         a stalled write, and for an idle keep-alive (default 60)\n"
		"  --keepalive SEC        SSE ': keep-alive' comment after SEC silent seconds (default 15)\n"
		"  --retry-after SEC      Retry-After on 429 and 503 (default 1)\n"
		"  --daemon-timeout SEC   limit for k3d's answer to HELLO and STATUS (default 10)\n"
		"  --quiet                no access log on stderr\n"
		"  --version, --help\n",
		GW_MAX_CORS, K3_LIM_HTTP_BODY_DEFAULT);
}

/* A flag's whole number in [min, max] (base/parse.h); prints why not. */
static int parse_uint(const char *flag, const char *s, uint64_t min, uint64_t max, uint64_t *out)
{
	struct k3_err err = { 0, "" };

	if (k3_parse_u64(s, min, max, out, &err) == 0)
		return 0;
	fprintf(stderr, "k3-gateway: %s %s\n", flag, err.msg);
	return -1;
}

/* A number of seconds, at most an hour. */
static int parse_secs(const char *flag, const char *s, uint64_t min, unsigned *out)
{
	uint64_t v;

	if (parse_uint(flag, s, min, 3600, &v) < 0)
		return -1;
	*out = (unsigned)v;
	return 0;
}

static char *read_key(const char *path)
{
	FILE *f = fopen(path, "r");
	char buf[4096];
	size_t n;

	if (!f) {
		fprintf(stderr, "k3-gateway: --api-key-file '%s': %s\n", path, strerror(errno));
		return NULL;
	}
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = 0;
	buf[strcspn(buf, "\r\n")] = 0;
	while (n && (buf[strlen(buf) - 1] == ' ' || buf[strlen(buf) - 1] == '\t'))
		buf[strlen(buf) - 1] = 0, n--;
	if (!buf[0]) {
		fprintf(stderr, "k3-gateway: --api-key-file '%s' has no key on its first line\n", path);
		return NULL;
	}
	return strdup(buf);
}

/* Splits HOST:PORT ([v6]:PORT too). */
static int split_listen(const char *s, char *host, size_t hcap, uint16_t *port)
{
	const char *colon = strrchr(s, ':');
	uint64_t p;
	size_t hl;

	if (!colon)
		goto bad;
	hl = (size_t)(colon - s);
	if (hl >= 2 && s[0] == '[' && s[hl - 1] == ']') {
		s++;
		hl -= 2;
	}
	if (hl == 0 || hl >= hcap)
		goto bad;
	memcpy(host, s, hl);
	host[hl] = 0;
	if (parse_uint("--listen port", colon + 1, 0, 65535, &p))
		return -1;
	*port = (uint16_t)p;
	return 0;
bad:
	fprintf(stderr, "k3-gateway: --listen '%s': expected HOST:PORT, e.g. 127.0.0.1:8000\n", s);
	return -1;
}

/* True when every address host resolves to is loopback. */
static int host_is_loopback(const char *host)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM }, *ai, *a;
	int ok = 1;

	if (getaddrinfo(host, NULL, &hints, &ai) != 0)
		return 0;
	for (a = ai; a; a = a->ai_next) {
		if (a->ai_family == AF_INET) {
			const struct sockaddr_in *in = (const void *)a->ai_addr;

			ok &= (ntohl(in->sin_addr.s_addr) >> 24) == 127;
		} else if (a->ai_family == AF_INET6) {
			const struct sockaddr_in6 *in6 = (const void *)a->ai_addr;

			ok &= IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr);
		} else {
			ok = 0;
		}
	}
	freeaddrinfo(ai);
	return ok;
}

/* The first signal ends the open replies as replies and leaves the loop
 * when they are written (gw_http_stop); a second one leaves at once. */
static void on_signal(evutil_socket_t sig, short what, void *arg)
{
	(void)sig;
	(void)what;
	gw_http_stop(arg);
}

/* The options, each listed once (its O_ value and its row of getopt_long's
 * table come from the line): those that take a value, then the flags. */
#define GW_VALUE_OPTIONS(X) \
	X(LISTEN, "listen") \
	X(SOCKET, "socket") \
	X(KEY, "api-key-file") \
	X(CORS, "cors") \
	X(BODY, "max-body") \
	X(RTO, "read-timeout") \
	X(KA, "keepalive") \
	X(RA, "retry-after") \
	X(DTO, "daemon-timeout")
#define GW_FLAG_OPTIONS(X) \
	X(REMOTE, "allow-remote") \
	X(QUIET, "quiet") \
	X(VER, "version") \
	X(HELP, "help")
#define GW_OPTION_ID(id, name) O_##id,
#define GW_VALUE_ROW(id, name) { name, required_argument, NULL, O_##id },
#define GW_FLAG_ROW(id, name) { name, no_argument, NULL, O_##id },

int main(int argc, char **argv)
{
	/* from 1: getopt_long's 0 is no option of ours */
	enum { O_NONE_, GW_VALUE_OPTIONS(GW_OPTION_ID) GW_FLAG_OPTIONS(GW_OPTION_ID) };
	static const struct option opts[] = {
		GW_VALUE_OPTIONS(GW_VALUE_ROW)
		GW_FLAG_OPTIONS(GW_FLAG_ROW)
		{ NULL, 0, NULL, 0 },
	};
	static struct gw g;
	uint64_t v;
	int c, nfds, bad = 0;
	char host[256];
	uint16_t port;

	g.cfg.listen = "127.0.0.1:8000";
	g.cfg.socket_path = k3_client_default_socket();
	g.cfg.max_body = K3_LIM_HTTP_BODY_DEFAULT;
	g.cfg.read_timeout_s = 60;
	g.cfg.keepalive_s = 15;
	g.cfg.retry_after_s = 1;
	g.cfg.daemon_timeout_s = 10;
	while (!bad && (c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case O_LISTEN: g.cfg.listen = optarg; break;
		case O_REMOTE: g.cfg.allow_remote = true; break;
		case O_SOCKET: g.cfg.socket_path = optarg; break;
		case O_KEY:
			if (!(g.cfg.api_key = read_key(optarg)))
				return 2;
			break;
		case O_CORS:
			if (g.cfg.n_cors == GW_MAX_CORS) {
				fprintf(stderr, "k3-gateway: at most %d --cors origins\n", GW_MAX_CORS);
				return 2;
			}
			g.cfg.cors[g.cfg.n_cors++] = optarg;
			break;
		case O_BODY:
			/* A body must fit one GENERATE frame (k3_limits.h). */
			if (parse_uint("--max-body", optarg, 1024, K3_LIM_TEXT_MAX, &v))
				return 2;
			g.cfg.max_body = v;
			break;
		case O_RTO: bad = parse_secs("--read-timeout", optarg, 1, &g.cfg.read_timeout_s); break;
		case O_KA: bad = parse_secs("--keepalive", optarg, 1, &g.cfg.keepalive_s); break;
		case O_RA: bad = parse_secs("--retry-after", optarg, 0, &g.cfg.retry_after_s); break;
		case O_DTO: bad = parse_secs("--daemon-timeout", optarg, 1, &g.cfg.daemon_timeout_s); break;
		case O_QUIET: g.cfg.quiet = true; break;
		case O_VER: printf("k3-gateway %s\n", K3_VERSION); return 0;
		case O_HELP: usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (bad)
		return 2;
	if (optind < argc) {
		fprintf(stderr, "k3-gateway: unexpected argument '%s'\n", argv[optind]);
		return 2;
	}
	{
		/* Checked once here: every request would fail to connect anyway,
		 * and a start-up error is where the operator looks. An empty
		 * --socket is a usage error (2); a path no Unix socket can have
		 * is a k3d the gateway cannot reach (3, k3ctl's exit for it). */
		char why[512];
		int rc = k3_client_socket_check(g.cfg.socket_path, why, sizeof(why));

		if (rc < 0) {
			fprintf(stderr, "k3-gateway: %s\n", why);
			return rc == -ENAMETOOLONG ? 3 : 2;
		}
	}
	signal(SIGPIPE, SIG_IGN);
	g.started = time(NULL);
	g.base = event_base_new();
	g.http = g.base ? evhttp_new(g.base) : NULL;
	if (!g.http) {
		fprintf(stderr, "k3-gateway: cannot create the event loop\n");
		return 1;
	}
	gw_http_setup(&g);

	{
		struct k3_err err = { 0, "" };

		/* Malformed variables are a configuration error (2); a passed fd
		 * that is no listening socket leaves nothing to serve (1). */
		nfds = k3_sockact_listen_fds(AF_UNSPEC, "k3-gateway.socket", &err);
		if (nfds < 0) {
			fprintf(stderr, "k3-gateway: %s\n", err.msg);
			return nfds == -EINVAL || nfds == -ERANGE || nfds == -E2BIG ? 2 : 1;
		}
	}
	if (nfds > 0) {
		for (int fd = K3_SOCKACT_FIRST_FD; fd < K3_SOCKACT_FIRST_FD + nfds; fd++) {
			if (evhttp_accept_socket(g.http, fd) < 0) {
				fprintf(stderr, "k3-gateway: cannot serve on systemd socket fd %d\n", fd);
				return 1;
			}
		}
		fprintf(stderr, "k3-gateway: serving %d systemd socket(s), k3d at %s\n", nfds, g.cfg.socket_path);
	} else {
		struct evhttp_bound_socket *bs;
		struct sockaddr_storage ss;
		socklen_t sl = sizeof(ss);
		char addr[INET6_ADDRSTRLEN] = "?";
		unsigned bound_port = 0;

		if (split_listen(g.cfg.listen, host, sizeof(host), &port))
			return 2;
		if (!g.cfg.allow_remote && !host_is_loopback(host)) {
			fprintf(stderr, "k3-gateway: --listen '%s' is not a loopback address; add --allow-remote "
					"to serve other machines (and consider --api-key-file)\n", g.cfg.listen);
			return 2;
		}
		bs = evhttp_bind_socket_with_handle(g.http, host, port);
		if (!bs) {
			fprintf(stderr, "k3-gateway: cannot listen on %s: %s\n", g.cfg.listen, strerror(errno));
			return 1;
		}
		if (getsockname(evhttp_bound_socket_get_fd(bs), (struct sockaddr *)&ss, &sl) == 0) {
			if (ss.ss_family == AF_INET) {
				struct sockaddr_in *in = (void *)&ss;

				inet_ntop(AF_INET, &in->sin_addr, addr, sizeof(addr));
				bound_port = ntohs(in->sin_port);
			} else if (ss.ss_family == AF_INET6) {
				struct sockaddr_in6 *in6 = (void *)&ss;

				inet_ntop(AF_INET6, &in6->sin6_addr, addr, sizeof(addr));
				bound_port = ntohs(in6->sin6_port);
			}
		}
		/* Tests read this line to learn the port when --listen used 0. */
		fprintf(stderr, "k3-gateway: listening on http://%s%s%s:%u, k3d at %s\n",
			ss.ss_family == AF_INET6 ? "[" : "", addr, ss.ss_family == AF_INET6 ? "]" : "", bound_port,
			g.cfg.socket_path);
	}
	struct event *sigint = evsignal_new(g.base, SIGINT, on_signal, &g);
	struct event *sigterm = evsignal_new(g.base, SIGTERM, on_signal, &g);

	event_add(sigint, NULL);
	event_add(sigterm, NULL);
	event_base_dispatch(g.base);
	event_free(sigint);
	event_free(sigterm);
	if (g.stop_timer)
		event_free(g.stop_timer);
	evhttp_free(g.http);
	gw_http_release(&g);
	event_base_free(g.base);
	free(g.cfg.api_key);
	return 0;
}

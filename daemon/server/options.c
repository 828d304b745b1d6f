/* options.c - k3d command line (see options.h and k3d.8). */
#include "server/options.h"

#include <errno.h>
#include <getopt.h>
#include <pwd.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "base/parse.h"
#include "store/store.h"
#include "store/store_budget.h"
#include "k3_build_config.h"
#include "provider_registry.h"
#include "k3_limits.h"

static const char usage[] =
	"usage: k3d [options]\n"
	"\n"
	"Runs Kimi K3 and serves the k3 protocol on a Unix socket.\n"
	"\n"
	"  --socket PATH        listen here (default $RUNTIME_DIRECTORY/k3d.sock or\n"
	"                       $XDG_RUNTIME_DIR/k3d.sock; sockets passed by systemd win)\n"
	"  --model DIR          model directory (config.json, safetensors shards, tokenizer)\n"
	"  --allow-uid UID      also accept peers with this uid or user name (repeatable)\n"
	"  --allow-gid GID      also accept peers with this gid or group name (repeatable)\n"
	"  --queue N            generations that may wait behind the running one (default 0)\n"
	"  --threads N          compute threads (default: all cores)\n"
	"  --expert-cache-gb auto|N  RAM for the routed-expert cache, in GB (10^9 bytes;\n"
	"                       auto = min(RAM, cgroup limit) - spine - state - headroom);\n"
	"                       refused below what one token needs\n"
	"  --io-threads N       expert reader threads (default 2, at most 16)\n"
	"  --prefetch auto|N|off  router-lookahead prefetch: auto (default) reads a\n"
	"                       guess rank ahead only while its measured precision is\n"
	"                       >= 0.9; N reads the N best guesses per position\n"
	"  --direct auto|on|off expert reads with O_DIRECT: auto (default) where the\n"
	"                       file system allows it; on = required (refuse to start\n"
	"                       otherwise); off = buffered + posix_fadvise(RANDOM)\n"
	"  --router-trace FILE  append each routing decision as a JSON line\n"
	"  --no-packs           read experts from the shards even when packs are valid\n"
	"  --provider NAME      cpu (default), torch (LibTorch; a CUDA device when its\n"
	"                       LibTorch has one) or auto (torch with a CUDA device, else cpu)\n"
	"  --vram-cache-gb auto|off|N  device memory for routed experts (torch on a GPU),\n"
	"                       in GB; auto = free VRAM after the model - max(2 GiB, 20%%)\n"
	"  --drain-timeout S    seconds SIGTERM waits for running work (default 30)\n"
	"  --frame-timeout S    seconds a large request frame may take to arrive (default 60)\n"
	"  --log-level LEVEL    err, warning, notice, info (default) or debug\n"
	"  -h, --help           show this help\n"
	"  --version            show the version\n"
	"\n"
	"The daemon's own uid and root are always allowed. See k3d(8).\n";

static int parse_uid(const char *s, uid_t *out, struct k3_err *err)
{
	uint64_t v;
	struct passwd *pw;

	if (k3_parse_u64(s, 0, UINT32_MAX - 1, &v, NULL) == 0) {
		*out = (uid_t)v;
		return 0;
	}
	pw = getpwnam(s);
	if (!pw)
		return k3_err_set(err, -EINVAL, "--allow-uid: no user '%s'", s);
	*out = pw->pw_uid;
	return 0;
}

static int parse_gid(const char *s, gid_t *out, struct k3_err *err)
{
	uint64_t v;
	struct group *gr;

	if (k3_parse_u64(s, 0, UINT32_MAX - 1, &v, NULL) == 0) {
		*out = (gid_t)v;
		return 0;
	}
	gr = getgrnam(s);
	if (!gr)
		return k3_err_set(err, -EINVAL, "--allow-gid: no group '%s'", s);
	*out = gr->gr_gid;
	return 0;
}

static int parse_level(const char *s, int *out, struct k3_err *err)
{
	static const struct { const char *name; int level; } levels[] = {
		{ "err", K3_LOG_ERR }, { "warning", K3_LOG_WARNING }, { "notice", K3_LOG_NOTICE },
		{ "info", K3_LOG_INFO }, { "debug", K3_LOG_DEBUG },
	};
	for (size_t i = 0; i < sizeof(levels) / sizeof(levels[0]); i++)
		if (strcmp(s, levels[i].name) == 0) {
			*out = levels[i].level;
			return 0;
		}
	return k3_err_set(err, -EINVAL, "--log-level: '%s' is not one of err, warning, notice, info, debug", s);
}

int k3_options_parse(struct k3_options *opts, int argc, char **argv, struct k3_err *err)
{
	enum { O_SOCKET = 256, O_MODEL, O_UID, O_GID, O_QUEUE, O_THREADS, O_DRAIN, O_LOG, O_VERSION,
	       O_FRAME_TIMEOUT,
	       O_CACHE, O_IOT, O_PREFETCH, O_TRACE, O_NOPACKS, O_DIRECT, O_PROVIDER, O_VRAM };
	static const struct option longopts[] = {
		{ "socket", required_argument, NULL, O_SOCKET },
		{ "model", required_argument, NULL, O_MODEL },
		{ "allow-uid", required_argument, NULL, O_UID },
		{ "allow-gid", required_argument, NULL, O_GID },
		{ "queue", required_argument, NULL, O_QUEUE },
		{ "threads", required_argument, NULL, O_THREADS },
		{ "drain-timeout", required_argument, NULL, O_DRAIN },
		{ "frame-timeout", required_argument, NULL, O_FRAME_TIMEOUT },
		{ "log-level", required_argument, NULL, O_LOG },
		{ "expert-cache-gb", required_argument, NULL, O_CACHE },
		{ "io-threads", required_argument, NULL, O_IOT },
		{ "prefetch", required_argument, NULL, O_PREFETCH },
		{ "router-trace", required_argument, NULL, O_TRACE },
		{ "no-packs", no_argument, NULL, O_NOPACKS },
		{ "direct", required_argument, NULL, O_DIRECT },
		{ "provider", required_argument, NULL, O_PROVIDER },
		{ "vram-cache-gb", required_argument, NULL, O_VRAM },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, O_VERSION },
		{ NULL, 0, NULL, 0 },
	};
	uint64_t v;
	int c, r;

	memset(opts, 0, sizeof(*opts));
	opts->drain_timeout_s = 30;
	opts->frame_timeout_s = 60;
	opts->log_level = K3_LOG_INFO;
	opts->prefetch = -1;
	opts->provider = "cpu";
	opterr = 0;
	optind = 1;
	while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
		switch (c) {
		case O_SOCKET:
			if (strlen(optarg) >= sizeof(opts->socket_path) || optarg[0] == '\0')
				return k3_err_set(err, -EINVAL, "--socket: path must be 1..%zu bytes",
						  sizeof(opts->socket_path) - 1);
			strcpy(opts->socket_path, optarg);
			break;
		case O_MODEL:
			opts->model_dir = optarg;
			break;
		case O_UID:
			if (opts->n_allow_uid == K3_OPTIONS_MAX_IDS)
				return k3_err_set(err, -EINVAL, "--allow-uid: at most %d", K3_OPTIONS_MAX_IDS);
			r = parse_uid(optarg, &opts->allow_uid[opts->n_allow_uid], err);
			if (r < 0)
				return r;
			opts->n_allow_uid++;
			break;
		case O_GID:
			if (opts->n_allow_gid == K3_OPTIONS_MAX_IDS)
				return k3_err_set(err, -EINVAL, "--allow-gid: at most %d", K3_OPTIONS_MAX_IDS);
			r = parse_gid(optarg, &opts->allow_gid[opts->n_allow_gid], err);
			if (r < 0)
				return r;
			opts->n_allow_gid++;
			break;
		case O_QUEUE:
			if ((r = k3_parse_u64(optarg, 0, K3_LIM_QUEUE_MAX, &v, err)) < 0)
				return k3_err_prefix(err, "--queue");
			opts->queue_max = (unsigned)v;
			break;
		case O_THREADS:
			if ((r = k3_parse_u64(optarg, 0, 1024, &v, err)) < 0)
				return k3_err_prefix(err, "--threads");
			opts->threads = (unsigned)v;
			break;
		case O_FRAME_TIMEOUT:
			if ((r = k3_parse_double(optarg, 0.1, 86400, &opts->frame_timeout_s, err)) < 0)
				return k3_err_prefix(err, "--frame-timeout");
			break;
		case O_DRAIN:
			if ((r = k3_parse_double(optarg, 0, 86400, &opts->drain_timeout_s, err)) < 0)
				return k3_err_prefix(err, "--drain-timeout");
			break;
		case O_LOG:
			if ((r = parse_level(optarg, &opts->log_level, err)) < 0)
				return r;
			break;
		case O_CACHE:
			if ((r = k3_store_budget_parse_gb(optarg, &opts->expert_cache_bytes, err)) < 0)
				return r;
			break;
		case O_IOT:
			if ((r = k3_parse_u64(optarg, 1, K3_STORE_MAX_IO_THREADS, &v, err)) < 0)
				return k3_err_prefix(err, "--io-threads");
			opts->io_threads = (unsigned)v;
			break;
		case O_PREFETCH:
			if (strcmp(optarg, "off") == 0) {
				opts->prefetch = 0;
				break;
			}
			if (strcmp(optarg, "auto") == 0) {
				opts->prefetch = -1;
				break;
			}
			if ((r = k3_parse_u64(optarg, 1, K3_OPTIONS_PREFETCH_MAX, &v, err)) < 0)
				return k3_err_prefix(err, "--prefetch ('auto', a count or 'off')");
			opts->prefetch = (int)v;
			break;
		case O_DIRECT: {
			enum k3_store_direct d;
			if ((r = k3_store_direct_parse(optarg, &d, err)) < 0)
				return k3_err_prefix(err, "--direct");
			opts->direct = (int)d;
			break;
		}
		case O_TRACE:
			if (!optarg[0])
				return k3_err_set(err, -EINVAL, "--router-trace: empty path");
			opts->router_trace = optarg;
			break;
		case O_NOPACKS:
			opts->no_packs = true;
			break;
		case O_PROVIDER:
			if (strcmp(optarg, "auto") != 0 && !k3_provider_find(optarg, err))
				return k3_err_prefix(err, "--provider");
			opts->provider = optarg;
			break;
		case O_VRAM:
			if (strcmp(optarg, "off") == 0) {
				opts->vram_cache_bytes = UINT64_MAX;
				break;
			}
			if ((r = k3_store_budget_parse_gb(optarg, &opts->vram_cache_bytes, err)) < 0)
				return k3_err_set(err, r, "--vram-cache-gb must be 'auto', 'off' or a "
						  "size above 0 in GB");
			break;
		case 'h':
			fputs(usage, stdout);
			return 1;
		case O_VERSION:
			printf("k3d %s\n", K3_VERSION);
			return 1;
		case ':':
			return k3_err_set(err, -EINVAL, "option '%s' needs a value", argv[optind - 1]);
		default:
			return k3_err_set(err, -EINVAL, "unknown option '%s' (see k3d --help)", argv[optind - 1]);
		}
	}
	if (optind < argc)
		return k3_err_set(err, -EINVAL, "unexpected argument '%s' (see k3d --help)", argv[optind]);
	return 0;
}

int k3_options_default_socket(struct k3_options *opts, struct k3_err *err)
{
	const char *dir = getenv("RUNTIME_DIRECTORY");
	int n;

	if (opts->socket_path[0])
		return 0;
	if (!dir || !*dir)
		dir = getenv("XDG_RUNTIME_DIR");
	if (!dir || !*dir)
		return k3_err_set(err, -ENOENT,
				  "no socket path: pass --socket PATH or set XDG_RUNTIME_DIR");
	/* systemd may pass several directories separated by ':'; use the first. */
	n = (int)strcspn(dir, ":");
	if (snprintf(opts->socket_path, sizeof(opts->socket_path), "%.*s/k3d.sock", n, dir) >=
	    (int)sizeof(opts->socket_path))
		return k3_err_set(err, -ENAMETOOLONG, "socket path under '%.*s' is too long", n, dir);
	return 0;
}

void k3_options_log(const struct k3_options *opts)
{
	char ids[512];
	size_t off = 0;

	k3_log_info("k3d %s starting, pid %d, uid %u", K3_VERSION, (int)getpid(), (unsigned)getuid());
	k3_log_info("config: socket=%s%s", opts->socket_path[0] ? opts->socket_path : "(systemd)",
		    opts->socket_from_systemd ? " (passed by systemd)" : "");
	off += (size_t)snprintf(ids + off, sizeof(ids) - off, "self,root");
	for (unsigned i = 0; i < opts->n_allow_uid && off < sizeof(ids); i++)
		off += (size_t)snprintf(ids + off, sizeof(ids) - off, ",uid:%u", (unsigned)opts->allow_uid[i]);
	for (unsigned i = 0; i < opts->n_allow_gid && off < sizeof(ids); i++)
		off += (size_t)snprintf(ids + off, sizeof(ids) - off, ",gid:%u", (unsigned)opts->allow_gid[i]);
	k3_log_info("config: allow=%s", ids);
	k3_log_info("config: model=%s queue=%u threads=%u drain-timeout=%gs",
		    opts->model_dir ? opts->model_dir : "(none)", opts->queue_max, opts->threads,
		    opts->drain_timeout_s);
	char cache[32];
	if (opts->expert_cache_bytes)
		snprintf(cache, sizeof(cache), "%.9gGB", (double)opts->expert_cache_bytes / 1e9);
	else
		snprintf(cache, sizeof(cache), "auto");
	char pf[32];
	if (opts->prefetch < 0)
		snprintf(pf, sizeof(pf), "auto");
	else if (opts->prefetch == 0)
		snprintf(pf, sizeof(pf), "off");
	else
		snprintf(pf, sizeof(pf), "%d", opts->prefetch);
	k3_log_info("config: expert-cache=%s io-threads=%u prefetch=%s direct=%s router-trace=%s packs=%s",
		    cache, opts->io_threads ? opts->io_threads : K3_STORE_DEFAULT_IO_THREADS, pf,
		    k3_store_direct_name((enum k3_store_direct)opts->direct),
		    opts->router_trace ? opts->router_trace : "(none)",
		    opts->no_packs ? "no" : "when valid");
	char vram[32];
	if (opts->vram_cache_bytes == UINT64_MAX)
		snprintf(vram, sizeof(vram), "off");
	else if (opts->vram_cache_bytes)
		snprintf(vram, sizeof(vram), "%.9gGB", (double)opts->vram_cache_bytes / 1e9);
	else
		snprintf(vram, sizeof(vram), "auto");
	k3_log_info("config: provider=%s%s%s vram-cache=%s", opts->provider,
		    strcmp(opts->provider, "auto") == 0 ? " -> " : "",
		    strcmp(opts->provider, "auto") == 0 ? k3_provider_auto() : "", vram);
}

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
#include "draft/draft.h"
#include "engine/engine.h"
#include "store/store.h"
#include "store/store_budget.h"
#include "store/store_plan.h"
#include "k3_build_config.h"
#include "k3_limits.h"
#include "k3_proto.h"

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
	"  --queue N            generations that may wait behind the running ones (default 0)\n"
	"  --parallel auto|N    generations advanced together in one pass, 1..16 (auto:\n"
	"                       as many as the memory plan fits, at most 4; 1 = one at a time)\n"
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
	"  --memory-limit SIZE  plan memory for at most SIZE (64G, 512M; default and cap:\n"
	"                       min(RAM, cgroup memory.max / memory.high))\n"
	"  --context N          tokens of MLA cache the plan reserves per conversation, and\n"
	"                       the most one may hold (default: reserve min(32768, the\n"
	"                       model's), accept up to the model's)\n"
	"  --spine-resident auto|all|N|none  stream the spine (every non-expert weight):\n"
	"                       layers 0..N-1 stay resident, every later layer is read\n"
	"                       per pass into a ring of layer arenas; auto = the memory\n"
	"                       plan's prefix, all = every layer; not given: the plan's\n"
	"                       choice, the spine mapped when it all fits (docs/plan.md)\n"
	"  --router-trace FILE  append each routing decision as a JSON line\n"
	"  --no-packs           read experts (and the spine) from the shards even when\n"
	"                       packs are valid\n"
	"  --expert-dir DIR     another drive's copy of the expert packs, full or partial\n"
	"                       (k3ctl pack --out DIR [--layers L|--hot-experts N]);\n"
	"                       repeatable, up to 3; each read goes to the copy that\n"
	"                       should finish first, slow reads are hedged\n"
	"  --hedge auto|off|F   hedge a read running F x its drive's p95 (auto: 1.5)\n"
	"  --io-rate GBPS[,..]  emulated drive: each drive (the model directory's, then\n"
	"                       each --expert-dir) read at GBPS over the page cache\n"
	"  --io-latency MS[,..] emulated drive: latency per request\n"
	"  --io-stall MS:F[,..] emulated fault: a fraction F of requests MS later\n"
	"  --prefill-chunk auto|N  prompt positions per pass (auto: the longest whose\n"
	"                       activations fit a sixteenth of the memory limit)\n"
	"  --spine bf16|int8    the spine's weights: bf16 (default) = the checkpoint's,\n"
	"                       weight-exact; int8 = the row-wise int8 overlay written by\n"
	"                       `k3ctl convert-spine-int8` (NOT weight-exact: k3d says so in\n"
	"                       its log, STATUS, every DONE and the model id). Never automatic\n"
	"  --spine-int8-dir DIR the overlay's directory (default MODEL/spine-int8)\n"
	"  --fetch-experts      a streaming install (k3ctl setup --stream): fetch routed\n"
	"                       experts that are not on disk yet when first used, over\n"
	"                       HTTPS (needs network: docs/setup.md, 'Streaming installs')\n"
	"  --draft off|auto|ngram|dspark  speculative decoding for requests that do not\n"
	"                       choose (default auto: DSpark with --draft-model, else\n"
	"                       n-gram; the ids are the same either way)\n"
	"  --draft-model DIR    a DSpark draft checkpoint matching the model\n"
	"  --draft-max N        proposals per verification pass at most (default 7, 1-63)\n"
	"  --draft-width N      always propose N per pass (measurements; default: the\n"
	"                       width that maximises measured tokens per second)\n"
	"  --draft-oracle FILE  tests only: ngram and auto propose the ids in FILE (the\n"
	"                       reference run) instead of n-gram matches\n"
	"  --draft-oracle-spoil P  benchmarks: make a share P (0-1) of those wrong\n"
	"  --provider NAME      cpu (default), torch (LibTorch; a CUDA device when its\n"
	"                       LibTorch has one) or auto (torch with a CUDA device, else cpu)\n"
	"  --vram-cache-gb auto|off|N  device memory for routed experts (torch on a GPU),\n"
	"                       in GB; auto = free VRAM after the model - max(2 GiB, 20%%)\n"
	"  --drain-timeout S    seconds SIGTERM waits for running work (default 30)\n"
	"  --frame-timeout S    seconds a large request frame may take to arrive (default 60)\n"
	"  --max-connections N  client connections in all (default 256, 16-4096; 8 kept for root)\n"
	"  --max-connections-per-uid N  connections one uid may hold (default 32);\n"
	"                       root and --gateway-uid users are not capped\n"
	"  --gateway-uid UID    peers with this uid or user name are k3-gateway (repeatable):\n"
	"                       admitted, and served from --gateway-connections\n"
	"  --gateway-connections N  connections kept for --gateway-uid peers (default 64)\n"
	"  --idle-timeout S     close connections idle this long, with no request queued\n"
	"                       or running (default 300; 0 = never)\n"
	"  --log-level LEVEL    err, warning, notice, info (default) or debug\n"
	"  -h, --help           show this help\n"
	"  --version            show the version\n"
	"\n"
	"The daemon's own uid and root are always allowed. See k3d(8).\n";

/* A number, or a name: a user's (its uid) or, with group, a group's (its
 * gid). */
static int parse_id(const char *opt, const char *s, bool group, uint32_t *out, struct k3_err *err)
{
	uint64_t v;

	if (k3_parse_u64(s, 0, UINT32_MAX - 1, &v, NULL) == 0) {
		*out = (uint32_t)v;
		return 0;
	}
	if (group) {
		const struct group *gr = getgrnam(s);

		if (gr) {
			*out = gr->gr_gid;
			return 0;
		}
	} else {
		const struct passwd *pw = getpwnam(s);

		if (pw) {
			*out = pw->pw_uid;
			return 0;
		}
	}
	return k3_err_set(err, -EINVAL, "%s: no %s '%s'", opt, group ? "group" : "user", s);
}

/* A count option: k3_parse_u64 within [min, max], named in the error. */
static int parse_count(const char *opt, const char *s, uint64_t min, uint64_t max, unsigned *out,
		       struct k3_err *err)
{
	uint64_t v;

	if (k3_parse_u64(s, min, max, &v, err) < 0)
		return k3_err_prefix(err, "%s", opt);
	*out = (unsigned)v;
	return 0;
}

/* Appends a uid or user name to one of the K3_OPTIONS_MAX_IDS lists. */
static int add_uid(const char *opt, const char *s, uid_t *list, unsigned *n, struct k3_err *err)
{
	uint32_t id = 0;
	int r;

	if (*n == K3_OPTIONS_MAX_IDS)
		return k3_err_set(err, -EINVAL, "%s: at most %d", opt, K3_OPTIONS_MAX_IDS);
	if ((r = parse_id(opt, s, false, &id, err)) < 0)
		return r;
	list[(*n)++] = (uid_t)id;
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

/* The connection limits depend on each other: defaults shrink with a
 * small --max-connections, explicit values that cannot fit are refused. */
static int finish_connection_limits(struct k3_options *opts, bool per_uid_set, bool gateway_set,
				    struct k3_err *err)
{
	unsigned total = opts->max_connections;
	unsigned gw_max = total - K3_LIM_CONN_ROOT_RESERVED - 1;

	if (!per_uid_set)
		opts->max_connections_per_uid = K3_LIM_CONN_PER_UID_DEFAULT < total
			? K3_LIM_CONN_PER_UID_DEFAULT : total;
	else if (opts->max_connections_per_uid > total)
		return k3_err_set(err, -EINVAL, "--max-connections-per-uid %u is more than "
				  "--max-connections %u", opts->max_connections_per_uid, total);
	if (!gateway_set)
		opts->gateway_connections = K3_LIM_CONN_GATEWAY_DEFAULT < total / 4
			? K3_LIM_CONN_GATEWAY_DEFAULT : total / 4;
	else if (opts->gateway_connections > gw_max)
		return k3_err_set(err, -EINVAL, "--gateway-connections %u leaves no room for other "
				  "clients: at most %u with --max-connections %u (%u are kept for root)",
				  opts->gateway_connections, gw_max, total, K3_LIM_CONN_ROOT_RESERVED);
	if (gateway_set && !opts->n_gateway_uid)
		return k3_err_set(err, -EINVAL, "--gateway-connections needs --gateway-uid (whose "
				  "connections it keeps room for)");
	return 0;
}

/* The options, each named once: the rows give the ids, the getopt table
 * and, for the plain kinds, their cases in k3_options_parse.
 * COUNT: a count in [min, max] into an unsigned field (parse_count);
 * REAL: a number in [min, max] into a double field;
 * PATH: a non-empty path, kept as given;
 * PARSED: its own parser(value, &field, err), which names the option;
 * UID: a uid or user name appended to the list field (add_uid);
 * OTHER: parsed by its own case (has_arg as getopt_long takes it). */
#define K3D_COUNT_OPTS_(X) \
	X("queue", O_QUEUE, queue_max, 0, K3_LIM_QUEUE_MAX) \
	X("threads", O_THREADS, threads, 0, 1024) \
	X("max-connections", O_MAX_CONN, max_connections, K3_LIM_CONNECTIONS_MIN, \
	  K3_LIM_CONNECTIONS_MAX) \
	X("max-connections-per-uid", O_MAX_CONN_UID, max_connections_per_uid, 1, \
	  K3_LIM_CONNECTIONS_MAX) \
	X("gateway-connections", O_GW_CONN, gateway_connections, 1, K3_LIM_CONNECTIONS_MAX) \
	X("io-threads", O_IOT, io_threads, 1, K3_STORE_MAX_IO_THREADS) \
	X("context", O_CONTEXT, context_tokens, 1, 1u << 24) \
	X("draft-width", O_DRAFT_WIDTH, draft_width, 0, K3_OPTIONS_DRAFT_MAX) \
	X("draft-max", O_DRAFT_MAX, draft_max, 1, K3_OPTIONS_DRAFT_MAX)
#define K3D_REAL_OPTS_(X) \
	X("frame-timeout", O_FRAME_TIMEOUT, frame_timeout_s, 0.1, 86400) \
	X("idle-timeout", O_IDLE, idle_timeout_s, 0, K3_LIM_IDLE_TIMEOUT_MAX_S) \
	X("drain-timeout", O_DRAIN, drain_timeout_s, 0, 86400) \
	X("draft-oracle-spoil", O_DRAFT_SPOIL, draft_oracle_spoil, 0, 1)
#define K3D_PATH_OPTS_(X) \
	X("router-trace", O_TRACE, router_trace) \
	X("spine-int8-dir", O_SPINE_INT8_DIR, spine_int8_dir) \
	X("draft-model", O_DRAFT_MODEL, draft_model) \
	X("draft-oracle", O_DRAFT_ORACLE, draft_oracle)
#define K3D_PARSED_OPTS_(X) \
	X("log-level", O_LOG, parse_level, log_level) \
	X("expert-cache-gb", O_CACHE, k3_store_budget_parse_gb, expert_cache_bytes) \
	X("spine-resident", O_RESIDENT, k3_store_plan_parse_resident, spine_resident) \
	X("hedge", O_HEDGE, k3_store_drive_parse_hedge, drives) \
	X("io-rate", O_IO_RATE, k3_store_drive_parse_rate, drives) \
	X("io-latency", O_IO_LATENCY, k3_store_drive_parse_latency, drives) \
	X("io-stall", O_IO_STALL, k3_store_drive_parse_stall, drives)
#define K3D_UID_OPTS_(X) \
	X("allow-uid", O_UID, allow_uid, n_allow_uid) \
	X("gateway-uid", O_GW_UID, gateway_uid, n_gateway_uid)
#define K3D_OTHER_OPTS_(X) \
	X("socket", O_SOCKET, required_argument) \
	X("model", O_MODEL, required_argument) \
	X("allow-gid", O_GID, required_argument) \
	X("parallel", O_PARALLEL, required_argument) \
	X("prefetch", O_PREFETCH, required_argument) \
	X("no-packs", O_NOPACKS, no_argument) \
	X("fetch-experts", O_FETCH, no_argument) \
	X("direct", O_DIRECT, required_argument) \
	X("memory-limit", O_MEMLIMIT, required_argument) \
	X("expert-dir", O_EXPERT_DIR, required_argument) \
	X("prefill-chunk", O_PREFILL_CHUNK, required_argument) \
	X("spine", O_SPINE_DTYPE, required_argument) \
	X("draft", O_DRAFT, required_argument) \
	X("provider", O_PROVIDER, required_argument) \
	X("vram-cache-gb", O_VRAM, required_argument) \
	X("version", O_VERSION, no_argument)

enum k3d_option_id {
	O_FIRST_ = 255,   /* after every short option */
#define ID_(name, id, ...) id,
	K3D_COUNT_OPTS_(ID_) K3D_REAL_OPTS_(ID_) K3D_PATH_OPTS_(ID_) K3D_PARSED_OPTS_(ID_)
	K3D_UID_OPTS_(ID_) K3D_OTHER_OPTS_(ID_)
#undef ID_
};

/* A value that is one of these words or a count. */
struct opt_word {
	const char *word;
	int64_t value;
};
static const struct opt_word auto_zero[] = { { "auto", 0 }, { NULL, 0 } };

/* s as one of words[] (NULL-ended) or a count in [min, max], a bad count's
 * error prefixed with what (the option, and what it takes). */
static int parse_word_or_count(const char *what, const char *s, const struct opt_word *words,
			       uint64_t min, uint64_t max, int64_t *out, struct k3_err *err)
{
	uint64_t v;

	for (; words->word; words++)
		if (strcmp(s, words->word) == 0) {
			*out = words->value;
			return 0;
		}
	if (k3_parse_u64(s, min, max, &v, err) < 0)
		return k3_err_prefix(err, "%s", what);
	*out = (int64_t)v;
	return 0;
}

int k3_options_parse(struct k3_options *opts, int argc, char **argv, struct k3_err *err)
{
	static const struct option longopts[] = {
#define LONG_(name, id, ...) { name, required_argument, NULL, id },
#define LONG_OTHER_(name, id, has_arg) { name, has_arg, NULL, id },
		K3D_COUNT_OPTS_(LONG_) K3D_REAL_OPTS_(LONG_) K3D_PATH_OPTS_(LONG_)
		K3D_PARSED_OPTS_(LONG_) K3D_UID_OPTS_(LONG_) K3D_OTHER_OPTS_(LONG_OTHER_)
#undef LONG_OTHER_
#undef LONG_
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	int64_t w = 0;
	int c, r;
	bool per_uid_set = false, gateway_set = false;

	memset(opts, 0, sizeof(*opts));
	opts->drain_timeout_s = 30;
	opts->frame_timeout_s = 60;
	opts->max_connections = K3_LIM_CONNECTIONS_DEFAULT;
	opts->idle_timeout_s = K3_LIM_IDLE_TIMEOUT_DEFAULT_S;
	opts->log_level = K3_LOG_INFO;
	opts->prefetch = -1;
	opts->spine_resident = K3_STORE_PLAN_RESIDENT_DEFAULT;
	k3_store_drive_opts_init(&opts->drives);
	opts->draft = K3_DRAFT_POLICY_AUTO;
	opts->draft_max = K3_OPTIONS_DRAFT_MAX_DEFAULT;
	opts->provider = "cpu";
	opterr = 0;
	optind = 1;
	while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
		switch (c) {
#define COUNT_CASE_(name, id, field, min, max) case id: \
			if ((r = parse_count("--" name, optarg, min, max, &opts->field, err)) < 0) \
				return r; \
			break;
#define REAL_CASE_(name, id, field, min, max) case id: \
			if (k3_parse_double(optarg, min, max, &opts->field, err) < 0) \
				return k3_err_prefix(err, "--" name); \
			break;
#define PATH_CASE_(name, id, field) case id: \
			if (!optarg[0]) \
				return k3_err_set(err, -EINVAL, "--" name ": empty path"); \
			opts->field = optarg; \
			break;
		K3D_COUNT_OPTS_(COUNT_CASE_)
		K3D_REAL_OPTS_(REAL_CASE_)
#define PARSED_CASE_(name, id, parser, field) case id: \
			if ((r = parser(optarg, &opts->field, err)) < 0) \
				return r; \
			break;
		K3D_PATH_OPTS_(PATH_CASE_)
#define UID_CASE_(name, id, list, n) case id: \
			if ((r = add_uid("--" name, optarg, opts->list, &opts->n, err)) < 0) \
				return r; \
			break;
		K3D_PARSED_OPTS_(PARSED_CASE_)
		K3D_UID_OPTS_(UID_CASE_)
#undef UID_CASE_
#undef PARSED_CASE_
#undef PATH_CASE_
#undef REAL_CASE_
#undef COUNT_CASE_
		case O_SOCKET:
			if (strlen(optarg) >= sizeof(opts->socket_path) || optarg[0] == '\0')
				return k3_err_set(err, -EINVAL, "--socket: path must be 1..%zu bytes",
						  sizeof(opts->socket_path) - 1);
			strcpy(opts->socket_path, optarg);
			break;
		case O_MODEL:
			opts->model_dir = optarg;
			break;
		case O_GID: {
			uint32_t id = 0;

			if (opts->n_allow_gid == K3_OPTIONS_MAX_IDS)
				return k3_err_set(err, -EINVAL, "--allow-gid: at most %d", K3_OPTIONS_MAX_IDS);
			if ((r = parse_id("--allow-gid", optarg, true, &id, err)) < 0)
				return r;
			opts->allow_gid[opts->n_allow_gid++] = (gid_t)id;
			break;
		}
		case O_PARALLEL:
			if ((r = parse_word_or_count("--parallel", optarg, auto_zero, 1,
						     K3_OPTIONS_PARALLEL_MAX, &w, err)) < 0)
				return r;
			opts->parallel = (unsigned)w;
			break;
		case O_PREFETCH: {
			static const struct opt_word words[] = { { "off", 0 }, { "auto", -1 }, { NULL, 0 } };
			if ((r = parse_word_or_count("--prefetch ('auto', a count or 'off')", optarg, words,
						     1, K3_OPTIONS_PREFETCH_MAX, &w, err)) < 0)
				return r;
			opts->prefetch = (int)w;
			break;
		}
		case O_DIRECT: {
			enum k3_store_direct d;
			if ((r = k3_store_direct_parse(optarg, &d, err)) < 0)
				return k3_err_prefix(err, "--direct");
			opts->direct = (int)d;
			break;
		}
		case O_NOPACKS:
			opts->no_packs = true;
			break;
		case O_MEMLIMIT:
			if ((r = k3_parse_size(optarg, &opts->memory_limit_bytes, err)) < 0)
				return k3_err_prefix(err, "--memory-limit");
			if (!opts->memory_limit_bytes)
				return k3_err_set(err, -EINVAL, "--memory-limit: a size above 0 (64G, 512M)");
			break;
		case O_EXPERT_DIR:
			if (opts->n_expert_dirs == K3_STORE_MAX_DRIVES - 1)
				return k3_err_set(err, -EINVAL, "--expert-dir: at most %d",
						  K3_STORE_MAX_DRIVES - 1);
			opts->expert_dirs[opts->n_expert_dirs++] = optarg;
			break;
		case O_PREFILL_CHUNK:
			if ((r = parse_word_or_count("--prefill-chunk ('auto' or 1..4096)", optarg, auto_zero,
						     1, 4096, &w, err)) < 0)
				return r;
			opts->prefill_chunk = (uint32_t)w;
			break;
		case O_SPINE_DTYPE:
			if (strcmp(optarg, "bf16") && strcmp(optarg, "int8"))
				return k3_err_set(err, -EINVAL, "--spine: '%s' is not bf16 or int8 (k3d never"
						  " picks the int8 spine by itself: it is not weight-exact)",
						  optarg);
			opts->spine_int8 = strcmp(optarg, "int8") == 0;
			break;
		case O_FETCH:
			opts->fetch_experts = true;
			break;
		case O_DRAFT: {
			uint32_t p;
			if (k3_proto_draft_policy_parse(optarg, &p) < 0)
				return k3_err_set(err, -EINVAL, "--draft: '%s' is not one of off, auto, "
						  "ngram, dspark", optarg);
			opts->draft = (int)p;
			break;
		}
		case O_PROVIDER:
			if (k3_engine_provider_check(optarg, err) < 0)
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
		per_uid_set |= c == O_MAX_CONN_UID;
		gateway_set |= c == O_GW_CONN;
	}
	if (optind < argc)
		return k3_err_set(err, -EINVAL, "unexpected argument '%s' (see k3d --help)", argv[optind]);
	if (opts->spine_int8_dir && !opts->spine_int8)
		return k3_err_set(err, -EINVAL, "--spine-int8-dir needs --spine int8");
	if (opts->draft_oracle_spoil > 0 && !opts->draft_oracle)
		return k3_err_set(err, -EINVAL, "--draft-oracle-spoil needs --draft-oracle FILE");
	if (opts->draft == K3_DRAFT_POLICY_DSPARK && !opts->draft_model)
		return k3_err_set(err, -EINVAL, "--draft dspark needs --draft-model DIR (a DSpark "
				  "draft checkpoint)");
	return finish_connection_limits(opts, per_uid_set, gateway_set, err);
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

/* v as text in buf, or zero (the word a 0 stands for) when v is 0. */
static const char *count_or(char *buf, size_t n, unsigned v, const char *zero)
{
	if (!v)
		return zero;
	snprintf(buf, n, "%u", v);
	return buf;
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
	off = (size_t)snprintf(ids, sizeof(ids), "%s", opts->n_gateway_uid ? "" : "(none)");
	for (unsigned i = 0; i < opts->n_gateway_uid && off < sizeof(ids); i++)
		off += (size_t)snprintf(ids + off, sizeof(ids) - off, "%suid:%u", i ? "," : "",
					(unsigned)opts->gateway_uid[i]);
	k3_log_info("config: max-connections=%u (root %u, gateway %u) per-uid=%u gateway-uid=%s "
		    "idle-timeout=%gs", opts->max_connections, K3_LIM_CONN_ROOT_RESERVED,
		    opts->n_gateway_uid ? opts->gateway_connections : 0, opts->max_connections_per_uid,
		    ids, opts->idle_timeout_s);
	char par[16];
	k3_log_info("config: model=%s queue=%u parallel=%s threads=%u drain-timeout=%gs",
		    opts->model_dir ? opts->model_dir : "(none)", opts->queue_max,
		    count_or(par, sizeof(par), opts->parallel, "auto"), opts->threads,
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
	char num[16];
	const char *sp = opts->spine_resident == K3_STORE_PLAN_RESIDENT_DEFAULT
			 ? "mapped (streamed when it does not fit)"
			 : k3_store_plan_resident_name(opts->spine_resident, num, sizeof(num));
	k3_log_info("config: expert-cache=%s io-threads=%u prefetch=%s direct=%s router-trace=%s"
		    " packs=%s spine-resident=%s fetch-experts=%s",
		    cache, opts->io_threads ? opts->io_threads : K3_STORE_DEFAULT_IO_THREADS, pf,
		    k3_store_direct_name((enum k3_store_direct)opts->direct),
		    opts->router_trace ? opts->router_trace : "(none)",
		    opts->no_packs ? "no" : "when valid", sp, opts->fetch_experts ? "yes" : "no");
	char hedge[16], chunk[16];
	k3_log_info("config: expert-dirs=%u hedge=%s prefill-chunk=%s%s", opts->n_expert_dirs,
		    k3_store_drive_hedge_name(&opts->drives, hedge, sizeof(hedge)),
		    count_or(chunk, sizeof(chunk), opts->prefill_chunk, "auto"),
		    opts->drives.n_rate || opts->drives.n_latency || opts->drives.n_stall
		    ? " emulated-drive=on" : "");
	char mem[32], ctx[32];
	if (opts->memory_limit_bytes)
		snprintf(mem, sizeof(mem), "%.3fGB", (double)opts->memory_limit_bytes / 1e9);
	else
		snprintf(mem, sizeof(mem), "none");
	k3_log_info("config: memory-limit=%s context=%s", mem,
		    count_or(ctx, sizeof(ctx), opts->context_tokens, "auto"));
	if (opts->spine_int8)
		k3_log_info("config: spine=int8 (NOT weight-exact) spine-int8-dir=%s",
			    opts->spine_int8_dir ? opts->spine_int8_dir : "(MODEL/spine-int8)");
	else
		k3_log_info("config: spine=bf16 (the checkpoint's weights)");
	char width[16];
	k3_log_info("config: draft=%s draft-model=%s draft-max=%u draft-width=%s%s%s",
		    k3_proto_draft_policy_name((uint32_t)opts->draft),
		    opts->draft_model ? opts->draft_model : "(none)", opts->draft_max,
		    count_or(width, sizeof(width), opts->draft_width, "measured"),
		    opts->draft_oracle ? " draft-oracle=" : "",
		    opts->draft_oracle ? opts->draft_oracle : "");
	char vram[32];
	if (opts->vram_cache_bytes == UINT64_MAX)
		snprintf(vram, sizeof(vram), "off");
	else if (opts->vram_cache_bytes)
		snprintf(vram, sizeof(vram), "%.9gGB", (double)opts->vram_cache_bytes / 1e9);
	else
		snprintf(vram, sizeof(vram), "auto");
	k3_log_info("config: provider=%s%s%s vram-cache=%s", opts->provider,
		    strcmp(opts->provider, "auto") == 0 ? " -> " : "",
		    strcmp(opts->provider, "auto") == 0 ? k3_engine_provider_auto() : "", vram);
}

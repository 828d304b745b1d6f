/*
 * options.h - k3d's effective configuration: defaults < command line.
 * (A config file layer joins later; the table keeps one row per key so
 * that --help, parsing and the start-up log cannot disagree.)
 */
#ifndef K3_SERVER_OPTIONS_H
#define K3_SERVER_OPTIONS_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "base/err.h"
#include "store/store_drives.h"

enum { K3_OPTIONS_MAX_IDS = 32 };

struct k3_options {
	char socket_path[108];        /* sockaddr_un limit; "" = decide at start */
	bool socket_from_systemd;     /* sockets were passed (LISTEN_FDS) */
	uid_t allow_uid[K3_OPTIONS_MAX_IDS];
	unsigned n_allow_uid;
	gid_t allow_gid[K3_OPTIONS_MAX_IDS];
	unsigned n_allow_gid;
	const char *model_dir;        /* --model; NULL = none yet */
	unsigned queue_max;           /* --queue: generations waiting beyond the running one */
	/* --parallel: sequences advanced together in one pass (seats); 0 =
	 * auto (the memory plan's choice at load, at most
	 * K3_OPTIONS_PARALLEL_AUTO_MAX; docs/scheduler.md) */
	unsigned parallel;
	unsigned threads;             /* --threads: compute threads, 0 = cores */
	double drain_timeout_s;       /* how long SIGTERM waits for running work */
	double frame_timeout_s;       /* a large frame must arrive whole within this */
	/* Connections (k3_limits.h has each default, bound and why) */
	unsigned max_connections;     /* --max-connections: all together */
	unsigned max_connections_per_uid; /* --max-connections-per-uid: any one uid but
				       * root and the gateway uids */
	uid_t gateway_uid[K3_OPTIONS_MAX_IDS]; /* --gateway-uid: k3-gateway's users */
	unsigned n_gateway_uid;
	unsigned gateway_connections; /* --gateway-connections: kept for gateway_uid */
	double idle_timeout_s;        /* --idle-timeout: 0 = never */
	int log_level;                /* enum k3_log_level */
	/* The expert store (docs/store.md) */
	uint64_t expert_cache_bytes;  /* --expert-cache-gb: 0 = auto (store_budget.h) */
	unsigned io_threads;          /* --io-threads: reader threads, 0 = default (2) */
	int prefetch;                 /* --prefetch: lookahead guesses per position;
				       * 0 = off, -1 = auto (the default: every rank
				       * whose measured precision passes the gate) */
	const char *router_trace;     /* --router-trace FILE; NULL = none */
	bool no_packs;                /* --no-packs: read experts (and the spine) from the shards */
	/* --spine-resident: K3_STORE_PLAN_RESIDENT_DEFAULT when not given (the
	 * plan's choice, the spine mapped when it all fits), _AUTO, _ALL,
	 * _NONE, or N >= 0 layers resident and the rest streamed (docs/plan.md,
	 * docs/spine.md) */
	int32_t spine_resident;
	bool fetch_experts;           /* --fetch-experts: a streaming install's missing
				       * experts are fetched on demand (docs/setup.md) */
	int direct;                   /* --direct: enum k3_store_direct (auto, on, off) */
	/* Several drives (docs/drives.md): copies of the
	 * packs in each --expert-dir, drives 1.. (drive 0 is the model
	 * directory's packs or shards); the emulated drive per drive
	 * (--io-rate, --io-latency, --io-stall) and --hedge */
	const char *expert_dirs[K3_STORE_MAX_DRIVES - 1];
	unsigned n_expert_dirs;
	struct k3_store_drive_opts drives;
	/* --prefill-chunk: prompt positions per pass; 0 = auto (the largest
	 * whose activations fit the scratch budget, sched_load.c) */
	uint32_t prefill_chunk;
	/* --spine int8: the int8 spine overlay (NOT weight-exact), never chosen
	 * by k3d itself; --spine-int8-dir: where it is (NULL = MODEL/spine-int8) */
	bool spine_int8;
	const char *spine_int8_dir;
	/* The memory planner (docs/plan.md, store_plan.h) */
	uint64_t memory_limit_bytes;  /* --memory-limit: 0 = min(RAM, cgroup) alone */
	uint32_t context_tokens;      /* --context: 0 = plan for min(32768, max_position_embeddings),
				       * accept up to max_position_embeddings */
	/* Speculative decoding (docs/draft.md) */
	int draft;                    /* --draft: enum k3_draft_policy, the default of
				       * requests that do not choose (auto) */
	const char *draft_model;      /* --draft-model DIR: a DSpark draft; NULL = none */
	unsigned draft_max;           /* --draft-max N: proposals per pass at most (7) */
	unsigned draft_width;         /* --draft-width N: always N (measurements, tests);
				       * 0 = chosen from the measured cost (default) */
	const char *draft_oracle;     /* --draft-oracle FILE (tests): the n-gram draft's
				       * place goes to the oracle over these ids */
	double draft_oracle_spoil;    /* --draft-oracle-spoil P: share of its proposals
				       * made wrong (benchmarks: acceptance 1 - P) */
	/* Providers (docs/providers.md) */
	const char *provider;         /* --provider: "cpu" (default), "torch" or "auto" */
	uint64_t vram_cache_bytes;    /* --vram-cache-gb: 0 = auto, UINT64_MAX = off */
};

/* --draft-max bounds: a verification pass is at most one prefill chunk. */
enum { K3_OPTIONS_DRAFT_MAX_DEFAULT = 7, K3_OPTIONS_DRAFT_MAX = 63 };
/* --parallel: at most this many seats (each costs a sequence state; the
 * engine's pass holds them all); auto picks at most _AUTO_MAX. */
enum { K3_OPTIONS_PARALLEL_MAX = 16, K3_OPTIONS_PARALLEL_AUTO_MAX = 4 };

/* --prefetch N: at most this many guesses per position. The default, auto,
 * offers every rank of the next MoE layer's predicted experts and the store
 * reads a rank ahead only while its measured precision is >= 0.9: every
 * wrong guess costs a read (docs/store.md, "Prefetch", measured). */
enum { K3_OPTIONS_PREFETCH_MAX = 64 };

/*
 * Parses argv into opts (defaults first). Returns 0; 1 when --help or
 * --version was printed (caller exits 0); or -EINVAL with err naming the
 * bad option (caller prints it and exits 2).
 */
int k3_options_parse(struct k3_options *opts, int argc, char **argv, struct k3_err *err);

/* Resolves the default socket path when none was given: $RUNTIME_DIRECTORY
 * (systemd's RuntimeDirectory=, i.e. /run/k3d), else $XDG_RUNTIME_DIR,
 * each + "/k3d.sock". Returns -ENOENT with a hint when neither is set. */
int k3_options_default_socket(struct k3_options *opts, struct k3_err *err);

/* Logs the effective configuration, one line per key (INFO). */
void k3_options_log(const struct k3_options *opts);

#endif

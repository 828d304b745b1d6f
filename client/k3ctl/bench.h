/*
 * bench.h - what the files of `k3ctl bench` share: its options
 * (cmd_bench.c parses them), the disk yardstick and the probe store's cold
 * reads (cmd_bench_disk.c), the run (cmd_bench_run.c) and its report
 * (cmd_bench_report.c), and the model, store and engine that the run and
 * bench --parallel (cmd_bench_batch.c) both measure through
 * (k3ctl_bench_setup, cmd_bench_run.c). What the figures mean:
 * cmd_bench.c's head comment.
 */
#ifndef K3CTL_BENCH_H
#define K3CTL_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "store/store.h"
#include "store/store_drives.h"
#include "store/store_engine.h"
#include "store/store_spine.h"
#include "text/text_tok.h"

enum { BENCH_MAX_NEW = 4096, BENCH_MAX_PROMPT = 4096, BENCH_MAX_SAMPLES = 64 };

/* The options of one offline run, as parsed (bounded) by cmd_bench.c. */
struct k3ctl_bench_opts {
	const char *model_dir, *preset;  /* exactly one set; preset: "trained" */
	uint64_t max_new, prompt_len;    /* tokens, 1..BENCH_MAX_NEW / BENCH_MAX_PROMPT */
	uint64_t threads, io_threads;    /* 0: the engine's / store's default */
	uint64_t disk_mib;               /* MiB per disk sample */
	bool disk_mib_set;               /* --disk-mib given (else sized to the pool) */
	uint64_t cache_bytes;            /* --expert-cache-gb; 0: the plan's */
	uint64_t seed, n_samples;        /* n_samples 2..BENCH_MAX_SAMPLES */
	int64_t prefetch;                /* -1 = auto, 0 = off, else per position */
	double gate;                     /* --prefetch-gate; 0: the store's default */
	enum k3_store_direct direct;
	bool no_packs;
	int32_t spine_resident;          /* K3_STORE_PLAN_RESIDENT_* or a layer count */
	const char *dirs[K3_STORE_MAX_DRIVES - 1];   /* --expert-dir, in order */
	unsigned n_dirs;
	struct k3_store_drive_opts dopts;
	uint64_t prefill_chunk;          /* 0: the engine's default */
};

/* Runs the benchmark o describes (o is not changed) and prints its report
 * to stdout (the header lines to stderr under --json). Returns a K3CTL_EXIT_*
 * code; errors are printed as "k3ctl bench: ...". */
int k3ctl_bench_run(const struct k3ctl_bench_opts *o);

/* Monotonic seconds. */
double k3ctl_bench_now_s(void);

/* --preset trained: installs the trained demo model into a fresh
 * directory TMPDIR/k3-bench-<tag>.XXXXXX (written into dir[cap]; dir[0]
 * is 0 when none was made, else the caller removes it with
 * k3ctl_trained_remove) and encodes the preset's prompt (sentence forms
 * of the model's training corpus, tools/train_demo/data.py, so its
 * routing is the router's on text it knows) into *ids (caller releases).
 * 0 or a negative errno with err set. */
struct k3_tok_ids;
int k3ctl_bench_trained_model(char *dir, size_t cap, const char *tag, struct k3_tok_ids *ids,
			      struct k3_err *err);

struct k3ctl_bench_spread {
	double median, min, max;
};

/* The median, min and max of v[0..n), n <= BENCH_MAX_SAMPLES (zeros for
 * n <= 0). */
struct k3ctl_bench_spread k3ctl_bench_spread_of(const double *v, int n);

struct k3ctl_bench_layer_range {
	uint32_t layer;
	size_t first, n;      /* indices into by_layer */
};

/* A store of its own (2 x top-k slots) over the measured store's source,
 * to time the store's cold read path, and the source's experts by layer. */
struct k3ctl_bench_probe {
	struct k3_store *store;
	const struct k3_store_source *src;
	size_t *by_layer;     /* source indices sorted by (layer, expert) */
	struct k3ctl_bench_layer_range *layers;
	size_t n_layers;
	uint32_t top_k;
};

/* Opens the probe store over src (borrowed; it must outlive p) with
 * io_threads readers. Returns 0 or a negative errno (err says why); call
 * k3ctl_bench_probe_close after either. */
int k3ctl_bench_probe_open(struct k3ctl_bench_probe *p, const struct k3_store_source *src,
			   uint32_t top_k, unsigned io_threads, struct k3_err *err);
void k3ctl_bench_probe_close(struct k3ctl_bench_probe *p);

/* Raw reads of dsrc from one drive, max_bytes in cold-step order with
 * `threads` reads in flight into bufs (`threads` prefaulted slot-sized
 * buffers). Returns GB/s or a negative errno (-ENOENT: the drive holds no
 * expert); *bytes_out gets the bytes read. */
double k3ctl_bench_disk_bandwidth(const struct k3ctl_bench_probe *p,
				  const struct k3_store_source *dsrc, uint32_t drive,
				  unsigned threads, uint8_t **bufs, uint64_t max_bytes,
				  uint64_t *seed, uint64_t *bytes_out);

/* The disk and cold-read samples of a run, in the order taken. */
struct k3ctl_bench_samples {
	int n;
	double disk[BENCH_MAX_SAMPLES], cold[BENCH_MAX_SAMPLES], ratio[BENCH_MAX_SAMPLES];
	const char *where[BENCH_MAX_SAMPLES];
	uint64_t disk_bytes, cold_bytes;
};

/* Takes one disk + cold-read pair (drive 0) into sm, the order
 * alternating from sample to sample; nothing once sm is full. Returns 0
 * or a negative errno (err says why). */
int k3ctl_bench_take_sample(struct k3ctl_bench_samples *sm, const char *where,
			    const struct k3_store_source *dsrc, unsigned threads, uint8_t **bufs,
			    struct k3ctl_bench_probe *p, uint64_t max_bytes, uint64_t *seed,
			    struct k3_err *err);

/* One timed phase (prefill or decode): its wall time and the counters'
 * difference over it. */
struct k3ctl_bench_phase {
	double wall_s;
	struct k3_store_stats st;
	struct k3_store_spine_stats sp;   /* zero when the spine is mapped */
};

/* What a run measured, for the report. Pointers are borrowed. */
struct k3ctl_bench_result {
	const struct k3ctl_bench_opts *o;  /* prompt_len as run (--preset: clamped) */
	uint32_t top_k;                    /* experts per token */
	uint64_t slot, pool;               /* bytes: one cache slot, all experts */
	const struct k3_store_info *info;  /* at the start */
	const struct k3_store_info *info_end;
	const char *pfs;                   /* the prefetch setting, in words */
	struct k3ctl_bench_phase pre, dec;
	struct k3_store_stats all;         /* the whole run */
	const struct k3ctl_bench_samples *sm;
	uint32_t mid;                      /* samples taken during the decode */
	uint32_t d_buffered;               /* yardstick files without O_DIRECT */
	uint32_t n_drives;
	double io_rate, io_latency_ms;     /* the emulated drives' (0: none) */
	const double *drive_disk;          /* [K3_STORE_MAX_DRIVES] GB/s per further drive ([0]: unused) */
	const uint32_t *home_experts;      /* [K3_STORE_MAX_DRIVES] experts per further drive */
	const uint64_t (*scored)[K3_STORE_GUESS_RANKS], (*right)[K3_STORE_GUESS_RANKS];
	const uint32_t *gen_ids;
	uint32_t gen;                      /* tokens generated */
};

/* Prints the report of r: one JSON object on stdout under --json, else
 * the text lines. */
void k3ctl_bench_report(const struct k3ctl_bench_result *r);

/* What both bench runs (cmd_bench_run.c, cmd_bench_batch.c) measure
 * through, made as k3d makes it: the model, its expert source and store,
 * the spine loader (when the plan streams) and the engine over them with
 * the store's experts as its expert source. */
struct k3ctl_bench_setup {
	char tmpdir[2048];                   /* --preset: the installed model ("": none);
					      * leaves packdir room for its suffix */
	char packdir[4096];                  /* the model's pack directory */
	bool have_packs;                     /* packdir is there, and no --no-packs */
	struct k3_tok_ids text_ids;          /* --preset: the prompt's ids */
	struct k3_model *model;
	struct k3_store_source *src;         /* opened by the caller */
	struct k3_store *store;              /* made by the caller, over src */
	struct k3_engine *e;
	struct k3_store_spine *spine;        /* NULL: the spine is mapped */
	struct k3_store_spine_info sinfo;    /* zero when mapped */
	struct k3_store_spine_report srep;
	struct k3_store_engine_src ectx;     /* the expert source's state; outlives e */
	bool ectx_init;
};

/* Zeroes s and opens its model: with tag (--preset trained) the trained
 * demo model installed by k3ctl_bench_trained_model under tag (model_dir
 * is then s->tmpdir), else model_dir; refuses a model without MoE layers
 * and finds its packs (none with no_packs). Returns 0 or a negative errno
 * (err says why); call k3ctl_bench_setup_close after either. */
int k3ctl_bench_model_open(struct k3ctl_bench_setup *s, const char *model_dir, const char *tag,
			   bool no_packs, struct k3_err *err);

/* Opens s's spine loader (when streams: plan's resident set and ring, from
 * the spine pack when s has packs, else the shards, read with direct
 * through the store's readers) and then the engine (threads, max_chunk: 0
 * for the defaults) with s->store's experts, prefetching per_position
 * guesses per position (0: off). s->store must be made. Returns 0 or a
 * negative errno (err says why). */
struct k3_store_plan_out;
int k3ctl_bench_engine_open(struct k3ctl_bench_setup *s, const struct k3_store_plan_out *plan,
			    bool streams, enum k3_store_direct direct, uint32_t threads,
			    uint32_t max_chunk, uint32_t per_position, struct k3_err *err);

/* Frees what s holds, each before what it borrows (the engine, the spine
 * loader, the store, the source, the model) and removes s->tmpdir. */
void k3ctl_bench_setup_close(struct k3ctl_bench_setup *s);

#endif

/*
 * cmd_bench.c - `k3ctl bench (--model DIR | --preset trained) [--max-new N] [--prompt-len N]
 * [--expert-cache-gb auto|G] [--prefetch auto|N|off] [--prefetch-gate P]
 * [--direct auto|on|off] [--io-threads N] [--threads N] [--no-packs]
 * [--disk-mib M] [--disk-samples N] [--seed N] [--spine-resident auto|all|N|none]
 * [--io-rate GBPS] [--io-latency MS]`: offline (no daemon) greedy generation
 * through the expert store (and with --spine-resident the spine loader,
 * store_spine.h), measured against the disk it reads from (issue 7,
 * "Benchmarks"; docs/store.md), and with --io-rate against an emulated
 * drive of that bandwidth (store_io.h; docs/plan.md).
 *
 * Which model: --model DIR is any checkpoint; for bandwidth figures it is
 * one with K3's real expert shapes (`k3ctl demo-model --preset bench`),
 * whose random weights route nearly uniformly. --preset trained runs on
 * the trained demo model (tools/train_demo/, installed into a private
 * temporary directory and removed after) with a prompt of its training
 * text instead of random ids, so the prompt and the decode route as a
 * trained router does on text: the choice where routing realism matters
 * (hit rate, prefetch precision, the lookahead by rank at a given
 * --expert-cache-gb). Its experts are tiny (kilobytes), so its bytes and
 * disk ratios say nothing about K3's.
 *
 * Prints tokens/s, expert bytes read per token (and the wasted part) and,
 * when the spine streams, spine bytes per token apart, demand hit rate,
 * prefetch figures, the lookahead's precision by rank, and two ratios
 * against the disk measured in the same run (the floor counts the spine's
 * bytes with the experts').
 *
 * The disk is noisy when shared, so it is sampled several times interleaved
 * with the work: before the prompt, after it, at evenly spaced points of the
 * decode (between tokens, outside the timed part) and after. Each sample is
 * a pair, in alternating order:
 *
 *   disk  = raw preads of whole expert spans with O_DIRECT (a source of
 *           its own, opened O_DIRECT where the file system allows it), as
 *           many in flight as the store has reader threads, in the pattern
 *           of cold decode steps: groups of top-k random experts of one
 *           random layer, each sorted by offset, back to back
 *   cold  = the same kind of steps (other random experts, none resident)
 *           acquired through a probe store (its own 2 x top-k slot cache,
 *           same reader threads and read mode as the measured store): the
 *           store's own cold read path, one acquire per step
 *
 * (The same access pattern on both sides matters on a virtual disk whose
 * host caches and reads ahead: a layer's experts sorted by offset are
 * near each other, and were measured up to 2.5 x faster there than fully
 * random spans. On NVMe the two are about the same.)
 *
 * and the report gives the median and spread of each, then
 *
 *   cold-read ratio  = median of the per-sample ratios cold / disk
 *                      (each pair was measured back to back)
 *   decode vs floor  = decode time per token /
 *                      max(bytes read per token / median disk bandwidth,
 *                          compute time per token)
 *                      (and the same against the slowest and fastest disk
 *                      sample, so the reader sees how much the disk's noise
 *                      moves it)
 *
 * With --io-rate R (and --io-latency) the store's readers run through the
 * emulated drive, so over page-cached files (--direct off, the model read
 * once before) the decode is I/O-bound at a known bandwidth, and the
 * report adds
 *
 *   decode vs emulated floor = decode time per token /
 *                              max(bytes read per token / R, compute time)
 *
 * next to the real-disk figures (the yardstick and the probe store read
 * without the emulation: they measure the real disk).
 *
 * This file parses the options; the run is cmd_bench_run.c, the two disk
 * measures cmd_bench_disk.c, the report cmd_bench_report.c (bench.h), the
 * int8 spine comparison cmd_bench_spine.c.
 */
#include <stdio.h>
#include <string.h>

#include "base/parse.h"
#include "bench.h"
#include "k3ctl.h"
#include "store/store_budget.h"
#include "store/store_plan.h"

static void usage(void)
{
	fprintf(stderr,
		"usage: k3ctl bench (--model DIR | --preset trained) [--max-new N] [--prompt-len N]\n"
		"       [--expert-cache-gb auto|G] [--prefetch auto|N|off] [--prefetch-gate P]\n"
		"       [--direct auto|on|off] [--io-threads N] [--threads N] [--no-packs]\n"
		"       [--disk-mib M] [--disk-samples N] [--seed N] [--spine-resident auto|all|N|none]\n"
		"       [--expert-dir DIR]... [--io-rate GBPS[,..]] [--io-latency MS[,..]]\n"
		"       [--io-stall MS:F[,..]] [--hedge auto|off|F] [--prefill-chunk N]\n"
		"       (--preset trained: the trained demo model and a prompt of its training text,\n"
		"       where routing realism matters; its experts are tiny: no bandwidth figures)\n"
		"   or: k3ctl bench --compare-spine --model DIR (--text FILE | --prompt S | --ids LIST)\n"
		"       [--positions N] [--spine-int8-dir DIR] [--int8 CLASSES] [--per-class]\n"
		"   or: k3ctl bench --parallel 1,2,4 (--model DIR | --preset trained) [--max-new N]\n"
		"       [--prompt-len N] [--reps R] [--expert-cache-gb G] [--spine-resident ..]\n"
		"       [--io-rate GBPS] [--io-latency MS] [--direct ..] [--threads N] [--seed N]\n"
		"       (N sequences decoded in lockstep, one batched pass per step: aggregate and\n"
		"       per-sequence tok/s, bytes per token, ids against each one's solo run)\n");
}

static const char *const bench_flags[] = { "--no-packs", NULL };
static const struct k3ctl_args_spec bench_args = {
	.cmd = "bench", .flags = bench_flags, .help = usage,
	.need = "%s needs a value (see --help)",
};

int k3ctl_cmd_bench(int argc, char **argv)
{
	struct k3ctl_bench_opts o = {
		.max_new = 32, .prompt_len = 32, .disk_mib = 256, .seed = 1, .n_samples = 5,
		.prefetch = -1, .direct = K3_STORE_DIRECT_AUTO,
		.spine_resident = K3_STORE_PLAN_RESIDENT_DEFAULT,
	};
	struct k3_err err = { 0 };
	int rc = 0;

	k3_store_drive_opts_init(&o.dopts);

	/* the int8 spine against the bf16 one: its own report (cmd_bench_spine.c) */
	for (int i = 1; i < argc; i++)
		if (!strcmp(argv[i], "--compare-spine"))
			return k3ctl_bench_compare_spine(argc, argv);
	/* several sequences in one pass: its own report (cmd_bench_batch.c) */
	for (int i = 1; i < argc; i++)
		if (!strcmp(argv[i], "--parallel"))
			return k3ctl_bench_batch(argc, argv);
	struct k3ctl_args args = { .spec = &bench_args, .argc = argc, .argv = argv, .rc = &rc,
				   .err = &err };
	while (k3ctl_args_next(&args)) {
		const char *a = args.opt, *val = args.val;
		uint64_t v = 0;
		if (!strcmp(a, "--no-packs"))
			o.no_packs = true;
		else if (!strcmp(a, "--model"))
			o.model_dir = val;
		else if (!strcmp(a, "--preset")) {
			if (strcmp(val, "trained"))
				return k3ctl_usage("bench", "--preset '%s': only trained (for another demo "
						   "model: k3ctl demo-model --out DIR --preset P, then "
						   "--model DIR)", val);
			o.preset = val;
		} else if (!strcmp(a, "--max-new"))
			rc = k3_parse_u64(val, 1, BENCH_MAX_NEW, &o.max_new, &err);
		else if (!strcmp(a, "--prompt-len"))
			rc = k3_parse_u64(val, 1, BENCH_MAX_PROMPT, &o.prompt_len, &err);
		else if (!strcmp(a, "--threads"))
			rc = k3_parse_u64(val, 1, 256, &o.threads, &err);
		else if (!strcmp(a, "--io-threads"))
			rc = k3_parse_u64(val, 1, K3_STORE_MAX_IO_THREADS, &o.io_threads, &err);
		else if (!strcmp(a, "--disk-mib")) {
			rc = k3_parse_u64(val, 1, 1 << 20, &o.disk_mib, &err);
			o.disk_mib_set = true;
		}
		else if (!strcmp(a, "--disk-samples"))
			rc = k3_parse_u64(val, 2, BENCH_MAX_SAMPLES, &o.n_samples, &err);
		else if (!strcmp(a, "--seed"))
			rc = k3_parse_u64(val, 1, UINT64_MAX, &o.seed, &err);
		else if (!strcmp(a, "--expert-cache-gb"))
			rc = k3_store_budget_parse_gb(val, &o.cache_bytes, &err);
		else if (!strcmp(a, "--direct"))
			rc = k3_store_direct_parse(val, &o.direct, &err);
		else if (!strcmp(a, "--spine-resident"))
			rc = k3_store_plan_parse_resident(val, &o.spine_resident, &err);
		else if (!strcmp(a, "--expert-dir")) {
			if (o.n_dirs == K3_STORE_MAX_DRIVES - 1)
				return k3ctl_usage("bench", "--expert-dir: at most %d",
						   K3_STORE_MAX_DRIVES - 1);
			o.dirs[o.n_dirs++] = val;
		} else if (!strcmp(a, "--io-rate"))
			rc = k3_store_drive_parse_rate(val, &o.dopts, &err);
		else if (!strcmp(a, "--io-latency"))
			rc = k3_store_drive_parse_latency(val, &o.dopts, &err);
		else if (!strcmp(a, "--io-stall"))
			rc = k3_store_drive_parse_stall(val, &o.dopts, &err);
		else if (!strcmp(a, "--hedge"))
			rc = k3_store_drive_parse_hedge(val, &o.dopts, &err);
		else if (!strcmp(a, "--prefill-chunk"))
			rc = k3_parse_u64(val, 1, 4096, &o.prefill_chunk, &err);
		else if (!strcmp(a, "--prefetch-gate"))
			rc = k3_parse_double(val, 0.001, 1, &o.gate, &err);
		else if (!strcmp(a, "--prefetch")) {
			if (!strcmp(val, "off"))
				o.prefetch = 0;
			else if (!strcmp(val, "auto"))
				o.prefetch = -1;
			else if (!(rc = k3_parse_u64(val, 1, 64, &v, &err)))
				o.prefetch = (int64_t)v;
		} else
			return k3ctl_usage("bench", "unknown option '%s' (see --help)", a);
	}
	if (args.stop)
		return args.code;
	if (!!o.model_dir + !!o.preset != 1)
		return k3ctl_usage("bench", "one of --model DIR and --preset trained is required");
	if (o.gate > 0 && o.prefetch >= 0)
		return k3ctl_usage("bench", "--prefetch-gate applies to --prefetch auto only");
	return k3ctl_bench_run(&o);
}

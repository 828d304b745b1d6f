/*
 * cmd_bench_report.c - k3ctl bench's report: the floors and ratios
 * computed from what the run measured (the formulas: cmd_bench.c's head
 * comment), printed as text or, under --json, as one JSON object.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "json_fields.h"
#include "k3ctl.h"

enum { SHOW_RANKS = 8 };

static void phase_print(const char *name, const struct k3ctl_bench_phase *p, uint32_t tokens)
{
	const struct k3_store_stats *s = &p->st;
	uint64_t acc = s->demand_hits + s->demand_misses;
	printf("%-8s %4u tokens in %8.3f s = %8.2f tokens/s; %.0f expert bytes/token (%.2f MB, of "
	       "which %.2f MB wasted prefetch); hits %.1f%% of %llu; io wait %.3f s, compute %.3f s\n",
	       name, tokens, p->wall_s, p->wall_s > 0 ? tokens / p->wall_s : 0,
	       tokens ? (double)s->bytes_read / tokens : 0,
	       tokens ? (double)s->bytes_read / tokens / 1e6 : 0,
	       tokens ? (double)s->prefetch_wasted_bytes / tokens / 1e6 : 0,
	       acc ? 100.0 * (double)s->demand_hits / (double)acc : 0, (unsigned long long)acc,
	       (double)(s->io_wait_ns + p->sp.io_wait_ns) * 1e-9,
	       p->wall_s - (double)(s->io_wait_ns + p->sp.io_wait_ns) * 1e-9);
	if (p->sp.bytes_read)
		printf("         spine: %.0f bytes/token (%.2f MB; %llu layers read, %llu embedding"
		       " rows), %.3f s of the io wait\n", tokens ? (double)p->sp.bytes_read / tokens : 0,
		       tokens ? (double)p->sp.bytes_read / tokens / 1e6 : 0,
		       (unsigned long long)p->sp.loads, (unsigned long long)p->sp.rows_read,
		       (double)p->sp.io_wait_ns * 1e-9);
	printf("         prefetch: %llu issued (%.2f MB), %llu used later (%.1f%% of issued), "
	       "%llu late (same step, counted as misses), %llu cancelled unread, %llu stopped "
	       "part-way, %llu not read (gate), %.2f MB wasted\n",
	       (unsigned long long)s->prefetch_issued, (double)s->prefetch_issued_bytes / 1e6,
	       (unsigned long long)s->prefetch_used,
	       s->prefetch_issued ? 100.0 * (double)s->prefetch_used / (double)s->prefetch_issued : 0,
	       (unsigned long long)s->prefetch_late, (unsigned long long)s->prefetch_cancelled,
	       (unsigned long long)s->prefetch_aborted, (unsigned long long)s->prefetch_skipped,
	       (double)s->prefetch_wasted_bytes / 1e6);
}

static json_t *phase_json(const struct k3ctl_bench_phase *p, uint32_t tokens)
{
	const struct k3_store_stats *s = &p->st;
	json_t *o = json_pack("{s:i, s:f, s:f, s:f, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f}",
			      "tokens", (json_int_t)tokens, "wall_s", p->wall_s,
			      "tokens_per_s", p->wall_s > 0 ? tokens / p->wall_s : 0.0,
			      "bytes_per_token", tokens ? (double)s->bytes_read / tokens : 0.0,
			      "bytes_read", (json_int_t)s->bytes_read,
			      "demand_hits", (json_int_t)s->demand_hits,
			      "demand_misses", (json_int_t)s->demand_misses,
			      "prefetch_issued", (json_int_t)s->prefetch_issued,
			      "prefetch_issued_bytes", (json_int_t)s->prefetch_issued_bytes,
			      "prefetch_used", (json_int_t)s->prefetch_used,
			      "prefetch_late", (json_int_t)s->prefetch_late,
			      "prefetch_cancelled", (json_int_t)s->prefetch_cancelled,
			      "prefetch_wasted_bytes", (json_int_t)s->prefetch_wasted_bytes,
			      "io_wait_s", (double)s->io_wait_ns * 1e-9);
	json_object_set_new(o, "prefetch_aborted", json_integer((json_int_t)s->prefetch_aborted));
	json_object_set_new(o, "prefetch_skipped", json_integer((json_int_t)s->prefetch_skipped));
	json_object_set_new(o, "guesses_scored", json_integer((json_int_t)s->guesses_scored));
	json_object_set_new(o, "guesses_right", json_integer((json_int_t)s->guesses_right));
	json_object_set_new(o, "spine_bytes_per_token",
			    json_real(tokens ? (double)p->sp.bytes_read / tokens : 0.0));
	json_object_set_new(o, "spine_bytes_read", json_integer((json_int_t)p->sp.bytes_read));
	json_object_set_new(o, "spine_loads", json_integer((json_int_t)p->sp.loads));
	json_object_set_new(o, "spine_io_wait_s", json_real((double)p->sp.io_wait_ns * 1e-9));
	return o;
}

static json_t *spread_json(struct k3ctl_bench_spread s)
{
	return json_pack("{s:f, s:f, s:f}", "median", s.median, "min", s.min, "max", s.max);
}

static json_t *array_json(const double *v, int n)
{
	json_t *a = json_array();
	for (int i = 0; i < n; i++)
		json_array_append_new(a, json_real(v[i]));
	return a;
}

/* Several drives: where each drive's bytes went over the whole run (they
 * add up: bytes = demand + prefetch used + prefetch wasted), its hedges,
 * its measured and emulated rates, its raw yardstick (drive 0: the median
 * sample; others: one sample after the run; 0: it holds no expert). */
static json_t *drives_json(const struct k3_store_stats *st, const struct k3_store_info *in,
			   uint32_t n, const double *disk, const uint32_t *held)
{
	json_t *a = json_array();

	for (uint32_t d = 0; d < n; d++)
		json_array_append_new(a, json_pack("{s:I,s:I,s:I,s:I,s:I,s:I,s:f,s:f,s:f,s:I,s:I}",
			"bytes_read", (json_int_t)st->drive_bytes_read[d],
			"demand_bytes", (json_int_t)st->drive_demand_bytes[d],
			"prefetch_used_bytes", (json_int_t)st->drive_prefetch_used_bytes[d],
			"prefetch_wasted_bytes", (json_int_t)st->drive_prefetch_wasted_bytes[d],
			"hedges", (json_int_t)st->drive_hedges[d],
			"hedges_won", (json_int_t)st->drive_hedges_won[d],
			"disk_gbps", disk[d] > 0 ? disk[d] : 0.0,
			"measured_gbps", (double)in->drive[d].rate_bytes_per_s / 1e9,
			"emulated_gbps", (double)in->drive[d].emulated_rate / 1e9,
			"p95_ns", (json_int_t)in->drive[d].p95_ns,
			"experts", (json_int_t)(d ? held[d] : in->drive_experts[0])));
	return a;
}

static void drives_print(const struct k3_store_stats *st, const struct k3_store_info *in,
			 uint32_t n, const double *disk, const uint32_t *held)
{
	printf("expert bytes read, whole run: %.2f MB = demand %.2f + prefetch used %.2f + wasted "
	       "%.2f MB; %llu reads hedged (%llu won by the other copy)\n",
	       (double)st->bytes_read / 1e6, (double)st->demand_bytes / 1e6,
	       (double)st->prefetch_used_bytes / 1e6, (double)st->prefetch_wasted_bytes / 1e6,
	       (unsigned long long)st->hedges, (unsigned long long)st->hedges_won);
	for (uint32_t d = 0; d < n && n > 1; d++) {
		char emu[48] = "";
		if (in->drive[d].emulated_rate)
			snprintf(emu, sizeof(emu), ", emulated at %.2f GB/s",
				 (double)in->drive[d].emulated_rate / 1e9);
		printf("  drive %u: %u experts; %.2f MB (demand %.2f, prefetch used %.2f, wasted %.2f),"
		       " %llu hedged (%llu won elsewhere); measured %.2f GB/s, p95 %.1f ms; raw disk"
		       " %.3f GB/s%s\n", d, d ? held[d] : in->drive_experts[0],
		       (double)st->drive_bytes_read[d] / 1e6, (double)st->drive_demand_bytes[d] / 1e6,
		       (double)st->drive_prefetch_used_bytes[d] / 1e6,
		       (double)st->drive_prefetch_wasted_bytes[d] / 1e6,
		       (unsigned long long)st->drive_hedges[d], (unsigned long long)st->drive_hedges_won[d],
		       (double)in->drive[d].rate_bytes_per_s / 1e9, (double)in->drive[d].p95_ns / 1e6,
		       disk[d] > 0 ? disk[d] : 0.0, emu);
	}
}

void k3ctl_bench_report(const struct k3ctl_bench_result *r)
{
	const struct k3ctl_bench_opts *opt = r->o;
	const struct k3ctl_bench_samples *sm = r->sm;
	const struct k3_store_info *info = r->info, *info_end = r->info_end;
	const struct k3ctl_bench_phase *pre = &r->pre, *dec = &r->dec;
	const struct k3_store_stats *all = &r->all;
	uint64_t slot = r->slot, pool = r->pool;
	double io_rate = r->io_rate, io_latency_ms = r->io_latency_ms;
	double drive_disk[K3_STORE_MAX_DRIVES];

	memcpy(drive_disk, r->drive_disk, sizeof(drive_disk));
	struct k3ctl_bench_spread disk = k3ctl_bench_spread_of(sm->disk, sm->n);
	struct k3ctl_bench_spread cold = k3ctl_bench_spread_of(sm->cold, sm->n);
	drive_disk[0] = disk.median;
	struct k3ctl_bench_spread ratio = k3ctl_bench_spread_of(sm->ratio, sm->n);
	double bw = disk.median;
	double dec_wait = (double)(dec->st.io_wait_ns + dec->sp.io_wait_ns) * 1e-9;
	double per_tok = dec->wall_s / (double)opt->max_new;
	double compute_tok = (dec->wall_s - dec_wait) / (double)opt->max_new;
	if (compute_tok < 0)
		compute_tok = 0;
	/* the floor reads the streamed spine's bytes too */
	double bytes_tok = (double)(dec->st.bytes_read + dec->sp.bytes_read) / (double)opt->max_new;
	double read_tok = bw > 0 ? bytes_tok / (bw * 1e9) : 0;
	double floor_tok = read_tok > compute_tok ? read_tok : compute_tok;
	/* The same floor against the slowest and the fastest disk sample. */
	double r_slow = disk.min > 0 ? bytes_tok / (disk.min * 1e9) : 0;
	double r_fast = disk.max > 0 ? bytes_tok / (disk.max * 1e9) : 0;
	double f_slow = r_slow > compute_tok ? r_slow : compute_tok;
	double f_fast = r_fast > compute_tok ? r_fast : compute_tok;
	/* The emulated drive's floor: its bandwidth, not the disk's. */
	double emu_read = io_rate > 0 ? bytes_tok / (io_rate * 1e9) : 0;
	double emu_floor = emu_read > compute_tok ? emu_read : compute_tok;
	uint64_t dacc = dec->st.demand_hits + dec->st.demand_misses;
	static const char *const kind_key[K3_STORE_GUESS_KINDS] = {
		"lookahead_by_rank", "partial_lookahead_by_rank" };
	static const char *const kind_name[K3_STORE_GUESS_KINDS] = {
		"after the layer", "partial" };

	if (k3ctl_g.json) {
		json_t *o = json_pack("{s:s, s:I, s:I, s:I, s:i, s:s, s:s, s:o, s:o}",
				      "model", opt->preset ? "trained" : opt->model_dir,
				      "expert_bytes", (json_int_t)slot,
				      "pool_bytes", (json_int_t)pool,
				      "cache_bytes", (json_int_t)((uint64_t)info->n_slots * info->slot_bytes),
				      "io_threads", (int)info->io_threads,
				      "direct", k3_store_direct_name(opt->direct), "prefetch", r->pfs,
				      "prefill", phase_json(pre, (uint32_t)opt->prompt_len),
				      "decode", phase_json(dec, (uint32_t)opt->max_new));
		json_object_set_new(o, "disk_gbps", spread_json(disk));
		json_object_set_new(o, "disk_gbps_samples", array_json(sm->disk, sm->n));
		json_object_set_new(o, "cold_read_gbps", spread_json(cold));
		json_object_set_new(o, "cold_read_gbps_samples", array_json(sm->cold, sm->n));
		json_object_set_new(o, "cold_read_ratio", spread_json(ratio));
		json_object_set_new(o, "decode_s_per_token", json_real(per_tok));
		json_object_set_new(o, "compute_s_per_token", json_real(compute_tok));
		json_object_set_new(o, "floor_s_per_token", json_real(floor_tok));
		json_object_set_new(o, "decode_vs_floor", json_real(floor_tok > 0 ? per_tok / floor_tok : 0));
		json_object_set_new(o, "decode_vs_floor_range",
				    json_pack("{s:f, s:f}", "slowest_disk", f_slow > 0 ? per_tok / f_slow : 0,
					      "fastest_disk", f_fast > 0 ? per_tok / f_fast : 0));
		if (io_rate > 0 || io_latency_ms > 0) {
			json_object_set_new(o, "io_rate_gbps", json_real(io_rate));
			json_object_set_new(o, "io_latency_ms", json_real(io_latency_ms));
			json_object_set_new(o, "emulated_wait_s",
					    json_real((double)dec->st.emulated_wait_ns * 1e-9));
			json_object_set_new(o, "emulated_floor_s_per_token", json_real(emu_floor));
			json_object_set_new(o, "decode_vs_emulated_floor",
					    json_real(emu_floor > 0 ? per_tok / emu_floor : 0));
		}
		json_object_set_new(o, "prefetch_unused_resident_bytes",
				    json_integer((json_int_t)info_end->prefetch_unused_bytes));
		json_object_set_new(o, "prefetch_precision",
				    json_real(all->prefetch_issued ? (double)all->prefetch_used /
								    (double)all->prefetch_issued : 0));
		for (int g = 0; g < K3_STORE_GUESS_KINDS; g++) {
			json_t *gr = json_array();
			for (int k = 0; k < K3_STORE_GUESS_RANKS && k < (int)r->top_k; k++)
				json_array_append_new(gr, json_pack("{s:I, s:I}",
					"scored", (json_int_t)r->scored[g][k], "right", (json_int_t)r->right[g][k]));
			json_object_set_new(o, kind_key[g], gr);
		}
		json_t *g = json_array();
		for (uint32_t i = 0; i < r->gen; i++)
			json_array_append_new(g, json_integer(r->gen_ids[i]));
		json_object_set_new(o, "greedy", g);
		json_object_set_new(o, "prefill_distinct_experts",
				    json_integer((json_int_t)pre->st.distinct_experts));
		json_object_set_new(o, "prefill_bytes_per_distinct_span", json_real(
			pre->st.distinct_experts ? (double)pre->st.bytes_read /
			((double)pre->st.distinct_experts * (double)slot) : 0));
		json_object_set_new(o, "hedge_buffers", json_integer(info->hedge_buffers));
		json_object_set_new(o, "drives", drives_json(all, info_end, r->n_drives, drive_disk,
							    r->home_experts));
		k3ctl_json_puts(o, JSON_COMPACT, NULL);
	} else {
		phase_print("prefill", pre, (uint32_t)opt->prompt_len);
		phase_print("decode", dec, (uint32_t)opt->max_new);
		printf("greedy ids:");
		for (uint32_t i = 0; i < r->gen && i < 8; i++)
			printf(" %u", r->gen_ids[i]);
		printf("%s\n", r->gen > 8 ? " ..." : "");
		printf("disk, %d samples (before, after the prompt, %u during the decode, after), each "
		       "%.0f MB of whole-expert reads with %s, %u in flight, in cold-step order (top-k "
		       "random experts of a layer, sorted by offset):\n"
		       "  disk GB/s:       ", sm->n, r->mid, (double)sm->disk_bytes / 1e6,
		       r->d_buffered ? "buffered reads" : "O_DIRECT", info->io_threads);
		for (int i = 0; i < sm->n; i++)
			printf(" %.3f", sm->disk[i]);
		printf("  -> median %.3f, min %.3f, max %.3f (spread %.0f%% of the median)\n",
		       disk.median, disk.min, disk.max,
		       disk.median > 0 ? 100 * (disk.max - disk.min) / disk.median : 0);
		printf("  cold store GB/s: ");
		for (int i = 0; i < sm->n; i++)
			printf(" %.3f", sm->cold[i]);
		printf("  -> median %.3f, min %.3f, max %.3f\n", cold.median, cold.min, cold.max);
		printf("cold expert reads / disk (per sample pair): median %.2f x (%.2f .. %.2f) "
		       "(target >= 0.90)\n", ratio.median, ratio.min, ratio.max);
		printf("decode: %.2f tokens/s, %.2f MB read/token (%.2f MB of it wasted prefetch%s), hit "
		       "rate %.1f%% (%.1f%% of accesses served by an earlier step's prefetch); prefetch "
		       "precision %.1f%% (used later / issued, whole run), %.2f MB wasted in all (+ %.2f MB "
		       "read ahead, unused and still resident at the end)\n",
		       dec->wall_s > 0 ? opt->max_new / dec->wall_s : 0, bytes_tok / 1e6,
		       (double)dec->st.prefetch_wasted_bytes / (double)opt->max_new / 1e6,
		       dec->sp.bytes_read ? ", spine included" : "",
		       dacc ? 100.0 * (double)dec->st.demand_hits / (double)dacc : 0,
		       dacc ? 100.0 * (double)dec->st.prefetch_used / (double)dacc : 0,
		       all->prefetch_issued ? 100.0 * (double)all->prefetch_used /
						(double)all->prefetch_issued : 0,
		       (double)all->prefetch_wasted_bytes / 1e6,
		       (double)info_end->prefetch_unused_bytes / 1e6);
		printf("lookahead precision by rank (guesses not resident when made, read or not):");
		for (int g = 0; g < K3_STORE_GUESS_KINDS; g++) {
			printf("%s %s:", g ? ";" : "", kind_name[g]);
			for (int k = 0; k < SHOW_RANKS && k < (int)r->top_k; k++)
				printf(" r%d %.0f%% of %llu", k, r->scored[g][k] ? 100.0 *
				       (double)r->right[g][k] / (double)r->scored[g][k] : 0,
				       (unsigned long long)r->scored[g][k]);
		}
		printf("\n");
		printf("prefill: %u positions per pass, %.2f MB of experts read for %llu distinct experts:"
		       " %.3f x one read of each\n",
		       opt->prefill_chunk ? (unsigned)opt->prefill_chunk : 64u,
		       (double)pre->st.bytes_read / 1e6, (unsigned long long)pre->st.distinct_experts,
		       pre->st.distinct_experts ? (double)pre->st.bytes_read /
		       ((double)pre->st.distinct_experts * (double)slot) : 0);
		drives_print(all, info_end, r->n_drives, drive_disk, r->home_experts);
		printf("decode time/token %.4f s vs floor max(read %.4f s at the median disk, compute "
		       "%.4f s) = %.4f s: %.2f x floor (%.2f x .. %.2f x against the slowest .. fastest "
		       "disk sample) (target <= 1.2)\n", per_tok, read_tok, compute_tok, floor_tok,
		       floor_tok > 0 ? per_tok / floor_tok : 0, f_slow > 0 ? per_tok / f_slow : 0,
		       f_fast > 0 ? per_tok / f_fast : 0);
		if (io_rate > 0 || io_latency_ms > 0)
			printf("emulated drive %.3f GB/s + %.3f ms per request (readers slept %.3f s of the "
			       "decode for it): decode time/token %.4f s vs floor max(read %.4f s at %.3f "
			       "GB/s, compute %.4f s) = %.4f s: %.2f x floor\n", io_rate, io_latency_ms,
			       (double)dec->st.emulated_wait_ns * 1e-9, per_tok, emu_read, io_rate,
			       compute_tok, emu_floor, emu_floor > 0 ? per_tok / emu_floor : 0);
	}
}

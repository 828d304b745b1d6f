/*
 * cmd_bench_run.c - the offline run of `k3ctl bench` (what it measures and
 * why: cmd_bench.c's head comment): the model, its memory plan, the store,
 * the spine loader and the engine as k3d would make them; the prompt and
 * the greedy decode, timed apart, with the disk sampled between them.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "demo_trained.h"
#include "engine/engine.h"
#include "k3ctl.h"
#include "model/model.h"
#include "store/store.h"
#include "store/store_engine.h"
#include "store/store_model.h"
#include "store/store_plan.h"
#include "store/store_spine.h"
#include "text/text_tok.h"

/* The --preset trained prompt: sentence forms of the model's training
 * corpus (tools/train_demo/data.py), so the prompt's routing is the
 * router's on text it knows; its first --prompt-len ids are used. */
static const char trained_prompt[] =
	"The capital of France is Paris. The capital of England is London. "
	"The capital of Japan is Tokyo. The capital of Italy is Rome. "
	"The capital of Spain is Madrid. The capital of Egypt is Cairo. The capital of";

int k3ctl_bench_trained_model(char *dir, size_t cap, const char *tag, struct k3_tok_ids *ids,
			      struct k3_err *err)
{
	const char *t = getenv("TMPDIR");
	unsigned long long written = 0;
	struct k3_tok *tok = NULL;
	int rc;

	if ((size_t)snprintf(dir, cap, "%s/k3-bench-%s.XXXXXX", t && *t ? t : "/tmp", tag) >= cap) {
		dir[0] = 0;
		return k3_err_set(err, -ENAMETOOLONG, "TMPDIR is too long (%zu bytes at most)",
				  cap - 25);
	}
	if (!mkdtemp(dir)) {
		rc = k3_err_set(err, -errno, "%s: %s", dir, strerror(errno));
		dir[0] = 0;
		return rc;
	}
	if ((rc = k3ctl_trained_install(dir, &written, err)))
		return rc;
	rc = k3_tok_load_dir(dir, &tok, err);
	if (!rc)
		rc = k3_tok_encode(tok, trained_prompt, sizeof(trained_prompt) - 1, false, ids, err);
	k3_tok_free(tok);
	return rc;
}

/* Counters of the store and the spine loader (NULL: mapped) after their
 * reads in flight landed. */
static void snapshot(struct k3_store *store, struct k3_store_spine *spine,
		     struct k3_store_stats *st, struct k3_store_spine_stats *sp)
{
	memset(sp, 0, sizeof(*sp));
	k3_store_stats_get(store, st);
	if (spine) {
		k3_store_spine_drain(spine);
		k3_store_spine_stats_get(spine, sp);
	}
}

int k3ctl_bench_model_open(struct k3ctl_bench_setup *s, const char *model_dir, const char *tag,
			   bool no_packs, struct k3_err *err)
{
	int rc;

	memset(s, 0, sizeof(*s));
	if (tag) {
		if ((rc = k3ctl_bench_trained_model(s->tmpdir, sizeof(s->tmpdir), tag, &s->text_ids,
						     err)))
			return rc;
		model_dir = s->tmpdir;
	}
	if ((rc = k3_model_open(model_dir, &s->model, err)))
		return rc;
	if (!k3_model_config(s->model)->n_moe)
		return k3_err_set(err, -EINVAL, "the model has no MoE layers: nothing to stream");
	snprintf(s->packdir, sizeof(s->packdir), "%s/%s", model_dir, K3_STORE_PACK_SUBDIR);
	s->have_packs = !no_packs && access(s->packdir, F_OK) == 0;
	return 0;
}

int k3ctl_bench_engine_open(struct k3ctl_bench_setup *s, const struct k3_store_plan_out *plan,
			    bool streams, enum k3_store_direct direct, uint32_t threads,
			    uint32_t max_chunk, uint32_t per_position, struct k3_err *err)
{
	struct k3_engine_opts eo = { .threads = threads, .max_chunk = max_chunk };
	struct k3_spine_source ss;   /* copied by the engine */
	int rc;

	if (streams) {
		struct k3_store_spine_config scfg = {
			.resident_layers = plan->resident_layers, .head_resident = plan->head_resident,
			.ring_arenas = plan->ring_arenas, .direct = direct,
			.io = k3_store_reader_pool(s->store), .max_rows = max_chunk,
		};
		char spath[4200];
		snprintf(spath, sizeof(spath), "%s/spine.k3pack", s->packdir);
		if ((rc = k3_store_spine_new(s->model, s->have_packs ? spath : NULL, &scfg, &s->spine,
					     &s->srep, err)))
			return rc;
		k3_store_spine_source(s->spine, &ss);
		k3_store_spine_info_get(s->spine, &s->sinfo);
		eo.spine = &ss;
	}
	if ((rc = k3_engine_open(s->model, &eo, &s->e, err)))
		return rc;
	struct k3_expert_source es;   /* copied by the engine */
	k3_store_engine_src_init(&s->ectx, s->store, &es);
	s->ectx_init = true;
	k3_store_engine_src_set_prefetch(&s->ectx, per_position, &es);
	k3_engine_set_expert_source(s->e, &es);
	return 0;
}

void k3ctl_bench_setup_close(struct k3ctl_bench_setup *s)
{
	k3_engine_free(s->e);
	if (s->ectx_init)
		k3_store_engine_src_release(&s->ectx);
	k3_store_spine_free(s->spine);   /* before the store's reader pool it borrows */
	k3_store_free(s->store);
	k3_store_source_free(s->src);
	k3_model_free(s->model);
	k3_tok_ids_release(&s->text_ids);
	if (s->tmpdir[0])
		k3ctl_trained_remove(s->tmpdir);
}

int k3ctl_bench_run(const struct k3ctl_bench_opts *opts)
{
	struct k3ctl_bench_opts o = *opts;   /* --preset: model_dir and prompt_len change */
	struct k3_err err = { 0 };
	struct k3_engine_seq *seq = NULL;
	struct k3_store_source *dsrc = NULL;
	struct k3ctl_bench_setup bs;
	struct k3ctl_bench_probe probe = { 0 };
	bool probe_init = false;
	struct k3_store_open_report rep = { 0 };
	struct k3_store_plan_out *plan = NULL;
	int32_t *ids = NULL;
	uint32_t *gen_ids = NULL;
	float *logits = NULL;
	struct k3ctl_bench_samples *sm = calloc(1, sizeof(*sm));
	uint8_t *dbufs[K3_STORE_MAX_IO_THREADS] = { 0 }, *dmem = NULL;   /* dbufs: slots of dmem */
	int code = K3CTL_EXIT_ERROR, rc;

	rc = k3ctl_bench_model_open(&bs, o.model_dir, o.preset ? "trained" : NULL, o.no_packs, &err);
	if (!rc && !sm)
		rc = k3_err_set(&err, -ENOMEM, "out of memory");
	if (rc)
		goto fail;
	if (o.preset) {
		o.model_dir = bs.tmpdir;
		if (o.prompt_len > bs.text_ids.n)
			o.prompt_len = bs.text_ids.n;
	}
	const struct k3_model_config *mc = k3_model_config(bs.model);
	const char *packs = bs.have_packs ? bs.packdir : NULL;
	if ((rc = k3_store_source_open_model(bs.model, packs, o.direct, &bs.src, &rep, &err))) {
		if (rc == -EMEDIUMTYPE)
			k3_err_prefix(&err, "--direct on");
		goto fail;
	}
	/* The disk yardstick reads the same files with O_DIRECT where it
	 * works, whatever --direct the store was given. */
	if ((rc = k3_store_source_open_model(bs.model, packs, K3_STORE_DIRECT_AUTO, &dsrc, NULL,
					     &err)))
		goto fail;
	/* each --expert-dir: copies on the next drive, for the store and the
	 * yardstick alike */
	uint32_t home_experts[K3_STORE_MAX_DRIVES] = { 0 };
	for (unsigned i = 0; i < o.n_dirs; i++) {
		struct k3_store_home_report hr, dhr;
		if ((rc = k3_store_source_add_home(bs.src, bs.model, o.dirs[i], i + 1, &hr, &err)) ||
		    (rc = k3_store_source_add_home(dsrc, bs.model, o.dirs[i], i + 1, &dhr, &err))) {
			k3_err_prefix(&err, "--expert-dir '%s'", o.dirs[i]);
			goto fail;
		}
		if (hr.layers == 0) {
			rc = k3_err_set(&err, -ENOENT, "--expert-dir '%s' holds no valid expert pack of"
					" this model (%s)", o.dirs[i], hr.packs_rejected ? hr.first_rejection
					: "no experts-L*.k3pack");
			goto fail;
		}
		home_experts[i + 1] = hr.experts;
	}
	uint64_t slot = k3_store_source_slot_bytes(bs.src);
	uint64_t pool = (uint64_t)k3_store_source_count(bs.src) * slot;
	/* The memory plan k3d would make for this machine: the spine mapped
	 * when it fits, else (or with --spine-resident) the plan's resident
	 * set through the spine loader; the expert cache what it leaves, or
	 * --expert-cache-gb. */
	plan = malloc(sizeof(*plan));
	if (!plan) {
		rc = k3_err_set(&err, -ENOMEM, "out of memory");
		goto fail;
	}
	struct k3_store_plan_in pi = {
		.spine_resident = o.spine_resident, .expert_cache_bytes = o.cache_bytes,
		.context_tokens = (uint32_t)(o.prompt_len + o.max_new + 1), .slot_bytes = slot,
		.max_chunk = (uint32_t)o.prefill_chunk,
	};
	bool streams;
	if ((rc = k3_store_plan_model(bs.model, &pi, plan, &streams, &err)))
		goto fail;
	bool pf_auto = o.prefetch < 0;
	uint32_t per_position = pf_auto ? mc->num_experts_per_token : (uint32_t)o.prefetch;
	struct k3_store_config cfg = {
		.cache_bytes = plan->expert_cache_bytes, .io_threads = (unsigned)o.io_threads,
		.prefetch_slots = per_position ? -1 : 0, .prefetch_auto = pf_auto,
		.prefetch_min_precision = o.gate, .check_scales = true, .prefault = true,
		.min_slots = mc->num_experts_per_token,
	};
	uint32_t n_drives = k3_store_source_drive_count(bs.src);
	if ((rc = k3_store_drive_opts_apply(&o.dopts, n_drives, &cfg, &err)) ||
	    (rc = k3_store_new(bs.src, &cfg, &bs.store, &err)))
		goto fail;
	struct k3_store_info info;
	k3_store_info_get(bs.store, &info);
	/* the emulated drives' bandwidth in all (the floor reads at it) */
	double io_rate = 0, io_latency_ms = (double)info.drive[0].emulated_latency_ns / 1e6;
	for (uint32_t d = 0; d < info.n_drives; d++)
		io_rate += (double)info.drive[d].emulated_rate / 1e9;
	probe_init = true;
	if ((rc = k3ctl_bench_probe_open(&probe, bs.src, mc->num_experts_per_token, info.io_threads,
					  &err)))
		goto fail;
	/* the yardstick's read buffers, one slot per reader, each aligned */
	size_t dstride = (slot + K3_STORE_ALIGN - 1) / K3_STORE_ALIGN * K3_STORE_ALIGN;
	if (posix_memalign((void **)&dmem, K3_STORE_ALIGN, dstride * info.io_threads) != 0) {
		dmem = NULL;
		rc = k3_err_set(&err, -ENOMEM, "out of memory");
		goto fail;
	}
	memset(dmem, 0, dstride * info.io_threads);   /* prefault: no page faults inside the timing */
	for (unsigned i = 0; i < info.io_threads; i++)
		dbufs[i] = dmem + (size_t)i * dstride;
	uint32_t d_buffered = 0;
	for (uint32_t f = 0; f < k3_store_source_file_count(dsrc); f++)
		d_buffered += !k3_store_source_file_direct(dsrc, f);

	if ((rc = k3ctl_bench_engine_open(&bs, plan, streams, o.direct, (uint32_t)o.threads,
					  (uint32_t)o.prefill_chunk, per_position, &err)))
		goto fail;

	uint32_t V = k3_engine_vocab(bs.e);
	ids = calloc(o.prompt_len, sizeof(*ids));
	logits = calloc(V, sizeof(*logits));
	gen_ids = calloc(o.max_new, sizeof(*gen_ids));
	if (!ids || !logits || !gen_ids) {
		rc = k3_err_set(&err, -ENOMEM, "out of memory");
		goto fail;
	}
	uint64_t rng = o.seed * 0x9E3779B97F4A7C15ull;
	for (uint64_t i = 0; i < o.prompt_len; i++) {
		rng = rng * 6364136223846793005ull + 1442695040888963407ull;
		ids[i] = o.preset ? (int32_t)bs.text_ids.v[i] : (int32_t)((rng >> 33) % V);
	}

	char pfs[64];
	if (pf_auto)
		snprintf(pfs, sizeof(pfs), "auto (gate: precision >= %.2f)",
			 o.gate > 0 ? o.gate : K3_STORE_PREFETCH_MIN_PRECISION);
	else if (per_position)
		snprintf(pfs, sizeof(pfs), "%u per position", per_position);
	else
		snprintf(pfs, sizeof(pfs), "off");
	FILE *hdr = k3ctl_g.json ? stderr : stdout;   /* --json: stdout is one JSON object */
	fprintf(hdr, "model %s: %u MoE layers x %u experts, top-%u; %zu experts in cache slots of %llu "
		"bytes (the largest expert read, O_DIRECT alignment included) = %.3f GB\n",
	       o.preset ? "trained (k3ctl bench --preset trained)" : o.model_dir, mc->n_moe,
	       mc->num_experts, mc->num_experts_per_token,
	       k3_store_source_count(bs.src), (unsigned long long)slot, (double)pool / 1e9);
	fprintf(hdr, "prompt: %llu ids of %s\n", (unsigned long long)o.prompt_len,
		o.preset ? "the model's training text (routing as on text)"
		       : "seeded random ids (--seed)");
	fprintf(hdr, "experts from %s; store reads: %u files O_DIRECT, %u buffered (--direct %s); "
	       "cache %u slots = %.3f GB (%.1f%% of the experts; floor %.3f GB); %u I/O threads; "
	       "prefetch %s\n",
	       rep.layers_packed ? (rep.layers_shards ? "packs and shards" : "packs") : "shards",
	       info.files_direct, info.files_buffered, k3_store_direct_name(o.direct), info.n_slots,
	       (double)info.n_slots * (double)info.slot_bytes / 1e9,
	       100.0 * (double)info.n_slots * (double)info.slot_bytes / (double)pool,
	       (double)plan->expert_floor_bytes / 1e9, info.io_threads, pfs);
	if (rep.packs_rejected)
		fprintf(hdr, "note: %u packs rejected, those layers read from the shards; first: %s\n",
			rep.packs_rejected, rep.first_rejection);
	if (bs.spine)
		fprintf(hdr, "spine: %u layers resident, %u streamed%s from %s (%.3f GB per pass)"
			" through %u arenas of %.3f GB%s%s\n", bs.sinfo.resident_layers,
			bs.sinfo.n_layers - bs.sinfo.resident_layers,
			bs.sinfo.head_resident ? "" : " and the head",
			bs.srep.from_pack ? "the spine pack" : "the shards",
			(double)bs.sinfo.streamed_bytes_per_pass / 1e9, bs.sinfo.ring_arenas,
			(double)bs.sinfo.arena_bytes / 1e9,
			bs.srep.pack_rejected ? "; pack rejected: " : "",
			bs.srep.pack_rejected ? bs.srep.rejection : "");
	if (info.files_buffered)
		fprintf(hdr, "note: buffered store reads may be served from the page cache; bytes "
			"counted are bytes asked of the kernel\n");
	if (io_rate > 0 || io_latency_ms > 0)
		fprintf(hdr, "emulated drive: store reads limited to %.3f GB/s in all, %.3f ms per "
			"request%s\n", io_rate, io_latency_ms, info.files_direct ? " (O_DIRECT reads: "
			"the real disk also limits them; --direct off over page-cached files isolates "
			"the emulation)" : "");
	if (n_drives > 1)
		fprintf(hdr, "drives: %u (the model directory's and %u --expert-dir); hedging %s\n",
			n_drives, o.n_dirs, info.hedge_buffers ? "on" : o.dopts.hedge_factor == 0 ? "off"
			: "off: the cache cannot spare a hedge buffer beyond a token's experts");
	if (d_buffered)
		fprintf(hdr, "note: the disk yardstick could not use O_DIRECT on %u files: its figure "
			"may include the page cache\n", d_buffered);
	fflush(hdr);

	/* Sample points: before, after the prompt, evenly inside the decode,
	 * after. */
	uint32_t mid = (uint32_t)o.n_samples > 3 ? (uint32_t)o.n_samples - 3 : 0;
	if (o.n_samples == 2)
		mid = 0;
	uint64_t dseed = o.seed ^ 0xD1B54A32D192ED03ull, dmax = o.disk_mib << 20;
	/* A sample sized for K3 (256 MiB) against a tiny demo pool takes a
	 * minute of expert-sized reads and says nothing about K3: by default a
	 * sample reads at most the pool once (at least 16 MiB). */
	if (!o.disk_mib_set && dmax > pool) {
		dmax = pool > (16u << 20) ? pool : (16u << 20);
		fprintf(hdr, "note: disk samples of %.1f MiB (the %.1f MiB expert pool once, at least "
			"16 MiB; --disk-mib sets it); a pool this small is mostly in the host's caches, "
			"so the disk figures are indicative only\n", (double)dmax / (1 << 20),
			(double)pool / (1 << 20));
	}
	if ((rc = k3ctl_bench_take_sample(sm, "before", dsrc, info.io_threads, dbufs, &probe, dmax,
					   &dseed, &err)))
		goto fail;

	struct k3_store_stats s0, s1, s2;
	struct k3_store_spine_stats p0, p1, p2;
	struct k3ctl_bench_phase pre, dec;
	if ((rc = k3_engine_seq_new(bs.e, (uint32_t)(o.prompt_len + o.max_new + 1), &seq, &err)))
		goto fail;
	snapshot(bs.store, bs.spine, &s0, &p0);
	k3_store_epoch_begin(bs.store);   /* the prefill's distinct experts */
	double t0 = k3ctl_bench_now_s();
	struct k3_engine_out out = { K3_ENGINE_LOGITS_LAST, logits, NULL, NULL };
	if ((rc = k3_engine_forward(bs.e, seq, ids, (uint32_t)o.prompt_len, &out, &err)))
		goto fail;
	k3_store_prefetch_cancel(bs.store, UINT32_MAX);
	k3_store_drain(bs.store);
	if (bs.spine)
		k3_store_spine_drain(bs.spine);
	pre.wall_s = k3ctl_bench_now_s() - t0;
	k3_store_idle(bs.store);
	snapshot(bs.store, bs.spine, &s1, &p1);
	if (o.n_samples > 2 &&
	    (rc = k3ctl_bench_take_sample(sm, "after the prompt", dsrc, info.io_threads, dbufs, &probe,
					  dmax, &dseed, &err)))
		goto fail;
	uint32_t gen = 0, next_mid = 1;
	dec.wall_s = 0;
	for (; gen < o.max_new; gen++) {
		if (next_mid <= mid && gen == (uint32_t)(o.max_new * next_mid / (mid + 1))) {
			/* Between tokens, outside the timed part. */
			k3_store_drain(bs.store);
			k3_store_idle(bs.store);
			if ((rc = k3ctl_bench_take_sample(sm, "during the decode", dsrc,
							   info.io_threads, dbufs, &probe, dmax,
							   &dseed, &err)))
				goto fail;
			next_mid++;
		}
		int32_t tok = (int32_t)k3_engine_argmax(logits, V);
		gen_ids[gen] = (uint32_t)tok;
		double tt = k3ctl_bench_now_s();
		if ((rc = k3_engine_forward(bs.e, seq, &tok, 1, &out, &err)))
			goto fail;
		dec.wall_s += k3ctl_bench_now_s() - tt;
	}
	double tt = k3ctl_bench_now_s();
	k3_store_prefetch_cancel(bs.store, UINT32_MAX);
	k3_store_drain(bs.store);
	if (bs.spine)
		k3_store_spine_drain(bs.spine);
	dec.wall_s += k3ctl_bench_now_s() - tt;
	k3_store_idle(bs.store);   /* unused guesses settle as wasted: the bytes add up */
	snapshot(bs.store, bs.spine, &s2, &p2);
	k3_store_stats_sub(&s1, &s0, &pre.st);
	k3_store_stats_sub(&s2, &s1, &dec.st);
	k3_store_spine_stats_sub(&p1, &p0, &pre.sp);
	k3_store_spine_stats_sub(&p2, &p1, &dec.sp);
	if ((rc = k3ctl_bench_take_sample(sm, "after", dsrc, info.io_threads, dbufs, &probe, dmax,
					   &dseed, &err)))
		goto fail;

	/* each further drive's yardstick, once, after the run */
	double drive_disk[K3_STORE_MAX_DRIVES] = { 0 };
	for (uint32_t d = 1; d < n_drives; d++) {
		uint64_t db = 0;
		drive_disk[d] = k3ctl_bench_disk_bandwidth(&probe, dsrc, d, info.io_threads, dbufs, dmax,
							   &dseed, &db);
		if (drive_disk[d] < 0 && drive_disk[d] != -ENOENT) {
			rc = k3_err_set(&err, (int)drive_disk[d], "drive %u: disk read failed: %s", d,
					strerror((int)-drive_disk[d]));
			goto fail;
		}
	}
	uint64_t scored[K3_STORE_GUESS_KINDS][K3_STORE_GUESS_RANKS];
	uint64_t right[K3_STORE_GUESS_KINDS][K3_STORE_GUESS_RANKS];
	for (int g = 0; g < K3_STORE_GUESS_KINDS; g++)
		k3_store_guess_table(bs.store, (enum k3_store_guess_kind)g, scored[g], right[g]);
	struct k3_store_stats all;
	k3_store_stats_sub(&s2, &s0, &all);
	struct k3_store_info info_end;
	k3_store_info_get(bs.store, &info_end);

	struct k3ctl_bench_result res = {
		.o = &o, .top_k = mc->num_experts_per_token, .slot = slot, .pool = pool,
		.info = &info, .info_end = &info_end, .pfs = pfs, .pre = pre, .dec = dec, .all = all,
		.sm = sm, .mid = mid, .d_buffered = d_buffered, .n_drives = n_drives,
		.io_rate = io_rate, .io_latency_ms = io_latency_ms, .drive_disk = drive_disk,
		.home_experts = home_experts, .scored = scored, .right = right, .gen_ids = gen_ids,
		.gen = gen,
	};
	k3ctl_bench_report(&res);
	code = K3CTL_EXIT_OK;
	rc = 0;
fail:
	if (rc)
		fprintf(stderr, "k3ctl bench: %s\n", err.msg);
	free(plan);
	free(ids);
	free(gen_ids);
	free(logits);
	free(sm);
	free(dmem);
	k3_engine_seq_free(seq);
	if (probe_init)
		k3ctl_bench_probe_close(&probe);
	k3_store_source_free(dsrc);
	k3ctl_bench_setup_close(&bs);
	return code;
}

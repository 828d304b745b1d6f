/*
 * sched_load.c - what the engine thread loads before its first job and
 * the work that uses the expert store directly: the model, tokenizer and
 * engine; the memory plan (store_plan.h: the limit split between spine,
 * ring, expert cache, state, scratch and headroom, refused below the
 * floor); the expert store behind the engine (packs or shards, readers,
 * prefetch, the emulated drive) and the spine loader when the plan streams
 * the spine; --router-trace (opening it, appending each
 * forward call's routes, flushing after each job); and WARM_EXPERTS
 * (validated on the loop thread, run on the engine thread between
 * generations).
 *
 * Loading runs once, on the engine thread, before MSG_LOADED; what it sets
 * in struct k3_sched is read-only afterwards (the trace aside, which the
 * engine thread alone uses).
 */
#include "server/sched_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "model/model.h"
#include "store/store_budget.h"
#include "store/store_drives.h"
#include "store/store_int8.h"
#include "store/store_model.h"
#include "store/store_plan.h"
#include "store/store_spine.h"
#include "store/store_trace.h"

/* ---- router trace ------------------------------------------------------------ */

void sched_trace_routes(struct k3_sched *s, const struct sched_job *j, uint32_t pos, uint32_t c)
{
	struct k3_err err = { 0, "" };

	if (!s->trace || !s->route_ids)
		return;
	int r = k3_store_trace_write_routes(s->trace, j->id, pos, c, k3_engine_moe_layers(s->engine),
					    k3_engine_n_moe(s->engine), k3_engine_top_k(s->engine),
					    s->route_ids, s->route_w, &err);
	if (r < 0) {
		k3_log_warning("router trace stopped: %s", err.msg);
		k3_store_trace_close(s->trace, NULL);
		s->trace = NULL;
	}
}

void sched_trace_flush(struct k3_sched *s)
{
	struct k3_err err = { 0, "" };

	/* Each finished request is on disk for warm-expert-cache, and a crash
	 * loses at most the running one. */
	if (s->trace && k3_store_trace_flush(s->trace, &err) < 0) {
		k3_log_warning("router trace stopped: %s", err.msg);
		k3_store_trace_close(s->trace, NULL);
		s->trace = NULL;
	}
}

/* Opens --router-trace FILE and the per-chunk route buffers. Apart from
 * the model so that a bad trace path is reported as what it is (a symlink,
 * not a regular file, not writable), never as "cannot load model". */
static int open_trace(struct k3_sched *s, struct k3_err *err)
{
	const struct k3_options *o = s->opts;
	size_t per;
	int r;

	if (!o->router_trace)
		return 0;
	per = (size_t)s->prefill_chunk * k3_engine_n_moe(s->engine) * k3_engine_top_k(s->engine);
	r = k3_store_trace_open(o->router_trace, 0, K3_STORE_TRACE_BUFFERED, &s->trace, err);
	if (r < 0)
		return r;
	s->route_ids = calloc(per ? per : 1, sizeof(*s->route_ids));
	s->route_w = calloc(per ? per : 1, sizeof(*s->route_w));
	if (!s->route_ids || !s->route_w)
		return k3_err_set(err, -ENOMEM, "out of memory for the router trace buffers");
	k3_log_info("router trace: appending to %s", o->router_trace);
	return 0;
}

/* ---- the expert store ---------------------------------------------------------- */

/* The first expert file read without O_DIRECT (for the log). */
static uint32_t first_buffered(const struct k3_store_source *src)
{
	for (uint32_t f = 0; f < k3_store_source_file_count(src); f++)
		if (!k3_store_source_file_direct(src, f))
			return f;
	return 0;
}

/* Each --expert-dir as the next drive's copies of the packs
 * (docs/drives.md), logged with what it holds and why a pack there was
 * refused. A directory holding no valid pack is an error: the user asked
 * for a drive that would never be read. */
static int add_homes(struct k3_sched *s, struct k3_err *err)
{
	const struct k3_options *o = s->opts;

	for (unsigned i = 0; i < o->n_expert_dirs; i++) {
		struct k3_store_home_report rep;
		int r = k3_store_source_add_home(s->xsrc, s->model, o->expert_dirs[i], i + 1, &rep, err);
		if (r < 0)
			return k3_err_prefix(err, "--expert-dir '%s'", o->expert_dirs[i]);
		if (rep.layers == 0)
			return k3_err_set(err, -ENOENT, "--expert-dir '%s' holds no valid expert pack of"
					  " this model (%s); write one with k3ctl pack --model DIR --out"
					  " '%s'", o->expert_dirs[i],
					  rep.packs_rejected ? rep.first_rejection : "no experts-L*.k3pack",
					  o->expert_dirs[i]);
		k3_log(rep.packs_rejected ? K3_LOG_WARNING : K3_LOG_INFO,
		       "drive %u: %s holds %u experts of %u MoE layers%s%s", i + 1, o->expert_dirs[i],
		       rep.experts, rep.layers, rep.packs_rejected ? "; packs rejected, first: " : "",
		       rep.packs_rejected ? rep.first_rejection : "");
	}
	return 0;
}

/* The expert source (packs when valid, else shards; logged with the
 * reason), or none when the model's experts cannot be streamed (not
 * MXFP4: they stay mmapped, with a warning). */
static int open_expert_source(struct k3_sched *s, const char *packdir, bool have_packs,
			      struct k3_err *err)
{
	const struct k3_options *o = s->opts;
	struct k3_store_open_report rep;
	int r;

	memset(&rep, 0, sizeof(rep));
	r = k3_store_source_open_model(s->model, have_packs ? packdir : NULL,
				       (enum k3_store_direct)o->direct, &s->xsrc, &rep, err);
	if (r == -ENOTSUP) {
		k3_log_warning("expert store off: %s; routed experts come from the mmapped shards", err->msg);
		err->code = 0;
		err->msg[0] = '\0';
		return 0;
	}
	if (r == -EMEDIUMTYPE)   /* --direct on, and the file system refuses O_DIRECT */
		return k3_err_prefix(err, "--direct on");
	if (r < 0)
		return k3_err_prefix(err, "expert store");
	if (o->no_packs)
		k3_log_info("experts: %u MoE layers from the shards (--no-packs)", rep.layers_shards);
	else if (!have_packs)
		k3_log_info("experts: %u MoE layers from the shards (no %s; `k3ctl pack --model DIR` writes packs)",
			    rep.layers_shards, packdir);
	else if (rep.layers_shards)   /* a rejected pack is a warning: its layer reads slower */
		k3_log(rep.packs_rejected ? K3_LOG_WARNING : K3_LOG_INFO,
		       "experts: %u MoE layers from packs, %u from the shards (%u packs rejected; first: %s)",
		       rep.layers_packed, rep.layers_shards, rep.packs_rejected,
		       rep.first_rejection[0] ? rep.first_rejection : "no pack for the layer");
	else
		k3_log_info("experts: all %u MoE layers from packs in %s", rep.layers_packed, packdir);
	return add_homes(s, err);
}

/* Guesses per position: auto offers every rank (the store's precision
 * gate decides), N offers N, off none. */
static int prefetch_of(const struct k3_options *o, const struct k3_model_config *mc)
{
	return o->prefetch < 0 ? (int)mc->num_experts_per_token : o->prefetch;
}

/* Positions per prefill pass (docs/store.md, "Expert-major prefill"): a
 * pass reads each layer's experts once for all its positions, so the
 * longest the memory allows: --prefill-chunk N, or the longest (64..4096)
 * whose activations (k3_engine_scratch_bytes) fit a sixteenth of the
 * plan's memory limit (min(RAM, cgroup, --memory-limit)); the plan counts
 * them as its scratch. K3 on 64 GB: about 2100 positions, 4 GB. */
static uint32_t prefill_chunk(const struct k3_sched *s, uint64_t limit_bytes)
{
	if (s->opts->prefill_chunk)
		return s->opts->prefill_chunk;
	return k3_engine_chunk_for(k3_model_config(s->model), limit_bytes / K3_ENGINE_SCRATCH_SHARE,
				   SCHED_PREFILL_CHUNK_MIN, SCHED_PREFILL_CHUNK_MAX);
}

/* Splits the memory limit (store_plan.h) with the checkpoint's bytes (the
 * spine loader's when it streams) and keeps the split for STATUS;
 * slot_bytes: the expert store's slot (0: none). *streams: the spine
 * loader serves the spine. Below the floor (or when --spine-resident or
 * --expert-cache-gb ask for more than the limit holds) it fails with every
 * number. */
static int plan_memory(struct k3_sched *s, uint64_t slot_bytes, bool *streams, struct k3_err *err)
{
	const struct k3_options *o = s->opts;
	const struct k3_model_config *mc = k3_model_config(s->model);
	uint32_t ctx = o->context_tokens ? o->context_tokens : K3_STORE_PLAN_DEFAULT_CONTEXT;

	if (!o->context_tokens && mc->max_position_embeddings && ctx > mc->max_position_embeddings)
		ctx = (uint32_t)mc->max_position_embeddings;
	struct k3_store_plan_in in = {
		.memory_limit_bytes = o->memory_limit_bytes,
		.context_tokens = ctx,
		.spine_resident = o->spine_resident,
		.expert_cache_bytes = o->expert_cache_bytes,
		.max_chunk = o->prefill_chunk ? o->prefill_chunk : SCHED_PREFILL_CHUNK_MIN,
		.slot_bytes = slot_bytes,
	};
	/* --parallel auto: the most seats (up to K3_OPTIONS_PARALLEL_AUTO_MAX)
	 * whose sequence states the limit holds above its floor; each seat
	 * reserves its own KDA state and MLA cache for the whole context. */
	uint32_t seats = o->parallel ? o->parallel : K3_OPTIONS_PARALLEL_AUTO_MAX;
	int r;
	for (;;) {
		in.sequences = seats;
		r = k3_store_plan_model(s->model, &in, &s->plan, streams, err);
		if (r == 0 || o->parallel || seats == 1)
			break;
		seats--;
	}
	if (r < 0)
		return k3_err_prefix(err, "memory plan");
	s->parallel = seats;
	/* auto: the pass the limit allows, planned again with its scratch (the
	 * shortest pass's plan stands when the longer one does not fit) */
	s->prefill_chunk = prefill_chunk(s, s->plan.limit_bytes);
	if (s->prefill_chunk != in.max_chunk) {
		struct k3_store_plan_out longer;
		bool st;
		struct k3_err e2 = { 0, "" };
		in.max_chunk = s->prefill_chunk;
		if (k3_store_plan_model(s->model, &in, &longer, &st, &e2) == 0) {
			s->plan = longer;
			*streams = st;
		} else {
			s->prefill_chunk = SCHED_PREFILL_CHUNK_MIN;
		}
	}
	k3_log_info("parallel: %u sequence%s per pass (%s; state %.3f GB)", s->parallel,
		    s->parallel == 1 ? "" : "s", o->parallel ? "--parallel" : "auto",
		    (double)s->plan.state_bytes / 1e9);
	k3_log_info("prefill: up to %u positions per pass (%s; activations %.3f GB)",
		    s->prefill_chunk, o->prefill_chunk ? "--prefill-chunk" : "auto",
		    (double)k3_engine_scratch_bytes(mc, s->prefill_chunk) / 1e9);
	s->have_plan = true;
	return 0;
}

static void log_plan(const struct k3_store_plan_out *p, bool mapped)
{
	char pre[64];

	if (p->resident_layers == 0)
		snprintf(pre, sizeof(pre), "no layer");
	else
		snprintf(pre, sizeof(pre), "layers 0..%u", p->resident_layers - 1);
	k3_log_info("memory plan: limit %.3f GB (%s) = headroom %.3f + state %.3f (%u tokens) + scratch "
		    "%.3f + resident spine %.3f (%s of %u%s%s%s) + ring %u x %.3f + expert cache %.3f "
		    "(%u slots) + unused %.3f GB; floor %.3f GB; a cold token reads %.3f GB of spine "
		    "and %.3f GB of experts", (double)p->limit_bytes / 1e9, p->limited_by,
		    (double)p->headroom_bytes / 1e9, (double)p->state_bytes / 1e9, p->context_tokens,
		    (double)p->scratch_bytes / 1e9, (double)p->spine_resident_bytes / 1e9, pre,
		    p->n_layers, p->head_resident ? ", head" : "", p->embed_resident ? ", embedding" : "",
		    mapped ? "; mapped" : "", p->ring_arenas, (double)p->arena_bytes / 1e9,
		    (double)p->expert_cache_bytes / 1e9, p->expert_slots, (double)p->unused_bytes / 1e9,
		    (double)p->floor_bytes / 1e9, (double)p->cold_spine_bytes_per_pass / 1e9,
		    (double)p->cold_expert_bytes_per_token / 1e9);
}

/* The spine loader's configuration: the plan's resident set (docs/plan.md);
 * the embedding is gathered row by row. */
static void spine_config(const struct k3_sched *s, struct k3_store_spine_config *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	cfg->direct = (enum k3_store_direct)s->opts->direct;
	cfg->io_threads = s->opts->io_threads;
	cfg->max_rows = s->prefill_chunk;
	cfg->resident_layers = s->plan.resident_layers;
	cfg->head_resident = s->plan.head_resident;
	cfg->embed_resident = false;
	cfg->ring_arenas = s->plan.ring_arenas;
}

uint64_t sched_context_tokens(const struct k3_sched *s)
{
	const struct k3_model_config *mc = k3_model_config(s->model);
	uint64_t ctx = mc->max_position_embeddings ? mc->max_position_embeddings : 4096;

	/* Only an explicit --context is a cap: by default the plan reserves
	 * state for min(32768, the model's) tokens and a longer conversation
	 * grows its MLA cache past the plan (docs/plan.md, "Options and where
	 * the plan shows"). */
	return s->opts->context_tokens && s->opts->context_tokens < ctx ? s->opts->context_tokens : ctx;
}

void sched_status_memory(const struct k3_sched *s, struct k3_msg_status_reply *r)
{
	char line[256];
	uint64_t kb;
	FILE *f = fopen("/proc/self/status", "re");

	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "VmHWM: %" SCNu64, &kb) == 1) {
			r->peak_rss_bytes = kb * 1024; r->has_peak_rss_bytes = true;
			break;
		}
	if (f)
		fclose(f);
	/* The plan is written before MSG_LOADED and never again. */
	if (!s->ready || !s->have_plan)
		return;
	const struct k3_store_plan_out *p = &s->plan;
	r->memory_limit_bytes = p->limit_bytes; r->has_memory_limit_bytes = true;
	r->spine_layers = p->n_layers; r->has_spine_layers = true;
	r->spine_resident_layers = p->resident_layers; r->has_spine_resident_layers = true;
	r->spine_resident_bytes = p->spine_resident_bytes; r->has_spine_resident_bytes = true;
	r->spine_ring_bytes = p->spine_ring_bytes; r->has_spine_ring_bytes = true;
	r->state_bytes = p->state_bytes; r->has_state_bytes = true;
}

/* The spine loader (--spine-resident): the pack of the spine that runs
 * (spine.k3pack, or spine-int8.k3pack for --spine int8) when valid, else
 * the shards (and the overlay's), logged with the reason; reading through
 * the expert store's pool when there is one. */
static int open_spine(struct k3_sched *s, const struct k3_store_spine_config *cfg0,
		      const char *packdir, bool have_packs, struct k3_err *err)
{
	struct k3_store_spine_config cfg = *cfg0;
	struct k3_store_spine_report rep;
	struct k3_store_spine_info in;
	char path[4096];
	int r;

	cfg.io = s->store ? k3_store_reader_pool(s->store) : NULL;
	if (have_packs && k3_store_spine_pack_path(path, sizeof(path), packdir, s->model) != 0)
		return k3_err_set(err, -ENAMETOOLONG, "model path too long");
	r = k3_store_spine_new(s->model, have_packs ? path : NULL, &cfg, &s->spine, &rep, err);
	if (r == -EMEDIUMTYPE)
		return k3_err_prefix(err, "--direct on");
	if (r < 0)
		return k3_err_prefix(err, "spine loader");
	k3_store_spine_info_get(s->spine, &in);
	bool int8 = s->spine_kind == K3_SPINE_INT8;
	if (rep.pack_rejected)
		k3_log_warning("spine: from the shards (the spine pack was rejected: %s)", rep.rejection);
	else if (have_packs && !rep.from_pack)
		k3_log_info("spine: from the shards (no %s; `k3ctl pack --model DIR%s` writes it)",
			    path, int8 ? " --spine int8" : "");
	char res[64];
	if (in.resident_layers)
		snprintf(res, sizeof(res), "layers 0..%" PRIu32, in.resident_layers - 1);
	else
		snprintf(res, sizeof(res), "no layer");
	k3_log_info("spine: %s resident (%.3f GB with%s the head), %" PRIu32
		    " layers%s streamed per pass (%.3f GB per pass) through %" PRIu32 " arenas of %.3f"
		    " GB; embedding rows per token; from %s; %.3f GB of memory; %u files with"
		    " O_DIRECT, %u buffered",
		    res, (double)in.resident_bytes / 1e9,
		    in.head_resident ? "" : "out", in.n_layers - in.resident_layers,
		    in.head_resident ? "" : " and the head", (double)in.streamed_bytes_per_pass / 1e9,
		    in.ring_arenas, (double)in.arena_bytes / 1e9,
		    rep.from_pack ? "the spine pack" : s->opts->no_packs ? "the shards (--no-packs)"
		    : "the shards", (double)in.memory_bytes / 1e9, rep.files_direct, rep.files_buffered);
	return 0;
}

/* One line per drive when there are several, or when one is emulated. */
static void log_drives(const struct k3_sched *s)
{
	struct k3_store_info in;

	k3_store_info_get(s->store, &in);
	for (uint32_t d = 0; d < in.n_drives; d++) {
		const struct k3_store_io_drive_info *di = &in.drive[d];
		if (in.n_drives == 1 && !di->emulated_rate && !di->emulated_latency_ns)
			return;
		char emu[96] = "";
		if (di->emulated_rate || di->emulated_latency_ns)
			snprintf(emu, sizeof(emu), "; emulated at %.2f GB/s, %.2f ms a request",
				 (double)di->emulated_rate / 1e9, (double)di->emulated_latency_ns / 1e6);
		k3_log_info("drive %u (%s): copies of %u experts, %u readers%s", d,
			    d ? s->opts->expert_dirs[d - 1] : "the model directory", in.drive_experts[d],
			    di->threads, emu);
	}
	if (in.n_drives > 1)
		k3_log_info("reads: each to the copy predicted to finish first; %s", in.hedge_buffers
			    ? "a read past 1.5 x (or --hedge) its drive's p95 is hedged from another copy"
			    : "hedging off");
}

/* Creates the expert store over s->xsrc (docs/store.md, "For the engine"):
 * the memory plan's expert cache, the reader threads (through the emulated
 * drive when --io-rate / --io-latency ask for it); on a streaming install
 * (stream, `absent` experts not on disk) the readers fetch what is missing
 * (setup_remote.h). */
static int open_store(struct k3_sched *s, bool stream, uint64_t absent, struct k3_err *err)
{
	const struct k3_options *o = s->opts;
	const struct k3_model_config *mc = k3_model_config(s->model);
	int r;

	uint64_t slot = k3_store_source_slot_bytes(s->xsrc);
	uint64_t pool = (uint64_t)k3_store_source_count(s->xsrc) * slot;
	bool pf_auto = o->prefetch < 0;
	int prefetch = prefetch_of(o, mc);
	struct k3_store_config cfg = {
		.cache_bytes = s->plan.expert_cache_bytes,
		.io_threads = o->io_threads,
		.policy = K3_STORE_POLICY_FREQ,
		.prefetch_slots = prefetch ? -1 : 0,
		.prefetch_auto = pf_auto,
		.check_scales = true,
		/* hedge buffers only while a token's experts keep their slots */
		.min_slots = mc->num_experts_per_token,
	};
	if (stream) {
		struct k3_setup_opts so;
		k3_setup_opts_default(&so);
		so.dir = o->model_dir;
		so.progress = K3_SETUP_PROGRESS_QUIET;
		so.out = stderr;
		r = k3_setup_remote_open(&so, s->model, true, &s->remote, err);
		if (r < 0)
			return k3_err_prefix(err, "--fetch-experts");
		s->remote_reader = (struct k3_setup_remote_reader){ s->remote, s->xsrc };
		cfg.read = k3_setup_remote_read;
		cfg.read_ctx = &s->remote_reader;
		k3_log_info("experts: streaming install, %" PRIu64 " routed experts not on disk yet are"
			    " fetched when first used (verified as docs/setup.md says)", absent);
	}
	r = k3_store_drive_opts_apply(&o->drives, k3_store_source_drive_count(s->xsrc), &cfg, err);
	if (r == 0)
		r = k3_store_new(s->xsrc, &cfg, &s->store, err);
	if (r < 0)
		return k3_err_prefix(err, "expert store");
	log_drives(s);
	struct k3_store_info info;
	k3_store_info_get(s->store, &info);
	char pfs[96];
	if (pf_auto)
		snprintf(pfs, sizeof(pfs), "auto (a rank is read ahead while its precision >= %.2f)",
			 K3_STORE_PREFETCH_MIN_PRECISION);
	else if (prefetch)
		snprintf(pfs, sizeof(pfs), "%d guesses per position", prefetch);
	else
		snprintf(pfs, sizeof(pfs), "off");
	/* A slot is the whole 4 KiB pages one expert's reads cover: its
	 * weights and scales (k3ctl inspect's span) rounded up when a pack
	 * aligns it (k3ctl plan's slot), more where a shard places it across
	 * page boundaries or its arrays apart. Said here so the three sizes
	 * of one expert explain themselves. */
	struct k3_store_plan xp = { 0 };
	char why[224];
	if (k3_store_source_count(s->xsrc))
		k3_store_source_plan(s->xsrc, 0, &xp);
	uint64_t aligned = (xp.useful_bytes + K3_STORE_ALIGN - 1) / K3_STORE_ALIGN * K3_STORE_ALIGN;
	if (info.slot_bytes > aligned)
		snprintf(why, sizeof(why), "an expert's %" PRIu64 " bytes of weights and scales in"
			 " whole 4 KiB pages, as the shards place it; aligned in a pack: %" PRIu64,
			 xp.useful_bytes, aligned);
	else
		snprintf(why, sizeof(why), "an expert's %" PRIu64 " bytes of weights and scales in"
			 " whole 4 KiB pages", xp.useful_bytes);
	k3_log_info("expert cache: %u slots of %" PRIu64 " bytes (%s) = %.3f GB (%s; floor "
		    "%.3f GB, experts %.3f GB); %u reader threads; prefetch %s",
		    info.n_slots, info.slot_bytes, why,
		    (double)info.n_slots * (double)info.slot_bytes / 1e9,
		    o->expert_cache_bytes ? "--expert-cache-gb" : "the memory plan",
		    (double)s->plan.expert_floor_bytes / 1e9, (double)pool / 1e9, info.io_threads, pfs);
	/* one emulated drive for all (--io-rate, --io-latency of one value) */
	if (o->drives.n_rate <= 1 && o->drives.n_latency <= 1 &&
	    (o->drives.rate[0] || o->drives.latency_ns[0]))
		k3_log_notice("emulated drive: reads limited to %.3f GB/s in all, %.3f ms per request "
			      "(--io-rate, --io-latency: for benchmarks over page-cached files)",
			      (double)o->drives.rate[0] / 1e9, (double)o->drives.latency_ns[0] / 1e6);
	if (info.files_buffered && o->direct == K3_STORE_DIRECT_AUTO)
		k3_log_warning("expert reads: %u files with O_DIRECT, %u buffered + posix_fadvise(RANDOM)"
			       " (--direct auto: the file system refused O_DIRECT for %s)",
			       info.files_direct, info.files_buffered,
			       k3_store_source_file_path(s->xsrc, first_buffered(s->xsrc)));
	else
		k3_log_info("expert reads: %u files with O_DIRECT, %u buffered + posix_fadvise(RANDOM)"
			    " (--direct %s)", info.files_direct, info.files_buffered,
			    k3_store_direct_name((enum k3_store_direct)o->direct));
	return 0;
}

/* Everything between the model and the engine's first job (docs/store.md,
 * docs/plan.md): the prefill's pass length, the expert source, the memory
 * plan, the expert store, the spine loader sharing its readers, the engine
 * over the spine source, the expert source behind the engine. */
static int open_engine(struct k3_sched *s, struct k3_err *err)
{
	const struct k3_options *o = s->opts;
	const struct k3_model_config *mc = k3_model_config(s->model);
	struct k3_engine_opts eo = { .threads = o->threads, .provider = o->provider,
				     .vram_cache_bytes = o->vram_cache_bytes };
	struct k3_store_spine_config scfg;
	struct k3_spine_source ss;
	char packdir[4096];
	int r;

	if (snprintf(packdir, sizeof(packdir), "%s/%s", o->model_dir, K3_STORE_PACK_SUBDIR) >=
	    (int)sizeof(packdir))
		return k3_err_set(err, -ENAMETOOLONG, "model path too long");
	/* A streaming install (k3ctl setup --stream) has routed experts that
	 * are not on disk yet: reading them needs the fetcher, and packs of
	 * such shards would hold holes. */
	bool stream = false;
	uint64_t absent = 0;
	r = k3_setup_stream_status(o->model_dir, &stream, &absent, err);
	if (r < 0)
		return k3_err_prefix(err, "the install's state");
	if (stream && !o->fetch_experts)
		return k3_err_set(err, -ENOENT, "%s is a streaming install with %" PRIu64 " routed experts"
				  " not on disk yet: start k3d with --fetch-experts (it needs network"
				  " access: docs/setup.md, 'Streaming installs'), or fetch them first with"
				  " 'k3ctl fetch-weights --model %s'", o->model_dir, absent, o->model_dir);
	if (!stream && o->fetch_experts)
		k3_log_notice("--fetch-experts: every routed expert of %s is on disk; nothing to fetch",
			      o->model_dir);
	bool have_packs = !o->no_packs && !stream && access(packdir, F_OK) == 0;
	if (mc->n_moe && (r = open_expert_source(s, packdir, have_packs, err)) < 0)
		return r;
	uint64_t slot = s->xsrc ? k3_store_source_slot_bytes(s->xsrc) : 0;
	bool spine;
	if ((r = plan_memory(s, slot, &spine, err)) < 0)
		return r;
	eo.max_chunk = s->prefill_chunk;
	log_plan(&s->plan, !spine);
	if (s->xsrc && (r = open_store(s, stream, absent, err)) < 0)
		return r;
	if (spine) {
		spine_config(s, &scfg);
		r = open_spine(s, &scfg, packdir, have_packs, err);
		if (r < 0)
			return r;
		k3_store_spine_source(s->spine, &ss);
		eo.spine = &ss;
	}
	r = k3_engine_open(s->model, &eo, &s->engine, err);
	if (r < 0)
		return r;
	if (s->store) {
		struct k3_expert_source es;
		k3_store_engine_src_init(&s->xctx, s->store, &es);
		k3_store_engine_src_set_prefetch(&s->xctx, (uint32_t)prefetch_of(o, mc), &es);
		k3_engine_set_expert_source(s->engine, &es);
	}
	return 0;
}

/* ---- the model -------------------------------------------------------------------- */

/* Says which spine runs; the int8 one loudly (it is not the checkpoint's
 * weights) with what it replaced. */
static void log_spine(struct k3_sched *s)
{
	struct k3_model_int8_info in;

	k3_model_int8_info_get(s->model, &in);
	s->spine_kind = in.on ? K3_SPINE_INT8 : K3_SPINE_BF16;
	if (!in.on) {
		k3_log_info("spine: bf16, the checkpoint's weights (weight-exact)");
		return;
	}
	k3_log_warning("spine: %s: %zu matrices from %s (%.3f GB of int8 and row scales in place"
		       " of %.3f GB of BF16); the embedding,%s MLA kv_b_proj and every norm and vector"
		       " are the checkpoint's; outputs differ from the BF16 spine's (`k3ctl bench"
		       " --compare-spine` measures how much)", K3_PROTO_SPINE_INT8_LABEL,
		       in.matrices, in.dir, (double)in.int8_bytes / 1e9, (double)in.bf16_bytes / 1e9,
		       in.roles & K3_MODEL_INT8_ROUTER ? "" : " the router,");
}

/* Logs what loading mapped and how much is resident so far. */
static void log_model(const struct k3_sched *s)
{
	size_t n_t = 0;
	const struct k3_tensor *t = k3_model_tensors(s->model, &n_t);
	uint64_t mapped = 0, weights = 0, rss_kb = 0;
	char line[256];
	FILE *f = fopen("/proc/self/status", "r");

	for (uint32_t i = 0; i < k3_model_shard_count(s->model); i++)
		mapped += k3_model_shard_size(s->model, i);
	for (size_t i = 0; i < n_t; i++)
		weights += t[i].nbytes;
	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "VmRSS: %" SCNu64, &rss_kb) == 1)
			break;
	if (f)
		fclose(f);
	/* Weights are mapped read-only and paged in on use, so resident
	 * memory grows with the first tokens, not at load. */
	k3_log_info("model: %u shards, %.1f MB mapped read-only, %zu tensors with %.1f MB of "
		    "weights; resident now %.1f MB; per-sequence state is allocated per request",
		    k3_model_shard_count(s->model), (double)mapped / 1e6, n_t, (double)weights / 1e6,
		    (double)rss_kb / 1e3);
}

void sched_load(struct k3_sched *s)
{
	struct k3_err err = { 0, "" };
	const char *dir = s->opts->model_dir;
	const char *base;
	char msg[K3_ERR_MSG_MAX + 64];
	int r;

	/* --spine int8: the overlay, checked against the shards it was made
	 * from (a stale or missing one is refused, saying what to run) */
	if (s->opts->spine_int8)
		r = k3_store_int8_open_model(dir, s->opts->spine_int8_dir, 0, &s->model, &err);
	else
		r = k3_model_open(dir, &s->model, &err);
	if (r == 0)
		log_spine(s);
	snprintf(msg, sizeof(msg), "%s/tiktoken.model", dir);
	if (r == 0 && access(msg, F_OK) == 0)
		r = k3_tok_load_dir(dir, &s->tok, &err);
	else if (r == 0)
		k3_log_warning("model '%s' has no tiktoken.model: serving token-id requests only", dir);
	if (r == 0)
		r = open_engine(s, &err);
	if (r == 0)
		r = sched_draft_load(s, &err);
	if (r == 0 && (r = open_trace(s, &err)) < 0) {
		snprintf(msg, sizeof(msg), "cannot use --router-trace: %s", err.msg);
		sched_post_kind(s, MSG_LOADED, NULL, false, msg);
		return;
	}
	if (r < 0) {
		snprintf(msg, sizeof(msg), "cannot load model '%s': %s", dir, err.msg);
		sched_post_kind(s, MSG_LOADED, NULL, false, msg);
		return;
	}
	log_model(s);
	base = strrchr(dir, '/');
	base = base && base[1] ? base + 1 : dir;
	/* the model id says what runs: an OpenAI-style id, and every client
	 * (the gateway's /v1/models too) shows it (docs/k3d.8, --spine) */
	snprintf(s->model_id, sizeof(s->model_id), "%.200s%s", base,
		 s->spine_kind == K3_SPINE_INT8 ? "+int8-spine" : "");
	s->loaded = true;
	sched_post_kind(s, MSG_LOADED, NULL, true, NULL);
}

/* ---- WARM_EXPERTS ------------------------------------------------------------------- */

void sched_warm_request(struct k3_sched *s, struct k3_conn *c, uint32_t rid,
			const struct k3_msg_warm_experts *m)
{
	struct k3_store_info info;
	struct sched_job *j;

	if (!s->store) {
		k3_conn_send_error(c, rid, K3_STATUS_UNSUPPORTED, NULL,
				   "this model's experts are not streamed through the expert cache");
		return;
	}
	if (m->layers.n != m->experts.n || m->layers.n == 0) {
		k3_conn_send_error(c, rid, K3_STATUS_BAD_REQUEST, "experts",
				   "layers (%u) and experts (%u) must pair up, at least one",
				   m->layers.n, m->experts.n);
		return;
	}
	for (uint32_t i = 0; i < m->layers.n; i++) {
		uint32_t l = k3_proto_ids_at(&m->layers, i), x = k3_proto_ids_at(&m->experts, i);
		if (k3_store_source_find(s->xsrc, l, x) < 0) {
			k3_conn_send_error(c, rid, K3_STATUS_INVALID_ARGUMENT, "experts",
					   "entry %u: layer %u has no routed expert %u", i, l, x);
			return;
		}
	}
	if (sched_admit(s, c, rid) < 0)
		return;
	k3_store_info_get(s->store, &info);
	j = sched_job_new(s, K3_JOB_WARM_EXPERTS, rid);
	uint32_t n = m->layers.n < info.n_slots ? m->layers.n : info.n_slots;
	if (j) {
		j->warm_layer = malloc(n * sizeof(uint32_t));
		j->warm_expert = malloc(n * sizeof(uint32_t));
	}
	if (!j || !j->warm_layer || !j->warm_expert) {
		sched_job_free(j);
		k3_conn_send_error(c, rid, K3_STATUS_INTERNAL, NULL, "out of memory");
		return;
	}
	/* Duplicates would only waste slots of the best-first prefix. */
	for (uint32_t i = 0; i < m->layers.n && j->n_warm < n; i++) {
		uint32_t l = k3_proto_ids_at(&m->layers, i), x = k3_proto_ids_at(&m->experts, i);
		bool dup = false;
		for (uint32_t k = 0; k < j->n_warm && !dup; k++)
			dup = j->warm_layer[k] == l && j->warm_expert[k] == x;
		if (!dup) {
			j->warm_layer[j->n_warm] = l;
			j->warm_expert[j->n_warm++] = x;
		}
	}
	j->warm_requested = m->layers.n;
	sched_enqueue(s, c, j);
}

/* Acquires and at once releases n experts of one layer as one store step. */
static int warm_batch(struct k3_sched *s, uint32_t layer, const uint32_t *ids, uint32_t n,
		      struct k3_store_view *views, struct k3_err *err)
{
	int rc;

	k3_store_step_begin(s->store);
	rc = k3_store_acquire(s->store, layer, ids, n, views, err);
	if (rc == 0)
		k3_store_release(s->store, views, n);
	return rc;
}

/* Preloads a WARM_EXPERTS job's experts on the engine thread (between
 * generations, so no step is in progress): per layer, in batches of at
 * most half the slots, acquire (reads the misses sorted by offset, several
 * in flight) and release at once, leaving them resident and unpinned. The
 * job holds at most as many experts as the cache has slots (the best
 * first), so later batches take free or evictable slots, never fail. The
 * reads count in the store's counters like any demand read. */
void sched_warm_run(struct k3_sched *s, struct sched_job *j)
{
	struct k3_store_info info;
	struct k3_store_stats a, b;
	struct k3_msg_warm_experts_reply r;
	struct k3_err err = { 0, "" };
	struct timespec t0;
	uint32_t loaded = 0, resident = 0;
	int rc = 0;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	k3_store_info_get(s->store, &info);
	k3_store_stats_get(s->store, &a);
	uint32_t batch = info.n_slots / 2 ? info.n_slots / 2 : 1;
	struct k3_store_view *views = calloc(batch, sizeof(*views));
	uint32_t *ids = calloc(batch, sizeof(*ids));
	bool *done_mask = calloc(j->n_warm ? j->n_warm : 1, sizeof(*done_mask));
	if (!views || !ids || !done_mask)
		rc = k3_err_set(&err, -ENOMEM, "out of memory");
	/* Layer by layer in order of each layer's best entry; inside a layer,
	 * rank order. */
	for (uint32_t i = 0; rc == 0 && i < j->n_warm; i++) {
		if (done_mask[i])
			continue;
		uint32_t layer = j->warm_layer[i], n = 0;
		for (uint32_t k = i; k < j->n_warm; k++) {
			if (done_mask[k] || j->warm_layer[k] != layer)
				continue;
			done_mask[k] = true;
			ids[n++] = j->warm_expert[k];
			if (n == batch || k + 1 == j->n_warm) {
				if (atomic_load(&j->cancel)) {
					rc = k3_err_set(&err, -ECANCELED, "cancelled");
					break;
				}
				rc = warm_batch(s, layer, ids, n, views, &err);
				if (rc)
					break;
				loaded += n;
				n = 0;
			}
		}
		if (rc == 0 && n) {
			rc = warm_batch(s, layer, ids, n, views, &err);
			if (rc == 0)
				loaded += n;
		}
	}
	k3_store_idle(s->store);
	k3_store_stats_get(s->store, &b);
	for (uint32_t i = 0; i < j->n_warm; i++)
		resident += k3_store_resident(s->store, j->warm_layer[i], j->warm_expert[i]);
	free(views);
	free(ids);
	free(done_mask);
	if (rc < 0) {
		struct k3_msg_error e;

		k3_log_warning("warm-experts job %llu: %s", (unsigned long long)j->id, err.msg);
		memset(&e, 0, sizeof(e));
		e.status = rc == -ECANCELED ? K3_STATUS_CANCELLED : K3_STATUS_INTERNAL; e.has_status = true;
		e.message = k3_proto_str_of(err.msg); e.has_message = true;
		j->final = sched_encode_frame(j, K3_MSG_ERROR, &e);
		return;
	}
	memset(&r, 0, sizeof(r));
	r.requested = j->warm_requested; r.has_requested = true;
	r.loaded = loaded; r.has_loaded = true;
	r.resident = resident; r.has_resident = true;
	r.bytes_read = b.bytes_read - a.bytes_read; r.has_bytes_read = true;
	r.seconds = sched_since(&t0); r.has_seconds = true;
	k3_log_info("warmed %u of %u requested experts (%u resident now), %.1f MB read in %.2f s",
		    loaded, j->warm_requested, resident, (double)r.bytes_read / 1e6, r.seconds);
	j->final = sched_encode_frame(j, K3_MSG_WARM_EXPERTS_REPLY, &r);
}

/* ---- drives and the counters that add up (STATUS, DONE) ------------------------------ */

/* v[0..n) as the protocol's u64 array (borrowed). */
static struct k3_proto_u64s u64s(const uint64_t *v, uint32_t n)
{
	return (struct k3_proto_u64s){ n, v, NULL };
}

/* The per-drive columns DONE and STATUS_REPLY share (fields 60-66), each
 * K3_STORE_MAX_DRIVES long in b: expert bytes, demand, prefetch used and
 * wasted, spine bytes (all on drive 0: the spine reads through its
 * readers), hedges, hedges won. */
static void drive_columns(const struct k3_store_stats *st, uint64_t spine, uint32_t n, uint64_t *b)
{
	const uint64_t *cols[7] = { st->drive_bytes_read, st->drive_demand_bytes,
				    st->drive_prefetch_used_bytes, st->drive_prefetch_wasted_bytes,
				    NULL, st->drive_hedges, st->drive_hedges_won };

	for (int c = 0; c < 7; c++)
		for (uint32_t d = 0; d < n; d++)
			b[c * K3_STORE_MAX_DRIVES + d] = cols[c] ? cols[c][d] : d == 0 ? spine : 0;
}

/* Sets what DONE and STATUS_REPLY (msg: the message's lower-case name, r
 * its struct) both carry from the store's counters st: the per-drive
 * columns of K3_PROTO_FIELDS_DRIVES_, through b (drive_columns), the
 * expert demand and prefetch-used totals, hedges and hedges won. One
 * list for both, so a column added to the shared rows is sent by both. */
#define SET_DRIVE_ROWS_(msg, r, st, spine, n, b) do { \
	drive_columns(st, spine, n, b); \
	k3_msg_##msg##_set_drive_expert_bytes_read(r, u64s(b, n)); \
	k3_msg_##msg##_set_drive_expert_demand_bytes(r, u64s(b + K3_STORE_MAX_DRIVES, n)); \
	k3_msg_##msg##_set_drive_prefetch_used_bytes(r, u64s(b + 2 * K3_STORE_MAX_DRIVES, n)); \
	k3_msg_##msg##_set_drive_prefetch_wasted_bytes(r, u64s(b + 3 * K3_STORE_MAX_DRIVES, n)); \
	k3_msg_##msg##_set_drive_spine_bytes_read(r, u64s(b + 4 * K3_STORE_MAX_DRIVES, n)); \
	k3_msg_##msg##_set_drive_hedges(r, u64s(b + 5 * K3_STORE_MAX_DRIVES, n)); \
	k3_msg_##msg##_set_drive_hedges_won(r, u64s(b + 6 * K3_STORE_MAX_DRIVES, n)); \
	k3_msg_##msg##_set_expert_demand_bytes(r, (st)->demand_bytes); \
	k3_msg_##msg##_set_prefetch_used_bytes(r, (st)->prefetch_used_bytes); \
	k3_msg_##msg##_set_hedges(r, (st)->hedges); \
	k3_msg_##msg##_set_hedges_won(r, (st)->hedges_won); \
} while (0)

void sched_status_drives(struct k3_sched *s, struct k3_msg_status_reply *r)
{
	uint64_t *b = s->status_u64;
	uint32_t *u = s->status_u32;
	struct k3_store_stats st;
	struct k3_store_info in;
	uint32_t n;

	k3_msg_status_reply_set_prefill_chunk(r, s->prefill_chunk);
	if (!s->store)
		return;
	k3_store_stats_get(s->store, &st);
	k3_store_info_get(s->store, &in);
	n = in.n_drives;
	uint64_t spine = 0;
	if (s->spine) {
		struct k3_store_spine_stats ss;
		k3_store_spine_stats_get(s->spine, &ss);
		spine = ss.bytes_read;
		k3_msg_status_reply_set_spine_demand_bytes(r, ss.demand_bytes);
		k3_msg_status_reply_set_spine_wasted_bytes(r, ss.wasted_bytes);
	}
	SET_DRIVE_ROWS_(status_reply, r, &st, spine, n, b);
	for (uint32_t d = 0; d < n; d++) {
		b[7 * K3_STORE_MAX_DRIVES + d] = in.drive[d].rate_bytes_per_s;
		b[8 * K3_STORE_MAX_DRIVES + d] = in.drive[d].p95_ns;
		u[d] = in.drive_prefetch_on[d];
		u[K3_STORE_MAX_DRIVES + d] = in.drive_experts[d];
	}
	k3_msg_status_reply_set_drive_rate(r, u64s(b + 7 * K3_STORE_MAX_DRIVES, n));
	k3_msg_status_reply_set_drive_p95_ns(r, u64s(b + 8 * K3_STORE_MAX_DRIVES, n));
	k3_msg_status_reply_set_drive_prefetch_on(r, (struct k3_proto_ids){ n, u, NULL });
	k3_msg_status_reply_set_drive_experts(r, (struct k3_proto_ids){ n, u + K3_STORE_MAX_DRIVES,
									 NULL });
}

void sched_done_drives(const struct k3_sched *s, const struct sched_seq *q,
		       const struct k3_store_stats *xd, const struct k3_store_spine_stats *sd,
		       struct k3_msg_done *done, uint64_t *b)
{
	k3_msg_done_set_prefill_chunk(done, q->chunk);
	if (s->spine) {
		k3_msg_done_set_spine_demand_bytes(done, sd->demand_bytes);
		k3_msg_done_set_spine_wasted_bytes(done, sd->wasted_bytes);
	}
	if (!s->store)
		return;
	struct k3_store_info in;
	k3_store_info_get(s->store, &in);
	uint32_t n = in.n_drives;
	SET_DRIVE_ROWS_(done, done, xd, s->spine ? sd->bytes_read : 0, n, b);
	/* the prefill's cost against one read of each distinct expert */
	struct k3_store_stats pf;
	k3_store_stats_sub(&q->xs_prefilled, &q->xs0, &pf);
	k3_msg_done_set_prefill_expert_bytes(done, q->prefilled ? pf.bytes_read : 0);
	k3_msg_done_set_prefill_distinct_experts(done, q->prefilled ? pf.distinct_experts : 0);
	k3_msg_done_set_expert_span_bytes(done, in.slot_bytes);
}

/*
 * sched_load.c - what the engine thread loads before its first job and
 * the work that uses the expert store directly: the model, tokenizer and
 * engine; the expert store behind the engine (packs or shards, the RAM
 * budget, readers, prefetch); --router-trace (opening it, appending each
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
#include "store/store_model.h"
#include "store/store_trace.h"

/* Per-request state the budget reserves besides the cache: MLA caches and
 * KDA states of one sequence plus activations (small next to the experts at
 * every scale this build serves; a long-context K3 request needs more and
 * --expert-cache-gb N then sets the share explicitly). */
#define SCHED_STATE_RESERVE ((uint64_t)512 << 20)

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
	per = (size_t)SCHED_PREFILL_CHUNK * k3_engine_n_moe(s->engine) * k3_engine_top_k(s->engine);
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

/* Bytes of the routed experts' tensors (what the store streams). */
static uint64_t expert_tensor_bytes(const struct k3_model *m)
{
	const struct k3_model_plan *plan = k3_model_plan(m);
	uint64_t sum = 0;

	for (uint32_t l = 0; l < plan->n_layers; l++) {
		if (!plan->layers[l].is_moe)
			continue;
		for (uint32_t x = 0; x < plan->layers[l].moe.n_experts; x++) {
			const struct k3_expert *e = &plan->layers[l].moe.experts[x];
			const struct k3_expert_proj *pr[3] = { &e->w1, &e->w2, &e->w3 };
			for (int i = 0; i < 3; i++) {
				if (pr[i]->packed)
					sum += pr[i]->packed->nbytes;
				if (pr[i]->scale)
					sum += pr[i]->scale->nbytes;
				if (pr[i]->weight)
					sum += pr[i]->weight->nbytes;
			}
		}
	}
	return sum;
}

/* The first expert file read without O_DIRECT (for the log). */
static uint32_t first_buffered(const struct k3_store_source *src)
{
	for (uint32_t f = 0; f < k3_store_source_file_count(src); f++)
		if (!k3_store_source_file_direct(src, f))
			return f;
	return 0;
}

/* Opens the expert store behind the engine (docs/store.md, "For the
 * engine"): packs when valid (else shards, logged with the reason), the
 * RAM budget (refused below one token's floor), the reader threads and the
 * lookahead. A model whose experts the store cannot
 * stream (not MXFP4) keeps the mmapped tensors, with a warning. */
static int open_store(struct k3_sched *s, struct k3_err *err)
{
	const struct k3_options *o = s->opts;
	const struct k3_model_config *mc = k3_model_config(s->model);
	struct k3_store_open_report rep;
	struct k3_store_budget_out b;
	char packdir[4096];
	int r;

	if (!mc->n_moe)
		return 0;
	if (snprintf(packdir, sizeof(packdir), "%s/%s", o->model_dir, K3_STORE_PACK_SUBDIR) >=
	    (int)sizeof(packdir))
		return k3_err_set(err, -ENAMETOOLONG, "model path too long");
	memset(&rep, 0, sizeof(rep));
	bool have_packs = !o->no_packs && access(packdir, F_OK) == 0;
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

	size_t n_t = 0;
	const struct k3_tensor *t = k3_model_tensors(s->model, &n_t);
	uint64_t weights = 0, xbytes = expert_tensor_bytes(s->model);
	uint64_t slot = k3_store_source_slot_bytes(s->xsrc);
	uint64_t pool = (uint64_t)k3_store_source_count(s->xsrc) * slot;
	for (size_t i = 0; i < n_t; i++)
		weights += t[i].nbytes;
	struct k3_store_budget_in bi = {
		.spine_bytes = weights > xbytes ? weights - xbytes : 0,
		.state_bytes = SCHED_STATE_RESERVE,
		.slot_bytes = slot,
		.floor_slots = mc->num_experts_per_token,
		.requested_bytes = o->expert_cache_bytes,
	};
	r = k3_store_budget(&bi, &b, err);
	if (r < 0)
		return k3_err_prefix(err, "--expert-cache-gb");
	/* More than every expert buys nothing. */
	uint64_t cache = b.cache_bytes < pool ? b.cache_bytes : pool;
	if (cache < b.floor_bytes)
		cache = b.floor_bytes;
	/* auto: every rank is offered, the store's precision gate decides. */
	bool pf_auto = o->prefetch < 0;
	int prefetch = pf_auto ? (int)mc->num_experts_per_token : o->prefetch;
	struct k3_store_config cfg = {
		.cache_bytes = cache,
		.io_threads = o->io_threads,
		.policy = K3_STORE_POLICY_FREQ,
		.prefetch_slots = prefetch ? -1 : 0,
		.prefetch_auto = pf_auto,
		.check_scales = true,
	};
	r = k3_store_new(s->xsrc, &cfg, &s->store, err);
	if (r < 0)
		return k3_err_prefix(err, "expert store");
	struct k3_store_info info;
	struct k3_expert_source es;
	k3_store_info_get(s->store, &info);
	k3_store_engine_src_init(&s->xctx, s->store, &es);
	k3_store_engine_src_set_prefetch(&s->xctx, (uint32_t)prefetch, &es);
	k3_engine_set_expert_source(s->engine, &es);
	char pfs[96];
	if (pf_auto)
		snprintf(pfs, sizeof(pfs), "auto (a rank is read ahead while its precision >= %.2f)",
			 K3_STORE_PREFETCH_MIN_PRECISION);
	else if (prefetch)
		snprintf(pfs, sizeof(pfs), "%d guesses per position", prefetch);
	else
		snprintf(pfs, sizeof(pfs), "off");
	k3_log_info("expert cache: %u slots of %" PRIu64 " bytes = %.3f GB (%s; limit %.1f GB%s, "
		    "spine %.3f GB, floor %.3f GB, experts %.3f GB); %u reader threads; prefetch %s",
		    info.n_slots, info.slot_bytes, (double)info.n_slots * (double)info.slot_bytes / 1e9,
		    o->expert_cache_bytes ? "--expert-cache-gb" : "auto", (double)b.limit_bytes / 1e9,
		    b.limited_by_cgroup ? " by cgroup" : "", (double)bi.spine_bytes / 1e9,
		    (double)b.floor_bytes / 1e9, (double)pool / 1e9, info.io_threads, pfs);
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

/* ---- the model -------------------------------------------------------------------- */

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
	struct k3_engine_opts eo = { .threads = s->opts->threads, .provider = s->opts->provider,
				     .vram_cache_bytes = s->opts->vram_cache_bytes };
	const char *dir = s->opts->model_dir;
	const char *base;
	char msg[K3_ERR_MSG_MAX + 64];
	int r;

	r = k3_model_open(dir, &s->model, &err);
	snprintf(msg, sizeof(msg), "%s/tiktoken.model", dir);
	if (r == 0 && access(msg, F_OK) == 0)
		r = k3_tok_load_dir(dir, &s->tok, &err);
	else if (r == 0)
		k3_log_warning("model '%s' has no tiktoken.model: serving token-id requests only", dir);
	if (r == 0)
		r = k3_engine_open(s->model, &eo, &s->engine, &err);
	if (r == 0 && (r = open_trace(s, &err)) < 0) {
		snprintf(msg, sizeof(msg), "cannot use --router-trace: %s", err.msg);
		sched_post_kind(s, MSG_LOADED, NULL, false, msg);
		return;
	}
	if (r == 0)
		r = open_store(s, &err);
	if (r < 0) {
		snprintf(msg, sizeof(msg), "cannot load model '%s': %s", dir, err.msg);
		sched_post_kind(s, MSG_LOADED, NULL, false, msg);
		return;
	}
	log_model(s);
	base = strrchr(dir, '/');
	base = base && base[1] ? base + 1 : dir;
	snprintf(s->model_id, sizeof(s->model_id), "%s", base);
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

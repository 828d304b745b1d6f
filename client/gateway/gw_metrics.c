/*
 * gw_metrics.c - counters of k3-gateway and their Prometheus text form
 * (text exposition format 0.0.4). Token and timing totals come from the
 * DONE frames this gateway saw, split by whether the reply reached its
 * client; queue depth and expert-cache counters from
 * k3d's STATUS_REPLY at scrape time.
 */
#include "gw.h"

#include <stdbool.h>

#include <event2/buffer.h>

#include "k3_proto.h"

static const char *const ep_names[GW_M_COUNT_] = {
	"chat_completions", "completions", "models", "health", "metrics", "other",
};

void gw_metrics_count(struct gw_metrics *m, enum gw_ep_metric ep, int status)
{
	for (unsigned i = 0; i < GW_M_STATUSES; i++) {
		if (m->by_status[ep][i].status == status || m->by_status[ep][i].status == 0) {
			m->by_status[ep][i].status = status;
			m->by_status[ep][i].n++;
			return;
		}
	}
}

/* One metric's "# HELP" and "# TYPE" lines; type is "counter" or "gauge". */
static void help_type(struct evbuffer *out, const char *name, const char *type, const char *help)
{
	evbuffer_add_printf(out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void metric_u64(struct evbuffer *out, const char *name, const char *type, const char *help,
		       uint64_t v)
{
	help_type(out, name, type, help);
	evbuffer_add_printf(out, "%s %llu\n", name, (unsigned long long)v);
}

/* digits: decimals printed (6 for seconds and ratios) */
static void metric_f64(struct evbuffer *out, const char *name, const char *type, const char *help,
		       int digits, double v)
{
	help_type(out, name, type, help);
	evbuffer_add_printf(out, "%s %.*f\n", name, digits, v);
}

/* A counter k3d reports only when it has it (has = its optional field). */
static void counter_u64(struct evbuffer *out, const char *name, const char *help, bool has, uint64_t v)
{
	if (has)
		metric_u64(out, name, "counter", help, v);
}

static void counter_f64(struct evbuffer *out, const char *name, const char *help, bool has, double v)
{
	if (has)
		metric_f64(out, name, "counter", help, 6, v);
}

/* The expert store's counters since k3d started (docs/store.md "Counters";
 * present only when k3d streams the model's experts). Per-token and
 * per-second figures are rate() of these in PromQL; the one gauge is the
 * lifetime bytes read per computed token. */
static void render_expert(const struct k3_msg_status_reply *st, struct evbuffer *out)
{
	counter_u64(out, "k3_expert_bytes_read_total",
		    "Expert bytes read from storage (O_DIRECT alignment included): the ground truth.",
		    st->has_expert_bytes_read, st->expert_bytes_read);
	counter_u64(out, "k3_expert_positions_total",
		    "Token positions the engine computed (uncached prompt positions plus decode steps).",
		    st->has_positions_total, st->positions_total);
	if (st->has_positions_total)
		metric_f64(out, "k3_expert_bytes_read_per_token", "gauge",
			   "Expert bytes read / positions computed, since k3d started.", 1,
			   st->positions_total ? (double)st->expert_bytes_read / (double)st->positions_total : 0.0);
	counter_u64(out, "k3_expert_demand_hits_total",
		    "Routed experts found resident, not read for the same step (once per expert per step).",
		    st->has_expert_hits, st->expert_hits);
	counter_u64(out, "k3_expert_demand_misses_total",
		    "Routed experts that had to be read (a prefetch for the same step counts here).",
		    st->has_expert_misses, st->expert_misses);
	counter_u64(out, "k3_expert_prefetch_issued_total", "Prefetch (router lookahead) reads started.",
		    st->has_prefetch_issued, st->prefetch_issued);
	counter_u64(out, "k3_expert_prefetch_issued_bytes_total",
		    "Bytes of prefetch reads (part of k3_expert_bytes_read_total).",
		    st->has_prefetch_issued_bytes, st->prefetch_issued_bytes);
	counter_u64(out, "k3_expert_prefetch_used_total", "Prefetched experts used by a later step.",
		    st->has_prefetch_used, st->prefetch_used);
	counter_u64(out, "k3_expert_prefetch_wasted_bytes_total",
		    "Bytes of prefetched experts evicted unused.",
		    st->has_prefetch_wasted_bytes, st->prefetch_wasted_bytes);
	counter_f64(out, "k3_expert_io_wait_seconds_total",
		    "Time generations waited for expert reads.", st->has_io_wait_s_total, st->io_wait_s_total);
	counter_f64(out, "k3_expert_compute_seconds_total",
		    "Time generations spent on everything but waiting for expert reads.",
		    st->has_compute_s_total, st->compute_s_total);
	if (st->has_expert_cache_bytes)
		metric_u64(out, "k3_expert_cache_bytes", "gauge", "Size of k3d's RAM expert cache.",
			   st->expert_cache_bytes);
}

/* One series per drive of a STATUS_REPLY per-drive array (drive 0 the
 * model directory's, then each k3d --expert-dir; docs/protocol.md), with
 * the label drive="N"; scale turns the value into the metric's unit. */
static void per_drive(struct evbuffer *out, const char *name, const char *type, const char *help,
		      const struct k3_proto_u64s *v, double scale)
{
	if (v->n == 0)
		return;
	help_type(out, name, type, help);
	for (uint32_t d = 0; d < v->n; d++) {
		uint64_t x = k3_proto_u64s_at(v, d);
		if (scale == 1.0)
			evbuffer_add_printf(out, "%s{drive=\"%u\"} %llu\n", name, d,
					    (unsigned long long)x);
		else
			evbuffer_add_printf(out, "%s{drive=\"%u\"} %.6f\n", name, d, (double)x * scale);
	}
}

/* Several drives (issue 19): where the bytes went and how each drive
 * reads (present only from a k3d that streams experts and sends them). */
static void render_drives(const struct k3_msg_status_reply *st, struct evbuffer *out)
{
	counter_u64(out, "k3_expert_demand_bytes_total",
		    "Expert bytes read on demand (hedged reads included); with prefetch used and"
		    " wasted, all of k3_expert_bytes_read_total.", st->has_expert_demand_bytes,
		    st->expert_demand_bytes);
	counter_u64(out, "k3_expert_prefetch_used_bytes_total",
		    "Bytes of prefetched experts a later step used.", st->has_prefetch_used_bytes,
		    st->prefetch_used_bytes);
	counter_u64(out, "k3_expert_hedges_total",
		    "Duplicate reads of another copy for a read past its drive's p95.", st->has_hedges,
		    st->hedges);
	counter_u64(out, "k3_expert_hedges_won_total", "Hedges that finished first.",
		    st->has_hedges_won, st->hedges_won);
	if (st->has_drive_expert_bytes_read)
		per_drive(out, "k3_drive_expert_bytes_read_total", "counter",
			  "Expert bytes read from each drive.", &st->drive_expert_bytes_read, 1.0);
	if (st->has_drive_expert_demand_bytes)
		per_drive(out, "k3_drive_expert_demand_bytes_total", "counter",
			  "Expert bytes each drive read on demand.", &st->drive_expert_demand_bytes, 1.0);
	if (st->has_drive_prefetch_used_bytes)
		per_drive(out, "k3_drive_prefetch_used_bytes_total", "counter",
			  "Prefetched bytes of each drive a later step used.",
			  &st->drive_prefetch_used_bytes, 1.0);
	if (st->has_drive_prefetch_wasted_bytes)
		per_drive(out, "k3_drive_prefetch_wasted_bytes_total", "counter",
			  "Prefetched bytes of each drive never used.", &st->drive_prefetch_wasted_bytes,
			  1.0);
	if (st->has_drive_hedges)
		per_drive(out, "k3_drive_hedges_total", "counter",
			  "Reads of each drive that ran past its p95 and were hedged.", &st->drive_hedges,
			  1.0);
	if (st->has_drive_rate)
		per_drive(out, "k3_drive_read_bytes_per_second", "gauge",
			  "Each drive's measured read rate (0 before it has read).", &st->drive_rate, 1.0);
	if (st->has_drive_p95_ns)
		per_drive(out, "k3_drive_read_p95_seconds", "gauge",
			  "The p95 of each drive's recent expert read times (0: too few reads).",
			  &st->drive_p95_ns, 1e-9);
}

/* Speculative decoding since k3d started (docs/draft.md): acceptance is
 * accepted / proposed, tokens per pass completion tokens / passes (1.0
 * without drafting). */
static void render_draft(const struct k3_msg_status_reply *st, struct evbuffer *out)
{
	counter_u64(out, "k3_daemon_draft_proposed_total", "Draft proposals the target verified.",
		    true, st->draft_proposed_total);
	counter_u64(out, "k3_daemon_draft_accepted_total",
		    "Draft proposals equal to the target's own greedy id.", true, st->draft_accepted_total);
	counter_u64(out, "k3_daemon_decode_passes_total",
		    "Target passes that produced generated ids (plain and verification).", true,
		    st->decode_passes_total);
	counter_f64(out, "k3_daemon_draft_seconds_total", "Time in the draft (proposing).", true,
		    st->draft_s_total);
	counter_f64(out, "k3_daemon_verify_seconds_total",
		    "Time in verification passes, commit included.", true, st->verify_s_total);
	metric_f64(out, "k3_daemon_tokens_per_pass", "gauge",
		   "Generated tokens per target pass since k3d started (1 without drafting).", 6,
		   st->decode_passes_total ? (double)st->completion_tokens_total /
					     (double)st->decode_passes_total : 0.0);
}

void gw_metrics_render(const struct gw_metrics *m, const struct k3_msg_status_reply *st,
		       struct evbuffer *out)
{
	help_type(out, "k3_gateway_requests_total", "counter",
		  "HTTP requests by endpoint and status (499: client went away).");
	for (unsigned ep = 0; ep < GW_M_COUNT_; ep++)
		for (unsigned i = 0; i < GW_M_STATUSES && m->by_status[ep][i].status; i++)
			evbuffer_add_printf(out, "k3_gateway_requests_total{endpoint=\"%s\",status=\"%d\"} %llu\n",
					    ep_names[ep], m->by_status[ep][i].status,
					    (unsigned long long)m->by_status[ep][i].n);
	help_type(out, "k3_gateway_tokens_total", "counter",
		  "Tokens in the usage of replies that reached their client (generations that ended stop, "
		  "length or tool_calls), by kind: prompt, completion, reasoning (part of completion), "
		  "cached_prompt (prompt tokens whose KV cache k3d reused instead of prefilling; part of "
		  "prompt).");
	evbuffer_add_printf(out,
		"k3_gateway_tokens_total{kind=\"prompt\"} %llu\n"
		"k3_gateway_tokens_total{kind=\"completion\"} %llu\n"
		"k3_gateway_tokens_total{kind=\"reasoning\"} %llu\n"
		"k3_gateway_tokens_total{kind=\"cached_prompt\"} %llu\n",
		(unsigned long long)m->prompt_tokens, (unsigned long long)m->completion_tokens,
		(unsigned long long)m->reasoning_tokens, (unsigned long long)m->cached_tokens);
	help_type(out, "k3_gateway_undelivered_tokens_total", "counter",
		  "Tokens k3d reported for generations whose reply did not reach the client (it went "
		  "away, or k3d cancelled or failed the job), by kind.");
	evbuffer_add_printf(out,
		"k3_gateway_undelivered_tokens_total{kind=\"prompt\"} %llu\n"
		"k3_gateway_undelivered_tokens_total{kind=\"completion\"} %llu\n",
		(unsigned long long)m->undelivered_prompt_tokens,
		(unsigned long long)m->undelivered_completion_tokens);
	metric_f64(out, "k3_gateway_prefill_seconds_total", "counter",
		   "Prefill time of generations whose reply reached the client.", 6, m->prefill_s);
	metric_f64(out, "k3_gateway_decode_seconds_total", "counter",
		   "Decode time of generations whose reply reached the client.", 6, m->decode_s);
	metric_u64(out, "k3_gateway_expert_bytes_read_total", "counter",
		   "Expert bytes k3d read for the generations of this gateway (DONE, every reply).",
		   m->done_expert_bytes);
	metric_u64(out, "k3_gateway_spine_bytes_read_total", "counter",
		   "Spine bytes k3d read for the generations of this gateway (DONE; 0 while k3d maps"
		   " the spine).", m->done_spine_bytes);
	metric_u64(out, "k3_gateway_cancels_total", "counter",
		   "CANCELs sent to k3d because a client went away.", m->cancels_sent);
	metric_u64(out, "k3_gateway_in_flight", "gauge",
		   "API requests now holding a k3d connection (the /health and /metrics probes are not counted).",
		   m->in_flight);
	metric_u64(out, "k3_gateway_daemon_up", "gauge",
		   "1 when k3d answered STATUS for this scrape.", st ? 1 : 0);
	if (!st)
		return;
	uint64_t lookups = st->expert_hits + st->expert_misses;
	metric_u64(out, "k3_daemon_state", "gauge",
		   "k3d state (0 loading, 1 ready, 2 draining, 3 no model).", st->state);
	metric_u64(out, "k3_daemon_queue_depth", "gauge", "Generations waiting for the engine slot.",
		   st->queued);
	metric_u64(out, "k3_daemon_running", "gauge", "Generations running now.", st->running);
	/* several sequences in one pass (k3d --parallel; absent from an older k3d) */
	if (st->has_parallel)
		metric_u64(out, "k3_daemon_parallel", "gauge",
			   "Generations k3d advances together in one pass (--parallel seats).", st->parallel);
	if (st->has_pass_width)
		metric_u64(out, "k3_daemon_pass_width", "gauge",
			   "Sequences in k3d's latest pass.", st->pass_width);
	if (st->has_pass_width_mean)
		metric_f64(out, "k3_daemon_pass_width_mean", "gauge",
			   "Mean sequences per pass since k3d started.", 3, st->pass_width_mean);
	if (st->has_passes_total)
		metric_u64(out, "k3_daemon_passes_total", "counter",
			   "Forward passes k3d ran since it started (prefill chunks, decode and "
			   "verification passes).", st->passes_total);
	metric_u64(out, "k3_daemon_expert_bytes_read_total", "counter",
		   "Expert weight bytes read from storage.", st->expert_bytes_read);
	metric_f64(out, "k3_daemon_expert_cache_hit_ratio", "gauge",
		   "Expert cache hits / lookups since k3d started.", 6,
		   lookups ? (double)st->expert_hits / (double)lookups : 0.0);
	metric_f64(out, "k3_daemon_prefill_seconds_total", "counter", "Prefill time, all clients.", 6,
		   st->prefill_s_total);
	metric_f64(out, "k3_daemon_decode_seconds_total", "counter", "Decode time, all clients.", 6,
		   st->decode_s_total);
	if (st->has_expert_bytes_read) {
		render_expert(st, out);
		render_drives(st, out);
	}
	/* the streamed spine (issue 17; absent while k3d maps it) */
	counter_u64(out, "k3_spine_bytes_read_total",
		    "Spine bytes read from storage since k3d became ready (streamed layers, head,"
		    " embedding rows).", st->has_spine_bytes_read, st->spine_bytes_read);
	if (st->has_spine_bytes_read && st->has_positions_total)
		metric_f64(out, "k3_spine_bytes_read_per_token", "gauge",
			   "Spine bytes read / positions computed, since k3d started.", 1,
			   st->positions_total ? (double)st->spine_bytes_read / (double)st->positions_total
					       : 0.0);
	counter_u64(out, "k3_spine_loads_total", "Spine layers (and heads) read whole.",
		    st->has_spine_loads, st->spine_loads);
	if (st->has_spine_memory_bytes)
		metric_u64(out, "k3_spine_memory_bytes", "gauge",
			   "k3d's spine memory: resident prefix, ring of layer arenas, row scratch.",
			   st->spine_memory_bytes);
	if (st->has_decode_passes_total)
		render_draft(st, out);
}

/*
 * gw_metrics.c - counters of k3-gateway and their Prometheus text form
 * (text exposition format 0.0.4). Token and timing totals come from the
 * DONE frames this gateway saw; queue depth and expert-cache counters from
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

static void counter_u64(struct evbuffer *out, const char *name, const char *help, bool has, uint64_t v)
{
	if (has)
		evbuffer_add_printf(out, "# HELP %s %s\n# TYPE %s counter\n%s %llu\n", name, help, name,
				    name, (unsigned long long)v);
}

static void counter_f64(struct evbuffer *out, const char *name, const char *help, bool has, double v)
{
	if (has)
		evbuffer_add_printf(out, "# HELP %s %s\n# TYPE %s counter\n%s %.6f\n", name, help, name,
				    name, v);
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
		evbuffer_add_printf(out,
			"# HELP k3_expert_bytes_read_per_token Expert bytes read / positions computed, since k3d started.\n"
			"# TYPE k3_expert_bytes_read_per_token gauge\n"
			"k3_expert_bytes_read_per_token %.1f\n",
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
		evbuffer_add_printf(out,
			"# HELP k3_expert_cache_bytes Size of k3d's RAM expert cache.\n"
			"# TYPE k3_expert_cache_bytes gauge\n"
			"k3_expert_cache_bytes %llu\n", (unsigned long long)st->expert_cache_bytes);
}

void gw_metrics_render(const struct gw_metrics *m, const struct k3_msg_status_reply *st,
		       struct evbuffer *out)
{
	evbuffer_add_printf(out,
		"# HELP k3_gateway_requests_total HTTP requests by endpoint and status (499: client went away).\n"
		"# TYPE k3_gateway_requests_total counter\n");
	for (unsigned ep = 0; ep < GW_M_COUNT_; ep++)
		for (unsigned i = 0; i < GW_M_STATUSES && m->by_status[ep][i].status; i++)
			evbuffer_add_printf(out, "k3_gateway_requests_total{endpoint=\"%s\",status=\"%d\"} %llu\n",
					    ep_names[ep], m->by_status[ep][i].status,
					    (unsigned long long)m->by_status[ep][i].n);
	evbuffer_add_printf(out,
		"# HELP k3_gateway_tokens_total Tokens of finished generations, by kind (reasoning is part of completion).\n"
		"# TYPE k3_gateway_tokens_total counter\n"
		"k3_gateway_tokens_total{kind=\"prompt\"} %llu\n"
		"k3_gateway_tokens_total{kind=\"completion\"} %llu\n"
		"k3_gateway_tokens_total{kind=\"reasoning\"} %llu\n"
		"k3_gateway_tokens_total{kind=\"cached_prompt\"} %llu\n"
		"# HELP k3_gateway_prefill_seconds_total Prefill time of finished generations.\n"
		"# TYPE k3_gateway_prefill_seconds_total counter\n"
		"k3_gateway_prefill_seconds_total %.6f\n"
		"# HELP k3_gateway_decode_seconds_total Decode time of finished generations.\n"
		"# TYPE k3_gateway_decode_seconds_total counter\n"
		"k3_gateway_decode_seconds_total %.6f\n"
		"# HELP k3_gateway_cancels_total CANCELs sent to k3d because a client went away.\n"
		"# TYPE k3_gateway_cancels_total counter\n"
		"k3_gateway_cancels_total %llu\n"
		"# HELP k3_gateway_in_flight API requests now holding a k3d connection (the /health and /metrics probes are not counted).\n"
		"# TYPE k3_gateway_in_flight gauge\n"
		"k3_gateway_in_flight %u\n",
		(unsigned long long)m->prompt_tokens, (unsigned long long)m->completion_tokens,
		(unsigned long long)m->reasoning_tokens, (unsigned long long)m->cached_tokens,
		m->prefill_s, m->decode_s, (unsigned long long)m->cancels_sent, m->in_flight);
	evbuffer_add_printf(out,
		"# HELP k3_gateway_daemon_up 1 when k3d answered STATUS for this scrape.\n"
		"# TYPE k3_gateway_daemon_up gauge\n"
		"k3_gateway_daemon_up %d\n", st ? 1 : 0);
	if (!st)
		return;
	uint64_t lookups = st->expert_hits + st->expert_misses;
	evbuffer_add_printf(out,
		"# HELP k3_daemon_state k3d state (0 loading, 1 ready, 2 draining, 3 no model).\n"
		"# TYPE k3_daemon_state gauge\n"
		"k3_daemon_state %u\n"
		"# HELP k3_daemon_queue_depth Generations waiting for the engine slot.\n"
		"# TYPE k3_daemon_queue_depth gauge\n"
		"k3_daemon_queue_depth %u\n"
		"# HELP k3_daemon_running Generations running now.\n"
		"# TYPE k3_daemon_running gauge\n"
		"k3_daemon_running %u\n"
		"# HELP k3_daemon_expert_bytes_read_total Expert weight bytes read from storage.\n"
		"# TYPE k3_daemon_expert_bytes_read_total counter\n"
		"k3_daemon_expert_bytes_read_total %llu\n"
		"# HELP k3_daemon_expert_cache_hit_ratio Expert cache hits / lookups since k3d started.\n"
		"# TYPE k3_daemon_expert_cache_hit_ratio gauge\n"
		"k3_daemon_expert_cache_hit_ratio %.6f\n"
		"# HELP k3_daemon_prefill_seconds_total Prefill time, all clients.\n"
		"# TYPE k3_daemon_prefill_seconds_total counter\n"
		"k3_daemon_prefill_seconds_total %.6f\n"
		"# HELP k3_daemon_decode_seconds_total Decode time, all clients.\n"
		"# TYPE k3_daemon_decode_seconds_total counter\n"
		"k3_daemon_decode_seconds_total %.6f\n",
		st->state, st->queued, st->running, (unsigned long long)st->expert_bytes_read,
		lookups ? (double)st->expert_hits / (double)lookups : 0.0, st->prefill_s_total,
		st->decode_s_total);
	if (st->has_expert_bytes_read)
		render_expert(st, out);
}

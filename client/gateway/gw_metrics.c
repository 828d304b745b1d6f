/*
 * gw_metrics.c - counters of k3-gateway and their Prometheus text form
 * (text exposition format 0.0.4). Token and timing totals come from the
 * DONE frames this gateway saw, split by whether the reply reached its
 * client; queue depth and expert-cache counters from
 * k3d's STATUS_REPLY at scrape time.
 */
#include "gw.h"

#include <stdbool.h>
#include <stddef.h>

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

/* One series per drive of a STATUS_REPLY per-drive array (drive 0 the
 * model directory's, then each k3d --expert-dir; docs/protocol.md), with
 * the label drive="N"; scale turns the value into the metric's unit (0:
 * the value is the unit, a count or bytes, printed as an integer). */
static void per_drive(struct evbuffer *out, const char *name, const char *type, const char *help,
		      const struct k3_proto_u64s *v, double scale)
{
	if (v->n == 0)
		return;
	help_type(out, name, type, help);
	for (uint32_t d = 0; d < v->n; d++) {
		uint64_t x = k3_proto_u64s_at(v, d);
		if (scale == 0)
			evbuffer_add_printf(out, "%s{drive=\"%u\"} %llu\n", name, d,
					    (unsigned long long)x);
		else
			evbuffer_add_printf(out, "%s{drive=\"%u\"} %.6f\n", name, d, (double)x * scale);
	}
}

/* How a series reads its field: the field's C type, or a ratio of
 * uint64_t fields. */
enum series_kind { S_U64, S_U32, S_UINT, S_F64, S_RATIO, S_DRIVES };

/*
 * A metric read out of a struct (struct gw_metrics or k3d's
 * k3_msg_status_reply) by offsets: the value at `at` (a ratio's
 * numerator, over the sum of the fields at per[], 0 when that is 0),
 * shown only when the bool flags at has[] are all true. An offset of 0 is
 * none: neither struct starts with a flag or a count (the status struct's
 * first member is its unused_ int).
 */
struct series {
	const char *name, *type, *help;
	size_t at, has[2], per[2];
	enum series_kind kind;
	int digits;     /* S_F64, S_RATIO: decimals printed */
	double scale;   /* S_DRIVES: into the metric's unit (0: none, printed as an integer) */
};

static void render_series(struct evbuffer *out, const void *src, const struct series *s, size_t n)
{
	const char *p = src;

	for (; n--; s++) {
		if ((s->has[0] && !*(const bool *)(p + s->has[0])) || (s->has[1] && !*(const bool *)(p + s->has[1])))
			continue;
		const void *v = p + s->at;
		uint64_t per = 0;

		switch (s->kind) {
		case S_U64: metric_u64(out, s->name, s->type, s->help, *(const uint64_t *)v); break;
		case S_U32: metric_u64(out, s->name, s->type, s->help, *(const uint32_t *)v); break;
		case S_UINT: metric_u64(out, s->name, s->type, s->help, *(const unsigned *)v); break;
		case S_F64: metric_f64(out, s->name, s->type, s->help, s->digits, *(const double *)v); break;
		case S_RATIO:
			for (int i = 0; i < 2; i++)
				per += s->per[i] ? *(const uint64_t *)(p + s->per[i]) : 0;
			metric_f64(out, s->name, s->type, s->help, s->digits,
				   per ? (double)*(const uint64_t *)v / (double)per : 0.0);
			break;
		case S_DRIVES: per_drive(out, s->name, s->type, s->help, v, s->scale); break;
		}
	}
}

/* Row macros: GW(f) and ST(f) take the value (and its kind, from its C
 * type) from struct gw_metrics or the STATUS_REPLY; ST_HAS(f) is that
 * field's has_ flag. */
#define GW(f) .at = offsetof(struct gw_metrics, f), \
	.kind = _Generic(((struct gw_metrics *)0)->f, uint64_t: S_U64, unsigned: S_UINT, double: S_F64)
#define ST_OFF(f) offsetof(struct k3_msg_status_reply, f)
#define ST_HAS(f) ST_OFF(has_##f)
#define ST(f) .at = ST_OFF(f), .kind = _Generic(((struct k3_msg_status_reply *)0)->f, uint64_t: S_U64, \
	uint32_t: S_U32, double: S_F64, struct k3_proto_u64s: S_DRIVES)
/* a counter or gauge k3d reports only when it has it (its optional field) */
#define ST_SENT(f) ST(f), .has = { ST_HAS(f) }
/* the expert store's (present only when k3d streams the model's experts) */
#define ST_EXPERT(f) ST(f), .has = { ST_HAS(expert_bytes_read), ST_HAS(f) }
/* a ratio num / den of the STATUS_REPLY (den the sum of one or two fields) */
#define ST_RATIO(num, ...) .at = ST_OFF(num), .per = { __VA_ARGS__ }, .kind = S_RATIO
/* num's bytes per computed position since k3d started (both fields sent) */
#define ST_PER_TOKEN(num) ST_RATIO(num, ST_OFF(positions_total)), .has = { ST_HAS(num), ST_HAS(positions_total) }, \
	.digits = 1

/* The gateway's own totals (from the DONE frames it relayed). */
static const struct series gateway_series[] = {
	{ "k3_gateway_prefill_seconds_total", "counter",
	  "Prefill time of generations whose reply reached the client.", GW(prefill_s), .digits = 6 },
	{ "k3_gateway_decode_seconds_total", "counter",
	  "Decode time of generations whose reply reached the client.", GW(decode_s), .digits = 6 },
	{ "k3_gateway_expert_bytes_read_total", "counter",
	  "Expert bytes k3d read for the generations of this gateway (DONE, every reply).", GW(done_expert_bytes) },
	{ "k3_gateway_spine_bytes_read_total", "counter",
	  "Spine bytes k3d read for the generations of this gateway (DONE; 0 while k3d maps the spine).",
	  GW(done_spine_bytes) },
	{ "k3_gateway_cancels_total", "counter", "CANCELs sent to k3d because a client went away.",
	  GW(cancels_sent) },
	{ "k3_gateway_in_flight", "gauge",
	  "API requests now holding a k3d connection (the /health and /metrics probes are not counted).",
	  GW(in_flight) },
};

/* k3d's STATUS_REPLY at scrape time, in the order they are printed. */
static const struct series status_series[] = {
	{ "k3_daemon_state", "gauge", "k3d state (0 loading, 1 ready, 2 draining, 3 no model).", ST(state) },
	{ "k3_daemon_queue_depth", "gauge", "Generations waiting for the engine slot.", ST(queued) },
	{ "k3_daemon_running", "gauge", "Generations running now.", ST(running) },
	/* several sequences in one pass (k3d --parallel; absent from an older k3d) */
	{ "k3_daemon_parallel", "gauge", "Generations k3d advances together in one pass (--parallel seats).",
	  ST_SENT(parallel) },
	{ "k3_daemon_pass_width", "gauge", "Sequences in k3d's latest pass.", ST_SENT(pass_width) },
	{ "k3_daemon_pass_width_mean", "gauge", "Mean sequences per pass since k3d started.",
	  ST_SENT(pass_width_mean), .digits = 3 },
	{ "k3_daemon_passes_total", "counter",
	  "Forward passes k3d ran since it started (prefill chunks, decode and verification passes).",
	  ST_SENT(passes_total) },
	{ "k3_daemon_expert_bytes_read_total", "counter", "Expert weight bytes read from storage.",
	  ST(expert_bytes_read) },
	{ "k3_daemon_expert_cache_hit_ratio", "gauge", "Expert cache hits / lookups since k3d started.",
	  ST_RATIO(expert_hits, ST_OFF(expert_hits), ST_OFF(expert_misses)), .digits = 6 },
	{ "k3_daemon_prefill_seconds_total", "counter", "Prefill time, all clients.", ST(prefill_s_total),
	  .digits = 6 },
	{ "k3_daemon_decode_seconds_total", "counter", "Decode time, all clients.", ST(decode_s_total),
	  .digits = 6 },
	/* The expert store's counters since k3d started (docs/store.md
	 * "Counters"). Per-token and per-second figures are rate() of these in
	 * PromQL; the one gauge is the lifetime bytes read per computed token. */
	{ "k3_expert_bytes_read_total",
	  "counter", "Expert bytes read from storage (O_DIRECT alignment included): the ground truth.",
	  ST_EXPERT(expert_bytes_read) },
	{ "k3_expert_positions_total", "counter",
	  "Token positions the engine computed (uncached prompt positions plus decode steps).",
	  ST_EXPERT(positions_total) },
	{ "k3_expert_bytes_read_per_token", "gauge", "Expert bytes read / positions computed, since k3d started.",
	  ST_PER_TOKEN(expert_bytes_read) },
	{ "k3_expert_demand_hits_total", "counter",
	  "Routed experts found resident, not read for the same step (once per expert per step).",
	  ST_EXPERT(expert_hits) },
	{ "k3_expert_demand_misses_total", "counter",
	  "Routed experts that had to be read (a prefetch for the same step counts here).",
	  ST_EXPERT(expert_misses) },
	{ "k3_expert_prefetch_issued_total", "counter", "Prefetch (router lookahead) reads started.",
	  ST_EXPERT(prefetch_issued) },
	{ "k3_expert_prefetch_issued_bytes_total", "counter",
	  "Bytes of prefetch reads (part of k3_expert_bytes_read_total).", ST_EXPERT(prefetch_issued_bytes) },
	{ "k3_expert_prefetch_used_total", "counter", "Prefetched experts used by a later step.",
	  ST_EXPERT(prefetch_used) },
	{ "k3_expert_prefetch_wasted_bytes_total", "counter", "Bytes of prefetched experts evicted unused.",
	  ST_EXPERT(prefetch_wasted_bytes) },
	{ "k3_expert_io_wait_seconds_total", "counter", "Time generations waited for expert reads.",
	  ST_EXPERT(io_wait_s_total), .digits = 6 },
	{ "k3_expert_compute_seconds_total", "counter",
	  "Time generations spent on everything but waiting for expert reads.", ST_EXPERT(compute_s_total),
	  .digits = 6 },
	{ "k3_expert_cache_bytes", "gauge", "Size of k3d's RAM expert cache.", ST_EXPERT(expert_cache_bytes) },
	/* Several drives (issue 19): where the bytes went and how each drive
	 * reads (present only from a k3d that streams experts and sends them). */
	{ "k3_expert_demand_bytes_total", "counter",
	  "Expert bytes read on demand (hedged reads included); with prefetch used and wasted, all of "
	  "k3_expert_bytes_read_total.", ST_EXPERT(expert_demand_bytes) },
	{ "k3_expert_prefetch_used_bytes_total", "counter", "Bytes of prefetched experts a later step used.",
	  ST_EXPERT(prefetch_used_bytes) },
	{ "k3_expert_hedges_total", "counter", "Duplicate reads of another copy for a read past its drive's p95.",
	  ST_EXPERT(hedges) },
	{ "k3_expert_hedges_won_total", "counter", "Hedges that finished first.", ST_EXPERT(hedges_won) },
	{ "k3_drive_expert_bytes_read_total", "counter", "Expert bytes read from each drive.",
	  ST_EXPERT(drive_expert_bytes_read) },
	{ "k3_drive_expert_demand_bytes_total", "counter", "Expert bytes each drive read on demand.",
	  ST_EXPERT(drive_expert_demand_bytes) },
	{ "k3_drive_prefetch_used_bytes_total", "counter", "Prefetched bytes of each drive a later step used.",
	  ST_EXPERT(drive_prefetch_used_bytes) },
	{ "k3_drive_prefetch_wasted_bytes_total", "counter", "Prefetched bytes of each drive never used.",
	  ST_EXPERT(drive_prefetch_wasted_bytes) },
	{ "k3_drive_hedges_total", "counter", "Reads of each drive that ran past its p95 and were hedged.",
	  ST_EXPERT(drive_hedges) },
	{ "k3_drive_read_bytes_per_second", "gauge", "Each drive's measured read rate (0 before it has read).",
	  ST_EXPERT(drive_rate) },
	{ "k3_drive_read_p95_seconds", "gauge",
	  "The p95 of each drive's recent expert read times (0: too few reads).", ST_EXPERT(drive_p95_ns),
	  .scale = 1e-9 },
	/* the streamed spine (issue 17; absent while k3d maps it) */
	{ "k3_spine_bytes_read_total", "counter",
	  "Spine bytes read from storage since k3d became ready (streamed layers, head, embedding rows).",
	  ST_SENT(spine_bytes_read) },
	{ "k3_spine_bytes_read_per_token", "gauge", "Spine bytes read / positions computed, since k3d started.",
	  ST_PER_TOKEN(spine_bytes_read) },
	{ "k3_spine_loads_total", "counter", "Spine layers (and heads) read whole.", ST_SENT(spine_loads) },
	{ "k3_spine_memory_bytes", "gauge", "k3d's spine memory: resident prefix, ring of layer arenas, row scratch.",
	  ST_SENT(spine_memory_bytes) },
	/* Speculative decoding since k3d started (docs/draft.md): acceptance is
	 * accepted / proposed, tokens per pass completion tokens / passes (1.0
	 * without drafting); all there when decode_passes_total is. */
	{ "k3_daemon_draft_proposed_total", "counter", "Draft proposals the target verified.",
	  ST(draft_proposed_total), .has = { ST_HAS(decode_passes_total) } },
	{ "k3_daemon_draft_accepted_total", "counter", "Draft proposals equal to the target's own greedy id.",
	  ST(draft_accepted_total), .has = { ST_HAS(decode_passes_total) } },
	{ "k3_daemon_decode_passes_total", "counter",
	  "Target passes that produced generated ids (plain and verification).", ST_SENT(decode_passes_total) },
	{ "k3_daemon_draft_seconds_total", "counter", "Time in the draft (proposing).", ST(draft_s_total),
	  .has = { ST_HAS(decode_passes_total) }, .digits = 6 },
	{ "k3_daemon_verify_seconds_total", "counter", "Time in verification passes, commit included.",
	  ST(verify_s_total), .has = { ST_HAS(decode_passes_total) }, .digits = 6 },
	{ "k3_daemon_tokens_per_pass", "gauge",
	  "Generated tokens per target pass since k3d started (1 without drafting).",
	  ST_RATIO(completion_tokens_total, ST_OFF(decode_passes_total)), .has = { ST_HAS(decode_passes_total) },
	  .digits = 6 },
};

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
	render_series(out, m, gateway_series, sizeof(gateway_series) / sizeof(gateway_series[0]));
	metric_u64(out, "k3_gateway_daemon_up", "gauge",
		   "1 when k3d answered STATUS for this scrape.", st ? 1 : 0);
	if (st)
		render_series(out, st, status_series, sizeof(status_series) / sizeof(status_series[0]));
}

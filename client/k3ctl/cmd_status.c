/* cmd_status.c - `k3ctl status`: the daemon's state and counters, and
 * the running and queued jobs (their ids are what `k3ctl cancel` takes). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "client.h"
#include "json_fields.h"
#include "k3ctl.h"

static const char *state_name(uint32_t s)
{
	static const char *const names[] = { "loading", "ready", "draining", "no-model" };

	return s < 4 ? names[s] : "unknown";
}

static json_t *jstr(struct k3_proto_str s)
{
	return json_stringn(s.p ? s.p : "", s.len);
}

/* The reply's plain counters, "pid" to "prefetch_wasted_bytes", in
 * output order. */
#define F(key, member, t) \
	K3CTL_JSON_FIELD(key, struct k3_msg_status_reply, member, K3CTL_JSON_##t)
static const struct k3ctl_json_field counter_fields[] = {
	F("pid", pid, U32),
	F("uptime_s", uptime_s, F64),
	F("connections", connections, U32),
	F("running", running, U32),
	F("queued", queued, U32),
	F("queue_max", queue_max, U32),
	F("requests_total", requests_total, U64),
	F("prompt_tokens_total", prompt_tokens_total, U64),
	F("completion_tokens_total", completion_tokens_total, U64),
	F("expert_bytes_read", expert_bytes_read, U64),
	F("expert_hits", expert_hits, U64),
	F("expert_misses", expert_misses, U64),
	F("prefetch_issued", prefetch_issued, U64),
	F("prefetch_used", prefetch_used, U64),
	F("prefetch_wasted_bytes", prefetch_wasted_bytes, U64),
};
#undef F

static const char *job_state_name(uint32_t s)
{
	return s == K3_JOB_RUNNING ? "running" : s == K3_JOB_QUEUED ? "queued" : "unknown";
}

static const char *job_kind_name(uint32_t k)
{
	return k == K3_JOB_GENERATE ? "generate" : k == K3_JOB_WARM_EXPERTS ? "warm-experts" : "unknown";
}

/* How many jobs the reply lists: 0 when k3d sent no list, -1 when its
 * arrays do not pair up (refused, never guessed). */
static int job_count(const struct k3_msg_status_reply *s)
{
	uint32_t n = s->job_ids.n;

	if (!s->has_job_ids)
		return s->has_job_states || s->has_job_kinds || s->has_job_uids || s->has_job_pids ||
		       s->has_job_ages_ms ? -1 : 0;
	if (!s->has_job_states || !s->has_job_kinds || !s->has_job_uids || !s->has_job_pids ||
	    !s->has_job_ages_ms || s->job_states.n != n || s->job_kinds.n != n ||
	    s->job_uids.n != n || s->job_pids.n != n || s->job_ages_ms.n != n)
		return -1;
	return (int)n;
}

/* The job list as JSON objects (job ids for `k3ctl cancel`). */
static json_t *jobs_json(const struct k3_msg_status_reply *s, int n)
{
	json_t *a = json_array();

	for (uint32_t i = 0; i < (uint32_t)n; i++) {
		json_t *o = json_object();

		json_object_set_new(o, "id", json_integer((json_int_t)k3_proto_u64s_at(&s->job_ids, i)));
		json_object_set_new(o, "state", json_string(job_state_name(k3_proto_ids_at(&s->job_states, i))));
		json_object_set_new(o, "kind", json_string(job_kind_name(k3_proto_ids_at(&s->job_kinds, i))));
		json_object_set_new(o, "uid", json_integer(k3_proto_ids_at(&s->job_uids, i)));
		json_object_set_new(o, "pid", json_integer(k3_proto_ids_at(&s->job_pids, i)));
		json_object_set_new(o, "age_s",
				    json_real((double)k3_proto_u64s_at(&s->job_ages_ms, i) / 1e3));
		json_array_append_new(a, o);
	}
	return a;
}

static void jobs_print(const struct k3_msg_status_reply *s, int n)
{
	if (n <= 0)
		return;
	printf("jobs:        %-8s %-8s %-13s %-7s %-8s %s\n", "ID", "STATE", "KIND", "UID", "PID", "AGE");
	for (uint32_t i = 0; i < (uint32_t)n; i++)
		printf("             %-8llu %-8s %-13s %-7u %-8u %.1f s\n",
		       (unsigned long long)k3_proto_u64s_at(&s->job_ids, i),
		       job_state_name(k3_proto_ids_at(&s->job_states, i)),
		       job_kind_name(k3_proto_ids_at(&s->job_kinds, i)),
		       k3_proto_ids_at(&s->job_uids, i), k3_proto_ids_at(&s->job_pids, i),
		       (double)k3_proto_u64s_at(&s->job_ages_ms, i) / 1e3);
	if (n == (int)K3_LIM_STATUS_JOBS)
		printf("             (the first %u shown)\n", K3_LIM_STATUS_JOBS);
}

/* Drives in the reply: the length of its per-drive arrays (0: none). */
static uint32_t drive_count(const struct k3_msg_status_reply *s)
{
	return s->has_drive_expert_bytes_read ? s->drive_expert_bytes_read.n : 0;
}

static uint64_t at(const struct k3_proto_u64s *v, uint32_t i)
{
	return i < v->n ? k3_proto_u64s_at(v, i) : 0;
}

static uint32_t at32(const struct k3_proto_ids *v, uint32_t i)
{
	return i < v->n ? k3_proto_ids_at(v, i) : 0;
}

/* Several drives (docs/drives.md): where each drive's bytes went, its
 * measured rate and p95, its hedges, what it holds. */
static json_t *drives_json(const struct k3_msg_status_reply *s)
{
	json_t *a = json_array();

	for (uint32_t d = 0; d < drive_count(s); d++)
		json_array_append_new(a, json_pack("{s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:b,s:I}",
			"expert_bytes_read", (json_int_t)at(&s->drive_expert_bytes_read, d),
			"demand_bytes", (json_int_t)at(&s->drive_expert_demand_bytes, d),
			"prefetch_used_bytes", (json_int_t)at(&s->drive_prefetch_used_bytes, d),
			"prefetch_wasted_bytes", (json_int_t)at(&s->drive_prefetch_wasted_bytes, d),
			"spine_bytes_read", (json_int_t)at(&s->drive_spine_bytes_read, d),
			"hedges", (json_int_t)at(&s->drive_hedges, d),
			"hedges_won", (json_int_t)at(&s->drive_hedges_won, d),
			"rate_bytes_per_s", (json_int_t)at(&s->drive_rate, d),
			"p95_ns", (json_int_t)at(&s->drive_p95_ns, d),
			"prefetch_on", at32(&s->drive_prefetch_on, d) != 0,
			"experts", (json_int_t)at32(&s->drive_experts, d)));
	return a;
}

static void drives_print(const struct k3_msg_status_reply *s)
{
	if (s->has_expert_demand_bytes)
		printf("bytes read:  experts %llu = demand %llu + prefetch used %llu + prefetch wasted"
		       " %llu%s\n", (unsigned long long)s->expert_bytes_read,
		       (unsigned long long)s->expert_demand_bytes,
		       (unsigned long long)s->prefetch_used_bytes,
		       (unsigned long long)s->prefetch_wasted_bytes,
		       s->expert_bytes_read == s->expert_demand_bytes + s->prefetch_used_bytes +
		       s->prefetch_wasted_bytes ? "" : " (a request is running)");
	if (s->has_spine_demand_bytes)
		printf("             spine %llu = demand %llu + wasted %llu\n",
		       (unsigned long long)s->spine_bytes_read, (unsigned long long)s->spine_demand_bytes,
		       (unsigned long long)s->spine_wasted_bytes);
	for (uint32_t d = 0; d < drive_count(s); d++) {
		uint64_t p95 = at(&s->drive_p95_ns, d);
		printf("drive %u:     %llu expert bytes (demand %llu, prefetch used %llu, wasted %llu),"
		       " %llu spine bytes; %.2f GB/s measured, p95 %s%.1f ms; %llu reads hedged (%llu won"
		       " by another copy); %u experts; prefetch %s\n", d,
		       (unsigned long long)at(&s->drive_expert_bytes_read, d),
		       (unsigned long long)at(&s->drive_expert_demand_bytes, d),
		       (unsigned long long)at(&s->drive_prefetch_used_bytes, d),
		       (unsigned long long)at(&s->drive_prefetch_wasted_bytes, d),
		       (unsigned long long)at(&s->drive_spine_bytes_read, d),
		       (double)at(&s->drive_rate, d) / 1e9, p95 ? "" : "(too few reads) ",
		       (double)p95 / 1e6, (unsigned long long)at(&s->drive_hedges, d),
		       (unsigned long long)at(&s->drive_hedges_won, d), at32(&s->drive_experts, d),
		       at32(&s->drive_prefetch_on, d) ? "on" : "off (its guesses did not pay)");
	}
	if (s->has_prefill_chunk)
		printf("prefill:     up to %u positions per pass\n", s->prefill_chunk);
}

/* Generated tokens per target pass over every finished generation (1.0
 * without drafting; docs/draft.md). */
static double tokens_per_pass(const struct k3_msg_status_reply *s)
{
	return s->decode_passes_total ? (double)s->completion_tokens_total /
					(double)s->decode_passes_total : 0.0;
}

int k3ctl_cmd_status(int argc, char **argv)
{
	struct k3ctl_client c;
	struct k3_msg_status req;
	struct k3_proto_header h;
	union k3_proto_body reply;
	const struct k3_msg_status_reply *s = &reply.status_reply;
	struct k3_err err = { 0, "" };
	int r;

	(void)argv;
	if (argc > 1)
		return k3ctl_usage("status", "takes no arguments");
	if ((r = k3ctl_connect(&c)) != 0)
		return r;
	memset(&req, 0, sizeof(req));
	r = k3ctl_client_call(&c, K3_MSG_STATUS, &req, 10000, &h, &reply, NULL, &err);
	if (r < 0 || h.type != K3_MSG_STATUS_REPLY) {
		k3ctl_client_close(&c);
		return k3ctl_fail(K3CTL_EXIT_ERROR, "status: %s", r < 0 ? err.msg : "unexpected reply");
	}
	int n_jobs = job_count(s);
	if (n_jobs < 0) {
		k3ctl_client_close(&c);
		return k3ctl_fail(K3CTL_EXIT_ERROR, "status: k3d sent a job list whose fields do not pair up");
	}
	if (k3ctl_g.json) {
		json_t *o = json_object();

		json_object_set_new(o, "version", jstr(s->version));
		json_object_set_new(o, "state", json_string(state_name(s->state)));
		json_object_set_new(o, "status", jstr(s->status_text));
		json_object_set_new(o, "model", s->has_model ? jstr(s->model) : json_null());
		if (s->has_spine) {
			json_object_set_new(o, "spine", json_string(s->spine == K3_SPINE_BF16 ? "bf16" :
				s->spine == K3_SPINE_INT8 ? "int8" : "other"));
			json_object_set_new(o, "weight_exact", json_boolean(s->spine == K3_SPINE_BF16));
			if (s->has_spine_label)
				json_object_set_new(o, "spine_label", jstr(s->spine_label));
		}
		k3ctl_json_set_fields(o, s, counter_fields,
				      sizeof(counter_fields) / sizeof(counter_fields[0]));
		if (s->has_prefetch_issued_bytes)
			json_object_set_new(o, "prefetch_issued_bytes",
					    json_integer((json_int_t)s->prefetch_issued_bytes));
		if (s->has_expert_cache_bytes)
			json_object_set_new(o, "expert_cache_bytes",
					    json_integer((json_int_t)s->expert_cache_bytes));
		if (s->has_positions_total)
			json_object_set_new(o, "positions_total", json_integer((json_int_t)s->positions_total));
		if (s->has_io_wait_s_total)
			json_object_set_new(o, "io_wait_s_total", json_real(s->io_wait_s_total));
		if (s->has_compute_s_total)
			json_object_set_new(o, "compute_s_total", json_real(s->compute_s_total));
		/* the streamed spine, apart from the experts (absent: mapped) */
		if (s->has_spine_bytes_read) {
			json_object_set_new(o, "spine_bytes_read",
					    json_integer((json_int_t)s->spine_bytes_read));
			json_object_set_new(o, "spine_loads", json_integer((json_int_t)s->spine_loads));
			json_object_set_new(o, "spine_memory_bytes",
					    json_integer((json_int_t)s->spine_memory_bytes));
			json_object_set_new(o, "spine_io_wait_s_total",
					    json_real(s->spine_io_wait_s_total));
		}
		if (s->has_expert_demand_bytes) {
			json_object_set_new(o, "expert_demand_bytes",
					    json_integer((json_int_t)s->expert_demand_bytes));
			json_object_set_new(o, "prefetch_used_bytes",
					    json_integer((json_int_t)s->prefetch_used_bytes));
			json_object_set_new(o, "hedges", json_integer((json_int_t)s->hedges));
			json_object_set_new(o, "hedges_won", json_integer((json_int_t)s->hedges_won));
		}
		if (s->has_spine_demand_bytes) {
			json_object_set_new(o, "spine_demand_bytes",
					    json_integer((json_int_t)s->spine_demand_bytes));
			json_object_set_new(o, "spine_wasted_bytes",
					    json_integer((json_int_t)s->spine_wasted_bytes));
		}
		if (s->has_prefill_chunk)
			json_object_set_new(o, "prefill_chunk", json_integer(s->prefill_chunk));
		if (s->has_parallel) {
			json_object_set_new(o, "parallel", json_integer(s->parallel));
			json_object_set_new(o, "pass_width", json_integer(s->pass_width));
			json_object_set_new(o, "pass_width_mean", json_real(s->pass_width_mean));
			json_object_set_new(o, "passes_total", json_integer((json_int_t)s->passes_total));
		}
		json_object_set_new(o, "drives", drive_count(s) ? drives_json(s) : json_null());
		if (s->has_peak_rss_bytes)
			json_object_set_new(o, "peak_rss_bytes", json_integer((json_int_t)s->peak_rss_bytes));
		if (s->has_memory_limit_bytes) {
			json_t *m = json_object();
			json_object_set_new(m, "limit_bytes", json_integer((json_int_t)s->memory_limit_bytes));
			json_object_set_new(m, "spine_layers", json_integer(s->spine_layers));
			json_object_set_new(m, "spine_resident_layers", json_integer(s->spine_resident_layers));
			json_object_set_new(m, "spine_resident_bytes",
					    json_integer((json_int_t)s->spine_resident_bytes));
			json_object_set_new(m, "spine_ring_bytes", json_integer((json_int_t)s->spine_ring_bytes));
			json_object_set_new(m, "state_bytes", json_integer((json_int_t)s->state_bytes));
			json_object_set_new(m, "expert_cache_bytes",
					    json_integer((json_int_t)s->expert_cache_bytes));
			json_object_set_new(o, "memory_plan", m);
		}
		if (s->has_decode_passes_total)
			json_object_set_new(o, "draft", json_pack("{s:I,s:I,s:I,s:f,s:f,s:f}",
					    "proposed", (json_int_t)s->draft_proposed_total,
					    "accepted", (json_int_t)s->draft_accepted_total,
					    "passes", (json_int_t)s->decode_passes_total,
					    "tokens_per_pass", tokens_per_pass(s),
					    "draft_s", s->draft_s_total, "verify_s", s->verify_s_total));
		/* null: a k3d that does not list jobs */
		json_object_set_new(o, "jobs", s->has_job_ids ? jobs_json(s, n_jobs) : json_null());
		k3ctl_json_puts(o, JSON_COMPACT | JSON_PRESERVE_ORDER, "{}");
	} else {
		printf("k3d %.*s, pid %u, up %.1f s\n", (int)s->version.len, s->version.p, s->pid, s->uptime_s);
		/* The status text only adds something when it is not the state's name. */
		bool text = s->has_status_text && s->status_text.len &&
			    !(s->status_text.len == strlen(state_name(s->state)) &&
			      memcmp(s->status_text.p, state_name(s->state), s->status_text.len) == 0);

		printf("state:       %s%s%.*s\n", state_name(s->state), text ? " - " : "",
		       text ? (int)s->status_text.len : 0, text ? s->status_text.p : "");
		printf("model:       %.*s\n", s->has_model ? (int)s->model.len : 6,
		       s->has_model ? s->model.p : "(none)");
		if (s->has_spine && s->spine == K3_SPINE_BF16)
			printf("spine:       bf16 (the checkpoint's weights)\n");
		else if (s->has_spine)
			printf("spine:       %.*s\n", s->has_spine_label ? (int)s->spine_label.len : 16,
			       s->has_spine_label ? s->spine_label.p : "not weight-exact");
		printf("connections: %u\n", s->connections);
		printf("generation:  %u running, %u/%u queued\n", s->running, s->queued, s->queue_max);
		if (s->has_parallel)
			printf("passes:      %u seat%s (--parallel); %llu passes, %.2f sequences per pass "
			       "on average, %u in the latest\n", s->parallel, s->parallel == 1 ? "" : "s",
			       (unsigned long long)s->passes_total, s->pass_width_mean, s->pass_width);
		jobs_print(s, n_jobs);
		if (s->has_requests_total)
			printf("requests:    %llu (prompt %llu tokens, completion %llu tokens)\n",
			       (unsigned long long)s->requests_total,
			       (unsigned long long)s->prompt_tokens_total,
			       (unsigned long long)s->completion_tokens_total);
		if (s->has_expert_bytes_read)
			printf("experts:     %llu bytes read, %llu hits, %llu misses\n",
			       (unsigned long long)s->expert_bytes_read, (unsigned long long)s->expert_hits,
			       (unsigned long long)s->expert_misses);
		if (s->has_prefetch_issued)
			printf("prefetch:    %llu issued (%llu bytes), %llu used in a later step, "
			       "%llu bytes wasted\n",
			       (unsigned long long)s->prefetch_issued,
			       (unsigned long long)s->prefetch_issued_bytes,
			       (unsigned long long)s->prefetch_used,
			       (unsigned long long)s->prefetch_wasted_bytes);
		if (s->has_expert_cache_bytes)
			printf("expert cache: %.3f GB\n", (double)s->expert_cache_bytes / 1e9);
		if (s->has_spine_bytes_read)
			printf("spine reads: %llu bytes read (%llu layers loaded), %.3f GB of memory\n", (unsigned long long)s->spine_bytes_read,
			       (unsigned long long)s->spine_loads, (double)s->spine_memory_bytes / 1e9);
		if (s->has_expert_bytes_read && s->has_positions_total && s->positions_total)
			printf("per token:   %.0f expert bytes read over %llu positions computed\n",
			       (double)s->expert_bytes_read / (double)s->positions_total,
			       (unsigned long long)s->positions_total);
		if (s->has_spine_bytes_read && s->has_positions_total && s->positions_total)
			printf("per token:   %.0f spine bytes read over %llu positions computed\n",
			       (double)s->spine_bytes_read / (double)s->positions_total,
			       (unsigned long long)s->positions_total);
		if (s->has_io_wait_s_total && s->has_compute_s_total && s->has_spine_io_wait_s_total)
			printf("engine time: %.3f s waiting for reads (%.3f s of it for the spine),"
			       " %.3f s computing\n", s->io_wait_s_total, s->spine_io_wait_s_total,
			       s->compute_s_total);
		else if (s->has_io_wait_s_total && s->has_compute_s_total)
			printf("engine time: %.3f s waiting for expert reads, %.3f s computing\n",
			       s->io_wait_s_total, s->compute_s_total);
		drives_print(s);
		if (s->has_peak_rss_bytes)
			printf("peak RSS:    %.3f GB (VmHWM)%s\n", (double)s->peak_rss_bytes / 1e9,
			       s->has_memory_limit_bytes && s->peak_rss_bytes > s->memory_limit_bytes
			       ? ", above the memory limit" : "");
		if (s->has_memory_limit_bytes) {
			char pre[48];
			if (s->spine_resident_layers)
				snprintf(pre, sizeof(pre), "layers 0..%u of %u", s->spine_resident_layers - 1,
					 s->spine_layers);
			else
				snprintf(pre, sizeof(pre), "no layer of %u", s->spine_layers);
			printf("memory plan: limit %.3f GB = spine %.3f GB resident (%s) + ring %.3f GB + "
			       "expert cache %.3f GB + state %.3f GB + scratch and headroom\n",
			       (double)s->memory_limit_bytes / 1e9, (double)s->spine_resident_bytes / 1e9,
			       pre, (double)s->spine_ring_bytes / 1e9, (double)s->expert_cache_bytes / 1e9,
			       (double)s->state_bytes / 1e9);
		}
		if (s->has_decode_passes_total)
			printf("drafting:    %llu proposed, %llu accepted (%.1f %%); %llu passes, "
			       "%.2f tokens/pass; draft %.3f s, verify %.3f s\n",
			       (unsigned long long)s->draft_proposed_total,
			       (unsigned long long)s->draft_accepted_total,
			       s->draft_proposed_total ? 100.0 * (double)s->draft_accepted_total /
							 (double)s->draft_proposed_total : 0.0,
			       (unsigned long long)s->decode_passes_total, tokens_per_pass(s),
			       s->draft_s_total, s->verify_s_total);
	}
	k3ctl_client_close(&c);
	return K3CTL_EXIT_OK;
}

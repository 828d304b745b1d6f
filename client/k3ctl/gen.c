/*
 * gen.c - one streamed generation for `k3ctl run` and `k3ctl chat` (see
 * gen.h). Content goes to stdout as it arrives; reasoning goes to stderr
 * (dimmed on a terminal).
 */
#include "gen.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/parse.h"
#include "json_fields.h"
#include "k3ctl.h"

volatile sig_atomic_t k3ctl_gen_interrupted;

static void on_sigint(int sig)
{
	(void)sig;
	k3ctl_gen_interrupted = 1;
}

static void append(char **buf, size_t *len, const char *p, size_t n)
{
	char *b = realloc(*buf, *len + n + 1);

	if (!b)
		return;
	memcpy(b + *len, p, n);
	*len += n;
	b[*len] = '\0';
	*buf = b;
}

static double now_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

void k3ctl_gen_release(struct k3ctl_gen_result *r)
{
	json_decref(r->ids);
	json_decref(r->tool_calls);
	free(r->text);
	free(r->reasoning);
	memset(r, 0, sizeof(*r));
}

const char *k3ctl_gen_finish_name(uint32_t f)
{
	static const char *const names[] = { "stop", "length", "cancelled", "error", "tool_calls" };

	return f < 5 ? names[f] : "unknown";
}

int k3ctl_gen_run(struct k3ctl_client *c, const struct k3ctl_gen_opts *o, const char *prompt,
		  const char *messages_json, struct k3ctl_gen_result *res)
{
	struct k3_msg_generate g;
	struct k3_proto_header h;
	union k3_proto_body b;
	struct k3_err err = { 0, "" };
	bool tty_err = isatty(2), cancel_sent = false, in_reasoning = false;
	double t_first = 0, t_start = now_s();
	uint32_t rid, n_tokens = 0;
	int r;

	memset(res, 0, sizeof(*res));
	res->ids = json_array();
	res->tool_calls = json_array();
	memset(&g, 0, sizeof(g));
	k3_msg_generate_set_mode(&g, o->chat ? K3_MODE_CHAT : K3_MODE_RAW);
	if (o->chat)
		k3_msg_generate_set_messages(&g, k3_proto_str_of(messages_json));
	else if (o->n_prompt_ids)
		k3_msg_generate_set_prompt_ids(&g, (struct k3_proto_ids){ o->n_prompt_ids, o->prompt_ids, NULL });
	else
		k3_msg_generate_set_prompt(&g, k3_proto_str_of(prompt));
	if (o->has_max_new)
		k3_msg_generate_set_max_new(&g, o->max_new);
	if (o->n_stop) {
		struct k3_proto_strv stop = { .n = o->n_stop };

		for (uint32_t i = 0; i < o->n_stop; i++)
			stop.v[i] = k3_proto_str_of(o->stop[i]);
		k3_msg_generate_set_stop(&g, stop);
	}
	if (o->effort)
		k3_msg_generate_set_reasoning_effort(&g, o->effort);
	if (o->draft)
		k3_msg_generate_set_draft_policy(&g, o->draft);
	r = k3ctl_client_send(c, K3_MSG_GENERATE, &g, &rid, &err);
	if (r < 0)   /* -EINVAL: the request does not encode (too large): not the daemon's fault */
		return k3ctl_fail(r == -EINVAL ? K3CTL_EXIT_ERROR : K3CTL_EXIT_UNAVAILABLE, "%s", err.msg);
	for (;;) {
		if (k3ctl_gen_interrupted && !cancel_sent && res->job_id) {
			struct k3_msg_cancel cm;

			memset(&cm, 0, sizeof(cm));
			k3_msg_cancel_set_job_id(&cm, res->job_id);
			cancel_sent = true;
			if (k3ctl_client_send(c, K3_MSG_CANCEL, &cm, NULL, &err) < 0)
				return k3ctl_fail(K3CTL_EXIT_UNAVAILABLE, "%s", err.msg);
		}
		r = k3ctl_client_recv(c, -1, &h, &b, &err);
		if (r == -EINTR)
			continue;   /* Ctrl-C: the CANCEL goes out at the top */
		if (r < 0)
			return k3ctl_fail(r == -ECONNRESET ? K3CTL_EXIT_UNAVAILABLE : K3CTL_EXIT_ERROR,
					  "%s", err.msg);
		if (h.request_id != rid && h.type != K3_MSG_OK && h.type != K3_MSG_ERROR)
			continue;
		switch (h.type) {
		case K3_MSG_ACCEPTED:
			/* The id 'k3ctl cancel' takes; printed once, at the first ACCEPTED. */
			if (o->stats && !res->job_id)
				fprintf(stderr, "[job %llu]\n", (unsigned long long)b.accepted.job_id);
			res->job_id = b.accepted.job_id;
			if (b.accepted.queue_position > 0 && o->stats)
				fprintf(stderr, "[queued at position %u, job %llu]\n", b.accepted.queue_position,
					(unsigned long long)b.accepted.job_id);
			break;
		case K3_MSG_PROGRESS:
			if (o->stats && tty_err)
				fprintf(stderr, "\r[prefill %u/%u]", b.progress.done, b.progress.total);
			break;
		case K3_MSG_TOKEN: {
			const struct k3_msg_token *t = &b.token;
			bool reasoning = t->has_channel && t->channel == K3_CHANNEL_REASONING;

			if (!t_first)
				t_first = now_s();
			for (uint32_t i = 0; i < t->ids.n; i++)
				json_array_append_new(res->ids, json_integer(k3_proto_ids_at(&t->ids, i)));
			n_tokens += t->ids.n;
			if (t->has_text && t->text.len) {
				if (reasoning) {
					append(&res->reasoning, &res->reasoning_len, t->text.p, t->text.len);
					if (!o->json && !o->quiet_reasoning) {
						if (tty_err && !in_reasoning)
							fputs("\033[2m", stderr);
						fwrite(t->text.p, 1, t->text.len, stderr);
						in_reasoning = true;
					}
				} else {
					append(&res->text, &res->text_len, t->text.p, t->text.len);
					if (!o->json) {
						if (in_reasoning) {
							fputs(tty_err ? "\033[0m\n" : "\n", stderr);
							in_reasoning = false;
						}
						fwrite(t->text.p, 1, t->text.len, stdout);
						fflush(stdout);
					}
				}
			}
			if (o->stats && tty_err && n_tokens > 1) {
				double dt = now_s() - t_first;

				fprintf(stderr, "\r\033[K[%u tokens, %.2f tok/s]", n_tokens,
					dt > 0 ? (double)(n_tokens - 1) / dt : 0.0);
			}
			break;
		}
		case K3_MSG_TOOL_CALL: {
			const struct k3_msg_tool_call *t = &b.tool_call;
			json_t *call = json_array_get(res->tool_calls, t->index);

			if (!call) {
				call = json_pack("{s:s%,s:s,s:{s:s%,s:s}}", "id", t->id.p ? t->id.p : "",
						 (size_t)t->id.len, "type", "function", "function", "name",
						 t->name.p ? t->name.p : "", (size_t)t->name.len, "arguments", "");
				json_array_append_new(res->tool_calls, call);
			}
			if (t->has_arguments && call) {
				json_t *fn = json_object_get(call, "function");
				json_t *old = json_object_get(fn, "arguments");
				char *joined = NULL;
				size_t jl = 0;

				/* lengths, not strlen: arguments may hold U+0000 */
				append(&joined, &jl, old ? json_string_value(old) : "",
				       old ? json_string_length(old) : 0);
				append(&joined, &jl, t->arguments.p, t->arguments.len);
				if (joined)
					json_object_set_new(fn, "arguments", json_stringn(joined, jl));
				free(joined);
			}
			break;
		}
		case K3_MSG_DONE:
			res->done = b.done;
			res->done.spine_label = k3_proto_str_of(NULL);
			snprintf(res->spine_label, sizeof(res->spine_label), "%.*s",
				 b.done.has_spine_label ? (int)b.done.spine_label.len : 0,
				 b.done.has_spine_label ? b.done.spine_label.p : "");
			res->got_done = true;
			if (in_reasoning)
				fputs(tty_err ? "\033[0m\n" : "\n", stderr);
			if (o->stats && tty_err)
				fputs("\r\033[K", stderr);
			(void)t_start;
			return 0;
		case K3_MSG_ERROR:
			if (h.request_id != rid)
				break;   /* e.g. CANCEL raced with the end */
			res->error_status = b.error.status;
			snprintf(res->error, sizeof(res->error), "%.*s", (int)b.error.message.len,
				 b.error.message.p);
			if (in_reasoning)
				fputs(tty_err ? "\033[0m\n" : "\n", stderr);
			/* busy, draining or still loading: try again later (3),
			 * what the gateway answers 429/503 for */
			return k3ctl_fail(b.error.status == K3_STATUS_BUSY ||
					  b.error.status == K3_STATUS_SHUTTING_DOWN ||
					  b.error.status == K3_STATUS_NOT_READY ? K3CTL_EXIT_UNAVAILABLE :
					  K3CTL_EXIT_ERROR, "%s (%s)", res->error,
					  k3_proto_status_name(b.error.status));
		default:
			break;
		}
	}
}

static void print_stats(const struct k3ctl_gen_result *r)
{
	const struct k3_msg_done *d = &r->done;

	/* a spine that is not the checkpoint's weights says so first */
	if (r->spine_label[0])
		fprintf(stderr, "[%s] ", r->spine_label);
	else if (d->has_spine && d->spine != K3_SPINE_BF16)
		fprintf(stderr, "[spine %u: not weight-exact] ", d->spine);
	fprintf(stderr,
		"[%s] prompt %u tokens (%u cached), completion %u (%u reasoning); queued %.3f s, "
		"prefill %.3f s (%.1f tok/s), decode %.3f s (%.2f tok/s), first token %.3f s; ",
		k3ctl_gen_finish_name(d->finish), d->prompt_tokens, d->cached_tokens,
		d->completion_tokens, d->reasoning_tokens, d->queued_s, d->prefill_s, d->prefill_tps,
		d->decode_s, d->decode_tps, d->ttft_s);
	/* several sequences in one pass (k3d --parallel) */
	if (d->shared_passes)
		fprintf(stderr, "shared %llu passes (mean width %.2f); ",
			(unsigned long long)d->shared_passes, d->pass_width_mean);
	/* Absent counters are unknown, not zero. */
	if (d->has_expert_bytes_read)
		fprintf(stderr, "experts: %llu bytes read, %llu hits, %llu misses, prefetch %llu issued / "
			"%llu used", (unsigned long long)d->expert_bytes_read,
			(unsigned long long)d->expert_hits, (unsigned long long)d->expert_misses,
			(unsigned long long)d->prefetch_issued, (unsigned long long)d->prefetch_used);
	else
		fputs("experts: not reported", stderr);
	/* The streamed spine's bytes, apart (absent: the spine is mapped). */
	if (d->has_spine_bytes_read)
		fprintf(stderr, "; spine: %llu bytes read (%llu layers, %llu embedding rows), %.3f s"
			" waited\n", (unsigned long long)d->spine_bytes_read,
			(unsigned long long)d->spine_loads, (unsigned long long)d->spine_rows_read,
			d->spine_io_wait_s);
	else
		fputs("\n", stderr);
	/* The prefill's cost against one read of each distinct expert. */
	if (d->has_prefill_distinct_experts && d->prefill_distinct_experts && d->expert_span_bytes)
		fprintf(stderr, "[prefill] %u positions per pass: %llu expert bytes read for %llu"
			" distinct experts of %llu bytes: %.3f x one read of each\n", d->prefill_chunk,
			(unsigned long long)d->prefill_expert_bytes,
			(unsigned long long)d->prefill_distinct_experts,
			(unsigned long long)d->expert_span_bytes,
			(double)d->prefill_expert_bytes /
			((double)d->prefill_distinct_experts * (double)d->expert_span_bytes));
	if (d->has_drive_expert_bytes_read && d->drive_expert_bytes_read.n > 1)
		for (uint32_t i = 0; i < d->drive_expert_bytes_read.n; i++)
			fprintf(stderr, "[drive %u] %llu expert bytes, %llu hedged\n", i,
				(unsigned long long)k3_proto_u64s_at(&d->drive_expert_bytes_read, i),
				(unsigned long long)(i < d->drive_hedges.n
						     ? k3_proto_u64s_at(&d->drive_hedges, i) : 0));
	if (d->has_decode_passes)
		fprintf(stderr, "[draft %s] %llu proposed, %llu accepted; %llu passes, %.2f tokens/pass; "
			"draft %.3f s, verify %.3f s\n", k3_proto_draft_policy_name(d->draft_policy),
			(unsigned long long)d->draft_proposed, (unsigned long long)d->draft_accepted,
			(unsigned long long)d->decode_passes, d->tokens_per_pass, d->draft_s, d->verify_s);
}

static json_t *result_json(const struct k3ctl_gen_result *r)
{
	const struct k3_msg_done *d = &r->done;

	/* s% (pointer and length): the model's text may hold U+0000 */
	json_t *j = json_pack("{s:I,s:s%,s:s%,s:O,s:O,s:s,s:{s:i,s:i,s:i,s:i},"
			 "s:{s:f,s:f,s:f,s:f,s:f,s:f},s:{s:I,s:I,s:I,s:I,s:I,s:I}}",
			 "job_id", (json_int_t)r->job_id,
			 "text", r->text ? r->text : "", r->text_len,
			 "reasoning", r->reasoning ? r->reasoning : "", r->reasoning_len,
			 "ids", r->ids, "tool_calls", r->tool_calls,
			 "finish", k3ctl_gen_finish_name(d->finish),
			 "usage", "prompt_tokens", (int)d->prompt_tokens, "completion_tokens",
			 (int)d->completion_tokens, "reasoning_tokens", (int)d->reasoning_tokens,
			 "cached_tokens", (int)d->cached_tokens,
			 "timings", "queued_s", d->queued_s, "prefill_s", d->prefill_s, "decode_s",
			 d->decode_s, "prefill_tps", d->prefill_tps, "decode_tps", d->decode_tps,
			 "ttft_s", d->ttft_s, "experts", "bytes_read", (json_int_t)d->expert_bytes_read, "hits",
			 (json_int_t)d->expert_hits, "misses", (json_int_t)d->expert_misses,
			 "prefetch_issued", (json_int_t)d->prefetch_issued, "prefetch_used",
			 (json_int_t)d->prefetch_used, "prefetch_wasted_bytes",
			 (json_int_t)d->prefetch_wasted_bytes);

	if (j && !d->has_expert_bytes_read)
		json_object_set_new(j, "experts", json_null());   /* unknown, not zero */
	if (j && d->has_prefill_distinct_experts)
		json_object_set_new(j, "prefill", json_pack("{s:i,s:I,s:I,s:I}", "chunk",
			(int)d->prefill_chunk, "expert_bytes_read", (json_int_t)d->prefill_expert_bytes,
			"distinct_experts", (json_int_t)d->prefill_distinct_experts, "span_bytes",
			(json_int_t)d->expert_span_bytes));
	if (j) {
		/* absent from an older k3d: the BF16 spine */
		uint32_t sp = d->has_spine ? d->spine : K3_SPINE_BF16;
		json_object_set_new(j, "spine", json_string(sp == K3_SPINE_BF16 ? "bf16" :
							    sp == K3_SPINE_INT8 ? "int8" : "other"));
		json_object_set_new(j, "weight_exact", json_boolean(sp == K3_SPINE_BF16));
		if (r->spine_label[0])
			json_object_set_new(j, "spine_label", json_string(r->spine_label));
	}
	/* the streamed spine's reads (absent: the spine is mapped) */
	if (j)
		json_object_set_new(j, "spine_io", d->has_spine_bytes_read
			? json_pack("{s:I,s:I,s:I,s:f}", "bytes_read", (json_int_t)d->spine_bytes_read,
				    "loads", (json_int_t)d->spine_loads, "rows_read",
				    (json_int_t)d->spine_rows_read, "io_wait_s", d->spine_io_wait_s)
			: json_null());
	if (j && d->has_decode_passes)
		json_object_set_new(j, "draft", json_pack("{s:s,s:I,s:I,s:I,s:f,s:f,s:f}", "policy",
				    k3_proto_draft_policy_name(d->draft_policy), "proposed",
				    (json_int_t)d->draft_proposed, "accepted", (json_int_t)d->draft_accepted,
				    "passes", (json_int_t)d->decode_passes, "tokens_per_pass",
				    d->tokens_per_pass, "draft_s", d->draft_s, "verify_s", d->verify_s));
	return j;
}

static int parse_ids(const char *s, struct k3ctl_gen_opts *o)
{
	size_t cap = 1;

	for (const char *p = s; *p; p++)
		cap += *p == ',';
	if (cap > K3_LIM_IDS_MAX)
		return -E2BIG;
	o->prompt_ids = calloc(cap, sizeof(uint32_t));
	if (!o->prompt_ids)
		return -ENOMEM;
	while (*s) {
		char num[16];
		size_t n = strcspn(s, ",");
		uint64_t v;

		if (n == 0 || n >= sizeof(num))
			return -EINVAL;
		memcpy(num, s, n);
		num[n] = '\0';
		if (k3_parse_u64(num, 0, UINT32_MAX, &v, NULL) < 0)
			return -EINVAL;
		o->prompt_ids[o->n_prompt_ids++] = (uint32_t)v;
		s += n;
		if (*s == ',')
			s++;
	}
	return o->n_prompt_ids ? 0 : -EINVAL;
}

/* run's and chat's options, listed once: (id, --name, getopt_long's
 * has_arg) make both the ids and the getopt_long table. */
#define GEN_OPTIONS(X) \
	X(O_MAX_NEW, "max-new", required_argument) \
	X(O_STOP, "stop", required_argument) \
	X(O_EFFORT, "reasoning-effort", required_argument) \
	X(O_STATS, "stats", no_argument) \
	X(O_IDS, "ids", no_argument) \
	X(O_CHAT, "chat", no_argument) \
	X(O_PROMPT_IDS, "prompt-ids", required_argument) \
	X(O_NO_REASONING, "hide-reasoning", no_argument) \
	X(O_DRAFT, "draft", required_argument)

int k3ctl_gen_parse_opts(const char *cmd, int argc, char **argv, struct k3ctl_gen_opts *o)
{
	/* ids above 255, so none is a character getopt_long returns */
#define GEN_ID_(id, name, has_arg) id,
	enum { O_BEFORE_FIRST_ = 255, GEN_OPTIONS(GEN_ID_) };
#undef GEN_ID_
#define GEN_ROW_(id, name, has_arg) { name, has_arg, NULL, id },
	static const struct option longopts[] = { GEN_OPTIONS(GEN_ROW_) { NULL, 0, NULL, 0 } };
#undef GEN_ROW_
	uint64_t v;
	int c;

	memset(o, 0, sizeof(*o));
	o->json = k3ctl_g.json;
	o->max_new = 128;
	o->has_max_new = true;
	opterr = 0;
	optind = 1;
	/* A leading ':' makes a missing value ':' rather than '?' (unknown). */
	while ((c = getopt_long(argc, argv, ":", longopts, NULL)) != -1) {
		switch (c) {
		case O_MAX_NEW:
			if (k3_parse_u64(optarg, 0, K3_LIM_MAX_NEW, &v, NULL) < 0)
				return -k3ctl_usage(cmd, "--max-new needs a number 0..%u", K3_LIM_MAX_NEW);
			o->max_new = (uint32_t)v;
			break;
		case O_STOP:
			if (o->n_stop == K3_LIM_STOP_COUNT)
				return -k3ctl_usage(cmd, "at most %u --stop strings", K3_LIM_STOP_COUNT);
			if (!*optarg || strlen(optarg) > K3_LIM_STOP_BYTES ||
			    !k3_proto_utf8_valid(optarg, strlen(optarg)))
				return -k3ctl_usage(cmd, "--stop needs 1..%u bytes of UTF-8", K3_LIM_STOP_BYTES);
			o->stop[o->n_stop++] = optarg;
			break;
		case O_EFFORT:
			if (strcmp(optarg, "none") == 0) o->effort = K3_EFFORT_NONE;
			else if (strcmp(optarg, "low") == 0) o->effort = K3_EFFORT_LOW;
			else if (strcmp(optarg, "high") == 0) o->effort = K3_EFFORT_HIGH;
			else if (strcmp(optarg, "max") == 0) o->effort = K3_EFFORT_MAX;
			else
				return -k3ctl_usage(cmd, "--reasoning-effort is one of none, low, high, max");
			break;
		case O_STATS: o->stats = true; break;
		case O_IDS: o->ids = true; break;
		case O_CHAT: o->chat = true; break;
		case O_NO_REASONING: o->quiet_reasoning = true; break;
		case O_DRAFT:
			if (k3_proto_draft_policy_parse(optarg, &o->draft) < 0)
				return -k3ctl_usage(cmd, "--draft is one of off, auto, ngram, dspark");
			break;
		case O_PROMPT_IDS:
			if (parse_ids(optarg, o) < 0)
				return -k3ctl_usage(cmd, "--prompt-ids takes comma-separated token ids");
			break;
		case ':':
			return -k3ctl_usage(cmd, "%s needs a value", argv[optind - 1]);
		default:
			return -k3ctl_usage(cmd, "unknown option '%s'", argv[optind - 1]);
		}
	}
	return optind;
}

int k3ctl_gen_print(const struct k3ctl_gen_opts *o, const struct k3ctl_gen_result *res)
{
	if (o->json) {
		k3ctl_json_puts(result_json(res), JSON_COMPACT | JSON_PRESERVE_ORDER, "{}");
	} else {
		if (res->text_len && res->text[res->text_len - 1] != '\n')
			putchar('\n');
		if (o->ids) {
			size_t i;
			json_t *v;

			printf("ids:");
			json_array_foreach(res->ids, i, v)
				printf("%s%lld", i ? "," : " ", (long long)json_integer_value(v));
			putchar('\n');
		}
		if (json_array_size(res->tool_calls)) {
			char *s = json_dumps(res->tool_calls, JSON_COMPACT | JSON_PRESERVE_ORDER);

			printf("tool_calls: %s\n", s ? s : "[]");
			free(s);
		}
	}
	fflush(stdout);
	if (o->stats)
		print_stats(res);
	return 0;
}

void k3ctl_gen_install_sigint(void)
{
	struct sigaction sa;

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_sigint;   /* no SA_RESTART: poll() returns EINTR */
	sigaction(SIGINT, &sa, NULL);
}

const char *k3ctl_gen_cancel_cause(uint32_t reason)
{
	switch (reason) {
	case K3_CANCEL_BY_ID: return "'k3ctl cancel' from another client";
	case K3_CANCEL_SHUTDOWN: return "k3d is shutting down (drain timeout, or asked to stop again)";
	default: return "'k3ctl cancel', or a shutdown whose --drain-timeout ran out";
	}
}

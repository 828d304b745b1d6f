/* cmd_warm_expert_cache.c - `k3ctl warm-expert-cache --trace FILE [--show N]
 * [--preload [--top N]] [--fetch N [--model DIR ...]]`: ranks experts by use
 * in a router trace (store_trace.h); with --preload, sends the ranking
 * (best first, the top N or all) to the running daemon in one WARM_EXPERTS
 * request, which reads as many as its cache holds into RAM between
 * generations; with --fetch N, fetches the N most-used experts that a
 * streaming install (k3ctl setup --stream) does not have on disk yet. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/parse.h"
#include "client.h"
#include "k3ctl.h"
#include "setup/setup_install.h"
#include "setup_cli.h"
#include "store/store_trace.h"

/* Fetches the n most-used experts of the ranking that the streaming
 * install lacks. */
static int fetch_ranking(struct k3ctl_setup_cli *c, const struct k3_store_trace_rank *rk,
			 size_t n, uint64_t want)
{
	struct k3_setup_fetch_sel sel = { .experts = true };
	struct k3_err err = { 0, "" };
	uint32_t *pairs = malloc((n ? n : 1) * 2 * sizeof(uint32_t));
	size_t fetched = 0;
	int rc;

	if (!pairs)
		return k3ctl_fail(K3CTL_EXIT_ERROR, "out of memory");
	for (size_t i = 0; i < n; i++) {
		pairs[2 * i] = rk[i].layer;
		pairs[2 * i + 1] = rk[i].expert;
	}
	sel.pairs = pairs;
	sel.n_pairs = n;
	sel.limit = (size_t)want;
	rc = k3_setup_fetch(&c->o, &sel, &fetched, &err);
	free(pairs);
	return rc ? k3ctl_setup_cli_fail(&err) : K3CTL_EXIT_OK;
}

/* Sends the best min(n, top) experts to the daemon and prints its answer. */
static int preload_ranking(const struct k3_store_trace_rank *rk, size_t n, uint64_t top)
{
	struct k3ctl_client c;
	struct k3_msg_warm_experts req;
	struct k3_proto_header h;
	union k3_proto_body reply;
	struct k3_err err = { 0, "" };
	size_t m = n < top ? n : (size_t)top;
	int r;

	if (m == 0)
		return k3ctl_fail(K3CTL_EXIT_ERROR, "the trace names no experts");
	uint32_t *layers = malloc(m * sizeof(uint32_t)), *experts = malloc(m * sizeof(uint32_t));
	if (!layers || !experts) {
		free(layers);
		free(experts);
		return k3ctl_fail(K3CTL_EXIT_ERROR, "out of memory");
	}
	for (size_t i = 0; i < m; i++) {
		layers[i] = rk[i].layer;
		experts[i] = rk[i].expert;
	}
	if ((r = k3ctl_connect(&c)) != 0) {
		free(layers);
		free(experts);
		return r;
	}
	memset(&req, 0, sizeof(req));
	k3_msg_warm_experts_set_layers(&req, (struct k3_proto_ids){ (uint32_t)m, layers, NULL });
	k3_msg_warm_experts_set_experts(&req, (struct k3_proto_ids){ (uint32_t)m, experts, NULL });
	/* Reading a large cache from disk takes minutes on slow disks. */
	r = k3ctl_client_call(&c, K3_MSG_WARM_EXPERTS, &req, 3600 * 1000, &h, &reply, NULL, &err);
	free(layers);
	free(experts);
	if (r < 0 || h.type != K3_MSG_WARM_EXPERTS_REPLY) {
		k3ctl_client_close(&c);
		return k3ctl_fail(K3CTL_EXIT_ERROR, "warm-expert-cache: %s",
				  r < 0 ? err.msg : "unexpected reply");
	}
	const struct k3_msg_warm_experts_reply *w = &reply.warm_experts_reply;
	if (k3ctl_g.json)
		printf("{\"requested\":%" PRIu32 ",\"loaded\":%" PRIu32 ",\"resident\":%" PRIu32
		       ",\"bytes_read\":%" PRIu64 ",\"seconds\":%.3f}\n", w->requested, w->loaded,
		       w->resident, w->bytes_read, w->has_seconds ? w->seconds : 0.0);
	else
		printf("preloaded %" PRIu32 " of %" PRIu32 " experts (%" PRIu32 " resident now): "
		       "%.1f MB read in %.2f s\n", w->loaded, w->requested, w->resident,
		       (double)w->bytes_read / 1e6, w->has_seconds ? w->seconds : 0.0);
	k3ctl_client_close(&c);
	return K3CTL_EXIT_OK;
}

#define USAGE "--trace FILE [--show N] [--preload [--top N]] [--fetch N [--model DIR]]"

int k3ctl_cmd_warm_expert_cache(int argc, char **argv)
{
	const char *trace = NULL;
	uint64_t show = 20, records = 0, total = 0;
	struct k3_store_trace_rank *rk = NULL;
	struct k3_err err = { 0, "" };
	size_t n = 0;
	bool preload = false;
	uint64_t top = UINT64_MAX, fetch = 0;
	struct k3ctl_setup_cli c;
	int code;

	k3ctl_setup_cli_init(&c, "warm-expert-cache", USAGE);
	for (int i = 0; k3ctl_setup_cli_next(&c, argc, argv, &i);) {
		if (strcmp(argv[i], "--fetch") == 0 && i + 1 < argc) {
			if (k3_parse_u64(argv[++i], 1, 1u << 24, &fetch, &err) != 0)
				return k3ctl_usage("warm-expert-cache", "--fetch: %s", err.msg);
		} else if (strcmp(argv[i], "--trace") == 0 && i + 1 < argc) {
			trace = argv[++i];
		} else if (strcmp(argv[i], "--show") == 0 && i + 1 < argc) {
			if (k3_parse_u64(argv[++i], 0, 1u << 24, &show, &err) != 0)
				return k3ctl_usage("warm-expert-cache", "--show: %s", err.msg);
		} else if (strcmp(argv[i], "--preload") == 0) {
			preload = true;
		} else if (strcmp(argv[i], "--top") == 0 && i + 1 < argc) {
			if (k3_parse_u64(argv[++i], 1, 1u << 20, &top, &err) != 0)
				return k3ctl_usage("warm-expert-cache", "--top: %s", err.msg);
		} else {
			return k3ctl_setup_cli_unexpected(&c, argv[i]);
		}
	}
	if (!trace)
		return k3ctl_usage("warm-expert-cache", "--trace FILE is required");
	if (fetch && preload)
		return k3ctl_usage("warm-expert-cache", "--fetch and --preload are separate steps:"
				   " fetch to disk first, then preload into the running k3d");
	if (k3_store_trace_rank(trace, &rk, &n, &records, &err) != 0)
		return k3ctl_fail(K3CTL_EXIT_ERROR, "%s", err.msg);
	for (size_t i = 0; i < n; i++)
		total += rk[i].uses;
	if (preload) {
		int rc = preload_ranking(rk, n, top);
		free(rk);
		return rc;
	}
	if (fetch) {
		code = k3ctl_setup_cli_finish(&c, false);
		if (code == 0)
			code = fetch_ranking(&c, rk, n, fetch);
		k3ctl_setup_cli_release(&c);
		free(rk);
		return code;
	}
	if (k3ctl_g.json) {
		printf("{\"records\":%" PRIu64 ",\"experts\":%zu,\"top\":[", records, n);
		for (size_t i = 0; i < n && i < show; i++)
			printf("%s{\"layer\":%" PRIu32 ",\"expert\":%" PRIu32 ",\"uses\":%" PRIu64
			       ",\"weight_sum\":%.9g}", i ? "," : "", rk[i].layer, rk[i].expert,
			       rk[i].uses, rk[i].weight_sum);
		printf("]}\n");
	} else {
		printf("%" PRIu64 " routing records, %zu distinct experts\n", records, n);
		printf("%6s %6s %7s %12s %8s %8s\n", "rank", "layer", "expert", "uses", "share",
		       "cum");
		uint64_t cum = 0;
		for (size_t i = 0; i < n && i < show; i++) {
			cum += rk[i].uses;
			printf("%6zu %6" PRIu32 " %7" PRIu32 " %12" PRIu64 " %7.3f%% %7.2f%%\n", i + 1,
			       rk[i].layer, rk[i].expert, rk[i].uses,
			       100.0 * (double)rk[i].uses / (double)total,
			       100.0 * (double)cum / (double)total);
		}
	}
	free(rk);
	return K3CTL_EXIT_OK;
}

/* cmd_warm_expert_cache.c - `k3ctl warm-expert-cache --trace FILE [--show N]`:
 * ranks experts by use in a router trace (store_trace.h). Preloading the
 * ranking into a running daemon needs a protocol request that does not
 * exist yet; --preload is refused until it does. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/parse.h"
#include "k3ctl.h"
#include "store/store_trace.h"

int k3ctl_cmd_warm_expert_cache(int argc, char **argv)
{
	const char *trace = NULL;
	uint64_t show = 20, records = 0, total = 0;
	struct k3_store_trace_rank *rk = NULL;
	struct k3_err err = { 0, "" };
	size_t n = 0;

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--trace") == 0 && i + 1 < argc) {
			trace = argv[++i];
		} else if (strcmp(argv[i], "--show") == 0 && i + 1 < argc) {
			if (k3_parse_u64(argv[++i], 0, 1u << 24, &show, &err) != 0)
				return k3ctl_usage("warm-expert-cache", "--show: %s", err.msg);
		} else if (strcmp(argv[i], "--preload") == 0) {
			return k3ctl_usage("warm-expert-cache", "--preload is not available yet:"
					   " the daemon has no preload request");
		} else {
			return k3ctl_usage("warm-expert-cache", "usage: k3ctl warm-expert-cache"
					   " --trace FILE [--show N] (unexpected '%s')", argv[i]);
		}
	}
	if (!trace)
		return k3ctl_usage("warm-expert-cache", "--trace FILE is required");
	if (k3_store_trace_rank(trace, &rk, &n, &records, &err) != 0)
		return k3ctl_fail(K3CTL_EXIT_ERROR, "%s", err.msg);
	for (size_t i = 0; i < n; i++)
		total += rk[i].uses;
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

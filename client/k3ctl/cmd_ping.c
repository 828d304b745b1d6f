/* cmd_ping.c - `k3ctl ping`: round trip time to the daemon. */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "client.h"
#include "k3ctl.h"

static const char *state_name(uint32_t s)
{
	static const char *const names[] = { "loading", "ready", "draining", "no-model" };

	return s < 4 ? names[s] : "unknown";
}

int k3ctl_cmd_ping(int argc, char **argv)
{
	struct k3_msg_ping ping;
	struct k3ctl_reply rep;
	struct timespec t0, t1;
	double ms;
	int r;

	(void)argv;
	if (argc > 1)
		return k3ctl_usage("ping", "takes no arguments");
	memset(&ping, 0, sizeof(ping));
	clock_gettime(CLOCK_MONOTONIC, &t0);
	r = k3ctl_request(&rep, K3_MSG_PING, &ping);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	if (r > 0)
		return r;
	if (r < 0)
		return k3ctl_fail(K3CTL_EXIT_UNAVAILABLE, "%s", rep.err.msg);
	k3ctl_client_close(&rep.c);
	ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-6;
	if (k3ctl_g.json)
		printf("{\"ok\":true,\"state\":\"%s\",\"ms\":%.3f}\n", state_name(rep.body.pong.state), ms);
	else
		printf("k3d answered in %.2f ms (%s)\n", ms, state_name(rep.body.pong.state));
	return K3CTL_EXIT_OK;
}

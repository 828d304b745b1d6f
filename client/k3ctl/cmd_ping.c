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
	struct k3ctl_client c;
	struct k3_msg_ping ping;
	struct k3_proto_header h;
	union k3_proto_body reply;
	struct k3_err err = { 0, "" };
	struct timespec t0, t1;
	double ms;
	int r;

	(void)argv;
	if (argc > 1)
		return k3ctl_usage("ping", "takes no arguments");
	clock_gettime(CLOCK_MONOTONIC, &t0);
	if ((r = k3ctl_connect(&c)) != 0)
		return r;
	memset(&ping, 0, sizeof(ping));
	r = k3ctl_client_call(&c, K3_MSG_PING, &ping, 10000, &h, &reply, NULL, &err);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	k3ctl_client_close(&c);
	if (r < 0)
		return k3ctl_fail(K3CTL_EXIT_UNAVAILABLE, "%s", err.msg);
	ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-6;
	if (k3ctl_g.json)
		printf("{\"ok\":true,\"state\":\"%s\",\"ms\":%.3f}\n", state_name(reply.pong.state), ms);
	else
		printf("k3d answered in %.2f ms (%s)\n", ms, state_name(reply.pong.state));
	return K3CTL_EXIT_OK;
}

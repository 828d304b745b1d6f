/* cmd_shutdown.c - `k3ctl shutdown`: ask k3d to drain and exit. */
#include <stdio.h>
#include <string.h>

#include "client.h"
#include "k3ctl.h"

int k3ctl_cmd_shutdown(int argc, char **argv)
{
	struct k3ctl_client c;
	struct k3_msg_shutdown req;
	struct k3_proto_header h;
	union k3_proto_body reply;
	struct k3_err err = { 0, "" };
	int r;

	(void)argv;
	if (argc > 1)
		return k3ctl_usage("shutdown", "takes no arguments");
	if ((r = k3ctl_connect(&c)) != 0)
		return r;
	memset(&req, 0, sizeof(req));
	r = k3ctl_client_call(&c, K3_MSG_SHUTDOWN, &req, 10000, &h, &reply, NULL, &err);
	k3ctl_client_close(&c);
	if (r < 0)
		return k3ctl_fail(K3CTL_EXIT_ERROR, "shutdown refused: %s", err.msg);
	if (k3ctl_g.json)
		printf("{\"ok\":true}\n");
	else
		printf("k3d is draining and will exit\n");
	return K3CTL_EXIT_OK;
}

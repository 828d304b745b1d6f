/* cmd_cancel.c - `k3ctl cancel JOB_ID`: stop a queued or running generation. */
#include <stdio.h>
#include <string.h>

#include "base/parse.h"
#include "client.h"
#include "k3ctl.h"

int k3ctl_cmd_cancel(int argc, char **argv)
{
	struct k3ctl_client c;
	struct k3_msg_cancel req;
	struct k3_proto_header h;
	union k3_proto_body reply;
	struct k3_err err = { 0, "" };
	uint64_t id;
	uint32_t status = 0;
	int r;

	if (argc != 2 || k3_parse_u64(argv[1], 1, UINT64_MAX, &id, NULL) < 0)
		return k3ctl_usage("cancel", "takes one job id (shown by 'k3ctl run --stats' and --json)");
	if ((r = k3ctl_connect(&c)) != 0)
		return r;
	memset(&req, 0, sizeof(req));
	k3_msg_cancel_set_job_id(&req, id);
	r = k3ctl_client_call(&c, K3_MSG_CANCEL, &req, 10000, &h, &reply, &status, &err);
	k3ctl_client_close(&c);
	if (r < 0)
		return k3ctl_fail(K3CTL_EXIT_ERROR, "cancel %llu: %s", (unsigned long long)id, err.msg);
	if (k3ctl_g.json)
		printf("{\"ok\":true,\"job_id\":%llu}\n", (unsigned long long)id);
	else
		printf("job %llu cancelled\n", (unsigned long long)id);
	return K3CTL_EXIT_OK;
}

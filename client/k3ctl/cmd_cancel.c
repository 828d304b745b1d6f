/* cmd_cancel.c - `k3ctl cancel JOB_ID`: stop a queued or running generation. */
#include <stdio.h>
#include <string.h>

#include "base/parse.h"
#include "client.h"
#include "k3ctl.h"

int k3ctl_cmd_cancel(int argc, char **argv)
{
	struct k3_msg_cancel req;
	struct k3ctl_reply rep;
	uint64_t id;
	int r;

	if (argc != 2 || k3_parse_u64(argv[1], 1, UINT64_MAX, &id, NULL) < 0)
		return k3ctl_usage("cancel", "takes one job id (shown by 'k3ctl run --stats' and --json)");
	memset(&req, 0, sizeof(req));
	k3_msg_cancel_set_job_id(&req, id);
	if ((r = k3ctl_request(&rep, K3_MSG_CANCEL, &req)) > 0)
		return r;
	if (r < 0)
		return k3ctl_fail(K3CTL_EXIT_ERROR, "cancel %llu: %s", (unsigned long long)id, rep.err.msg);
	k3ctl_client_close(&rep.c);
	if (k3ctl_g.json)
		printf("{\"ok\":true,\"job_id\":%llu}\n", (unsigned long long)id);
	else
		printf("job %llu cancelled\n", (unsigned long long)id);
	return K3CTL_EXIT_OK;
}

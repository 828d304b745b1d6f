/* cmd_shutdown.c - `k3ctl shutdown`: ask k3d to drain and exit; asked
 * again during the drain, k3d cancels the running work and k3ctl says so. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "client.h"
#include "json_fields.h"
#include "k3ctl.h"

int k3ctl_cmd_shutdown(int argc, char **argv)
{
	struct k3_msg_shutdown req;
	struct k3ctl_reply rep;
	int r;

	(void)argv;
	if (argc > 1)
		return k3ctl_usage("shutdown", "takes no arguments");
	memset(&req, 0, sizeof(req));
	if ((r = k3ctl_request(&rep, K3_MSG_SHUTDOWN, &req)) > 0)
		return r;
	if (r < 0 || rep.h.type != K3_MSG_OK) {
		if (r == 0)
			k3ctl_client_close(&rep.c);
		return k3ctl_fail(K3CTL_EXIT_ERROR, "shutdown refused: %s",
				  r < 0 ? rep.err.msg : "unexpected reply");
	}
	/* k3d's OK says what the request did: "draining" for the first one;
	 * during a drain, whether it cancelled the running work. */
	const struct k3_msg_ok *ok = &rep.body.ok;
	const struct k3_proto_str *m = &ok->message;
	bool first = !ok->has_message || (m->len == 8 && memcmp(m->p, "draining", 8) == 0);
	if (k3ctl_g.json) {
		json_t *o = json_object();

		json_object_set_new(o, "ok", json_true());
		if (ok->has_message)
			json_object_set_new(o, "message", json_stringn(m->p ? m->p : "", m->len));
		k3ctl_json_puts(o, JSON_COMPACT | JSON_PRESERVE_ORDER, "{\"ok\":true}");
	} else if (first) {
		printf("k3d is draining and will exit\n");
	} else {
		printf("k3d is draining and will exit (%.*s)\n", (int)m->len, m->p);
	}
	k3ctl_client_close(&rep.c);
	return K3CTL_EXIT_OK;
}

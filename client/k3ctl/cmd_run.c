/*
 * cmd_run.c - `k3ctl run`: one completion (raw, or one chat turn with
 * --chat), streamed from k3d (the shared machinery is in gen.c). Ctrl-C
 * sends CANCEL for the running generation and exits 130 after the
 * daemon's DONE.
 */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "gen.h"
#include "k3ctl.h"

int k3ctl_cmd_run(int argc, char **argv)
{
	struct k3ctl_gen_opts o;
	struct k3ctl_gen_result res;
	struct k3ctl_client c;
	const char *prompt = "The capital of France is";
	char *messages = NULL;
	int i = k3ctl_gen_parse_opts("run", argc, argv, &o), r;

	if (i < 0)
		return -i;
	if (argc - i > 1)
		return k3ctl_usage("run", "takes one PROMPT (quote it)");
	if (argc - i == 1)
		prompt = argv[i];
	if (o.chat && o.n_prompt_ids)
		return k3ctl_usage("run", "--prompt-ids is for raw completions, not --chat");
	if (!k3_proto_utf8_valid(prompt, strlen(prompt)))
		return k3ctl_usage("run", "PROMPT is not valid UTF-8");
	if (o.chat) {
		json_t *m = json_pack("[{s:s,s:s}]", "role", "user", "content", prompt);

		messages = json_dumps(m, JSON_COMPACT);
		json_decref(m);
	}
	if ((r = k3ctl_connect(&c)) != 0) {
		free(messages);
		free(o.prompt_ids);
		return r;
	}
	k3ctl_gen_install_sigint();
	r = k3ctl_gen_run(&c, &o, prompt, messages, &res);
	if (r == 0)
		k3ctl_gen_print(&o, &res);
	k3ctl_client_close(&c);
	free(messages);
	free(o.prompt_ids);
	/* 130 is for the user's own Ctrl-C; a cancel from elsewhere (k3ctl
	 * cancel, a shutdown whose drain timeout ran out) is an error. */
	if (r == 0 && res.done.finish == K3_FINISH_CANCELLED)
		r = k3ctl_gen_interrupted ? 130 :
		    k3ctl_fail(K3CTL_EXIT_ERROR, "run: k3d cancelled the generation: %s",
			       k3ctl_gen_cancel_cause(res.done.cancel_reason));
	k3ctl_gen_release(&res);
	return r;
}

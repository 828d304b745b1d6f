/*
 * gen.h - what `k3ctl run` and `k3ctl chat` share: their options, one
 * streamed generation (GENERATE, then ACCEPTED / PROGRESS / TOKEN /
 * TOOL_CALL events until DONE or ERROR), its output (text, --ids, --json,
 * --stats) and Ctrl-C, which cancels the running generation.
 */
#ifndef K3CTL_GEN_H
#define K3CTL_GEN_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "client.h"
#include "k3_proto.h"

/* The options run and chat share (parsed by k3ctl_gen_parse_opts). */
struct k3ctl_gen_opts {
	bool chat;
	uint32_t max_new;
	bool has_max_new;
	const char *stop[K3_LIM_STOP_COUNT];
	uint32_t n_stop;
	uint32_t effort;        /* enum k3_proto_effort */
	bool stats, ids, json, quiet_reasoning;
	uint32_t *prompt_ids;   /* --prompt-ids */
	uint32_t n_prompt_ids;
	uint32_t draft;         /* --draft: enum k3_proto_draft_policy; 0 = k3d's default */
};

/* What one generation produced. */
struct k3ctl_gen_result {
	json_t *ids;            /* array of ints */
	json_t *tool_calls;     /* OpenAI-shaped array */
	char *text, *reasoning; /* malloc'ed, NUL-terminated */
	size_t text_len, reasoning_len;
	struct k3_msg_done done;
	char spine_label[K3_LIM_NAME_MAX + 1];   /* DONE's, copied (done's points into a frame) */
	bool got_done;
	uint64_t job_id;
	uint32_t error_status;
	char error[K3_LIM_MESSAGE_MAX];
};

/* Set by the SIGINT handler k3ctl_gen_install_sigint installs; a caller
 * clears it before a turn and reads it after (130 = the user's Ctrl-C). */
extern volatile sig_atomic_t k3ctl_gen_interrupted;

/* Installs the SIGINT handler (no SA_RESTART, so a blocked poll returns
 * EINTR and the CANCEL goes out at once). */
void k3ctl_gen_install_sigint(void);

/* Parses the options shared by run and chat into *o (defaults: max_new
 * 128, --json from the global flag). Returns the index of the first
 * positional argument, or a negative exit code after printing the usage
 * error. o->prompt_ids is malloc'd; the caller frees it. */
int k3ctl_gen_parse_opts(const char *cmd, int argc, char **argv, struct k3ctl_gen_opts *o);

/*
 * Sends one GENERATE on c (chat: messages_json, a JSON array of OpenAI
 * messages; raw: prompt, or o->prompt_ids) and streams its events until
 * DONE or ERROR: content to stdout and reasoning to stderr as they arrive
 * (unless o->json), everything collected in *res (which the caller
 * releases with k3ctl_gen_release, also on failure). Ctrl-C sends CANCEL
 * for the job. Returns 0 when DONE arrived, or the k3ctl exit code after
 * printing why (3 when k3d is unavailable or busy, 1 for other errors).
 */
int k3ctl_gen_run(struct k3ctl_client *c, const struct k3ctl_gen_opts *o, const char *prompt,
		  const char *messages_json, struct k3ctl_gen_result *res);

/* Prints what a finished generation left to print: with --json the whole
 * result as one JSON object on stdout; else the final newline, --ids and
 * tool calls. --stats adds the DONE counters on stderr. Returns 0. */
int k3ctl_gen_print(const struct k3ctl_gen_opts *o, const struct k3ctl_gen_result *res);

/* Frees what *r owns and zeroes it. */
void k3ctl_gen_release(struct k3ctl_gen_result *r);

/* DONE's finish reason (enum k3_finish) as its name: "stop", "length",
 * "cancelled", "error", "tool_calls"; "unknown" for a newer value. */
const char *k3ctl_gen_finish_name(uint32_t f);

/* Why k3d cancelled a generation this k3ctl did not cancel, from DONE's
 * cancel_reason (enum k3_proto_cancel_reason), for a message. */
const char *k3ctl_gen_cancel_cause(uint32_t reason);

#endif

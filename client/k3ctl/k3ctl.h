/*
 * k3ctl.h - what every k3ctl command shares. Each command lives in its own
 * file cmd_<name>.c and exports `int k3ctl_cmd_<name>(int argc, char **argv)`
 * (argv[0] is the command name; options follow). The table in main.c maps
 * names to these functions.
 *
 * Exit codes (documented in k3ctl.1): 0 ok, 1 error, 2 usage, 3 daemon
 * unavailable.
 */
#ifndef K3CTL_H
#define K3CTL_H

#include <stdbool.h>
#include <stddef.h>

#include "client.h"
#include "k3_client_socket.h"

enum k3ctl_exit {
	K3CTL_EXIT_OK = 0,
	K3CTL_EXIT_ERROR = 1,
	K3CTL_EXIT_USAGE = 2,
	K3CTL_EXIT_UNAVAILABLE = 3,
};
/* The socket-path rule is shared with k3-gateway (client/common). */
_Static_assert((int)K3CTL_EXIT_USAGE == (int)K3_CLIENT_EXIT_USAGE &&
	       (int)K3CTL_EXIT_UNAVAILABLE == (int)K3_CLIENT_EXIT_UNAVAILABLE, "one exit-code rule");

/* Global options parsed by main.c before the command runs. */
struct k3ctl_globals {
	const char *socket_path;   /* --socket, $K3D_SOCKET, or the default */
	bool json;                 /* --json: machine-readable output */
};
extern struct k3ctl_globals k3ctl_g;

/* Connects to the daemon named by the globals. Returns 0, or the exit
 * code to use after printing why (3 when no daemon answers). */
int k3ctl_connect(struct k3ctl_client *c);

/* One request and its reply, on a connection of their own (the commands
 * that send one request: cancel, ping, shutdown). */
struct k3ctl_reply {
	struct k3ctl_client c;
	struct k3_proto_header h;
	union k3_proto_body body;    /* the reply; its strings live in c's buffer */
	uint32_t status;             /* ERROR's status, when the call got one */
	struct k3_err err;
};
/*
 * Connects (k3ctl_connect), sends type with body and waits up to 10 s for
 * the reply (k3ctl_client_call). Returns 0 with the reply in r and the
 * connection open for its strings (close it with k3ctl_client_close(&r->c)),
 * the exit code to use when no daemon was reached (why is printed), or a
 * negative errno with r->err saying why the call failed (closed then).
 */
int k3ctl_request(struct k3ctl_reply *r, uint32_t type, const void *body);

/* Prints "k3ctl <cmd>: message" to stderr and returns K3CTL_EXIT_USAGE. */
int k3ctl_usage(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prints "k3ctl: message" to stderr and returns code. */
int k3ctl_fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/*
 * A command's options, walked in order: "-h" and "--help" (with help),
 * the flags (options without a value), and the "--name VALUE" options,
 * whose value is the next argument whatever it looks like. What a command
 * takes is a static k3ctl_args_spec; each walk is a k3ctl_args:
 *
 *	struct k3ctl_args args = { .spec = &spec, .argc = argc, .argv = argv, ... };
 *	while (k3ctl_args_next(&args)) { args.opt, args.val: a flag or an option }
 *	if (args.stop)
 *		return args.code;
 */
struct k3ctl_args_spec {
	const char *cmd;           /* for the usage messages */
	const char *const *flags;  /* the options without a value, NULL-terminated; may be NULL */
	void (*help)(void);        /* prints the usage for -h/--help; NULL: those are options */
	const char *need;          /* the message (a k3ctl_usage format with one %s, the
				    * option) for an option whose value is missing */
};
/* An option whose value is kept as given: the walk stores it in *to. */
struct k3ctl_arg_str {
	const char *name;
	const char **to;
};
struct k3ctl_args {
	const struct k3ctl_args_spec *spec;
	int argc;
	char **argv;               /* argv[0] is the command name */
	const struct k3ctl_arg_str *strs;   /* taken on the way, not returned; may be NULL */
	size_t n_strs;
	const int *rc;             /* the command's check of the last value (may be NULL):
				    * nonzero stops the walk with "OPTION: err->msg" */
	const struct k3_err *err;
	int i;                     /* set by the walk: argv index of the last option */
	const char *opt, *val;     /* that option and its value (NULL for a flag) */
	bool stop;                 /* the walk ended early: return code */
	int code;
};
/* Steps to the next option that a->strs does not take: true with a->opt
 * and a->val set; false at the end of argv, or with a->stop set after
 * -h/--help (help printed, code K3CTL_EXIT_OK), an option without its
 * value or a value *a->rc refused (usage printed, code K3CTL_EXIT_USAGE). */
bool k3ctl_args_next(struct k3ctl_args *a);

#define K3CTL_COMMANDS(X) \
	X(status,   "show the daemon's state and counters") \
	X(ping,     "check that the daemon answers") \
	X(shutdown, "ask the daemon to drain and exit") \
	X(run,      "generate from PROMPT (or --chat) and stream K3's greedy output") \
	X(chat,     "interactive multi-turn chat (Ctrl-C cancels a reply)") \
	X(cancel,   "cancel a queued or running generation by job id") \
	X(demo_model, "write a synthetic K3 checkpoint (HF layout) to --out DIR") \
	X(inspect,  "bytes by role, experts, RAM fit of a checkpoint directory") \
	X(plan,     "split a RAM size between spine, ring, expert cache, state (--model DIR --ram 64G)") \
	X(setup,    "fetch (--full | --stream), plan or check the Kimi K3 checkpoint, verified") \
	X(fetch_weights, "fetch the spine or routed experts of a streaming install ahead of use") \
	X(inventory, "print the inventory (sizes, SHA-256) of a model directory") \
	X(forward,  "run the forward pass offline on token ids (logits, greedy, routes)") \
	X(tokenize, "encode text to K3 token ids (offline)") \
	X(detokenize, "decode K3 token ids to text (offline)") \
	X(render_chat, "render a chat with the K3 XTML renderer (offline)") \
	X(pack,     "write expert packs for a model directory (--model DIR [--verify])") \
	X(convert_spine_int8, "write the int8 spine overlay, NOT weight-exact (--model DIR)") \
	X(warm_expert_cache, "rank experts by use in a router trace; --preload or --fetch N them") \
	X(bench,    "offline tokens/s and expert bytes/token vs the disk's bandwidth (--model DIR)")

/* `k3ctl bench --compare-spine ...` (cmd_bench_spine.c), reached from
 * k3ctl_cmd_bench. */
int k3ctl_bench_compare_spine(int argc, char **argv);
/* k3ctl bench --parallel LIST: several sequences in one pass
 * (cmd_bench_batch.c); exit 1 when a sequence's ids differ from its solo run. */
int k3ctl_bench_batch(int argc, char **argv);

#define K3CTL_DECLARE_(name, summary) int k3ctl_cmd_##name(int argc, char **argv);
K3CTL_COMMANDS(K3CTL_DECLARE_)
#undef K3CTL_DECLARE_

#endif

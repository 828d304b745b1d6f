/*
 * sched.h - k3d's scheduler: loads the model, owns the engine thread, the
 * FIFO of generation jobs and the published conversation state, and turns
 * GENERATE / CANCEL / TOKENIZE / DETOKENIZE / MODEL_INFO requests into
 * protocol events (docs/protocol.md, "Conversation").
 *
 * Threads. The loop thread (libevent) validates requests, renders chat
 * prompts and tokenizes them (the tokenizer is immutable and thread-safe),
 * and writes every frame. The engine thread alone runs the model: it takes
 * one job at a time, computes on a private branch of sequence state, and
 * posts encoded frames back to the loop through a locked queue. A job's
 * branch is published (becomes the conversation the next chat request may
 * extend) only after its DONE frame has been handed to the kernel; a
 * disconnect or write failure discards it, and so does a client that has
 * not taken its DONE within 5 s (the states are freed, not pinned).
 */
#ifndef K3_SERVER_SCHED_H
#define K3_SERVER_SCHED_H

#include <event2/event.h>

#include "base/err.h"
#include "server/options.h"
#include "server/server.h"

struct k3_sched;

/*
 * Creates the scheduler and starts the engine thread, which loads the
 * model from opts->model_dir (the server reports LOADING meanwhile).
 * on_ready(ctx, ok, text) runs on the loop thread when loading ends: text
 * is the model id on success (valid while the scheduler lives), else the
 * error message.
 * Returns 0 or a negative errno (thread or memory failure).
 */
int k3_sched_new(struct event_base *base, struct k3_server *srv, const struct k3_options *opts,
		 void (*on_ready)(void *ctx, bool ok, const char *message), void *ctx,
		 struct k3_sched **out, struct k3_err *err);

/* Stops the engine thread (cancelling its job) and frees everything. */
struct k3_sched *k3_sched_free(struct k3_sched *s);

/* The hooks to hand to k3_server_set_hooks. */
struct k3_server_hooks k3_sched_hooks(struct k3_sched *s);

#endif

/*
 * setup_transfer.h - HTTPS downloads for setup and for k3d's expert
 * fetcher: libcurl's multi interface running up to N transfers at once
 * (HTTP/2 where the server offers it, each transfer on its own connection
 * so one slow stream does not hold the others), TLS through OpenSSL with
 * the system's CAs or a given bundle.
 *
 * A job asks for bytes [offset, offset + length) of a remote file of
 * `total` bytes and hands them, in order, to its sink (ops->write). What
 * the engine guarantees:
 *
 *   - HTTPS only, for the first URL and every redirect; redirects are
 *     followed by the engine (libcurl's own following is off), at most
 *     max_redirects of them, only to hosts on the allow list, and the
 *     bearer token goes only to token_host, never to a redirect target;
 *   - exact responses: 200 only for a whole file asked from byte 0
 *     (Content-Length == total), 206 only with Content-Range "bytes
 *     a-b/total" equal to what was asked, never a byte more than asked;
 *     anything else that says the remote file is not the pinned one is a
 *     mismatch and not retried;
 *   - retries with exponential backoff (retry_delay_ms, doubled, at most
 *     30 s, plus Retry-After) on 5xx and 429, dropped or reset connections,
 *     short bodies, and stalls: a transfer that receives no byte for
 *     idle_timeout_s seconds is abandoned and retried, never waited on;
 *     a retry asks only for the bytes not yet delivered;
 *   - the token and signed redirect URLs never appear in messages (URLs
 *     are shown without their query).
 *
 * One thread runs k3_setup_net_run; k3_setup_net_submit and
 * k3_setup_net_stop may be called from any thread.
 */
#ifndef K3_SETUP_TRANSFER_H
#define K3_SETUP_TRANSFER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "setup/setup_inventory.h"

enum { K3_SETUP_MAX_WORKERS = 64 };

struct k3_setup_net_opts {
	const char *cacert;             /* PEM CA bundle; NULL: the system's CAs */
	const char *token;              /* bearer token or NULL */
	const char *token_host;         /* the only host the token is sent to */
	char *const *allow_hosts;       /* hosts a redirect may go to ("*.x" patterns) */
	size_t n_allow_hosts;
	unsigned workers;               /* transfers at once, 1..K3_SETUP_MAX_WORKERS */
	unsigned idle_timeout_s;        /* 1..3600: no byte for this long -> retry */
	unsigned connect_timeout_s;     /* 1..600 */
	unsigned attempts;              /* tries per job, the first included, 1..100 */
	unsigned retry_delay_ms;        /* first backoff, 0..60000 */
	unsigned max_redirects;         /* 0..20 */
	const char *user_agent;         /* NULL: "k3ctl" */
};

struct k3_setup_job;

struct k3_setup_job_ops {
	/* n response bytes that belong at byte `off` of the remote file (off
	 * is job->offset + job->got). Returns 0 or a negative errno, which
	 * ends the job with it (not retried). */
	int (*write)(struct k3_setup_job *job, uint64_t off, const void *buf, size_t n,
		     struct k3_err *err);
	/* The server answered a range request with the whole file: the sink
	 * starts over at byte 0. NULL: such an answer fails the job. */
	int (*restart)(struct k3_setup_job *job, struct k3_err *err);
	/* A retry is scheduled in delay_ms (attempt: the one about to start,
	 * 2-based); why says what went wrong. May be NULL. */
	void (*retry)(struct k3_setup_job *job, unsigned attempt, unsigned delay_ms, const char *why);
	/* The job is over: rc 0, or a negative errno with err saying why
	 * (-EBADMSG: the remote file is not the pinned one; -EACCES: 401/403;
	 * -ENOENT: 404; -EPERM: a redirect refused; -ETIMEDOUT / -EIO: gave up
	 * after the last attempt). Called on the thread running the engine;
	 * the engine does not touch the job afterwards. */
	void (*done)(struct k3_setup_job *job, int rc, const struct k3_err *err);
};

/* A job. The submitter owns the storage and fills the fields above the
 * line; it must not change or free the job until done is called. */
struct k3_setup_job {
	char url[K3_SETUP_URL_MAX + 1];
	uint64_t offset, length;        /* bytes wanted of the remote file */
	uint64_t total;                 /* the remote file's size, bytes */
	/* A document of unknown size (a listing): total and length 0, 200
	 * only, at most max_bytes of body. */
	uint64_t max_bytes;
	const struct k3_setup_job_ops *ops;
	void *owner;
	/* Bytes of [offset, offset + length) delivered so far. The submitter
	 * sets it (0, or what a resumed download already holds: the request
	 * then asks for the rest); the engine advances it. */
	uint64_t got;
	/* ---- the engine's ---- */
	unsigned attempt;               /* 1-based */
	unsigned redirects;
	char next_link[K3_SETUP_URL_MAX + 1];   /* a Link rel="next" of the last response */
	char cur_url[K3_SETUP_URL_MAX + 1];
	double not_before;              /* monotonic seconds */
	struct k3_setup_job *next_queued;
};

/* Byte and request counters since k3_setup_net_new. */
struct k3_setup_net_stats {
	uint64_t bytes;                 /* body bytes delivered to sinks */
	uint64_t requests;              /* HTTP requests made, redirects included */
	uint64_t retries;
	uint64_t jobs_ok, jobs_failed;
	unsigned running, queued;
};

struct k3_setup_net;

/* Checks the options and sets up the engine. Returns 0, -EINVAL (names the
 * option), -ENOMEM or -EIO (libcurl would not start). */
int k3_setup_net_new(const struct k3_setup_net_opts *o, struct k3_setup_net **out,
		     struct k3_err *err);
/* Accepts NULL. Jobs still queued or running are dropped without done. */
void k3_setup_net_free(struct k3_setup_net *net);

/* Queues a job (fields above the line filled; url https://). Thread-safe. */
void k3_setup_net_submit(struct k3_setup_net *net, struct k3_setup_job *job);

/* Runs transfers. persistent false: until no job is queued or running;
 * true: until k3_setup_net_stop. tick (may be NULL) is called about every
 * 200 ms from this thread. Returns 0, or -EIO when libcurl fails. */
int k3_setup_net_run(struct k3_setup_net *net, bool persistent, void (*tick)(void *ctx),
		     void *ctx);
/* Makes a persistent run return soon. Thread-safe. */
void k3_setup_net_stop(struct k3_setup_net *net);

void k3_setup_net_stats_get(struct k3_setup_net *net, struct k3_setup_net_stats *st);

/* Bytes delivered so far to the job's sink (thread-safe snapshot for
 * progress). */
uint64_t k3_setup_job_got(const struct k3_setup_job *job);

/* Writes url without its query string or fragment into buf (for
 * messages: signed URLs carry secrets there). */
void k3_setup_url_display(const char *url, char *buf, size_t size);

/* Fetches a small document (200, at most max bytes) into a malloc'd,
 * NUL-terminated buffer with its own engine run (the caller's thread):
 * used for the remote listing and safetensors headers. *next_link gets a
 * Link rel="next" URL or "" (size K3_SETUP_URL_MAX + 1; may be NULL).
 * Range: when length > 0, bytes [offset, offset + length) of a file of
 * `total` bytes (206 required) instead. */
int k3_setup_net_fetch(struct k3_setup_net *net, const char *url, uint64_t offset,
		       uint64_t length, uint64_t total, size_t max, char **body, size_t *len,
		       char *next_link, struct k3_err *err);

#endif

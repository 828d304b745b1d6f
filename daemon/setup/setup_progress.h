/*
 * setup_progress.h - what a download shows while it runs:
 *
 *   - on a terminal: a bar per file in flight and one for the total, with
 *     bytes, rate and ETA, redrawn in place about 5 times a second;
 *   - otherwise (a log, a pipe): one plain line every 10 seconds and one
 *     per finished file;
 *   - with --json: one JSON object per line on stdout, for scripts and for
 *     whatever reports a streaming install's state (docs/setup.md,
 *     "Progress events"): plan, start, progress (every second), retry,
 *     verified, failed, done.
 *
 * Rates are measured over the last few seconds of bytes actually received
 * (a resumed file's old bytes count as present, not as speed).
 */
#ifndef K3_SETUP_PROGRESS_H
#define K3_SETUP_PROGRESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum k3_setup_progress_mode {
	K3_SETUP_PROGRESS_AUTO = 0,   /* TTY bars when text_out is a terminal, else plain */
	K3_SETUP_PROGRESS_TTY,
	K3_SETUP_PROGRESS_PLAIN,
	K3_SETUP_PROGRESS_JSON,
	K3_SETUP_PROGRESS_QUIET,
};

struct k3_setup_progress;

/* text_out: bars and lines (stderr); json_out: events (stdout). Returns
 * NULL when out of memory. */
struct k3_setup_progress *k3_setup_progress_new(enum k3_setup_progress_mode mode, FILE *text_out,
						FILE *json_out);
void k3_setup_progress_free(struct k3_setup_progress *pr);

/* The plan: files, bytes of all of them, bytes still to fetch, the disk's
 * free bytes and the peak the install needs (JSON event "plan"). */
void k3_setup_progress_plan(struct k3_setup_progress *pr, size_t files, uint64_t bytes_total,
			    uint64_t bytes_to_fetch, uint64_t free_bytes, uint64_t peak_bytes);

/* A file (or range set) that will be fetched: size bytes, `have` of them
 * present already. Returns its id, or (size_t)-1 when out of memory. */
size_t k3_setup_progress_add(struct k3_setup_progress *pr, const char *name, uint64_t size,
			     uint64_t have);
void k3_setup_progress_start(struct k3_setup_progress *pr, size_t id);
/* `have` bytes of file id are present now (absolute, not a delta). */
void k3_setup_progress_update(struct k3_setup_progress *pr, size_t id, uint64_t have);
void k3_setup_progress_retry(struct k3_setup_progress *pr, size_t id, unsigned attempt,
			     unsigned delay_ms, const char *why);
/* Verified and published; sha_hex may be NULL (ranges). */
void k3_setup_progress_done(struct k3_setup_progress *pr, size_t id, const char *sha_hex);
void k3_setup_progress_fail(struct k3_setup_progress *pr, size_t id, const char *msg);
/* Redraws or prints when due. Cheap; call it often. */
void k3_setup_progress_tick(struct k3_setup_progress *pr);
/* The last line / the "done" event. */
void k3_setup_progress_end(struct k3_setup_progress *pr, bool ok, const char *msg);

/* "1.23 GB" style (decimal units, as disks are sold) into buf. */
void k3_setup_bytes_str(uint64_t n, char *buf, size_t size);

#endif

/*
 * setup_partial.h - one whole-file download in progress: NAME.partial and
 * its resume journal NAME.partial.k3j beside it, then publication under
 * NAME once every byte arrived and the SHA-256 of the bytes on disk is the
 * pinned one.
 *
 * Resume. The SHA-256 runs over the bytes as they are written. Every
 * `chunk` bytes the digest of everything so far is appended to the journal
 * ("OFFSET HEX"). A later run (after a crash, kill -9, a dead connection)
 * re-reads the partial from its start, recomputes the digest and compares
 * it at every journal offset: it resumes from the last offset the disk
 * reproduces and cuts off whatever lies beyond, so at most one chunk of
 * what had arrived is fetched again (none after an orderly stop, which
 * journals its last offset), and nothing that was not verified against
 * the journal is trusted. Neither file is fsynced at checkpoints:
 * a power cut can lose more than a chunk, never correctness, because the
 * re-hash decides. The journal's first line binds it to one download
 * ("k3-partial 1 SIZE SHA256 CHUNK"); a partial of another file starts
 * over.
 *
 * A partial whose bytes do not hash to the pinned value at the end is
 * removed with its journal and never published (the caller fetches it
 * again).
 */
#ifndef K3_SETUP_PARTIAL_H
#define K3_SETUP_PARTIAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"

/* Default and bounds of the checkpoint distance, bytes. */
#define K3_SETUP_CHUNK_DEFAULT ((uint64_t)64 << 20)
#define K3_SETUP_CHUNK_MIN ((uint64_t)64 << 10)
#define K3_SETUP_CHUNK_MAX ((uint64_t)1 << 30)

struct k3_setup_partial;

/* Opens (or creates, mode 0644) dirfd/<name>.partial and its journal for a
 * download of `size` bytes whose SHA-256 is sha; `chunk` is the checkpoint
 * distance (raised so that a journal has at most 65536 entries). An existing
 * partial is re-hashed as described above; *resume gets the offset the
 * download continues from (size when it is complete already). `what`
 * names the destination in messages. Returns 0, -ELOOP for a symbolic link
 * at either name, or an I/O errno. */
int k3_setup_partial_open(int dirfd, const char *name, uint64_t size, const uint8_t sha[32],
			  uint64_t chunk, const char *what, struct k3_setup_partial **out,
			  uint64_t *resume, struct k3_err *err);

/* Appends n bytes that belong at offset off, which must equal the bytes
 * written so far; off + n must not pass the size. The bytes are copied to
 * a ring that the download's writer thread writes, hashes and journals
 * (this call waits only when the ring is full). Returns 0, -ERANGE for an
 * offset or length that does not fit, or the writer's error from an
 * earlier write (-ENOSPC ...). */
int k3_setup_partial_write(struct k3_setup_partial *p, uint64_t off, const void *buf, size_t n,
			   struct k3_err *err);

/* Waits until every byte queued by write is in the file, hashed and
 * journalled (writes are handed to a writer thread). Returns 0 or the
 * writer's error. */
int k3_setup_partial_flush(struct k3_setup_partial *p, struct k3_err *err);

/* Back to zero bytes (a server answered a range request with the whole
 * file). 0 or the errno. */
int k3_setup_partial_restart(struct k3_setup_partial *p, struct k3_err *err);

/* Bytes written so far (the offset of the next write). */
uint64_t k3_setup_partial_bytes(const struct k3_setup_partial *p);

/* Every byte arrived: compares the digest. Mismatch: removes the partial
 * and its journal and returns -EBADMSG (the message gives both digests).
 * Match: publishes under the name (k3_setup_publish: never replacing
 * anything there, -EEXIST then) and removes the journal. Returns 0 or a
 * negative errno. The partial is closed in every case. */
int k3_setup_partial_finish(struct k3_setup_partial *p, struct k3_err *err);

/* What a resume of dirfd/<name>.partial would keep, without hashing: the
 * last journal checkpoint not past the partial's size (0 when there is no
 * partial or journal). For plans; the resume itself re-hashes. */
uint64_t k3_setup_partial_estimate(int dirfd, const char *name);

/* Closes, keeping the partial and its journal for a later resume (a
 * checkpoint at the current offset is journalled first, so an orderly stop
 * loses nothing; only a crash costs up to a chunk). Accepts NULL. */
void k3_setup_partial_close(struct k3_setup_partial *p);

#endif

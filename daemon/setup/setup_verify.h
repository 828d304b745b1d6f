/*
 * setup_verify.h - SHA-256 for downloads: a streaming hasher fed as bytes
 * arrive (OpenSSL EVP), digests of file ranges read back from disk, and the
 * lower-case hex spelling the inventory and the Hugging Face LFS object ids
 * use. Everything a download publishes or trusts goes through here, so a
 * file is accepted only when the bytes on disk hash to the pinned value.
 */
#ifndef K3_SETUP_VERIFY_H
#define K3_SETUP_VERIFY_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"

enum { K3_SETUP_SHA256_BYTES = 32, K3_SETUP_SHA256_HEX = 65 /* with NUL */ };

/* A streaming SHA-256. Opaque; owned by whoever made it. */
struct k3_setup_hasher;

/* Returns a fresh hasher, or NULL when out of memory. */
struct k3_setup_hasher *k3_setup_hasher_new(void);
/* Accepts NULL. */
void k3_setup_hasher_free(struct k3_setup_hasher *h);
/* Forgets everything fed so far (back to the empty message). 0 or -EIO. */
int k3_setup_hasher_reset(struct k3_setup_hasher *h);
/* Feeds n bytes. 0 or -EIO (OpenSSL refused). */
int k3_setup_hasher_update(struct k3_setup_hasher *h, const void *p, size_t n);
/* The digest of everything fed so far, without ending the stream (a copy
 * of the state is finalized): resume checkpoints use it. 0 or -EIO. */
int k3_setup_hasher_peek(const struct k3_setup_hasher *h, uint8_t out[K3_SETUP_SHA256_BYTES]);
/* Makes dst continue from src's state (a saved position). 0 or -EIO. */
int k3_setup_hasher_copy(struct k3_setup_hasher *dst, const struct k3_setup_hasher *src);
/* Bytes fed since new/reset. */
uint64_t k3_setup_hasher_bytes(const struct k3_setup_hasher *h);

/* Feeds `len` bytes of fd starting at `off` into h (pread in 4 MiB pieces,
 * EINTR and short reads retried). Returns 0, -EIO at an unexpected end of
 * file, or the read errno; err names `what`. */
int k3_setup_hash_fd(struct k3_setup_hasher *h, int fd, uint64_t off, uint64_t len,
		     const char *what, struct k3_err *err);

/* SHA-256 of `len` bytes of fd at `off` into out. Same errors. */
int k3_setup_sha256_fd(int fd, uint64_t off, uint64_t len, uint8_t out[K3_SETUP_SHA256_BYTES],
		       const char *what, struct k3_err *err);

/* 64 lower-case hex digits and a NUL into out. */
void k3_setup_sha256_hex(const uint8_t d[K3_SETUP_SHA256_BYTES], char out[K3_SETUP_SHA256_HEX]);
/* Parses exactly 64 hex digits (either case) into out. 0 or -EINVAL. */
int k3_setup_sha256_parse(const char *hex, uint8_t out[K3_SETUP_SHA256_BYTES]);

#endif

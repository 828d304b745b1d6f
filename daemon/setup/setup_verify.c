/* setup_verify.c - streamed SHA-256 and its hex form (see setup_verify.h). */
#include "setup/setup_verify.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <openssl/evp.h>

enum { READ_PIECE = 4 << 20 };

struct k3_setup_hasher {
	EVP_MD_CTX *ctx;
	uint64_t bytes;
};

struct k3_setup_hasher *k3_setup_hasher_new(void)
{
	struct k3_setup_hasher *h = calloc(1, sizeof(*h));

	if (!h)
		return NULL;
	h->ctx = EVP_MD_CTX_new();
	if (!h->ctx || k3_setup_hasher_reset(h) != 0) {
		k3_setup_hasher_free(h);
		return NULL;
	}
	return h;
}

void k3_setup_hasher_free(struct k3_setup_hasher *h)
{
	if (!h)
		return;
	EVP_MD_CTX_free(h->ctx);
	free(h);
}

int k3_setup_hasher_reset(struct k3_setup_hasher *h)
{
	h->bytes = 0;
	return EVP_DigestInit_ex(h->ctx, EVP_sha256(), NULL) == 1 ? 0 : -EIO;
}

int k3_setup_hasher_update(struct k3_setup_hasher *h, const void *p, size_t n)
{
	if (n == 0)
		return 0;
	if (EVP_DigestUpdate(h->ctx, p, n) != 1)
		return -EIO;
	h->bytes += n;
	return 0;
}

int k3_setup_hasher_peek(const struct k3_setup_hasher *h, uint8_t out[K3_SETUP_SHA256_BYTES])
{
	EVP_MD_CTX *copy = EVP_MD_CTX_new();
	unsigned len = K3_SETUP_SHA256_BYTES;
	int rc = -EIO;

	if (copy && EVP_MD_CTX_copy_ex(copy, h->ctx) == 1 && EVP_DigestFinal_ex(copy, out, &len) == 1)
		rc = 0;
	EVP_MD_CTX_free(copy);
	return rc;
}

int k3_setup_hasher_copy(struct k3_setup_hasher *dst, const struct k3_setup_hasher *src)
{
	if (EVP_MD_CTX_copy_ex(dst->ctx, src->ctx) != 1)
		return -EIO;
	dst->bytes = src->bytes;
	return 0;
}

uint64_t k3_setup_hasher_bytes(const struct k3_setup_hasher *h)
{
	return h->bytes;
}

int k3_setup_hash_fd(struct k3_setup_hasher *h, int fd, uint64_t off, uint64_t len,
		     const char *what, struct k3_err *err)
{
	size_t cap = len < READ_PIECE ? (size_t)len : READ_PIECE;
	uint8_t *buf = malloc(cap ? cap : 1);
	int rc = 0;

	if (!buf)
		return k3_err_set(err, -ENOMEM, "out of memory hashing '%s'", what);
	while (len > 0) {
		size_t want = len < cap ? (size_t)len : cap;
		ssize_t r = pread(fd, buf, want, (off_t)off);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			rc = k3_err_set(err, -errno, "cannot read '%s': %s", what, strerror(errno));
			break;
		}
		if (r == 0) {
			rc = k3_err_set(err, -EIO, "'%s' ends before byte %llu", what,
					(unsigned long long)off);
			break;
		}
		if (k3_setup_hasher_update(h, buf, (size_t)r) != 0) {
			rc = k3_err_set(err, -EIO, "SHA-256 of '%s' failed", what);
			break;
		}
		off += (uint64_t)r;
		len -= (uint64_t)r;
	}
	free(buf);
	return rc;
}

int k3_setup_sha256_fd(int fd, uint64_t off, uint64_t len, uint8_t out[K3_SETUP_SHA256_BYTES],
		       const char *what, struct k3_err *err)
{
	struct k3_setup_hasher *h = k3_setup_hasher_new();
	int rc;

	if (!h)
		return k3_err_set(err, -ENOMEM, "out of memory hashing '%s'", what);
	rc = k3_setup_hash_fd(h, fd, off, len, what, err);
	if (rc == 0 && k3_setup_hasher_peek(h, out) != 0)
		rc = k3_err_set(err, -EIO, "SHA-256 of '%s' failed", what);
	k3_setup_hasher_free(h);
	return rc;
}

void k3_setup_sha256_hex(const uint8_t d[K3_SETUP_SHA256_BYTES], char out[K3_SETUP_SHA256_HEX])
{
	static const char digits[] = "0123456789abcdef";

	for (int i = 0; i < K3_SETUP_SHA256_BYTES; i++) {
		out[2 * i] = digits[d[i] >> 4];
		out[2 * i + 1] = digits[d[i] & 15];
	}
	out[64] = '\0';
}

static int nibble(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

int k3_setup_sha256_parse(const char *hex, uint8_t out[K3_SETUP_SHA256_BYTES])
{
	if (!hex || strlen(hex) != 64)
		return -EINVAL;
	for (int i = 0; i < K3_SETUP_SHA256_BYTES; i++) {
		int hi = nibble(hex[2 * i]), lo = nibble(hex[2 * i + 1]);
		if (hi < 0 || lo < 0)
			return -EINVAL;
		out[i] = (uint8_t)(hi << 4 | lo);
	}
	return 0;
}

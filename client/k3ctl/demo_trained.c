/*
 * demo_trained.c - installs the embedded trained demo checkpoint (see
 * demo_trained.h): every file is hashed before anything is written, so a
 * k3ctl whose embedded bytes do not match the recipe's SHA256SUMS writes
 * nothing and says which file differs.
 */
#include "demo_trained.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/evp.h>

static int sha256_hex(const unsigned char *p, size_t n, char out[65])
{
	unsigned char md[EVP_MAX_MD_SIZE];
	unsigned int len = 0;

	if (!EVP_Digest(p, n, md, &len, EVP_sha256(), NULL) || len != 32)
		return -EIO;
	for (unsigned i = 0; i < 32; i++)
		snprintf(out + 2 * i, 3, "%02x", md[i]);
	return 0;
}

int k3ctl_trained_install(const char *out, unsigned long long *bytes, struct k3_err *err)
{
	char hex[65], path[4096];

	*bytes = 0;
	for (size_t i = 0; i < k3ctl_trained_n_files; i++) {
		const struct k3ctl_trained_file *f = &k3ctl_trained_files[i];
		if (sha256_hex(f->data, f->size, hex))
			return k3_err_set(err, -EIO, "SHA-256 of the embedded %s failed", f->name);
		if (strcmp(hex, f->sha256) != 0)
			return k3_err_set(err, -EBADMSG,
					  "the embedded %s has SHA-256 %s, the recipe records %s: "
					  "this k3ctl was built from a different checkpoint; rebuild it",
					  f->name, hex, f->sha256);
	}
	if (mkdir(out, 0755) != 0 && errno != EEXIST)
		return k3_err_set(err, -errno, "%s: %s", out, strerror(errno));
	for (size_t i = 0; i < k3ctl_trained_n_files; i++) {
		const struct k3ctl_trained_file *f = &k3ctl_trained_files[i];
		if ((size_t)snprintf(path, sizeof(path), "%s/%s", out, f->name) >= sizeof(path))
			return k3_err_set(err, -ENAMETOOLONG, "%s/%s: path too long", out, f->name);
		FILE *o = fopen(path, "wb");
		if (!o)
			return k3_err_set(err, -errno, "%s: %s", path, strerror(errno));
		size_t w = fwrite(f->data, 1, f->size, o);
		if (fclose(o) != 0 || w != f->size)
			return k3_err_set(err, -EIO, "%s: write failed", path);
		*bytes += f->size;
	}
	return 0;
}

void k3ctl_trained_remove(const char *dir)
{
	char path[4096];

	for (size_t i = 0; i < k3ctl_trained_n_files; i++)
		if ((size_t)snprintf(path, sizeof(path), "%s/%s", dir, k3ctl_trained_files[i].name) <
		    sizeof(path))
			unlink(path);
	rmdir(dir);   /* fails, harmlessly, when something else is there */
}

/*
 * fuzz_store_pack.c - any bytes as an expert or spine pack file
 * (store_pack.h). The harness re-signs the metadata and header SHA-256
 * fields before opening, so mutations reach the structural checks instead
 * of stopping at the hashes. Properties: no crash, no read outside the
 * file; an accepted expert pack yields a source whose every expert plans
 * and reads back inside the file; an accepted spine pack's every span reads
 * back inside the file and every tensor lies inside its span.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "store/store_pack.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint64_t le64(const uint8_t *p)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t *buf = malloc(size ? size : 1);
	struct k3_store_pack *pack = NULL;
	struct k3_store_source *src = NULL;
	char path[64];
	unsigned len = 32;
	int fd;

	if (!buf)
		return 0;
	memcpy(buf, data, size);
	if (size >= 4096) {
		uint64_t meta = le64(buf + 32);
		if (meta <= size - 4096)
			EVP_Digest(buf + 4096, (size_t)meta, buf + 56, &len, EVP_sha256(), NULL);
		EVP_Digest(buf, 88, buf + 88, &len, EVP_sha256(), NULL);
	}
	fd = memfd_create("k3pack", MFD_CLOEXEC);
	if (fd < 0 || write(fd, buf, size) != (ssize_t)size)
		goto out;
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	if (k3_store_pack_open(path, NULL, 0, K3_STORE_PACK_VERIFY, &pack, NULL) != 0)
		goto out;
	src = k3_store_source_new(K3_STORE_DIRECT_OFF);
	if (src && k3_store_pack_kind(pack) == K3_STORE_PACK_SPINE) {
		const struct k3_store_pack_layout *lo = k3_store_pack_layout(pack);
		uint32_t file;
		void *slot = NULL;
		if (k3_store_source_add_file(src, path, &file, NULL) == 0 &&
		    posix_memalign(&slot, 4096, size + 8192) == 0) {
			for (size_t i = 0; i < lo->n_spans; i++) {
				const struct k3_store_pack_span *sp = &lo->spans[i];
				struct k3_store_read rd = { .file = file, .offset = sp->offset,
							    .length = sp->length };
				if (k3_store_source_pread(src, &rd, slot) < 0)
					abort();   /* the pack said it fits */
				for (uint32_t j = sp->first; j < sp->first + sp->count; j++)
					if (lo->arrays[j].offset + lo->arrays[j].length > sp->length)
						abort();
			}
		}
		free(slot);
	} else if (src && k3_store_pack_add_to_source(pack, path, src, NULL) == 0) {
		uint64_t slot_bytes = k3_store_source_slot_bytes(src);
		void *slot = NULL;
		struct k3_store_plan plan;
		if (slot_bytes <= (64u << 20) && posix_memalign(&slot, 4096, slot_bytes) == 0) {
			for (size_t i = 0; i < k3_store_source_count(src); i++) {
				k3_store_source_plan(src, i, &plan);
				for (unsigned r = 0; r < plan.n_reads; r++)
					if (k3_store_source_pread(src, &plan.read[r], slot) < 0)
						abort();   /* the pack said it fits */
			}
			free(slot);
		}
	}
out:
	k3_store_source_free(src);
	k3_store_pack_free(pack);
	if (fd >= 0)
		close(fd);
	free(buf);
	return 0;
}

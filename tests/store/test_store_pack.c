/* Expert packs: round trip (every byte equals the shard bytes), re-run keeps
 * the pack, --verify rechecks, damage and stale sources are detected. */
#include "t.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include "store/store_pack.h"
#include "fixture.h"

static void idents(struct fixture *fx, struct k3_store_pack_ident *id)
{
	for (int s = 0; s < FX_SHARDS; s++) {
		struct k3_err err = { 0 };
		const char *name = strrchr(fx->shard[s], '/') + 1;
		int rc = k3_store_pack_ident(fx->shard[s], name, 0, &id[s], &err);
		if (rc)
			printf("ident: %s\n", err.msg);
		T_EQ_INT(rc, 0);
		T_EQ_U64(id[s].header_bytes, 8 + FX_HEADER);
		T_EQ_U64(id[s].size, fx->size[s]);
	}
}

/* Reads every expert of a pack source and compares with the shard bytes. */
static void check_pack_bytes(struct fixture *fx, const char *pack_path)
{
	struct k3_store_pack *pack = NULL;
	struct k3_store_source *src = k3_store_source_new(K3_STORE_DIRECT_AUTO);
	struct k3_err err = { 0 };
	struct k3_store_plan plan;
	void *slot = NULL;
	int bad = 0;

	T_EQ_INT(k3_store_pack_open(pack_path, NULL, 0, K3_STORE_PACK_VERIFY, &pack, &err), 0);
	if (!pack)
		goto out;
	T_EQ_INT(k3_store_pack_add_to_source(pack, pack_path, src, &err), 0);
	T_EQ_U64(k3_store_source_count(src), fx->n_ex);
	T_OK(posix_memalign(&slot, K3_STORE_ALIGN, k3_store_source_slot_bytes(src)) == 0);
	for (size_t i = 0; i < k3_store_source_count(src); i++) {
		const struct k3_store_expert *e = k3_store_source_expert(src, i);
		size_t fi = fx_find(fx, e->layer, e->expert);
		k3_store_source_plan(src, i, &plan);
		/* A pack span is one read. */
		T_EQ_INT(plan.n_reads, 1);
		T_EQ_U64(e->ext[0].offset % K3_STORE_ALIGN, 0);
		T_EQ_U64(k3_store_source_pread(src, &plan.read[0], slot) >= (int64_t)plan.useful_bytes, 1);
		for (int a = 0; a < K3_STORE_ARRAYS; a++) {
			T_EQ_U64(plan.array_length[a], fx_len[a]);
			bad += memcmp((uint8_t *)slot + plan.array_offset[a], fx_array(fx, fi, a),
				      fx_len[a]) != 0;
		}
	}
	T_EQ_INT(bad, 0);
out:
	free(slot);
	k3_store_source_free(src);
	k3_store_pack_free(pack);
}

static void flip_byte(const char *path, off_t off)
{
	int fd = open(path, O_RDWR);
	uint8_t b = 0;
	T_OK(fd >= 0);
	T_EQ_INT(pread(fd, &b, 1, off), 1);
	b ^= 0x5a;
	T_EQ_INT(pwrite(fd, &b, 1, off), 1);
	close(fd);
}

int main(void)
{
	struct fixture fx;
	struct k3_store_pack_ident id[FX_SHARDS];
	struct k3_store_pack_result res;
	struct k3_store_pack *pack = NULL;
	struct k3_store_source *src;
	struct k3_err err = { 0 };
	char path[400];
	int rc;

	if (fx_init(&fx) != 0)
		return t_skip("cannot create the fixture in a temp dir");
	snprintf(path, sizeof(path), "%s/experts.k3pack", fx.dir);
	idents(&fx, id);
	src = fx_source(&fx, K3_STORE_DIRECT_OFF, &err);
	T_OK(src != NULL);
	if (!src)
		goto out;

	/* First run writes, reads back, publishes. */
	rc = k3_store_pack_write(path, src, id, FX_SHARDS, 0, &res, &err);
	if (rc)
		printf("write: %s\n", err.msg);
	T_EQ_INT(rc, 0);
	T_OK(res.written);
	T_OK(!res.replaced);
	T_EQ_U64(res.n_experts, fx.n_ex);
	T_EQ_U64(res.payload_bytes, fx.n_ex * (3000 + 190 + 2600 + 170 + 3000 + 190));
	T_OK(res.verified_bytes >= res.payload_bytes);
	T_EQ_INT(fx_dir_entries(&fx), FX_SHARDS + 1);   /* no temp file left */
	check_pack_bytes(&fx, path);

	/* The reader checks the sources it was built from. */
	T_EQ_INT(k3_store_pack_open(path, id, FX_SHARDS, 0, &pack, &err), 0);
	T_EQ_U64(k3_store_pack_expert_count(pack), fx.n_ex);
	T_EQ_U64(k3_store_pack_source_count(pack), FX_SHARDS);
	T_EQ_STR(k3_store_pack_source(pack, 1)->name, "model-00002-of-00002.safetensors");
	k3_store_pack_free(pack);
	pack = NULL;

	/* Re-run: kept, not rewritten; --verify rehashes every span. */
	struct stat st0, st1;
	T_EQ_INT(stat(path, &st0), 0);
	T_EQ_INT(k3_store_pack_write(path, src, id, FX_SHARDS, 0, &res, &err), 0);
	T_OK(!res.written);
	T_EQ_U64(res.verified_bytes, 0);
	T_EQ_INT(k3_store_pack_write(path, src, id, FX_SHARDS, K3_STORE_PACK_VERIFY, &res, &err), 0);
	T_OK(!res.written);
	T_OK(res.verified_bytes >= res.payload_bytes);
	T_EQ_INT(stat(path, &st1), 0);
	T_EQ_U64(st0.st_ino, st1.st_ino);

	/* One flipped weight byte: --verify names it; the file is left alone. */
	{
		struct k3_store_pack *p2 = NULL;
		T_EQ_INT(k3_store_pack_open(path, NULL, 0, 0, &p2, &err), 0);
		k3_store_source_free(src);
		src = k3_store_source_new(K3_STORE_DIRECT_OFF);
		T_EQ_INT(k3_store_pack_add_to_source(p2, path, src, &err), 0);
		off_t off = (off_t)k3_store_source_expert(src, 7)->ext[K3_STORE_W2_PACKED].offset + 11;
		k3_store_pack_free(p2);
		k3_store_source_free(src);
		src = fx_source(&fx, K3_STORE_DIRECT_OFF, &err);
		flip_byte(path, off);
	}
	memset(&err, 0, sizeof(err));
	T_EQ_INT(k3_store_pack_write(path, src, id, FX_SHARDS, K3_STORE_PACK_VERIFY, &res, &err),
		 -EBADMSG);
	T_OK(strstr(err.msg, "SHA-256") != NULL);
	T_EQ_INT(k3_store_pack_open(path, id, FX_SHARDS, K3_STORE_PACK_VERIFY, &pack, &err), -EBADMSG);
	T_OK(pack == NULL);
	/* Without --verify the structure is still valid (hashes are per span). */
	T_EQ_INT(k3_store_pack_open(path, id, FX_SHARDS, 0, &pack, &err), 0);
	k3_store_pack_free(pack);
	pack = NULL;

	/* Damage in the header or directory is always caught. */
	flip_byte(path, 20);
	T_EQ_INT(k3_store_pack_open(path, NULL, 0, 0, &pack, &err), -EBADMSG);
	flip_byte(path, 20);
	flip_byte(path, 4096 + 700);
	T_EQ_INT(k3_store_pack_open(path, NULL, 0, 0, &pack, &err), -EBADMSG);
	T_OK(strstr(err.msg, "metadata") != NULL);
	flip_byte(path, 4096 + 700);
	T_EQ_INT(truncate(path, (off_t)res.file_bytes - 1), 0);
	T_EQ_INT(k3_store_pack_open(path, NULL, 0, 0, &pack, &err), -EBADMSG);

	/* A damaged pack is replaced by a re-run without --verify only when
	 * its structure is bad (here: truncated). */
	T_EQ_INT(k3_store_pack_write(path, src, id, FX_SHARDS, 0, &res, &err), 0);
	T_OK(res.written);
	T_OK(res.replaced);
	check_pack_bytes(&fx, path);

	/* Changed sources: the pack is stale, and a re-run replaces it. */
	fx.bytes[0][8 + 5] ^= 1;
	T_EQ_INT(fx_write_file(fx.shard[0], fx.bytes[0], fx.size[0]), 0);
	idents(&fx, id);
	T_EQ_INT(k3_store_pack_open(path, id, FX_SHARDS, 0, &pack, &err), -ESTALE);
	T_EQ_INT(k3_store_pack_write(path, src, id, FX_SHARDS, K3_STORE_PACK_VERIFY, &res, &err), 0);
	T_OK(res.written);
	T_OK(res.replaced);
	check_pack_bytes(&fx, path);

	/* Not a pack at all. */
	T_EQ_INT(k3_store_pack_open(fx.shard[1], NULL, 0, 0, &pack, &err), -EBADMSG);
	T_EQ_INT(k3_store_pack_open("/nonexistent/x.k3pack", NULL, 0, 0, &pack, &err), -ENOENT);
out:
	k3_store_source_free(src);
	fx_release(&fx);
	return t_done();
}

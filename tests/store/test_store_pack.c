/* Expert packs: round trip (every byte equals the shard bytes), re-run keeps
 * the pack, --verify rechecks, damage and stale sources are detected; the
 * source identity field by field (a touched mtime, a ctime, a copy under
 * another inode: the pack is refused until the writer compared it with
 * the source, which then re-signs it in place without rewriting), a stale
 * pack behind an unchanged identity caught by VERIFY's comparison, a
 * source changed under the writer, packs of format 1. */
#include "t.h"

#include <errno.h>
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <openssl/evp.h>

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

/* Recomputes the metadata and header SHA-256 of the pack at path after a
 * test edited its bytes (what a writer that lies would do). */
static void resign_raw(const char *path)
{
	int fd = open(path, O_RDWR);
	uint8_t hdr[4096], *meta;
	uint64_t meta_bytes = 0;
	unsigned len = 32;

	T_OK(fd >= 0);
	T_EQ_INT(pread(fd, hdr, sizeof(hdr), 0), (int)sizeof(hdr));
	for (int i = 7; i >= 0; i--)
		meta_bytes = meta_bytes << 8 | hdr[32 + i];
	meta = malloc(meta_bytes);
	T_OK(meta != NULL);
	T_EQ_INT(pread(fd, meta, meta_bytes, 4096), (int)meta_bytes);
	EVP_Digest(meta, meta_bytes, hdr + 56, &len, EVP_sha256(), NULL);
	EVP_Digest(hdr, 88, hdr + 88, &len, EVP_sha256(), NULL);
	T_EQ_INT(pwrite(fd, hdr, sizeof(hdr), 0), (int)sizeof(hdr));
	free(meta);
	close(fd);
}

static ino_t inode_of(const char *path)
{
	struct stat st;
	return stat(path, &st) == 0 ? st.st_ino : 0;
}

/* Each identity field on its own: which ones name another file, which ones
 * only say the file changed. */
static void test_ident_match(const struct k3_store_pack_ident *base)
{
	static const struct {
		const char *field;
		enum k3_store_pack_match want;
	} cases[] = {
		{ "name", K3_STORE_PACK_OTHER }, { "size", K3_STORE_PACK_OTHER },
		{ "header", K3_STORE_PACK_OTHER }, { "SHA-256", K3_STORE_PACK_OTHER },
		{ "device", K3_STORE_PACK_CHANGED }, { "inode", K3_STORE_PACK_CHANGED },
		{ "mtime", K3_STORE_PACK_CHANGED }, { "ctime", K3_STORE_PACK_CHANGED },
	};
	struct k3_store_pack_ident a = *base, b;
	char what[128];

	T_EQ_INT(k3_store_pack_ident_match(&a, base, what, sizeof(what)), K3_STORE_PACK_SAME);
	T_EQ_STR(what, "");
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		b = a;
		b.has_sha256 = a.has_sha256 = false;
		switch (i) {
		case 0: b.name[0] ^= 1; break;
		case 1: b.size++; break;
		case 2: b.header_sha256[31] ^= 1; break;
		case 3: a.has_sha256 = b.has_sha256 = true; b.sha256[0] = 1; break;
		case 4: b.dev++; break;
		case 5: b.ino++; break;
		case 6: b.mtime_ns++; break;
		default: b.ctime_ns++; break;
		}
		T_EQ_INT(k3_store_pack_ident_match(&a, &b, what, sizeof(what)), cases[i].want);
		T_EQ_STR(what, cases[i].field);
	}
	/* a whole-file SHA-256 only in the pack says nothing (k3d never
	 * knows one); a verified one the pack lacks means "compare and
	 * record it" (issue 20, item 6) */
	a = b = *base;
	a.has_sha256 = true;
	a.sha256[3] = 9;
	T_EQ_INT(k3_store_pack_ident_match(&a, &b, NULL, 0), K3_STORE_PACK_SAME);
	T_EQ_INT(k3_store_pack_ident_match(&b, &a, what, sizeof(what)), K3_STORE_PACK_CHANGED);
	T_EQ_STR(what, "verified SHA-256");
	/* several fields: the worst decides, all are named */
	b = a;
	b.mtime_ns++;
	b.ino++;
	b.size++;
	T_EQ_INT(k3_store_pack_ident_match(&a, &b, what, sizeof(what)), K3_STORE_PACK_OTHER);
	T_EQ_STR(what, "size, inode, mtime");
}

/* A pack whose shard 0 changed identity only: refused at open (naming the
 * shard and `field`), then re-verified by the writer without a rewrite,
 * then accepted. src must read the shard as it is now. */
static void expect_reverify(struct fixture *fx, const char *path, struct k3_store_source *src,
			    struct k3_store_pack_ident *id, const char *field)
{
	struct k3_store_pack_result res;
	struct k3_store_pack *pack = NULL;
	struct k3_err err = { 0 };
	ino_t ino = inode_of(path);

	idents(fx, id);
	T_EQ_INT(k3_store_pack_open(path, id, FX_SHARDS, 0, &pack, &err), -ESTALE);
	T_OK(strstr(err.msg, "model-00001-of-00002.safetensors") != NULL &&
	     strstr(err.msg, field) != NULL && strstr(err.msg, "k3ctl pack") != NULL);
	if (!strstr(err.msg, field))
		printf("     %s: %s\n", field, err.msg);
	T_EQ_INT(k3_store_pack_write(path, src, id, FX_SHARDS, 0, &res, &err), 0);
	T_OK(!res.written && res.reverified);
	T_OK(res.verified_bytes >= res.payload_bytes);
	T_OK(strstr(res.why, field) != NULL);
	T_EQ_U64(inode_of(path), ino);   /* re-signed in place, not rewritten */
	T_EQ_INT(k3_store_pack_open(path, id, FX_SHARDS, 0, &pack, &err), 0);
	k3_store_pack_free(pack);
	check_pack_bytes(fx, path);
	/* and now it is SAME: kept without a comparison */
	T_EQ_INT(k3_store_pack_write(path, src, id, FX_SHARDS, 0, &res, &err), 0);
	T_OK(!res.written && !res.reverified && res.verified_bytes == 0);
}

static void test_identity(struct fixture *fx, const char *path)
{
	struct k3_store_pack_ident id[FX_SHARDS], old_id[FX_SHARDS];
	struct k3_store_pack_result res;
	struct k3_store_pack *pack = NULL;
	struct k3_err err = { 0 };
	struct k3_store_source *src = fx_source(fx, K3_STORE_DIRECT_OFF, &err);
	struct timespec later[2];
	struct stat st;
	char copy[400];

	if (!src)
		return;
	idents(fx, id);
	test_ident_match(&id[0]);
	T_EQ_INT(k3_store_pack_write(path, src, id, FX_SHARDS, 0, &res, &err), 0);
	memcpy(old_id, id, sizeof(id));

	/* mtime touched, bytes the same */
	T_EQ_INT(stat(fx->shard[0], &st), 0);
	later[0] = later[1] = st.st_mtim;
	later[1].tv_sec += 7;
	T_EQ_INT(utimensat(AT_FDCWD, fx->shard[0], later, 0), 0);
	expect_reverify(fx, path, src, id, "mtime");

	/* ctime alone (a chmod): the time stamp moves on a clock tick */
	nanosleep(&(struct timespec){ 0, 30000000 }, NULL);
	T_EQ_INT(chmod(fx->shard[0], 0600), 0);
	T_EQ_INT(chmod(fx->shard[0], 0644), 0);
	idents(fx, id);
	T_EQ_INT(k3_store_pack_open(path, id, FX_SHARDS, 0, &pack, &err), -ESTALE);
	T_OK(strstr(err.msg, "(ctime changed)") != NULL);
	expect_reverify(fx, path, src, id, "ctime");

	/* another inode with the same bytes (a copy renamed over the shard):
	 * the writer's old descriptor reads the old file, which it refuses;
	 * a source opened now re-verifies */
	snprintf(copy, sizeof(copy), "%s.copy", fx->shard[0]);
	T_EQ_INT(fx_write_file(copy, fx->bytes[0], fx->size[0]), 0);
	T_EQ_INT(rename(copy, fx->shard[0]), 0);
	idents(fx, id);
	T_EQ_INT(k3_store_pack_write(path, src, id, FX_SHARDS, 0, &res, &err), -EAGAIN);
	T_OK(strstr(err.msg, "changed before k3ctl pack read it") != NULL &&
	     strstr(err.msg, "inode") != NULL);
	k3_store_source_free(src);
	src = fx_source(fx, K3_STORE_DIRECT_OFF, &err);
	expect_reverify(fx, path, src, id, "inode");

	/* Other bytes of the same length (an expert's array rewritten in
	 * place, header and size unchanged): the changed mtime makes the
	 * writer compare, and the stale pack is rewritten. */
	memcpy(old_id, id, sizeof(id));
	{
		const struct k3_store_extent *x = &fx->ex[4].ext[K3_STORE_W3_PACKED];
		uint8_t *p = fx->bytes[x->file] + x->offset;
		p[10] ^= 0xff;
		T_EQ_INT(fx_write_file(fx->shard[x->file], fx->bytes[x->file], fx->size[x->file]), 0);
	}
	idents(fx, id);
	T_EQ_INT(k3_store_pack_open(path, id, FX_SHARDS, 0, &pack, &err), -ESTALE);
	T_EQ_INT(k3_store_pack_write(path, src, id, FX_SHARDS, 0, &res, &err), 0);
	T_OK(res.written && res.replaced && !res.reverified);
	T_OK(strstr(res.why, "differs from its bytes") != NULL);
	check_pack_bytes(fx, path);

	/* A stale pack behind an identity that looks unchanged (bytes changed
	 * below the file system, or a writer that lies): the start-up check
	 * cannot see it, a run without VERIFY keeps it, VERIFY's comparison
	 * rewrites it. */
	{
		uint8_t *head = NULL;
		size_t head_bytes = 0;
		const struct k3_store_extent *x = &fx->ex[9].ext[K3_STORE_W1_SCALE];
		fx->bytes[x->file][x->offset + 3] ^= 0x11;
		T_EQ_INT(fx_write_file(fx->shard[x->file], fx->bytes[x->file], fx->size[x->file]), 0);
		idents(fx, id);
		T_EQ_INT(k3_store_pack_open(path, NULL, 0, 0, &pack, &err), 0);
		T_EQ_INT(k3_store_pack_encode_head(id, FX_SHARDS, k3_store_pack_layout(pack), &head,
						   &head_bytes), 0);
		k3_store_pack_free(pack);
		int fd = open(path, O_WRONLY);
		T_EQ_INT(pwrite(fd, head, head_bytes, 0), (int)head_bytes);
		close(fd);
		free(head);
	}
	T_EQ_INT(k3_store_pack_open(path, id, FX_SHARDS, 0, &pack, &err), 0);
	k3_store_pack_free(pack);
	pack = NULL;
	T_EQ_INT(k3_store_pack_write(path, src, id, FX_SHARDS, 0, &res, &err), 0);
	T_OK(!res.written && res.verified_bytes == 0);
	T_EQ_INT(k3_store_pack_write(path, src, id, FX_SHARDS, K3_STORE_PACK_VERIFY, &res, &err), 0);
	T_OK(res.written && res.replaced);
	T_OK(strstr(res.why, "expert (") != NULL && strstr(res.why, "differs") != NULL);
	check_pack_bytes(fx, path);

	/* Format 1 (no file identities): refused with what to run, rewritten
	 * by the writer. A source record with a reserved byte set is refused. */
	{
		int fd = open(path, O_RDWR);
		uint8_t one = 1;
		T_EQ_INT(pwrite(fd, &one, 1, 8), 1);
		close(fd);
		resign_raw(path);
	}
	T_EQ_INT(k3_store_pack_open(path, id, FX_SHARDS, 0, &pack, &err), -EBADMSG);
	T_OK(strstr(err.msg, "format 1") != NULL && strstr(err.msg, "k3ctl pack --model") != NULL);
	T_EQ_INT(k3_store_pack_write(path, src, id, FX_SHARDS, 0, &res, &err), 0);
	T_OK(res.written && res.replaced && strstr(res.why, "format 1") != NULL);
	{
		int fd = open(path, O_RDWR);
		uint8_t b = 1;
		T_EQ_INT(pwrite(fd, &b, 1, 4096 + 384 + 380), 1);   /* record 1, reserved */
		close(fd);
		resign_raw(path);
	}
	T_EQ_INT(k3_store_pack_open(path, NULL, 0, 0, &pack, &err), -EBADMSG);
	T_OK(strstr(err.msg, "source record 1") != NULL);
	T_EQ_INT(k3_store_pack_write(path, src, id, FX_SHARDS, 0, &res, &err), 0);
	T_OK(res.written);
	check_pack_bytes(fx, path);
	k3_store_source_free(src);
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
	T_EQ_U64(res.n_spans, fx.n_ex);
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

	test_identity(&fx, path);

	/* Not a pack at all. */
	T_EQ_INT(k3_store_pack_open(fx.shard[1], NULL, 0, 0, &pack, &err), -EBADMSG);
	T_EQ_INT(k3_store_pack_open("/nonexistent/x.k3pack", NULL, 0, 0, &pack, &err), -ENOENT);
out:
	k3_store_source_free(src);
	fx_release(&fx);
	return t_done();
}

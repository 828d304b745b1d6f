/*
 * test_setup_units.c - daemon/setup's pieces without a network: inventory
 * parsing and its refusals, the listing merge and its mismatches, the
 * redirect allow list, resumable partials (orderly stop, crash, on-disk
 * damage, a wrong digest, a name that appeared), the state file, the
 * expert table and the expert-tensor names.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "setup/setup_experts.h"
#include "setup/setup_inventory.h"
#include "setup/setup_partial.h"
#include "setup/setup_publish.h"
#include "setup/setup_state.h"
#include "setup/setup_verify.h"
#include "t.h"

#define SHA_A "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
#define SHA_B "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"

static const char *doc(const char *files, const char *extra)
{
	/* one buffer per call: a table of cases holds many at once */
	static char bufs[32][2048];
	static unsigned next;
	char *buf = bufs[next++ % 32];

	snprintf(buf, sizeof(bufs[0]), "{\"format\":\"k3-inventory\",\"version\":1,\"name\":\"m\","
		 "\"repository\":\"o/m\",\"revision\":\"r1\",\"base_url\":\"https://h.example/m/\"%s,"
		 "\"files\":[%s]}", extra, files);
	return buf;
}

static int parse(const char *text, struct k3_err *err)
{
	struct k3_setup_inventory *inv = NULL;
	int rc = k3_setup_inventory_parse(text, strlen(text), &inv, err);

	k3_setup_inventory_free(inv);
	return rc;
}

static void test_inventory(void)
{
	struct k3_setup_inventory *inv = NULL, *again = NULL;
	struct k3_err err = { 0, "" };
	const char *good = doc("{\"path\":\"b.safetensors\",\"size\":10,\"sha256\":\"" SHA_A "\","
			       "\"spine_bytes\":8},{\"path\":\"a.json\",\"size\":null,\"sha256\":\""
			       SHA_B "\"}", ",\"allow_hosts\":[\"*.hf.co\"]");
	char *text;

	T_EQ_INT(k3_setup_inventory_parse(good, strlen(good), &inv, &err), 0);
	if (!inv)
		return;
	T_EQ_INT(inv->n_files, 2);
	T_EQ_STR(inv->files[0].path, "a.json");   /* sorted */
	T_OK(!inv->files[0].size_known && inv->files[0].sha_known);
	T_OK(inv->files[1].spine_known && inv->files[1].spine_bytes == 8);
	T_OK(k3_setup_inventory_incomplete(inv) == &inv->files[0]);
	T_EQ_U64(k3_setup_inventory_bytes(inv), 10);
	text = k3_setup_inventory_dump(inv);
	T_OK(text != NULL);
	T_EQ_INT(k3_setup_inventory_parse(text, strlen(text), &again, &err), 0);
	if (again) {
		char *text2 = k3_setup_inventory_dump(again);
		T_EQ_STR(text2, text);   /* a dump parses back to itself */
		T_EQ_INT(k3_setup_inventory_agree(inv, again, &err), 0);
		again->files[1].sha256[0] ^= 1;
		T_EQ_INT(k3_setup_inventory_agree(inv, again, &err), -EBADMSG);
		free(text2);
	}
	free(text);
	k3_setup_inventory_free(again);
	k3_setup_inventory_free(inv);

	/* refusals, each naming what is wrong */
	struct { const char *text, *msg; } bad[] = {
		{ doc("{\"path\":\"../x\",\"size\":1,\"sha256\":\"" SHA_A "\"}", ""), "files[0].path" },
		{ doc("{\"path\":\"a/b\",\"size\":1,\"sha256\":\"" SHA_A "\"}", ""), "files[0].path" },
		{ doc("{\"path\":\".k3-setup\",\"size\":1,\"sha256\":\"" SHA_A "\"}", ""), "files[0].path" },
		{ doc("{\"path\":\"x.partial\",\"size\":1,\"sha256\":\"" SHA_A "\"}", ""), "files[0].path" },
		{ doc("{\"path\":\"x\",\"size\":1,\"sha256\":\"abc\"}", ""), "files[0].sha256" },
		{ doc("{\"path\":\"x\",\"size\":1125899906842624,\"sha256\":\"" SHA_A "\"}", ""), "files[0].size" },
		{ doc("{\"path\":\"x\",\"size\":-1,\"sha256\":\"" SHA_A "\"}", ""), "files[0].size" },
		{ doc("{\"path\":\"x\",\"size\":1,\"sha256\":\"" SHA_A "\",\"mode\":1}", ""), "unknown key 'mode'" },
		{ doc("{\"path\":\"x\",\"size\":1,\"sha256\":\"" SHA_A "\"},{\"path\":\"x\",\"size\":1,"
		      "\"sha256\":\"" SHA_A "\"}", ""), "listed twice" },
		{ doc("{\"path\":\"x\",\"size\":1,\"sha256\":\"" SHA_A "\"}", ",\"expert_table\":\"t\""),
		  "expert_table" },
		{ doc("{\"path\":\"x\",\"size\":1,\"sha256\":\"" SHA_A "\"}", ",\"allow_hosts\":[\"Evil\"]"),
		  "allow_hosts[0]" },
		{ doc("", ""), "'files'" },
		{ "{\"format\":\"k3-inventory\",\"version\":2}", "'version'" },
		{ "{\"format\":\"k3-inventory\",\"version\":1,\"name\":\"m\",\"repository\":\"o/m\","
		  "\"revision\":\"r\",\"base_url\":\"http://h/\",\"files\":[]}", "base_url" },
		{ "{\"format\":\"k3-inventory\",\"version\":1,\"name\":\"m\",\"repository\":\"o/m\","
		  "\"revision\":\"r\",\"base_url\":\"https://h/no-slash\",\"files\":[]}", "base_url" },
		{ "[1,2]", "not a JSON object" },
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		memset(&err, 0, sizeof(err));
		T_EQ_INT(parse(bad[i].text, &err), -EINVAL);
		if (!T_OK(strstr(err.msg, bad[i].msg) != NULL))
			printf("     case %zu: '%s' does not name '%s'\n", i, err.msg, bad[i].msg);
	}
}

static void test_listing(void)
{
	const char *text = doc("{\"path\":\"s\",\"size\":null,\"sha256\":null},{\"path\":\"c\","
			       "\"size\":5,\"sha256\":\"" SHA_A "\"}", "");
	struct k3_setup_inventory *inv = NULL;
	struct k3_err err = { 0, "" };
	bool seen[2] = { false, false };
	const char *page1 = "[{\"type\":\"directory\",\"path\":\"d\"},{\"type\":\"file\",\"path\":\"s\","
			    "\"size\":77,\"lfs\":{\"oid\":\"sha256:" SHA_B "\",\"size\":77}},"
			    "{\"type\":\"file\",\"path\":\"other\",\"size\":1}]";

	T_EQ_INT(k3_setup_inventory_parse(text, strlen(text), &inv, &err), 0);
	if (!inv)
		return;
	T_EQ_INT(k3_setup_inventory_apply_listing(inv, page1, strlen(page1), seen, &err), 0);
	const struct k3_setup_file *s = k3_setup_inventory_find(inv, "s");
	T_OK(s && s->size_known && s->size == 77 && s->sha_known && s->sha256[0] == 0xbb);
	T_OK(seen[1] && !seen[0]);   /* "s" sorts after "c" */
	T_OK(k3_setup_inventory_incomplete(inv) == NULL);
	/* a pinned value the listing contradicts */
	const char *wrong_size = "[{\"type\":\"file\",\"path\":\"c\",\"size\":6}]";
	T_EQ_INT(k3_setup_inventory_apply_listing(inv, wrong_size, strlen(wrong_size), seen, &err),
		 -EBADMSG);
	T_OK(strstr(err.msg, "manifest mismatch") && strstr(err.msg, "'c'"));
	const char *wrong_sha = "[{\"type\":\"file\",\"path\":\"c\",\"size\":5,\"lfs\":{\"oid\":\""
				SHA_B "\"}}]";
	T_EQ_INT(k3_setup_inventory_apply_listing(inv, wrong_sha, strlen(wrong_sha), seen, &err),
		 -EBADMSG);
	T_OK(strstr(err.msg, "SHA-256") != NULL);
	T_EQ_INT(k3_setup_inventory_apply_listing(inv, "{}", 2, seen, &err), -EINVAL);
	k3_setup_inventory_free(inv);
}

static void test_hosts(void)
{
	char *hosts[] = { "huggingface.co", "*.hf.co" };
	char h[256];

	T_EQ_INT(k3_setup_url_host("https://user:pw@CDN.HF.co:8443/x?y", h, sizeof(h)), 0);
	T_EQ_STR(h, "cdn.hf.co");
	T_EQ_INT(k3_setup_url_host("https://[::1]:9/x", h, sizeof(h)), 0);
	T_EQ_STR(h, "::1");
	T_EQ_INT(k3_setup_url_host("http://huggingface.co/", h, sizeof(h)), -EINVAL);
	T_OK(k3_setup_host_allowed("huggingface.co", hosts, 2));
	T_OK(k3_setup_host_allowed("cas-bridge.xethub.hf.co", hosts, 2));
	T_OK(!k3_setup_host_allowed("hf.co", hosts, 2));
	T_OK(!k3_setup_host_allowed("evilhf.co", hosts, 2));
	T_OK(!k3_setup_host_allowed("huggingface.co.evil", hosts, 2));
	T_OK(!k3_setup_host_allowed("localhost", hosts, 2));
}

static void copy_file(const char *from, const char *to)
{
	char buf[1 << 16];
	int a = open(from, O_RDONLY), b = open(to, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	ssize_t n;

	while (a >= 0 && b >= 0 && (n = read(a, buf, sizeof(buf))) > 0)
		T_EQ_INT(write(b, buf, (size_t)n), n);
	close(a);
	close(b);
}

static void test_partial(const char *tmp)
{
	enum { CHUNK = 65536, SIZE = 4 * CHUNK + 1000 };
	uint8_t *data = malloc(SIZE), sha[32], bad[32];
	struct k3_setup_partial *p = NULL;
	struct k3_err err = { 0, "" };
	char path[4096], saved[4096], savedj[4096];
	uint64_t resume = 99;
	int dfd;

	for (int i = 0; i < SIZE; i++)
		data[i] = (uint8_t)(i * 2654435761u >> 13);
	T_EQ_INT(k3_setup_dir_open(tmp, false, &dfd, &err), 0);
	{
		struct k3_setup_hasher *h = k3_setup_hasher_new();
		k3_setup_hasher_update(h, data, SIZE);
		k3_setup_hasher_peek(h, sha);
		k3_setup_hasher_free(h);
	}
	memcpy(bad, sha, 32);
	bad[0] ^= 1;

	/* fresh, then an orderly stop after 2.5 chunks: resumes exactly there */
	T_EQ_INT(k3_setup_partial_open(dfd, "f", SIZE, sha, CHUNK, "f", &p, &resume, &err), 0);
	T_EQ_U64(resume, 0);
	T_EQ_INT(k3_setup_partial_write(p, 0, data, CHUNK * 2 + CHUNK / 2, &err), 0);
	T_EQ_INT(k3_setup_partial_write(p, 5, data, 10, &err), -ERANGE);   /* not the next byte */
	T_EQ_INT(k3_setup_partial_flush(p, &err), 0);
	/* what a crash would leave: the files as they are now */
	snprintf(path, sizeof(path), "%s/f.partial", tmp);
	snprintf(saved, sizeof(saved), "%s/crash.partial", tmp);
	copy_file(path, saved);
	snprintf(path, sizeof(path), "%s/f.partial.k3j", tmp);
	snprintf(savedj, sizeof(savedj), "%s/crash.k3j", tmp);
	copy_file(path, savedj);
	k3_setup_partial_close(p);
	T_EQ_INT(k3_setup_partial_open(dfd, "f", SIZE, sha, CHUNK, "f", &p, &resume, &err), 0);
	T_EQ_U64(resume, CHUNK * 2 + CHUNK / 2);
	k3_setup_partial_close(p);

	/* after a crash: only what a checkpoint vouches for, at most a chunk back */
	copy_file(saved, (snprintf(path, sizeof(path), "%s/f.partial", tmp), path));
	copy_file(savedj, (snprintf(path, sizeof(path), "%s/f.partial.k3j", tmp), path));
	T_EQ_INT(k3_setup_partial_open(dfd, "f", SIZE, sha, CHUNK, "f", &p, &resume, &err), 0);
	T_EQ_U64(resume, CHUNK * 2);
	T_EQ_INT(k3_setup_partial_write(p, resume, data + resume, SIZE - resume - 100, &err), 0);
	k3_setup_partial_close(p);

	/* damage on disk inside chunk 1: resumes before it */
	snprintf(path, sizeof(path), "%s/f.partial", tmp);
	{
		int fd = open(path, O_RDWR);
		uint8_t x = (uint8_t)~data[CHUNK + 7];
		T_EQ_INT(pwrite(fd, &x, 1, CHUNK + 7), 1);
		close(fd);
	}
	T_EQ_INT(k3_setup_partial_open(dfd, "f", SIZE, sha, CHUNK, "f", &p, &resume, &err), 0);
	T_EQ_U64(resume, CHUNK);
	T_EQ_INT(k3_setup_partial_write(p, resume, data + resume, SIZE - resume, &err), 0);
	T_EQ_INT(k3_setup_partial_finish(p, &err), 0);
	{
		uint8_t got[32];
		int fd = open((snprintf(path, sizeof(path), "%s/f", tmp), path), O_RDONLY);
		T_EQ_INT(k3_setup_sha256_fd(fd, 0, SIZE, got, "f", &err), 0);
		T_EQ_MEM(got, sha, 32);
		close(fd);
		snprintf(path, sizeof(path), "%s/f.partial.k3j", tmp);
		T_OK(access(path, F_OK) != 0);   /* the journal went with the partial */
	}

	/* another download's journal: starts over */
	T_EQ_INT(k3_setup_partial_open(dfd, "g", SIZE, sha, CHUNK, "g", &p, &resume, &err), 0);
	T_EQ_INT(k3_setup_partial_write(p, 0, data, CHUNK * 3, &err), 0);
	k3_setup_partial_close(p);
	T_EQ_INT(k3_setup_partial_open(dfd, "g", SIZE, bad, CHUNK, "g", &p, &resume, &err), 0);
	T_EQ_U64(resume, 0);
	/* a wrong digest at the end: removed, never published */
	T_EQ_INT(k3_setup_partial_write(p, 0, data, SIZE, &err), 0);
	T_EQ_INT(k3_setup_partial_finish(p, &err), -EBADMSG);
	T_OK(strstr(err.msg, "not published") != NULL);
	snprintf(path, sizeof(path), "%s/g", tmp);
	T_OK(access(path, F_OK) != 0);
	snprintf(path, sizeof(path), "%s/g.partial", tmp);
	T_OK(access(path, F_OK) != 0);

	/* a name that appeared meanwhile is never replaced */
	T_EQ_INT(k3_setup_partial_open(dfd, "h", SIZE, sha, CHUNK, "h", &p, &resume, &err), 0);
	T_EQ_INT(k3_setup_partial_write(p, 0, data, SIZE, &err), 0);
	snprintf(path, sizeof(path), "%s/h", tmp);
	{
		int fd = open(path, O_WRONLY | O_CREAT, 0644);
		T_EQ_INT(write(fd, "mine", 4), 4);
		close(fd);
	}
	T_EQ_INT(k3_setup_partial_finish(p, &err), -EEXIST);
	{
		char buf[8] = "";
		int fd = open(path, O_RDONLY);
		T_EQ_INT(read(fd, buf, sizeof(buf)), 4);
		T_EQ_MEM(buf, "mine", 4);
		close(fd);
	}
	/* a link at the partial's name is refused */
	snprintf(path, sizeof(path), "%s/i.partial", tmp);
	T_EQ_INT(symlink("/etc/passwd", path), 0);
	T_EQ_INT(k3_setup_partial_open(dfd, "i", SIZE, sha, CHUNK, "i", &p, &resume, &err), -ELOOP);
	T_OK(strstr(err.msg, "symbolic link") != NULL);
	close(dfd);
	free(data);
}

static void test_state(const char *tmp)
{
	struct k3_setup_state *st = NULL, *back = NULL;
	struct k3_err err = { 0, "" };
	uint8_t sha[32] = { 1, 2, 3 };
	struct stat sb;
	int dfd;

	T_EQ_INT(k3_setup_dir_open(tmp, false, &dfd, &err), 0);
	T_EQ_INT(k3_setup_state_load(dfd, &st, &err), 0);
	if (!st)
		return;
	T_EQ_INT(st->n, 0);
	T_EQ_INT(fstat(dfd, &sb), 0);
	T_OK(k3_setup_state_set(st, "z.bin", 5, sha, K3_SETUP_HAVE_VERIFIED, &sb) != NULL);
	T_OK(k3_setup_state_set(st, "a.bin", 6, sha, K3_SETUP_HAVE_SPARSE, &sb) != NULL);
	st->stream = true;
	T_EQ_INT(k3_setup_state_set_str(&st->base_url, "https://m/"), 0);
	T_EQ_INT(k3_setup_state_save(dfd, st, &err), 0);
	T_EQ_INT(k3_setup_state_load(dfd, &back, &err), 0);
	if (back) {
		struct k3_setup_record *z = k3_setup_state_find(back, "z.bin"), *a = k3_setup_state_find(back, "a.bin");
		T_OK(back->stream && back->base_url && strcmp(back->base_url, "https://m/") == 0);
		T_OK(z && z->have == K3_SETUP_HAVE_VERIFIED && z->size == 5 && z->sha256[2] == 3);
		T_OK(a && a->have == K3_SETUP_HAVE_SPARSE);
		/* identity: size matters; mtime matters except for a sparse shard */
		struct stat other = sb;
		other.st_size = 5;
		T_OK(k3_setup_record_same_file(z, &other));
		other.st_mtim.tv_nsec ^= 1;
		T_OK(!k3_setup_record_same_file(z, &other));
		other.st_size = 6;
		T_OK(k3_setup_record_same_file(a, &other));
		other.st_ino ^= 1;
		T_OK(!k3_setup_record_same_file(a, &other));
	}
	k3_setup_state_free(back);
	k3_setup_state_free(st);
	close(dfd);
}

static void test_experts(void)
{
	struct k3_setup_expert_table *t = NULL;
	struct k3_err err = { 0, "" };
	uint8_t d[32];
	uint32_t l = 0, e = 0;
	const char *good = "k3-expert-sha256 1\n1 0 " SHA_A "\n1 5 " SHA_B "\n2 0 " SHA_A "\n";
	const char *unsorted = "k3-expert-sha256 1\n1 5 " SHA_A "\n1 0 " SHA_B "\n";

	T_EQ_INT(k3_setup_expert_table_parse(good, strlen(good), &t, &err), 0);
	if (t) {
		T_EQ_INT(k3_setup_expert_table_count(t), 3);
		T_EQ_INT(k3_setup_expert_table_find(t, 1, 5, d), 0);
		T_EQ_INT(d[0], 0xbb);
		T_EQ_INT(k3_setup_expert_table_find(t, 1, 6, d), -ENOENT);
	}
	k3_setup_expert_table_free(t);
	T_EQ_INT(k3_setup_expert_table_parse(unsorted, strlen(unsorted), &t, &err), -EINVAL);
	T_OK(strstr(err.msg, "line 3") != NULL);
	T_EQ_INT(k3_setup_expert_table_parse("nope\n", 5, &t, &err), -EINVAL);
	/* an empty table is a table (found by the fuzzer: a lookup in it) */
	T_EQ_INT(k3_setup_expert_table_parse("k3-expert-sha256 1\n", 19, &t, &err), 0);
	if (t) {
		T_EQ_INT(k3_setup_expert_table_count(t), 0);
		T_EQ_INT(k3_setup_expert_table_find(t, 1, 0, d), -ENOENT);
	}
	k3_setup_expert_table_free(t);

	T_OK(k3_setup_expert_tensor("language_model.model.layers.12.block_sparse_moe.experts.895.w2."
				    "weight_scale", &l, &e));
	T_EQ_INT(l, 12);
	T_EQ_INT(e, 895);
	T_OK(!k3_setup_expert_tensor("language_model.model.layers.12.block_sparse_moe.shared_experts."
				     "gate_proj.weight", NULL, NULL));
	T_OK(!k3_setup_expert_tensor("language_model.model.layers.3.self_attn.q_proj.weight", NULL, NULL));
}

int main(void)
{
	char tmp[] = "/tmp/k3setup-units-XXXXXX";

	if (!mkdtemp(tmp))
		return 1;
	test_inventory();
	test_listing();
	test_hosts();
	test_partial(tmp);
	test_state(tmp);
	test_experts();
	{
		char cmd[4200];
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp);
		if (system(cmd) != 0)
			printf("could not remove %s\n", tmp);
	}
	return t_done();
}

/* Router traces: exact round trip of ids and weight bits, the size cap,
 * refusal of symlinks and non-regular files, strict parsing, ranking. */
#include "t.h"

#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

#include "store/store_trace.h"

static char dir[256];

static const char *p(const char *name)
{
	return t_join(dir, name);
}

static struct k3_store_trace_rec mkrec(uint64_t pos, uint32_t layer, uint32_t base)
{
	struct k3_store_trace_rec r = { .request = 7, .position = pos, .layer = layer, .k = 16 };
	for (uint32_t i = 0; i < 16; i++) {
		r.ids[i] = (base + i * 5) % 896;
		r.weights[i] = 1.0f / (float)(i + 3) + (float)pos * 1e-7f;
	}
	return r;
}

/* Records k3_store_trace_rank counts in path (the ranking itself freed);
 * its return code. */
static int rank_count(const char *path, uint64_t *recs, struct k3_err *err)
{
	struct k3_store_trace_rank *rk = NULL;
	size_t nr = 0;
	int rc;

	*recs = 0;
	rc = k3_store_trace_rank(path, &rk, &nr, recs, err);
	free(rk);
	return rc;
}

int main(void)
{
	struct k3_store_trace *t = NULL;
	struct k3_store_trace_rec r, back;
	struct k3_err err = { 0 };
	char line[K3_STORE_TRACE_LINE_MAX];

	if (!t_tempdir(dir, sizeof(dir), "k3trace"))
		return t_skip("no temp dir");
	{
		/* The writer refuses a symlink anywhere in its path: work under
		 * the resolved name in case $TMPDIR holds one. */
		char *real = realpath(dir, NULL);

		T_OK(real != NULL && strlen(real) < sizeof(dir));
		snprintf(dir, sizeof(dir), "%s", real);
		free(real);
	}

	/* The documented line format, exactly. */
	r = (struct k3_store_trace_rec){ .request = 1, .position = 2, .layer = 3, .k = 2,
					 .ids = { 5, 17 }, .weights = { 1.0f, -0.5f } };
	T_EQ_INT(k3_store_trace_format(&r, line, sizeof(line)), (int)strlen(line));
	T_EQ_STR(line, "{\"request\":1,\"position\":2,\"layer\":3,\"ids\":[5,17],"
		       "\"weights\":[\"3f800000\",\"bf000000\"]}\n");

	/* Write (both modes), read back bit-exact, rank. */
	for (int mode = 0; mode < 2; mode++) {
		const char *path = p(mode ? "sync.jsonl" : "buf.jsonl");
		T_EQ_INT(k3_store_trace_open(path, 0, (enum k3_store_trace_mode)mode, &t, &err), 0);
		for (uint64_t pos = 0; pos < 10; pos++)
			for (uint32_t l = 1; l <= 3; l++) {
				r = mkrec(pos, l, (uint32_t)(l * 100 + (pos % 2)));
				T_EQ_INT(k3_store_trace_write(t, &r, &err), 0);
			}
		struct stat st;
		if (mode == 1) {   /* sync: already on disk */
			T_EQ_INT(stat(path, &st), 0);
			T_EQ_U64((uint64_t)st.st_size, k3_store_trace_bytes(t));
		}
		T_EQ_INT(k3_store_trace_close(t, &err), 0);
		T_EQ_INT(stat(path, &st), 0);

		FILE *f = fopen(path, "r");
		int n = 0, bad = 0;
		while (f && fgets(line, sizeof(line), f)) {
			struct k3_store_trace_rec want = mkrec((uint64_t)(n / 3), (uint32_t)(n % 3 + 1),
				(uint32_t)((n % 3 + 1) * 100 + (n / 3) % 2));
			T_EQ_INT(k3_store_trace_parse(line, strlen(line), &back, &err), 0);
			bad += memcmp(&back, &want, sizeof(back)) != 0;
			n++;
		}
		if (f)
			fclose(f);
		T_EQ_INT(n, 30);
		T_EQ_INT(bad, 0);

		struct k3_store_trace_rank *rk = NULL;
		size_t nr = 0;
		uint64_t recs = 0;
		T_EQ_INT(k3_store_trace_rank(path, &rk, &nr, &recs, &err), 0);
		T_EQ_U64(recs, 30);
		/* Per layer: ids base+5i for base in {100l, 100l+1}: 32 distinct, of
		 * which none overlap -> 96 experts, each used 5 times. */
		T_EQ_U64(nr, 96);
		if (nr == 96) {
			T_EQ_U64(rk[0].uses, 5);
			T_EQ_INT(rk[0].layer, 1);
			T_EQ_INT(rk[0].expert, 100);
			T_EQ_INT(rk[1].expert, 101);
			T_EQ_INT(rk[95].layer, 3);
			double w = 0;
			for (uint64_t pos = 0; pos < 10; pos += 2)
				w += mkrec(pos, 1, 100).weights[0];
			T_NEAR(rk[0].weight_sum, w, 1e-12);
		}
		free(rk);
	}

	/* Appending continues the same file. */
	T_EQ_INT(k3_store_trace_open(p("sync.jsonl"), 0, K3_STORE_TRACE_SYNC, &t, &err), 0);
	r = mkrec(99, 2, 0);
	T_EQ_INT(k3_store_trace_write(t, &r, &err), 0);
	T_EQ_INT(k3_store_trace_close(t, &err), 0);
	{
		uint64_t recs;
		T_EQ_INT(rank_count(p("sync.jsonl"), &recs, &err), 0);
		T_EQ_U64(recs, 31);
	}

	/* The cap: records that would pass it are dropped, the file stays under. */
	int len = k3_store_trace_format(&r, line, sizeof(line));
	T_EQ_INT(k3_store_trace_open(p("cap.jsonl"), (uint64_t)len * 3 + 5, K3_STORE_TRACE_BUFFERED,
				     &t, &err), 0);
	for (int i = 0; i < 3; i++)
		T_EQ_INT(k3_store_trace_write(t, &r, &err), 0);
	T_EQ_INT(k3_store_trace_write(t, &r, &err), -EFBIG);
	T_OK(k3_store_trace_capped(t));
	T_EQ_INT(k3_store_trace_write(t, &r, &err), -EFBIG);
	T_EQ_INT(k3_store_trace_close(t, &err), 0);
	{
		struct stat st;
		T_EQ_INT(stat(p("cap.jsonl"), &st), 0);
		T_EQ_U64((uint64_t)st.st_size, (uint64_t)len * 3);
	}

	/* A buffered writer holds records until flushed; after
	 * k3_store_trace_flush the file has them (k3d flushes per request). */
	{
		struct stat st;
		T_EQ_INT(k3_store_trace_open(p("flush.jsonl"), 0, K3_STORE_TRACE_BUFFERED, &t, &err), 0);
		T_EQ_INT(k3_store_trace_write(t, &r, &err), 0);
		T_EQ_INT(k3_store_trace_write(t, &r, &err), 0);
		T_EQ_INT(stat(p("flush.jsonl"), &st), 0);
		T_EQ_U64((uint64_t)st.st_size, 0);
		T_EQ_INT(k3_store_trace_flush(t, &err), 0);
		T_EQ_INT(stat(p("flush.jsonl"), &st), 0);
		T_EQ_U64((uint64_t)st.st_size, (uint64_t)len * 2);
		T_EQ_INT(k3_store_trace_write(t, &r, &err), 0);
		T_EQ_INT(k3_store_trace_close(t, &err), 0);
		T_EQ_INT(stat(p("flush.jsonl"), &st), 0);
		T_EQ_U64((uint64_t)st.st_size, (uint64_t)len * 3);
		unlink(p("flush.jsonl"));
	}

	/* Engine route output ([T][n_moe][k]) becomes one record per
	 * (position, MoE layer), with model layer numbers. */
	{
		const uint32_t moe[2] = { 1, 3 };
		uint32_t ids[3 * 2 * 2];
		float w[3 * 2 * 2];
		for (uint32_t i = 0; i < 12; i++) {
			ids[i] = 100 + i;
			w[i] = (float)i * 0.25f;
		}
		T_EQ_INT(k3_store_trace_open(p("routes.jsonl"), 0, K3_STORE_TRACE_BUFFERED, &t, &err), 0);
		T_EQ_INT(k3_store_trace_write_routes(t, 9, 40, 3, moe, 2, 2, ids, w, &err), 0);
		T_EQ_INT(k3_store_trace_close(t, &err), 0);
		FILE *f = fopen(p("routes.jsonl"), "r");
		int n = 0;
		while (f && fgets(line, sizeof(line), f)) {
			T_EQ_INT(k3_store_trace_parse(line, strlen(line), &back, &err), 0);
			T_EQ_U64(back.request, 9);
			T_EQ_U64(back.position, 40 + (uint64_t)(n / 2));
			T_EQ_INT(back.layer, moe[n % 2]);
			T_EQ_INT(back.k, 2);
			T_EQ_INT(back.ids[1], 100 + 2 * n + 1);
			T_EQ_INT(memcmp(&back.weights[0], &w[2 * n], 4), 0);
			n++;
		}
		if (f)
			fclose(f);
		T_EQ_INT(n, 6);
		unlink(p("routes.jsonl"));
	}

	/* Symlinks (to a file, dangling) and non-regular files are refused. */
	T_EQ_INT(symlink(p("buf.jsonl"), p("link.jsonl")), 0);
	T_EQ_INT(k3_store_trace_open(p("link.jsonl"), 0, K3_STORE_TRACE_SYNC, &t, &err), -ELOOP);
	T_OK(strstr(err.msg, "symlink") != NULL);
	T_EQ_INT(symlink(p("nothing-here"), p("dangling.jsonl")), 0);
	T_EQ_INT(k3_store_trace_open(p("dangling.jsonl"), 0, K3_STORE_TRACE_SYNC, &t, &err), -ELOOP);
	T_EQ_INT(access(p("nothing-here"), F_OK), -1);
	T_EQ_INT(mkfifo(p("fifo"), 0600), 0);
	T_EQ_INT(k3_store_trace_open(p("fifo"), 0, K3_STORE_TRACE_SYNC, &t, &err), -EINVAL);
	T_OK(strstr(err.msg, "not a regular file") != NULL);
	T_EQ_INT(k3_store_trace_open(dir, 0, K3_STORE_TRACE_SYNC, &t, &err) < 0, 1);

	/* ... and so is a symlink in any directory component, first, middle or
	 * last, for absolute and relative paths: nothing is created through it. */
	{
		char want[600], cwd[512];

		T_EQ_INT(mkdir(p("real"), 0700), 0);
		T_EQ_INT(mkdir(p("real/sub"), 0700), 0);
		T_EQ_INT(symlink(p("real"), p("linkdir")), 0);
		T_EQ_INT(symlink(p("real/sub"), p("real/linksub")), 0);
		T_EQ_INT(k3_store_trace_open(p("linkdir/t.jsonl"), 0, K3_STORE_TRACE_SYNC, &t, &err), -ELOOP);
		snprintf(want, sizeof(want), "'%s' is a symlink; refusing to follow it", p("linkdir"));
		T_OK(strstr(err.msg, want) != NULL);
		T_EQ_INT(k3_store_trace_open(p("linkdir/sub/t.jsonl"), 0, K3_STORE_TRACE_SYNC, &t, &err),
			 -ELOOP);
		T_EQ_INT(k3_store_trace_open(p("real/linksub/t.jsonl"), 0, K3_STORE_TRACE_SYNC, &t, &err),
			 -ELOOP);
		snprintf(want, sizeof(want), "'%s' is a symlink", p("real/linksub"));
		T_OK(strstr(err.msg, want) != NULL);
		T_EQ_INT(access(p("real/t.jsonl"), F_OK), -1);
		T_EQ_INT(access(p("real/sub/t.jsonl"), F_OK), -1);
		/* a file where a directory should be */
		T_EQ_INT(k3_store_trace_open(p("buf.jsonl/t.jsonl"), 0, K3_STORE_TRACE_SYNC, &t, &err),
			 -ENOTDIR);
		/* doubled slashes and the real directories are fine */
		T_EQ_INT(k3_store_trace_open(p("real//sub/ok.jsonl"), 0, K3_STORE_TRACE_SYNC, &t, &err), 0);
		T_EQ_INT(k3_store_trace_close(t, &err), 0);
		t = NULL;
		T_EQ_INT(access(p("real/sub/ok.jsonl"), F_OK), 0);
		T_OK(getcwd(cwd, sizeof(cwd)) != NULL);
		T_EQ_INT(chdir(dir), 0);
		T_EQ_INT(k3_store_trace_open("linkdir/rel.jsonl", 0, K3_STORE_TRACE_SYNC, &t, &err), -ELOOP);
		T_EQ_INT(k3_store_trace_open("real/rel.jsonl", 0, K3_STORE_TRACE_SYNC, &t, &err), 0);
		T_EQ_INT(k3_store_trace_close(t, &err), 0);
		t = NULL;
		T_EQ_INT(chdir(cwd), 0);
		T_EQ_INT(access(p("real/rel.jsonl"), F_OK), 0);
	}
	{
		uint64_t recs;
		T_EQ_INT(rank_count(p("fifo"), &recs, &err), -EINVAL);
	}

	/* Strict parsing. */
	static const char *const bad[] = {
		"",
		"[]",
		"{\"request\":1,\"position\":2,\"layer\":3,\"ids\":[5],\"weights\":[\"3f800000\"],\"x\":1}",
		"{\"request\":1,\"position\":2,\"layer\":3,\"ids\":[5,6],\"weights\":[\"3f800000\"]}",
		"{\"request\":1,\"position\":2,\"layer\":3,\"ids\":[5],\"weights\":[\"3F800000\"]}",
		"{\"request\":1,\"position\":2,\"layer\":3,\"ids\":[5],\"weights\":[\"3f80000\"]}",
		"{\"request\":1,\"position\":2,\"layer\":3,\"ids\":[-5],\"weights\":[\"3f800000\"]}",
		"{\"request\":1,\"position\":2,\"layer\":3000,\"ids\":[5],\"weights\":[\"3f800000\"]}",
		"{\"request\":1.5,\"position\":2,\"layer\":3,\"ids\":[5],\"weights\":[\"3f800000\"]}",
		"{\"request\":1,\"request\":1,\"layer\":3,\"ids\":[5],\"weights\":[\"3f800000\"]}",
		"{\"request\":1,\"position\":2,\"layer\":3,\"ids\":[],\"weights\":[]}",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		int rc = k3_store_trace_parse(bad[i], strlen(bad[i]), &back, &err);
		if (rc != -EINVAL)
			printf("accepted bad line %zu: %s\n", i, bad[i]);
		T_EQ_INT(rc, -EINVAL);
	}
	/* A malformed line in a trace names its line number. */
	{
		FILE *f = fopen(p("bad.jsonl"), "w");
		fputs("{\"request\":1,\"position\":2,\"layer\":3,\"ids\":[5],\"weights\":[\"3f800000\"]}\n", f);
		fputs("{\"request\":1}\n", f);
		fclose(f);
		uint64_t recs;
		T_EQ_INT(rank_count(p("bad.jsonl"), &recs, &err), -EINVAL);
		T_OK(strstr(err.msg, "line 2") != NULL);
	}

	/* A torn last line (writer stopped mid-record by a full disk or a
	 * crash): readers skip it, and the next writer cuts it off before
	 * appending, so the file stays a valid trace. */
	{
		char one[K3_STORE_TRACE_LINE_MAX];
		struct k3_store_trace_rec a = mkrec(5, 1, 0), b = mkrec(6, 1, 3);
		int la = k3_store_trace_format(&a, one, sizeof(one));
		FILE *f = fopen(p("torn.jsonl"), "w");
		T_OK(f != NULL);
		fwrite(one, 1, (size_t)la, f);
		fwrite(one, 1, (size_t)la / 2, f);
		fclose(f);
		uint64_t recs;
		T_EQ_INT(rank_count(p("torn.jsonl"), &recs, &err), 0);
		T_EQ_U64(recs, 1);
		T_EQ_INT(k3_store_trace_open(p("torn.jsonl"), 0, K3_STORE_TRACE_SYNC, &t, &err), 0);
		T_EQ_U64(k3_store_trace_bytes(t), (uint64_t)la);
		T_EQ_INT(k3_store_trace_write(t, &b, &err), 0);
		T_EQ_INT(k3_store_trace_close(t, &err), 0);
		T_EQ_INT(rank_count(p("torn.jsonl"), &recs, &err), 0);
		T_EQ_U64(recs, 2);
		struct stat st;
		T_EQ_INT(stat(p("torn.jsonl"), &st), 0);
		T_EQ_U64((uint64_t)st.st_size, (uint64_t)la + (uint64_t)k3_store_trace_format(&b, one, sizeof(one)));

		/* Only a torn line: cut to empty. No newline in the last
		 * LINE_MAX bytes of a bigger file: not a trace, left alone. */
		f = fopen(p("torn.jsonl"), "w");
		fputs("{\"request\":1,", f);
		fclose(f);
		T_EQ_INT(k3_store_trace_open(p("torn.jsonl"), 0, K3_STORE_TRACE_SYNC, &t, &err), 0);
		T_EQ_U64(k3_store_trace_bytes(t), 0);
		T_EQ_INT(k3_store_trace_close(t, &err), 0);
		f = fopen(p("torn.jsonl"), "w");
		for (int i = 0; i < K3_STORE_TRACE_LINE_MAX + 10; i++)
			fputc('x', f);
		fclose(f);
		T_EQ_INT(k3_store_trace_open(p("torn.jsonl"), 0, K3_STORE_TRACE_SYNC, &t, &err), -EINVAL);
		T_OK(strstr(err.msg, "not a router trace") != NULL);
		T_EQ_INT(stat(p("torn.jsonl"), &st), 0);
		T_EQ_U64((uint64_t)st.st_size, (uint64_t)K3_STORE_TRACE_LINE_MAX + 10);

		/* A mistyped --router-trace at someone's file: refused, not a
		 * byte cut or appended (this used to truncate "hello world" to
		 * empty and cut the unterminated last line of a text file). */
		static const char *const not_traces[] = {
			"hello world", "line1\nline2 no newline", "notes\n",
			"{\"request\":1}\ngarbage tail", "{\"reque",
		};
		for (size_t i = 0; i < sizeof(not_traces) / sizeof(not_traces[0]); i++) {
			size_t n = strlen(not_traces[i]);
			char got_bytes[64] = { 0 };

			f = fopen(p("torn.jsonl"), "w");
			fputs(not_traces[i], f);
			fclose(f);
			int rc = k3_store_trace_open(p("torn.jsonl"), 0, K3_STORE_TRACE_SYNC, &t, &err);
			if (i == 4) {
				/* a first record torn inside its prefix is a trace */
				T_EQ_INT(rc, 0);
				T_EQ_U64(k3_store_trace_bytes(t), 0);
				T_EQ_INT(k3_store_trace_close(t, &err), 0);
				continue;
			}
			T_EQ_INT(rc, -EINVAL);
			T_OK(strstr(err.msg, "not a router trace") != NULL);
			f = fopen(p("torn.jsonl"), "r");
			T_OK(f != NULL);
			T_EQ_U64((uint64_t)fread(got_bytes, 1, sizeof(got_bytes) - 1, f), (uint64_t)n);
			fclose(f);
			T_EQ_STR(got_bytes, not_traces[i]);
		}
	}

	static const char *const names[] = { "buf.jsonl", "sync.jsonl", "cap.jsonl", "link.jsonl",
					     "dangling.jsonl", "fifo", "bad.jsonl", "torn.jsonl",
					     "real/sub/ok.jsonl", "real/rel.jsonl", "real/linksub", "linkdir" };
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		unlink(p(names[i]));
	rmdir(p("real/sub"));
	rmdir(p("real"));
	rmdir(dir);
	return t_done();
}

/*
 * test_engine_invariance.c - batch invariance (issue 8 item 5) and
 * prefill-equals-decode: the logits and route of every position of the
 * 24-token prompt must be bit-identical whether the position is
 * computed
 *   - alone (one forward call per token),
 *   - inside a prefill chunk of 7, 16 or 64 positions,
 *   - inside a multi-token batch after a prefix (verification shape),
 *   - on a cloned sequence,
 *   - with 1, 2 or 3 compute threads,
 * on both golden checkpoints, on the fast path (and chunking on the
 * reference path), and again with every convertible matrix taken from an
 * int8 spine overlay (docs/formats.md, "int8 spine overlay"; written into
 * a temp dir, the goldens being read-only): the I8 kernels keep the same
 * contract. Comparisons are memcmp, not tolerances.
 */
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "t.h"

#include "engine/engine.h"
#include "model/model.h"
#include "store/store_int8.h"

enum { NTOK = 24, NTHR = 6 };

static const int32_t prompt[NTOK] = {
	5, 231, 232, 165, 64, 57, 240, 60, 11, 200, 17, 93, 148, 3, 77, 250,
	120, 19, 45, 88, 160, 201, 7, 33,
};

struct run {
	float *logits;               /* [NTOK][V] */
	uint32_t *ids;               /* [NTOK][n_moe][K] */
	float *w;
	size_t nl, nr;
};

static struct k3_model *model;

static void run_free(struct run *r)
{
	free(r->logits);
	free(r->ids);
	free(r->w);
}

/* Runs the prompt as calls of the given sizes (sum NTOK); optionally
 * clones the sequence after the first call and continues on the clone. */
static int run(uint32_t chunk, uint32_t threads, bool reference, const uint32_t *calls,
	       uint32_t n_calls, bool clone, struct run *r)
{
	struct k3_err err = { 0 };
	struct k3_engine *e = NULL;
	struct k3_engine_seq *s = NULL, *s2 = NULL;
	struct k3_engine_opts o = { .threads = threads, .max_chunk = chunk, .reference = reference,
				    .split_all = true };
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	int rc = k3_engine_open(model, &o, &e, &err);
	if (!rc)
		rc = k3_engine_seq_new(e, 8, &s, &err);   /* small: exercises cache growth */
	if (rc) {
		printf("     %s\n", err.msg);
		k3_engine_free(e);
		return rc;
	}
	uint32_t V = k3_engine_vocab(e), per = k3_engine_n_moe(e) * k3_engine_top_k(e);
	r->nl = (size_t)NTOK * V;
	r->nr = (size_t)NTOK * per;
	r->logits = calloc(r->nl, sizeof(float));
	r->ids = calloc(r->nr, sizeof(uint32_t));
	r->w = calloc(r->nr, sizeof(float));
	uint32_t pos = 0;
	for (uint32_t c = 0; !rc && c < n_calls; c++) {
		struct k3_engine_out out = { K3_ENGINE_LOGITS_ALL, r->logits + (size_t)pos * V,
					     r->ids + (size_t)pos * per, r->w + (size_t)pos * per };
		rc = k3_engine_forward(e, s, prompt + pos, calls[c], &out, &err);
		pos += calls[c];
		if (!rc && clone && c == 0) {
			rc = k3_engine_seq_clone(e, s, &s2, &err);
			if (!rc) {
				/* poison-free original keeps going elsewhere; continue on the copy */
				k3_engine_seq_free(s);
				s = s2;
			}
		}
	}
	if (rc)
		printf("     %s\n", err.msg);
	k3_engine_seq_free(s);
	k3_engine_free(e);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	printf("  run chunk %u threads %u %s calls %u: %.2f s\n", chunk, threads,
	       reference ? "ref" : "fast", n_calls,
	       (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
	return rc;
}

/* Compares the first npos positions (all when npos == NTOK). */
static void same_n(const struct run *a, const struct run *b, uint32_t npos, const char *what)
{
	size_t nl = a->nl / NTOK * npos, nr = a->nr / NTOK * npos;
	bool ok = memcmp(a->logits, b->logits, nl * sizeof(float)) == 0 &&
		  memcmp(a->ids, b->ids, nr * sizeof(uint32_t)) == 0 &&
		  memcmp(a->w, b->w, nr * sizeof(float)) == 0;
	if (!T_OK(ok))
		printf("     %s differs from token-by-token\n", what);
}

static void same(const struct run *a, const struct run *b, const char *what)
{
	same_n(a, b, NTOK, what);
}

/* Opens the golden checkpoint `name`, with int8 through an overlay of all
 * its convertible matrices (router included) written into ov_dir. */
static int open_golden(const char *name, bool int8, const char *ov_dir, struct k3_err *err)
{
	char path[256];
	snprintf(path, sizeof(path), "golden/forward/%s/model", name);
	if (!int8)
		return k3_model_open(t_shared_path(path), &model, err);
	struct k3_model *src = NULL;
	struct k3_store_int8_report rep;
	int rc = k3_model_open(t_shared_path(path), &src, err);
	if (!rc)
		rc = k3_store_int8_write(src, ov_dir, true, &rep, err);
	k3_model_free(src);
	if (!rc)
		rc = k3_store_int8_open_model(t_shared_path(path), ov_dir, K3_MODEL_INT8_ALL, &model, err);
	return rc;
}

static void check_model(const char *name, bool int8, const char *ov_dir)
{
	struct k3_err err = { 0 };
	if (!T_OK(open_golden(name, int8, ov_dir, &err) == 0)) {
		printf("     %s\n", err.msg);
		return;
	}
	struct k3_model_int8_info in;
	k3_model_int8_info_get(model, &in);
	T_OK(in.on == int8);
	uint32_t ones[NTOK];
	for (int i = 0; i < NTOK; i++)
		ones[i] = 1;
	uint32_t whole[1] = { NTOK };
	uint32_t verify[2] = { 14, 10 };     /* prefix, then a 10-token batch */
	uint32_t odd[4] = { 3, 13, 1, 7 };

	for (int ref = 0; ref < 2; ref++) {
		struct run base = { 0 }, r = { 0 };
		/* baseline: every position alone, one call per token, 1 thread */
		if (!T_OK(run(1, 1, ref, ones, NTOK, false, &base) == 0))
			continue;
		static const uint32_t chunks[] = { 64, 7, 16 };
		/* the scalar reference is slow under sanitizers: one chunk size */
		for (int c = 0; c < (ref ? 1 : 3); c++) {
			if (T_OK(run(chunks[c], 1, ref, whole, 1, false, &r) == 0))
				same(&base, &r, "prefill chunk");
			run_free(&r);
		}
		if (T_OK(run(64, 1, ref, verify, 2, false, &r) == 0))
			same(&base, &r, "prefix + 10-token batch");
		run_free(&r);
		if (T_OK(run(16, 1, ref, odd, 4, true, &r) == 0))
			same(&base, &r, "uneven calls on a cloned sequence");
		run_free(&r);
		if (!ref) {
			/* Threads: the first NTHR positions only. Each op is a pool
			 * dispatch, and on an oversubscribed machine a dispatch
			 * waits for a descheduled worker, so keep the count low. */
			uint32_t few[1] = { NTHR }, few1[NTHR];
			for (int i = 0; i < NTHR; i++)
				few1[i] = 1;
			for (uint32_t th = 2; th <= 3; th++) {
				if (T_OK(run(64, th, ref, few, 1, false, &r) == 0))
					same_n(&base, &r, NTHR, "threads, one chunk");
				run_free(&r);
			}
			if (T_OK(run(1, 2, ref, few1, NTHR, false, &r) == 0))
				same_n(&base, &r, NTHR, "2 threads, token by token");
			run_free(&r);
		}
		printf("%s%s %s: invariance checked\n", name, int8 ? " (int8 spine)" : "",
		       ref ? "reference" : "fast");
		run_free(&base);
	}
	k3_model_free(model);
	model = NULL;
}

int main(void)
{
	const char *tmp = getenv("TMPDIR");
	char root[256], ov[300], cmd[400];

	check_model("k3tiny_a", false, NULL);
	check_model("k3tiny_b", false, NULL);
	snprintf(root, sizeof(root), "%s/k3inv8.XXXXXX", tmp ? tmp : "/tmp");
	if (!T_OK(mkdtemp(root) != NULL))
		return t_done();
	snprintf(ov, sizeof(ov), "%s/int8", root);
	check_model("k3tiny_a", true, ov);
	check_model("k3tiny_b", true, ov);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	if (system(cmd) != 0)
		printf("could not remove %s\n", root);
	return t_done();
}

/*
 * test_engine_batch.c - several sequences in one pass
 * (k3_engine_forward_batch, issue 21): four sequences with prompts of
 * different lengths, started at different passes, each pass taking one
 * decode position from every decoding sequence and at most one prefill
 * chunk, must give every sequence's logits (every position), routes and
 * taps bit-identical to running it alone with k3_engine_forward, on both
 * golden checkpoints, with a pass of 8 and of 64 positions and with 2
 * threads. Then the errors: a refused pass (repeated sequence, too many
 * positions, a bad id, zero parts) leaves every sequence as it was, and a
 * cancelled pass poisons every sequence in it. Comparisons are memcmp.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "t.h"

#include "engine/engine.h"
#include "model/model.h"

enum { NSEQ = 4, NDEC = 6, MAXLEN = 24 + NDEC };

static const int32_t words[24] = {
	5, 231, 232, 165, 64, 57, 240, 60, 11, 200, 17, 93, 148, 3, 77, 250,
	120, 19, 45, 88, 160, 201, 7, 33,
};
/* prompt lengths and the pass each sequence joins at */
static const uint32_t plen[NSEQ] = { 24, 5, 13, 1 };
static const uint32_t start[NSEQ] = { 0, 1, 1, 4 };
static const uint32_t tap_layers[2] = { 0, 2 };

struct rec {
	float *logits;               /* [MAXLEN][V] */
	uint32_t *ids;               /* [MAXLEN][n_moe][K] */
	float *w;
	float *taps;                 /* [MAXLEN][2][D] */
	int32_t toks[MAXLEN];
	uint32_t pos;                /* positions run */
};

static struct k3_model *model;
static uint32_t V, per, tap_row;

static void rec_init(struct rec *r)
{
	memset(r, 0, sizeof(*r));
	r->logits = calloc((size_t)MAXLEN * V, sizeof(float));
	r->ids = calloc((size_t)MAXLEN * per, sizeof(uint32_t));
	r->w = calloc((size_t)MAXLEN * per, sizeof(float));
	r->taps = calloc((size_t)MAXLEN * tap_row, sizeof(float));
}

static void rec_free(struct rec *r)
{
	free(r->logits);
	free(r->ids);
	free(r->w);
	free(r->taps);
}

/* Out buffers for positions [pos, ...) of r. */
static struct k3_engine_out rec_out(struct rec *r, enum k3_engine_logits mode)
{
	return (struct k3_engine_out){ mode, r->logits + (size_t)r->pos * V,
				       r->ids + (size_t)r->pos * per, r->w + (size_t)r->pos * per };
}

/* The id sequence i runs: its prompt, then greedy ids. */
static void next_ids(struct rec *r, uint32_t i, uint32_t n)
{
	for (uint32_t t = r->pos; t < r->pos + n; t++)
		r->toks[t] = t < plen[i] ? words[(t + 3 * i) % 24]
					 : (int32_t)k3_engine_argmax(r->logits + (size_t)(t - 1) * V, V);
}

static int open_engine(uint32_t chunk, uint32_t threads, struct k3_engine **e, struct k3_err *err)
{
	struct k3_engine_opts o = { .threads = threads, .max_chunk = chunk, .split_all = true };
	int rc = k3_engine_open(model, &o, e, err);
	if (!rc)
		rc = k3_engine_set_taps(*e, tap_layers, 2, err);
	if (!rc) {
		V = k3_engine_vocab(*e);
		per = k3_engine_n_moe(*e) * k3_engine_top_k(*e);
		tap_row = 2 * k3_engine_hidden(*e);
	}
	return rc;
}

/* Sequence i alone: its prompt in one forward call, then NDEC decode calls. */
static int solo(uint32_t i, struct rec *r, struct k3_err *err)
{
	struct k3_engine *e = NULL;
	struct k3_engine_seq *s = NULL;
	int rc = open_engine(64, 1, &e, err);
	if (!rc)
		rc = k3_engine_seq_new(e, 4, &s, err);
	rec_init(r);
	while (!rc && r->pos < plen[i] + NDEC) {
		uint32_t n = r->pos == 0 ? plen[i] : 1;
		struct k3_engine_out out = rec_out(r, r->pos == 0 ? K3_ENGINE_LOGITS_ALL
								  : K3_ENGINE_LOGITS_LAST);
		next_ids(r, i, n);
		k3_engine_set_tap_out(e, r->taps + (size_t)r->pos * tap_row);
		rc = k3_engine_forward(e, s, r->toks + r->pos, n, &out, err);
		r->pos += n;
	}
	k3_engine_seq_free(s);
	k3_engine_free(e);
	return rc;
}

/* All four through batched passes of at most `chunk` positions: decode
 * parts first (LAST logits), then at most one prefill chunk (ALL logits)
 * of the oldest sequence still prefilling. *passes := passes run. */
static int batched(uint32_t chunk, uint32_t threads, struct rec *r, uint32_t *passes,
		   struct k3_err *err)
{
	struct k3_engine *e = NULL;
	struct k3_engine_seq *s[NSEQ] = { 0 };
	struct k3_engine_out outs[NSEQ];
	int rc = open_engine(chunk, threads, &e, err);

	for (uint32_t i = 0; i < NSEQ; i++)
		rec_init(&r[i]);
	for (uint32_t i = 0; !rc && i < NSEQ; i++)
		rc = k3_engine_seq_new(e, 4, &s[i], err);
	*passes = 0;
	for (uint32_t pass = 0; !rc; pass++) {
		struct k3_engine_part parts[NSEQ];
		uint32_t np = 0, rows = 0, left = 0;
		bool prefilled = false;
		for (uint32_t i = 0; i < NSEQ; i++) {
			struct rec *q = &r[i];
			left += q->pos < plen[i] + NDEC;
			if (pass < start[i] || q->pos < plen[i] || q->pos >= plen[i] + NDEC)
				continue;
			next_ids(q, i, 1);
			outs[np] = rec_out(q, K3_ENGINE_LOGITS_LAST);
			parts[np++] = (struct k3_engine_part){ s[i], q->toks + q->pos, 1, NULL,
							       q->taps + (size_t)q->pos * tap_row };
			rows++;
		}
		for (uint32_t i = 0; i < NSEQ && !prefilled && rows < chunk; i++) {
			struct rec *q = &r[i];
			if (pass < start[i] || q->pos >= plen[i])
				continue;
			uint32_t n = plen[i] - q->pos < chunk - rows ? plen[i] - q->pos : chunk - rows;
			next_ids(q, i, n);
			outs[np] = rec_out(q, K3_ENGINE_LOGITS_ALL);
			parts[np++] = (struct k3_engine_part){ s[i], q->toks + q->pos, n, NULL,
							       q->taps + (size_t)q->pos * tap_row };
			prefilled = true;
		}
		if (!left)
			break;
		if (np == 0)
			continue;
		for (uint32_t k = 0; k < np; k++)
			parts[k].out = &outs[k];
		rc = k3_engine_forward_batch(e, parts, np, err);
		for (uint32_t k = 0; !rc && k < np; k++)
			for (uint32_t i = 0; i < NSEQ; i++)
				if (parts[k].seq == s[i])
					r[i].pos += parts[k].n;
		++*passes;
	}
	for (uint32_t i = 0; i < NSEQ; i++) {
		if (!rc)
			T_EQ_INT(k3_engine_seq_len(s[i]), plen[i] + NDEC);
		k3_engine_seq_free(s[i]);
	}
	k3_engine_free(e);
	return rc;
}

static void same(const struct rec *a, const struct rec *b, uint32_t i, const char *what)
{
	uint32_t n = plen[i] + NDEC;
	bool ok = memcmp(a->toks, b->toks, n * sizeof(int32_t)) == 0 &&
		  memcmp(a->logits, b->logits, (size_t)n * V * sizeof(float)) == 0 &&
		  memcmp(a->ids, b->ids, (size_t)n * per * sizeof(uint32_t)) == 0 &&
		  memcmp(a->w, b->w, (size_t)n * per * sizeof(float)) == 0 &&
		  memcmp(a->taps, b->taps, (size_t)n * tap_row * sizeof(float)) == 0;
	if (!T_OK(ok))
		printf("     sequence %u (%s) differs from its solo run\n", i, what);
}

/* A refused pass changes nothing; a cancelled one poisons its sequences. */
static void check_errors(void)
{
	struct k3_err err = { 0 };
	struct k3_engine *e = NULL;
	struct k3_engine_seq *a = NULL, *b = NULL;
	int32_t ids[9] = { 5, 6, 7, 8, 9, 10, 11, 12, 13 }, bad = -1;

	if (!T_OK(open_engine(8, 1, &e, &err) == 0 && k3_engine_seq_new(e, 4, &a, &err) == 0 &&
		  k3_engine_seq_new(e, 4, &b, &err) == 0)) {
		printf("     %s\n", err.msg);
		goto out;
	}
	T_OK(k3_engine_forward(e, a, ids, 2, NULL, &err) == 0);
	struct k3_engine_part twice[2] = { { a, ids, 1, NULL, NULL }, { a, ids, 1, NULL, NULL } };
	T_EQ_INT(k3_engine_forward_batch(e, twice, 2, &err), -EINVAL);
	struct k3_engine_part big[2] = { { a, ids, 1, NULL, NULL }, { b, ids, 8, NULL, NULL } };
	T_EQ_INT(k3_engine_forward_batch(e, big, 2, &err), -E2BIG);
	struct k3_engine_part badid[2] = { { a, ids, 1, NULL, NULL }, { b, &bad, 1, NULL, NULL } };
	T_EQ_INT(k3_engine_forward_batch(e, badid, 2, &err), -EINVAL);
	T_EQ_INT(k3_engine_forward_batch(e, badid, 0, &err), -EINVAL);
	T_EQ_INT(k3_engine_seq_len(a), 2);
	T_EQ_INT(k3_engine_seq_len(b), 0);
	/* still usable after the refusals */
	struct k3_engine_part ok[2] = { { a, ids, 1, NULL, NULL }, { b, ids, 7, NULL, NULL } };
	T_EQ_INT(k3_engine_forward_batch(e, ok, 2, &err), 0);
	T_EQ_INT(k3_engine_seq_len(a), 3);
	T_EQ_INT(k3_engine_seq_len(b), 7);
	atomic_bool cancel = true;
	k3_engine_set_cancel(e, &cancel);
	T_EQ_INT(k3_engine_forward_batch(e, ok, 2, &err), -ECANCELED);
	k3_engine_set_cancel(e, NULL);
	T_EQ_INT(k3_engine_forward(e, a, ids, 1, NULL, &err), -EINVAL);
	T_EQ_INT(k3_engine_forward(e, b, ids, 1, NULL, &err), -EINVAL);
out:
	k3_engine_seq_free(a);
	k3_engine_seq_free(b);
	k3_engine_free(e);
}

static void check_model(const char *name)
{
	struct k3_err err = { 0 };
	char path[256];
	struct rec alone[NSEQ], r[NSEQ];
	static const uint32_t chunks[3] = { 64, 8, 8 }, threads[3] = { 1, 1, 2 };

	snprintf(path, sizeof(path), "golden/forward/%s/model", name);
	if (!T_OK(k3_model_open(t_shared_path(path), &model, &err) == 0)) {
		printf("     %s\n", err.msg);
		return;
	}
	for (uint32_t i = 0; i < NSEQ; i++)
		if (!T_OK(solo(i, &alone[i], &err) == 0))
			printf("     solo %u: %s\n", i, err.msg);
	for (int c = 0; c < 3; c++) {
		uint32_t passes = 0;
		char what[64];
		snprintf(what, sizeof(what), "pass of %u, %u thread(s)", chunks[c], threads[c]);
		if (T_OK(batched(chunks[c], threads[c], r, &passes, &err) == 0)) {
			for (uint32_t i = 0; i < NSEQ; i++)
				same(&alone[i], &r[i], i, what);
			/* four sequences of 43 + 24 decode positions shared passes */
			T_OK(passes < 67);
			printf("%s: %s: %u passes for %u sequences\n", name, what, passes, NSEQ);
		} else {
			printf("     %s\n", err.msg);
		}
		for (uint32_t i = 0; i < NSEQ; i++)
			rec_free(&r[i]);
	}
	for (uint32_t i = 0; i < NSEQ; i++)
		rec_free(&alone[i]);
	check_errors();
	k3_model_free(model);
	model = NULL;
}

int main(void)
{
	check_model("k3tiny_a");
	check_model("k3tiny_b");
	return t_done();
}

/*
 * test_engine_verify.c - speculative verification is exact (issue 18):
 * on both golden checkpoints and the nano and small demo presets, with the
 * provider's KDA verify/replay ops and with the engine's snapshot
 * fallback, at 1 and 2 threads (and the reference path on one model):
 *   - every position of a verification pass has the logits, route and
 *     tap rows of decoding the same ids one by one (memcmp);
 *   - commit(0) leaves every KDA state and MLA cache exactly as before
 *     (the rejected suffix publishes nothing);
 *   - after commit(m), every KDA state and MLA cache equals, byte for
 *     byte, the state of a sequence that decoded exactly those m ids, for
 *     m from 1 to T over the run;
 *   - a failed verification (a bad id past the checks, cancel) keeps the
 *     sequence as it was, and the API refuses misuse (-EBUSY, -EINVAL);
 *   - all of it with a streamed spine too (the spine loader, no layer or
 *     one layer resident, the head streamed): replay needs no bind, the
 *     snapshot fallback binds the layer it reruns.
 */
#include <errno.h>
#include <stdatomic.h>
#include <unistd.h>

#include "t.h"

#include "demo/demo.h"
#include "engine/engine.h"
#include "model/model.h"
#include "store/store_spine.h"

enum { NPROMPT = 9, NCONT = 13, TMAX = 5, NTAPS = 2 };

struct base {
	uint32_t V, per, L, D;
	float *logits;               /* [NCONT][V]: logits after prompt + cont[0..i] */
	uint32_t *ids;               /* [NCONT][per] routes of those positions */
	float *w;
	float *taps;                 /* [NCONT][NTAPS][D] */
	uint8_t ***state;            /* [NCONT + 1][L]: exported state after prompt + i ids */
	size_t **state_n;
};

static int32_t prompt[NPROMPT], cont[NCONT];

static void make_ids(uint32_t V)
{
	uint64_t x = 0x9e3779b97f4a7c15ull;
	for (int i = 0; i < NPROMPT + NCONT; i++) {
		x = x * 6364136223846793005ull + 1442695040888963407ull;
		int32_t id = (int32_t)((x >> 33) % V);
		if (i < NPROMPT)
			prompt[i] = id;
		else
			cont[i - NPROMPT] = id;
	}
}

/* Every layer's exported state of s, into fresh buffers. */
static bool export_all(struct k3_engine *e, struct k3_engine_seq *s, uint32_t L, uint8_t ***out,
		       size_t **n_out)
{
	struct k3_err err = { 0 };
	uint8_t **bufs = calloc(L, sizeof(*bufs));
	size_t *ns = calloc(L, sizeof(*ns));
	for (uint32_t l = 0; l < L; l++) {
		if (k3_engine_seq_export(e, s, l, NULL, 0, &ns[l], &err) != 0) {
			printf("     export: %s\n", err.msg);
			return false;
		}
		bufs[l] = malloc(ns[l] + 1);
		if (k3_engine_seq_export(e, s, l, bufs[l], ns[l], &ns[l], &err) != 0)
			return false;
	}
	*out = bufs;
	*n_out = ns;
	return true;
}

static void free_state(uint8_t **b, size_t *n, uint32_t L)
{
	for (uint32_t l = 0; b && l < L; l++)
		free(b[l]);
	free(b);
	free(n);
}

/* Whether s's state equals snapshot i of the baseline, layer by layer. */
static bool state_equals(struct k3_engine *e, struct k3_engine_seq *s, const struct base *b,
			 uint32_t i, const char *what)
{
	uint8_t **now;
	size_t *n;
	bool ok = true;
	if (!export_all(e, s, b->L, &now, &n))
		return false;
	for (uint32_t l = 0; l < b->L; l++)
		if (n[l] != b->state_n[i][l] || memcmp(now[l], b->state[i][l], n[l]) != 0) {
			printf("     %s: layer %u state differs from decoding %u ids\n", what, l, i);
			ok = false;
		}
	free_state(now, n, b->L);
	return ok;
}

/* spine: -1 = the mapped spine; else a spine loader with that many
 * resident layers (the head and the embedding streamed), in *sp. */
static int open_engine(const struct k3_model *model, uint32_t threads, bool reference,
		       bool snapshot, int spine, struct k3_store_spine **sp, struct k3_engine **e)
{
	struct k3_err err = { 0 };
	struct k3_spine_source ss;
	struct k3_engine_opts o = { .threads = threads, .max_chunk = 8, .reference = reference,
				    .split_all = threads > 1, .kda_snapshot = snapshot };
	int rc = 0;
	*sp = NULL;
	if (spine >= 0) {
		struct k3_store_spine_config cfg = { .resident_layers = (uint32_t)spine,
						     .io_threads = 1, .max_rows = 4 };
		rc = k3_store_spine_new(model, NULL, &cfg, sp, NULL, &err);
		if (!rc) {
			k3_store_spine_source(*sp, &ss);
			o.spine = &ss;
		}
	}
	if (!rc)
		rc = k3_engine_open(model, &o, e, &err);
	if (rc)
		printf("     %s\n", err.msg);
	return rc;
}

static void set_taps(struct k3_engine *e)
{
	struct k3_err err = { 0 };
	uint32_t L = k3_engine_n_layers(e);
	uint32_t taps[NTAPS] = { L > 2 ? 1 : 0, L - 1 };
	T_OK(k3_engine_set_taps(e, taps, NTAPS, &err) == 0);
}

/* The baseline: the prompt in one call, then the continuation one id per
 * call, keeping every position's outputs and the state after each id. */
static bool baseline(const struct k3_model *model, bool reference, struct base *b)
{
	struct k3_err err = { 0 };
	struct k3_engine *e;
	struct k3_store_spine *sp;
	struct k3_engine_seq *s = NULL;
	if (open_engine(model, 1, reference, false, -1, &sp, &e))
		return false;
	set_taps(e);
	b->V = k3_engine_vocab(e);
	b->per = k3_engine_n_moe(e) * k3_engine_top_k(e);
	b->L = k3_engine_n_layers(e);
	b->D = k3_engine_hidden(e);
	b->logits = calloc((size_t)NCONT * b->V, sizeof(float));
	b->ids = calloc((size_t)NCONT * b->per + 1, sizeof(uint32_t));
	b->w = calloc((size_t)NCONT * b->per + 1, sizeof(float));
	b->taps = calloc((size_t)(NCONT + NPROMPT) * NTAPS * b->D, sizeof(float));
	b->state = calloc(NCONT + 1, sizeof(*b->state));
	b->state_n = calloc(NCONT + 1, sizeof(*b->state_n));
	bool ok = k3_engine_seq_new(e, 4, &s, &err) == 0;
	struct k3_engine_out none = { K3_ENGINE_LOGITS_NONE, NULL, NULL, NULL };
	k3_engine_set_tap_out(e, b->taps);
	ok = ok && k3_engine_forward(e, s, prompt, NPROMPT, &none, &err) == 0;
	ok = ok && export_all(e, s, b->L, &b->state[0], &b->state_n[0]);
	for (uint32_t i = 0; ok && i < NCONT; i++) {
		struct k3_engine_out o = { K3_ENGINE_LOGITS_LAST, b->logits + (size_t)i * b->V,
					   b->ids + (size_t)i * b->per, b->w + (size_t)i * b->per };
		k3_engine_set_tap_out(e, b->taps + (size_t)i * NTAPS * b->D);
		ok = k3_engine_forward(e, s, cont + i, 1, &o, &err) == 0 &&
		     export_all(e, s, b->L, &b->state[i + 1], &b->state_n[i + 1]);
	}
	if (!ok)
		printf("     baseline: %s\n", err.msg);
	k3_engine_seq_free(s);
	k3_engine_free(e);
	return ok;
}

static void base_free(struct base *b)
{
	for (uint32_t i = 0; b->state && i <= NCONT; i++)
		free_state(b->state[i], b->state_n[i], b->L);
	free(b->state);
	free(b->state_n);
	free(b->logits);
	free(b->ids);
	free(b->w);
	free(b->taps);
}

/* How many positions the commit after the pass at continuation index k
 * keeps: cycles through full acceptance, one, and everything between. */
static uint32_t keep_for(uint32_t pass, uint32_t T)
{
	static const uint32_t pat[] = { 99, 1, 3, 2, 99, 4 };
	uint32_t m = pat[pass % (sizeof(pat) / sizeof(pat[0]))];
	return m > T ? T : m;
}

static void verify_run(const struct k3_model *model, const struct base *b, uint32_t threads,
		       bool reference, bool snapshot, int spine, const char *name)
{
	struct k3_err err = { 0 };
	struct k3_engine *e;
	struct k3_store_spine *sp;
	struct k3_engine_seq *s = NULL;
	char what[128];
	snprintf(what, sizeof(what), "%s threads %u%s%s%s", name, threads, reference ? " ref" : "",
		 snapshot ? " snapshot" : " replay", spine >= 0 ? (spine ? " spine 1 resident" :
		 " spine streamed") : "");
	if (!T_OK(open_engine(model, threads, reference, snapshot, spine, &sp, &e) == 0))
		return;
	set_taps(e);
	float *logits = calloc((size_t)TMAX * b->V, sizeof(float));
	uint32_t *ids = calloc((size_t)TMAX * b->per + 1, sizeof(uint32_t));
	float *w = calloc((size_t)TMAX * b->per + 1, sizeof(float));
	float *taps = calloc((size_t)TMAX * NTAPS * b->D, sizeof(float));
	bool ok = T_OK(k3_engine_seq_new(e, 4, &s, &err) == 0);
	struct k3_engine_out none = { K3_ENGINE_LOGITS_NONE, NULL, NULL, NULL };
	k3_engine_set_tap_out(e, NULL);
	ok = ok && T_OK(k3_engine_forward(e, s, prompt, NPROMPT, &none, &err) == 0);
	uint32_t k = 0, passes = 0, partial = 0;
	while (ok && k < NCONT) {
		uint32_t T = NCONT - k < TMAX ? NCONT - k : TMAX;
		struct k3_engine_out o = { K3_ENGINE_LOGITS_ALL, logits, ids, w };
		k3_engine_set_tap_out(e, taps);
		/* a rejected pass first: it must leave no trace */
		ok = T_OK(k3_engine_verify(e, s, cont + k, T, &o, &err) == 0) &&
		     T_OK(k3_engine_commit(e, s, 0, &err) == 0) &&
		     T_OK(k3_engine_seq_len(s) == NPROMPT + k) &&
		     T_OK(state_equals(e, s, b, k, "commit(0)"));
		memset(logits, 0, (size_t)TMAX * b->V * sizeof(float));
		ok = ok && T_OK(k3_engine_verify(e, s, cont + k, T, &o, &err) == 0);
		if (!ok)
			break;
		bool same = memcmp(logits, b->logits + (size_t)k * b->V, (size_t)T * b->V * sizeof(float)) == 0 &&
			    memcmp(ids, b->ids + (size_t)k * b->per, (size_t)T * b->per * sizeof(uint32_t)) == 0 &&
			    memcmp(w, b->w + (size_t)k * b->per, (size_t)T * b->per * sizeof(float)) == 0 &&
			    memcmp(taps, b->taps + (size_t)k * NTAPS * b->D,
				   (size_t)T * NTAPS * b->D * sizeof(float)) == 0;
		if (!T_OK(same))
			printf("     %s: pass at %u (T = %u) differs from decoding one by one\n", what, k, T);
		uint32_t m = keep_for(passes++, T);
		partial += m < T;
		ok = T_OK(k3_engine_commit(e, s, m, &err) == 0) &&
		     T_OK(k3_engine_seq_len(s) == NPROMPT + k + m);
		k += m;
		ok = ok && T_OK(state_equals(e, s, b, k, what));
	}
	T_OK(partial >= 3);
	if (!ok)
		printf("     %s: %s\n", what, err.msg);

	/* Misuse: forward, clone and a second verify wait for the commit. */
	if (ok) {
		struct k3_engine_seq *c = NULL;
		struct k3_engine_out o = { K3_ENGINE_LOGITS_ALL, logits, NULL, NULL };
		k3_engine_set_tap_out(e, NULL);
		T_OK(k3_engine_verify(e, s, cont, 2, &o, &err) == 0);
		T_OK(k3_engine_verify_pending(e, s));
		T_EQ_INT(k3_engine_forward(e, s, cont, 1, &o, &err), -EBUSY);
		T_EQ_INT(k3_engine_verify(e, s, cont, 1, &o, &err), -EBUSY);
		T_EQ_INT(k3_engine_seq_clone(e, s, &c, &err), -EBUSY);
		T_EQ_INT(k3_engine_commit(e, s, 3, &err), -EINVAL);
		T_OK(k3_engine_commit(e, s, 0, &err) == 0);
		T_EQ_INT(k3_engine_commit(e, s, 0, &err), -EINVAL);
		T_OK(state_equals(e, s, b, NCONT, "after refused calls"));
		/* Too wide for one pass, a bad id: refused before anything runs. */
		int32_t wide[9] = { 0 }, bad[2] = { 0, (int32_t)b->V };
		T_EQ_INT(k3_engine_verify(e, s, wide, 9, &o, &err), -EINVAL);
		T_EQ_INT(k3_engine_verify(e, s, bad, 2, &o, &err), -EINVAL);
		/* Cancelled between layers: the provisional rows go, s stays usable. */
		atomic_bool stop = true;
		k3_engine_set_cancel(e, &stop);
		T_EQ_INT(k3_engine_verify(e, s, cont, 3, &o, &err), -ECANCELED);
		k3_engine_set_cancel(e, NULL);
		T_OK(!k3_engine_verify_pending(e, s));
		T_OK(state_equals(e, s, b, NCONT, "after a cancelled verification"));
	}
	printf("%s: %u passes checked\n", what, passes);
	k3_engine_seq_free(s);
	k3_engine_free(e);
	k3_store_spine_free(sp);
	free(logits);
	free(ids);
	free(w);
	free(taps);
}

static void check(const char *dir, const char *name, bool with_ref)
{
	struct k3_err err = { 0 };
	struct k3_model *model;
	struct base b = { 0 };
	if (!T_OK(k3_model_open(dir, &model, &err) == 0)) {
		printf("     %s: %s\n", name, err.msg);
		return;
	}
	make_ids(k3_model_config(model)->vocab_size);
	if (T_OK(baseline(model, false, &b))) {
		for (int snap = 0; snap < 2; snap++)
			for (uint32_t th = 1; th <= 2; th++)
				verify_run(model, &b, th, false, snap, -1, name);
		/* streamed spine: the baseline is the mapped one (bit-identical) */
		for (int snap = 0; snap < 2; snap++)
			for (int res = 0; res <= 1; res++)
				verify_run(model, &b, 1, false, snap, res, name);
	}
	base_free(&b);
	/* the scalar reference path: its own baseline (other rounding) */
	memset(&b, 0, sizeof(b));
	if (with_ref && T_OK(baseline(model, true, &b)))
		verify_run(model, &b, 1, true, false, -1, name);
	base_free(&b);
	k3_model_free(model);
}

int main(void)
{
	struct k3_err err = { 0 };
	char tmpl[] = "/tmp/k3_verify_XXXXXX";
	const char *presets[] = { "nano", "small" };

	check(t_shared_path("golden/forward/k3tiny_a/model"), "k3tiny_a", false);
	check(t_shared_path("golden/forward/k3tiny_b/model"), "k3tiny_b", true);
	if (!mkdtemp(tmpl))
		return t_skip("no temporary directory");
	for (size_t i = 0; i < sizeof(presets) / sizeof(presets[0]); i++) {
		struct k3_demo_opts o = { .seed = 7 };
		char dir[256];
		snprintf(dir, sizeof(dir), "%s/%s", tmpl, presets[i]);
		if (!T_OK(k3_demo_preset_parse(presets[i], &o.preset) == 0) ||
		    !T_OK(k3_demo_write(dir, &o, &err) == 0)) {
			printf("     %s\n", err.msg);
			continue;
		}
		check(dir, presets[i], false);
		char cmd[512];
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
		if (system(cmd) != 0)
			printf("     could not remove %s\n", dir);
	}
	rmdir(tmpl);
	return t_done();
}

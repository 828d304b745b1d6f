/*
 * test_engine_noalloc.c - no heap allocation in the per-token path after
 * warm-up (issue 8): malloc/calloc/realloc are interposed and counted while
 * a decode step and a prefill chunk run on a warmed-up sequence, with the
 * spine mapped and streamed (the spine loader, store_spine.h, with one
 * layer resident: binding, reads and read-ahead allocate nothing either).
 * Skipped under AddressSanitizer, which owns the allocator.
 */
#include "t.h"

#include "engine/engine.h"
#include "model/model.h"
#include "store/store_spine.h"

#if defined(__SANITIZE_ADDRESS__)
#define NOALLOC_SKIP 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define NOALLOC_SKIP 1
#endif
#endif

#ifndef NOALLOC_SKIP
extern void *__libc_malloc(size_t n);
extern void *__libc_calloc(size_t n, size_t m);
extern void *__libc_realloc(void *p, size_t n);

static volatile int counting;
static volatile long allocs;

void *malloc(size_t n)
{
	if (counting)
		__atomic_add_fetch(&allocs, 1, __ATOMIC_RELAXED);
	return __libc_malloc(n);
}

void *calloc(size_t n, size_t m)
{
	if (counting)
		__atomic_add_fetch(&allocs, 1, __ATOMIC_RELAXED);
	return __libc_calloc(n, m);
}

void *realloc(void *p, size_t n)
{
	if (counting)
		__atomic_add_fetch(&allocs, 1, __ATOMIC_RELAXED);
	return __libc_realloc(p, n);
}
#endif

#ifndef NOALLOC_SKIP
/* Allocations during 8 decode steps and one 8-token chunk after warm-up. */
static void count(const struct k3_model *model, const struct k3_spine_source *spine,
		  const char *what)
{
	struct k3_err err = { 0 };
	struct k3_engine *e = NULL;
	struct k3_engine_seq *s = NULL;
	struct k3_engine_opts o = { .threads = 2, .max_chunk = 8, .spine = spine };
	T_OK(k3_engine_open(model, &o, &e, &err) == 0);
	T_OK(e && k3_engine_seq_new(e, 64, &s, &err) == 0);
	if (!s) {
		printf("     %s\n", err.msg);
		k3_engine_free(e);
		return;
	}
	uint32_t V = k3_engine_vocab(e), per = k3_engine_n_moe(e) * k3_engine_top_k(e);
	float *logits = calloc((size_t)8 * V, sizeof(float));
	uint32_t *ids = calloc((size_t)8 * per, sizeof(uint32_t));
	float *w = calloc((size_t)8 * per, sizeof(float));
	int32_t prompt[8] = { 5, 231, 232, 165, 64, 57, 240, 60 };
	struct k3_engine_out out = { K3_ENGINE_LOGITS_LAST, logits, ids, w };

	T_OK(k3_engine_forward(e, s, prompt, 8, &out, &err) == 0);   /* warm-up */
	int32_t tok = (int32_t)k3_engine_argmax(logits, V);
	T_OK(k3_engine_forward(e, s, &tok, 1, &out, &err) == 0);

	allocs = 0;
	counting = 1;
	int fails = 0;
	for (int i = 0; i < 8; i++) {
		tok = (int32_t)k3_engine_argmax(logits, V);
		fails += k3_engine_forward(e, s, &tok, 1, &out, &err) != 0;
	}
	struct k3_engine_out all = { K3_ENGINE_LOGITS_ALL, logits, ids, w };
	fails += k3_engine_forward(e, s, prompt, 8, &all, &err) != 0;
	counting = 0;
	T_EQ_INT(fails, 0);
	T_EQ_INT(allocs, 0);
	printf("allocations during 8 decode steps and one 8-token chunk, %s: %ld\n", what, allocs);

	free(logits);
	free(ids);
	free(w);
	k3_engine_seq_free(s);
	k3_engine_free(e);
}
#endif

int main(void)
{
#ifdef NOALLOC_SKIP
	return t_skip("allocation counting is not possible under ASan");
#else
	struct k3_err err = { 0 };
	struct k3_model *model = NULL;
	if (!T_OK(k3_model_open(t_shared_path("golden/forward/k3tiny_b/model"), &model, &err) == 0)) {
		printf("     %s\n", err.msg);
		return t_done();
	}
	count(model, NULL, "spine mapped");
	struct k3_store_spine_config cfg = { .resident_layers = 1, .max_rows = 8 };
	struct k3_store_spine *sp = NULL;
	struct k3_spine_source ss;
	T_OK(k3_store_spine_new(model, NULL, &cfg, &sp, NULL, &err) == 0);
	if (sp) {
		k3_store_spine_source(sp, &ss);
		count(model, &ss, "spine streamed (1 layer resident)");
	} else {
		printf("     %s\n", err.msg);
	}
	k3_store_spine_free(sp);
	k3_model_free(model);
	return t_done();
#endif
}

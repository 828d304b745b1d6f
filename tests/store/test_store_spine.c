/*
 * test_store_spine.c - spine streaming (issue 17 items 1-2): the engine's
 * logits, routes and greedy ids are bit-identical whether the spine is the
 * model's mmapped tensors or comes through the spine loader
 * (store_spine.h), for every resident prefix from all layers to none, the
 * head resident or streamed, the embedding resident or read row by row,
 * from the spine pack or the shards, O_DIRECT on and off, 1 and 2 readers,
 * rings of 2 and 3 arenas, prefill chunks of 1, 5 and 64, with experts
 * mmapped or through the expert store (floor and unlimited budgets,
 * lookahead on) sharing its reader pool; on both golden checkpoints and on
 * a demo model whose spine is several times the loader's memory. Each
 * streamed layer is read once per pass (counted), nothing is read ahead in
 * vain, and the shards' mmapped pages of streamed tensors are never
 * touched (/proc/self/pagemap). A spine pack that is stale, damaged or of
 * another model is refused and the shards are read instead.
 *
 * The int8 spine (a demo model opened with its overlay, store_int8.h) the
 * same way: every variant and resident prefix bit-identical to the mapped
 * int8 spine, from its own pack (spine-int8.k3pack, whose sources are the
 * shards and the overlay's shards) and from the shards and the overlay's
 * files, no mapped page of either touched; the BF16 spine pack refused for
 * the int8 model and the int8 one for the BF16 model.
 */
#include "t.h"
#include "t_engine.h"
#include "t_store.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include "engine/engine.h"
#include "demo/demo.h"
#include "model/model.h"
#include "store/store.h"
#include "store/store_engine.h"
#include "store/store_int8.h"
#include "store/store_model.h"
#include "store/store_spine.h"

enum { NTOK = 12, NGEN = 6, NALL = NTOK + NGEN, ALL = 1000 };

static const int32_t prompt[NTOK] = { 5, 231, 232, 165, 64, 57, 240, 60, 11, 200, 17, 93 };

static struct k3_model *model;
static uint32_t V, PER, N_LAYERS;
static char packdir[256], spine_path[600];

struct result {
	float *logits;      /* [NALL][V] */
	uint32_t *ids;      /* [NALL][n_moe][K] */
	float *w;
	int32_t gen[NGEN];
	struct k3_store_spine_stats st;      /* since the loader was created */
	struct k3_store_spine_info info;
	struct k3_store_spine_report rep;
	int rc;
	char msg[K3_ERR_MSG_MAX];
};

struct variant {
	const char *name;
	bool spine;                 /* false: the mmapped tensors (the reference) */
	bool packs;
	uint32_t resident;          /* layers; ALL = every layer */
	bool head_resident, embed_resident;
	uint32_t ring;
	enum k3_store_direct direct;
	unsigned threads;
	uint32_t chunk;
	int experts;                /* 0: mmapped; 1: store at the floor; 2: store, unlimited */
	uint64_t chunk_bytes;       /* spine read jobs; 0 = default */
};

static void result_free(struct result *r)
{
	free(r->logits);
	free(r->ids);
	free(r->w);
}

/* Prompt in chunks, then NGEN greedy decode steps. */
static void run(const struct variant *v, struct result *r)
{
	struct k3_engine_opts o = { .threads = 1, .max_chunk = v->chunk };
	struct k3_store_source *xsrc = NULL;
	struct k3_store *store = NULL;
	struct k3_store_engine_src ectx;
	struct k3_store_spine *sp = NULL;
	struct k3_spine_source ss;
	struct k3_store_spine_stats s0 = { 0 };
	struct k3_engine *e = NULL;
	struct k3_err err = { 0 };
	int rc = 0;

	memset(r, 0, sizeof(*r));
	r->logits = calloc((size_t)NALL * V, sizeof(float));
	r->ids = calloc((size_t)NALL * PER, sizeof(uint32_t));
	r->w = calloc((size_t)NALL * PER, sizeof(float));
	if (v->experts) {
		rc = k3_store_source_open_model(model, packdir, v->direct, &xsrc, NULL, &err);
		if (!rc) {
			uint64_t slots = v->experts == 1 ? k3_model_config(model)->num_experts_per_token
							 : k3_store_source_count(xsrc);
			struct k3_store_config cfg = {
				.cache_bytes = slots * k3_store_source_slot_bytes(xsrc),
				.io_threads = v->threads, .check_scales = true, .prefetch_slots = -1,
			};
			rc = k3_store_new(xsrc, &cfg, &store, &err);
		}
	}
	if (!rc && v->spine) {
		struct k3_store_spine_config cfg = {
			.resident_layers = v->resident == ALL ? N_LAYERS : v->resident,
			.head_resident = v->head_resident, .embed_resident = v->embed_resident,
			.ring_arenas = v->ring, .direct = v->direct, .io_threads = v->threads,
			.io = store ? k3_store_reader_pool(store) : NULL,
			.chunk_bytes = v->chunk_bytes, .max_rows = 4,
		};
		rc = k3_store_spine_new(model, v->packs ? spine_path : NULL, &cfg, &sp, &r->rep, &err);
		if (!rc) {
			k3_store_spine_source(sp, &ss);
			o.spine = &ss;
			k3_store_spine_stats_get(sp, &s0);
		}
	}
	if (!rc)
		rc = k3_engine_open(model, &o, &e, &err);
	if (!rc && store) {
		struct k3_expert_source es;
		k3_store_engine_src_init(&ectx, store, &es);
		k3_store_engine_src_set_prefetch(&ectx, k3_model_config(model)->num_experts_per_token,
						 &es);
		k3_engine_set_expert_source(e, &es);
	}
	if (!rc)
		rc = t_engine_run(e, prompt, NTOK, NGEN, r->logits, r->ids, r->w, r->gen, &err);
	r->rc = rc;
	snprintf(r->msg, sizeof(r->msg), "%s", rc ? err.msg : "");
	k3_engine_free(e);
	if (sp) {
		struct k3_store_spine_stats now;
		k3_store_spine_drain(sp);
		k3_store_spine_stats_get(sp, &now);
		k3_store_spine_stats_sub(&now, &s0, &r->st);
		k3_store_spine_info_get(sp, &r->info);
	}
	if (store)
		k3_store_engine_src_release(&ectx);
	k3_store_spine_free(sp);   /* before the pool it borrows */
	k3_store_free(store);
	k3_store_source_free(xsrc);
}

static bool same(const struct result *a, const struct result *b)
{
	return a->rc == 0 && b->rc == 0 &&
	       memcmp(a->logits, b->logits, (size_t)NALL * V * sizeof(float)) == 0 &&
	       memcmp(a->ids, b->ids, (size_t)NALL * PER * sizeof(uint32_t)) == 0 &&
	       memcmp(a->w, b->w, (size_t)NALL * PER * sizeof(float)) == 0 &&
	       memcmp(a->gen, b->gen, sizeof(a->gen)) == 0;
}

/* Passes (chunks) of a run: the prompt's chunks, then one per decode step. */
static uint32_t passes(uint32_t chunk)
{
	return (NTOK + chunk - 1) / chunk + NGEN;
}

/* Runs v against ref and checks what one pass reads. */
static void check_variant(const char *model_name, const struct variant *v,
			  const struct result *ref)
{
	struct result got;
	uint32_t R = v->resident == ALL ? N_LAYERS : v->resident;

	run(v, &got);
	if (got.rc)
		printf("%s %s: %s\n", model_name, v->name, got.msg);
	T_EQ_INT(got.rc, 0);
	if (!same(&got, ref))
		printf("%s %s: results differ from the mmapped tensors\n", model_name, v->name);
	T_OK(same(&got, ref));
	T_EQ_INT(got.rep.from_pack, v->packs);
	/* every streamed layer (and a streamed head) once per pass; the
	 * read-ahead may have started the next pass's first ones */
	uint64_t per_pass = (N_LAYERS - R) + !v->head_resident;
	uint64_t want = per_pass * passes(v->chunk);
	if (per_pass <= got.info.ring_arenas)
		want = per_pass;   /* the ring holds them all: each is read once */
	T_OK(got.st.loads >= want && got.st.loads <= want + got.info.ring_arenas);
	if (got.st.loads < want || got.st.loads > want + got.info.ring_arenas)
		printf("%s %s: %llu loads, %llu passes of %llu units\n", model_name, v->name,
		       (unsigned long long)got.st.loads, (unsigned long long)passes(v->chunk),
		       (unsigned long long)per_pass);
	T_EQ_U64(got.st.wasted_bytes, 0);
	T_EQ_U64(got.st.rows_read, v->embed_resident ? 0 : NALL);
	if (per_pass == 0)
		T_EQ_U64(got.st.loads, 0);
	T_EQ_U64(got.info.streamed_bytes_per_pass > 0, per_pass > 0);
	T_OK(got.st.bytes_read >= want * (v->direct == K3_STORE_DIRECT_OFF ? 1 : 4096));
	result_free(&got);
}

static const struct variant variants[] = {
	{ "all resident, pack, O_DIRECT auto, 2 readers", true, true, ALL, true, true, 2,
	  K3_STORE_DIRECT_AUTO, 2, 64, 0, 0 },
	{ "all layers, head streamed, embedding rows, pack, buffered, 1 reader", true, true, ALL,
	  false, false, 0, K3_STORE_DIRECT_OFF, 1, 64, 0, 0 },
	{ "prefix n-1, shards, O_DIRECT auto, 2 readers, chunk 5", true, false, ALL - 1, true,
	  false, 2, K3_STORE_DIRECT_AUTO, 2, 5, 0, 0 },
	{ "prefix 1, pack, buffered, 2 readers, chunk 1, small jobs", true, true, 1, true, false,
	  2, K3_STORE_DIRECT_OFF, 2, 1, 0, 3 * 4096 },
	{ "none resident, pack, O_DIRECT auto, 1 reader", true, true, 0, false, false, 2,
	  K3_STORE_DIRECT_AUTO, 1, 64, 0, 0 },
	{ "none resident, shards, buffered, 2 readers, ring 3, chunk 5", true, false, 0, false,
	  false, 3, K3_STORE_DIRECT_OFF, 2, 5, 0, 4096 },
	{ "none resident, shards, O_DIRECT auto, 1 reader, chunk 1", true, false, 0, true, true,
	  2, K3_STORE_DIRECT_AUTO, 1, 1, 0, 0 },
	{ "prefix 2, pack, experts at the floor (shared pool), O_DIRECT auto, 2 readers, chunk 5",
	  true, true, 2, false, false, 2, K3_STORE_DIRECT_AUTO, 2, 5, 1, 8192 },
	{ "none resident, shards, experts unlimited (shared pool), buffered, 1 reader", true,
	  false, 0, false, false, 2, K3_STORE_DIRECT_OFF, 1, 64, 2, 0 },
	{ "none resident, pack, experts at the floor, O_DIRECT auto, 2 readers, chunk 1", true,
	  true, 0, false, false, 3, K3_STORE_DIRECT_AUTO, 2, 1, 1, 0 },
};

/* Pages of [p, p + n) present in this process's page tables, from
 * /proc/self/pagemap (bit 63 of each page's entry). */
static uint64_t present_pages(int fd, const void *p, uint64_t n)
{
	uint64_t page = 4096, first = (uintptr_t)p / page, last = ((uintptr_t)p + n - 1) / page;
	uint64_t count = 0, ent;

	for (uint64_t pg = first; pg <= last; pg++)
		if (pread(fd, &ent, 8, (off_t)(pg * 8)) == 8 && (ent >> 63))
			count++;
	return count;
}

/* With every layer and the head streamed (and the experts through the
 * store), no page of a streamed spine tensor in the model's mapping is
 * touched: compared with what opening the model itself mapped (its header
 * reads and the kernel's fault-around next to them), not one more page is
 * present after a prefill and decode. */
static void check_untouched(const char *dir, bool int8)
{
	struct k3_err err = { 0 };
	struct k3_model *m2 = NULL;
	int fd = open("/proc/self/pagemap", O_RDONLY);

	if (fd < 0 || (int8 ? k3_store_int8_open_model(dir, NULL, 0, &m2, &err)
			    : k3_model_open(dir, &m2, &err)) != 0) {
		printf("pagemap check skipped (%s)\n", fd < 0 ? "no /proc/self/pagemap" : err.msg);
		if (fd >= 0)
			close(fd);
		return;
	}
	const struct k3_model_plan *plan = k3_model_plan(m2);
	const struct k3_tensor *f[K3_ENGINE_LAYER_FIELDS];
	size_t n = 0, cap = (size_t)plan->n_layers * K3_ENGINE_LAYER_FIELDS + 8;
	const struct k3_tensor **ts = calloc(cap, sizeof(*ts));
	uint64_t *base = calloc(cap, sizeof(*base)), grown = 0, total = 0;
	for (uint32_t l = 0; l < plan->n_layers; l++) {
		k3_engine_layer_tensors(&plan->layers[l], f);
		for (unsigned i = 0; i < K3_ENGINE_LAYER_FIELDS; i++)
			if (f[i])
				ts[n++] = f[i];
	}
	k3_engine_head_tensors(plan, f);
	for (unsigned i = 0; i < K3_ENGINE_HEAD_FIELDS; i++)
		if (f[i])
			ts[n++] = f[i];
	ts[n++] = plan->embed_tokens;
	for (size_t i = 0; i < n; i++)
		base[i] = present_pages(fd, ts[i]->data, ts[i]->nbytes);

	struct k3_model *keep = model;
	struct result got;
	/* experts through the store, as in k3d: a fault on a mapped expert
	 * would map its page-cached neighbours too (the kernel's fault-around) */
	const struct variant v = { "pagemap", true, false, 0, false, false, 2,
				   K3_STORE_DIRECT_AUTO, 2, 5, 2, 0 };
	model = m2;
	run(&v, &got);
	model = keep;
	T_EQ_INT(got.rc, 0);
	for (size_t i = 0; i < n; i++) {
		uint64_t now = present_pages(fd, ts[i]->data, ts[i]->nbytes);
		total += (ts[i]->nbytes + 4095) / 4096;
		if (now > base[i]) {
			printf("streamed tensor '%s': %llu mapped pages touched\n", ts[i]->name,
			       (unsigned long long)(now - base[i]));
			grown += now - base[i];
		}
	}
	printf("pagemap: %zu spine tensors (%llu pages), none touched: %s\n", n,
	       (unsigned long long)total, grown ? "no" : "yes");
	T_EQ_U64(grown, 0);
	result_free(&got);
	free(ts);
	free(base);
	close(fd);
	k3_model_free(m2);
}

/* Packs (experts and spine) of the model in packdir. */
static void write_packs(void)
{
	struct k3_store_pack_ident *id = NULL;
	struct k3_err err = { 0 };
	size_t n_id = 0;

	t_store_write_expert_packs(model, packdir);
	/* the spine's sources: the shards, and an int8 overlay's shards */
	T_EQ_INT(k3_store_spine_idents(model, &id, &n_id, &err), 0);
	T_EQ_INT(k3_store_spine_pack_path(spine_path, sizeof(spine_path), packdir, model), 0);
	T_EQ_INT(k3_store_spine_pack_write(model, spine_path, id, n_id, 0, NULL, &err), 0);
	free(id);
}

static void remove_packs(void)
{
	char path[600];

	for (uint32_t l = 0; l < N_LAYERS; l++) {
		k3_store_pack_path(path, sizeof(path), packdir, l);
		unlink(path);
	}
	unlink(spine_path);
}

static int open_model(const char *dir)
{
	struct k3_err err = { 0 };

	if (k3_model_open(dir, &model, &err) != 0) {
		printf("model_open %s: %s\n", dir, err.msg);
		T_OK(0);
		return -1;
	}
	const struct k3_model_config *cfg = k3_model_config(model);
	PER = cfg->n_moe * cfg->num_experts_per_token;
	V = cfg->vocab_size;
	N_LAYERS = cfg->num_hidden_layers;
	return 0;
}

/* A pack that is not this model's spine, or damaged: refused with the
 * reason, the shards read instead, the same results. */
static void check_rejections(const char *name, const struct result *ref)
{
	const struct variant v = { "rejected pack", true, true, 0, false, false, 2,
				   K3_STORE_DIRECT_OFF, 1, 64, 0, 0 };
	struct result got;
	int fd;

	/* a byte of the metadata flipped: the pack fails its own hash */
	fd = open(spine_path, O_RDWR);
	uint8_t b;
	T_EQ_INT(pread(fd, &b, 1, 4096 + 20), 1);
	b ^= 0x40;
	T_EQ_INT(pwrite(fd, &b, 1, 4096 + 20), 1);
	close(fd);
	run(&v, &got);
	T_EQ_INT(got.rc, 0);
	T_OK(got.rep.pack_rejected && !got.rep.from_pack);
	T_OK(strstr(got.rep.rejection, "SHA-256") != NULL);
	T_OK(same(&got, ref));
	result_free(&got);

	/* an expert pack where the spine pack should be */
	char p1[600];
	T_EQ_INT(k3_store_pack_path(p1, sizeof(p1), packdir, 1), 0);
	T_EQ_INT(rename(p1, spine_path), 0);
	run(&v, &got);
	T_EQ_INT(got.rc, 0);
	T_OK(got.rep.pack_rejected && strstr(got.rep.rejection, "not a spine pack") != NULL);
	T_OK(same(&got, ref));
	if (!got.rep.pack_rejected)
		printf("%s: an expert pack was taken for the spine\n", name);
	result_free(&got);
	remove_packs();
	write_packs();
}

static const struct variant mapped = { "mmapped", false, false, 0, true, true, 2,
				       K3_STORE_DIRECT_AUTO, 1, 64, 0, 0 };

/* Every variant of the table, then every prefix from all layers to none
 * (the rest fixed), against ref. */
static void check_matrix(const char *name, const struct result *ref)
{
	for (size_t i = 0; i < sizeof(variants) / sizeof(variants[0]); i++) {
		struct variant v = variants[i];
		if (v.resident == ALL - 1)
			v.resident = N_LAYERS - 1;
		check_variant(name, &v, ref);
	}
	for (uint32_t R = 0; R <= N_LAYERS; R++) {
		const struct variant v = { "prefix sweep", true, true, R, R % 2 == 0, false, 2,
					   K3_STORE_DIRECT_AUTO, 2, 64, 0, 0 };
		check_variant(name, &v, ref);
	}
}

static void run_case(const char *name, const char *dir)
{
	struct result ref;

	if (open_model(dir) != 0)
		return;
	write_packs();
	run(&mapped, &ref);
	T_EQ_INT(ref.rc, 0);
	check_matrix(name, &ref);
	check_rejections(name, &ref);
	result_free(&ref);
	check_untouched(dir, false);
	remove_packs();
	k3_model_free(model);
	model = NULL;
}

/* A demo model whose spine is several times what the loader holds with no
 * layer resident (two arenas of its largest layer, a few embedding rows). */
static void run_demo(void)
{
	const char *tmp = getenv("TMPDIR");
	char dir[300];
	struct k3_err err = { 0 };
	struct k3_demo_opts o = { .preset = K3_DEMO_NANO, .seed = 17, .layers = 12, .vocab = 768 };
	struct k3_store_spine_sizes z;

	snprintf(dir, sizeof(dir), "%s/k3spinedemo.XXXXXX", tmp ? tmp : "/tmp");
	if (!mkdtemp(dir) || k3_demo_write(dir, &o, &err) != 0) {
		printf("demo model: %s\n", err.msg);
		T_OK(0);
		return;
	}
	if (open_model(dir) != 0)
		return;
	T_EQ_INT(k3_store_spine_sizes(model, &z, &err), 0);
	struct k3_store_spine_config none = { .resident_layers = 0, .max_rows = 4 };
	uint64_t mem = k3_store_spine_memory(&z, &none);
	printf("demo: spine %.2f MB, loader memory with nothing resident %.2f MB (%.1fx)\n",
	       (double)z.spine_bytes / 1e6, (double)mem / 1e6, (double)z.spine_bytes / (double)mem);
	T_OK(z.spine_bytes >= 3 * mem);
	write_packs();
	struct result ref;
	const struct variant mm = { "mmapped", false, false, 0, true, true, 2,
				    K3_STORE_DIRECT_AUTO, 1, 64, 0, 0 };
	run(&mm, &ref);
	T_EQ_INT(ref.rc, 0);
	const struct variant vs[] = {
		{ "demo: none resident, pack, O_DIRECT auto, 2 readers, chunk 5", true, true, 0,
		  false, false, 2, K3_STORE_DIRECT_AUTO, 2, 5, 0, 0 },
		{ "demo: none resident, shards, buffered, 1 reader, experts at the floor", true,
		  false, 0, false, false, 2, K3_STORE_DIRECT_OFF, 1, 64, 1, 0 },
		{ "demo: prefix 6, pack, buffered, 2 readers, chunk 1", true, true, 6, true, false,
		  2, K3_STORE_DIRECT_OFF, 2, 1, 0, 0 },
	};
	for (size_t i = 0; i < sizeof(vs) / sizeof(vs[0]); i++) {
		struct result got;
		check_variant("demo", &vs[i], &ref);
		if (i == 0) {
			run(&vs[i], &got);
			/* what the loader holds, measured */
			T_OK(got.info.memory_bytes * 3 <= z.spine_bytes);
			T_OK(got.info.memory_bytes <= mem);
			result_free(&got);
		}
	}
	result_free(&ref);
	remove_packs();
	k3_model_free(model);
	model = NULL;
	char cmd[700];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	T_EQ_INT(system(cmd), 0);
}

/* The model's results with spine_path naming the other spine's pack:
 * refused (its tensors are of the other dtype), the shards read, the same
 * results as ref. */
static void check_foreign_pack(const char *what, const char *pack, const struct result *ref,
			       const char *needle)
{
	const struct variant v = { "the other spine's pack", true, true, 1, true, false, 2,
				   K3_STORE_DIRECT_AUTO, 2, 5, 0, 0 };
	char keep[sizeof(spine_path)];
	struct result got;

	snprintf(keep, sizeof(keep), "%s", spine_path);
	snprintf(spine_path, sizeof(spine_path), "%s", pack);
	run(&v, &got);
	snprintf(spine_path, sizeof(spine_path), "%s", keep);
	T_EQ_INT(got.rc, 0);
	T_OK(got.rep.pack_rejected && !got.rep.from_pack);
	if (!got.rep.pack_rejected || !strstr(got.rep.rejection, needle))
		printf("%s: %s\n", what, got.rep.pack_rejected ? got.rep.rejection : "taken");
	T_OK(strstr(got.rep.rejection, needle) != NULL);
	T_OK(same(&got, ref));
	result_free(&got);
}

/* A demo model opened with its int8 spine overlay: the whole matrix
 * against its mapped int8 spine, from spine-int8.k3pack and from the
 * shards and the overlay's; the two spines' packs side by side, each
 * refused for the other spine. */
static void run_int8(void)
{
	const char *tmp = getenv("TMPDIR");
	char dir[300], bf16_pack[600], cmd[700];
	struct k3_err err = { 0 };
	struct k3_demo_opts o = { .preset = K3_DEMO_NANO, .seed = 23, .layers = 6, .vocab = 768 };
	struct k3_store_int8_report rep;
	struct result ref, ref_bf16;

	snprintf(dir, sizeof(dir), "%s/k3spinei8.XXXXXX", tmp ? tmp : "/tmp");
	if (!mkdtemp(dir) || k3_demo_write(dir, &o, &err) != 0 || open_model(dir) != 0) {
		printf("int8 demo model: %s\n", err.msg);
		T_OK(0);
		return;
	}
	/* the BF16 spine's packs and results first, then the overlay */
	write_packs();
	snprintf(bf16_pack, sizeof(bf16_pack), "%s", spine_path);
	run(&mapped, &ref_bf16);
	T_EQ_INT(ref_bf16.rc, 0);
	T_EQ_INT(k3_store_int8_write(model, NULL, false, &rep, &err), 0);
	k3_model_free(model);
	model = NULL;
	if (k3_store_int8_open_model(dir, NULL, 0, &model, &err) != 0) {
		printf("int8 open: %s\n", err.msg);
		T_OK(0);
		return;
	}
	write_packs();
	T_OK(strstr(spine_path, "/spine-int8.k3pack") != NULL);
	T_OK(strcmp(spine_path, bf16_pack) != 0 && access(bf16_pack, R_OK) == 0);
	run(&mapped, &ref);
	T_EQ_INT(ref.rc, 0);
	/* not weight-exact: a different model's results, or the test would
	 * not tell the two spines apart */
	T_OK(memcmp(ref.logits, ref_bf16.logits, (size_t)NALL * V * sizeof(float)) != 0);
	check_matrix("int8", &ref);
	check_foreign_pack("int8 model, BF16 spine pack", bf16_pack, &ref, "--spine int8");
	check_untouched(dir, true);
	/* the BF16 model with the int8 spine's pack */
	char i8_pack[600];
	snprintf(i8_pack, sizeof(i8_pack), "%s", spine_path);
	k3_model_free(model);
	model = NULL;
	T_EQ_INT(open_model(dir), 0);
	snprintf(spine_path, sizeof(spine_path), "%s", bf16_pack);
	check_foreign_pack("BF16 model, int8 spine pack", i8_pack, &ref_bf16, "source files");
	result_free(&ref);
	result_free(&ref_bf16);
	remove_packs();
	unlink(i8_pack);
	k3_model_free(model);
	model = NULL;
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	T_EQ_INT(system(cmd), 0);
}

int main(void)
{
	const char *tmp = getenv("TMPDIR");

	if (access(t_shared_path("golden/forward/k3tiny_a/model/config.json"), R_OK) != 0)
		return t_skip("golden checkpoints not found");
	snprintf(packdir, sizeof(packdir), "%s/k3spinepacks.XXXXXX", tmp ? tmp : "/tmp");
	if (!mkdtemp(packdir))
		return t_skip("no temp dir");
	run_case("k3tiny_a", t_shared_path("golden/forward/k3tiny_a/model"));
	run_case("k3tiny_b", t_shared_path("golden/forward/k3tiny_b/model"));
	run_demo();
	run_int8();
	rmdir(packdir);
	return t_done();
}

/* The store on the golden checkpoints (../shared/golden/forward/<case>/model):
 * every routed expert read through the store, from shards and from packs,
 * equals the checkpoint's tensor bytes; a pack that does not belong to the
 * layer is rejected and the shards are used; the spine pack holds every
 * spine tensor (each layer's, the embedding, the head) with its name,
 * dtype and shape, and its bytes equal the checkpoint's. */
#include "t.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include "model/model.h"
#include "store/store.h"
#include "store/store_model.h"

static char packdir[256];

static const struct k3_tensor *arr(const struct k3_expert *x, int a)
{
	switch (a) {
	case K3_STORE_W1_PACKED: return x->w1.packed;
	case K3_STORE_W1_SCALE: return x->w1.scale;
	case K3_STORE_W2_PACKED: return x->w2.packed;
	case K3_STORE_W2_SCALE: return x->w2.scale;
	case K3_STORE_W3_PACKED: return x->w3.packed;
	default: return x->w3.scale;
	}
}

/* Acquires every expert of every MoE layer, 4 at a time, through a small
 * cache, and counts arrays whose bytes differ from the model's. */
static int compare_all(const struct k3_model *m, const struct k3_store_source *src,
		       unsigned threads, uint64_t *experts_seen)
{
	const struct k3_model_plan *plan = k3_model_plan(m);
	struct k3_store_config cfg = {
		.cache_bytes = 6 * k3_store_source_slot_bytes(src),
		.io_threads = threads, .check_scales = true, .prefetch_slots = -1,
		.prefault = true,
	};
	struct k3_store *s = NULL;
	struct k3_store_view v[4];
	struct k3_err err = { 0 };
	int bad = 0;

	if (k3_store_new(src, &cfg, &s, &err) != 0) {
		printf("store_new: %s\n", err.msg);
		return 1000;
	}
	for (uint32_t l = 0; l < plan->n_layers; l++) {
		const struct k3_layer_plan *lp = &plan->layers[l];
		if (!lp->is_moe)
			continue;
		for (uint32_t e0 = 0; e0 < lp->moe.n_experts; e0 += 4) {
			uint32_t ids[4], n = 0;
			for (uint32_t e = e0; e < e0 + 4 && e < lp->moe.n_experts; e++)
				ids[n++] = e;
			/* Guess the next group, as the engine's lookahead would. */
			uint32_t next[4] = { e0 + 4, e0 + 5, e0 + 6, e0 + 7 };
			k3_store_step_begin(s);
			if (k3_store_acquire(s, l, ids, n, v, &err) != 0) {
				printf("acquire: %s\n", err.msg);
				bad++;
				continue;
			}
			k3_store_prefetch(s, l, next, 4);
			for (uint32_t k = 0; k < n; k++) {
				const struct k3_expert *x = &lp->moe.experts[ids[k]];
				for (int a = 0; a < K3_STORE_ARRAYS; a++) {
					const struct k3_tensor *t = arr(x, a);
					bad += v[k].length[a] != t->nbytes ||
					       memcmp(v[k].array[a], t->data, t->nbytes) != 0;
				}
				(*experts_seen)++;
			}
			k3_store_release(s, v, n);
		}
	}
	k3_store_free(s);
	return bad;
}

/* Every tensor of the spine pack equals the checkpoint's: the name,
 * dtype, shape and length it records, and its bytes (read from the pack
 * file); and every spine tensor of the model is in it exactly once, in
 * the span of its layer (or the embedding's, the head's). */
static void check_spine_pack(const struct k3_model *m, const struct k3_store_pack_ident *id,
			     size_t n_id)
{
	const struct k3_model_plan *plan = k3_model_plan(m);
	const struct k3_tensor *f[K3_ENGINE_LAYER_FIELDS];
	struct k3_store_pack_result res;
	struct k3_store_pack *pack = NULL;
	struct k3_err err = { 0 };
	char path[600];
	size_t want = 1;   /* the embedding */
	int fd, bad = 0;

	T_EQ_INT(k3_store_spine_pack_path(path, sizeof(path), packdir, m), 0);
	T_EQ_INT(k3_store_spine_pack_write(m, path, id, n_id, 0, &res, &err), 0);
	T_OK(res.written);
	T_EQ_U64(res.n_spans, plan->n_layers + 2);
	T_EQ_INT(k3_store_pack_open(path, id, n_id, K3_STORE_PACK_VERIFY, &pack, &err), 0);
	if (!pack)
		return;
	T_EQ_INT(k3_store_pack_kind(pack), K3_STORE_PACK_SPINE);
	for (uint32_t l = 0; l < plan->n_layers; l++) {
		k3_engine_layer_tensors(&plan->layers[l], f);
		for (unsigned i = 0; i < K3_ENGINE_LAYER_FIELDS; i++)
			want += f[i] != NULL;
	}
	k3_engine_head_tensors(plan, f);
	for (unsigned i = 0; i < K3_ENGINE_HEAD_FIELDS; i++)
		want += f[i] != NULL;
	const struct k3_store_pack_layout *lo = k3_store_pack_layout(pack);
	T_EQ_U64(lo->n_arrays, want);
	uint64_t spine_bytes = 0;
	fd = open(path, O_RDONLY);
	for (size_t i = 0; i < lo->n_spans; i++) {
		const struct k3_store_pack_span *sp = &lo->spans[i];
		T_EQ_INT(sp->kind, i < plan->n_layers ? K3_STORE_SPAN_LAYER
			 : i == plan->n_layers ? K3_STORE_SPAN_EMBED : K3_STORE_SPAN_HEAD);
		T_EQ_INT(sp->offset % 4096, 0);
		for (uint32_t j = sp->first; j < sp->first + sp->count; j++) {
			const struct k3_store_pack_tensor *pt = &lo->tensors[j];
			const struct k3_tensor *t = k3_model_tensor(m, pt->name);
			uint8_t *buf = malloc(lo->arrays[j].length);
			if (!t || !buf || lo->arrays[j].length != t->nbytes || pt->ndim != t->ndim ||
			    pt->shape[0] != t->shape[0] ||
			    (t->ndim > 1 && pt->shape[1] != t->shape[1]) ||
			    pt->dtype != (t->dtype == K3_DTYPE_BF16 ? 2u : t->dtype == K3_DTYPE_F32 ? 1u : 0u) ||
			    pread(fd, buf, lo->arrays[j].length,
				  (off_t)(sp->offset + lo->arrays[j].offset)) != (ssize_t)t->nbytes ||
			    memcmp(buf, t->data, t->nbytes) != 0) {
				printf("spine tensor '%s' differs from the checkpoint\n", pt->name);
				bad++;
			}
			/* the span's tensor belongs to its layer */
			if (t && sp->kind == K3_STORE_SPAN_LAYER) {
				char pre[64];
				snprintf(pre, sizeof(pre), "model.layers.%u.", sp->layer);
				T_OK(strstr(t->name, pre) != NULL);
			}
			spine_bytes += lo->arrays[j].length;
			free(buf);
		}
	}
	close(fd);
	T_EQ_INT(bad, 0);
	T_EQ_U64(res.payload_bytes, spine_bytes);
	/* spine + experts = every tensor of the checkpoint */
	size_t n_t = 0;
	uint64_t all = 0, experts = 0;
	const struct k3_tensor *ts = k3_model_tensors(m, &n_t);
	for (size_t i = 0; i < n_t; i++) {
		all += ts[i].nbytes;
		if (strstr(ts[i].name, ".experts."))
			experts += ts[i].nbytes;
	}
	T_EQ_U64(spine_bytes + experts, all);
	k3_store_pack_free(pack);
	unlink(path);
}

static void run_case(const char *name)
{
	char rel[256], path[600];
	struct k3_model *m = NULL;
	struct k3_store_source *src = NULL;
	struct k3_store_open_report rep;
	struct k3_store_pack_ident *id = NULL;
	struct k3_err err = { 0 };
	size_t n_id = 0;
	uint64_t seen = 0, want;
	int rc;

	snprintf(rel, sizeof(rel), "golden/forward/%s/model", name);
	rc = k3_model_open(t_shared_path(rel), &m, &err);
	if (rc) {
		printf("model_open %s: %s\n", name, err.msg);
		T_EQ_INT(rc, 0);
		return;
	}
	const struct k3_model_config *cfg = k3_model_config(m);
	const struct k3_model_plan *plan = k3_model_plan(m);
	want = (uint64_t)cfg->n_moe * cfg->num_experts;

	/* Shards only. */
	src = k3_store_source_new(K3_STORE_DIRECT_AUTO);
	T_EQ_INT(k3_store_source_add_model(src, m, UINT32_MAX, &err), 0);
	T_EQ_U64(k3_store_source_count(src), want);
	T_EQ_INT(compare_all(m, src, 2, &seen), 0);
	T_EQ_U64(seen, want);
	k3_store_source_free(src);

	/* Packs, one per MoE layer, as k3ctl pack writes them. */
	T_EQ_INT(k3_store_model_idents(m, &id, &n_id, &err), 0);
	T_EQ_U64(n_id, k3_model_shard_count(m));
	for (uint32_t l = 0; l < plan->n_layers; l++) {
		struct k3_store_pack_result res;
		if (!plan->layers[l].is_moe)
			continue;
		src = k3_store_source_new(K3_STORE_DIRECT_OFF);
		T_EQ_INT(k3_store_source_add_model(src, m, l, &err), 0);
		T_EQ_INT(k3_store_pack_path(path, sizeof(path), packdir, l), 0);
		rc = k3_store_pack_write(path, src, id, n_id, 0, &res, &err);
		if (rc)
			printf("pack_write: %s\n", err.msg);
		T_EQ_INT(rc, 0);
		T_OK(res.written);
		T_EQ_U64(res.n_spans, cfg->num_experts);
		k3_store_source_free(src);
	}
	T_EQ_INT(k3_store_source_open_model(m, packdir, K3_STORE_DIRECT_AUTO, &src, &rep, &err), 0);
	T_EQ_INT(rep.layers_packed, cfg->n_moe);
	T_EQ_INT(rep.layers_shards, 0);
	T_EQ_INT(rep.packs_rejected, 0);
	T_EQ_U64(k3_store_source_count(src), want);
	/* A pack expert is one read. */
	{
		struct k3_store_plan pl;
		k3_store_source_plan(src, 0, &pl);
		T_EQ_INT(pl.n_reads, 1);
	}
	seen = 0;
	T_EQ_INT(compare_all(m, src, 1, &seen), 0);
	T_EQ_U64(seen, want);
	k3_store_source_free(src);

	/* Layer 2's pack replaced by layer 1's: rejected, shards used. */
	{
		char p1[600];
		T_EQ_INT(k3_store_pack_path(p1, sizeof(p1), packdir, 1), 0);
		T_EQ_INT(k3_store_pack_path(path, sizeof(path), packdir, 2), 0);
		T_EQ_INT(rename(p1, path), 0);
		T_EQ_INT(k3_store_source_open_model(m, packdir, K3_STORE_DIRECT_AUTO, &src, &rep,
						    &err), 0);
		T_EQ_INT(rep.layers_packed, cfg->n_moe - 2);   /* 1 missing, 2 rejected */
		T_EQ_INT(rep.layers_shards, 2);
		T_EQ_INT(rep.packs_rejected, 1);
		T_OK(strstr(rep.first_rejection, "does not match") != NULL);
		seen = 0;
		T_EQ_INT(compare_all(m, src, 2, &seen), 0);
		T_EQ_U64(seen, want);
		k3_store_source_free(src);
	}
	check_spine_pack(m, id, n_id);
	for (uint32_t l = 0; l < plan->n_layers; l++) {
		k3_store_pack_path(path, sizeof(path), packdir, l);
		unlink(path);
	}
	free(id);
	k3_model_free(m);
}

int main(void)
{
	return t_golden_main(packdir, sizeof(packdir), "k3packs", run_case);
}

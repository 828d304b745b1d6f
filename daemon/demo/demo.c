/*
 * demo.c - the synthetic checkpoint writer (see demo.h). Tensors are
 * described first (name, dtype, shape, how to draw them), assigned to shards
 * the way the release's exporter does (layers split evenly, the embedding in
 * the first shard, lm_head and the final norms in the last), ordered inside a
 * shard as the safetensors serializer orders them (wider dtypes first, then
 * by name), and streamed to disk one tensor at a time.
 */
#include "demo/demo.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/array.h"
#include "base/path.h"
#include "model/model.h"

/* ---- presets ---- */

static const struct k3_demo_dims presets[K3_DEMO_PRESET_COUNT] = {
	/* nano: 9 layers -> MLA at 4, 8, 9 (two consecutive at the end), KDA
	 * elsewhere; blocks of 3 -> 3 AttnRes blocks; dense layer 0 */
	[K3_DEMO_NANO] = {
		.layers = 9, .hidden = 128, .vocab = 2304, .intermediate = 256,
		.experts = 16, .top_k = 4, .moe_intermediate = 64, .latent = 64, .shared_experts = 2,
		.kda_heads = 4, .kda_head_dim = 32,
		.mla_heads = 4, .q_lora = 64, .kv_lora = 32, .nope = 32, .rope = 16, .v_head = 32,
		.attn_res_block = 3,
	},
	[K3_DEMO_SMALL] = {
		.layers = 12, .hidden = 512, .vocab = 8448, .intermediate = 1024,
		.experts = 32, .top_k = 8, .moe_intermediate = 128, .latent = 256, .shared_experts = 2,
		.kda_heads = 8, .kda_head_dim = 64,
		.mla_heads = 8, .q_lora = 192, .kv_lora = 128, .nope = 64, .rope = 32, .v_head = 64,
		.attn_res_block = 4,
	},
	/* bench: K3's expert shapes (latent 3584, moe_intermediate 3072) with a
	 * small spine; --experts / --layers size the expert pool */
	[K3_DEMO_BENCH] = {
		.layers = 3, .hidden = 1024, .vocab = 2304, .intermediate = 2048,
		.experts = 8, .top_k = 4, .moe_intermediate = 3072, .latent = 3584, .shared_experts = 2,
		.kda_heads = 8, .kda_head_dim = 128,
		.mla_heads = 8, .q_lora = 384, .kv_lora = 256, .nope = 128, .rope = 64, .v_head = 128,
		.attn_res_block = 2, .random_expert_codes = true,
	},
	/* k3-sparse: the values of docs/model.md §1.2 */
	[K3_DEMO_K3_SPARSE] = {
		.layers = 93, .hidden = 7168, .vocab = 163840, .intermediate = 33792,
		.experts = 896, .top_k = 16, .moe_intermediate = 3072, .latent = 3584, .shared_experts = 2,
		.kda_heads = 96, .kda_head_dim = 128,
		.mla_heads = 96, .q_lora = 1536, .kv_lora = 512, .nope = 128, .rope = 64, .v_head = 128,
		.attn_res_block = 12, .release_layout = true, .sparse = true,
	},
};

int k3_demo_preset_parse(const char *s, enum k3_demo_preset *out)
{
	static const char *names[] = { "nano", "small", "bench", "k3-sparse" };

	for (int i = 0; i < K3_DEMO_PRESET_COUNT; i++)
		if (strcmp(s, names[i]) == 0) {
			*out = (enum k3_demo_preset)i;
			return 0;
		}
	return -EINVAL;
}

#define OVR(f) do { if (o->f) d->f = o->f; } while (0)

int k3_demo_resolve(const struct k3_demo_opts *o, struct k3_demo_dims *d, struct k3_err *err)
{
	if ((unsigned)o->preset >= K3_DEMO_PRESET_COUNT)
		return k3_err_set(err, -EINVAL, "unknown preset");
	*d = presets[o->preset];
	if (d->release_layout && (o->layers || o->hidden || o->vocab || o->intermediate || o->experts ||
				  o->top_k || o->moe_intermediate || o->latent || o->shared_experts ||
				  o->kda_heads || o->kda_head_dim || o->mla_heads || o->q_lora ||
				  o->kv_lora || o->nope || o->rope || o->v_head || o->attn_res_block ||
				  o->shards))
		return k3_err_set(err, -EINVAL, "the k3-sparse preset is K3's real layout: it takes "
				  "no size options");
	OVR(layers); OVR(hidden); OVR(vocab); OVR(intermediate);
	OVR(experts); OVR(top_k); OVR(moe_intermediate); OVR(latent); OVR(shared_experts);
	OVR(kda_heads); OVR(kda_head_dim);
	OVR(mla_heads); OVR(q_lora); OVR(kv_lora); OVR(nope); OVR(rope); OVR(v_head);
	OVR(attn_res_block); OVR(shards);
	/* fewer experts than the preset's top-k: route to all of them */
	if (o->experts && !o->top_k && d->top_k > d->experts)
		d->top_k = d->experts;
	/* fewer layers than the preset's AttnRes block: one block */
	if (o->layers && !o->attn_res_block && d->attn_res_block > d->layers)
		d->attn_res_block = d->layers;
	/* shared_experts 0 cannot be requested through OVR; that path is
	 * not part of K3 anyway */
	const struct { const char *n; uint32_t v, max; } lim[] = {
		{ "--layers", d->layers, K3_MODEL_MAX_LAYERS }, { "--hidden", d->hidden, 16384 },
		{ "--vocab", d->vocab, 1u << 20 }, { "--intermediate", d->intermediate, 65536 },
		{ "--experts", d->experts, K3_MODEL_MAX_EXPERTS }, { "--top-k", d->top_k, 64 },
		{ "--moe-intermediate", d->moe_intermediate, 16384 }, { "--latent", d->latent, 16384 },
		{ "--shared-experts", d->shared_experts, 16 }, { "--kda-heads", d->kda_heads, 256 },
		{ "--kda-head-dim", d->kda_head_dim, 512 }, { "--mla-heads", d->mla_heads, 256 },
		{ "--q-lora", d->q_lora, 8192 }, { "--kv-lora", d->kv_lora, 8192 },
		{ "--nope", d->nope, 512 }, { "--rope", d->rope, 512 }, { "--v-head", d->v_head, 512 },
		{ "--attn-res-block", d->attn_res_block, K3_MODEL_MAX_LAYERS },
	};
	for (size_t i = 0; i < sizeof(lim) / sizeof(lim[0]); i++)
		if (lim[i].v < 1 || lim[i].v > lim[i].max)
			return k3_err_set(err, -EINVAL, "%s %u is out of range [1, %u]", lim[i].n, lim[i].v,
					  lim[i].max);
	if (d->vocab < 512)
		return k3_err_set(err, -EINVAL, "--vocab %u: at least 512 (256 byte ranks + 256 special ids)",
				  d->vocab);
	if (d->latent % 32 || d->moe_intermediate % 32)
		return k3_err_set(err, -EINVAL,
				  "--latent %u and --moe-intermediate %u must be multiples of 32 (MXFP4 groups)",
				  d->latent, d->moe_intermediate);
	if (d->top_k > d->experts)
		return k3_err_set(err, -EINVAL, "--top-k %u exceeds --experts %u", d->top_k, d->experts);
	if (d->attn_res_block > d->layers)
		return k3_err_set(err, -EINVAL, "--attn-res-block %u exceeds --layers %u", d->attn_res_block,
				  d->layers);
	if (d->shards > 4096)
		return k3_err_set(err, -EINVAL, "too many shards");
	return 0;
}

/* ---- deterministic draws ---- */

struct rng { uint64_t s; };

static uint64_t rng_next(struct rng *r)
{
	uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Irwin-Hall(4) scaled to unit variance: integer bits and exact float
 * operations only, so the value is the same everywhere (no libm). */
static float rng_normal(struct rng *r)
{
	uint64_t b = rng_next(r);
	float s = 0.0f;

	for (int i = 0; i < 4; i++)
		s += (float)((b >> (16 * i)) & 0xffff) * (1.0f / 65536.0f);
	return (s - 2.0f) * 1.7320508f;
}

static struct rng rng_for(uint64_t seed, const char *name)
{
	uint64_t h = 0xcbf29ce484222325ull;   /* FNV-1a */

	for (const char *p = name; *p; p++)
		h = (h ^ (uint8_t)*p) * 0x100000001b3ull;
	struct rng r = { seed * 0x9e3779b97f4a7c15ull ^ h };
	rng_next(&r);
	return r;
}

/* ---- tensor descriptions ---- */

enum gen {
	G_NORMAL,     /* mean + std * N(0,1) */
	G_ALOG,       /* first heads entries log(U(1, 16)), zero padding after */
	G_CONV,       /* taps N(0, std), + 0.5 on the current-token tap */
	G_MX_PACKED,  /* MXFP4 packed (scale written from the same draw) */
	G_MX_SCALE,
	G_COPY,       /* bytes of another tensor (the draft's copy of the embedding) */
};

struct tdesc {
	char name[192];
	const void *copy_from; /* G_COPY: these bytes (nbytes of them) */
	enum k3_dtype dtype;
	uint32_t ndim;
	uint64_t shape[4];
	uint64_t nbytes;
	uint32_t shard;
	enum gen gen;
	float mean, std;
	uint32_t heads;       /* G_ALOG: live entries; G_CONV: kernel size */
	uint64_t offset;      /* within the shard's data section */
	uint8_t *pending;     /* G_MX_SCALE: bytes computed with the packed draw */
};

struct dlist {
	struct tdesc *v;
	size_t n, cap;
	const char *prefix;
	int err;
};

static struct tdesc *add(struct dlist *l, uint32_t shard, enum k3_dtype dt, enum gen g,
			 float mean, float std, uint32_t ndim, uint64_t d0, uint64_t d1, uint64_t d2,
			 const char *fmt, ...) __attribute__((format(printf, 11, 12)));
static struct tdesc *add(struct dlist *l, uint32_t shard, enum k3_dtype dt, enum gen g,
			 float mean, float std, uint32_t ndim, uint64_t d0, uint64_t d1, uint64_t d2,
			 const char *fmt, ...)
{
	va_list ap;

	if (l->err)
		return NULL;
	if (k3_array_reserve(&l->v, &l->cap, l->n + 1, sizeof(*l->v), 256)) {
		l->err = -ENOMEM;
		return NULL;
	}
	struct tdesc *t = &l->v[l->n++];
	memset(t, 0, sizeof(*t));
	size_t o = (size_t)snprintf(t->name, sizeof(t->name), "%s", l->prefix);
	va_start(ap, fmt);
	vsnprintf(t->name + o, sizeof(t->name) - o, fmt, ap);
	va_end(ap);
	t->dtype = dt;
	t->gen = g;
	t->mean = mean;
	t->std = std;
	t->ndim = ndim;
	t->shape[0] = d0;
	t->shape[1] = d1;
	t->shape[2] = d2;
	uint64_t ne = 1;
	for (uint32_t i = 0; i < ndim; i++)
		ne *= t->shape[i];
	t->nbytes = ne * k3_dtype_size(dt);
	t->shard = shard;
	return t;
}

#define BF K3_DTYPE_BF16
#define F32 K3_DTYPE_F32

/* matrices [rows, in]: input projections N(0, 1/in), outputs N(0, 0.25/in) */
static void mat(struct dlist *l, uint32_t sh, bool out_proj, uint64_t rows, uint64_t in,
		uint32_t layer, const char *role)
{
	float sd = (out_proj ? 0.5f : 1.0f) / sqrtf((float)in);
	add(l, sh, BF, G_NORMAL, 0.0f, sd, 2, rows, in, 0, "model.layers.%u.%s", layer, role);
}

static void normw(struct dlist *l, uint32_t sh, uint64_t n, uint32_t layer, const char *role)
{
	add(l, sh, BF, G_NORMAL, 1.0f, 0.05f, 1, n, 0, 0, "model.layers.%u.%s", layer, role);
}

static bool is_mla(const struct k3_demo_dims *d, uint32_t l)
{
	uint32_t l1 = l + 1;
	return l1 % 4 == 0 || l1 + 1 >= d->layers;
}

static void expert_proj(struct dlist *l, uint32_t sh, uint32_t layer, uint32_t e, const char *w,
			uint64_t rows, uint64_t in, bool out_proj)
{
	float sd = (out_proj ? 0.5f : 1.0f) / sqrtf((float)in);
	struct tdesc *p = add(l, sh, K3_DTYPE_U8, G_MX_PACKED, 0.0f, sd, 2, rows, in / 2, 0,
			      "model.layers.%u.block_sparse_moe.experts.%u.%s.weight_packed", layer, e, w);
	add(l, sh, K3_DTYPE_U8, G_MX_SCALE, 0.0f, sd, 2, rows, in / 32, 0,
	    "model.layers.%u.block_sparse_moe.experts.%u.%s.weight_scale", layer, e, w);
	(void)p;
}

/* The release's vision tower and projector (k3d ignores them; their
 * names, shapes and shards are the release's, docs/plan.md "Sources"):
 * the projector in shard `sh`, the tower in the next. */
static void describe_vision(struct dlist *l, uint32_t sh)
{
	const char *pre = l->prefix;

	l->prefix = "";
	add(l, sh, BF, G_NORMAL, 0, 0, 1, 7168, 0, 0, "mm_projector.post_norm.weight");
	add(l, sh, BF, G_NORMAL, 0, 0, 2, 4096, 4096, 0, "mm_projector.proj.0.weight");
	add(l, sh, BF, G_NORMAL, 0, 0, 2, 7168, 4096, 0, "mm_projector.proj.2.weight");
	for (uint32_t b = 0; b < 27; b++) {
		add(l, sh + 1, BF, G_NORMAL, 0, 0, 2, 4096, 1024, 0, "vision_tower.encoder.blocks.%u.mlp.fc0.weight", b);
		add(l, sh + 1, BF, G_NORMAL, 0, 0, 2, 1024, 4096, 0, "vision_tower.encoder.blocks.%u.mlp.fc1.weight", b);
		add(l, sh + 1, BF, G_NORMAL, 0, 0, 1, 1024, 0, 0, "vision_tower.encoder.blocks.%u.norm0.weight", b);
		add(l, sh + 1, BF, G_NORMAL, 0, 0, 1, 1024, 0, 0, "vision_tower.encoder.blocks.%u.norm1.weight", b);
		add(l, sh + 1, BF, G_NORMAL, 0, 0, 2, 1024, 1536, 0, "vision_tower.encoder.blocks.%u.wo.weight", b);
		add(l, sh + 1, BF, G_NORMAL, 0, 0, 2, 4608, 1024, 0, "vision_tower.encoder.blocks.%u.wqkv.weight", b);
	}
	add(l, sh + 1, BF, G_NORMAL, 0, 0, 1, 1024, 0, 0, "vision_tower.encoder.final_layernorm.weight");
	add(l, sh + 1, BF, G_NORMAL, 0, 0, 3, 64, 64, 1024, "vision_tower.patch_embed.pos_emb.weight");
	struct tdesc *t = add(l, sh + 1, BF, G_NORMAL, 0, 0, 3, 1024, 3, 14,
			      "vision_tower.patch_embed.proj.weight");
	if (t) {   /* [1024, 3, 14, 14] */
		t->ndim = 4;
		t->shape[3] = 14;
		t->nbytes *= 14;
	}
	l->prefix = pre;
}

static void describe(struct dlist *l, const struct k3_demo_dims *d, uint32_t n_shards)
{
	uint64_t D = d->hidden, P = (uint64_t)d->kda_heads * d->kda_head_dim, dk = d->kda_head_dim;
	uint64_t H = d->mla_heads;
	uint32_t last = n_shards - 1;

	/* The release keeps the embedding with the head, after the layers. */
	uint32_t first = 0;
	if (d->release_layout)
		first = last = d->layers;
	add(l, first, BF, G_NORMAL, 0.0f, 1.0f, 2, d->vocab, D, 0, "model.embed_tokens.weight");
	add(l, last, BF, G_NORMAL, 0.0f, 1.0f / sqrtf((float)D), 2, d->vocab, D, 0, "lm_head.weight");
	add(l, last, BF, G_NORMAL, 1.0f, 0.05f, 1, D, 0, 0, "model.norm.weight");
	add(l, last, BF, G_NORMAL, 1.0f, 0.05f, 1, D, 0, 0, "model.output_attn_res_norm.weight");
	add(l, last, BF, G_NORMAL, 0.0f, 1.0f / sqrtf((float)D), 2, 1, D, 0,
	    "model.output_attn_res_proj.weight");
	for (uint32_t y = 0; y < d->layers; y++) {
		/* even split, the remainder to the first shards */
		uint32_t base = d->layers / n_shards, rem = d->layers % n_shards, sh = 0, acc = 0;
		for (sh = 0; sh < n_shards && !d->release_layout; sh++) {
			acc += base + (sh < rem);
			if (y < acc)
				break;
		}
		if (d->release_layout)   /* one layer per shard */
			sh = y;
		normw(l, sh, D, y, "input_layernorm.weight");
		normw(l, sh, D, y, "post_attention_layernorm.weight");
		normw(l, sh, D, y, "self_attention_res_norm.weight");
		normw(l, sh, D, y, "mlp_res_norm.weight");
		add(l, sh, BF, G_NORMAL, 0.0f, 1.0f / sqrtf((float)D), 2, 1, D, 0,
		    "model.layers.%u.self_attention_res_proj.weight", y);
		add(l, sh, BF, G_NORMAL, 0.0f, 1.0f / sqrtf((float)D), 2, 1, D, 0,
		    "model.layers.%u.mlp_res_proj.weight", y);
		if (!is_mla(d, y)) {
			mat(l, sh, false, P, D, y, "self_attn.q_proj.weight");
			mat(l, sh, false, P, D, y, "self_attn.k_proj.weight");
			mat(l, sh, false, P, D, y, "self_attn.v_proj.weight");
			mat(l, sh, false, P, D, y, "self_attn.g_proj.weight");
			mat(l, sh, false, dk, D, y, "self_attn.f_a_proj.weight");
			mat(l, sh, false, P, dk, y, "self_attn.f_b_proj.weight");
			mat(l, sh, false, d->kda_heads, D, y, "self_attn.b_proj.weight");
			mat(l, sh, true, D, P, y, "self_attn.o_proj.weight");
			static const char *conv[] = { "q", "k", "v" };
			for (int c = 0; c < 3; c++) {
				struct tdesc *t = add(l, sh, F32, G_CONV, 0.0f, 0.25f, 3, P, 1, 4,
						      "model.layers.%u.self_attn.%s_conv1d.weight", y, conv[c]);
				if (t)
					t->heads = 4;
			}
			/* stored like the release: [max(head_dim, heads)], heads live values then zeros */
			struct tdesc *a = add(l, sh, F32, G_ALOG, 0.0f, 0.0f, 1,
					      dk > d->kda_heads ? dk : d->kda_heads, 0, 0,
					      "model.layers.%u.self_attn.A_log", y);
			if (a)
				a->heads = d->kda_heads;
			add(l, sh, F32, G_NORMAL, -1.0f, 1.0f, 1, P, 0, 0, "model.layers.%u.self_attn.dt_bias", y);
			add(l, sh, F32, G_NORMAL, 1.0f, 0.05f, 1, dk, 0, 0, "model.layers.%u.self_attn.o_norm.weight", y);
		} else {
			uint64_t qh = (uint64_t)d->nope + d->rope;
			mat(l, sh, false, d->q_lora, D, y, "self_attn.q_a_proj.weight");
			normw(l, sh, d->q_lora, y, "self_attn.q_a_layernorm.weight");
			mat(l, sh, false, H * qh, d->q_lora, y, "self_attn.q_b_proj.weight");
			mat(l, sh, false, (uint64_t)d->kv_lora + d->rope, D, y, "self_attn.kv_a_proj_with_mqa.weight");
			normw(l, sh, d->kv_lora, y, "self_attn.kv_a_layernorm.weight");
			mat(l, sh, false, H * ((uint64_t)d->nope + d->v_head), d->kv_lora, y, "self_attn.kv_b_proj.weight");
			mat(l, sh, false, H * d->v_head, D, y, "self_attn.g_proj.weight");
			mat(l, sh, true, D, H * d->v_head, y, "self_attn.o_proj.weight");
		}
		if (y == 0) {
			mat(l, sh, false, d->intermediate, D, y, "mlp.gate_proj.weight");
			mat(l, sh, false, d->intermediate, D, y, "mlp.up_proj.weight");
			mat(l, sh, true, D, d->intermediate, y, "mlp.down_proj.weight");
			continue;
		}
		uint64_t sw = (uint64_t)d->moe_intermediate * d->shared_experts;
		mat(l, sh, false, d->experts, D, y, "block_sparse_moe.gate.weight");
		add(l, sh, F32, G_NORMAL, 0.0f, 0.02f, 1, d->experts, 0, 0,
		    "model.layers.%u.block_sparse_moe.gate.e_score_correction_bias", y);
		mat(l, sh, false, d->latent, D, y, "block_sparse_moe.routed_expert_down_proj.weight");
		normw(l, sh, d->latent, y, "block_sparse_moe.routed_expert_norm.weight");
		mat(l, sh, true, D, d->latent, y, "block_sparse_moe.routed_expert_up_proj.weight");
		mat(l, sh, false, sw, D, y, "block_sparse_moe.shared_experts.gate_proj.weight");
		mat(l, sh, false, sw, D, y, "block_sparse_moe.shared_experts.up_proj.weight");
		mat(l, sh, true, D, sw, y, "block_sparse_moe.shared_experts.down_proj.weight");
		for (uint32_t e = 0; e < d->experts; e++) {
			expert_proj(l, sh, y, e, "w1", d->moe_intermediate, d->latent, false);
			expert_proj(l, sh, y, e, "w2", d->latent, d->moe_intermediate, true);
			expert_proj(l, sh, y, e, "w3", d->moe_intermediate, d->latent, false);
		}
	}
	if (d->release_layout)
		describe_vision(l, d->layers + 1);
}

/* safetensors serializer order: larger dtype first, then name */
static int cmp_layout(const void *a, const void *b)
{
	const struct tdesc *x = *(const struct tdesc *const *)a, *y = *(const struct tdesc *const *)b;
	size_t sx = k3_dtype_size(x->dtype), sy = k3_dtype_size(y->dtype);

	if (sx != sy)
		return sx > sy ? -1 : 1;
	return strcmp(x->name, y->name);
}

/* ---- drawing ---- */

static int draw(const struct k3_demo_dims *d, uint64_t seed, struct tdesc *t, struct tdesc *scale,
		uint8_t *buf)
{
	struct rng r = rng_for(seed, t->name);
	uint64_t n = t->nbytes / k3_dtype_size(t->dtype);

	switch (t->gen) {
	case G_NORMAL:
		for (uint64_t i = 0; i < n; i++) {
			float v = t->mean + t->std * rng_normal(&r);
			if (t->dtype == K3_DTYPE_F32) {
				memcpy(buf + 4 * i, &v, 4);
			} else {
				uint16_t h = k3_f32_to_bf16(v);
				buf[2 * i] = (uint8_t)h;
				buf[2 * i + 1] = (uint8_t)(h >> 8);
			}
		}
		return 0;
	case G_CONV:
		for (uint64_t i = 0; i < n; i++) {
			float v = t->std * rng_normal(&r) + ((i % t->heads) == t->heads - 1 ? 0.5f : 0.0f);
			memcpy(buf + 4 * i, &v, 4);
		}
		return 0;
	case G_ALOG:
		for (uint64_t i = 0; i < n; i++) {
			/* A = exp(A_log) in [1, 16): log of a uniform draw, computed
			 * as a tabulated ln over 16 steps to stay libm-free */
			static const float ln_tab[16] = {
				0.0f, 0.693147182f, 1.09861231f, 1.38629436f, 1.60943794f, 1.79175949f,
				1.94591010f, 2.07944155f, 2.19722462f, 2.30258512f, 2.39789534f,
				2.48490667f, 2.56494927f, 2.63905740f, 2.70805025f, 2.77258873f,
			};
			float v = i < t->heads ? ln_tab[rng_next(&r) & 15] * 0.5f : 0.0f;
			memcpy(buf + 4 * i, &v, 4);
		}
		return 0;
	case G_MX_PACKED: {
		uint64_t rows = t->shape[0], cols = t->shape[1] * 2;
		uint8_t *sc = malloc(rows * cols / 32);
		if (!sc)
			return -ENOMEM;
		if (d->random_expert_codes) {
			/* bench: codes drawn directly (quantizing GBs of fp32
			 * would dominate generation time); the group scale is
			 * what an N(0, std) draw would get: amax ~ 2.5 std */
			int e;
			float m = frexpf(2.5f * t->std / 6.0f, &e);
			int s = (m == 0.5f ? e - 1 : e) + 127;
			for (uint64_t i = 0; i < t->nbytes; i += 8) {
				uint64_t v = rng_next(&r);
				for (int k = 0; k < 8 && i + (uint64_t)k < t->nbytes; k++)
					buf[i + (uint64_t)k] = (uint8_t)(v >> (8 * k));
			}
			for (uint64_t i = 0; i < rows * cols / 32; i++)
				sc[i] = (uint8_t)(s - (int)(rng_next(&r) & 1));
		} else {
			float *row = malloc(cols * sizeof(float));
			if (!row) {
				free(sc);
				return -ENOMEM;
			}
			for (uint64_t y = 0; y < rows; y++) {
				for (uint64_t c = 0; c < cols; c++)
					row[c] = t->std * rng_normal(&r);
				k3_mxfp4_encode_row(row, (size_t)cols, buf + y * cols / 2, sc + y * cols / 32);
			}
			free(row);
		}
		if (scale)
			scale->pending = sc;
		else
			free(sc);
		return 0;
	}
	case G_COPY:
		memcpy(buf, t->copy_from, t->nbytes);
		return 0;
	case G_MX_SCALE:
		if (!t->pending)
			return -EINVAL;   /* written before its packed twin: layout bug */
		memcpy(buf, t->pending, t->nbytes);
		free(t->pending);
		t->pending = NULL;
		return 0;
	}
	return -EINVAL;
}

/* Shard s of n_shards (file model-0000s-of-0000n.safetensors, or `single`
 * when set) with every tensor of l assigned to it. */
static int write_shard(const char *out, const struct k3_demo_dims *d, uint64_t seed,
		       struct dlist *l, uint32_t s, uint32_t n_shards, json_t *wmap,
		       const char *single, struct k3_err *err)
{
	char fname[64];
	struct tdesc **v = NULL;
	size_t m = 0;
	int r = 0;
	FILE *f = NULL;
	uint8_t *buf = NULL;
	char *hdr = NULL, *path = NULL;
	json_t *h = NULL;

	/* The release numbers its shards "model-00001-of-000096". */
	if (single)
		snprintf(fname, sizeof(fname), "%s", single);
	else
		snprintf(fname, sizeof(fname), d->release_layout ? "model-%05u-of-%06u.safetensors"
							 : "model-%05u-of-%05u.safetensors", s + 1, n_shards);
	v = malloc((l->n ? l->n : 1) * sizeof(*v));
	if (!v)
		return k3_err_set(err, -ENOMEM, "out of memory");
	uint64_t maxb = 0;
	for (size_t i = 0; i < l->n; i++)
		if (l->v[i].shard == s) {
			v[m++] = &l->v[i];
			if (l->v[i].nbytes > maxb)
				maxb = l->v[i].nbytes;
		}
	qsort(v, m, sizeof(*v), cmp_layout);
	h = json_object();
	if (!d->release_layout) {   /* the release's headers have no __metadata__ */
		json_t *md = json_object();
		json_object_set_new(md, "format", json_string("pt"));
		json_object_set_new(h, "__metadata__", md);
	}
	uint64_t off = 0;
	for (size_t i = 0; i < m; i++) {
		json_t *e = json_object(), *sh = json_array();
		v[i]->offset = off;
		for (uint32_t k = 0; k < v[i]->ndim; k++)
			json_array_append_new(sh, json_integer((json_int_t)v[i]->shape[k]));
		json_object_set_new(e, "dtype", json_string(k3_dtype_name(v[i]->dtype)));
		json_object_set_new(e, "shape", sh);
		json_object_set_new(e, "data_offsets",
				    json_pack("[II]", (json_int_t)off, (json_int_t)(off + v[i]->nbytes)));
		json_object_set_new(h, v[i]->name, e);
		json_object_set_new(wmap, v[i]->name, json_string(fname));
		off += v[i]->nbytes;
	}
	hdr = json_dumps(h, JSON_COMPACT);
	path = k3_path_join(out, fname);
	buf = d->sparse ? NULL : malloc(maxb ? maxb : 1);
	if (!hdr || !path || (!buf && !d->sparse)) {
		r = k3_err_set(err, -ENOMEM, "out of memory");
		goto done;
	}
	f = fopen(path, "wb");
	if (!f) {
		r = k3_err_set(err, -errno, "%s: %s", path, strerror(errno));
		goto done;
	}
	size_t hl = strlen(hdr), pad = (8 - hl % 8) % 8;
	uint64_t n = hl + pad;
	uint8_t pre[8];
	for (int i = 0; i < 8; i++)
		pre[i] = (uint8_t)(n >> (8 * i));
	if (fwrite(pre, 1, 8, f) != 8 || fwrite(hdr, 1, hl, f) != hl ||
	    fwrite("        ", 1, pad, f) != pad) {
		r = k3_err_set(err, -EIO, "%s: write failed", path);
		goto done;
	}
	/* Sparse: the data section is one hole the size of the payloads. */
	if (d->sparse && (fflush(f) != 0 || ftruncate(fileno(f), (off_t)(8 + n + off)) != 0)) {
		r = k3_err_set(err, -errno, "%s: cannot extend to %llu bytes: %s", path,
			       (unsigned long long)(8 + n + off), strerror(errno));
		goto done;
	}
	for (size_t i = 0; i < m && !d->sparse; i++) {
		struct tdesc *scale = NULL;
		if (v[i]->gen == G_MX_PACKED) {
			/* its scale twin sorts right after it (".weight_packed" < ".weight_scale") */
			for (size_t j = i + 1; j < m && !scale; j++)
				if (v[j]->gen == G_MX_SCALE &&
				    strncmp(v[j]->name, v[i]->name, strlen(v[i]->name) - 6) == 0)
					scale = v[j];
		}
		r = draw(d, seed, v[i], scale, buf);
		if (r) {
			r = k3_err_set(err, r, "drawing '%s' failed", v[i]->name);
			goto done;
		}
		if (fwrite(buf, 1, (size_t)v[i]->nbytes, f) != v[i]->nbytes) {
			r = k3_err_set(err, -EIO, "%s: write failed", path);
			goto done;
		}
	}
	if (fclose(f) != 0) {
		f = NULL;
		r = k3_err_set(err, -EIO, "%s: write failed", path);
		goto done;
	}
	f = NULL;
done:
	if (f)
		fclose(f);
	free(buf);
	free(path);
	free(hdr);
	json_decref(h);
	free(v);
	return r;
}

/* Writes c (consumed) as out/config.json, keys sorted, 2-space indent. */
static int dump_config(const char *out, json_t *c, struct k3_err *err)
{
	char *p = k3_path_join(out, "config.json");
	int r = 0;
	if (!p || json_dump_file(c, p, JSON_INDENT(2) | JSON_SORT_KEYS) != 0)
		r = k3_err_set(err, -EIO, "%s/config.json: write failed", out);
	free(p);
	json_decref(c);
	return r;
}

static int write_config(const char *out, const struct k3_demo_dims *d, uint64_t seed, struct k3_err *err)
{
	uint32_t ranks = d->vocab - 256;
	json_t *kda = json_array(), *full = json_array();

	for (uint32_t y = 0; y < d->layers; y++)
		json_array_append_new(is_mla(d, y) ? full : kda, json_integer(y + 1));
	json_t *quant = json_pack(
		"{s:{s:{s:s,s:n,s:n,s:[s],s:{s:n,s:n,s:b,s:i,s:i,s:s,s:{},s:s,s:s,s:b,s:s,s:n}}},"
		"s:s,s:n,s:[ssssss],s:n,s:s,s:s}",
		"config_groups", "group_0", "format", "mxfp4-pack-quantized", "input_activations",
		"output_activations", "targets", "Linear", "weights", "actorder", "block_structure",
		"dynamic", 0, "group_size", 32, "num_bits", 4, "observer", "minmax", "observer_kwargs",
		"scale_dtype", "torch.uint8", "strategy", "group", "symmetric", 1, "type", "float",
		"zp_dtype",
		"format", "mxfp4-pack-quantized", "global_compression_ratio", "ignore",
		"re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
		"re:.*lm_head.*", "re:.*vision_tower.*", "re:.*mm_projector.*", "kv_cache_scheme",
		"quant_method", "compressed-tensors", "quantization_status", "compressed");
	json_t *lac = json_pack("{s:o,s:f,s:i,s:o,s:i,s:i,s:b}", "full_attn_layers", full,
				"gate_lower_bound", -5.0, "head_dim", (int)d->kda_head_dim, "kda_layers", kda,
				"num_heads", (int)d->kda_heads, "short_conv_kernel_size", 4,
				"use_full_rank_gate", 1);
	json_t *t = json_object();
	json_object_set_new(t, "activation_situ_beta", json_real(4.0));
	json_object_set_new(t, "activation_situ_linear_beta", json_real(25.0));
	json_object_set_new(t, "architectures", json_pack("[s]", "KimiLinearForCausalLM"));
	json_object_set_new(t, "attn_res_block_size", json_integer(d->attn_res_block));
	json_object_set_new(t, "bos_token_id", json_integer(ranks + 0));
	json_object_set_new(t, "dtype", json_string("bfloat16"));
	json_object_set_new(t, "eos_token_id", json_integer(ranks + 2));
	json_object_set_new(t, "first_k_dense_replace", json_integer(1));
	json_object_set_new(t, "hidden_act", json_string("situ"));
	json_object_set_new(t, "hidden_size", json_integer(d->hidden));
	json_object_set_new(t, "initializer_range", json_real(0.02));
	json_object_set_new(t, "intermediate_size", json_integer(d->intermediate));
	json_object_set_new(t, "kv_lora_rank", json_integer(d->kv_lora));
	json_object_set_new(t, "latent_moe_use_norm", json_true());
	json_object_set_new(t, "linear_attn_config", lac);
	json_object_set_new(t, "max_position_embeddings", json_integer(1048576));
	json_object_set_new(t, "mla_use_nope", json_true());
	json_object_set_new(t, "mla_use_output_gate", json_true());
	json_object_set_new(t, "model_type", json_string("kimi_linear"));
	json_object_set_new(t, "moe_intermediate_size", json_integer(d->moe_intermediate));
	json_object_set_new(t, "moe_layer_freq", json_integer(1));
	json_object_set_new(t, "moe_renormalize", json_true());
	json_object_set_new(t, "moe_router_activation_func", json_string("sigmoid"));
	json_object_set_new(t, "num_attention_heads", json_integer(d->mla_heads));
	json_object_set_new(t, "num_expert_group", json_integer(1));
	json_object_set_new(t, "num_experts", json_integer(d->experts));
	json_object_set_new(t, "num_experts_per_token", json_integer(d->top_k));
	json_object_set_new(t, "num_hidden_layers", json_integer(d->layers));
	json_object_set_new(t, "num_key_value_heads", json_integer(d->mla_heads));
	json_object_set_new(t, "num_nextn_predict_layers", json_integer(0));
	json_object_set_new(t, "num_shared_experts", json_integer(d->shared_experts));
	json_object_set_new(t, "pad_token_id", json_integer(ranks + 255));
	json_object_set_new(t, "q_lora_rank", json_integer(d->q_lora));
	json_object_set_new(t, "qk_nope_head_dim", json_integer(d->nope));
	json_object_set_new(t, "qk_rope_head_dim", json_integer(d->rope));
	json_object_set_new(t, "quantization_config", quant);
	json_object_set_new(t, "rms_norm_eps", json_real(1e-5));
	json_object_set_new(t, "rope_theta", json_real(10000.0));
	json_object_set_new(t, "routed_expert_hidden_size", json_integer(d->latent));
	json_object_set_new(t, "routed_scaling_factor", json_real(1.0));
	json_object_set_new(t, "tie_word_embeddings", json_false());
	json_object_set_new(t, "topk_group", json_integer(1));
	json_object_set_new(t, "topk_method", json_string("noaux_tc"));
	json_object_set_new(t, "use_cache", json_true());
	json_object_set_new(t, "use_grouped_topk", json_true());
	json_object_set_new(t, "v_head_dim", json_integer(d->v_head));
	json_object_set_new(t, "vocab_size", json_integer(d->vocab));

	json_t *c = json_object();
	json_object_set_new(c, "architectures", json_pack("[s]", "KimiK3ForConditionalGeneration"));
	json_object_set_new(c, "bos_token_id", json_integer(ranks + 0));
	json_object_set_new(c, "dtype", json_string("bfloat16"));
	json_object_set_new(c, "eos_token_id", json_integer(ranks + 2));
	json_object_set_new(c, "media_placeholder_token_id", json_integer(ranks + 21));
	json_object_set_new(c, "model_type", json_string("kimi_k3"));
	json_object_set_new(c, "pad_token_id", json_integer(ranks + 255));
	json_object_set_new(c, "text_config", t);
	json_object_set_new(c, "tie_word_embeddings", json_false());
	json_object_set_new(c, "k3_demo_model", json_pack("{s:s,s:I,s:s}", "generator", "k3ctl demo-model",
							   "seed", (json_int_t)seed, "note", d->sparse ?
							   K3_DEMO_SPARSE_NOTE :
							   "synthetic weights; no vision tower weights are stored"));
	return dump_config(out, c, err);
}

int k3_demo_write(const char *out, const struct k3_demo_opts *o, struct k3_err *err)
{
	struct k3_demo_dims d;
	struct dlist l = { .prefix = "language_model." };
	json_t *wmap = NULL, *ix = NULL;
	char *p = NULL;
	int r;

	r = k3_demo_resolve(o, &d, err);
	if (r)
		return r;
	if (mkdir(out, 0755) != 0 && errno != EEXIST)
		return k3_err_set(err, -errno, "%s: %s", out, strerror(errno));
	/* describe once with 2 shards to size the model, then decide (the
	 * release: a shard per layer, one for the embedding and head, two for
	 * the vision tower and projector) */
	uint32_t n_shards = d.release_layout ? d.layers + 3 : d.shards ? d.shards : 2;
	describe(&l, &d, n_shards);
	if (l.err) {
		r = k3_err_set(err, l.err, "out of memory");
		goto out;
	}
	if (!d.shards && !d.release_layout) {
		uint64_t total = 0;
		for (size_t i = 0; i < l.n; i++)
			total += l.v[i].nbytes;
		uint64_t want = (total + (2ull << 30) - 1) / (2ull << 30);   /* <= 2 GiB per shard */
		if (want > 2) {
			n_shards = (uint32_t)(want < d.layers ? want : d.layers);
			if (n_shards < 2)
				n_shards = 2;
			l.n = 0;
			describe(&l, &d, n_shards);
			if (l.err) {
				r = k3_err_set(err, l.err, "out of memory");
				goto out;
			}
		}
	}
	wmap = json_object();
	uint64_t total = 0;
	for (size_t i = 0; i < l.n; i++)
		total += l.v[i].nbytes;
	for (uint32_t s = 0; s < n_shards; s++) {
		r = write_shard(out, &d, o->seed, &l, s, n_shards, wmap, NULL, err);
		if (r)
			goto out;
	}
	ix = json_pack("{s:{s:I},s:O}", "metadata", "total_size", (json_int_t)total, "weight_map", wmap);
	p = k3_path_join(out, "model.safetensors.index.json");
	if (!ix || !p || json_dump_file(ix, p, JSON_INDENT(2) | JSON_SORT_KEYS) != 0) {
		r = k3_err_set(err, -EIO, "%s/model.safetensors.index.json: write failed", out);
		goto out;
	}
	r = write_config(out, &d, o->seed, err);
	if (!r)
		/* k3-sparse: no tokenizer. A synthetic rank file of the release's
		 * size is refused by the tokenizer loader, which knows the real
		 * one's SHA-256; copy the release's tiktoken.model and
		 * tokenizer_config.json in to serve text (docs/plan.md). */
		r = d.release_layout ? 0 : k3_demo_write_tokenizer(out, d.vocab, err);
out:
	for (size_t i = 0; i < l.n; i++)
		free(l.v[i].pending);
	free(l.v);
	free(p);
	json_decref(ix);
	json_decref(wmap);
	return r;
}

/* ---- a DSpark draft for a demo target ---- */

/* Taps spread over the target: layer floor((2i + 1) L / (2n)), i < n
 * (K3's real draft taps 2, 23, 47, 71, 89 of 93). */
static uint32_t draft_taps(uint32_t L, uint32_t *taps)
{
	uint32_t n = L < K3_DEMO_DRAFT_TAPS ? L : K3_DEMO_DRAFT_TAPS;
	for (uint32_t i = 0; i < n; i++)
		taps[i] = (uint32_t)(((uint64_t)2 * i + 1) * L / (2 * n));
	return n;
}

static void describe_draft(struct dlist *l, const struct k3_model *target,
			   const struct k3_demo_draft_dims *g, uint32_t n_taps)
{
	const struct k3_model_config *t = k3_model_config(target);
	const struct k3_tensor *emb = k3_model_plan(target)->embed_tokens;
	uint64_t D = t->hidden_size, H = g->heads, V = t->vocab_size;
	float one_in = 1.0f / sqrtf((float)D);

	/* the release ships a byte copy of K3's embedding (never read) */
	struct tdesc *e = add(l, 0, emb->dtype, G_COPY, 0.0f, 0.0f, 2, V, D, 0, "embed_tokens.weight");
	if (e)
		e->copy_from = emb->data;
	add(l, 0, BF, G_NORMAL, 0.0f, 1.0f / sqrtf((float)(D * n_taps)), 2, D, D * n_taps, 0,
	    "context_proj.weight");
	add(l, 0, BF, G_NORMAL, 1.0f, 0.05f, 1, D, 0, 0, "context_norm.weight");
	add(l, 0, BF, G_NORMAL, 1.0f, 0.05f, 1, D, 0, 0, "final_norm.weight");
	add(l, 0, BF, G_NORMAL, 0.0f, 1.0f, 2, V, g->markov_rank, 0, "markov_head.markov_w1.weight");
	add(l, 0, BF, G_NORMAL, 0.0f, 0.1f / sqrtf((float)g->markov_rank), 2, V, g->markov_rank, 0,
	    "markov_head.markov_w2.weight");
	add(l, 0, BF, G_NORMAL, 0.0f, one_in, 2, 1, D + g->markov_rank, 0, "confidence_head.proj.weight");
	add(l, 0, BF, G_NORMAL, 0.0f, 0.02f, 1, 1, 0, 0, "confidence_head.proj.bias");
	for (uint32_t y = 0; y < g->layers; y++) {
		uint64_t qh = (uint64_t)g->nope + g->rope;
#define N(suffix, ...) add(l, 0, BF, G_NORMAL, __VA_ARGS__, "layers.%u." suffix, y)
		N("input_layernorm.weight", 1.0f, 0.05f, 1, D, 0, 0);
		N("post_attention_layernorm.weight", 1.0f, 0.05f, 1, D, 0, 0);
		N("self_attn.q_a_proj.weight", 0.0f, one_in, 2, g->q_lora, D, 0);
		N("self_attn.q_a_layernorm.weight", 1.0f, 0.05f, 1, g->q_lora, 0, 0);
		N("self_attn.q_b_proj.weight", 0.0f, 1.0f / sqrtf((float)g->q_lora), 2, H * qh, g->q_lora, 0);
		N("self_attn.kv_a_proj_with_mqa.weight", 0.0f, one_in, 2, (uint64_t)g->kv_lora + g->rope, D, 0);
		N("self_attn.kv_a_layernorm.weight", 1.0f, 0.05f, 1, g->kv_lora, 0, 0);
		N("self_attn.kv_b_proj.weight", 0.0f, 1.0f / sqrtf((float)g->kv_lora), 2,
		  H * ((uint64_t)g->nope + g->v_head), g->kv_lora, 0);
		/* strong enough that the context rows visibly steer a proposal */
		N("self_attn.o_proj.weight", 0.0f, 2.0f / sqrtf((float)(H * g->v_head)), 2, D,
		  H * g->v_head, 0);
		N("mlp.gate_proj.weight", 0.0f, one_in, 2, g->inter, D, 0);
		N("mlp.up_proj.weight", 0.0f, one_in, 2, g->inter, D, 0);
		N("mlp.down_proj.weight", 0.0f, 0.5f / sqrtf((float)g->inter), 2, D, g->inter, 0);
#undef N
	}
}

static int write_draft_config(const char *out, const struct k3_model_config *t,
			      const struct k3_demo_draft_dims *g, const uint32_t *taps, uint32_t n_taps,
			      uint64_t seed, struct k3_err *err)
{
	uint32_t ranks = t->vocab_size - 256;
	json_t *ids = json_array();
	for (uint32_t i = 0; i < n_taps; i++)
		json_array_append_new(ids, json_integer(taps[i]));
	json_t *c = json_object();
	json_object_set_new(c, "architectures", json_pack("[s]", "K3DSparkModel"));
	json_object_set_new(c, "model_type", json_string("k3_dspark"));
	json_object_set_new(c, "hidden_size", json_integer(t->hidden_size));
	json_object_set_new(c, "intermediate_size", json_integer(g->inter));
	json_object_set_new(c, "num_hidden_layers", json_integer(g->layers));
	json_object_set_new(c, "num_attention_heads", json_integer(g->heads));
	json_object_set_new(c, "num_key_value_heads", json_integer(g->heads));
	json_object_set_new(c, "q_lora_rank", json_integer(g->q_lora));
	json_object_set_new(c, "kv_lora_rank", json_integer(g->kv_lora));
	json_object_set_new(c, "qk_nope_head_dim", json_integer(g->nope));
	json_object_set_new(c, "qk_rope_head_dim", json_integer(g->rope));
	json_object_set_new(c, "v_head_dim", json_integer(g->v_head));
	json_object_set_new(c, "mla_use_nope", json_false());
	json_object_set_new(c, "mla_use_output_gate", json_false());
	json_object_set_new(c, "vocab_size", json_integer(t->vocab_size));
	json_object_set_new(c, "draft_vocab_size", json_integer(t->vocab_size));
	json_object_set_new(c, "rms_norm_eps", json_real(1e-5));
	json_object_set_new(c, "max_position_embeddings", json_integer(1048576));
	json_object_set_new(c, "rope_theta", json_real(50000.0));
	json_object_set_new(c, "rope_parameters",
			    json_pack("{s:s,s:f,s:i,s:f,s:f,s:f,s:f}", "rope_type", "yarn", "factor", 32.0,
				      "original_max_position_embeddings", 32768, "beta_fast", 32.0,
				      "beta_slow", 1.0, "mscale", 1.0, "mscale_all_dim", 1.0));
	json_object_set_new(c, "num_target_layers", json_integer(n_taps));
	json_object_set_new(c, "target_hidden_size", json_integer(t->hidden_size));
	json_object_set_new(c, "target_num_hidden_layers", json_integer(t->num_hidden_layers));
	json_object_set_new(c, "target_layer_ids", ids);
	json_object_set_new(c, "mask_token_id", json_integer(ranks + 253));
	json_object_set_new(c, "bos_token_id", json_integer(ranks + 0));
	json_object_set_new(c, "eos_token_id", json_integer(ranks + 2));
	json_object_set_new(c, "pad_token_id", json_integer(ranks + 255));
	json_object_set_new(c, "markov_rank", json_integer(g->markov_rank));
	json_object_set_new(c, "markov_head_type", json_string("vanilla"));
	json_object_set_new(c, "enable_confidence_head", json_true());
	json_object_set_new(c, "confidence_head_with_markov", json_true());
	json_object_set_new(c, "tie_word_embeddings", json_false());
	json_object_set_new(c, "torch_dtype", json_string("bfloat16"));
	json_object_set_new(c, "k3_demo_model", json_pack("{s:s,s:I,s:s}", "generator",
							   "k3ctl demo-model --draft", "seed", (json_int_t)seed,
							   "note", "synthetic DSpark-format draft; random weights"));
	return dump_config(out, c, err);
}

void k3_demo_draft_dims(const struct k3_model *target, struct k3_demo_draft_dims *g)
{
	(void)target;
	*g = (struct k3_demo_draft_dims){ .layers = 2, .heads = 4, .q_lora = 64, .kv_lora = 32,
		.nope = 16, .rope = 16, .v_head = 16, .inter = 256, .markov_rank = 16 };
}

int k3_demo_write_draft(const char *out, const struct k3_model *target, uint64_t seed,
			struct k3_err *err)
{
	const struct k3_model_config *t = k3_model_config(target);
	const struct k3_tensor *emb = k3_model_plan(target)->embed_tokens;
	struct k3_demo_dims none = { 0 };
	struct k3_demo_draft_dims g;
	struct dlist l = { .prefix = "" };
	uint32_t taps[K3_DEMO_DRAFT_TAPS];
	int r = 0;

	if (!emb || emb->ndim != 2 || t->vocab_size < 512)
		return k3_err_set(err, -EINVAL, "the target has no [vocab, hidden] embedding of >= 512 rows");
	k3_demo_draft_dims(target, &g);
	uint32_t n_taps = draft_taps(t->num_hidden_layers, taps);
	if (mkdir(out, 0755) != 0 && errno != EEXIST)
		return k3_err_set(err, -errno, "%s: %s", out, strerror(errno));
	describe_draft(&l, target, &g, n_taps);
	if (l.err)
		r = k3_err_set(err, l.err, "out of memory");
	json_t *wmap = json_object();
	if (!r)
		r = write_shard(out, &none, seed, &l, 0, 1, wmap, "model.safetensors", err);
	if (!r)
		r = write_draft_config(out, t, &g, taps, n_taps, seed, err);
	json_decref(wmap);
	free(l.v);
	return r;
}

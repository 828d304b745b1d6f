/*
 * model_int8.c - the int8 spine overlay on the model side (model.h, "the
 * int8 spine overlay"; docs/formats.md): which matrices an overlay
 * converts, its tensor names, and attaching one to an opened model, i.e.
 * pointing the plan's matrix roles at checked I8 views of its mapped
 * shards.
 *
 * Attaching trusts nothing in the overlay: every I8 tensor must replace a
 * BF16 matrix of this model with the same shape, its scales must lie where
 * the provider ABI expects them (K3_MODEL_I8_SCALE_OFFSET after q, same
 * shard), and every matrix of the selected classes must be there; an
 * overlay tensor that matches no matrix means it was made for another
 * model. Each message ends with the command that rewrites the overlay.
 * Whether the overlay is stale (its source files changed since) is the
 * store's check (store_int8.h): it needs the files' identities.
 */
#include "model/model_internal.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "base/file.h"
#include "k3_kernels.h"

static const char *const role_names[] = { "kda", "mla", "mlp", "latent", "router", "lm_head" };

const char *k3_model_int8_role_name(unsigned role)
{
	for (unsigned i = 0; i < sizeof(role_names) / sizeof(role_names[0]); i++)
		if (role == 1u << i)
			return role_names[i];
	return NULL;
}

int k3_model_int8_roles_parse(const char *s, unsigned *out, struct k3_err *err)
{
	unsigned bits = 0;
	const char *p = s;

	if (!strcmp(s, "all") || !strcmp(s, "default") || !strcmp(s, "none")) {
		*out = !strcmp(s, "all") ? K3_MODEL_INT8_ALL :
		       !strcmp(s, "none") ? 0 : K3_MODEL_INT8_DEFAULT;
		return 0;
	}
	while (*p) {
		size_t n = strcspn(p, ",");
		unsigned bit = 0;
		for (unsigned i = 0; i < sizeof(role_names) / sizeof(role_names[0]); i++)
			if (strlen(role_names[i]) == n && strncmp(p, role_names[i], n) == 0)
				bit = 1u << i;
		if (!bit)
			return k3_err_set(err, -EINVAL, "'%.*s' is not a matrix class (kda, mla, mlp,"
					  " latent, router, lm_head; or all, default, none)", (int)n, p);
		bits |= bit;
		p += n;
		if (*p == ',' && *++p == '\0')
			return k3_err_set(err, -EINVAL, "'%s' ends with a comma", s);
	}
	if (!bits)
		return k3_err_set(err, -EINVAL, "no matrix class in '%s'", s);
	*out = bits;
	return 0;
}

int k3_model_int8_name(const char *name, const char *suffix, char *buf, size_t size)
{
	size_t n = strlen(name);
	static const char w[] = ".weight";

	if (n < sizeof(w) - 1 || strcmp(name + n - (sizeof(w) - 1), w) != 0)
		return -EINVAL;
	int k = snprintf(buf, size, "%.*s%s", (int)(n - (sizeof(w) - 1)), name, suffix);
	return k < 0 || (size_t)k >= size ? -EINVAL : 0;
}

/* ---- the matrix roles of a plan ---- */

/* Visits every convertible matrix role of the plan: its slot (the plan's
 * pointer, which attach redirects) and class. A NULL slot value (a role
 * the config switches off) is skipped by the callers. */
typedef void (*slot_fn)(void *ctx, const struct k3_tensor **slot, unsigned role);

static void visit_mlp(struct k3_mlp_plan *p, slot_fn fn, void *ctx)
{
	fn(ctx, &p->gate_proj, K3_MODEL_INT8_MLP);
	fn(ctx, &p->up_proj, K3_MODEL_INT8_MLP);
	fn(ctx, &p->down_proj, K3_MODEL_INT8_MLP);
}

static void visit_slots(struct k3_model *m, slot_fn fn, void *ctx)
{
	for (uint32_t l = 0; l < m->plan.n_layers; l++) {
		struct k3_layer_plan *y = &m->layers[l];
		if (y->is_kda) {
			struct k3_kda_plan *k = &y->kda;
			const struct k3_tensor **kda[] = { &k->q_proj, &k->k_proj, &k->v_proj,
				&k->f_a_proj, &k->f_b_proj, &k->b_proj, &k->g_proj, &k->g_a_proj,
				&k->g_b_proj, &k->o_proj };
			for (size_t i = 0; i < sizeof(kda) / sizeof(kda[0]); i++)
				fn(ctx, kda[i], K3_MODEL_INT8_KDA);
		} else {
			/* kv_b_proj stays BF16: its WUK half is used transposed
			 * (spec §6.5), not as the operand of a row-wise product */
			struct k3_mla_plan *a = &y->mla;
			const struct k3_tensor **mla[] = { &a->q_proj, &a->q_a_proj, &a->q_b_proj,
				&a->kv_a_proj_with_mqa, &a->g_proj, &a->o_proj };
			for (size_t i = 0; i < sizeof(mla) / sizeof(mla[0]); i++)
				fn(ctx, mla[i], K3_MODEL_INT8_MLA);
		}
		if (y->is_moe) {
			fn(ctx, &y->moe.gate, K3_MODEL_INT8_ROUTER);
			fn(ctx, &y->moe.routed_expert_down_proj, K3_MODEL_INT8_LATENT);
			fn(ctx, &y->moe.routed_expert_up_proj, K3_MODEL_INT8_LATENT);
			visit_mlp(&y->moe.shared_experts, fn, ctx);
		} else {
			visit_mlp(&y->mlp, fn, ctx);
		}
	}
	/* a tied lm_head is the embedding, which is never converted */
	if (m->plan.lm_head != m->plan.embed_tokens)
		fn(ctx, &m->plan.lm_head, K3_MODEL_INT8_LM_HEAD);
}

struct list_ctx {
	struct k3_model_int8_matrix *out;
	size_t cap, n;
};

static void list_one(void *vctx, const struct k3_tensor **slot, unsigned role)
{
	struct list_ctx *c = vctx;
	if (!*slot)
		return;
	if (c->n < c->cap)
		c->out[c->n] = (struct k3_model_int8_matrix){ .role = role, .tensor = *slot };
	c->n++;
}

size_t k3_model_int8_matrices(const struct k3_model *m, struct k3_model_int8_matrix *out,
			      size_t cap)
{
	struct list_ctx c = { out, cap, 0 };
	/* visit_slots only reads through the slots here */
	visit_slots((struct k3_model *)m, list_one, &c);
	return c.n;
}

/* ---- attaching ---- */

/* One overlay tensor, for lookup by name. */
struct ov_entry {
	const char *name;
	const struct k3_st_entry *e;
	uint32_t shard;              /* index into m->int8.shards */
	bool used;
};

struct attach_ctx {
	struct k3_model *m;
	unsigned roles;
	struct ov_entry *ents;
	size_t n_ents;
	size_t problems;
	char first[K3_ERR_MSG_MAX / 2];
	bool nomem;
};

static int cmp_ent(const void *a, const void *b)
{
	return strcmp(((const struct ov_entry *)a)->name, ((const struct ov_entry *)b)->name);
}

static struct ov_entry *find(struct attach_ctx *c, const char *name)
{
	struct ov_entry key = { .name = name };
	return bsearch(&key, c->ents, c->n_ents, sizeof(key), cmp_ent);
}

static void problem(struct attach_ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void problem(struct attach_ctx *c, const char *fmt, ...)
{
	if (c->problems++ == 0) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(c->first, sizeof(c->first), fmt, ap);
		va_end(ap);
	}
}

static uint64_t abs_offset(const struct k3_model *m, const struct ov_entry *x)
{
	return m->int8.shards[x->shard].data_start + x->e->begin;
}

/* Marks the zero pad `name` + suffix used, when the overlay has one. */
static void use_pad(struct attach_ctx *c, const char *name, const char *suffix)
{
	char pn[K3_TENSOR_NAME_MAX + 32];
	if (k3_model_int8_name(name, suffix, pn, sizeof(pn)) == 0) {
		struct ov_entry *p = find(c, pn);
		if (p)
			p->used = true;
	}
}

static void attach_one(void *vctx, const struct k3_tensor **slot, unsigned role)
{
	struct attach_ctx *c = vctx;
	struct k3_model *m = c->m;
	const struct k3_tensor *t = *slot;
	char qn[K3_TENSOR_NAME_MAX + 32], sn[K3_TENSOR_NAME_MAX + 32];

	if (!t)
		return;
	if (k3_model_int8_name(t->name, ".weight_i8", qn, sizeof(qn)) ||
	    k3_model_int8_name(t->name, ".weight_row_scale", sn, sizeof(sn))) {
		problem(c, "matrix '%s' has no int8 name", t->name);
		return;
	}
	struct ov_entry *q = find(c, qn), *s = find(c, sn);
	if (q)
		q->used = true;
	if (s)
		s->used = true;
	use_pad(c, t->name, ".weight_i8_pad");
	use_pad(c, t->name, ".weight_row_scale_pad");
	if (!(c->roles & role))
		return;                   /* this class stays BF16 */
	if (!q || !s) {
		problem(c, "it has no '%s' for the %s matrix '%s'", q ? sn : qn,
			k3_model_int8_role_name(role), t->name);
		return;
	}
	uint64_t rows = t->shape[0], cols = t->ndim == 2 ? t->shape[1] : 0;
	if (t->dtype != K3_DTYPE_BF16 || t->ndim != 2) {
		problem(c, "'%s' is not a BF16 matrix in this model", t->name);
		return;
	}
	if (q->e->dtype != K3_DTYPE_I8 || q->e->ndim != 2 || q->e->shape[0] != rows ||
	    q->e->shape[1] != cols) {
		problem(c, "'%s' is not I8 [%llu, %llu] like '%s'", qn, (unsigned long long)rows,
			(unsigned long long)cols, t->name);
		return;
	}
	if (s->e->dtype != K3_DTYPE_F32 || s->e->ndim != 1 || s->e->shape[0] != rows) {
		problem(c, "'%s' is not F32 [%llu]", sn, (unsigned long long)rows);
		return;
	}
	uint64_t qoff = abs_offset(m, q), soff = abs_offset(m, s);
	if (s->shard != q->shard || qoff % 4 || soff != qoff + K3_MODEL_I8_SCALE_OFFSET(rows, cols)) {
		problem(c, "'%s' does not start %llu bytes after '%s' in the same shard", sn,
			(unsigned long long)K3_MODEL_I8_SCALE_OFFSET(rows, cols), qn);
		return;
	}
	struct k3_tensor *v = &m->int8.views[m->int8.n_views++];
	const struct k3_shard *sh = &m->int8.shards[q->shard];
	*v = (struct k3_tensor){
		.name = q->e->name, .dtype = K3_DTYPE_I8, .ndim = 2,
		.shape = { rows, cols }, .nelem = rows * cols,
		.nbytes = K3_MODEL_I8_BYTES(rows, cols),
		.data = sh->map + qoff, .shard = m->n_shards + q->shard, .file_offset = qoff,
	};
	m->int8.int8_bytes += v->nbytes;
	m->int8.bf16_bytes += t->nbytes;
	*slot = v;
}

static int index_shards(const char *dir, struct k3_st_index *ix, struct k3_err *err)
{
	char p[PATH_MAX];
	char *text = NULL;
	size_t len = 0;

	if (snprintf(p, sizeof(p), "%s/model.safetensors.index.json", dir) >= (int)sizeof(p))
		return k3_err_set(err, -ENAMETOOLONG, "overlay path too long");
	int r = k3_file_read(p, K3_MODEL_INDEX_MAX, 0, &text, &len, err);
	if (!r)
		r = k3_st_parse_index(text, len, ix, err);
	free(text);
	return r;
}

/* The overlay's tensors of every shard, sorted by name (duplicates refused). */
static int collect(struct k3_model *m, struct attach_ctx *c, struct k3_err *err)
{
	size_t total = 0;

	for (uint32_t s = 0; s < m->int8.n_shards; s++)
		total += m->int8.shards[s].hdr.n;
	if (total > K3_MODEL_MAX_TENSORS)
		return k3_err_set(err, -EINVAL, "%zu tensors exceed the limit of %u", total,
				  K3_MODEL_MAX_TENSORS);
	c->ents = calloc(total ? total : 1, sizeof(*c->ents));
	if (!c->ents)
		return k3_err_set(err, -ENOMEM, "out of memory");
	for (uint32_t s = 0; s < m->int8.n_shards; s++)
		for (size_t i = 0; i < m->int8.shards[s].hdr.n; i++) {
			const struct k3_st_entry *e = &m->int8.shards[s].hdr.v[i];
			c->ents[c->n_ents++] = (struct ov_entry){ .name = e->name, .e = e, .shard = s };
		}
	qsort(c->ents, c->n_ents, sizeof(*c->ents), cmp_ent);
	for (size_t i = 1; i < c->n_ents; i++)
		if (strcmp(c->ents[i - 1].name, c->ents[i].name) == 0)
			return k3_err_set(err, -EINVAL, "tensor '%s' is stored twice", c->ents[i].name);
	return 0;
}

int k3_model_int8_attach(struct k3_model *m, const struct k3_model_open_opts *opts,
			 struct k3_err *err)
{
	struct k3_st_index ix = { 0 };
	struct attach_ctx c = { .m = m, .roles = opts->int8_roles ? opts->int8_roles
							       : K3_MODEL_INT8_DEFAULT };
	char real[PATH_MAX];
	int r;

	if (!realpath(opts->int8_dir, real)) {
		if (errno == ENOENT)
			return k3_err_set(err, -ENOENT, "no int8 spine overlay at '%s': run `k3ctl"
					  " convert-spine-int8 --model %s` first", opts->int8_dir, m->dir);
		return k3_err_set(err, -errno, "int8 spine overlay '%s': %s", opts->int8_dir,
				  strerror(errno));
	}
	if (!(m->int8.dir = strdup(real)))
		return k3_err_set(err, -ENOMEM, "out of memory");
	r = index_shards(real, &ix, err);
	if (r == -ENOENT)
		r = k3_err_set(err, -ENOENT, "'%s' is not an int8 spine overlay (no index): run `k3ctl"
			       " convert-spine-int8 --model %s`", real, m->dir);
	if (r)
		goto out;
	m->int8.shards = calloc(ix.n_shards ? ix.n_shards : 1, sizeof(*m->int8.shards));
	if (!m->int8.shards) {
		r = k3_err_set(err, -ENOMEM, "out of memory");
		goto out;
	}
	for (uint32_t s = 0; s < ix.n_shards; s++) {
		r = k3_model_shard_open(real, ix.shards[s], &m->int8.shards[s], err);
		m->int8.n_shards = s + 1;
		if (r)
			goto out;
	}
	if ((r = collect(m, &c, err)))
		goto out;
	size_t n = k3_model_int8_matrices(m, NULL, 0);
	m->int8.views = calloc(n ? n : 1, sizeof(*m->int8.views));
	if (!m->int8.views) {
		r = k3_err_set(err, -ENOMEM, "out of memory");
		goto out;
	}
	m->int8.roles = c.roles;
	visit_slots(m, attach_one, &c);
	for (size_t i = 0; i < c.n_ents; i++)
		if (!c.ents[i].used)
			problem(&c, "'%s' matches no matrix of this model", c.ents[i].name);
	if (c.problems)
		r = k3_err_set(err, -EINVAL, "int8 spine overlay '%s' does not fit this model (%zu"
			       " problem%s; first: %s): rerun `k3ctl convert-spine-int8 --model %s`",
			       real, c.problems, c.problems == 1 ? "" : "s", c.first, m->dir);
out:
	k3_st_index_release(&ix);
	free(c.ents);
	return r;
}

void k3_model_int8_release(struct k3_model *m)
{
	for (uint32_t s = 0; s < m->int8.n_shards; s++) {
		struct k3_shard *sh = &m->int8.shards[s];
		if (sh->map)
			munmap((void *)sh->map, (size_t)sh->size);
		k3_st_header_release(&sh->hdr);
		free(sh->path);
	}
	free(m->int8.shards);
	free(m->int8.views);
	free(m->int8.dir);
	memset(&m->int8, 0, sizeof(m->int8));
}

const struct k3_shard *k3_model_shard_at(const struct k3_model *m, uint32_t i)
{
	if (i < m->n_shards)
		return &m->shards[i];
	if (i - m->n_shards < m->int8.n_shards)
		return &m->int8.shards[i - m->n_shards];
	return NULL;
}

int k3_model_int8_quantize_rows(const struct k3_tensor *t, size_t r0, size_t n, uint16_t *w,
				int8_t *q, float *scales, size_t *bad_row)
{
	size_t bad = 0;

	if (t->dtype != K3_DTYPE_BF16 || t->ndim != 2)
		return -EINVAL;
	if (r0 > t->shape[0] || n > t->shape[0] - r0)
		return -ERANGE;
	size_t cols = (size_t)t->shape[1];
	memcpy(w, (const uint8_t *)t->data + 2 * r0 * cols, n * cols * 2);
	int rc = k3_kern_quantize_i8_bf16(n, cols, cols, w, q, scales, &bad);
	if (rc && bad_row)
		*bad_row = r0 + bad;
	return rc;
}

const struct k3_tensor *k3_model_int8_views(const struct k3_model *m, size_t *n)
{
	*n = m->int8.n_views;
	return m->int8.views;
}

void k3_model_int8_info_get(const struct k3_model *m, struct k3_model_int8_info *info)
{
	memset(info, 0, sizeof(*info));
	info->on = m->int8.n_views > 0;
	info->roles = m->int8.roles;
	info->dir = m->int8.dir;
	info->shards = m->int8.n_shards;
	info->matrices = m->int8.n_views;
	info->int8_bytes = m->int8.int8_bytes;
	info->bf16_bytes = m->int8.bf16_bytes;
}

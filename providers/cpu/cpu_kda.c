/*
 * cpu_kda.c - the cpu provider's KDA sub-layer (spec §5): the per-sequence
 * state (conv windows and the [H][dk][dk] delta-rule state), the
 * projections, the per-token step (short conv, decay, delta rule, gated
 * output norm) and o_proj; and exact speculative verification: kda_verify
 * runs a draft on a scratch copy of the state and records what the step
 * consumed, kda_replay applies the accepted prefix to the real state.
 * Decode, prefill, verify and replay all run the one kda_steps, which is
 * what makes a replayed state bit-identical to a decoded one.
 */
#include "cpu/cpu_internal.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* One allocation: the struct, then win (padded to whole 64-byte lines, so
 * S is as aligned as win), then S. */
struct k3_prov_kda_state {
	k3_prov_model *m;
	uint32_t layer;
	float *win;              /* [3 streams][K-1][P] raw projections */
	float *S;                /* [H][dk][dk], row = key channel */
	size_t n_win, n_S;
	float mem[];
};

/* ---------------------------------------------------------------- state */

int cpu_kda_state_new(k3_prov_model *m, uint32_t layer, k3_prov_kda_state **out,
		      struct k3_prov_status *st)
{
	if (layer >= m->cfg.n_layers || m->cfg.attn_kind[layer] != K3_PROV_ATTN_KDA)
		return cpu_fail(st, -EINVAL, "layer %u is not a KDA layer", layer);
	size_t n_win = (size_t)3 * (m->cfg.conv_kernel - 1) * m->P;
	size_t n_S = (size_t)m->cfg.kda_heads * m->cfg.kda_head_dim * m->cfg.kda_head_dim;
	size_t win_cap = (n_win + 16) / 16 * 16;    /* >= n_win + 1 floats */
	k3_prov_kda_state *s = calloc(1, sizeof(*s) + (win_cap + n_S) * sizeof(float));
	if (!s)
		return cpu_fail(st, -ENOMEM, "out of memory for KDA state");
	*s = (struct k3_prov_kda_state){ .m = m, .layer = layer, .win = s->mem,
					 .S = s->mem + win_cap, .n_win = n_win, .n_S = n_S };
	*out = s;
	return 0;
}

void cpu_kda_state_free(k3_prov_kda_state *s)
{
	free(s);
}

void cpu_kda_state_reset(k3_prov_kda_state *s)
{
	memset(s->win, 0, s->n_win * sizeof(float));
	memset(s->S, 0, s->n_S * sizeof(float));
}

int cpu_kda_state_copy(k3_prov_kda_state *dst, const k3_prov_kda_state *src,
		       struct k3_prov_status *st)
{
	if (dst->m != src->m || dst->layer != src->layer)
		return cpu_fail(st, -EINVAL, "KDA state copy across layers %u -> %u", src->layer, dst->layer);
	memcpy(dst->win, src->win, src->n_win * sizeof(float));
	memcpy(dst->S, src->S, src->n_S * sizeof(float));
	return 0;
}

int cpu_kda_state_export(const k3_prov_kda_state *s, void *dst, size_t cap, size_t *n,
			 struct k3_prov_status *st)
{
	return cpu_export_bytes(dst, cap, n, s->win, s->n_win * sizeof(float), s->S,
				s->n_S * sizeof(float), st);
}

/* ---------------------------------------------------------------- step */

/* One KDA position of head hh (spec §5.3-5.6): q, k, v post-conv, f decay
 * logits, b beta logit, gz gate logits; writes z[dk]. z == NULL (a replay,
 * which only advances the state) skips the gated output norm, which reads
 * the state but never writes it. */
static void kda_head(const k3_prov_model *m, const struct cpu_layer *L, float *S,
		     uint32_t hh, const float *q, const float *k, const float *v,
		     const float *f, float b, const float *gz, float *z, float *work)
{
	const struct k3_prov_config *c = &m->cfg;
	uint32_t dk = c->kda_head_dim;
	size_t c0 = (size_t)hh * dk;
	float *alpha = work, *o = work + dk, *qn = work + 2 * dk, *kn = work + 3 * dk;
	float *scratch = work + 4 * dk;
	float beta = k3_cpu_sigmoid(b);

	if (m->reference) {
		for (uint32_t i = 0; i < dk; i++)
			alpha[i] = expf(c->gate_lower_bound *
				k3_cpu_sigmoid(L->a_exp[hh] * (f[i] + L->dt_bias[c0 + i])));
		k3_cpu_ref_kda_head(S, dk, dk, q, k, v, alpha, beta, o);
		if (!z)
			return;
		double ss = 0.0;
		for (uint32_t j = 0; j < dk; j++)
			ss += (double)o[j] * o[j];
		float r = (float)(1.0 / sqrt(ss / dk + c->rms_eps));
		for (uint32_t j = 0; j < dk; j++)
			z[j] = o[j] * r * L->o_norm[j] * k3_cpu_sigmoid(gz[j]);
		return;
	}
	k3_kern_kda_decay(dk, f, L->dt_bias + c0, L->a_exp[hh], c->gate_lower_bound, alpha);
	k3_kern_l2norm(dk, q, 1e-6f, 1.0f / sqrtf((float)dk), qn);
	k3_kern_l2norm(dk, k, 1e-6f, 1.0f, kn);
	k3_kern_kda_step(dk, dk, S, qn, kn, v, alpha, beta, o, scratch);
	if (z)
		k3_kern_rmsnorm_gated(dk, o, L->o_norm, gz, c->rms_eps, z);
}

/* Heads [begin, end) of one KDA position; each head uses its own slice of
 * m->work, so heads can run on different threads. */
struct kda_heads_job {
	const k3_prov_model *m;
	const struct cpu_layer *L;
	float *S;
	const float *q, *k, *v, *f, *b, *gz;
	float *z;                /* NULL: state only (replay) */
};

static void kda_heads_task(void *arg, size_t begin, size_t end)
{
	const struct kda_heads_job *j = arg;
	uint32_t dk = j->m->cfg.kda_head_dim;
	for (size_t hh = begin; hh < end; hh++) {
		size_t c0 = hh * dk;
		kda_head(j->m, j->L, j->S + c0 * dk, (uint32_t)hh, j->q + c0, j->k + c0, j->v + c0,
			 j->f + c0, j->b[hh], j->gz ? j->gz + c0 : NULL, j->z ? j->z + c0 : NULL,
			 j->m->work + 6 * c0);
	}
}

static void conv_step(const k3_prov_model *m, float *win, const float *w, const float *x,
		      float *y)
{
	uint32_t K = m->cfg.conv_kernel;
	if (m->reference || K != 4)
		k3_cpu_ref_conv_step(win, w, m->P, K, x, y);
	else
		k3_kern_kda_conv_silu(m->P, w, win, x, y);
}

/*
 * The per-token part of a KDA sub-layer (spec §5.2-5.6) over T positions,
 * strictly in order, on the state (win, S): rows [T][ld] of the raw q, k,
 * v projections (qp's rows are consumed: the v conv output lands there),
 * the decay logits f, the beta logits bl and the gate logits gz, into the
 * head outputs z ([T][ld]; NULL for a replay, which advances the state
 * only). Decode, prefill, verification and replay all run this one
 * routine, which is what makes a replayed state bit-identical to a
 * decoded one.
 */
static void kda_steps(k3_prov_model *m, const struct cpu_layer *L, float *win, float *S,
		      float *qp, const float *kp, const float *vp, const float *f,
		      const float *bl, const float *gz, float *z, uint32_t T, size_t ld)
{
	const struct k3_prov_config *c = &m->cfg;
	uint32_t P = m->P, H = c->kda_heads, dk = c->kda_head_dim;
	size_t wstride = (size_t)(c->conv_kernel - 1) * P;
	float *q1 = m->tmp, *k1 = m->tmp2;

	for (uint32_t t = 0; t < T; t++) {
		float *qt = qp + t * ld;
		/* q -> tmp, k -> tmp2, v -> the consumed raw-q row */
		conv_step(m, win, L->conv[0], qt, q1);
		conv_step(m, win + wstride, L->conv[1], kp + t * ld, k1);
		conv_step(m, win + 2 * wstride, L->conv[2], vp + t * ld, qt);
		struct kda_heads_job job = { m, L, S, q1, k1, qt, f + t * ld, bl + t * ld,
					     gz ? gz + t * ld : NULL, z ? z + t * ld : NULL };
		/* heads are independent: split them across threads when the
		 * state is big enough to be worth a dispatch (K3: 6 MB/layer) */
		size_t state_bytes = (size_t)H * dk * dk * sizeof(float);
		if (!m->reference && (m->ctx.split_all || state_bytes >= K3_CPU_PARALLEL_MIN_BYTES))
			k3_kern_pool_for(m->ctx.pool, H, 1, kda_heads_task, &job);
		else
			kda_heads_task(&job, 0, H);
	}
}

static int kda_check(k3_prov_model *m, uint32_t layer, uint32_t T, const k3_prov_kda_state *s,
		     struct k3_prov_status *st)
{
	return cpu_check_attn(m, layer, T, K3_PROV_ATTN_KDA, s->m, s->layer, "KDA state", st);
}

/* input_layernorm and the six input projections of T positions into the
 * scratch rows m->s[0..7] (q, k, v, f, gz; fa and bl), row stride m->wide. */
static void kda_project(k3_prov_model *m, const struct cpu_layer *L, const float *h, uint32_t T)
{
	const struct k3_prov_config *c = &m->cfg;
	uint32_t D = c->hidden;
	size_t W = m->wide;
	float *x = m->sx;

	cpu_norm_rows(m, h, L->input_norm, T, D, c->rms_eps, x, D, D);
	const struct k3_cpu_job proj[6] = {
		JOB(&L->q, x, D, T, m->s[0], W), JOB(&L->k, x, D, T, m->s[1], W),
		JOB(&L->v, x, D, T, m->s[2], W), JOB(&L->g, x, D, T, m->s[4], W),
		JOB(&L->fa, x, D, T, m->s[6], W), JOB(&L->b, x, D, T, m->s[7], W),
	};
	k3_cpu_linear_multi(&m->ctx, proj, 6);
	k3_cpu_linear(&m->ctx, &L->fb, m->s[6], W, T, m->s[3], W);
}

/* o_proj of the head outputs in m->s[5], stored (:= or +=) into out. */
static void kda_output(k3_prov_model *m, const struct cpu_layer *L, uint32_t T, float *out,
		       uint32_t flags)
{
	uint32_t D = m->cfg.hidden;
	size_t W = m->wide;
	float *y = m->s[0];

	k3_cpu_linear(&m->ctx, &L->o, m->s[5], W, T, y, W);
	for (uint32_t t = 0; t < T; t++)
		cpu_store(out + (size_t)t * D, y + t * W, D, flags);
}

int cpu_kda(k3_prov_model *m, uint32_t layer, const float *h, uint32_t T,
	    k3_prov_kda_state *s, float *out, uint32_t flags,
	    struct k3_prov_status *st)
{
	int rc = kda_check(m, layer, T, s, st);
	if (rc)
		return rc;
	const struct cpu_layer *L = &m->layers[layer];
	kda_project(m, L, h, T);
	kda_steps(m, L, s->win, s->S, m->s[0], m->s[1], m->s[2], m->s[3], m->s[7], m->s[4],
		  m->s[5], T, m->wide);
	kda_output(m, L, T, out, flags);
	return 0;
}

/* ---------------------------------------------------------------- KDA verify / replay */

struct k3_prov_kda_record {
	k3_prov_model *m;
	uint32_t layer;
	uint32_t cap;            /* positions */
	uint32_t n;              /* positions the last verify recorded */
	size_t row;              /* floats per position: 4 P + H */
	float *v;                /* [cap][row]: qp | kp | vp | f | bl */
};

int cpu_kda_record_new(k3_prov_model *m, uint32_t layer, uint32_t max_T,
		       k3_prov_kda_record **out, struct k3_prov_status *st)
{
	int rc = cpu_check_kind(m, layer, K3_PROV_ATTN_KDA, 0, st);
	if (rc)
		return rc;
	if (max_T == 0 || max_T > m->max_batch)
		return cpu_fail(st, -EINVAL, "KDA record of %u positions not in 1..%u", max_T, m->max_batch);
	k3_prov_kda_record *r = calloc(1, sizeof(*r));
	if (!r)
		return cpu_fail(st, -ENOMEM, "out of memory");
	r->m = m;
	r->layer = layer;
	r->cap = max_T;
	r->row = (size_t)4 * m->P + m->cfg.kda_heads;
	r->v = malloc((size_t)max_T * r->row * sizeof(float));
	if (!r->v) {
		free(r);
		return cpu_fail(st, -ENOMEM, "out of memory for a %u-position KDA record", max_T);
	}
	*out = r;
	return 0;
}

void cpu_kda_record_free(k3_prov_kda_record *r)
{
	if (!r)
		return;
	free(r->v);
	free(r);
}

int cpu_kda_verify(k3_prov_model *m, uint32_t layer, const float *h, uint32_t T,
		   const k3_prov_kda_state *s, k3_prov_kda_record *rec, float *out,
		   uint32_t flags, struct k3_prov_status *st)
{
	int rc = kda_check(m, layer, T, s, st);
	if (rc)
		return rc;
	if (rec->m != m || rec->layer != layer || T > rec->cap)
		return cpu_fail(st, -EINVAL, "KDA record (layer %u, %u positions) used for layer %u, %u positions",
				rec->layer, rec->cap, layer, T);
	const struct cpu_layer *L = &m->layers[layer];
	uint32_t P = m->P, H = m->cfg.kda_heads;
	size_t W = m->wide;

	kda_project(m, L, h, T);
	/* Record the inputs before the per-token loop consumes the q rows. */
	for (uint32_t t = 0; t < T; t++) {
		float *r = rec->v + t * rec->row;
		memcpy(r, m->s[0] + t * W, P * sizeof(float));
		memcpy(r + P, m->s[1] + t * W, P * sizeof(float));
		memcpy(r + 2 * (size_t)P, m->s[2] + t * W, P * sizeof(float));
		memcpy(r + 3 * (size_t)P, m->s[3] + t * W, P * sizeof(float));
		memcpy(r + 4 * (size_t)P, m->s[7] + t * W, H * sizeof(float));
	}
	rec->n = T;
	/* One layer's state of scratch: the published state is only read. */
	memcpy(m->kda_win, s->win, s->n_win * sizeof(float));
	memcpy(m->kda_S, s->S, s->n_S * sizeof(float));
	kda_steps(m, L, m->kda_win, m->kda_S, m->s[0], m->s[1], m->s[2], m->s[3], m->s[7],
		  m->s[4], m->s[5], T, W);
	kda_output(m, L, T, out, flags);
	return 0;
}

int cpu_kda_replay(k3_prov_model *m, uint32_t layer, k3_prov_kda_state *s,
		   const k3_prov_kda_record *rec, uint32_t n, struct k3_prov_status *st)
{
	/* Unbound is fine: the per-token step reads only the conv taps and
	 * decay vectors the provider converted when the layer was last bound
	 * (for the kda_verify that filled rec), never a borrowed matrix. */
	int rc = cpu_check_kind(m, layer, K3_PROV_ATTN_KDA, 0, st);
	if (rc)
		return rc;
	if (s->m != m || s->layer != layer || rec->m != m || rec->layer != layer)
		return cpu_fail(st, -EINVAL, "KDA replay of a layer %u record onto a layer %u state for layer %u",
				rec->layer, s->layer, layer);
	if (n > rec->n)
		return cpu_fail(st, -EINVAL, "KDA replay of %u positions; the record holds %u", n, rec->n);
	if (n == 0)
		return 0;
	uint32_t P = m->P, H = m->cfg.kda_heads;
	size_t W = m->wide;
	/* Back into the row layout kda_steps reads (m->s holds max_batch >= cap rows). */
	for (uint32_t t = 0; t < n; t++) {
		const float *r = rec->v + t * rec->row;
		memcpy(m->s[0] + t * W, r, P * sizeof(float));
		memcpy(m->s[1] + t * W, r + P, P * sizeof(float));
		memcpy(m->s[2] + t * W, r + 2 * (size_t)P, P * sizeof(float));
		memcpy(m->s[3] + t * W, r + 3 * (size_t)P, P * sizeof(float));
		memcpy(m->s[7] + t * W, r + 4 * (size_t)P, H * sizeof(float));
	}
	kda_steps(m, &m->layers[layer], s->win, s->S, m->s[0], m->s[1], m->s[2], m->s[3],
		  m->s[7], NULL, NULL, n, W);
	return 0;
}

/*
 * cpu_internal.h - what the files of the cpu provider share (internal to
 * providers/cpu; the engine sees only k3_provider_cpu through
 * providers/k3_provider.h). cpu_provider.c opens, binds and closes the
 * model, runs the small ops and holds the ops table; cpu_kda.c is the KDA
 * sub-layer with its states and records, cpu_mla.c the MLA sub-layer with
 * its caches, cpu_moe.c the FFN sub-layer (router, routed experts, dense
 * and shared MLP). They share the model below (weights, scratch), the
 * checks and the row helpers; every function here is the one copy of its
 * job, defined in cpu_provider.c.
 */
#ifndef K3_CPU_INTERNAL_H
#define K3_CPU_INTERNAL_H

#include "k3_provider.h"
#include "cpu/cpu_ops.h"
#include "cpu/cpu_linear.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
struct cpu_layer {
	uint32_t attn, ffn;
	/* The weights are readable: always, unless open() got the layer
	 * without data (a streamed layer); then between bind_layer calls.
	 * The fp32 vectors below are allocated at open either way and
	 * refilled by each bind, so binding allocates nothing. */
	bool bound;
	float *input_norm, *post_norm, *attn_u, *mlp_u;
	/* KDA */
	struct k3_cpu_mat q, k, v, fa, fb, b, g, o;
	float *conv[3];          /* [P][K] taps for q, k, v */
	float *a_exp;            /* [H] exp(A_log[h]) */
	float *dt_bias;          /* [P] */
	float *o_norm;           /* [dk] */
	/* MLA (g, o above are shared with KDA) */
	struct k3_cpu_mat qa, qb, kva, kvb;
	float *qa_norm, *kva_norm;
	/* dense MLP or shared experts */
	struct k3_cpu_mat mg, mu, md;
	/* MoE */
	struct k3_cpu_mat router, ldown, lup;
	float *rbias, *lnorm;
};

struct k3_prov_model {
	struct k3_prov_config cfg;
	uint32_t max_batch;
	int reference;
	struct k3_cpu_ctx ctx;
	struct k3_cpu_mat embed, lm_head;
	float *norm, *out_u;
	bool head_bound;         /* lm_head, norm, out_u readable (see cpu_layer.bound) */
	struct cpu_layer *layers;
	uint32_t P;              /* KDA width */
	uint32_t qhd;            /* MLA q head dim (nope + rope) */
	uint32_t wide;           /* widest per-position scratch row */
	/* The arrays from sx to edone (not mla_s, which grows) are parts of
	 * one block, scratch, freed with the model. */
	void *scratch;
	float *sx, *s[8];        /* [max_batch][D], [max_batch][wide] */
	float *tmp;              /* [wide] per-position temporaries */
	float *tmp2;             /* [wide] */
	float *work;             /* [kda_heads][6 * kda_head_dim] KDA head temporaries */
	float *kda_win, *kda_S;  /* one KDA layer's state: kda_verify's scratch copy */
	float *mla_q;            /* [mla_heads][kv_lora + qk_rope] absorbed queries */
	float *mla_cbar;         /* [mla_heads][kv_lora] */
	float *mla_s;            /* [mla_heads][mla_s_cap] attention scores */
	struct k3_cpu_mat *mla_wuv;   /* [mla_heads] WUV_h views */
	struct k3_cpu_job *mla_jobs;  /* [mla_heads] */
	uint32_t mla_s_cap;      /* tokens; grows with the largest MLA cache */
	/* routed experts: [max_batch * top_k] slots */
	float *ey;               /* [slots][latent] per-slot expert outputs */
	float *ex;               /* [slots][max(latent, moe_inter)] gathered inputs / outputs */
	float *eg, *eu;          /* [slots][moe_inter] gate / up */
	uint32_t *eslot;         /* [slots] */
	struct k3_cpu_job *ejobs;  /* [3 * slots] */
	uint8_t *edone;          /* [slots] */
	/* routed_begin .. routed_end in progress (routed_expert fills rows) */
	const uint32_t *r_ids;   /* borrowed from routed_begin */
	uint32_t r_layer, r_T, r_rows;
	bool r_open;
};

#define JOB(Wm, X, LDX, TT, Y, LDY) \
	((struct k3_cpu_job){ .W = (Wm), .x = (X), .ldx = (LDX), .T = (TT), .y = (Y), .ldy = (LDY) })
#define MXJOB(P_, S_, R_, C_, X, LDX, TT, Y, LDY) \
	((struct k3_cpu_job){ .packed = (P_), .scale = (S_), .rows = (R_), .cols = (C_), \
			      .x = (X), .ldx = (LDX), .T = (TT), .y = (Y), .ldy = (LDY) })

static inline uint32_t cpu_umax(uint32_t a, uint32_t b)
{
	return a > b ? a : b;
}

/* Fills st (when not NULL) with code and the printf-style message;
 * returns code (a negative errno). */
int cpu_fail(struct k3_prov_status *st, int code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* 0 when 1 <= T <= max_batch, else -EINVAL. */
int cpu_check_T(k3_prov_model *m, uint32_t T, struct k3_prov_status *st);

/* Layer in range and of the given kinds (0: any); its weights need not
 * be bound (KDA records and replay read only the provider's own vectors).
 * 0 or -EINVAL. */
int cpu_check_kind(k3_prov_model *m, uint32_t layer, uint32_t attn, uint32_t ffn,
		   struct k3_prov_status *st);

/* cpu_check_kind, and the layer's weights are bound. 0 or -EINVAL. */
int cpu_check_layer(k3_prov_model *m, uint32_t layer, uint32_t attn, uint32_t ffn,
		    struct k3_prov_status *st);

/* What an attention op checks first: cpu_check_T, cpu_check_layer of
 * kind attn, and that its state (what: "KDA state", "MLA cache"), made
 * for owner's layer owner_layer, belongs to m's layer. 0 or -EINVAL. */
int cpu_check_attn(k3_prov_model *m, uint32_t layer, uint32_t T, uint32_t attn,
		   const k3_prov_model *owner, uint32_t owner_layer, const char *what,
		   struct k3_prov_status *st);

/* out[0..n) := y, or += y with K3_PROV_OUT_ACCUMULATE in flags. */
void cpu_store(float *out, const float *y, size_t n, uint32_t flags);

/* RMSNorm of one row of n (spec §3.1), reference or kernel path; y may
 * alias x. */
void cpu_rmsnorm(const k3_prov_model *m, const float *x, const float *w, uint32_t n,
		 float eps, float *y);

/* cpu_rmsnorm of T rows: h row t at t * ld_in, x row t at t * ld_out. */
void cpu_norm_rows(const k3_prov_model *m, const float *h, const float *w, uint32_t T,
		   uint32_t n, float eps, float *x, size_t ld_in, size_t ld_out);

/* g[i] = SiTU-GLU(g[i], u[i]) for i < n (spec §7.1), in place. */
void cpu_situ_rows(const k3_prov_model *m, float *g, const float *u, uint32_t n);

/* A state export: *n = na + nb bytes; with dst, copies a then b into it
 * (-ENOSPC when cap < *n). dst NULL asks the size only. */
int cpu_export_bytes(void *dst, size_t cap, size_t *n, const void *a, size_t na,
		     const void *b, size_t nb, struct k3_prov_status *st);

/* The ops of struct k3_provider (providers/k3_provider.h has their
 * contracts) that live outside cpu_provider.c. */

/* cpu_kda.c */
int cpu_kda_state_new(k3_prov_model *m, uint32_t layer, k3_prov_kda_state **out,
		      struct k3_prov_status *st);
void cpu_kda_state_free(k3_prov_kda_state *s);
void cpu_kda_state_reset(k3_prov_kda_state *s);
int cpu_kda_state_copy(k3_prov_kda_state *dst, const k3_prov_kda_state *src,
		       struct k3_prov_status *st);
int cpu_kda_state_export(const k3_prov_kda_state *s, void *dst, size_t cap, size_t *n,
			 struct k3_prov_status *st);
int cpu_kda(k3_prov_model *m, uint32_t layer, const float *h, uint32_t T,
	    k3_prov_kda_state *s, float *out, uint32_t flags, struct k3_prov_status *st);
int cpu_kda_record_new(k3_prov_model *m, uint32_t layer, uint32_t max_T,
		       k3_prov_kda_record **out, struct k3_prov_status *st);
void cpu_kda_record_free(k3_prov_kda_record *r);
int cpu_kda_verify(k3_prov_model *m, uint32_t layer, const float *h, uint32_t T,
		   const k3_prov_kda_state *s, k3_prov_kda_record *rec, float *out,
		   uint32_t flags, struct k3_prov_status *st);
int cpu_kda_replay(k3_prov_model *m, uint32_t layer, k3_prov_kda_state *s,
		   const k3_prov_kda_record *rec, uint32_t n, struct k3_prov_status *st);

/* cpu_mla.c */
int cpu_mla_cache_new(k3_prov_model *m, uint32_t layer, uint32_t capacity,
		      k3_prov_mla_cache **out, struct k3_prov_status *st);
void cpu_mla_cache_free(k3_prov_mla_cache *c);
uint32_t cpu_mla_cache_len(const k3_prov_mla_cache *c);
void cpu_mla_cache_truncate(k3_prov_mla_cache *c, uint32_t n);
int cpu_mla_cache_copy(k3_prov_mla_cache *dst, const k3_prov_mla_cache *src,
		       struct k3_prov_status *st);
int cpu_mla_cache_export(const k3_prov_mla_cache *c, void *dst, size_t cap, size_t *n,
			 struct k3_prov_status *st);
int cpu_mla(k3_prov_model *m, uint32_t layer, const float *h, uint32_t T,
	    k3_prov_mla_cache *cache, float *out, uint32_t flags, struct k3_prov_status *st);

/* cpu_moe.c */
int cpu_ffn_norm(k3_prov_model *m, uint32_t layer, const float *h2, uint32_t T,
		 float *x, struct k3_prov_status *st);
int cpu_router(k3_prov_model *m, uint32_t layer, const float *x, uint32_t T,
	       uint32_t *ids, float *weights, struct k3_prov_status *st);
int cpu_routed_experts(k3_prov_model *m, uint32_t layer, const float *x, uint32_t T,
		       const uint32_t *ids, const float *weights,
		       const struct k3_prov_expert *experts, float *out,
		       struct k3_prov_status *st);
int cpu_routed_begin(k3_prov_model *m, uint32_t layer, const float *x, uint32_t T,
		     const uint32_t *ids, struct k3_prov_status *st);
int cpu_routed_expert(k3_prov_model *m, uint32_t layer, uint32_t expert,
		      const struct k3_prov_expert *sp, struct k3_prov_status *st);
int cpu_routed_end(k3_prov_model *m, uint32_t layer, const float *weights, float *out,
		   struct k3_prov_status *st);
int cpu_routed_partial(k3_prov_model *m, uint32_t layer, const float *weights,
		       float *out, struct k3_prov_status *st);
int cpu_mlp(k3_prov_model *m, uint32_t layer, const float *x, uint32_t T,
	    float *out, struct k3_prov_status *st);

#endif

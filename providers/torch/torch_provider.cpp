/*
 * torch_provider.cpp - the "torch" provider: the Kimi K3 forward pass of
 * providers/k3_provider.h in fp32 through LibTorch's ATen, on the CPU or
 * on a CUDA device (docs/providers.md; math: docs/model.md, "spec §n").
 *
 * Weights are converted once at open to fp32 tensors on the device (bf16
 * to fp32 is exact, spec §0.2), except the embedding, which is gathered on
 * the host from the borrowed bytes. Every op takes host fp32 activations,
 * computes on the device and hands host fp32 back (the ABI's rule; a
 * device provider keeps its own mirrors of the sequence state only).
 *
 * Batch invariance: every op runs one position at a time (`per_row`,
 * by_rows in torch_internal.h; products as at::mv), so position t's
 * arithmetic does not depend on T. ATen's batched matmul (OpenBLAS sgemm)
 * does not keep that: row t of a [T][n] product differs from the same row
 * alone (measured, docs/providers.md). K3_TORCH_BATCHED=1 runs whole
 * chunks instead (faster prefill, not batch invariant; tests only).
 *
 * The ABI boundary: every entry point is extern "C", runs its body inside
 * guard(), which turns k3t::Fail, std::bad_alloc, c10::Error and any other
 * exception into a negative errno and a message; nothing propagates.
 */
#include "torch/torch_internal.h"
#include "torch/torch_provider.h"

#include <c10/core/InferenceMode.h>

#include <cerrno>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>

struct k3_prov_model : k3t::Model {};
struct k3_prov_kda_state : k3t::KdaState {};
struct k3_prov_mla_cache : k3t::MlaCache {};

namespace k3t {

void fail(int code, const char *fmt, ...)
{
	char buf[K3_PROV_MSG_MAX];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	throw Fail{code, buf};
}

Model::~Model()
{
	experts_close(*this);
}

namespace {

void set_status(k3_prov_status *st, int code, const char *msg)
{
	if (!st)
		return;
	st->code = code;
	snprintf(st->msg, sizeof(st->msg), "%s", msg);
}

/* Runs body; returns 0 or the negative errno of what it threw. c10::Error
 * messages carry a C++ backtrace after the first line: only that line is
 * kept. */
template <class F> int guard(k3_prov_status *st, F &&body)
{
	try {
		c10::InferenceMode no_autograd;
		body();
		return 0;
	} catch (const Fail &f) {
		set_status(st, f.code, f.msg.c_str());
		return f.code;
	} catch (const std::bad_alloc &) {
		set_status(st, -ENOMEM, "out of memory");
		return -ENOMEM;
	} catch (const c10::Error &e) {
		std::string w = e.what_without_backtrace();
		size_t nl = w.find('\n');
		if (nl != std::string::npos)
			w.resize(nl);
		bool oom = w.find("out of memory") != std::string::npos;
		std::string msg = "ATen: " + w;
		set_status(st, oom ? -ENOMEM : -EIO, msg.c_str());
		return oom ? -ENOMEM : -EIO;
	} catch (const std::exception &e) {
		std::string msg = std::string("C++ exception: ") + e.what();
		set_status(st, -EIO, msg.c_str());
		return -EIO;
	} catch (...) {
		set_status(st, -EIO, "unknown C++ exception");
		return -EIO;
	}
}

/* The device: CUDA when this LibTorch has it, a device is present and
 * K3_TORCH_DEVICE is not "cpu"; else the CPU. */
int cuda_devices()
{
	const char *want = getenv("K3_TORCH_DEVICE");
	if (want && strcmp(want, "cpu") == 0)
		return 0;
	try {
		return at::hasCUDA() ? (int)at::getNumGPUs() : 0;
	} catch (...) {
		return 0;
	}
}

uint64_t numel(const k3_prov_tensor &t)
{
	uint64_t n = 1;
	for (uint32_t i = 0; i < t.ndim && i < 3; i++)
		n *= t.shape[i];
	return n;
}

/* The borrowed tensor as a host ATen tensor of its own dtype (no copy). */
at::Tensor host_view(const k3_prov_tensor &t, int64_t rows, int64_t cols)
{
	auto st = t.dtype == K3_PROV_DTYPE_BF16 ? at::kBFloat16 : at::kFloat;
	return at::from_blob(const_cast<void *>(t.data), {rows, cols},
			     at::TensorOptions().dtype(st).device(at::kCPU));
}

at::Tensor get_mat(const Model &m, const k3_prov_tensor &t, uint32_t rows, uint32_t cols,
		   const char *name, uint32_t layer)
{
	if (t.dtype != K3_PROV_DTYPE_BF16 && t.dtype != K3_PROV_DTYPE_F32)
		fail(-EINVAL, "layer %u tensor '%s': dtype %u is not bf16 or f32", layer, name, t.dtype);
	if (!t.data || t.ndim != 2 || t.shape[0] != rows || t.shape[1] != cols)
		fail(-EINVAL, "layer %u tensor '%s': shape [%llu, %llu] (ndim %u), want [%u, %u]",
		     layer, name, (unsigned long long)t.shape[0], (unsigned long long)t.shape[1],
		     t.ndim, rows, cols);
	if ((uintptr_t)t.data % (t.dtype == K3_PROV_DTYPE_BF16 ? 2 : 4))
		fail(-EINVAL, "layer %u tensor '%s': payload not aligned to its element size",
		     layer, name);
	/* bf16 -> fp32 is exact; one copy on the device */
	return host_view(t, rows, cols).to(m.dev, at::kFloat, false, true).contiguous();
}

/* fp32 copy of the first n values of a small tensor; exactly n, or at
 * least n when at_least. */
at::Tensor get_vec(const Model &m, const k3_prov_tensor &t, uint32_t n, bool at_least,
		   const char *name, uint32_t layer)
{
	uint64_t have = numel(t);
	if (!t.data || t.ndim < 1 || t.ndim > 3 ||
	    (t.dtype != K3_PROV_DTYPE_BF16 && t.dtype != K3_PROV_DTYPE_F32) ||
	    (at_least ? have < n : have != n))
		fail(-EINVAL, "layer %u tensor '%s': want %s%u bf16/f32 values, have %llu (dtype %u)",
		     layer, name, at_least ? ">= " : "", n, (unsigned long long)have, t.dtype);
	/* small tensors carry no alignment promise: copy bytes first */
	size_t esz = t.dtype == K3_PROV_DTYPE_BF16 ? 2 : 4;
	auto st = t.dtype == K3_PROV_DTYPE_BF16 ? at::kBFloat16 : at::kFloat;
	at::Tensor raw = at::empty({(int64_t)n}, at::TensorOptions().dtype(st));
	memcpy(raw.data_ptr(), t.data, n * esz);
	return raw.to(m.dev, at::kFloat).contiguous();
}

at::Tensor get_mix(const Model &m, const k3_prov_tensor &nw, const k3_prov_tensor &pw,
		   const char *name, uint32_t layer)
{
	uint32_t D = m.cfg.hidden;
	return (get_vec(m, nw, D, false, name, layer) * get_vec(m, pw, D, false, name, layer))
		.contiguous();
}

void check_config(const k3_prov_config *c)
{
	if (c->struct_size < sizeof(*c))
		fail(-EPROTO, "config struct_size %u < %zu", c->struct_size, sizeof(*c));
	if (!c->hidden || !c->n_layers || c->n_layers > K3_PROV_MAX_LAYERS || !c->vocab)
		fail(-EINVAL, "config: hidden, layers (1..%d) and vocab must be set", K3_PROV_MAX_LAYERS);
	if (!c->attn_res_block ||
	    (c->n_layers + c->attn_res_block - 1) / c->attn_res_block + 2 > K3_KERN_ATTNRES_MAX_CAND)
		fail(-EINVAL, "config: attn_res_block %u gives too many AttnRes candidates",
		     c->attn_res_block);
	if (c->n_experts > 1024 || c->top_k > c->n_experts || c->top_k > 64)
		fail(-EINVAL, "config: %u experts top-%u unsupported (<= 1024 experts, top-k <= 64)",
		     c->n_experts, c->top_k);
	if (c->latent % 32 || c->moe_inter % 32)
		fail(-EINVAL, "config: MXFP4 expert dims %u, %u must be multiples of 32", c->latent,
		     c->moe_inter);
	if (!c->kda_head_dim || c->kda_head_dim > 1024 || !c->conv_kernel || c->conv_kernel > 16)
		fail(-EINVAL, "config: KDA head dim %u (1..1024) or conv kernel %u (1..16) unsupported",
		     c->kda_head_dim, c->conv_kernel);
	for (uint32_t l = 0; l < c->n_layers; l++) {
		if (c->attn_kind[l] != K3_PROV_ATTN_KDA && c->attn_kind[l] != K3_PROV_ATTN_MLA)
			fail(-EINVAL, "config: layer %u attention kind %u", l, c->attn_kind[l]);
		if (c->ffn_kind[l] != K3_PROV_FFN_DENSE && c->ffn_kind[l] != K3_PROV_FFN_MOE)
			fail(-EINVAL, "config: layer %u ffn kind %u", l, c->ffn_kind[l]);
		if (c->ffn_kind[l] == K3_PROV_FFN_MOE && (!c->n_experts || !c->top_k || !c->latent))
			fail(-EINVAL, "config: layer %u is MoE without experts/latent", l);
	}
}

void open_layer(Model &m, uint32_t l, const k3_prov_layer_weights &w)
{
	const k3_prov_config &c = m.cfg;
	Layer &L = m.layers[l];
	uint32_t D = c.hidden, P = m.P;
	L.attn = c.attn_kind[l];
	L.ffn = c.ffn_kind[l];
	L.input_norm = get_vec(m, w.input_norm, D, false, "input_layernorm", l);
	L.post_norm = get_vec(m, w.post_attn_norm, D, false, "post_attention_layernorm", l);
	if (l > 0)
		L.attn_u = get_mix(m, w.attn_res_norm, w.attn_res_proj,
				   "self_attention_res_{norm,proj}", l);
	L.mlp_u = get_mix(m, w.mlp_res_norm, w.mlp_res_proj, "mlp_res_{norm,proj}", l);
	if (L.attn == K3_PROV_ATTN_KDA) {
		uint32_t H = c.kda_heads, dk = c.kda_head_dim, K = c.conv_kernel;
		L.q = get_mat(m, w.q_proj, P, D, "q_proj", l);
		L.k = get_mat(m, w.k_proj, P, D, "k_proj", l);
		L.v = get_mat(m, w.v_proj, P, D, "v_proj", l);
		L.fa = get_mat(m, w.f_a_proj, dk, D, "f_a_proj", l);
		L.fb = get_mat(m, w.f_b_proj, P, dk, "f_b_proj", l);
		L.b = get_mat(m, w.b_proj, H, D, "b_proj", l);
		L.g = get_mat(m, w.g_proj, P, D, "g_proj", l);
		L.o = get_mat(m, w.o_proj, D, P, "o_proj", l);
		const k3_prov_tensor *cv[3] = { &w.q_conv, &w.k_conv, &w.v_conv };
		const char *cn[3] = { "q_conv1d", "k_conv1d", "v_conv1d" };
		for (int i = 0; i < 3; i++)
			L.conv[i] = get_vec(m, *cv[i], P * K, false, cn[i], l).view({P, K});
		/* A_log: stored padded (K3: [128] for 96 heads), first H per head */
		L.a_exp = at::exp(get_vec(m, w.a_log, H, true, "A_log", l).slice(0, 0, H))
				  .contiguous();
		L.dt_bias = get_vec(m, w.dt_bias, P, false, "dt_bias", l).view({H, dk});
		L.o_norm = get_vec(m, w.o_norm, dk, false, "o_norm", l);
	} else {
		uint32_t H = c.mla_heads, nope = c.qk_nope, vh = c.v_head, kvl = c.kv_lora;
		L.qa = get_mat(m, w.q_a_proj, c.q_lora, D, "q_a_proj", l);
		L.qa_norm = get_vec(m, w.q_a_norm, c.q_lora, false, "q_a_layernorm", l);
		L.qb = get_mat(m, w.q_b_proj, H * m.qhd, c.q_lora, "q_b_proj", l);
		L.kva = get_mat(m, w.kv_a_proj, c.kv_lora + c.qk_rope, D, "kv_a_proj_with_mqa", l);
		L.kva_norm = get_vec(m, w.kv_a_norm, kvl, false, "kv_a_layernorm", l);
		L.kvb = get_mat(m, w.kv_b_proj, H * (nope + vh), kvl, "kv_b_proj", l);
		L.g = get_mat(m, w.g_proj, H * vh, D, "g_proj", l);
		L.o = get_mat(m, w.o_proj, D, H * vh, "o_proj", l);
		at::Tensor kvb = L.kvb.view({H, nope + vh, kvl});
		L.wuk = kvb.slice(1, 0, nope).contiguous();
		L.wuv = kvb.slice(1, nope, nope + vh).contiguous();
	}
	uint32_t inter = L.ffn == K3_PROV_FFN_DENSE ? c.dense_inter : c.shared_inter;
	L.mg = get_mat(m, w.mlp_gate, inter, D, "gate_proj", l);
	L.mu = get_mat(m, w.mlp_up, inter, D, "up_proj", l);
	L.md = get_mat(m, w.mlp_down, D, inter, "down_proj", l);
	if (L.ffn == K3_PROV_FFN_MOE) {
		L.router = get_mat(m, w.router, c.n_experts, D, "gate", l);
		at::Tensor rb = get_vec(m, w.router_bias, c.n_experts, false,
					"e_score_correction_bias", l).cpu();
		L.rbias.assign(rb.data_ptr<float>(), rb.data_ptr<float>() + c.n_experts);
		L.ldown = get_mat(m, w.lat_down, c.latent, D, "routed_expert_down_proj", l);
		L.lnorm = get_vec(m, w.lat_norm, c.latent, false, "routed_expert_norm", l);
		L.lup = get_mat(m, w.lat_up, D, c.latent, "routed_expert_up_proj", l);
	}
}

void set_threads(Model &m, uint32_t threads)
{
	if (threads < 1 || threads > 256)
		fail(-EINVAL, "threads %u not in 1..256", threads);
	/* ATen's intra-op pool is per process: the last provider opened
	 * sets it */
	at::set_num_threads((int)threads);
	k3_kern_pool_free(m.pool);
	m.pool = nullptr;
	m.threads = threads;
	if (threads > 1) {
		struct k3_err err = {};
		m.pool = k3_kern_pool_new((int)threads, &err);
		if (!m.pool)
			fail(err.code ? err.code : -ENOMEM, "cannot start %u compute threads", threads);
	}
}

void check_T(const Model &m, uint32_t T)
{
	if (T == 0 || T > m.max_batch)
		fail(-EINVAL, "batch of %u positions not in 1..%u", T, m.max_batch);
}

const Layer &check_layer(const Model &m, uint32_t layer, uint32_t attn, uint32_t ffn)
{
	if (layer >= m.cfg.n_layers)
		fail(-EINVAL, "layer %u out of range (%u layers)", layer, m.cfg.n_layers);
	const Layer &L = m.layers[layer];
	if (attn && L.attn != attn)
		fail(-EINVAL, "layer %u has attention kind %u, not %u", layer, L.attn, attn);
	if (ffn && L.ffn != ffn)
		fail(-EINVAL, "layer %u has ffn kind %u, not %u", layer, L.ffn, ffn);
	return L;
}

/* What an attention entry checks first: T, the layer's attention kind, and
 * that the state (what: "KDA state", "MLA cache") was made for this model
 * and layer. */
template <class State>
const Layer &check_attn(const Model &m, uint32_t layer, uint32_t T, uint32_t attn,
			const State *s, const char *what)
{
	check_T(m, T);
	const Layer &L = check_layer(m, layer, attn, 0);
	if (!s)
		fail(-EINVAL, "no %s for layer %u", what, layer);
	if (s->m != &m || s->layer != layer)
		fail(-EINVAL, "%s of layer %u used for layer %u", what, s->layer, layer);
	return L;
}

}  // namespace

at::Tensor linear(const Model &m, const at::Tensor &x, const at::Tensor &W)
{
	if (!m.per_row)
		return at::mm(x, W.t());
	int64_t T = x.size(0);
	at::Tensor y = at::empty({T, W.size(0)}, m.f32);
	for (int64_t t = 0; t < T; t++) {
		at::Tensor yt = y.select(0, t);
		at::mv_out(yt, W, x.select(0, t));
	}
	return y;
}

at::Tensor rmsnorm(const at::Tensor &x, const at::Tensor &w, float eps)
{
	return x * at::rsqrt((x * x).mean(-1, true) + eps) * w;
}

at::Tensor situ(const Model &m, const at::Tensor &g, const at::Tensor &u)
{
	float b1 = m.cfg.situ_beta1, b2 = m.cfg.situ_beta2;
	at::Tensor a = at::tanh(g / b1) * b1 * at::sigmoid(g);
	return b2 > 0.0f ? a * (at::tanh(u / b2) * b2) : a * u;
}

at::Tensor in(const Model &m, const float *x, int64_t rows, int64_t cols)
{
	at::Tensor t = at::from_blob(const_cast<float *>(x), {rows, cols},
				     at::TensorOptions().dtype(at::kFloat));
	return m.dev.is_cpu() ? t : t.to(m.dev);
}

void put(float *out, const at::Tensor &y, uint32_t flags)
{
	at::Tensor h = y.to(at::kCPU).contiguous();
	const float *p = h.data_ptr<float>();
	size_t n = (size_t)h.numel();
	if (flags & K3_PROV_OUT_ACCUMULATE)
		for (size_t i = 0; i < n; i++)
			out[i] += p[i];
	else
		memcpy(out, p, n * sizeof(float));
}

}  // namespace k3t

using namespace k3t;

extern "C" K3_TORCH_EXPORT int k3_torch_cuda_devices(void)
{
	return cuda_devices();
}

namespace {

void t_close(k3_prov_model *m)
{
	delete m;
}

int t_open(const k3_prov_open_args *a, k3_prov_model **out, k3_prov_status *st)
{
	*out = nullptr;
	k3_prov_model *m = nullptr;
	int rc = guard(st, [&] {
		if (!a || a->struct_size < sizeof(*a))
			fail(-EPROTO, "open args struct too small");
		if (!a->config || !a->weights)
			fail(-EINVAL, "open args: config and weights are required");
		check_config(a->config);
		const k3_prov_weights *w = a->weights;
		if (w->struct_size < sizeof(*w) || w->n_layers != a->config->n_layers || !w->layers)
			fail(-EINVAL, "weights: %u layers for a %u-layer config", w->n_layers,
			     a->config->n_layers);
		if (!a->max_batch || a->max_batch > 65536)
			fail(-EINVAL, "max_batch %u not in 1..65536", a->max_batch);
		if (a->flags & K3_PROV_OPEN_REFERENCE)
			fail(-EINVAL, "the torch provider has no scalar reference path (use --provider cpu)");
		m = new k3_prov_model();
		m->cfg = *a->config;
		m->max_batch = a->max_batch;
		m->split_all = (a->flags & K3_PROV_OPEN_SPLIT_ALL) != 0;
		const char *batched = getenv("K3_TORCH_BATCHED");
		m->per_row = !(batched && strcmp(batched, "1") == 0);
		if (cuda_devices() > 0)
			m->dev = at::Device(at::kCUDA, 0);
		m->f32 = at::TensorOptions().dtype(at::kFloat).device(m->dev);
		const k3_prov_config &c = m->cfg;
		m->P = c.kda_heads * c.kda_head_dim;
		m->qhd = c.qk_nope + c.qk_rope;
		set_threads(*m, a->threads ? a->threads
				: (uint32_t)k3_kern_pool_default_threads());
		uint32_t D = c.hidden;
		const k3_prov_tensor &e = w->embed;
		if ((e.dtype != K3_PROV_DTYPE_BF16 && e.dtype != K3_PROV_DTYPE_F32) || !e.data ||
		    e.ndim != 2 || e.shape[0] != c.vocab || e.shape[1] != D ||
		    (uintptr_t)e.data % (e.dtype == K3_PROV_DTYPE_BF16 ? 2 : 4))
			fail(-EINVAL, "tensor 'embed_tokens': want [%u, %u] bf16/f32", c.vocab, D);
		m->embed = e.data;
		m->embed_dtype = e.dtype;
		m->lm_head = get_mat(*m, w->lm_head, c.vocab, D, "lm_head", 0);
		m->norm = get_vec(*m, w->norm, D, false, "model.norm", 0);
		m->out_u = get_mix(*m, w->out_res_norm, w->out_res_proj,
				   "output_attn_res_{norm,proj}", 0);
		m->layers.resize(c.n_layers);
		for (uint32_t l = 0; l < c.n_layers; l++)
			open_layer(*m, l, w->layers[l]);
		uint64_t tier = UINT64_MAX;
		if (a->struct_size >= offsetof(k3_prov_open_args, expert_tier_bytes) +
					      sizeof(a->expert_tier_bytes))
			tier = a->expert_tier_bytes;
		experts_open(*m, tier);
	});
	if (rc) {
		delete m;
		return rc;
	}
	*out = m;
	return 0;
}

int t_kda_state_new(k3_prov_model *m, uint32_t layer, k3_prov_kda_state **out,
		    k3_prov_status *st)
{
	*out = nullptr;
	return guard(st, [&] {
		if (layer >= m->cfg.n_layers || m->cfg.attn_kind[layer] != K3_PROV_ATTN_KDA)
			fail(-EINVAL, "layer %u is not a KDA layer", layer);
		auto *s = new k3_prov_kda_state();
		s->m = m;
		s->layer = layer;
		int64_t K = m->cfg.conv_kernel, dk = m->cfg.kda_head_dim;
		s->win = at::zeros({3, K - 1, (int64_t)m->P}, m->f32);
		s->S = at::zeros({(int64_t)m->cfg.kda_heads, dk, dk}, m->f32);
		*out = s;
	});
}

void t_kda_state_free(k3_prov_kda_state *s)
{
	delete s;
}

void t_kda_state_reset(k3_prov_kda_state *s)
{
	(void)guard(nullptr, [&] {
		s->win.zero_();
		s->S.zero_();
	});
}

int t_kda_state_copy(k3_prov_kda_state *dst, const k3_prov_kda_state *src, k3_prov_status *st)
{
	return guard(st, [&] {
		if (dst->m != src->m || dst->layer != src->layer)
			fail(-EINVAL, "KDA state copy across layers %u -> %u", src->layer, dst->layer);
		dst->win.copy_(src->win);
		dst->S.copy_(src->S);
	});
}

void mla_reserve(MlaCache &c, uint32_t need)
{
	if (need <= c.cap)
		return;
	uint64_t cap = c.cap ? c.cap : 16;
	while (cap < need)
		cap *= 2;
	if (cap > (1u << 24))
		fail(-E2BIG, "MLA cache of %u tokens exceeds the limit of %u", need, 1u << 24);
	at::Tensor rows = at::empty({(int64_t)cap, (int64_t)c.row}, c.m->f32);
	if (c.len)
		rows.slice(0, 0, c.len).copy_(c.rows.slice(0, 0, c.len));
	c.rows = rows;
	c.cap = (uint32_t)cap;
}

int t_mla_cache_new(k3_prov_model *m, uint32_t layer, uint32_t capacity, k3_prov_mla_cache **out,
		    k3_prov_status *st)
{
	*out = nullptr;
	return guard(st, [&] {
		if (layer >= m->cfg.n_layers || m->cfg.attn_kind[layer] != K3_PROV_ATTN_MLA)
			fail(-EINVAL, "layer %u is not an MLA layer", layer);
		std::unique_ptr<k3_prov_mla_cache> c(new k3_prov_mla_cache());
		c->m = m;
		c->layer = layer;
		c->row = m->cfg.kv_lora + m->cfg.qk_rope;
		mla_reserve(*c, capacity ? capacity : 16);
		*out = c.release();
	});
}

void t_mla_cache_free(k3_prov_mla_cache *c)
{
	delete c;
}

uint32_t t_mla_cache_len(const k3_prov_mla_cache *c)
{
	return c->len;
}

void t_mla_cache_truncate(k3_prov_mla_cache *c, uint32_t n)
{
	if (n < c->len)
		c->len = n;
}

int t_mla_cache_copy(k3_prov_mla_cache *dst, const k3_prov_mla_cache *src, k3_prov_status *st)
{
	return guard(st, [&] {
		if (dst->m != src->m || dst->layer != src->layer)
			fail(-EINVAL, "MLA cache copy across layers %u -> %u", src->layer, dst->layer);
		mla_reserve(*dst, src->len);
		if (src->len)
			dst->rows.slice(0, 0, src->len).copy_(src->rows.slice(0, 0, src->len));
		dst->len = src->len;
	});
}

int t_embed(k3_prov_model *m, const int32_t *ids, uint32_t T, float *out, k3_prov_status *st)
{
	return guard(st, [&] {
		uint32_t D = m->cfg.hidden;
		for (uint32_t t = 0; t < T; t++) {
			if (ids[t] < 0 || (uint32_t)ids[t] >= m->cfg.vocab)
				fail(-EINVAL, "token id %d not in 0..%u", ids[t], m->cfg.vocab - 1);
			size_t off = (size_t)ids[t] * D;
			float *o = out + (size_t)t * D;
			if (m->embed_dtype == K3_PROV_DTYPE_BF16) {
				const uint16_t *e = (const uint16_t *)m->embed + off;
				for (uint32_t d = 0; d < D; d++) {
					uint32_t u = (uint32_t)e[d] << 16;
					memcpy(&o[d], &u, 4);
				}
			} else {
				memcpy(o, (const float *)m->embed + off, D * sizeof(float));
			}
		}
	});
}

int t_attnres_mix(k3_prov_model *m, uint32_t site, uint32_t layer, const float *const *cands,
		  uint32_t n, uint32_t T, float *out, k3_prov_status *st)
{
	return guard(st, [&] {
		if (n == 0 || n > K3_KERN_ATTNRES_MAX_CAND)
			fail(-EINVAL, "AttnRes mix of %u candidates not in 1..%d", n,
			     K3_KERN_ATTNRES_MAX_CAND);
		check_T(*m, T);
		at::Tensor u;
		if (site == K3_PROV_MIX_OUTPUT) {
			u = m->out_u;
		} else {
			const Layer &L = check_layer(*m, layer, 0, 0);
			u = site == K3_PROV_MIX_ATTN ? L.attn_u : site == K3_PROV_MIX_MLP ? L.mlp_u
											    : at::Tensor();
			if (!u.defined())
				fail(-EINVAL, "layer %u has no AttnRes site %u", layer, site);
		}
		int64_t D = m->cfg.hidden;
		by_rows(*m, T, [&](uint32_t t0, uint32_t nt) {
			std::vector<at::Tensor> cs;
			for (uint32_t j = 0; j < n; j++)
				cs.push_back(in(*m, cands[j] + (size_t)t0 * D, nt, D));
			at::Tensor C = at::stack(cs, 0);             /* [n][nt][D] */
			/* spec §4.2: keys RMS-normalized without the weight
			 * (folded in u), values the raw candidates */
			at::Tensor r = at::rsqrt((C * C).mean(-1, true) + m->cfg.rms_eps);
			at::Tensor s = ((C * r) * u).sum(-1);        /* [n][nt] */
			at::Tensor p = at::softmax(s, 0).unsqueeze(-1);
			put(out + (size_t)t0 * D, (p * C).sum(0), 0);
		});
	});
}

/* Short causal conv + SiLU of T positions for one stream (spec §5.2):
 * win [K-1][P] holds the raw inputs before them, x [T][P]; y[t] = silu(sum_j
 * w[:, j] x_{t-K+1+j}) with the taps summed j ascending; win := the last
 * K-1 rows of [win; x]. */
at::Tensor conv_silu(at::Tensor &win, const at::Tensor &w, const at::Tensor &x)
{
	int64_t K = w.size(1), T = x.size(0);
	at::Tensor X = at::cat({win, x}, 0);                  /* [K-1+T][P] */
	at::Tensor acc = X.slice(0, 0, T) * w.select(1, 0);
	for (int64_t j = 1; j < K; j++)
		acc = acc + X.slice(0, j, j + T) * w.select(1, j);
	win.copy_(X.slice(0, T, T + K - 1));
	return at::silu(acc);
}

int t_kda(k3_prov_model *m, uint32_t layer, const float *h, uint32_t T, k3_prov_kda_state *s,
	  float *out, uint32_t flags, k3_prov_status *st)
{
	return guard(st, [&] {
		const Layer &L = check_attn(*m, layer, T, K3_PROV_ATTN_KDA, s, "KDA state");
		const k3_prov_config &c = m->cfg;
		int64_t H = c.kda_heads, dk = c.kda_head_dim, D = c.hidden;
		/* the state carries from one piece to the next: T pieces of
		 * one position are the same recurrence as one piece of T */
		by_rows(*m, T, [&](uint32_t t0, uint32_t nt) {
			int64_t T = nt;
			at::Tensor x = rmsnorm(in(*m, h + (size_t)t0 * D, T, D), L.input_norm, c.rms_eps);
			at::Tensor qp = linear(*m, x, L.q), kp = linear(*m, x, L.k), vp = linear(*m, x, L.v);
			at::Tensor gz = linear(*m, x, L.g), bl = linear(*m, x, L.b);
			at::Tensor f = linear(*m, linear(*m, x, L.fa), L.fb).view({T, H, dk});
			at::Tensor wq = s->win.select(0, 0), wk = s->win.select(0, 1), wv = s->win.select(0, 2);
			at::Tensor q = conv_silu(wq, L.conv[0], qp).view({T, H, dk});
			at::Tensor k = conv_silu(wk, L.conv[1], kp).view({T, H, dk});
			at::Tensor v = conv_silu(wv, L.conv[2], vp).view({T, H, dk});
			/* spec §5.3: L2 norms (sum of squares, 1e-6 inside), 1/sqrt(dk) on q */
			q = q * at::rsqrt((q * q).sum(-1, true) + 1e-6f) * (1.0f / std::sqrt((float)dk));
			k = k * at::rsqrt((k * k).sum(-1, true) + 1e-6f);
			at::Tensor beta = at::sigmoid(bl);                   /* [T][H] */
			at::Tensor alpha = at::exp(c.gate_lower_bound *
						   at::sigmoid(L.a_exp.view({1, H, 1}) * (f + L.dt_bias)));
			/* spec §5.4, one position at a time: decay, predict from the
			 * decayed state, write, read from the updated state */
			at::Tensor S = s->S;
			at::Tensor o = at::empty({T, H, dk}, m->f32);
			for (int64_t t = 0; t < T; t++) {
				at::Tensor kt = k.select(0, t), qt = q.select(0, t);   /* [H][dk] */
				S.mul_(alpha.select(0, t).unsqueeze(2));
				at::Tensor pred = at::bmm(kt.unsqueeze(1), S).squeeze(1);      /* [H][dv] */
				at::Tensor u = (v.select(0, t) - pred) * beta.select(0, t).unsqueeze(1);
				S.add_(kt.unsqueeze(2) * u.unsqueeze(1));
				o.select(0, t).copy_(at::bmm(qt.unsqueeze(1), S).squeeze(1));
			}
			/* spec §5.6: per-head gated RMSNorm */
			at::Tensor z = rmsnorm(o, L.o_norm, c.rms_eps) * at::sigmoid(gz.view({T, H, dk}));
			put(out + (size_t)t0 * D, linear(*m, z.reshape({T, H * dk}), L.o), flags);
		});
	});
}

int t_mla(k3_prov_model *m, uint32_t layer, const float *h, uint32_t T, k3_prov_mla_cache *cache,
	  float *out, uint32_t flags, k3_prov_status *st)
{
	return guard(st, [&] {
		const Layer &L = check_attn(*m, layer, T, K3_PROV_ATTN_MLA, cache, "MLA cache");
		mla_reserve(*cache, cache->len + T);
		const k3_prov_config &c = m->cfg;
		int64_t H = c.mla_heads, kvl = c.kv_lora, rope = c.qk_rope, nope = c.qk_nope;
		int64_t vh = c.v_head, qhd = m->qhd, D = c.hidden;
		float scale = 1.0f / std::sqrt((float)qhd);
		by_rows(*m, T, [&](uint32_t t0, uint32_t nt) {
			int64_t T = nt;
			at::Tensor x = rmsnorm(in(*m, h + (size_t)t0 * D, T, D), L.input_norm, c.rms_eps);
			at::Tensor cq = rmsnorm(linear(*m, x, L.qa), L.qa_norm, c.mla_norm_eps);
			at::Tensor ckv = linear(*m, x, L.kva), gz = linear(*m, x, L.g);
			at::Tensor Q = linear(*m, cq, L.qb).view({T, H, qhd});
			uint32_t len0 = cache->len;
			at::Tensor dst = cache->rows.slice(0, len0, len0 + T);
			dst.slice(1, 0, kvl).copy_(rmsnorm(ckv.slice(1, 0, kvl), L.kva_norm, c.mla_norm_eps));
			dst.slice(1, kvl, kvl + rope).copy_(ckv.slice(1, kvl, kvl + rope));
			cache->len = len0 + T;
			at::Tensor att = at::empty({T, H, vh}, m->f32);
			for (int64_t t = 0; t < T; t++) {
				int64_t n = len0 + t + 1;                /* causal: rows 0..len0+t */
				at::Tensor Qt = Q.select(0, t);          /* [H][qhd] */
				/* spec §6.5, absorbed: qa_h = WUK_h^T qn_h, scores against
				 * [c | kr] of every cached row, cbar_h = sum_s p(s) c(s),
				 * o_h = WUV_h cbar_h */
				at::Tensor qa = at::bmm(Qt.slice(1, 0, nope).unsqueeze(1), L.wuk).squeeze(1);
				at::Tensor q = at::cat({qa, Qt.slice(1, nope, qhd)}, 1);     /* [H][row] */
				at::Tensor rows = cache->rows.slice(0, 0, n);
				at::Tensor p = at::softmax(at::mm(q, rows.t()) * scale, 1);  /* [H][n] */
				at::Tensor cbar = at::mm(p, rows.slice(1, 0, kvl));           /* [H][kvl] */
				att.select(0, t).copy_(at::bmm(L.wuv, cbar.unsqueeze(2)).squeeze(2));
			}
			/* spec §6.3: output gate before o_proj */
			at::Tensor o = att.reshape({T, H * vh}) * at::sigmoid(gz);
			put(out + (size_t)t0 * D, linear(*m, o, L.o), flags);
		});
	});
}

/* A row-wise op of one layer: the checks (T, the layer), then
 * body(L, t0, nt, D) over the positions as by_rows splits them. */
template <class Body>
int layer_rows(k3_prov_model *m, uint32_t layer, uint32_t T, k3_prov_status *st, Body body)
{
	return guard(st, [&] {
		check_T(*m, T);
		const Layer &L = check_layer(*m, layer, 0, 0);
		size_t D = m->cfg.hidden;
		by_rows(*m, T, [&](uint32_t t0, uint32_t nt) { body(L, t0, nt, D); });
	});
}

int t_ffn_norm(k3_prov_model *m, uint32_t layer, const float *h2, uint32_t T, float *x,
	       k3_prov_status *st)
{
	return layer_rows(m, layer, T, st, [&](const Layer &L, uint32_t t0, uint32_t nt, size_t D) {
		put(x + t0 * D, rmsnorm(in(*m, h2 + t0 * D, nt, D), L.post_norm, m->cfg.rms_eps), 0);
	});
}

int t_router(k3_prov_model *m, uint32_t layer, const float *x, uint32_t T, uint32_t *ids,
	     float *weights, k3_prov_status *st)
{
	return guard(st, [&] {
		check_T(*m, T);
		const Layer &L = check_layer(*m, layer, 0, K3_PROV_FFN_MOE);
		const k3_prov_config &c = m->cfg;
		uint32_t K = c.top_k;
		at::Tensor lg = linear(*m, in(*m, x, T, c.hidden), L.router).to(at::kCPU).contiguous();
		/* (a product only: at::mv per position in per_row mode) */
		/* sigmoid, biased selection (ties: lowest id) and the weights on
		 * the host with the project's kernel: the ids go to the engine */
		for (uint32_t t = 0; t < T; t++) {
			int32_t idx[64];
			int rc = k3_kern_router_topk(c.n_experts, lg.data_ptr<float>() + (size_t)t * c.n_experts,
						     L.rbias.data(), K, c.moe_renormalize && K > 1,
						     c.routed_scale, idx, weights + (size_t)t * K, nullptr);
			if (rc)
				fail(rc, "layer %u: router top-%u failed", layer, K);
			for (uint32_t j = 0; j < K; j++)
				ids[(size_t)t * K + j] = (uint32_t)idx[j];
		}
	});
}

void check_routed(const Model &m, uint32_t layer, uint32_t T, const uint32_t *ids)
{
	check_T(m, T);
	check_layer(m, layer, 0, K3_PROV_FFN_MOE);
	for (size_t i = 0; i < (size_t)T * m.cfg.top_k; i++)
		if (ids[i] >= m.cfg.n_experts)
			fail(-EINVAL, "layer %u: expert slot %zu has id %u >= %u", layer, i, ids[i],
			     m.cfg.n_experts);
}

int t_routed_experts(k3_prov_model *m, uint32_t layer, const float *x, uint32_t T,
		     const uint32_t *ids, const float *weights, const k3_prov_expert *experts,
		     float *out, k3_prov_status *st)
{
	return guard(st, [&] {
		check_routed(*m, layer, T, ids);
		m->r.open = false;
		routed_begin(*m, layer, x, T, ids);
		size_t TK = (size_t)T * m->cfg.top_k;
		for (size_t i = 0; i < TK; i++) {
			if (m->r.done[i])
				continue;
			const k3_prov_expert *sp = &experts[i];
			routed_expert(*m, layer, ids[i], sp->w1_packed ? sp : nullptr);
		}
		routed_end(*m, layer, weights, out, false);
	});
}

int t_routed_begin(k3_prov_model *m, uint32_t layer, const float *x, uint32_t T,
		   const uint32_t *ids, k3_prov_status *st)
{
	return guard(st, [&] {
		check_routed(*m, layer, T, ids);
		routed_begin(*m, layer, x, T, ids);
	});
}

int t_routed_expert(k3_prov_model *m, uint32_t layer, uint32_t expert, const k3_prov_expert *span,
		    k3_prov_status *st)
{
	return guard(st, [&] {
		if (!m->r.open || layer != m->r.layer)
			fail(-EINVAL, "layer %u: routed_expert outside routed_begin..end", layer);
		routed_expert(*m, layer, expert, span);
	});
}

/* routed_end, or with partial routed_partial: the open layer's sum. */
int routed_finish(k3_prov_model *m, uint32_t layer, const float *weights, float *out,
		  bool partial, k3_prov_status *st)
{
	return guard(st, [&] {
		if (!m->r.open || layer != m->r.layer)
			fail(-EINVAL, "layer %u: %s", layer, partial ? "routed_partial outside "
			     "routed_begin..end" : "routed_end without routed_begin");
		routed_end(*m, layer, weights, out, partial);
	});
}

int t_routed_end(k3_prov_model *m, uint32_t layer, const float *weights, float *out,
		 k3_prov_status *st)
{
	return routed_finish(m, layer, weights, out, false, st);
}

int t_routed_partial(k3_prov_model *m, uint32_t layer, const float *weights, float *out,
		     k3_prov_status *st)
{
	return routed_finish(m, layer, weights, out, true, st);
}

int t_experts_resident(k3_prov_model *m, uint32_t layer, const uint32_t *ids, size_t n,
		       uint8_t *resident, k3_prov_status *st)
{
	return guard(st, [&] {
		check_layer(*m, layer, 0, K3_PROV_FFN_MOE);
		for (size_t i = 0; i < n; i++)
			if (ids[i] >= m->cfg.n_experts)
				fail(-EINVAL, "layer %u: expert id %u >= %u", layer, ids[i],
				     m->cfg.n_experts);
		experts_resident(*m, layer, ids, n, resident);
	});
}

int t_mlp(k3_prov_model *m, uint32_t layer, const float *x, uint32_t T, float *out,
	  k3_prov_status *st)
{
	return layer_rows(m, layer, T, st, [&](const Layer &L, uint32_t t0, uint32_t nt, size_t D) {
		at::Tensor xt = in(*m, x + t0 * D, nt, D);
		at::Tensor a = situ(*m, linear(*m, xt, L.mg), linear(*m, xt, L.mu));
		put(out + t0 * D, linear(*m, a, L.md), 0);
	});
}

int t_add(k3_prov_model *m, float *dst, const float *src, size_t n, k3_prov_status *st)
{
	(void)m;
	(void)st;
	/* host arrays: the same elementwise sum as every provider */
	for (size_t i = 0; i < n; i++)
		dst[i] += src[i];
	return 0;
}

int t_logits(k3_prov_model *m, const float *z, uint32_t T, float *out, k3_prov_status *st)
{
	return guard(st, [&] {
		check_T(*m, T);
		size_t D = m->cfg.hidden, V = m->cfg.vocab;
		by_rows(*m, T, [&](uint32_t t0, uint32_t nt) {
			at::Tensor y = rmsnorm(in(*m, z + t0 * D, nt, D), m->norm, m->cfg.rms_eps);
			put(out + t0 * V, linear(*m, y, m->lm_head), 0);
		});
	});
}

int t_set_threads(k3_prov_model *m, uint32_t threads, k3_prov_status *st)
{
	return guard(st, [&] { set_threads(*m, threads); });
}

}  // namespace

extern "C" K3_TORCH_EXPORT const struct k3_provider k3_provider_torch = {
	.abi_version = K3_PROVIDER_ABI_VERSION,
	.struct_size = sizeof(struct k3_provider),
	.name = "torch",
	.open = t_open,
	.close = t_close,
	.kda_state_new = t_kda_state_new,
	.kda_state_free = t_kda_state_free,
	.kda_state_reset = t_kda_state_reset,
	.kda_state_copy = t_kda_state_copy,
	.mla_cache_new = t_mla_cache_new,
	.mla_cache_free = t_mla_cache_free,
	.mla_cache_len = t_mla_cache_len,
	.mla_cache_truncate = t_mla_cache_truncate,
	.mla_cache_copy = t_mla_cache_copy,
	.embed = t_embed,
	.attnres_mix = t_attnres_mix,
	.kda = t_kda,
	.mla = t_mla,
	.ffn_norm = t_ffn_norm,
	.router = t_router,
	.routed_experts = t_routed_experts,
	.mlp = t_mlp,
	.add = t_add,
	.logits = t_logits,
	.set_threads = t_set_threads,
	.routed_begin = t_routed_begin,
	.routed_expert = t_routed_expert,
	.routed_end = t_routed_end,
	.routed_partial = t_routed_partial,
	/* no streamed spine, no KDA record/replay (the engine snapshots the
	 * state for verification instead), no state export */
	.bind_layer = nullptr,
	.bind_head = nullptr,
	.embed_rows = nullptr,
	.kda_record_new = nullptr,
	.kda_record_free = nullptr,
	.kda_verify = nullptr,
	.kda_replay = nullptr,
	.kda_state_export = nullptr,
	.mla_cache_export = nullptr,
	.experts_resident = t_experts_resident,
};

/*
 * torch_experts.cpp - the torch provider's routed experts (spec §8.2):
 * the latent down projection, the weighted sum, the routed-expert norm and
 * the up projection through ATen; the MXFP4 expert products through the
 * project's own exact kernels, kernels/ on the host and kernels/cuda on a
 * device (torch_cuda.cpp), never a dequantized fp32 copy.
 *
 * The VRAM expert tier (providers/vram) keeps experts on the device across
 * steps. On the CPU there is no device memory to gain, so the tier runs
 * over host memory (vram_host.h) only when a budget is given: the same
 * plan/load/evict path, used by the tests to drive it end to end.
 *
 * A slot = one (position, k) pair of the call's ids[T][top_k]; the slots
 * of one expert are computed together, as rows of one product, in the
 * order routed_expert receives the experts; routed_end sums in route order
 * k = 0..top_k-1, so arrival order never changes a bit.
 */
#include "torch/torch_internal.h"

#include <cerrno>
#include <cstring>

extern "C" {
#include "base/log.h"
}

namespace k3t {

namespace {

uint64_t array_bytes(const k3_prov_config &c, int a)
{
	uint64_t n = (uint64_t)c.moe_inter * c.latent;   /* every expert matrix */
	return a % 2 == 0 ? n / 2 : n / 32;
}

/* The tier failed or refused: experts run without it from now on. */
void tier_off(Model &m, const char *why)
{
	if (!m.tier_warned)
		k3_log_warning("torch provider: VRAM expert tier off (%s); routed experts run %s "
			       "for the rest of this session", why,
			       m.dev.is_cpu() ? "without it" : "on the CPU");
	m.tier_warned = true;
	k3_vram_free(m.tier);
	m.tier = nullptr;
}

/* Slots of `expert` not yet computed: marks them done, gathers their
 * down-projected inputs into gx rows from r.rows on; returns how many. */
uint32_t gather(Model &m, uint32_t expert)
{
	Routed &r = m.r;
	uint32_t lat = m.cfg.latent, K = m.cfg.top_k, n = 0;
	size_t TK = (size_t)r.T * K;
	for (size_t j = 0; j < TK; j++) {
		if (r.done[j] || r.ids[j] != expert)
			continue;
		r.done[j] = 1;
		r.row_of[j] = r.rows + n;
		memcpy(&r.gx[(size_t)(r.rows + n) * lat], &r.z[(j / K) * lat], lat * sizeof(float));
		n++;
	}
	return n;
}

/* W1/W3, SiTU, W2 of rows [first, first + n) on the host (spec §7.1,
 * §8.2), from the six arrays w[] (a span or a host-tier slot). */
void host_rows(Model &m, const uint8_t *const w[K3_VRAM_ARRAYS], uint32_t first, uint32_t n)
{
	const k3_prov_config &c = m.cfg;
	Routed &r = m.r;
	size_t lat = c.latent, I = c.moe_inter;
	k3_kern_mat w1 = { K3_KERN_DT_MXFP4, I, lat, 0, w[0], w[1], nullptr };
	k3_kern_mat w3 = { K3_KERN_DT_MXFP4, I, lat, 0, w[2], w[3], nullptr };
	k3_kern_mat w2 = { K3_KERN_DT_MXFP4, lat, I, 0, w[4], w[5], nullptr };
	float *gx = &r.gx[first * lat], *g = &r.g[first * I], *u = &r.u[first * I];
	k3_kern_matmul_job jobs[2] = {
		{ &w1, 0, I, n, gx, lat, g, I },
		{ &w3, 0, I, n, gx, lat, u, I },
	};
	if (k3_kern_matmul_many(m.pool, 2, jobs))
		fail(-EINVAL, "expert product W1/W3 refused (shape)");
	auto opt = at::TensorOptions().dtype(at::kFloat);
	by_rows(m, n, [&](uint32_t r0, uint32_t nr) {
		at::Tensor gt = at::from_blob(g + r0 * I, {(int64_t)nr, (int64_t)I}, opt);
		at::Tensor ut = at::from_blob(u + r0 * I, {(int64_t)nr, (int64_t)I}, opt);
		gt.copy_(situ(m, gt, ut));
	});
	if (k3_kern_matmul(m.pool, &w2, 0, lat, n, g, I, &r.y[first * lat], lat))
		fail(-EINVAL, "expert product W2 refused (shape)");
}

}  // namespace

void experts_open(Model &m, uint64_t budget)
{
	const k3_prov_config &c = m.cfg;
	size_t slots = (size_t)m.max_batch * (c.top_k ? c.top_k : 1);
	size_t w = c.latent > c.moe_inter ? c.latent : c.moe_inter;
	Routed &r = m.r;
	r.done.assign(slots, 0);
	r.row_of.assign(slots, 0);
	r.z.assign((size_t)m.max_batch * c.latent, 0.0f);
	r.gx.assign(slots * c.latent, 0.0f);
	r.g.assign(slots * w, 0.0f);
	r.u.assign(slots * w, 0.0f);
	r.y.assign(slots * c.latent, 0.0f);
	if (!c.n_experts || budget == UINT64_MAX || (m.dev.is_cpu() && budget == 0))
		return;
	if (!m.dev.is_cpu()) {
#if K3_TORCH_CUDA
		if (!dx_open(m, budget))
			m.tier_warned = true;   /* dx_open said why */
#else
		/* a device tier needs the CUDA expert kernels (torch_cuda.cpp) */
		tier_off(m, "this build has no CUDA expert kernels (kernels/cuda)");
#endif
		return;
	}
	m.host_dev.total_bytes = budget;
	k3_vram_host_dev(&m.host_dev, &m.tier_dev);
	k3_vram_config vc = {};
	vc.budget_bytes = budget;
	for (int a = 0; a < K3_VRAM_ARRAYS; a++)
		vc.array_bytes[a] = array_bytes(c, a);
	vc.n_layers = c.n_layers;
	vc.n_experts = c.n_experts;
	vc.copy_pool = m.pool;
	struct k3_err err = {};
	if (k3_vram_new(&m.tier_dev, &vc, &m.tier, &err)) {
		tier_off(m, err.msg);
		return;
	}
	k3_vram_layout(vc.array_bytes, m.tier_off);
}

void experts_close(Model &m)
{
#if K3_TORCH_CUDA
	dx_close(m);
#endif
	k3_vram_free(m.tier);
	m.tier = nullptr;
	k3_kern_pool_free(m.pool);
	m.pool = nullptr;
}

void experts_resident(Model &m, uint32_t layer, const uint32_t *ids, size_t n, uint8_t *res)
{
	memset(res, 0, n);
	if (!m.tier)
		return;
	struct k3_err err = {};
	if (k3_vram_plan(m.tier, layer, ids, n, res, &err) < 0) {
		if (err.code == -EINVAL)
			fail(-EINVAL, "%s", err.msg);
		memset(res, 0, n);
		tier_off(m, err.msg);
	}
}

void routed_begin(Model &m, uint32_t layer, const float *x, uint32_t T, const uint32_t *ids)
{
#if K3_TORCH_CUDA
	if (m.dx && m.tier)
		return dx_begin(m, layer, x, T, ids);
#endif
	const k3_prov_config &c = m.cfg;
	Routed &r = m.r;
	const Layer &L = m.layers[layer];
	size_t TK = (size_t)T * c.top_k;
	at::Tensor z = linear(m, in(m, x, T, c.hidden), L.ldown).to(at::kCPU).contiguous();
	memcpy(r.z.data(), z.data_ptr<float>(), (size_t)T * c.latent * sizeof(float));
	/* rows not computed take part in a partial sum with weight 0 */
	std::fill(r.y.begin(), r.y.begin() + TK * c.latent, 0.0f);
	routed_open(m, layer, T, ids, false);
}

void routed_open(Model &m, uint32_t layer, uint32_t T, const uint32_t *ids, bool device)
{
	Routed &r = m.r;
	memset(r.done.data(), 0, (size_t)T * m.cfg.top_k);
	r.ids = ids;
	r.layer = layer;
	r.T = T;
	r.rows = 0;
	r.open = true;
	r.device = device;
}

void routed_expert(Model &m, uint32_t layer, uint32_t expert, const k3_prov_expert *span)
{
	Routed &r = m.r;
	if (span && (!span->w1_packed || !span->w1_scale || !span->w3_packed || !span->w3_scale ||
		     !span->w2_packed || !span->w2_scale))
		fail(-EINVAL, "layer %u: expert %u has an incomplete span", layer, expert);
#if K3_TORCH_CUDA
	if (r.device) {
		try {
			return dx_expert(m, layer, expert, span);
		} catch (const Fail &f) {
			/* this call fails; later ones run the experts on the CPU */
			if (f.code != -EINVAL && m.tier && k3_vram_failed(m.tier, nullptr, nullptr))
				tier_off(m, f.msg.c_str());
			throw;
		}
	}
#endif
	int slot = -1;
	struct k3_err err = {};
	if (m.tier) {
		slot = span ? -1 : k3_vram_find(m.tier, layer, expert);
		if (span && k3_vram_load(m.tier, layer, expert, span, &slot, &err) != 0) {
			if (err.code == -EINVAL)
				fail(-EINVAL, "%s", err.msg);
			tier_off(m, err.msg);
			slot = -1;
		}
		if (slot >= 0 && m.tier && k3_vram_wait_slot(m.tier, slot, &err) != 0) {
			tier_off(m, err.msg);
			slot = -1;
		}
	}
	if (!span && slot < 0)
		fail(-EINVAL, "layer %u: expert %u has no span and is not resident", layer, expert);
	uint32_t first = r.rows;
	uint32_t n = gather(m, expert);
	if (n == 0)
		fail(-EINVAL, "layer %u: expert %u has no slot left in this call", layer, expert);
	r.rows += n;
	const uint8_t *w[K3_VRAM_ARRAYS];
	if (slot >= 0) {
		const uint8_t *base = (const uint8_t *)k3_vram_slot_mem(m.tier, slot);
		for (int a = 0; a < K3_VRAM_ARRAYS; a++)
			w[a] = base + m.tier_off[a];
	} else {
		const uint8_t *s[K3_VRAM_ARRAYS] = { span->w1_packed, span->w1_scale, span->w3_packed,
						     span->w3_scale, span->w2_packed, span->w2_scale };
		memcpy(w, s, sizeof(w));
	}
	host_rows(m, w, first, n);
}

void routed_sum(Model &m, uint32_t layer, const at::Tensor &Y, const float *weights, float *out,
		bool partial)
{
	const k3_prov_config &c = m.cfg;
	Routed &r = m.r;
	const Layer &L = m.layers[layer];
	int64_t T = r.T, K = c.top_k, lat = c.latent;
	size_t TK = (size_t)T * K;
	if (!partial) {
		r.open = false;
		r.device = false;
		if (m.tier)
			k3_vram_step_end(m.tier);
		for (size_t j = 0; j < TK; j++)
			if (!r.done[j])
				fail(-EINVAL, "layer %u: expert %u (slot %zu) was not computed", layer,
				     r.ids[j], j);
	}
	/* ysum[t] = sum_k w[t][k] Y[row_of[t][k]], k ascending (spec §8.2);
	 * a slot not computed yet (partial) has weight 0 and a zero row */
	std::vector<int64_t> idx(TK);
	std::vector<float> wk(TK);
	for (size_t j = 0; j < TK; j++) {
		idx[j] = r.done[j] ? r.row_of[j] : 0;
		wk[j] = r.done[j] ? weights[j] : 0.0f;
	}
	at::Tensor it = at::from_blob(idx.data(), {(int64_t)TK}, at::TensorOptions().dtype(at::kLong));
	at::Tensor sel = Y.index_select(0, it.to(Y.device())).view({T, K, lat});
	at::Tensor w = at::from_blob(wk.data(), {T, K}, at::TensorOptions().dtype(at::kFloat))
			       .to(Y.device());
	by_rows(m, (uint32_t)T, [&](uint32_t t0, uint32_t nt) {
		at::Tensor st = sel.narrow(0, t0, nt), wt = w.narrow(0, t0, nt);
		at::Tensor ys = st.select(1, 0) * wt.select(1, 0).unsqueeze(1);
		for (int64_t k = 1; k < K; k++)
			ys = ys + st.select(1, k) * wt.select(1, k).unsqueeze(1);
		at::Tensor ylat = rmsnorm(ys.to(m.dev), L.lnorm, c.rms_eps);
		put(out + (size_t)t0 * c.hidden, linear(m, ylat, L.lup), K3_PROV_OUT_ACCUMULATE);
	});
}

void routed_end(Model &m, uint32_t layer, const float *weights, float *out, bool partial)
{
#if K3_TORCH_CUDA
	if (m.r.device)
		return dx_end(m, layer, weights, out, partial);
#endif
	size_t TK = (size_t)m.r.T * m.cfg.top_k;
	routed_sum(m, layer, at::from_blob(m.r.y.data(), {(int64_t)TK, (int64_t)m.cfg.latent},
					   at::TensorOptions().dtype(at::kFloat)),
		   weights, out, partial);
}

}  // namespace k3t

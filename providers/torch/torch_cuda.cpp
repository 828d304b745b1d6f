/*
 * torch_cuda.cpp - the torch provider's routed experts on a CUDA device
 * (built with a CUDA LibTorch and the kernels/cuda MXFP4 kernels:
 * K3_TORCH_CUDA): experts live in the VRAM tier (providers/vram over
 * vram_cuda.h), their products run through k3_cuda_mxfp4_matmul_many on
 * the device copies, the rest of the routed path (down projection, SiTU,
 * weighted sum, norm, up projection) through ATen on the same device.
 *
 * Streams: ATen computes on its current stream, kernels/cuda on its own
 * non-blocking streams (one for products, one for uploads), so every hand
 * over between them is a host wait: ATen's stream is synchronized before a
 * k3_cuda product reads what ATen wrote, and k3_cuda_sync before ATen reads
 * a product's output. Uploads overlap compute: a miss is queued on the
 * upload stream while the products of the experts before it run.
 *
 * Not yet run on a GPU (docs/providers.md): tests/device/run.sh checks it.
 */
#include "torch/torch_internal.h"

#include <c10/core/impl/VirtualGuardImpl.h>

#include <cerrno>
#include <cstring>
#include <memory>

extern "C" {
#include "base/log.h"
#include "k3_cuda.h"
#include "vram/vram_cuda.h"
}

namespace k3t {

struct Experts {
	struct k3_cuda_dev *up = nullptr, *cmp = nullptr;
	struct k3_vram_cuda vc{};
	at::Tensor z, gx, g, u, y;   /* device [T][lat], [slots][lat|I] */
};

namespace {

const uint32_t TMAX = K3_CUDA_T_MAX;   /* positions per k3_cuda product */

/* Waits for everything ATen queued on the device (its current stream). */
void aten_sync(const Model &m)
{
	c10::impl::VirtualGuardImpl impl(m.dev.type());
	impl.getStream(m.dev).synchronize();
}

void cuda_check(int rc, const k3_cuda_status &cs, const char *what)
{
	if (rc)
		fail(rc, "%s: %s", what, cs.msg);
}

}  // namespace

bool dx_open(Model &m, uint64_t budget)
{
	const k3_prov_config &c = m.cfg;
	std::unique_ptr<Experts> dx(new Experts());
	k3_cuda_status cs = {};
	int dev = m.dev.has_index() ? m.dev.index() : 0;
	if (k3_cuda_open(dev, &dx->up, &cs) || k3_cuda_open(dev, &dx->cmp, &cs)) {
		k3_log_warning("torch provider: kernels/cuda cannot open device %d (%s); routed "
			       "experts run on the CPU", dev, cs.msg);
		k3_cuda_close(dx->up);
		return false;
	}
	dx->vc.up = dx->up;
	dx->vc.compute = dx->cmp;
	k3_vram_cuda_dev(&dx->vc, &m.tier_dev);
	k3_vram_config vc = {};
	vc.budget_bytes = budget;
	uint64_t n = (uint64_t)c.moe_inter * c.latent;
	for (int a = 0; a < K3_VRAM_ARRAYS; a++)
		vc.array_bytes[a] = a % 2 == 0 ? n / 2 : n / 32;
	vc.n_layers = c.n_layers;
	vc.n_experts = c.n_experts;
	vc.copy_pool = m.pool;
	struct k3_err err = {};
	if (k3_vram_new(&m.tier_dev, &vc, &m.tier, &err)) {
		k3_log_warning("torch provider: no VRAM expert tier (%s); routed experts run on "
			       "the CPU", err.msg);
		k3_cuda_close(dx->cmp);
		k3_cuda_close(dx->up);
		return false;
	}
	k3_vram_layout(vc.array_bytes, m.tier_off);
	struct k3_vram_stats st;
	k3_vram_stats_get(m.tier, &st);
	k3_log_info("torch provider: VRAM expert tier of %.2f GB, %u experts of %.1f MB (+ %d "
		    "transient)", (double)st.budget_bytes / 1e9, st.slots_cap,
		    (double)st.slot_bytes / 1e6, K3_VRAM_TRANSIENT);
	int64_t slots = (int64_t)m.max_batch * c.top_k;
	int64_t w = c.latent > c.moe_inter ? c.latent : c.moe_inter;
	dx->gx = at::zeros({slots, (int64_t)c.latent}, m.f32);
	dx->g = at::zeros({slots, w}, m.f32);
	dx->u = at::zeros({slots, w}, m.f32);
	dx->y = at::zeros({slots, (int64_t)c.latent}, m.f32);
	m.dx = dx.release();
	return true;
}

void dx_close(Model &m)
{
	if (!m.dx)
		return;
	k3_cuda_sync(m.dx->cmp, nullptr);
	k3_vram_free(m.tier);
	m.tier = nullptr;
	k3_cuda_close(m.dx->cmp);
	k3_cuda_close(m.dx->up);
	delete m.dx;
	m.dx = nullptr;
}

void dx_begin(Model &m, uint32_t layer, const float *x, uint32_t T, const uint32_t *ids)
{
	const k3_prov_config &c = m.cfg;
	Experts &d = *m.dx;
	d.z = linear(m, in(m, x, T, c.hidden), m.layers[layer].ldown);   /* [T][lat] device */
	d.y.narrow(0, 0, (int64_t)T * c.top_k).zero_();
	routed_open(m, layer, T, ids, true);
}

void dx_expert(Model &m, uint32_t layer, uint32_t expert, const k3_prov_expert *span)
{
	const k3_prov_config &c = m.cfg;
	Routed &r = m.r;
	Experts &d = *m.dx;
	struct k3_err err = {};
	int slot = span ? -1 : k3_vram_find(m.tier, layer, expert);
	if (span && k3_vram_load(m.tier, layer, expert, span, &slot, &err))
		fail(err.code ? err.code : -EIO, "VRAM tier: %s", err.msg);
	if (slot < 0)
		fail(-EINVAL, "layer %u: expert %u has no span and is not resident", layer, expert);
	/* rows of this expert's slots, gathered from the down projection */
	uint32_t K = c.top_k, first = r.rows, n = 0;
	std::vector<int64_t> pos;
	for (size_t j = 0; j < (size_t)r.T * K; j++) {
		if (r.done[j] || r.ids[j] != expert)
			continue;
		r.done[j] = 1;
		r.row_of[j] = first + n++;
		pos.push_back((int64_t)(j / K));
	}
	if (n == 0)
		fail(-EINVAL, "layer %u: expert %u has no slot left in this call", layer, expert);
	r.rows += n;
	at::Tensor pidx = at::from_blob(pos.data(), {(int64_t)n}, at::TensorOptions().dtype(at::kLong))
				  .to(m.dev);
	d.gx.narrow(0, first, n).copy_(d.z.index_select(0, pidx));
	if (k3_vram_wait_slot(m.tier, slot, &err))
		fail(err.code ? err.code : -EIO, "VRAM tier: %s", err.msg);
	aten_sync(m);
	const uint8_t *base = (const uint8_t *)k3_vram_slot_mem(m.tier, slot);
	uint32_t lat = c.latent, I = c.moe_inter;
	k3_cuda_mxfp4 w1 = { base + m.tier_off[0], base + m.tier_off[1], I, lat };
	k3_cuda_mxfp4 w3 = { base + m.tier_off[2], base + m.tier_off[3], I, lat };
	k3_cuda_mxfp4 w2 = { base + m.tier_off[4], base + m.tier_off[5], lat, I };
	int64_t gw = d.g.size(1);
	float *gx = d.gx.data_ptr<float>() + (size_t)first * lat;
	float *g = d.g.data_ptr<float>() + (size_t)first * gw, *u = d.u.data_ptr<float>() + (size_t)first * gw;
	k3_cuda_status cs = {};
	/* products of at most K3_CUDA_T_MAX positions per launch */
	for (uint32_t r0 = 0; r0 < n; r0 += TMAX) {
		uint32_t nr = n - r0 < TMAX ? n - r0 : TMAX;
		k3_cuda_mxfp4_job jobs[2] = {
			{ &w1, nr, gx + (size_t)r0 * lat, lat, g + (size_t)r0 * gw, (uint32_t)gw },
			{ &w3, nr, gx + (size_t)r0 * lat, lat, u + (size_t)r0 * gw, (uint32_t)gw },
		};
		cuda_check(k3_cuda_mxfp4_matmul_many(d.cmp, 2, jobs, &cs), cs, "expert W1/W3");
	}
	cuda_check(k3_cuda_sync(d.cmp, &cs), cs, "expert W1/W3");
	by_rows(m, n, [&](uint32_t r0, uint32_t nr) {
		at::Tensor gt = d.g.narrow(0, first + r0, nr).narrow(1, 0, I);
		gt.copy_(situ(m, gt, d.u.narrow(0, first + r0, nr).narrow(1, 0, I)));
	});
	aten_sync(m);
	float *y = d.y.data_ptr<float>() + (size_t)first * lat;
	for (uint32_t r0 = 0; r0 < n; r0 += TMAX) {
		uint32_t nr = n - r0 < TMAX ? n - r0 : TMAX;
		cuda_check(k3_cuda_mxfp4_matmul(d.cmp, &w2, nr, g + (size_t)r0 * gw, (uint32_t)gw,
						y + (size_t)r0 * lat, lat, &cs), cs, "expert W2");
	}
	/* the next ATen op on y comes after this wait (dx_end) */
}

void dx_end(Model &m, uint32_t layer, const float *weights, float *out, bool partial)
{
	k3_cuda_status cs = {};
	cuda_check(k3_cuda_sync(m.dx->cmp, &cs), cs, "expert W2");
	k3_vram_note_fence(m.tier);
	routed_sum(m, layer, m.dx->y, weights, out, partial);
}

}  // namespace k3t

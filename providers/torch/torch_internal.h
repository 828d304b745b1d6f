/*
 * torch_internal.h - the torch provider's model handle and helpers, shared
 * by torch_provider.cpp (the ABI, dense ops through ATen) and
 * torch_experts.cpp (the routed experts: MXFP4 products through the
 * project's kernels on the host, or kernels/cuda on a device, with the
 * VRAM tier). C++17, internal to providers/torch.
 */
#ifndef K3_TORCH_INTERNAL_H
#define K3_TORCH_INTERNAL_H

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cstdint>
#include <vector>

extern "C" {
#include "k3_kernels.h"
#include "k3_provider.h"
#include "vram/vram.h"
#include "vram/vram_host.h"
}

namespace k3t {

/* A failure with an ABI code, thrown inside the provider and turned into
 * a return value at the ABI boundary (guard() in torch_provider.cpp). */
struct Fail {
	int code;
	std::string msg;
};

[[noreturn]] void fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

struct Layer {
	uint32_t attn = 0, ffn = 0;
	at::Tensor input_norm, post_norm, attn_u, mlp_u;
	/* KDA */
	at::Tensor q, k, v, fa, fb, b, g, o;
	at::Tensor conv[3];      /* [P][K] taps */
	at::Tensor a_exp;        /* [H] exp(A_log[h]) */
	at::Tensor dt_bias;      /* [H][dk] */
	at::Tensor o_norm;       /* [dk] */
	/* MLA (g, o shared with KDA) */
	at::Tensor qa, qb, kva, kvb, qa_norm, kva_norm;
	at::Tensor wuk, wuv;     /* [H][nope][kvl], [H][vh][kvl] views of kv_b_proj */
	/* dense MLP or shared experts */
	at::Tensor mg, mu, md;
	/* MoE */
	at::Tensor router, ldown, lup, lnorm;
	std::vector<float> rbias;    /* host: the top-k runs on the host */
};

/* Routed-expert state of one routed call (routed_begin .. routed_end, or
 * one routed_experts). Host buffers: [slots][width]. */
struct Routed {
	bool open = false;
	bool device = false;                 /* this call computes on the device (torch_cuda.cpp) */
	uint32_t layer = 0, T = 0, rows = 0;
	const uint32_t *ids = nullptr;       /* borrowed from routed_begin */
	std::vector<uint8_t> done;           /* [T*K] slot computed */
	std::vector<uint32_t> row_of;        /* [T*K] slot -> row of Y */
	std::vector<float> z;                /* [T][latent] down projection (host) */
	std::vector<float> gx, g, u, y;      /* [slots][latent|inter] */
};

struct Experts;   /* the device expert path (torch_experts.cpp) */

struct Model {
	k3_prov_config cfg{};
	uint32_t max_batch = 0, threads = 1;
	bool split_all = false;
	bool per_row = true;     /* every op one position at a time (batch invariance) */
	at::Device dev{at::kCPU};
	at::TensorOptions f32;   /* fp32 on dev */
	uint32_t P = 0, qhd = 0;
	/* borrowed embedding (read on the host: a gather, no arithmetic) */
	const void *embed = nullptr;
	uint32_t embed_dtype = 0;
	at::Tensor lm_head, norm, out_u;
	std::vector<Layer> layers;
	struct k3_kern_pool *pool = nullptr;   /* host MXFP4 products */
	Routed r;
	/* VRAM tier (or its host-memory stand-in on the CPU); null = none */
	struct k3_vram *tier = nullptr;
	struct k3_vram_host host_dev{};
	struct k3_vram_dev tier_dev{};
	uint64_t tier_off[K3_VRAM_ARRAYS] = {};
	bool tier_warned = false;
	Experts *dx = nullptr;               /* device expert path (torch_cuda.cpp), CUDA only */
	~Model();
};

struct KdaState {
	Model *m;
	uint32_t layer;
	at::Tensor win;          /* [3][K-1][P] raw projections, oldest first */
	at::Tensor S;            /* [H][dk][dk], row = key channel */
};

struct MlaCache {
	Model *m;
	uint32_t layer, len = 0, cap = 0, row = 0;
	at::Tensor rows;         /* [cap][row] */
};

/* Runs body(t0, n) over positions [0, T): one position at a time when
 * m.per_row, else in one piece. Row t of an ATen product over [T][n]
 * differs from the same row alone (OpenBLAS sgemm picks its kernel and
 * blocking by T), and an element-wise kernel handles the bulk of a tensor
 * with vector code and its tail with scalar code, so an element's bits
 * could depend on where it sits in a chunk; a tensor of one position has
 * the same shape whatever T is. */
template <class F> void by_rows(const Model &m, uint32_t T, F &&body)
{
	if (!m.per_row) {
		body(0u, T);
		return;
	}
	for (uint32_t t = 0; t < T; t++)
		body(t, 1u);
}

/* y[T][out] = x[T][in] W^T (fp32), one fixed order per position. */
at::Tensor linear(const Model &m, const at::Tensor &x, const at::Tensor &W);
/* RMSNorm over the last dim: x * rsqrt(mean(x^2) + eps) * w (spec §3.1). */
at::Tensor rmsnorm(const at::Tensor &x, const at::Tensor &w, float eps);
/* SiTU-GLU (spec §7.1). */
at::Tensor situ(const Model &m, const at::Tensor &g, const at::Tensor &u);
/* A host fp32 array [rows][cols] as a tensor on m.dev (a copy on a device). */
at::Tensor in(const Model &m, const float *x, int64_t rows, int64_t cols);
/* out[T][D] (:= or +=) y, y on any device. */
void put(float *out, const at::Tensor &y, uint32_t flags);

/* torch_experts.cpp: the routed path. */
void routed_begin(Model &m, uint32_t layer, const float *x, uint32_t T, const uint32_t *ids);
void routed_expert(Model &m, uint32_t layer, uint32_t expert, const k3_prov_expert *span);
void routed_end(Model &m, uint32_t layer, const float *weights, float *out, bool partial);
void experts_resident(Model &m, uint32_t layer, const uint32_t *ids, size_t n, uint8_t *res);
/* Marks a routed call of T positions open (the state routed_expert and
 * routed_sum read); device: its expert outputs live on the device. */
void routed_open(Model &m, uint32_t layer, uint32_t T, const uint32_t *ids, bool device);
/* The end of a routed call (or, partial, its sum so far): out[T][D] +=
 * Wup(RMSNorm(sum_k w[t][k] Y[row_of[t][k]])), k ascending, from the
 * expert outputs Y[rows][latent] on the host or the device. */
void routed_sum(Model &m, uint32_t layer, const at::Tensor &Y, const float *weights, float *out,
		bool partial);
/* Sets up the expert path after the weights are in place: the host
 * kernels' pool, the tier (budget_bytes: 0 = auto on a device, none on
 * the host; UINT64_MAX = none). */
void experts_open(Model &m, uint64_t budget_bytes);
void experts_close(Model &m);

#if K3_TORCH_CUDA
/* torch_cuda.cpp: the routed path on a CUDA device over the VRAM tier.
 * dx_open returns false (having logged why) when the device path cannot
 * start: the experts then run on the CPU. */
bool dx_open(Model &m, uint64_t budget_bytes);
void dx_close(Model &m);
void dx_begin(Model &m, uint32_t layer, const float *x, uint32_t T, const uint32_t *ids);
void dx_expert(Model &m, uint32_t layer, uint32_t expert, const k3_prov_expert *span);
void dx_end(Model &m, uint32_t layer, const float *weights, float *out, bool partial);
#endif

}  // namespace k3t

#endif

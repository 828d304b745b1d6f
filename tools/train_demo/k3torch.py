"""k3torch - the Kimi K3 text forward pass in PyTorch, at any size.

A third implementation of ../shared/design/k3-model.md, independent of
k3d's C engine and of the float64 oracle that made the goldens: KDA and
MLA layers typed by `linear_attn_config.kda_layers` (1-based), Attention
Residuals over block snapshots, SiTU-GLU, the sigmoid router with its
selection-only bias, latent MoE (down-projection, experts in the latent,
RMSNorm, up-projection) plus one shared MLP, MXFP4 experts.

Used two ways:
  * float64, batch 1, weights read from a checkpoint in the release's
    Hugging Face layout (`load_checkpoint`): the cross-check against the
    goldens and k3d (crosscheck.py);
  * float32, batched, trained (train.py): right padding is safe because
    every mixer is causal, so a padded tail never changes earlier
    positions.

Parameter names are the checkpoint's (without "language_model."), except
the routed experts, which are stacked per layer as `experts_w1/_w2/_w3`
([E, out, in]) and split into `experts.e.wN` at export.

Fake quantization for the last training steps (quantization-aware, as K3
was): `K3.qat = True` makes every BF16-stored weight its bfloat16 rounding
and every expert weight its MXFP4 rounding in the forward pass, with the
gradient passed straight through; the exported bytes are exactly those
values, so the trained model and the checkpoint compute the same function.
"""
import json
import math
import os
import struct

import torch
import torch.nn as nn
import torch.nn.functional as F

# ---------------------------------------------------------------- config


class Config:
    """The text_config fields the forward pass reads (k3-model.md §1.2)."""

    def __init__(self, tc):
        g = tc.get
        self.raw = tc
        self.vocab = tc["vocab_size"]
        self.D = tc["hidden_size"]
        self.L = tc["num_hidden_layers"]
        self.inter = tc["intermediate_size"]
        if g("hidden_act", "silu") != "situ":
            raise ValueError("only hidden_act 'situ' is implemented")
        self.beta1 = g("activation_situ_beta") or 1.0
        self.beta2 = g("activation_situ_linear_beta")
        self.eps = g("rms_norm_eps", 1e-6)
        self.S = g("attn_res_block_size")
        if not self.S:
            raise ValueError("only AttnRes models (attn_res_block_size set) are implemented")
        self.Hm = g("num_attention_heads")
        self.q_lora = g("q_lora_rank")
        self.kv_lora = g("kv_lora_rank")
        self.nope = g("qk_nope_head_dim")
        self.rope = g("qk_rope_head_dim")
        self.vh = g("v_head_dim")
        self.E = g("num_experts")
        self.K = g("num_experts_per_token")
        self.n_shared = g("num_shared_experts", 0)
        self.moe_inter = g("moe_intermediate_size")
        self.renorm = g("moe_renormalize", True)
        self.rscale = g("routed_scaling_factor", 1.0)
        self.first_dense = g("first_k_dense_replace", 0)
        self.freq = g("moe_layer_freq", 1)
        self.latent = g("routed_expert_hidden_size")
        if g("moe_router_activation_func", "sigmoid") != "sigmoid":
            raise ValueError("only the sigmoid router is implemented")
        if not self.latent or not g("latent_moe_use_norm"):
            raise ValueError("only latent MoE with latent_moe_use_norm is implemented")
        lac = tc["linear_attn_config"]
        self.kda = set(i - 1 for i in lac["kda_layers"])
        self.Hk = lac["num_heads"]
        self.dk = lac["head_dim"]
        self.conv_k = lac.get("short_conv_kernel_size", 4)
        self.lower = lac.get("gate_lower_bound")
        if self.lower is None or not lac.get("use_full_rank_gate"):
            raise ValueError("only gate_lower_bound + use_full_rank_gate KDA is implemented")

    def is_kda(self, l):
        return l in self.kda

    def is_moe(self, l):
        return self.E is not None and l >= self.first_dense and l % self.freq == 0


# ---------------------------------------------------------------- MXFP4

E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def mxfp4_encode(w):
    """w [R, C] (C a multiple of 32) -> (codes uint8 [R, C] 0..15, scale
    uint8 [R, C/32]). E8M0 per group of 32 input columns: the smallest power
    of two that brings the group's largest magnitude to <= 6; each value
    then rounds to the nearest E2M1 magnitude (ties to the smaller one).
    Computed in float64 so float32 and float64 callers agree."""
    w = w.detach().to(torch.float64)
    R, C = w.shape
    g = w.reshape(R, C // 32, 32)
    amax = g.abs().amax(-1)
    # exponent e with amax / 2^e <= 6; frexp is exact (no log rounding)
    m, ex = torch.frexp(amax / 6.0)
    e = torch.where(m == 0.5, ex - 1, ex)
    e = torch.where(amax == 0, torch.full_like(e, -127), e).clamp(-127, 127)
    scale = torch.ldexp(torch.ones_like(amax), e)
    x = (g / scale[..., None]).abs()
    mags = torch.tensor(E2M1, dtype=torch.float64)
    # nearest magnitude; ties go to the lower index (argmin takes the first)
    idx = (x[..., None] - mags).abs().argmin(-1)
    sign = (g < 0) & (idx > 0)
    codes = (idx + 8 * sign.to(idx.dtype)).to(torch.uint8).reshape(R, C)
    return codes, (e + 127).to(torch.uint8)


def mxfp4_decode(codes, scale, dtype=torch.float64):
    """Inverse of mxfp4_encode (k3-model.md §9): codes [R, C], scale [R, C/32]."""
    mags = torch.tensor(E2M1, dtype=dtype)
    c = codes.to(torch.long)
    v = mags[c & 7] * torch.where((c & 8) != 0, -1.0, 1.0).to(dtype)
    R, C = c.shape
    s = torch.ldexp(torch.ones(scale.shape, dtype=dtype), scale.to(torch.long) - 127)
    return (v.reshape(R, C // 32, 32) * s[..., None]).reshape(R, C)


def mxfp4_pack(codes):
    """codes [R, C] -> packed [R, C/2]: low nibble = even column."""
    c = codes.to(torch.uint8)
    return (c[:, 0::2] | (c[:, 1::2] << 4)).contiguous()


def mxfp4_unpack(packed):
    p = packed.to(torch.uint8)
    R, H = p.shape
    out = torch.empty(R, 2 * H, dtype=torch.uint8)
    out[:, 0::2] = p & 0x0F
    out[:, 1::2] = p >> 4
    return out


class _STE(torch.autograd.Function):
    """Forward: the quantized value; backward: the identity."""

    @staticmethod
    def forward(ctx, w, q):
        return q

    @staticmethod
    def backward(ctx, g):
        return g, None


def fake_bf16(w):
    return _STE.apply(w, w.detach().to(torch.bfloat16).to(w.dtype))


def fake_mxfp4(w):
    """w [E, R, C] -> the MXFP4 values (per expert, per row), STE."""
    E, R, C = w.shape
    codes, sc = mxfp4_encode(w.reshape(E * R, C))
    q = mxfp4_decode(codes, sc, torch.float64).to(w.dtype).reshape(E, R, C)
    return _STE.apply(w, q)


# ---------------------------------------------------------------- modules


class Lin(nn.Module):
    """y = W x, no bias; W [out, in] stored BF16 (fake-rounded under QAT)."""

    def __init__(self, i, o, root):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(o, i))
        self._root = [root]

    def forward(self, x):
        w = self.weight
        if self._root[0].qat:
            w = fake_bf16(w)
        return F.linear(x, w)


class Norm(nn.Module):
    """RMSNorm (mean of squares): y = w * x / sqrt(mean(x^2) + eps)."""

    def __init__(self, n, eps, root, bf16=True):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps
        self._root = [root]
        self.bf16 = bf16

    def w(self):
        w = self.weight
        if self.bf16 and self._root[0].qat:
            w = fake_bf16(w)
        return w

    def forward(self, x):
        r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return x * r * self.w()


def situ(g, u, beta1, beta2):
    """SiTU-GLU (k3-model.md §7.1): gate g (w1/gate_proj), up u (w3/up_proj)."""
    a = beta1 * torch.tanh(g / beta1) * torch.sigmoid(g)
    if beta2 is not None:
        u = beta2 * torch.tanh(u / beta2)
    return a * u


class MLP(nn.Module):
    def __init__(self, D, width, cfg, root):
        super().__init__()
        self.gate_proj = Lin(D, width, root)
        self.up_proj = Lin(D, width, root)
        self.down_proj = Lin(width, D, root)
        self.cfg = cfg

    def forward(self, x):
        return self.down_proj(situ(self.gate_proj(x), self.up_proj(x), self.cfg.beta1, self.cfg.beta2))


class DepthConv(nn.Module):
    """Depthwise causal conv, taps [P, 1, K] F32, tap K-1 = current token."""

    def __init__(self, P, K):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(P, 1, K))

    def forward(self, x):  # x [B, T, P]
        T = x.shape[1]
        K = self.weight.shape[-1]
        y = F.conv1d(x.transpose(1, 2), self.weight, padding=K - 1, groups=x.shape[-1])
        return y[..., :T].transpose(1, 2)


def kda_recurrent(q, k, v, alpha, beta):
    """k3-model.md §5.4 literally, token by token. q, k, v, alpha [B, T, H,
    dk]; beta [B, T, H] -> o [B, T, H, dk]. State S[key i][value j], zero
    at the start: decay rows, predict with the decayed state, write the
    delta, read with the updated state."""
    B, T, H, dk = q.shape
    S = q.new_zeros(B, H, dk, v.shape[-1])
    outs = []
    for t in range(T):
        S = S * alpha[:, t, :, :, None]
        kt = k[:, t]
        pred = torch.einsum("bhi,bhij->bhj", kt, S)
        u = beta[:, t, :, None] * (v[:, t] - pred)
        S = S + kt[..., None] * u[..., None, :]
        outs.append(torch.einsum("bhi,bhij->bhj", q[:, t], S))
    return torch.stack(outs, 1)


def kda_chunked(q, k, v, lam, beta, C):
    """The same recurrence in chunks of C tokens (the WY form of fla's
    chunk_kda, an exact re-association, k3-model.md §5.5), for training.

    In a chunk starting from state S0, with G_t = sum_{s<=t} lam_s (the log
    of the decay accumulated up to and including token t, per key channel):
      S'_{t} (decayed, before t's write) = e^{G_t} S0 + sum_{j<t} e^{G_t-G_j} k_j u_j^T
      u_t = beta_t (v_t - S'_t^T k_t)
          = beta_t (v_t - (e^{G_t} k_t)^T S0 - sum_{j<t} A_tj u_j),
            A_tj = sum_c k_t[c] k_j[c] e^{G_t[c]-G_j[c]}
    so U = (I + diag(beta) A)^{-1} diag(beta) (V - K~ S0) (unit lower
    triangular solve), o_t = (e^{G_t} q_t)^T S0 + sum_{i<=t} Bm_ti u_i with
    Bm_ti = sum_c q_t[c] k_i[c] e^{G_t[c]-G_i[c]}, and the next chunk starts
    from e^{G_C} S0 + sum_i (e^{G_C-G_i} k_i) u_i^T. The pairwise factors
    are split around the chunk's middle (e^{G_t-G_m} e^{G_m-G_j}), so with
    the lower bound of -5 per token every factor stays within e^{+-5C/2}."""
    B, T, H, dk = q.shape
    dv = v.shape[-1]
    pad = (-T) % C
    tr = lambda x: x.transpose(1, 2)                               # -> [B, H, T, ...]
    q, k, v, lam = tr(q), tr(k), tr(v), tr(lam)
    beta = beta.transpose(1, 2)
    if pad:
        # zero k, v, beta and lam = 0 (no decay) leave the state untouched
        z = lambda x: F.pad(x, (0, 0, 0, pad))
        q, k, v, lam = z(q), z(k), z(v), z(lam)
        beta = F.pad(beta, (0, pad))
    N = (T + pad) // C
    sh = lambda x: x.reshape(B, H, N, C, x.shape[-1])
    q, k, v, lam = sh(q), sh(k), sh(v), sh(lam)
    beta = beta.reshape(B, H, N, C, 1)
    G = lam.cumsum(3)
    Gm = G[:, :, :, C // 2: C // 2 + 1]
    kq = k * torch.exp(G - Gm)
    kk = k * torch.exp(Gm - G)
    qq = q * torch.exp(G - Gm)
    strict = torch.ones(C, C, dtype=torch.bool).tril(-1)
    A = (kq @ kk.transpose(-1, -2)).masked_fill(~strict, 0.0)
    Bm = (qq @ kk.transpose(-1, -2)).masked_fill(~strict.logical_or(torch.eye(C, dtype=torch.bool)), 0.0)
    M = torch.eye(C, dtype=q.dtype) + beta * A
    Wv = torch.linalg.solve_triangular(M, beta * v, upper=False, unitriangular=True)
    Kt = k * torch.exp(G)                                          # e^{G_t} k_t
    Wk = torch.linalg.solve_triangular(M, beta * Kt, upper=False, unitriangular=True)
    Qt = q * torch.exp(G)
    Kend = k * torch.exp(G[:, :, :, -1:] - G)                      # e^{G_C - G_i} k_i
    dend = torch.exp(G[:, :, :, -1])                               # [B, H, N, dk]
    S = q.new_zeros(B, H, dk, dv)
    outs = []
    for n in range(N):
        U = Wv[:, :, n] - Wk[:, :, n] @ S
        outs.append(Qt[:, :, n] @ S + Bm[:, :, n] @ U)
        S = dend[:, :, n, :, None] * S + Kend[:, :, n].transpose(-1, -2) @ U
    o = torch.stack(outs, 2).reshape(B, H, N * C, dv)[:, :, :T]
    return o.transpose(1, 2)


class KDA(nn.Module):
    """Kimi Delta Attention (k3-model.md §5), recurrent form."""

    def __init__(self, cfg, root):
        super().__init__()
        D, H, dk = cfg.D, cfg.Hk, cfg.dk
        P = H * dk
        self.cfg = cfg
        for n in ("q_proj", "k_proj", "v_proj", "g_proj"):
            setattr(self, n, Lin(D, P, root))
        self.f_a_proj = Lin(D, dk, root)
        self.f_b_proj = Lin(dk, P, root)
        self.b_proj = Lin(D, H, root)
        self.o_proj = Lin(P, D, root)
        self.q_conv1d = DepthConv(P, cfg.conv_k)
        self.k_conv1d = DepthConv(P, cfg.conv_k)
        self.v_conv1d = DepthConv(P, cfg.conv_k)
        self.A_log = nn.Parameter(torch.zeros(H))       # exported [max(dk, H)], zero padded
        self.dt_bias = nn.Parameter(torch.zeros(P))
        self.o_norm = Norm(dk, cfg.eps, root, bf16=False)   # F32, shared by the heads
        self._chunk = 0          # 0: the literal recurrence; C: kda_chunked with chunks of C

    def forward(self, x):
        cfg = self.cfg
        B, T, _ = x.shape
        H, dk = cfg.Hk, cfg.dk
        q = F.silu(self.q_conv1d(self.q_proj(x))).view(B, T, H, dk)
        k = F.silu(self.k_conv1d(self.k_proj(x))).view(B, T, H, dk)
        v = F.silu(self.v_conv1d(self.v_proj(x))).view(B, T, H, dk)
        q = q * torch.rsqrt(q.pow(2).sum(-1, keepdim=True) + 1e-6) * (dk ** -0.5)
        k = k * torch.rsqrt(k.pow(2).sum(-1, keepdim=True) + 1e-6)
        beta = torch.sigmoid(self.b_proj(x))                       # [B, T, H]
        f = self.f_b_proj(self.f_a_proj(x)).view(B, T, H, dk)
        A = torch.exp(self.A_log).view(1, 1, H, 1)
        lam = cfg.lower * torch.sigmoid(A * (f + self.dt_bias.view(1, 1, H, dk)))
        if self._chunk:
            o = kda_chunked(q, k, v, lam, beta, self._chunk)
        else:
            o = kda_recurrent(q, k, v, torch.exp(lam), beta)
        gz = self.g_proj(x).view(B, T, H, dk)
        z = self.o_norm(o) * torch.sigmoid(gz)
        return self.o_proj(z.reshape(B, T, H * dk))


class MLA(nn.Module):
    """Gated NoPE MLA (k3-model.md §6), naive (non-absorbed) form."""

    def __init__(self, cfg, root):
        super().__init__()
        D, H = cfg.D, cfg.Hm
        self.cfg = cfg
        self.q_a_proj = Lin(D, cfg.q_lora, root)
        self.q_a_layernorm = Norm(cfg.q_lora, 1e-6, root)
        self.q_b_proj = Lin(cfg.q_lora, H * (cfg.nope + cfg.rope), root)
        self.kv_a_proj_with_mqa = Lin(D, cfg.kv_lora + cfg.rope, root)
        self.kv_a_layernorm = Norm(cfg.kv_lora, 1e-6, root)
        self.kv_b_proj = Lin(cfg.kv_lora, H * (cfg.nope + cfg.vh), root)
        self.g_proj = Lin(D, H * cfg.vh, root)
        self.o_proj = Lin(H * cfg.vh, D, root)

    def forward(self, x):
        c = self.cfg
        B, T, _ = x.shape
        H = c.Hm
        Q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))).view(B, T, H, c.nope + c.rope)
        ckv = self.kv_a_proj_with_mqa(x)
        lat = self.kv_a_layernorm(ckv[..., : c.kv_lora])
        kr = ckv[..., c.kv_lora:]
        KV = self.kv_b_proj(lat).view(B, T, H, c.nope + c.vh)
        kn, v = KV[..., : c.nope], KV[..., c.nope:]
        key = torch.cat([kn, kr[:, :, None, :].expand(B, T, H, c.rope)], -1)
        s = torch.einsum("bthd,bshd->bhts", Q, key) / math.sqrt(c.nope + c.rope)
        mask = torch.ones(T, T, dtype=torch.bool).triu(1)
        s = s.masked_fill(mask, float("-inf"))
        p = torch.softmax(s, -1)
        o = torch.einsum("bhts,bshd->bthd", p, v).reshape(B, T, H * c.vh)
        return self.o_proj(o * torch.sigmoid(self.g_proj(x)))


class Gate(nn.Module):
    def __init__(self, cfg, root):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(cfg.E, cfg.D))
        self.e_score_correction_bias = nn.Parameter(torch.zeros(cfg.E), requires_grad=False)
        self._root = [root]

    def scores(self, x):
        w = self.weight
        if self._root[0].qat:
            w = fake_bf16(w)
        return torch.sigmoid(F.linear(x, w))


class MoE(nn.Module):
    """Latent MoE (k3-model.md §8)."""

    def __init__(self, cfg, root):
        super().__init__()
        D, E, I, Z = cfg.D, cfg.E, cfg.moe_inter, cfg.latent
        self.cfg = cfg
        self._root = [root]
        self.gate = Gate(cfg, root)
        self.routed_expert_down_proj = Lin(D, Z, root)
        self.routed_expert_norm = Norm(Z, cfg.eps, root)
        self.routed_expert_up_proj = Lin(Z, D, root)
        self.shared_experts = MLP(D, I * cfg.n_shared, cfg, root)
        self.experts_w1 = nn.Parameter(torch.empty(E, I, Z))
        self.experts_w3 = nn.Parameter(torch.empty(E, I, Z))
        self.experts_w2 = nn.Parameter(torch.empty(E, Z, I))

    def route(self, x):
        """x [N, D] -> (sel [N, K] in selection order, weights [N, K], scores [N, E])."""
        c = self.cfg
        s = self.gate.scores(x)
        sel = torch.topk(s.detach() + self.gate.e_score_correction_bias, c.K, dim=-1).indices
        w = s.gather(-1, sel)
        if c.renorm and c.K > 1:
            w = w / (w.sum(-1, keepdim=True) + 1e-20)
        return sel, w * c.rscale, s

    def expert_weights(self):
        w1, w2, w3 = self.experts_w1, self.experts_w2, self.experts_w3
        if self._root[0].qat:
            w1, w2, w3 = fake_mxfp4(w1), fake_mxfp4(w2), fake_mxfp4(w3)
        return w1, w2, w3

    def forward(self, x, info=None):
        c = self.cfg
        shp = x.shape
        xf = x.reshape(-1, c.D)
        sel, w, s = self.route(xf)
        z = self.routed_expert_down_proj(xf)
        w1, w2, w3 = self.expert_weights()
        # dispatch: each (token, expert) pair to a slot of its expert's
        # group, groups padded to the largest one, three batched matmuls
        N, K, E = xf.shape[0], c.K, c.E
        flat = sel.reshape(-1)
        order = torch.argsort(flat, stable=True)
        cnt = torch.bincount(flat, minlength=E)
        cap = int(cnt.max())
        ex = flat[order]
        slot = ex * cap + (torch.arange(N * K) - (torch.cumsum(cnt, 0) - cnt)[ex])
        tok = order // K
        X = z.new_zeros(E * cap, z.shape[1]).index_copy(0, slot, z[tok]).view(E, cap, -1)
        Hd = situ(torch.bmm(X, w1.transpose(1, 2)), torch.bmm(X, w3.transpose(1, 2)), c.beta1, c.beta2)
        Y = torch.bmm(Hd, w2.transpose(1, 2)).reshape(E * cap, -1)[slot]
        y = z.new_zeros(z.shape).index_add(0, tok, Y * w.reshape(-1)[order][:, None])
        counts = cnt.tolist()
        routed = self.routed_expert_up_proj(self.routed_expert_norm(y))
        if info is not None:
            info.append({"sel": sel, "scores": s, "counts": counts})
        return (routed + self.shared_experts(xf)).reshape(shp)


def attn_res(cands, nw, pw, eps):
    """AR(c_0..c_n; nw, pw) (k3-model.md §4.2): softmax over candidates of
    (RMS-normalized c_j) . (nw * pw), mixing the raw candidates."""
    C = torch.stack(cands, 0)                                     # [n, ..., D]
    u = nw * pw[0]
    r = torch.rsqrt(C.pow(2).mean(-1, keepdim=True) + eps)
    s = ((C * r) * u).sum(-1)                                      # [n, ...]
    p = torch.softmax(s, 0)
    return (p[..., None] * C).sum(0)


class Layer(nn.Module):
    def __init__(self, cfg, l, root):
        super().__init__()
        D = cfg.D
        self.l = l
        self.cfg = cfg
        self._root = [root]
        self.input_layernorm = Norm(D, cfg.eps, root)
        self.post_attention_layernorm = Norm(D, cfg.eps, root)
        self.self_attention_res_norm = Norm(D, cfg.eps, root)
        self.self_attention_res_proj = Lin(D, 1, root)
        self.mlp_res_norm = Norm(D, cfg.eps, root)
        self.mlp_res_proj = Lin(D, 1, root)
        self.self_attn = KDA(cfg, root) if cfg.is_kda(l) else MLA(cfg, root)
        if cfg.is_moe(l):
            self.block_sparse_moe = MoE(cfg, root)
        else:
            self.mlp = MLP(D, cfg.inter, cfg, root)

    def res_w(self, which):
        n = getattr(self, which + "_res_norm")
        p = getattr(self, which + "_res_proj")
        pw = p.weight
        if self._root[0].qat:
            pw = fake_bf16(pw)
        return n.w(), pw


class Inner(nn.Module):
    """`model.` of the checkpoint."""

    def __init__(self, cfg, root):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab, cfg.D)
        self.layers = nn.ModuleList([Layer(cfg, l, root) for l in range(cfg.L)])
        self.norm = Norm(cfg.D, cfg.eps, root)
        self.output_attn_res_norm = Norm(cfg.D, cfg.eps, root)
        self.output_attn_res_proj = Lin(cfg.D, 1, root)


class K3(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.qat = False
        self.model = Inner(cfg, self)
        self.lm_head = Lin(cfg.D, cfg.vocab, self)

    def set_kda_chunk(self, C):
        """0: KDA runs the literal recurrence (the cross-check); C > 0:
        kda_chunked with chunks of C tokens (training)."""
        for ly in self.model.layers:
            if isinstance(ly.self_attn, KDA):
                ly.self_attn._chunk = C
        return self

    def forward(self, ids, info=None, lookahead=None):
        """ids [B, T] -> logits [B, T, V]. info: a list that receives one
        dict per MoE layer ({"layer", "sel", "scores", "counts"}).
        lookahead: a list that receives, after each MoE layer but the last,
        the next MoE layer's router applied to the current residual
        (k3d's prefetch lookahead, engine.h): {"layer": next, "sel"}."""
        cfg = self.cfg
        m = self.model
        e = m.embed_tokens.weight
        if self.qat:
            e = fake_bf16(e)
        P = F.embedding(ids, e)
        Bl = []
        moe_layers = [l for l in range(cfg.L) if cfg.is_moe(l)]
        for ly in m.layers:
            l = ly.l
            h = attn_res(Bl + [P], *ly.res_w("self_attention"), cfg.eps) if Bl else P
            if l % cfg.S == 0:
                Bl.append(P)
                P = None
            a = ly.self_attn(ly.input_layernorm(h))
            P = a if P is None else P + a
            h2 = attn_res(Bl + [P], *ly.res_w("mlp"), cfg.eps)
            x = ly.post_attention_layernorm(h2)
            if cfg.is_moe(l):
                P = P + ly.block_sparse_moe(x, info)
                if info is not None:
                    info[-1]["layer"] = l
                nxt = [n for n in moe_layers if n > l]
                if lookahead is not None and nxt:
                    nl = m.layers[nxt[0]]
                    with torch.no_grad():
                        hx = attn_res(Bl + [P], *nl.res_w("mlp"), cfg.eps)
                        sel, _, _ = nl.block_sparse_moe.route(
                            nl.post_attention_layernorm(hx).reshape(-1, cfg.D))
                    lookahead.append({"layer": nxt[0], "sel": sel})
            else:
                P = P + ly.mlp(x)
        ow = m.output_attn_res_proj.weight
        if self.qat:
            ow = fake_bf16(ow)
        z = attn_res(Bl + [P], m.output_attn_res_norm.w(), ow, cfg.eps)
        return self.lm_head(m.norm(z))


# ---------------------------------------------------------------- safetensors

DT = {
    "F64": (torch.float64, 8), "F32": (torch.float32, 4), "BF16": (torch.bfloat16, 2),
    "F16": (torch.float16, 2), "U8": (torch.uint8, 1),
}


def read_safetensors(path):
    """{name: tensor} of one shard (CPU, the stored dtype)."""
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    hdr = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for k, v in hdr.items():
        if k == "__metadata__":
            continue
        dt, size = DT[v["dtype"]]
        b, e = v["data_offsets"]
        buf = bytearray(data[base + b:base + e])
        t = torch.frombuffer(buf, dtype=dt) if e > b else torch.empty(0, dtype=dt)
        out[k] = t.reshape(v["shape"])
    return out


def read_checkpoint(d):
    """(config dict, {name: tensor}) of a checkpoint directory."""
    with open(os.path.join(d, "config.json")) as f:
        conf = json.load(f)
    ix = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(ix):
        with open(ix) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
    else:
        shards = ["model.safetensors"]
    t = {}
    for s in shards:
        t.update(read_safetensors(os.path.join(d, s)))
    return conf, t


PREFIX = "language_model."


def load_checkpoint(d, dtype=torch.float64):
    """A K3 module holding the checkpoint's exact values in `dtype`."""
    conf, t = read_checkpoint(d)
    cfg = Config(conf.get("text_config", conf))
    m = K3(cfg).to(dtype)
    sd = {}
    experts = {}
    for name, v in t.items():
        if not name.startswith(PREFIX):
            continue
        n = name[len(PREFIX):]
        if ".experts." in n:
            # model.layers.L.block_sparse_moe.experts.E.wN.weight_{packed,scale}
            head, rest = n.split(".experts.")
            e, w, kind = rest.split(".")
            experts.setdefault((head, w), {}).setdefault(int(e), {})[kind] = v
            continue
        if n.endswith("self_attn.A_log"):
            v = v.reshape(-1)[: cfg.Hk]
        sd[n] = v.to(dtype)
    for (head, w), per in experts.items():
        mats = []
        for e in range(len(per)):
            p = per[e]
            if "weight_packed" in p:
                mats.append(mxfp4_decode(mxfp4_unpack(p["weight_packed"]), p["weight_scale"], torch.float64))
            else:
                mats.append(p["weight"].to(torch.float64))
        sd[head + ".experts_" + w] = torch.stack(mats).to(dtype)
    missing, unexpected = m.load_state_dict(sd, strict=False)
    if missing or unexpected:
        raise ValueError("checkpoint %s: missing %s, unexpected %s" % (d, missing[:5], unexpected[:5]))
    return m

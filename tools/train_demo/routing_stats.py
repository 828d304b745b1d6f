#!/usr/bin/env python3
"""routing_stats.py - how realistic the trained model's routing is, and what
an n-gram draft would get on it.

    routing_stats.py --model DIR --k3ctl K3CTL [--seed 2] [--json]

On a held-out corpus (data.corpus with another seed: raw paragraphs and
chats rendered by k3d's renderer), with the checkpoint loaded by k3torch
(float32, the exported MXFP4/BF16 values):

  entropy     per MoE layer, of the share of routed slots each expert gets
              (bits; the maximum is log2(experts): uniform use)
  reuse       next-token expert reuse: the share of a token's top-k experts
              at a layer that the previous token of the same sequence also
              used (random routing gives top_k / experts)
  lookahead   router lookahead recall: the next MoE layer's router applied
              to the current residual (AttnRes-mixed and normed with that
              layer's weights, its attention skipped: k3d's prefetch guess,
              daemon/engine/engine.h) -> share of the real top-k it predicts
  n-gram      prompt-lookup draft, teacher-forced: at every position, the
              token that followed the most recent earlier occurrence of the
              last n tokens; `proposed` = positions with a proposal,
              `accepted` = the proposal equals the model's greedy token there

K3's published figures for comparison: reuse ~29.5%, lookahead recall ~59%.
"""
import json
import math
import os
import sys

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import data  # noqa: E402
import k3torch  # noqa: E402
import train  # noqa: E402


def ngram_draft(seq, t, n):
    """The prompt-lookup proposal for position t (the token after seq[t]),
    from seq[0..t]: the token after the latest earlier match of seq[t-n+1..t]."""
    if t + 1 < n:
        return None
    key = seq[t - n + 1: t + 1]
    for s in range(t - n, -1, -1):
        if seq[s: s + n] == key:
            return seq[s + n]
    return None


def main():
    ap = train.options(("model", "k3ctl"), seed=2, texts=150, chats=100)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(1)
    m = k3torch.load_checkpoint(a.model, torch.float32).set_kda_chunk(16)
    m.eval()
    cfg = m.cfg
    texts, chats = data.corpus(a.seed, a.texts, a.chats)
    import bpe
    tok = bpe.load(a.model)
    seqs = [tok.encode(t) for t in texts]
    cache = {}
    for c in chats:
        seqs.append(train.render(a.k3ctl, a.model, dict(c, add_generation_prompt=False), cache))
    moe = [l for l in range(cfg.L) if cfg.is_moe(l)]
    use = {l: torch.zeros(cfg.E) for l in moe}
    reuse = {l: [0, 0] for l in moe}
    look = {l: [0, 0] for l in moe[1:]}
    ng = {n: [0, 0, 0] for n in (1, 2, 3)}   # positions, proposed, accepted
    with torch.no_grad():
        for s in seqs:
            info, la = [], []
            lg = m(torch.tensor([s]), info=info, lookahead=la)[0]
            greedy = lg.argmax(-1).tolist()
            for inf in info:
                l = inf["layer"]
                sel = inf["sel"]                       # [T, K]
                use[l] += torch.bincount(sel.reshape(-1), minlength=cfg.E).float()
                for t in range(1, sel.shape[0]):
                    reuse[l][0] += len(set(sel[t].tolist()) & set(sel[t - 1].tolist()))
                    reuse[l][1] += cfg.K
            real = {inf["layer"]: inf["sel"] for inf in info}
            for g in la:
                r = real[g["layer"]]
                for t in range(r.shape[0]):
                    look[g["layer"]][0] += len(set(g["sel"][t].tolist()) & set(r[t].tolist()))
                    look[g["layer"]][1] += cfg.K
            for n in ng:
                for t in range(len(s) - 1):
                    p = ngram_draft(s, t, n)
                    ng[n][0] += 1
                    if p is not None:
                        ng[n][1] += 1
                        ng[n][2] += p == greedy[t]
    out = {"experts": cfg.E, "top_k": cfg.K, "max_entropy_bits": math.log2(cfg.E),
           "random_reuse": cfg.K / cfg.E, "sequences": len(seqs),
           "tokens": sum(len(s) for s in seqs), "layers": []}
    for l in moe:
        p = use[l] / use[l].sum()
        h = float(-(p[p > 0] * p[p > 0].log2()).sum())
        row = {"layer": l, "entropy_bits": h, "reuse": reuse[l][0] / reuse[l][1],
               "max_share": float(p.max()), "unused": int((p == 0).sum())}
        if l in look:
            row["lookahead_recall"] = look[l][0] / look[l][1]
        out["layers"].append(row)
    out["reuse_mean"] = sum(r[0] for r in reuse.values()) / sum(r[1] for r in reuse.values())
    out["lookahead_recall_mean"] = sum(r[0] for r in look.values()) / max(1, sum(r[1] for r in look.values()))
    out["ngram"] = {str(n): {"proposed": v[1] / v[0], "accepted_of_proposed": v[2] / max(1, v[1]),
                             "accepted_of_all": v[2] / v[0]} for n, v in ng.items()}
    if a.json:
        print(json.dumps(out, indent=2))
        return 0
    print("held-out corpus: %d sequences, %d tokens; %d experts, top-%d" % (
        out["sequences"], out["tokens"], cfg.E, cfg.K))
    print("layer  entropy (bits, max %.2f)  reuse  lookahead recall  busiest expert  unused" % out["max_entropy_bits"])
    for r in out["layers"]:
        print("%5d  %8.3f                   %5.1f%%  %s  %13.1f%%  %6d" % (
            r["layer"], r["entropy_bits"], 100 * r["reuse"],
            ("%14.1f%%" % (100 * r["lookahead_recall"])) if "lookahead_recall" in r else "%15s" % "-",
            100 * r["max_share"], r["unused"]))
    print("mean   reuse %.1f%% (random routing %.1f%%; K3 ~29.5%%), lookahead recall %.1f%% (K3 ~59%%)" % (
        100 * out["reuse_mean"], 100 * out["random_reuse"], 100 * out["lookahead_recall_mean"]))
    for n, v in out["ngram"].items():
        print("%s-gram draft: proposes at %.1f%% of positions, %.1f%% of proposals equal the greedy token "
              "(%.1f%% of all positions)" % (n, 100 * v["proposed"], 100 * v["accepted_of_proposed"],
                                             100 * v["accepted_of_all"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""train.py - trains the `trained` demo model on CPU and exports it.

    nice -n 10 python3 tools/train_demo/train.py --k3ctl build/plain/client/k3ctl/k3ctl \\
        --out DIR [--steps N] [--seed S] [--bench N] [--recipe RECIPE.json]

Steps, all deterministic (fixed seed, fixed data order, fixed thread count):
  1. the corpus (data.py, DATA_VERSION) and the tokenizer learned from it
     (bpe.py), written to DIR;
  2. chats rendered and encoded by k3d's own renderer (`k3ctl render-chat
     --ids`), raw text encoded by bpe.py and checked id for id against
     `k3ctl tokenize` on the whole raw corpus;
  3. training (AdamW, warmup + cosine, loss-free routing balance through
     e_score_correction_bias as K3's noaux_tc does, quantization-aware for
     the last QAT_SHARE of the steps: bfloat16 weights, MXFP4 experts);
  4. export (export.py) in the release's layout, RECIPE.json and SHA256SUMS.

--bench N: runs N training steps of the configuration and prints tokens/s
(no export).
"""
import argparse
import hashlib
import json
import math
import os
import platform
import random
import subprocess
import sys
import tempfile
import time

# One thread everywhere: on a shared 2-core machine OpenMP and OpenBLAS
# threads spin against each other (measured 5x slower with 2), and one
# thread makes the float order independent of the core count.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe  # noqa: E402
import data  # noqa: E402
import export  # noqa: E402
import k3torch  # noqa: E402

# The model: K3's layout at a few MB (docs/formats.md, preset "trained").
# 8 layers: MLA at 4, 7, 8 (every 4th and the last two, 1-based), KDA
# elsewhere; layer 0 dense, 1..7 latent MoE; AttnRes blocks of 3.
DIMS = dict(layers=8, hidden=128, ranks=1792, intermediate=384, experts=32, top_k=4,
            moe_intermediate=64, latent=64, shared_experts=2, kda_heads=4, kda_head_dim=32,
            mla_heads=4, q_lora=64, kv_lora=32, nope=32, rope=16, v_head=32, attn_res_block=3)

TRAIN = dict(steps=480, tokens_per_step=2048, lr=5e-3, warmup=20, min_lr_share=0.05,
             weight_decay=0.01, clip=1.0, qat_share=0.12, bias_rate=1e-3, kda_chunk=16,
             n_text=12000, n_chat=6000, threads=1)


def text_config(d, vocab):
    L = d["layers"]
    kda = [l + 1 for l in range(L) if not ((l + 1) % 4 == 0 or l + 2 >= L)]
    return {
        "vocab_size": vocab, "hidden_size": d["hidden"], "num_hidden_layers": L,
        "intermediate_size": d["intermediate"], "hidden_act": "situ", "activation_situ_beta": 4.0,
        "activation_situ_linear_beta": 25.0, "rms_norm_eps": 1e-5, "attn_res_block_size": d["attn_res_block"],
        "num_attention_heads": d["mla_heads"], "num_key_value_heads": d["mla_heads"],
        "q_lora_rank": d["q_lora"], "kv_lora_rank": d["kv_lora"], "qk_nope_head_dim": d["nope"],
        "qk_rope_head_dim": d["rope"], "v_head_dim": d["v_head"], "num_experts": d["experts"],
        "num_experts_per_token": d["top_k"], "num_shared_experts": d["shared_experts"],
        "moe_intermediate_size": d["moe_intermediate"], "moe_renormalize": True,
        "routed_scaling_factor": 1.0, "first_k_dense_replace": 1, "moe_layer_freq": 1,
        "routed_expert_hidden_size": d["latent"], "latent_moe_use_norm": True,
        "moe_router_activation_func": "sigmoid",
        "linear_attn_config": {"kda_layers": kda, "num_heads": d["kda_heads"], "head_dim": d["kda_head_dim"],
                               "short_conv_kernel_size": 4, "gate_lower_bound": -5.0,
                               "use_full_rank_gate": True},
    }


def init_weights(m, g):
    """Small-model init: activations O(1) at every layer; deterministic in g."""
    for n, p in sorted(m.named_parameters()):
        with torch.no_grad():
            if n.endswith("e_score_correction_bias"):
                p.zero_()
            elif n.endswith("A_log"):
                p.copy_(torch.log(1.0 + 7.0 * torch.rand(p.shape, generator=g)))
            elif n.endswith("dt_bias"):
                p.zero_()
            elif "_conv1d" in n:
                p.normal_(0.0, 0.1, generator=g)
                p[..., -1] += 1.0
            elif p.dim() == 1:
                p.fill_(1.0)
            elif "embed_tokens" in n:
                p.normal_(0.0, 1.0, generator=g)
            else:
                fan_in = p.shape[-1]
                out_proj = n.endswith(("o_proj.weight", "down_proj.weight", "up_proj.weight")) and \
                    "shared_experts.up_proj" not in n and "mlp.up_proj" not in n
                out_proj = out_proj or ".experts_w2" in n or "lm_head" in n
                std = (0.5 if out_proj else 1.0) / math.sqrt(fan_in)
                if n.endswith("_res_proj.weight"):
                    std = 0.0    # AttnRes starts as a plain average of its candidates
                p.normal_(0.0, std, generator=g) if std else p.zero_()
    return m


# ---------------------------------------------------------------- corpus


def render(k3ctl, tokdir, obj, cache):
    key = json.dumps(obj, sort_keys=True)
    if key in cache:
        return cache[key]
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(obj, f)
        path = f.name
    try:
        args = [k3ctl, "render-chat", path]
        if tokdir:
            args += ["--ids", "--vocab", os.path.join(tokdir, "tiktoken.model"),
                     "--config", os.path.join(tokdir, "tokenizer_config.json")]
        p = subprocess.run(args, capture_output=True, text=True, check=True)
    finally:
        os.unlink(path)
    out = [int(x) for x in p.stdout.split()] if tokdir else p.stdout
    cache[key] = out
    return out


SPECIAL_SPELLINGS = ["<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"]


def strip_specials(s):
    for sp in SPECIAL_SPELLINGS:
        s = s.replace(sp, "\n")
    return s


def build(k3ctl, out, seed):
    """(tokenizer, samples) where a sample is (ids, first loss position)."""
    texts, chats = data.corpus(seed, TRAIN["n_text"], TRAIN["n_chat"])
    cache = {}
    # the tokenizer learns from the raw text and the chats' rendered text
    rendered = []
    for c in chats:
        full = dict(c, add_generation_prompt=False)
        rendered.append(strip_specials(render(k3ctl, None, full, cache)))
    tok = bpe.train(texts + rendered, DIMS["ranks"])
    tok.write(out)
    # raw text: bpe.encode must equal k3d's tokenizer on all of it
    # (in pieces below the tokenizer's 400,000-code-point chunk, §1.5)
    i = 0
    while i < len(texts):
        j = i
        n = 0
        while j < len(texts) and n + len(texts[j]) < 300000:
            n += len(texts[j]) + 1
            j += 1
        joined = "\n".join(texts[i:j])
        p = subprocess.run([k3ctl, "tokenize", "--vocab", os.path.join(out, "tiktoken.model"), "--config",
                            os.path.join(out, "tokenizer_config.json"), "-"],
                           input=joined, capture_output=True, text=True, check=True)
        if [int(x) for x in p.stdout.split()] != tok.encode(joined):
            raise SystemExit("bpe.encode disagrees with k3ctl tokenize on the raw corpus")
        i = j
    samples = [(tok.encode(t), 0) for t in texts]
    cache = {}
    for c in chats:
        full = render(k3ctl, out, dict(c, add_generation_prompt=False), cache)
        prompt = render(k3ctl, out, dict(c, messages=c["messages"][:-1], add_generation_prompt=True), cache)
        if full[: len(prompt)] != prompt:
            raise SystemExit("a chat's prompt is not a prefix of the full chat: %s" % c)
        samples.append((full, len(prompt)))
    return tok, samples, len(texts), len(chats)


def batches(samples, tokens_per_step, r):
    """Deterministic epoch: samples sorted into length buckets, each batch a
    bucket slice of about tokens_per_step padded tokens, batches shuffled."""
    order = list(range(len(samples)))
    r.shuffle(order)
    order.sort(key=lambda i: len(samples[i][0]) // 16)
    out = []
    cur = []
    for i in order:
        T = len(samples[i][0])
        if cur and (len(cur) + 1) * max(T, max(len(samples[j][0]) for j in cur)) > tokens_per_step:
            out.append(cur)
            cur = []
        cur.append(i)
    if cur:
        out.append(cur)
    r.shuffle(out)
    return out


def collate(samples, idx, pad):
    T = max(len(samples[i][0]) for i in idx)
    ids = torch.full((len(idx), T), pad, dtype=torch.long)
    tgt = torch.full((len(idx), T), -100, dtype=torch.long)
    for b, i in enumerate(idx):
        s, start = samples[i]
        ids[b, : len(s)] = torch.tensor(s)
        # position t predicts s[t+1]; loss from the first assistant token on
        lo = max(start - 1, 0)
        tgt[b, lo: len(s) - 1] = torch.tensor(s[lo + 1:])
    return ids, tgt


# ---------------------------------------------------------------- training


def lr_at(step, steps):
    t = TRAIN
    if step < t["warmup"]:
        return t["lr"] * (step + 1) / t["warmup"]
    p = (step - t["warmup"]) / max(1, steps - t["warmup"])
    return t["lr"] * (t["min_lr_share"] + (1 - t["min_lr_share"]) * 0.5 * (1 + math.cos(math.pi * p)))


def train(m, samples, steps, seed, pad, log, bench=0):
    torch.manual_seed(seed)
    r = random.Random(seed)
    decay, no_decay = [], []
    for n, p in m.named_parameters():
        if not p.requires_grad:
            continue
        (decay if p.dim() >= 2 and "embed" not in n else no_decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": TRAIN["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=TRAIN["lr"], betas=(0.9, 0.95), eps=1e-8)
    moes = [ly.block_sparse_moe for ly in m.model.layers if hasattr(ly, "block_sparse_moe")]
    qat_from = int(steps * (1 - TRAIN["qat_share"]))
    epoch = []
    hist = []
    t0 = time.time()
    ntok = 0
    for step in range(bench or steps):
        if not epoch:
            epoch = batches(samples, TRAIN["tokens_per_step"], r)
        idx = epoch.pop()
        m.qat = step >= qat_from
        ids, tgt = collate(samples, idx, pad)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps)
        info = []
        logits = m(ids, info=info)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1),
                                                 ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), TRAIN["clip"])
        opt.step()
        # loss-free balance (noaux_tc): raise the bias of under-used experts,
        # lower it for over-used ones; selection only, never the weights
        with torch.no_grad():
            for moe, inf in zip(moes, info):
                cnt = torch.tensor(inf["counts"], dtype=torch.float32)
                err = cnt.mean() - cnt
                moe.gate.e_score_correction_bias.add_(TRAIN["bias_rate"] * torch.sign(err))
        ntok += int(ids.numel())
        hist.append(float(loss))
        if step % 10 == 0 or step == (bench or steps) - 1:
            el = time.time() - t0
            log("step %5d/%d  loss %.4f  lr %.2e  %s  %.0f tok/s  %.0f s" % (
                step, steps, sum(hist[-10:]) / len(hist[-10:]), lr_at(step, steps),
                "qat" if m.qat else "   ", ntok / el, el))
    m.qat = True
    return hist, time.time() - t0, ntok


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read())
    return h.hexdigest()


def environment():
    blas = os.path.realpath("/usr/lib/x86_64-linux-gnu/libblas.so.3")
    return {
        "python": platform.python_version(), "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(), "blas": blas, "machine": platform.machine(),
        "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE"),
        "OPENBLAS_NUM_THREADS": os.environ.get("OPENBLAS_NUM_THREADS"),
        "debian_packages": debian_versions(["python3-torch", "libopenblas0-pthread", "python3-numpy"]),
    }


def debian_versions(pkgs):
    out = {}
    for p in pkgs:
        r = subprocess.run(["dpkg-query", "-W", "-f=${Version}", p], capture_output=True, text=True)
        out[p] = r.stdout.strip() if r.returncode == 0 else None
    return out


def options(required, **ints):
    """The command line of a demo tool: a required --NAME string per name in
    required, then an integer --NAME per keyword (its default)."""
    ap = argparse.ArgumentParser()
    for name in required:
        ap.add_argument("--" + name, required=True)
    for name, default in ints.items():
        ap.add_argument("--" + name, type=int, default=default)
    return ap


def main():
    ap = options(("k3ctl", "out"), seed=1, steps=TRAIN["steps"], bench=0)
    ap.add_argument("--recipe", default=None,
                    help="RECIPE.json of an earlier run: its seed, dims and training settings")
    a = ap.parse_args()
    if a.recipe:
        with open(a.recipe) as f:
            rec = json.load(f)
        if rec["data_version"] != data.DATA_VERSION:
            raise SystemExit("the recipe used data version %d, data.py is %d" % (rec["data_version"],
                                                                                data.DATA_VERSION))
        DIMS.update(rec["dims"])
        TRAIN.update(rec["train"])
        a.seed, a.steps = rec["seed"], rec["train"]["steps"]
    torch.set_num_threads(TRAIN["threads"])
    torch.use_deterministic_algorithms(True)
    os.makedirs(a.out, exist_ok=True)
    logf = open(os.path.join(a.out, "train.log"), "w")

    def log(s):
        print(s, flush=True)
        logf.write(s + "\n")
        logf.flush()

    t0 = time.time()
    tok, samples, n_text, n_chat = build(a.k3ctl, a.out, a.seed)
    lens = [len(s) for s, _ in samples]
    log("corpus: %d raw paragraphs + %d chats, %d tokens (mean %.0f, max %d), vocab %d; %.0f s" % (
        n_text, n_chat, sum(lens), sum(lens) / len(lens), max(lens), tok.vocab, time.time() - t0))
    cfg = k3torch.Config(text_config(DIMS, tok.vocab))
    g = torch.Generator().manual_seed(a.seed)
    m = init_weights(k3torch.K3(cfg), g).set_kda_chunk(TRAIN["kda_chunk"])
    pad = tok.special("[PAD]")
    hist, secs, ntok = train(m, samples, a.steps, a.seed, pad, log, a.bench)
    if a.bench:
        log("bench: %d steps, %.0f tokens/s (padded), %.2f s/step" % (a.bench, ntok / secs, secs / a.bench))
        return 0
    note = {"generator": "tools/train_demo/train.py", "seed": a.seed, "data_version": data.DATA_VERSION,
            "note": "trained on generated English facts and XTML chats; see tools/train_demo/README.md"}
    names = export.export(m, tok, a.out, note)
    sums = {n: sha256(os.path.join(a.out, n)) for n in names}
    with open(os.path.join(a.out, "SHA256SUMS"), "w") as f:
        for n in names:
            f.write("%s  %s\n" % (sums[n], n))
    recipe = {
        "recipe_version": 1, "seed": a.seed, "data_version": data.DATA_VERSION, "dims": DIMS,
        "train": dict(TRAIN, steps=a.steps), "environment": environment(),
        "corpus": {"paragraphs": n_text, "chats": n_chat, "tokens": sum(lens)},
        "result": {"final_loss_mean_last_50": sum(hist[-50:]) / len(hist[-50:]),
                   "train_seconds": round(secs, 1), "tokens_seen_padded": ntok},
        "sha256": sums,
    }
    export.dump_json(os.path.join(a.out, "RECIPE.json"), recipe)
    log("exported %s: %s" % (a.out, ", ".join(names)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""crosscheck.py - the float64 cross-check of k3torch against the goldens
and against k3d.

For every golden case (../shared/golden/forward/<case>/) and prompt
(golden/p*.json): loads the checkpoint with k3torch in float64, runs the
prompt, and compares
  * the logits at every prompt position with the golden `all_logits`
    (relative L2 per position, the worst reported),
  * the route sets and weights with the golden `routes`,
  * the greedy continuation with `greedy.tokens`,
  * when --k3ctl is given, the last-position logits with `k3ctl forward
    --json` (k3d's fp32 engine) and its greedy ids.

With --model DIR (a checkpoint without goldens, e.g. the trained demo
model) and --k3ctl: the float64 logits of the prompt --text (tokenized by
k3d) against k3d's, and both greedy continuations.

    crosscheck.py [--golden DIR] [--k3ctl PATH] [--limit REL]
                  [--model DIR --text TEXT]

Exit 0 when every figure is within the limit (default 1e-9 against the
float64 goldens, 1e-4 against k3d's float32), 1 otherwise, 77 when torch is
missing (the test harness's SKIP).
"""
import argparse
import glob
import json
import os
import subprocess
import sys

try:
    import torch
except ImportError:
    print("SKIP: torch is not importable (apt-get install python3-torch)")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import k3torch  # noqa: E402


def rel_l2(a, b):
    a = torch.as_tensor(a, dtype=torch.float64)
    b = torch.as_tensor(b, dtype=torch.float64)
    return float((a - b).norm() / b.norm())


def greedy(m, ids, steps):
    out = []
    seq = list(ids)
    for _ in range(steps):
        lg = m(torch.tensor([seq]))[0, -1]
        # argmax ties -> lowest id (the goldens' rule)
        t = int(torch.nonzero(lg == lg.max())[0])
        out.append(t)
        seq.append(t)
    return out


def check_model(a):
    """k3torch float64 vs k3d on a checkpoint without goldens."""
    if not a.k3ctl:
        print("--model needs --k3ctl")
        return 2
    p = subprocess.run([a.k3ctl, "tokenize", "--model", a.model, a.text], capture_output=True, text=True,
                       check=True)
    ids = [int(x) for x in p.stdout.split()]
    m = k3torch.load_checkpoint(a.model, torch.float64)
    with torch.no_grad():
        lg = m(torch.tensor([ids]))[0, -1]
        gt = greedy(m, ids, a.steps)
    p = subprocess.run([a.k3ctl, "forward", "--json", "--model", a.model, "--ids", ",".join(map(str, ids)),
                        "--steps", str(a.steps)], capture_output=True, text=True, check=True)
    k = json.loads(p.stdout)
    r = rel_l2(k["last_logits"], lg)
    ok = r <= a.k3d_limit and k["greedy"]["tokens"] == gt
    print("%s %s: %r = %s, k3torch float64 vs k3d fp32 last-position rel-L2 %.3g; greedy %s (k3d %s)" % (
        "ok  " if ok else "FAIL", os.path.basename(os.path.normpath(a.model)), a.text, ids, r, gt,
        "same" if k["greedy"]["tokens"] == gt else k["greedy"]["tokens"]))
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser()
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--golden", default=os.path.join(here, "..", "..", "..", "shared", "golden", "forward"))
    ap.add_argument("--k3ctl", default=None)
    ap.add_argument("--limit", type=float, default=1e-9)
    ap.add_argument("--k3d-limit", type=float, default=1e-4)
    ap.add_argument("--model", default=None)
    ap.add_argument("--text", default="The capital of France is")
    ap.add_argument("--steps", type=int, default=8)
    a = ap.parse_args()
    torch.set_num_threads(1)
    if a.model:
        return check_model(a)
    cases = sorted(glob.glob(os.path.join(a.golden, "*", "model")))
    if not cases:
        print("SKIP: no golden checkpoints under %s" % a.golden)
        return 77
    bad = 0
    for mdir in cases:
        case = os.path.basename(os.path.dirname(mdir))
        m = k3torch.load_checkpoint(mdir, torch.float64)
        m.eval()
        for gp in sorted(glob.glob(os.path.join(os.path.dirname(mdir), "golden", "p*.json"))):
            with open(gp) as f:
                g = json.load(f)
            ids = g["prompt"]
            info = []
            with torch.no_grad():
                lg = m(torch.tensor([ids]), info=info)[0]
                worst = max(rel_l2(lg[t], g["all_logits"][t]) for t in range(len(ids)))
                route_bad = 0
                wmax = 0.0
                for r, mine in zip(g["routes"], info):
                    assert r["layer"] == mine["layer"]
                    for pi, pos in enumerate(r["positions"]):
                        sel = mine["sel"][pos].tolist()
                        if set(sel) != set(r["experts"][pi]):
                            route_bad += 1
                            continue
                        s = mine["scores"][pos]
                        w = s[sel] / (s[sel].sum() + 1e-20)
                        ref = dict(zip(r["experts"][pi], r["weights"][pi]))
                        for e, wv in zip(sel, w.tolist()):
                            wmax = max(wmax, abs(wv - ref[e]))
                gt = greedy(m, ids, len(g["greedy"]["tokens"]))
            ok = worst <= a.limit and route_bad == 0 and gt == g["greedy"]["tokens"] and wmax <= 1e-9
            line = "%s %s: %d tokens, rel-L2 vs golden (worst position) %.3g, routes %s (max weight diff %.2g), greedy %s" % (
                case, os.path.basename(gp), len(ids), worst, "ok" if not route_bad else "%d WRONG" % route_bad,
                wmax, "ok" if gt == g["greedy"]["tokens"] else "WRONG %s" % gt)
            if a.k3ctl:
                p = subprocess.run([a.k3ctl, "forward", "--json", "--model", mdir, "--ids",
                                    ",".join(map(str, ids)), "--steps", str(len(gt))],
                                   capture_output=True, text=True)
                if p.returncode != 0:
                    line += "; k3ctl forward FAILED: %s" % p.stderr.strip()
                    ok = False
                else:
                    k = json.loads(p.stdout)
                    r = rel_l2(k["last_logits"], lg[-1])
                    kg = k["greedy"]["tokens"]
                    line += "; vs k3d (fp32) last position %.3g, k3d greedy %s" % (r, "same" if kg == gt else "DIFFERS")
                    ok = ok and r <= a.k3d_limit and kg == gt
            print(("ok   " if ok else "FAIL ") + line)
            bad += not ok
    print("%d case(s) failed" % bad if bad else "all cases agree")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""bench_draft.py - speculative decoding through the real k3d (issue 18):
tokens/s and expert bytes read per generated token with the oracle draft
at several acceptance rates against drafting off, all in ONE interleaved
run (every round sends the same request to each configuration in turn,
so load drifts hit them alike); medians over the rounds. Prints, never
asserts.

    bench_draft.py K3D K3CTL [--rounds N] [--max-new N] [--experts N]
                   [--cache-gb G] [--threads N] [--spine-resident none|N|mapped]
                   [--io-rate GBPS] [--keep DIR]

The model is the `bench` demo preset (K3's real expert shapes) with
--experts routed experts per MoE layer, not the trained demo model: the
figures are bytes per token on K3-sized experts and the oracle sets the
acceptance, so what matters is the expert shape; routing realism enters
only through the distinct experts a pass routes to (random here, so the
expert bytes are a pessimistic case; docs/draft.md). n-gram acceptance on
a model's own text is bench_draft_chat.py's, on the trained model; the expert cache (--cache-gb) is
smaller than the pool, so experts are read every pass, and the spine
streams (--spine-resident none: every layer read once per pass, whatever
its width). Configurations:
off; the oracle at 100 % acceptance at width 5 (4 proposals) and under the
width policy; at ~50 % and 0 % under the policy (which is expected to
switch the 0 % one off). --io-rate is passed to k3d when given (the
emulated drive of the spine issue); without it reads hit the real disk
(O_DIRECT where the file system allows it, else the page cache).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
from k3proto import T, connect, f64, field, frame, ids_field, read_frame, u32, u64, unpack_ids  # noqa

NAMES = {v: k for k, v in T.items()}


def generate(sock, ids=None, max_new=64, draft=None, chat=None, prompt=None):
    """One GENERATE (raw ids, raw text, or chat {"messages", "tools"}); returns
    (generated ids, DONE fields)."""
    p = field(1, 1 if chat else 0)
    if chat:
        p += field(4, json.dumps(chat["messages"]))
        if "tools" in chat:
            p += field(5, json.dumps(chat["tools"]))
    elif prompt is not None:
        p += field(2, prompt)
    else:
        p += ids_field(3, ids)
    p += field(8, max_new)
    if draft is not None:
        p += field(13, draft)
    c = connect(sock)
    c.sendall(frame(T["GENERATE"], 1, p))
    out = []
    while True:
        t, _, f = read_frame(c, 600)
        name = NAMES.get(t)
        if name == "TOKEN":
            out += unpack_ids(f[1][0])
        elif name == "DONE":
            c.close()
            return out, f
        elif name == "ERROR":
            raise RuntimeError(f[2][0].decode())


class K3d:
    def __init__(self, k3d, d, name, model, args):
        self.name, self.sock = name, os.path.join(d, name + ".sock")
        self.log = open(os.path.join(d, name + ".log"), "w")
        self.proc = subprocess.Popen([k3d, "--socket", self.sock, "--model", model, *args],
                                     stderr=self.log, stdin=subprocess.DEVNULL)
        end = time.time() + 120
        while not os.path.exists(self.sock) or "ready:" not in open(self.log.name).read():
            if self.proc.poll() is not None or time.time() > end:
                raise RuntimeError(name + ": " + open(self.log.name).read())
            time.sleep(0.05)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(30)
        self.log.close()


def bench_args(**ints):
    """The parser of a bench that drives k3d: the K3D and K3CTL paths, then
    an integer --NAME option per keyword (its default; _ in a name is -)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("k3d")
    ap.add_argument("k3ctl")
    for name, default in ints.items():
        ap.add_argument("--" + name.replace("_", "-"), type=int, default=default)
    return ap


def main():
    ap = bench_args(rounds=5, max_new=64, experts=32)
    ap.add_argument("--cache-gb", type=float, default=0.3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--io-rate", type=float, default=0)
    ap.add_argument("--spine-resident", default="none",
                    help="k3d --spine-resident (none: every layer streams; 'mapped': the spine stays mapped)")
    ap.add_argument("--keep", default=None, help="reuse/keep the model in this directory")
    a = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="k3-bench-draft-")
    model = a.keep or os.path.join(tmp, "bench")
    if not os.path.exists(os.path.join(model, "config.json")):
        subprocess.run([a.k3ctl, "demo-model", "--out", model, "--preset", "bench", "--experts",
                        str(a.experts)], check=True)
    prompt = [17, 301, 45, 1200, 9, 877, 33, 501]
    common = ["--threads", str(a.threads), "--expert-cache-gb", str(a.cache_gb), "--prefetch", "off"]
    if a.spine_resident != "mapped":
        common += ["--spine-resident", a.spine_resident]
    if a.io_rate:
        common += ["--io-rate", str(a.io_rate)]
    ref = K3d(a.k3d, tmp, "ref", model, common + ["--draft", "off"])
    truth_ids, _ = generate(ref.sock, prompt, a.max_new)
    ref.stop()
    truth = os.path.join(tmp, "truth.txt")
    with open(truth, "w") as f:
        f.write(",".join(map(str, prompt + truth_ids)))
    oracle = ["--draft", "ngram", "--draft-oracle", truth]
    configs = [
        ("off", ["--draft", "off"]),
        ("100% width 5", oracle + ["--draft-width", "4"]),
        ("100% policy", oracle),
        ("~50% policy", oracle + ["--draft-oracle-spoil", "0.5"]),
        ("0% policy", oracle + ["--draft-oracle-spoil", "1"]),
    ]
    ds = [K3d(a.k3d, tmp, "c%d" % i, model, common + args) for i, (_, args) in enumerate(configs)]
    res = {name: [] for name, _ in configs}
    load0 = os.getloadavg()
    t0 = time.time()
    try:
        for r in range(a.rounds + 1):            # round 0 warms the page cache and the fit
            for (name, _), d in zip(configs, ds):
                ids, f = generate(d.sock, prompt, a.max_new)
                if ids != truth_ids:
                    print(f"!! {name}: ids differ from drafting off")
                if r == 0:
                    continue
                n = max(u32(f, 3), 1)
                xb, sb = u64(f, 11) or 0, u64(f, 22) or 0     # expert and spine bytes
                res[name].append(dict(tps=f64(f, 10) or 0, xbytes=xb / n, sbytes=sb / n,
                                      bytes=(xb + sb) / n, passes=u64(f, 29) or 0,
                                      proposed=u64(f, 27) or 0, accepted=u64(f, 28) or 0,
                                      tpp=f64(f, 30) or 0, io=f64(f, 17) or 0))
    finally:
        for d in ds:
            d.stop()
    load1 = os.getloadavg()
    print(f"# bench_draft: bench preset, {a.experts} experts/layer, cache {a.cache_gb} GB, "
          f"{a.threads} threads, {a.max_new} ids, {a.rounds} interleaved rounds "
          f"({time.time() - t0:.0f} s); load {load0[0]:.1f} -> {load1[0]:.1f}; "
          f"{'--io-rate %g GB/s' % a.io_rate if a.io_rate else 'real disk (O_DIRECT where possible)'}")
    med = {k: {m: statistics.median(x[m] for x in v) for m in v[0]} for k, v in res.items()}
    base = med["off"]
    print(f"# spine: --spine-resident {a.spine_resident}; bytes per generated token = (expert + spine"
          f" bytes read) / completion tokens, prefill included")
    print(f"{'config':14} {'tok/s':>7} {'x off':>6} {'(rounds)':>11} {'bytes/tok':>11} {'off/this':>8} "
          f"{'spine/tok':>10} {'expert/tok':>10} {'ids/pass':>8} {'accept':>7} {'io wait':>7}")
    for name, _ in configs:
        m = med[name]
        acc = m["accepted"] / m["proposed"] if m["proposed"] else 0.0
        # the same round's ratio to off, then its median and range
        rr = sorted(x["tps"] / o["tps"] for x, o in zip(res[name], res["off"]) if o["tps"])
        rng = f"{rr[0]:.2f}-{rr[-1]:.2f}" if rr else "-"
        print(f"{name:14} {m['tps']:7.2f} {statistics.median(rr) if rr else 0:6.2f} {rng:>11} "
              f"{m['bytes']:11.0f} {(base['bytes'] / m['bytes']) if m['bytes'] else 0:8.2f} "
              f"{m['sbytes']:10.0f} {m['xbytes']:10.0f} {m['tpp']:8.2f} {acc:7.2f} {m['io']:7.3f}")
    shutil.rmtree(tmp, ignore_errors=True)     # a --keep model lives outside it
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""bench_tiers.py - the measurement behind the memory planner's tier
policy (docs/plan.md, "Which tier first"): at one memory budget for spine +
experts, split A keeps the whole spine resident and gives the rest to the
expert cache; split B keeps no spine layer resident (the ring of two arenas
streams every layer each pass) and gives the memory that frees to the
expert cache. Both run through the emulated drive at a fixed rate over
page-cached files, rounds interleaved, medians printed; nothing asserted.

    bench_tiers.py K3CTL MODEL_DIR [--cache-gb G] [--rate GBPS] [--rounds N]
                   [--max-new N]

The expert side (tokens/s, expert bytes per token at each cache size) is
measured. The spine side of B is measured too when `k3ctl bench` streams
the spine (--spine-resident); otherwise it is computed from the plan's
bytes: B's streamed spine bytes per token at the emulated rate, added to
B's measured time (an upper bound: streaming overlaps compute).
"""
import json
import statistics
import subprocess
import sys


def arg(name, default, conv=float):
    if name in sys.argv:
        return conv(sys.argv[sys.argv.index(name) + 1])
    return default


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    k3ctl, model = sys.argv[1], sys.argv[2]
    cache_gb = arg("--cache-gb", 0.5)
    rate = arg("--rate", 1.0)
    rounds = arg("--rounds", 3, int)
    max_new = arg("--max-new", 48, int)

    plan = lambda *a: json.loads(subprocess.run([k3ctl, "--json", "plan", "--model", model,
                                                 "--ram", "256G", *a], check=True,
                                                capture_output=True, text=True).stdout)
    allres = plan()
    none = plan("--spine-resident", "none")
    slot = allres["slot_bytes"]
    spine = allres["spine_total_bytes"]
    ring = none["spine_ring_bytes"]
    freed = spine - ring                       # what B frees for experts
    slots_a = int(cache_gb * 1e9) // slot
    slots_b = (int(cache_gb * 1e9) + freed) // slot
    streamed = none["cold_spine_bytes_per_token"]
    h = subprocess.run([k3ctl, "bench", "--help"], capture_output=True, text=True)
    bench_help = h.stdout + h.stderr
    streams = "--spine-resident" in bench_help
    # warm the page cache so the emulated drive, not the disk, sets the pace
    subprocess.run(["sh", "-c", f"cat '{model}'/*.safetensors > /dev/null"], check=True)
    print(f"model {model}: spine {spine / 1e6:.1f} MB (ring {ring / 1e6:.1f} MB), expert slots "
          f"of {slot} bytes; budget spine + experts = {(spine + cache_gb * 1e9) / 1e9:.3f} GB; "
          f"emulated drive {rate} GB/s, --direct off, prefetch off, {rounds} rounds, "
          f"{max_new} decode steps")
    print(f"A: all spine resident, {slots_a} expert slots")
    print(f"B: no spine layer resident ({streamed / 1e6:.1f} MB of spine read per token), "
          f"{slots_b} expert slots")
    res = {"A": [], "B": []}
    for r in range(rounds):
        for name, slots in (("A", slots_a), ("B", slots_b)) if r % 2 == 0 else \
                (("B", slots_b), ("A", slots_a)):
            cmd = [k3ctl, "--json", "bench", "--model", model, "--expert-cache-gb",
                   "%.9f" % ((slots * slot + 1) / 1e9), "--io-rate", str(rate), "--direct", "off",
                   "--prefetch", "off", "--max-new", str(max_new), "--prompt-len", "32",
                   "--disk-samples", "2", "--disk-mib", "64"]
            if name == "B" and streams:
                cmd += ["--spine-resident", "none"]
            o = json.loads(subprocess.run(cmd, check=True, capture_output=True,
                                          text=True).stdout)
            d = o["decode"]
            res[name].append((d["tokens_per_s"], d["bytes_per_token"], o["decode_s_per_token"],
                              d.get("spine_bytes_per_token", 0),
                              o.get("decode_vs_emulated_floor", 0)))
    out = {}
    for name in ("A", "B"):
        tps = statistics.median(x[0] for x in res[name])
        bpt = statistics.median(x[1] for x in res[name])
        spt = statistics.median(x[2] for x in res[name])
        sbt = statistics.median(x[3] for x in res[name])
        vsf = statistics.median(x[4] for x in res[name])
        out[name] = (tps, bpt, spt)
        print(f"{name}: {tps:.3f} tokens/s measured ({', '.join('%.3f' % x[0] for x in res[name])}),"
              f" {bpt / 1e6:.2f} MB of experts and {sbt / 1e6:.2f} MB of spine read per token;"
              f" {vsf:.2f} x the emulated floor")
    (ta, ea, sa), (tb, eb, sb) = out["A"], out["B"]
    saved = ea - eb
    print(f"expert cache: {slots_b - slots_a} more slots ({freed / 1e6:.1f} MB) saved "
          f"{saved / 1e6:.2f} MB of expert reads per token: {saved / freed:.3f} bytes per byte "
          f"of cache per token (uniform routing predicts top_k / experts per layer)")
    print(f"spine: streaming it costs {streamed / 1e6:.1f} MB per token: 1 byte read per pass "
          f"for every byte of spine not resident")
    if not streams:
        sb_total = sb + streamed / (rate * 1e9)
        print(f"B with its spine reads (computed: {streamed / 1e6:.1f} MB at {rate} GB/s added): "
              f"{1 / sb_total:.3f} tokens/s, {(eb + streamed) / 1e6:.2f} MB per token; A: "
              f"{ta:.3f} tokens/s, {ea / 1e6:.2f} MB per token")
    else:
        print(f"B measured with the spine streamed: {tb:.3f} tokens/s; A: {ta:.3f} tokens/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

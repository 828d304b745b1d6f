#!/usr/bin/env python3
"""Several drives, hedging, prefetch and expert-major prefill through the
real k3d (issue 19): on a golden checkpoint whose packs are laid out over
one, two and three drives (the model directory, a full copy written by
`k3ctl pack --out DIR --layers all`, a partial one by `--layers` and one of
the hottest experts by `--hot-experts N --trace FILE`), with hedging on and
off (and a stalled emulated drive), prefetch on and off, and the prefill in
one pass or token by token (--prefill-chunk 1), the greedy ids equal the
golden continuations and the router traces (ids and fp32 weight bits) are
identical; every DONE's expert bytes add up exactly (total = demand +
prefetch used + prefetch wasted, and the per-drive figures sum to the
totals); STATUS's totals are the sum of the DONEs; `k3ctl status` prints a
line per drive.

usage: test_drives.py K3D K3CTL SHARED_DIR
"""
import json
import os
import shutil
import struct
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
from k3proto import Daemon, generate_ids as generate, u64  # noqa
from k3test import check, check_routes, golden_model, golden_runs, packed_copy, report  # noqa

K3D, K3CTL, SHARED = sys.argv[1], sys.argv[2], sys.argv[3]

# DONE tags (docs/protocol.md)
EXPERT_BYTES, WASTED = 11, 16
D_BYTES, D_DEMAND, D_USED, D_WASTED, D_SPINE, D_HEDGES = 60, 61, 62, 63, 64, 65
DEMAND, USED = 67, 68
PREFILL_BYTES, PREFILL_DISTINCT, SPAN, CHUNK = 71, 72, 73, 74


def u64s(fields, tag):
    """A U64S field's values (little-endian u64 each), None when absent."""
    if tag not in fields:
        return None
    b = fields[tag][0]
    return [struct.unpack_from("<Q", b, i)[0] for i in range(0, len(b), 8)]


def k3ctl(*args):
    return subprocess.run([K3CTL, *args], capture_output=True, text=True)


def main():
    case = "k3tiny_b"
    model = golden_model(SHARED, case)
    if model is None:
        sys.exit(77)
    goldens = golden_runs(SHARED, case)
    work, packed, r = packed_copy(K3CTL, model, "k3d-drives-")
    try:
        check(r.returncode == 0, f"k3ctl pack: {r.stderr}")
        full, part, hot = (os.path.join(work, n) for n in ("full", "part", "hot"))
        r = k3ctl("pack", "--model", packed, "--out", full, "--layers", "all")
        check(r.returncode == 0 and "spine" not in os.listdir(full)[0],
              f"pack --layers all: {r.stdout} {r.stderr}")
        check(not os.path.exists(os.path.join(full, "spine.k3pack")),
              "a copy for another drive has no spine pack")
        r = k3ctl("pack", "--model", packed, "--out", part, "--layers", "1-3,7")
        check(r.returncode == 0 and sorted(os.listdir(part)) ==
              [f"experts-L00{n}.k3pack" for n in (1, 2, 3, 7)], f"pack --layers 1-3,7: {r.stdout}")
        # a reference run writes the router trace the hot copy is chosen from
        trace = os.path.join(work, "trace.jsonl")
        variants = [
            ("1 drive, prefill one pass", []),
            ("1 drive, token by token", ["--prefill-chunk", "1"]),
            ("1 drive, prefetch off, hedge off", ["--prefetch", "off", "--hedge", "off"]),
            ("2 drives (full copy)", ["--expert-dir", full]),
            ("2 drives, one stalled, hedged", ["--expert-dir", full, "--io-stall", "20:0.3,0",
                                               "--hedge", "1.5", "--prefetch", "4"]),
            ("2 drives, one stalled, hedge off", ["--expert-dir", full, "--io-stall", "20:0.3,0",
                                                  "--hedge", "off", "--prefetch", "off"]),
            ("3 drives (full, partial), prefill chunk 3", ["--expert-dir", full, "--expert-dir",
                                                           part, "--prefill-chunk", "3"]),
            ("3 drives (partial, hot)", ["--expert-dir", part, "--expert-dir", hot,
                                         "--io-rate", "1,2,3", "--prefetch", "off"]),
        ]
        ref = None
        for name, args in variants:
            if "hot" in name and not os.path.isdir(hot):
                r = k3ctl("pack", "--model", packed, "--out", hot, "--hot-experts", "40",
                          "--trace", trace_ref)
                check(r.returncode == 0 and "hot experts: 40 of" in r.stdout,
                      f"pack --hot-experts: {r.stdout} {r.stderr}")
            if os.path.exists(trace):
                os.unlink(trace)
            n_drives = 1 + args.count("--expert-dir")
            d = Daemon(K3D, "--router-trace", trace, *args, model=packed)
            try:
                tot = [0, 0, 0, 0]   # bytes, demand, used, wasted over the DONEs
                for prompt, want in goldens:
                    got, done = generate(d.sock, prompt, len(want))
                    check(got == want, f"{name}: greedy {got} == golden {want}")
                    b, dem, used, wasted = (u64(done, t) for t in (EXPERT_BYTES, DEMAND, USED, WASTED))
                    per = [u64s(done, t) for t in (D_BYTES, D_DEMAND, D_USED, D_WASTED)]
                    check(None not in (b, dem, used, wasted) and None not in per,
                          f"{name}: DONE has the byte counters: {sorted(done)}")
                    if None in (b, dem, used, wasted) or None in per:
                        continue
                    check(len(per[0]) == n_drives, f"{name}: {len(per[0])} drives in DONE")
                    check(b == dem + used + wasted,
                          f"{name}: bytes {b} == demand {dem} + used {used} + wasted {wasted}")
                    check([sum(x) for x in per] == [b, dem, used, wasted],
                          f"{name}: per-drive sums {[sum(x) for x in per]} == {[b, dem, used, wasted]}")
                    for i in range(n_drives):
                        check(per[0][i] == per[1][i] + per[2][i] + per[3][i],
                              f"{name}: drive {i} adds up: {[x[i] for x in per]}")
                    for i, v in enumerate((b, dem, used, wasted)):
                        tot[i] += v
                    pb, pd, span = (u64(done, t) for t in (PREFILL_BYTES, PREFILL_DISTINCT, SPAN))
                    check(pd and span and pb is not None, f"{name}: DONE has the prefill's cost")
                    if "prefetch off" in name and pd and span:
                        # each distinct expert read at most once per pass: no
                        # more than a pass count of reads, and at least one
                        # read for every distinct expert not yet cached
                        check(pb <= pd * span * len(prompt),
                              f"{name}: prefill bytes {pb} <= {pd} x {span} x positions")
                    if "one pass" in name and pd and span and prompt is goldens[0][0]:
                        # a cold cache and one pass: each distinct expert once
                        check(pb == pd * span, f"{name}: one pass reads {pb} == {pd} x {span}")
                st = subprocess.run([K3CTL, "--socket", d.sock, "--json", "status"],
                                    capture_output=True, text=True)
                sj = json.loads(st.stdout)
                txt = k3ctl("--socket", d.sock, "status").stdout
                check(sj.get("expert_bytes_read") == tot[0] and
                      sj.get("expert_demand_bytes") == tot[1] and
                      sj.get("prefetch_used_bytes") == tot[2],
                      f"{name}: STATUS totals {[sj.get(k) for k in ('expert_bytes_read', 'expert_demand_bytes', 'prefetch_used_bytes')]} == DONE sums {tot[:3]}")
                drives = sj.get("drives") or []
                check(len(drives) == n_drives, f"{name}: STATUS lists {len(drives)} drives")
                check(sum(x["expert_bytes_read"] for x in drives) == tot[0],
                      f"{name}: STATUS per-drive bytes sum to {tot[0]}")
                check(all(f"drive {i}:" in txt for i in range(n_drives)) and
                      "bytes read:  experts" in txt, f"{name}: k3ctl status per drive: {txt}")
                if "hedged" in name:
                    print(f"{name}: hedges {[x['hedges'] for x in drives]}, won "
                          f"{[x['hedges_won'] for x in drives]}")
                if n_drives > 1 and "stalled" not in name and "hot" not in name:
                    check(drives[1]["experts"] > 0, f"{name}: the copy holds experts")
            finally:
                d.stop()
            if ref is None:
                trace_ref = os.path.join(work, "trace-ref.jsonl")
                shutil.copy(trace, trace_ref)
            ref = check_routes(ref, trace, name, "one drive's")
        # a copy that does not match the model is refused at start-up
        bad = os.path.join(work, "bad")
        os.mkdir(bad)
        with open(os.path.join(bad, "experts-L001.k3pack"), "wb") as f:
            f.write(os.urandom(4096))
        try:
            d = Daemon(K3D, "--expert-dir", bad, model=packed)
            d.stop()
            check(False, "a damaged copy was accepted")
        except RuntimeError as e:
            check("expert-dir" in str(e) or bad in str(e), f"damaged copy message: {str(e)[-400:]}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


main()
sys.exit(report())

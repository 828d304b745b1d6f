#!/usr/bin/env python3
"""Spine streaming through the real k3d (issue 17): with --spine-resident
none, N, all and auto, from the spine pack and with --no-packs from the
shards, --direct on/off, 1 and 2 I/O threads and an expert cache at the
floor, the greedy ids equal the golden continuations and the router traces
(ids and fp32 weight bits) equal those of the mapped spine; DONE carries the
spine's bytes apart from the experts' (absent without --spine-resident) and
STATUS their sum; and on a demo model whose streamed spine is more than
three times a memory limit, k3d streams it with a peak RSS (VmHWM) under
that limit and gives the same ids as with the spine mapped. The int8 spine
(k3d --spine int8 over the overlay k3ctl convert-spine-int8 writes) the same
way: every resident prefix from all to none, from its own spine pack
(spine-int8.k3pack, k3ctl pack --spine int8) and from the shards and the
overlay's files, --direct on/off, gives the ids and routes of the mapped
int8 spine; a reconverted overlay makes its pack stale (ignored with a
warning, the shards read) until k3ctl pack --spine int8 rewrites it, and
the BF16 spine's pack is left as it is.

usage: test_spine.py K3D K3CTL SHARED_DIR
"""
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from k3proto import Daemon, direct_ok, generate_ids as generate, u64  # noqa
from k3proto import trace_routes as routes  # noqa
from k3test import (BIG_SPINE_PROMPT, asan_build, big_spine_model, check, check_routes,  # noqa
                    golden_model, golden_runs, mapped_run, packed_copy, report, vm_hwm)

K3D, K3CTL, SHARED = sys.argv[1], sys.argv[2], sys.argv[3]

# DONE tags (docs/protocol.md)
EXPERT_BYTES, SPINE_BYTES, SPINE_LOADS, SPINE_ROWS, SPINE_WAIT = 11, 22, 23, 24, 25


def status(sock):
    st = subprocess.run([K3CTL, "--socket", sock, "status", "--json"], capture_output=True,
                        text=True)
    txt = subprocess.run([K3CTL, "--socket", sock, "status"], capture_output=True,
                         text=True).stdout
    return json.loads(st.stdout), txt


def run_golden(case):
    model = golden_model(SHARED, case)
    if model is None:
        return
    goldens = golden_runs(SHARED, case)
    work, packed, r = packed_copy(K3CTL, model, "k3d-spine-model-")
    check(r.returncode == 0 and "spine    : wrote" in r.stdout, f"{case}: k3ctl pack: {r.stderr}")
    layers = json.load(open(os.path.join(packed, "config.json")))
    layers = layers.get("text_config", layers)["num_hidden_layers"]
    have_direct = direct_ok(glob.glob(os.path.join(packed, "*.safetensors"))[0])
    variants = [
        ("mapped", []),
        ("none, pack", ["--spine-resident", "none"]),
        ("none, --no-packs", ["--spine-resident", "none", "--no-packs"]),
        ("3, pack, --direct off, 1 I/O thread", ["--spine-resident", "3", "--direct", "off",
                                                  "--io-threads", "1"]),
        ("1, --no-packs, 2 I/O threads, expert cache at the floor",
         ["--spine-resident", "1", "--no-packs", "--io-threads", "2",
          "--expert-cache-gb", "0.0001"]),
        (f"{layers - 1}, pack, prefetch 4", ["--spine-resident", str(layers - 1),
                                              "--prefetch", "4"]),
        ("all, pack", ["--spine-resident", "all"]),
        ("auto, pack", ["--spine-resident", "auto"]),
    ]
    if have_direct:
        variants.append(("none, pack, --direct on", ["--spine-resident", "none", "--direct", "on"]))
    ref = None
    try:
        for name, args in variants:
            trace = os.path.join(work, "trace.jsonl")
            if os.path.exists(trace):
                os.unlink(trace)
            d = Daemon(K3D, "--router-trace", trace, *args, model=packed)
            spine = "--spine-resident" in args
            try:
                log = d.log_text()
                m = re.search(r"spine: (no layer|layers 0\.\.(\d+)) resident .* from (the spine pack|"
                              r"the shards)", log)
                if spine:
                    check(m is not None, f"{case} {name}: spine logged: {log[-800:]}")
                    want = args[args.index("--spine-resident") + 1]
                    if m and want in ("none", "all") or (m and want.isdigit()):
                        n = {"none": 0, "all": layers}.get(want, int(want) if want.isdigit() else 0)
                        got = 0 if m.group(1) == "no layer" else int(m.group(2)) + 1
                        check(got == n, f"{case} {name}: {got} layers resident, want {n}")
                    if m and want == "auto":   # plenty of memory: everything stays
                        check(m.group(2) is not None and int(m.group(2)) + 1 == layers,
                              f"{case} {name}: auto keeps every layer: {m.group(0)}")
                    if m:
                        check((m.group(3) == "the shards") == ("--no-packs" in args),
                              f"{case} {name}: read from {m.group(3)}")
                else:
                    check(m is None and "spine-resident=mapped" in log,
                          f"{case} {name}: the spine stays mapped")
                spine_sum = 0
                for prompt, want in goldens:
                    got, done = generate(d.sock, prompt, len(want))
                    check(got == want, f"{case} {name}: greedy {got} == golden {want}")
                    if not spine:
                        check(SPINE_BYTES not in done, f"{case} {name}: no spine counters when mapped")
                        continue
                    sb, loads, rows = u64(done, SPINE_BYTES), u64(done, SPINE_LOADS), u64(done, SPINE_ROWS)
                    check(sb is not None and loads is not None and rows is not None and
                          SPINE_WAIT in done, f"{case} {name}: DONE has the spine counters")
                    if sb is None:
                        continue
                    spine_sum += sb
                    # every prompt position and fed-back token: one row each
                    check(rows == len(prompt) + len(want) - 1,
                          f"{case} {name}: {rows} embedding rows for {len(prompt)} + {len(want) - 1}")
                    if "all" in name or "auto" in name:
                        check(loads == 0, f"{case} {name}: nothing streams: {loads} loads")
                    elif name.startswith(f"{layers - 1},"):
                        # one streamed layer: the ring of two arenas keeps it
                        check(loads <= 1, f"{case} {name}: the last layer read once: {loads}")
                    else:
                        check(loads >= len(want) and sb > 0,
                              f"{case} {name}: streamed layers every pass ({loads} loads, {sb} bytes)")
                    check(u64(done, EXPERT_BYTES) is not None, f"{case} {name}: expert bytes apart")
                sj, txt = status(d.sock)
                if spine:
                    check(sj.get("spine_bytes_read") == spine_sum,
                          f"{case} {name}: STATUS spine bytes {sj.get('spine_bytes_read')} == "
                          f"sum of DONE {spine_sum}")
                    check(sj.get("spine_memory_bytes", 0) > 0 and "spine reads:" in txt,
                          f"{case} {name}: k3ctl status shows the spine: {txt}")
                    check(("spine bytes read over" in txt) == (spine_sum > 0),
                          f"{case} {name}: k3ctl status shows spine bytes per token")
                else:
                    check("spine_bytes_read" not in sj and "spine reads:" not in txt,
                          f"{case} {name}: k3ctl status has no spine when mapped")
            finally:
                d.stop()
            ref = check_routes(ref, trace, f"{case} {name}", "the mapped spine's")
    finally:
        shutil.rmtree(work, ignore_errors=True)


# The memory limit of the RSS test; BIG_SPINE_DEMO streams over 3x it.
LIMIT = 100 * 1000 * 1000


def run_rss():
    work, model = big_spine_model(K3CTL, "k3d-spine-rss-")
    prompt = BIG_SPINE_PROMPT
    try:
        mapped, _, mapped_hwm = mapped_run(K3D, model, prompt, 6)
        # --prefill-chunk 64: the auto chunk plans activations for a
        # sixteenth of the machine's RAM, not for this test's limit
        d = Daemon(K3D, "--spine-resident", "none", "--expert-cache-gb", "0.005",
                   "--prefill-chunk", "64", model=model)
        try:
            log = d.log_text()
            m = re.search(r"streamed per pass \(([0-9.]+) GB per pass\)", log)
            check(m is not None, f"rss: spine logged: {log[-600:]}")
            per_pass = float(m.group(1)) * 1e9 if m else 0
            check(per_pass >= 3 * LIMIT, f"rss: the streamed spine {per_pass / 1e6:.0f} MB is >= 3x"
                  f" the {LIMIT / 1e6:.0f} MB limit")
            got, done = generate(d.sock, prompt, 6)
            hwm = vm_hwm(d.proc.pid)
            check(got == mapped, f"rss: streamed ids {got} == mapped ids {mapped}")
            print(f"# rss: spine {per_pass / 1e6:.0f} MB per pass; VmHWM {hwm / 1e6:.1f} MB streamed"
                  f" (limit {LIMIT / 1e6:.0f} MB), {mapped_hwm / 1e6:.1f} MB mapped; spine read"
                  f" {u64(done, SPINE_BYTES)} bytes in {u64(done, SPINE_LOADS)} loads")
            # AddressSanitizer's shadow memory and redzones are not the
            # product's: its build checks the ids, not the peak
            if asan_build(d.proc.pid):
                print("# rss: AddressSanitizer build, the VmHWM limit is not checked")
            else:
                check(hwm <= LIMIT, f"rss: VmHWM {hwm} <= {LIMIT}")
            check(u64(done, SPINE_BYTES) >= 6 * per_pass * 0.9,
                  f"rss: the spine was read every pass ({u64(done, SPINE_BYTES)} bytes)")
        finally:
            d.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def spine_log(d):
    """(layers resident, 'the spine pack' | 'the shards', the whole log) of
    a started k3d."""
    log = d.log_text()
    m = re.search(r"spine: (no layer|layers 0\.\.(\d+)) resident .* from (the spine pack|"
                  r"the shards)", log)
    if m is None:
        return None, None, log
    return 0 if m.group(1) == "no layer" else int(m.group(2)) + 1, m.group(3), log


def run_int8():
    work = tempfile.mkdtemp(prefix="k3d-spine-int8-")
    model = os.path.join(work, "demo")
    packs = os.path.join(model, "k3-packs")
    prompt = [300, 301, 302, 303, 304, 305, 306, 307]
    n_new = 6

    def k3ctl(*args):
        r = subprocess.run([K3CTL, *args], capture_output=True, text=True)
        check(r.returncode == 0, f"int8: k3ctl {' '.join(args)}: {r.stderr}")
        return r.stdout

    def ids_routes(name, args, want_layers=None, want_from=None, warn=None):
        trace = os.path.join(work, "trace.jsonl")
        if os.path.exists(trace):
            os.unlink(trace)
        d = Daemon(K3D, "--spine", "int8", "--router-trace", trace, *args, model=model)
        try:
            got_layers, got_from, log = spine_log(d)
            if want_layers is not None:
                check(got_layers == want_layers and got_from == want_from,
                      f"int8 {name}: {got_layers} layers resident from {got_from}, want"
                      f" {want_layers} from {want_from}: {log[-600:]}")
            if warn is not None:
                check(warn in log, f"int8 {name}: log says '{warn}': {log[-800:]}")
            ids, done = generate(d.sock, prompt, n_new)
            sb = u64(done, SPINE_BYTES)
        finally:
            d.stop()
        return ids, routes(trace), sb

    try:
        k3ctl("demo-model", "--out", model, "--preset", "small", "--layers", "6")
        k3ctl("convert-spine-int8", "--model", model)
        layers = 6
        out = k3ctl("pack", "--model", model)
        check("spine    : wrote" in out, f"int8: the BF16 spine pack written: {out}")
        ref_ids, ref_routes, _ = ids_routes("mapped", [])
        check(len(ref_ids) == n_new and len(ref_routes) > 0, f"int8 mapped: {ref_ids}")
        # only the BF16 spine's pack: the int8 spine is read from the files
        ids, rs, _ = ids_routes("no int8 pack", ["--spine-resident", "none"], 0, "the shards",
                                warn="`k3ctl pack --model DIR --spine int8` writes it")
        check(ids == ref_ids and rs == ref_routes, f"int8 no int8 pack: ids {ids} == {ref_ids}")
        out = k3ctl("pack", "--model", model, "--spine", "int8")
        check("spine int8: wrote" in out, f"int8: the int8 spine pack written: {out}")
        bf16_pack = os.path.join(packs, "spine.k3pack")
        i8_pack = os.path.join(packs, "spine-int8.k3pack")
        check(os.path.exists(bf16_pack) and os.path.exists(i8_pack), "int8: both spine packs")
        bf16_stat = os.stat(bf16_pack)
        have_direct = direct_ok(glob.glob(os.path.join(model, "spine-int8", "*.safetensors"))[0])
        mid = layers // 2
        variants = [
            ("all, pack", ["--spine-resident", "all"], layers, "the spine pack"),
            ("none, pack", ["--spine-resident", "none"], 0, "the spine pack"),
            (f"{mid}, pack, --direct off", ["--spine-resident", str(mid), "--direct", "off"],
             mid, "the spine pack"),
            ("all, --no-packs", ["--spine-resident", "all", "--no-packs"], layers, "the shards"),
            ("none, --no-packs", ["--spine-resident", "none", "--no-packs"], 0, "the shards"),
            (f"{mid}, --no-packs, --direct off, 1 I/O thread",
             ["--spine-resident", str(mid), "--no-packs", "--direct", "off", "--io-threads", "1"],
             mid, "the shards"),
            ("1, --no-packs", ["--spine-resident", "1", "--no-packs"], 1, "the shards"),
        ]
        if have_direct:
            variants += [("none, pack, --direct on", ["--spine-resident", "none", "--direct", "on"],
                          0, "the spine pack"),
                         ("none, --no-packs, --direct on",
                          ["--spine-resident", "none", "--no-packs", "--direct", "on"], 0,
                          "the shards")]
        streamed = {}
        for name, args, n, src in variants:
            ids, rs, sb = ids_routes(name, args, n, src)
            check(ids == ref_ids, f"int8 {name}: ids {ids} == mapped {ref_ids}")
            check(rs == ref_routes, f"int8 {name}: routes identical to the mapped int8 spine's")
            if n == 0:
                streamed[src] = sb
        # what the int8 spine saves per pass against the BF16 one
        d = Daemon(K3D, "--spine-resident", "none", "--no-packs", model=model)
        try:
            _, bf16_done = generate(d.sock, prompt, n_new)
        finally:
            d.stop()
        bf16_sb = u64(bf16_done, SPINE_BYTES)
        print(f"# int8: spine bytes streamed for {len(prompt)} + {n_new - 1} tokens, none"
              f" resident: int8 {streamed.get('the shards')} (shards),"
              f" {streamed.get('the spine pack')} (pack); bf16 {bf16_sb} (shards)")
        check(bf16_sb and streamed.get("the shards") and streamed["the shards"] < bf16_sb,
              "int8: the int8 spine streams fewer bytes than the BF16 one")
        # a reconverted overlay: the int8 pack is stale, the shards are read
        k3ctl("convert-spine-int8", "--model", model, "--force")
        ids, rs, _ = ids_routes("reconverted overlay", ["--spine-resident", "none"], 0,
                                "the shards",
                                warn="k3ctl pack --model DIR --spine int8 compares")
        check(ids == ref_ids and rs == ref_routes, f"int8 reconverted: ids {ids} == {ref_ids}")
        out = k3ctl("pack", "--model", model, "--spine", "int8")
        # the conversion is deterministic: the same bytes, so the pack is
        # compared span by span with them and its source records renewed
        line = next((x for x in out.splitlines() if x.startswith("spine int8:")), "")
        check("wrote" in line or ("kept" in line and "re-verified" in line),
              f"int8: k3ctl pack --spine int8 renews the stale pack: {out}")
        ids, rs, _ = ids_routes("rewritten pack", ["--spine-resident", "none"], 0,
                                "the spine pack")
        check(ids == ref_ids and rs == ref_routes, f"int8 rewritten pack: ids {ids} == {ref_ids}")
        st = os.stat(bf16_pack)
        check((st.st_ino, st.st_mtime_ns) == (bf16_stat.st_ino, bf16_stat.st_mtime_ns),
              "int8: the BF16 spine pack is left as it is")
        # the BF16 spine still takes its own pack
        d = Daemon(K3D, "--spine-resident", "none", model=model)
        try:
            n, src, log = spine_log(d)
            check(n == 0 and src == "the spine pack", f"int8: bf16 reads spine.k3pack: {log[-600:]}")
        finally:
            d.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)


for c in ("k3tiny_a", "k3tiny_b"):
    run_golden(c)
run_rss()
run_int8()
sys.exit(report())

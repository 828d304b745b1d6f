#!/usr/bin/env python3
"""The expert store through the real k3d (issue 7, items 4 and 8): greedy ids
and routes (ids and fp32 weight bits, from --router-trace) identical to the
golden continuations across cache budgets {floor, small, unlimited},
prefetch off/auto/N, O_DIRECT on/off, 1 vs 2 I/O threads and packs vs
shards; a budget below the one-token floor is refused at start with the
numbers; --direct on is refused with an actionable message on a file system
without O_DIRECT (ramfs in a private mount namespace, where unshare works);
DONE and STATUS carry honest expert counters (a warm unlimited cache reads 0
bytes).

usage: test_store.py K3D K3CTL SHARED_DIR
"""
import glob
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
from k3proto import Daemon, direct_ok, f64, generate_ids as generate, u64  # noqa
from k3test import check, check_routes, failures, golden_model, golden_runs, packed_copy  # noqa

K3D, K3CTL, SHARED = sys.argv[1], sys.argv[2], sys.argv[3]





def floor_numbers(k3d, model):
    """Starts k3d with a 1-byte budget: it must refuse, naming the floor."""
    tmp = tempfile.mkdtemp(prefix="k3d-store-")
    try:
        p = subprocess.run([k3d, "--socket", os.path.join(tmp, "s"), "--model", model,
                            "--threads", "1", "--expert-cache-gb", "0.000000001"],
                           capture_output=True, text=True, timeout=60)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    check(p.returncode != 0, "k3d refuses a cache below the floor")
    m = re.search(r"below the floor of (\d+) bytes: one token pins (\d+) experts of (\d+) bytes",
                  p.stderr)
    check(m is not None, "refusal names the floor: " + p.stderr[-400:])
    if not m:
        return None
    floor, k, slot = int(m.group(1)), int(m.group(2)), int(m.group(3))
    check(floor == k * slot, "floor = top-k x slot bytes")
    return floor, slot


def gb(nbytes):
    return "%.9f" % (nbytes / 1e9)



def run_case(case):
    model = golden_model(SHARED, case)
    if model is None:
        return
    nums = floor_numbers(K3D, model)
    if not nums:
        return
    floor, slot = nums
    goldens = golden_runs(SHARED, case)
    work, packed, r = packed_copy(K3CTL, model, "k3d-store-model-")
    check(r.returncode == 0, f"{case}: k3ctl pack: {r.stderr}")

    shard = sorted(glob.glob(os.path.join(model, "*.safetensors")))[0]
    have_direct = direct_ok(shard)
    print(f"# {case}: O_DIRECT {'works' if have_direct else 'is refused'} on {os.path.dirname(shard)}")
    variants = [
        ("unlimited, prefetch off", model, ["--prefetch", "off"]),
        ("unlimited, prefetch default", model, []),
        ("floor, prefetch auto, --direct off", model,
         ["--expert-cache-gb", gb(floor + slot // 2), "--prefetch", "auto", "--direct", "off"]),
        ("floor, prefetch off, 1 I/O thread", model,
         ["--expert-cache-gb", gb(floor + slot // 2), "--prefetch", "off", "--io-threads", "1"]),
        ("floor, prefetch 16, 2 I/O threads", model,
         ["--expert-cache-gb", gb(floor + slot // 2), "--prefetch", "16", "--io-threads", "2"]),
        ("small, prefetch 4", model, ["--expert-cache-gb", gb(2 * floor + slot // 2), "--prefetch", "4"]),
        ("packs, small, prefetch default", packed, ["--expert-cache-gb", gb(2 * floor + slot // 2)]),
        ("--no-packs, small", packed, ["--expert-cache-gb", gb(2 * floor + slot // 2), "--no-packs"]),
        ("packs, small, prefetch 16, --direct off", packed,
         ["--expert-cache-gb", gb(2 * floor + slot // 2), "--prefetch", "16", "--direct", "off"]),
    ]
    if have_direct:
        variants += [
            ("floor, prefetch auto, --direct on", model,
             ["--expert-cache-gb", gb(floor + slot // 2), "--prefetch", "auto", "--direct", "on"]),
            ("packs, small, prefetch 16, --direct on", packed,
             ["--expert-cache-gb", gb(2 * floor + slot // 2), "--prefetch", "16", "--direct", "on"]),
        ]
    ref_routes = None
    try:
        for name, mdir, args in variants:
            trace = os.path.join(work, "trace.jsonl")
            if os.path.exists(trace):
                os.unlink(trace)
            d = Daemon(K3D, "--router-trace", trace, *args, model=mdir)
            try:
                log = d.log_text()
                if mdir == packed and "--no-packs" not in args:
                    check("from packs" in log, f"{case} {name}: packs used: {log[-600:]}")
                else:
                    check("from the shards" in log, f"{case} {name}: shards logged")
                m = re.search(r"expert reads: (\d+) files with O_DIRECT, (\d+) buffered", log)
                if "--direct" in args and args[args.index("--direct") + 1] == "off":
                    check(m is not None and m.group(1) == "0" and int(m.group(2)) > 0
                          and "(--direct off)" in log, f"{case} {name}: buffered reads logged")
                elif "--direct" in args:
                    check(m is not None and m.group(2) == "0" and int(m.group(1)) > 0
                          and "(--direct on)" in log, f"{case} {name}: O_DIRECT reads logged")
                elif have_direct:
                    check(m is not None and m.group(2) == "0" and "(--direct auto)" in log,
                          f"{case} {name}: --direct auto used O_DIRECT")
                if "prefetch" not in name or "prefetch default" in name or "prefetch auto" in name:
                    check("prefetch auto" in log, f"{case} {name}: prefetch auto is the default")
                total_read = 0
                sums = {"positions": 0, "io_wait": 0.0, "compute": 0.0, "prefill": 0.0, "decode": 0.0}

                def account(done):
                    # positions the engine computed: uncached prompt + one per
                    # generated token but the last (it is never fed back)
                    pt, ct, cached = (struct.unpack("<I", done[t][0])[0] if t in done else 0 for t in (2, 3, 5))
                    sums["positions"] += pt - cached + max(ct - 1, 0)
                    sums["io_wait"] += f64(done, 17)
                    sums["compute"] += f64(done, 18)
                    sums["prefill"] += f64(done, 7)
                    sums["decode"] += f64(done, 8)
                for prompt, want in goldens:
                    got, done = generate(d.sock, prompt, len(want))
                    check(got == want, f"{case} {name}: greedy {got} == golden {want}")
                    hits, misses = u64(done, 12), u64(done, 13)
                    check(hits is not None and misses is not None and hits + misses > 0,
                          f"{case} {name}: DONE has expert hits/misses")
                    # (per request, used may exceed issued: a guess read
                    # during one request can serve the next)
                    check(u64(done, 14) is not None and u64(done, 15) is not None,
                          f"{case} {name}: DONE has prefetch counters")
                    iow, comp = f64(done, 17), f64(done, 18)
                    check(iow is not None and comp is not None and iow >= 0 and comp >= 0,
                          f"{case} {name}: io_wait_s / compute_s")
                    total_read += u64(done, 11)
                    account(done)
                    check(u64(done, 20) is not None and u64(done, 20) <= u64(done, 11),
                          f"{case} {name}: prefetch bytes are part of the bytes read")
                    if "prefetch off" in name:
                        check(u64(done, 14) == 0 and u64(done, 20) == 0,
                              f"{case} {name}: no prefetch when off")
                # Same prompt again: with every expert cached nothing is read,
                # and every access is a hit.
                prompt, want = goldens[0]
                got, done = generate(d.sock, prompt, len(want))
                check(got == want, f"{case} {name}: repeat greedy")
                total_read += u64(done, 11)
                account(done)
                if name.startswith("unlimited"):
                    check(u64(done, 11) == 0 and u64(done, 13) == 0 and u64(done, 12) > 0,
                          f"{case} {name}: warm repeat reads 0 bytes, all hits "
                          f"({u64(done, 11)} bytes, {u64(done, 12)} hits, {u64(done, 13)} misses)")
                st = subprocess.run([K3CTL, "--socket", d.sock, "status", "--json"],
                                    capture_output=True, text=True)
                sj = json.loads(st.stdout)
                check(sj.get("expert_cache_bytes", 0) >= floor,
                      f"{case} {name}: STATUS expert_cache_bytes {sj.get('expert_cache_bytes')}")
                txt = subprocess.run([K3CTL, "--socket", d.sock, "status"], capture_output=True,
                                     text=True).stdout
                check(f"experts:     {total_read} bytes read" in txt and "prefetch:" in txt,
                      f"{case} {name}: k3ctl status shows the expert counters: {txt}")
                check(sj.get("prefetch_used", 1) <= sj.get("prefetch_issued", 0),
                      f"{case} {name}: cumulative prefetch used <= issued")
                # auto may read nothing ahead on these tiny random models (no
                # rank reaches 90% precision): only fixed counts must read.
                if re.search(r"prefetch \d+", name):
                    check(sj.get("prefetch_issued", 0) > 0, f"{case} {name}: lookahead prefetched")
                check(sj.get("expert_bytes_read") == total_read,
                      f"{case} {name}: STATUS bytes {sj.get('expert_bytes_read')} == sum of DONE {total_read}")
                check(sj.get("positions_total") == sums["positions"],
                      f"{case} {name}: STATUS positions {sj.get('positions_total')} == {sums['positions']}")
                for key, tot in (("io_wait_s_total", "io_wait"), ("compute_s_total", "compute")):
                    check(abs(sj.get(key, -1) - sums[tot]) < 1e-6,
                          f"{case} {name}: STATUS {key} {sj.get(key)} == sum of DONE {sums[tot]}")
                check("per token:" in txt and "engine time:" in txt,
                      f"{case} {name}: k3ctl status shows bytes per token and the time split: {txt}")
            finally:
                d.stop()
            if ref_routes is None:
                shutil.copy(trace, os.path.join(work, "ref-trace.jsonl"))
            ref_routes = check_routes(ref_routes, trace, f"{case} {name}", "the first variant")
        test_preload(case, model, os.path.join(work, "ref-trace.jsonl"), floor, slot, goldens, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_preload(case, model, trace, floor, slot, goldens, work):
    """k3ctl warm-expert-cache --preload fills the running daemon's cache
    with the trace's most used experts: as many as the cache has slots, read
    once, counted in STATUS; a second preload reads nothing; output is
    unchanged; an expert the model lacks is refused by name."""
    slots = (2 * floor + slot // 2) // slot
    d = Daemon(K3D, "--expert-cache-gb", gb(2 * floor + slot // 2), "--prefetch", "off", model=model)
    try:
        def warm(*extra):
            return subprocess.run([K3CTL, "--socket", d.sock, "--json", "warm-expert-cache",
                                   "--trace", trace, "--preload", *extra],
                                  capture_output=True, text=True, timeout=120)
        ranked = subprocess.run([K3CTL, "--json", "warm-expert-cache", "--trace", trace, "--show", "100000"],
                                capture_output=True, text=True)
        n_distinct = json.loads(ranked.stdout)["experts"]
        r = warm()
        check(r.returncode == 0, f"{case} preload: {r.stderr}")
        w = json.loads(r.stdout) if r.returncode == 0 else {}
        want = min(n_distinct, slots)
        check(w.get("requested") == n_distinct and w.get("loaded") == want and w.get("resident") == want,
              f"{case} preload: {w} (distinct {n_distinct}, slots {slots})")
        check(w.get("bytes_read", 0) >= want * 1, f"{case} preload read bytes: {w}")
        st = json.loads(subprocess.run([K3CTL, "--socket", d.sock, "status", "--json"],
                                       capture_output=True, text=True).stdout)
        check(st.get("expert_bytes_read") == w.get("bytes_read"),
              f"{case} preload bytes in STATUS: {st.get('expert_bytes_read')} vs {w}")
        r2 = warm("--top", str(slots))
        w2 = json.loads(r2.stdout) if r2.returncode == 0 else {}
        check(w2.get("bytes_read") == 0 and w2.get("resident") == want,
              f"{case} second preload reads nothing: {w2}")
        for prompt, want_ids in goldens:
            got, _ = generate(d.sock, prompt, len(want_ids))
            check(got == want_ids, f"{case} after preload: greedy {got} == golden {want_ids}")
        bad = os.path.join(work, "bad-trace.jsonl")
        with open(bad, "w") as f:
            f.write('{"request":1,"position":0,"layer":1,"ids":[4095],"weights":["3f800000"]}\n')
        r3 = subprocess.run([K3CTL, "--socket", d.sock, "warm-expert-cache", "--trace", bad, "--preload"],
                            capture_output=True, text=True, timeout=60)
        check(r3.returncode == 1 and "no routed expert 4095" in r3.stderr,
              f"{case} preload of an unknown expert refused: {r3.returncode} {r3.stderr}")
    finally:
        d.stop()


def test_direct_refusal():
    """--direct on where the file system refuses O_DIRECT: k3d must not start,
    and must say why and what to do. ramfs refuses O_DIRECT; it is mounted in
    a private user+mount namespace (unshare -rm), so no privilege is needed
    where unprivileged user namespaces are allowed. --direct auto on the same
    copy serves the golden ids with buffered reads."""
    model = os.path.join(SHARED, "golden", "forward", "k3tiny_a", "model")
    if not os.path.isdir(model) or not shutil.which("unshare"):
        print("skip: --direct on refusal (no golden model or no unshare)")
        return
    tmp = tempfile.mkdtemp(prefix="k3d-direct-")
    try:
        mnt = os.path.join(tmp, "ramfs")
        os.mkdir(mnt)
        probe = subprocess.run(["unshare", "-rm", "sh", "-c", 'mount -t ramfs ramfs "$1"', "sh", mnt],
                               capture_output=True, text=True, timeout=30)
        if probe.returncode != 0:
            print("skip: --direct on refusal: cannot mount ramfs in a user namespace:",
                  probe.stderr.strip())
            return
        g = json.load(open(os.path.join(SHARED, "golden", "forward", "k3tiny_a", "golden", "p8.json")))
        prompt, want = g["prompt"], g["greedy"]["tokens"]
        # exec: k3d replaces the shell, so terminating the child stops k3d
        script = ('mount -t ramfs ramfs "$1" && cp -r "$2" "$1/model" && sock="$1/k3d.sock" && '
                  'shift 2 && exec "$@" --socket "$sock"')
        base = ["unshare", "-rm", "sh", "-c", script, "sh", mnt, model, K3D, "--model",
                os.path.join(mnt, "model"), "--threads", "1"]
        p = subprocess.run(base + ["--direct", "on"], capture_output=True, text=True, timeout=60)
        check(p.returncode != 0, f"--direct on on ramfs: k3d refuses to start (rc {p.returncode})")
        check("--direct on" in p.stderr and "refuses it" in p.stderr and "--direct auto" in p.stderr
              and "--direct off" in p.stderr and ".safetensors" in p.stderr,
              "--direct on refusal names the flag, the file and the alternatives: " + p.stderr[-600:])
        print("# --direct on on ramfs:", next((ln for ln in p.stderr.splitlines() if "--direct on" in ln),
                                                "(no message)")[:400])
        # auto on the same file system: buffered, same ids. k3d runs in the
        # namespace; the test talks to it through the socket on the ramfs,
        # reached via the namespace's /proc/PID/root.
        d = subprocess.Popen(base + ["--direct", "auto", "--log-level", "info"], stderr=subprocess.PIPE,
                             text=True)
        try:
            log, deadline = "", time.time() + 60
            while "ready:" not in log and time.time() < deadline and d.poll() is None:
                line = d.stderr.readline()
                log += line
            check("ready:" in log, "--direct auto on ramfs starts: " + log[-600:])
            check(re.search(r"expert reads: 0 files with O_DIRECT, \d+ buffered .*--direct auto: the file "
                            r"system refused O_DIRECT", log) is not None,
                  "--direct auto on ramfs falls back to buffered reads, logged: " + log[-600:])
            if "ready:" in log:
                sock = f"/proc/{d.pid}/root{mnt}/k3d.sock"
                got, _ = generate(sock, prompt, len(want))
                check(got == want, f"--direct auto (buffered) on ramfs: greedy {got} == golden {want}")
        finally:
            d.terminate()
            try:
                d.wait(10)
            except subprocess.TimeoutExpired:
                d.kill()
                d.wait()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_router_trace_refusal():
    """A bad --router-trace FILE (a symlink, a symlinked folder on the way, a
    directory, a path whose folder is missing) stops k3d with a message about the trace file, never
    "cannot load model" (the model itself is fine)."""
    model = os.path.join(SHARED, "golden", "forward", "k3tiny_a", "model")
    if not os.path.isdir(model):
        print("skip: --router-trace refusal (no golden model)")
        return
    tmp = tempfile.mkdtemp(prefix="k3d-rtrace-")
    try:
        link = os.path.join(tmp, "trace.jsonl")
        os.symlink(os.path.join(tmp, "elsewhere.jsonl"), link)
        missing = os.path.join(tmp, "no-such-dir", "trace.jsonl")
        # a symlinked directory on the way is refused too (the daemon may run
        # as a service user: a planted link must not move its writes)
        os.mkdir(os.path.join(tmp, "real"))
        os.symlink(os.path.join(tmp, "real"), os.path.join(tmp, "linkdir"))
        via_dir = os.path.join(tmp, "linkdir", "trace.jsonl")
        for path, want in ((link, f"cannot use --router-trace: router trace '{link}' is a symlink; "
                                  "refusing to follow it"),
                           (via_dir, f"cannot use --router-trace: router trace '{via_dir}': "
                                     f"'{os.path.join(tmp, 'linkdir')}' is a symlink; refusing to follow it"),
                           (tmp, f"cannot use --router-trace: router trace '{tmp}' is not a regular file"),
                           (missing, f"cannot use --router-trace: cannot open router trace '{missing}': "
                                     "No such file or directory")):
            p = subprocess.run([K3D, "--model", model, "--socket", os.path.join(tmp, "k3d.sock"),
                                "--threads", "1", "--router-trace", path],
                               capture_output=True, text=True, timeout=60)
            check(p.returncode != 0 and want in p.stderr and "cannot load model" not in p.stderr,
                  f"--router-trace {path}: k3d stops with '{want}' (rc {p.returncode}): {p.stderr[-600:]}")
        check(not os.path.exists(os.path.join(tmp, "elsewhere.jsonl")), "the symlink's target was not created")
        check(os.listdir(os.path.join(tmp, "real")) == [], "nothing created through the symlinked directory")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_bad_options():
    for args, words in ((["--prefetch", "banana"], "--prefetch"), (["--io-threads", "0"], "--io-threads"),
                        (["--direct", "sometimes"], "--direct"),
                        (["--io-threads", "17"], "--io-threads"),
                        (["--expert-cache-gb", "-1"], "--expert-cache-gb"),
                        (["--expert-cache-gb", "lots"], "--expert-cache-gb")):
        p = subprocess.run([K3D, "--socket", "/nonexistent/s", *args], capture_output=True, text=True,
                           timeout=30)
        check(p.returncode == 2 and words in p.stderr, f"k3d {args} refused with usage: {p.returncode} {p.stderr}")
    p = subprocess.run([K3D, "--help"], capture_output=True, text=True, timeout=30)
    for o in ("--expert-cache-gb", "--io-threads", "--prefetch", "--router-trace", "--no-packs", "--direct"):
        check(o in p.stdout, f"--help lists {o}")


def main():
    t0 = time.time()
    test_bad_options()
    test_router_trace_refusal()
    test_direct_refusal()
    run_case("k3tiny_a")
    run_case("k3tiny_b")
    print(f"{len(failures)} failures, {time.time() - t0:.1f}s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

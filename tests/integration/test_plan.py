#!/usr/bin/env python3
"""The memory plan through the real k3d (issue 17, items 3 and 5): a
--memory-limit below the floor is refused at start with every number; a
limit above it starts, logs the split, and STATUS carries peak RSS (VmHWM)
and the split (fields 40-46); an explicit --context caps a conversation
(MODEL_INFO says so, a longer request is refused); --spine-resident beyond
the layer count is refused; the emulated drive (--io-rate, --io-latency)
serves the same ids with the same bytes read, and is logged; and with
--memory-limit alone, a model whose spine is over 3x the limit streams on
its own, with the mapped spine's ids and a peak RSS (VmHWM) under the limit.

usage: test_plan.py K3D K3CTL
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from k3proto import (T, Daemon, connect, frame, generate_ids, make_model, read_frame,  # noqa
                     u32, u64)
from k3test import (BIG_SPINE_PROMPT, asan_build, big_spine_model, check, mapped_run, report,  # noqa
                    vm_hwm)

K3D, K3CTL = sys.argv[1], sys.argv[2]


def refused(model, *args):
    tmp = tempfile.mkdtemp(prefix="k3d-plan-")
    try:
        p = subprocess.run([K3D, "--socket", os.path.join(tmp, "s"), "--model", model,
                            "--threads", "1", *args], capture_output=True, text=True,
                           timeout=60)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    check("Sanitizer" not in p.stderr and "runtime error:" not in p.stderr,
          f"sanitizer report from k3d {' '.join(args)}: {p.stderr[-600:]}")
    return p


def stop(d):
    d.stop()
    check(not d.sanitizer_reports(), f"sanitizer reports: {d.sanitizer_reports()}")


def status(sock):
    s = connect(sock)
    s.sendall(frame(T["STATUS"], 3))
    t, rid, f = read_frame(s)
    s.close()
    check(t == T["STATUS_REPLY"], f"STATUS_REPLY, got type {t}")
    return f


def model_info(sock):
    s = connect(sock)
    s.sendall(frame(T["MODEL_INFO"], 4))
    t, rid, f = read_frame(s)
    s.close()
    return f


# BIG_SPINE_DEMO's spine is more than 3x LIMIT; the plan streams it without
# being asked.
LIMIT = 110 * 1000 * 1000


def run_limit():
    work, model = big_spine_model(K3CTL, "k3d-plan-rss-")
    prompt = BIG_SPINE_PROMPT
    try:
        mapped, log, _ = mapped_run(K3D, model, prompt, 6, stop)
        check("; mapped)" in log, "without a limit the spine stays mapped")
        d = Daemon(K3D, "--memory-limit", str(LIMIT), "--context", "256", model=model)
        try:
            log = d.log_text()
            m = re.search(r"streamed per pass \(([0-9.]+) GB per pass\)", log)
            check(m is not None and float(m.group(1)) * 1e9 >= 3 * LIMIT,
                  "the plan streams a spine over 3x the limit: " + log[-700:])
            got, done = generate_ids(d.sock, prompt, 6)
            check(got == mapped, f"streamed ids {got} == mapped ids {mapped}")
            f = status(d.sock)
            check(u32(f, 43) < u32(f, 42) and u64(f, 45) > 0,
                  f"STATUS: {u32(f, 43)} of {u32(f, 42)} layers resident, ring {u64(f, 45)}")
            hwm = vm_hwm(d.proc.pid)
            asan = asan_build(d.proc.pid)
            print(f"# limit {LIMIT / 1e6:.0f} MB: VmHWM {hwm / 1e6:.1f} MB"
                  f"{' (AddressSanitizer build: not checked)' if asan else ''}")
            if not asan:   # ASan's shadow memory and redzones are not k3d's
                check(hwm <= LIMIT, f"VmHWM {hwm} <= the limit {LIMIT}")
        finally:
            stop(d)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main():
    model = make_model(K3CTL)
    try:
        # Below the floor: refused, naming the limit, who set it and the floor.
        p = refused(model, "--memory-limit", "1M")
        check(p.returncode != 0, "k3d refuses a limit below the floor")
        check("below the floor: the memory limit is 1048576 bytes" in p.stderr and
              "--memory-limit" in p.stderr and "the smallest limit one pass fits in, is" in
              p.stderr, "the refusal has the numbers: " + p.stderr[-600:])
        # The spine loader's floor (its units' aligned extents: a little more
        # than the mapped spine's).
        p = refused(model, "--memory-limit", "1M", "--spine-resident", "all")
        m = re.search(r"the smallest limit one pass fits in, is (\d+) bytes", p.stderr)
        floor = int(m.group(1)) if m else 1 << 20
        # What everything resident needs is enough, to the byte (at the floor
        # the cheaper choice streams: the nano spine is more than its ring).
        p = refused(model, "--memory-limit", str(floor), "--spine-resident", "all")
        m = re.search(r"--spine-resident all: the memory limit is %d bytes .*; this needs "
                      r"(\d+) bytes" % floor, p.stderr)
        check(p.returncode != 0 and m is not None, "all resident: the need: " + p.stderr[-600:])
        if m:
            need = int(m.group(1))
            p = refused(model, "--memory-limit", str(need - 1), "--spine-resident", "all")
            check(p.returncode != 0, "one byte short of the need is refused")
            d = Daemon(K3D, "--memory-limit", str(need), "--spine-resident", "all", model=model)
            check("memory plan: limit" in d.log_text(), "starts with exactly the need")
            stop(d)
        p = refused(model, "--spine-resident", "99")
        check(p.returncode != 0 and "--spine-resident 99: the model has 9 layers" in p.stderr,
              "--spine-resident 99 refused: " + p.stderr[-300:])
        p = refused(model, "--memory-limit", "lots")
        check(p.returncode == 2 and "--memory-limit" in p.stderr, "bad --memory-limit: usage")
        p = refused(model, "--io-rate", "0")
        check(p.returncode == 2 and "--io-rate" in p.stderr, "--io-rate 0: usage")

        # A limit above it: the split is logged and in STATUS.
        d = Daemon(K3D, "--memory-limit", "2G", "--context", "4096", "--prefetch", "off", model=model)
        try:
            log = d.log_text()
            check(re.search(r"memory plan: limit 2\.147 GB \(--memory-limit\) = headroom", log)
                  is not None, "the plan is logged: " + log[-800:])
            # the slot says what it holds: inspect's per-expert span, in
            # whole 4 KiB pages (more where the shards place it across them)
            ins = subprocess.run([K3CTL, "inspect", model], capture_output=True, text=True).stdout
            span = re.search(r"per-expert span: (\d+) bytes \(one expert's weights as stored: "
                             r"(\d+) bytes of MXFP4 values \+ (\d+) of E8M0 scales", ins)
            slot = re.search(r"expert cache: \d+ slots of (\d+) bytes \(an expert's (\d+) bytes "
                             r"of weights and scales in whole 4 KiB pages", log)
            check(span and int(span.group(1)) == int(span.group(2)) + int(span.group(3)),
                  "inspect: the span is its MXFP4 values and scales: " + ins[-400:])
            check(span and slot and int(slot.group(2)) == int(span.group(1)) and
                  int(slot.group(1)) >= -(-int(span.group(1)) // 4096) * 4096,
                  "k3d's slot names inspect's span in whole pages: " + log[-800:])
            ids, done = generate_ids(d.sock, [5, 6, 7, 8], 4)
            check(len(ids) == 4, f"generates: {ids}")
            f = status(d.sock)
            check(u64(f, 41) == 2 << 30, f"STATUS memory_limit_bytes {u64(f, 41)}")
            check(u64(f, 40) and 0 < u64(f, 40) < 2 << 30,
                  f"STATUS peak_rss_bytes {u64(f, 40)} (VmHWM, below the limit)")
            layers = u32(f, 42)
            check(layers == 9 and u32(f, 43) == 9, f"every layer resident: {u32(f, 43)}/{layers}")
            check(u64(f, 45) == 0 and u64(f, 44) and u64(f, 46),
                  f"no ring, some spine and state: {u64(f, 44)} {u64(f, 45)} {u64(f, 46)}")
            out = subprocess.run([K3CTL, "--socket", d.sock, "status"], capture_output=True,
                                 text=True).stdout
            check("peak RSS:" in out and "memory plan: limit 2.147 GB" in out and
                  "(layers 0..8 of 9)" in out, "k3ctl status shows RSS and the split: " + out)
            # --context 4096 caps a conversation.
            mi = model_info(d.sock)
            check(u32(mi, 4) == 4096, f"MODEL_INFO context_length {u32(mi, 4)}")
            try:
                generate_ids(d.sock, [5, 6, 7], 4094)
                check(False, "a request past --context is refused")
            except RuntimeError as e:
                check("context holds 4096" in str(e), f"past --context: {e}")
        finally:
            stop(d)
        baseline = (ids, u64(done, 11) if done else None)

        # The emulated drive: same ids, same expert bytes, and logged.
        d = Daemon(K3D, "--io-rate", "0.05", "--io-latency", "0.5", "--prefetch", "off", model=model)
        try:
            check("emulated drive: reads limited to 0.050 GB/s in all, 0.500 ms per request" in
                  d.log_text(), "the emulated drive is logged")
            ids2, done2 = generate_ids(d.sock, [5, 6, 7, 8], 4)
            check((ids2, u64(done2, 11)) == baseline,
                  f"same ids and bytes with the drive: {ids2} {u64(done2, 11)} vs {baseline}")
        finally:
            stop(d)
    finally:
        shutil.rmtree(os.path.dirname(model), ignore_errors=True)
    run_limit()
    return report()


if __name__ == "__main__":
    sys.exit(main())

"""What the Python test programs share besides the protocol codec
(k3proto.py): the failure list and its report, the golden cases of
../shared/golden/forward and a private packed copy of their checkpoints,
the demo model whose streamed spine is over three times a small memory
limit, and a process's peak RSS. Stdlib only.

A test imports check and report and ends with `return report()` (or
`sys.exit(report())`): the list is the module's, one per test process.
"""
import json
import os
import shutil
import subprocess
import tempfile

from k3proto import Daemon, generate_ids, trace_routes

failures = []


def check(cond, what):
    """Records a failed expectation (printed at once, counted by report)."""
    if not cond:
        failures.append(what)
        print("FAIL:", what)
    return bool(cond)


def report(ok="ok"):
    """Prints the count of failures (or ok) and returns the exit status."""
    if failures:
        print(f"{len(failures)} failures")
        return 1
    print(ok)
    return 0


def golden_model(shared, case):
    """The checkpoint directory of a golden case, None (and a skip line)
    when ../shared does not hold it."""
    model = os.path.join(shared, "golden", "forward", case, "model")
    if not os.path.isdir(model):
        print("skip: no", model)
        return None
    return model


def golden_runs(shared, case, prompts=("p8", "p40")):
    """[(prompt ids, greedy continuation ids)] of a golden case's prompts."""
    out = []
    for p in prompts:
        with open(os.path.join(shared, "golden", "forward", case, "golden", p + ".json")) as f:
            g = json.load(f)
        out.append((g["prompt"], g["greedy"]["tokens"]))
    return out


def packed_copy(k3ctl, model, prefix):
    """Copies a (small) checkpoint into a fresh temporary directory and runs
    `k3ctl pack` on the copy: packs may then be written beside it, and the
    model loader refuses symlinks that leave the model directory. Returns
    (work dir, the copy, k3ctl pack's CompletedProcess); the caller removes
    the work dir."""
    work = tempfile.mkdtemp(prefix=prefix)
    packed = os.path.join(work, "model")
    os.mkdir(packed)
    for name in os.listdir(model):
        shutil.copy(os.path.join(model, name), os.path.join(packed, name))
    r = subprocess.run([k3ctl, "pack", "--model", packed], capture_output=True, text=True)
    return work, packed, r


# `k3ctl demo-model` arguments of a model whose spine (24 layers of hidden
# 1024 and the head: 0.36 GB a pass) is more than 3x a 100-110 MB limit.
BIG_SPINE_DEMO = ["--preset", "small", "--layers", "24", "--hidden", "1024", "--vocab", "8192",
                  "--intermediate", "2048", "--experts", "16", "--top-k", "4",
                  "--moe-intermediate", "256", "--latent", "512", "--shared-experts", "1",
                  "--kda-heads", "8", "--kda-head-dim", "128", "--mla-heads", "8",
                  "--q-lora", "384", "--kv-lora", "256", "--nope", "128", "--rope", "64",
                  "--v-head", "128", "--attn-res-block", "4"]


def vm_hwm(pid):
    """Peak resident set (VmHWM) of a running process, in bytes; 0 when
    /proc does not say."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def asan_build(pid):
    """True when the process maps AddressSanitizer's runtime: its shadow
    memory and redzones are not k3d's, so a peak-RSS bound does not apply."""
    with open(f"/proc/{pid}/maps") as fh:
        return "libasan" in fh.read()


# A prompt for BIG_SPINE_DEMO models (ids inside its 8192-token vocabulary).
BIG_SPINE_PROMPT = [300, 301, 302, 303, 304, 305, 306, 307]


def big_spine_model(k3ctl, prefix):
    """Writes a BIG_SPINE_DEMO model into a fresh temporary directory;
    returns (work dir, model dir). The caller removes the work dir."""
    work = tempfile.mkdtemp(prefix=prefix)
    model = os.path.join(work, "demo")
    subprocess.run([k3ctl, "demo-model", "--out", model, *BIG_SPINE_DEMO], check=True,
                   capture_output=True)
    return work, model


def mapped_run(k3d, model, prompt, n_new, stop=None):
    """Runs prompt for n_new ids through a k3d on model with no memory
    limit (the spine mapped: the reference a limited run is held to) and
    stops it (stop(d) when given, else d.stop()). Returns (ids, that k3d's
    log, its VmHWM in bytes)."""
    d = Daemon(k3d, model=model)
    try:
        ids, _ = generate_ids(d.sock, prompt, n_new)
        return ids, d.log_text(), vm_hwm(d.proc.pid)
    finally:
        (stop or Daemon.stop)(d)


def check_routes(ref, trace, what, against):
    """Checks that a router trace was written and, when ref (an earlier
    variant's routes) is given, that it equals ref. Returns the reference
    for the next variant: ref, or this trace's routes when ref is None."""
    rs = trace_routes(trace)
    check(len(rs) > 0, f"{what}: trace written")
    if ref is None:
        return rs
    check(rs == ref, f"{what}: routes identical to {against}")
    return ref

#!/usr/bin/env python3
"""bench_setup.py K3CTL [--mib N] [--rounds N] [--resume-rounds N] [--chunk-mib N]

k3ctl setup's download against curl's, same file, same local HTTPS server
(tests/setup/k3serve.py, throwaway CA), same run, interleaved rounds,
medians; the file is random bytes (this VM merges identical pages). k3ctl
hashes (SHA-256) while it streams and fsyncs before it publishes; curl does
neither, so the ratio is printed against plain curl and against curl plus an
fsync of its output. Then the resume: k3ctl is killed with SIGKILL part-way,
run again, and the bytes it fetched twice (arrived before the kill, asked
for again) are compared with the checkpoint distance (--chunk-mib).
Prints, never asserts (docs/setup.md, "Measurements")."""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "setup"))
from setup_harness import Env, kill  # noqa: E402


def timed(args, **kw):
    t = time.monotonic()
    r = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
    dt = time.monotonic() - t
    if r.returncode != 0:
        raise SystemExit("failed: %s\n%s" % (" ".join(args), r.stderr))
    return dt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("k3ctl")
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--resume-rounds", type=int, default=3)
    ap.add_argument("--chunk-mib", type=int, default=64)
    a = ap.parse_args()
    env = Env(os.path.abspath(a.k3ctl))
    try:
        src = os.path.join(env.tmp, "src", "blob")
        os.makedirs(src)
        blob = os.path.join(src, "blob.bin")
        with open(blob, "wb") as f:
            for _ in range(a.mib):
                f.write(os.urandom(1 << 20))
        size = os.path.getsize(blob)
        srv = env.server(src)
        inv, _ = env.inventory(src, srv.base)
        url = srv.base + "blob.bin"
        out = os.path.join(env.tmp, "curl.out")
        henv = {**os.environ, "HOME": env.tmp}
        rates = {"curl": [], "curl+fsync": [], "k3ctl": []}
        print("load: %s" % open("/proc/loadavg").read().split()[:3])
        print("file: %d MiB of random bytes; %d interleaved rounds" % (a.mib, a.rounds))
        for i in range(a.rounds):
            order = ["curl", "k3ctl"] if i % 2 == 0 else ["k3ctl", "curl"]
            for who in order:
                if who == "curl":
                    t = time.monotonic()
                    subprocess.run(["curl", "-sS", "--fail", "--cacert", env.ca, "-o", out, url],
                                   check=True)
                    t1 = time.monotonic()
                    fd = os.open(out, os.O_RDONLY)
                    os.fsync(fd)
                    os.close(fd)
                    t2 = time.monotonic()
                    rates["curl"].append(size / (t1 - t))
                    rates["curl+fsync"].append(size / (t2 - t))
                    os.unlink(out)
                else:
                    shutil.rmtree(env.root, ignore_errors=True)
                    dt = timed([env.k3ctl, "setup", "--full", "--inventory", inv, "--model-root",
                                env.root, "--cacert", env.ca, "--workers", "1",
                                "--chunk-mib", str(a.chunk_mib)], env=henv)
                    rates["k3ctl"].append(size / dt)
            print("round %d: curl %.1f MB/s, curl+fsync %.1f MB/s, k3ctl %.1f MB/s" % (
                i + 1, rates["curl"][-1] / 1e6, rates["curl+fsync"][-1] / 1e6,
                rates["k3ctl"][-1] / 1e6))
        med = {k: statistics.median(v) for k, v in rates.items()}
        print("median: curl %.1f MB/s, curl+fsync %.1f MB/s, k3ctl (SHA-256 + fsync) %.1f MB/s" % (
            med["curl"] / 1e6, med["curl+fsync"] / 1e6, med["k3ctl"] / 1e6))
        ratios = [k / c for k, c in zip(rates["k3ctl"], rates["curl"])]
        print("k3ctl / curl: median %.3f (per-round %s); k3ctl / (curl+fsync): %.3f; target >= 0.90"
              % (statistics.median(ratios), " ".join("%.2f" % r for r in ratios),
                 med["k3ctl"] / med["curl+fsync"]))

        chunk = a.chunk_mib << 20
        print("resume: SIGKILL part-way, run again (checkpoint every %d MiB)" % a.chunk_mib)
        for i in range(a.resume_rounds):
            shutil.rmtree(env.root, ignore_errors=True)
            slow = env.server(src, rate=60e6)
            target = size * (0.3 + 0.2 * i)
            part = os.path.join(env.root, "blob", "blob.bin.partial")
            p = subprocess.Popen([env.k3ctl, "setup", "--full", "--inventory", inv, "--model-root",
                                  env.root, "--cacert", env.ca, "--from", slow.base,
                                  "--chunk-mib", str(a.chunk_mib)],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=henv)
            while p.poll() is None and not (os.path.exists(part) and os.path.getsize(part) >= target):
                time.sleep(0.01)
            kill(p)
            arrived = os.path.getsize(part)
            slow.stop()
            n0 = len(srv.requests("blob.bin"))
            timed([env.k3ctl, "setup", "--full", "--inventory", inv, "--model-root", env.root,
                   "--cacert", env.ca, "--from", srv.base, "--chunk-mib", str(a.chunk_mib)], env=henv)
            req = srv.requests("blob.bin")[n0:]
            start = int(req[0]["range"].split("=")[1].split("-")[0]) if req and req[0]["range"] else 0
            again = arrived - start
            print("  killed at %.1f MiB: resumed from %.1f MiB, fetched %.1f MiB twice (%.2f chunks)"
                  % (arrived / 2**20, start / 2**20, again / 2**20, again / chunk))
    finally:
        env.close()


if __name__ == "__main__":
    main()

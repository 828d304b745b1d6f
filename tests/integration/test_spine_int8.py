#!/usr/bin/env python3
"""The int8 spine end to end through the real k3ctl, k3d and k3-gateway
(docs/k3d.8 --spine, docs/protocol.md spine fields): every place that says
what runs says "int8 spine (not weight-exact)", the BF16 spine says nothing
of the kind, a stale, missing or foreign overlay is refused with the
command that rewrites it, and k3d never picks int8 by itself.

  - k3ctl convert-spine-int8: writes, then keeps an up-to-date overlay;
  - k3d --spine int8: its log, HELLO_OK's model and MODEL_INFO's id
    (<name>+int8-spine), MODEL_INFO/STATUS_REPLY spine fields, every DONE
    (a finished one, and one cancelled in the queue), k3ctl status (text
    and --json), k3ctl run --stats and --json, the gateway's /v1/models;
  - its greedy ids equal k3ctl forward --spine int8 (the same engine);
  - k3d --spine bf16: spine 0 everywhere, no label, the plain model id;
  - refusals: --spine auto, --spine-int8-dir without --spine int8, no
    overlay, a model shard touched since the conversion;
  - k3ctl bench --compare-spine --json: figures in range, and the
    requested positions.

usage: test_spine_int8.py K3D K3CTL K3_GATEWAY
"""
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))
from k3proto import T, Daemon, connect, field, frame, make_model, read_frame, u32  # noqa
from k3proto import generate_ids as generate  # noqa

K3D, K3CTL, GATEWAY = sys.argv[1], sys.argv[2], sys.argv[3]
LABEL = "int8 spine (not weight-exact)"
failures = []
checks = [0]


def check(cond, what):
    checks[0] += 1
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def u32g(f, tag):
    """A U32 field, None when absent (a missing field is a failed check,
    not a crash)."""
    return u32(f, tag) if tag in f else None


def strg(f, tag):
    return f[tag][0].decode() if tag in f else None


def k3ctl(*args, sock=None, check_rc=True):
    cmd = [K3CTL] + (["--socket", sock] if sock else []) + list(args)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if check_rc and r.returncode != 0:
        print("k3ctl", args, "->", r.returncode, r.stderr)
    return r


def request(sock_path, mtype, payload=b"", rid=5):
    s = connect(sock_path)
    s.sendall(frame(mtype, rid, payload))
    r = read_frame(s, 30)
    s.close()
    return r


def hello_model(sock_path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(sock_path)
    s.sendall(frame(T["HELLO"], 1, field(1, "test/1") + field(2, 1)))
    t, rid, f = read_frame(s)
    s.close()
    return f.get(4, [b""])[0].decode()


def queued_cancel_done(sock_path):
    """The DONE of a job cancelled while it waits behind a long one."""
    a = connect(sock_path)
    a.sendall(frame(T["GENERATE"], 1, field(1, 0) + field(2, "long") + field(8, 100000)))
    while True:   # the long one runs once it yields a token
        t, rid, f = read_frame(a, 60)
        if t == T["TOKEN"]:
            break
    b = connect(sock_path)
    b.sendall(frame(T["GENERATE"], 2, field(1, 0) + field(2, "queued") + field(8, 4)))
    job = None
    while job is None:
        t, rid, f = read_frame(b, 60)
        if t == T["ACCEPTED"]:
            job = struct.unpack("<Q", f[1][0])[0]
    b.sendall(frame(T["CANCEL"], 3, field(1, struct.pack("<Q", job))))
    done = None
    while done is None:
        t, rid, f = read_frame(b, 60)
        if t == T["DONE"] and rid == 2:
            done = f
    a.sendall(frame(T["CANCEL"], 4))
    a.close()
    b.close()
    return done


def start_fails(*args):
    """k3d's exit code and stderr when it is expected to stop by itself."""
    tmp = tempfile.mkdtemp(prefix="k3d-fail-")
    try:
        d = subprocess.run([K3D, "--socket", os.path.join(tmp, "k3d.sock"), *args],
                           capture_output=True, text=True, timeout=60)
        return d.returncode, d.stderr
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def gateway_model(sock_path):
    g = subprocess.Popen([GATEWAY, "--listen", "127.0.0.1:0", "--socket", sock_path],
                         stderr=subprocess.PIPE, text=True)
    try:
        line = g.stderr.readline()
        m = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        if not m:
            return None
        url = f"http://127.0.0.1:{m.group(1)}/v1/models"
        for _ in range(50):
            try:
                with urllib.request.urlopen(url, timeout=10) as r:
                    return json.loads(r.read())
            except OSError:
                time.sleep(0.1)
        return None
    finally:
        g.terminate()
        g.wait(10)


def main():
    model = make_model(K3CTL, "nano")
    name = os.path.basename(model)
    ov = os.path.join(model, "spine-int8")
    root = os.path.dirname(model)
    try:
        # the overlay: written, then kept
        r = k3ctl("convert-spine-int8", "--model", model)
        check(r.returncode == 0 and "wrote" in r.stdout and "not weight-exact" in r.stdout,
              f"convert-spine-int8 writes and says what it is: {r.stdout!r} {r.stderr!r}")
        r = k3ctl("convert-spine-int8", "--model", model)
        check(r.returncode == 0 and "up to date" in r.stdout, f"an up-to-date overlay is kept: {r.stdout!r}")
        check(os.path.isfile(os.path.join(ov, "manifest.json")), "the overlay has its manifest")

        # k3d never picks int8 by itself; --spine-int8-dir alone is refused
        rc, err = start_fails("--model", model, "--spine", "auto")
        check(rc == 2 and "never picks the int8 spine" in err, f"--spine auto refused: {rc} {err!r}")
        rc, err = start_fails("--model", model, "--spine-int8-dir", ov)
        check(rc == 2 and "needs --spine int8" in err, f"--spine-int8-dir alone refused: {rc} {err!r}")

        ids = [5, 17, 300, 42, 9]
        d = Daemon(K3D, "--spine", "int8", "--queue", "1", model=model)
        try:
            log = d.log_text()
            check(f"spine: {LABEL}" in log, "k3d's log says the spine is int8 (not weight-exact)")
            check(f"model '{name}+int8-spine' loaded" in log and LABEL in log.split("loaded")[1],
                  "the load line names the int8 model id and the label")
            check(hello_model(d.sock) == f"{name}+int8-spine", "HELLO_OK's model is <name>+int8-spine")
            t, _, f = request(d.sock, T["MODEL_INFO"])
            check(t == T["MODEL_INFO_REPLY"] and f[1][0].decode() == f"{name}+int8-spine" and
                  u32g(f, 20) == 1 and strg(f, 21) == LABEL,
                  "MODEL_INFO: id, spine 1 and the label")
            t, _, f = request(d.sock, T["STATUS"])
            check(t == T["STATUS_REPLY"] and u32g(f, 50) == 1 and strg(f, 51) == LABEL,
                  "STATUS_REPLY: spine 1 and the label")
            out, done = generate(d.sock, ids, 6)
            check(u32g(done, 40) == 1 and strg(done, 41) == LABEL,
                  "a finished DONE carries spine 1 and the label")
            cd = queued_cancel_done(d.sock)
            check(u32g(cd, 1) == 2 and u32g(cd, 40) == 1 and strg(cd, 41) == LABEL,
                  "a DONE cancelled in the queue carries them too")
            r = k3ctl("status", sock=d.sock)
            check(re.search(r"^spine:\s+int8 spine \(not weight-exact\)$", r.stdout, re.M) is not None,
                  f"k3ctl status prints the spine: {r.stdout!r}")
            r = k3ctl("--json", "status", sock=d.sock)
            js = json.loads(r.stdout)
            check(js.get("spine") == "int8" and js.get("weight_exact") is False and
                  js.get("spine_label") == LABEL, f"k3ctl --json status: {js}")
            r = k3ctl("run", "--stats", "--max-new", "3", "hello", sock=d.sock)
            check(r.returncode == 0 and f"[{LABEL}]" in r.stderr, f"run --stats says so: {r.stderr!r}")
            r = k3ctl("--json", "run", "--max-new", "3", "hello", sock=d.sock)
            js = json.loads(r.stdout)
            check(js.get("spine") == "int8" and js.get("weight_exact") is False,
                  f"run --json says so: {r.stdout!r}")
            gm = gateway_model(d.sock)
            check(gm is not None and gm["data"][0]["id"] == f"{name}+int8-spine",
                  f"the gateway's /v1/models id: {gm}")
            # the same engine offline: same greedy ids
            r = k3ctl("forward", "--model", model, "--ids", ",".join(map(str, ids)), "--steps", "6",
                      "--spine", "int8", "--json", "--threads", "1")
            fw = json.loads(r.stdout)
            check(fw["greedy"]["tokens"] == out and fw["spine"] == "int8" and not fw["weight_exact"],
                  f"k3d --spine int8 ids {out} == k3ctl forward --spine int8 {fw['greedy']['tokens']}")
        finally:
            check(d.stop() == 0, "k3d --spine int8 stops cleanly")
            check(not d.sanitizer_reports(), f"sanitizers: {d.sanitizer_reports()}")

        d = Daemon(K3D, model=model)
        try:
            out_bf, done = generate(d.sock, ids, 6)
            check(u32g(done, 40) == 0 and 41 not in done, "the bf16 spine's DONE: spine 0, no label")
            t, _, f = request(d.sock, T["STATUS"])
            check(u32g(f, 50) == 0 and 51 not in f, "the bf16 spine's STATUS: spine 0, no label")
            check(hello_model(d.sock) == name, "the bf16 model id is the plain name")
            r = k3ctl("status", sock=d.sock)
            check("spine:       bf16 (the checkpoint's weights)" in r.stdout, f"status: {r.stdout!r}")
            r = k3ctl("run", "--stats", "--max-new", "3", "hello", sock=d.sock)
            check("not weight-exact" not in r.stderr, f"bf16 run --stats: {r.stderr!r}")
            check("spine: bf16" in d.log_text(), "the bf16 log line")
        finally:
            d.stop()

        # the comparison report
        r = k3ctl("--json", "bench", "--compare-spine", "--model", model, "--ids",
                  ",".join(str(i) for i in range(3, 40)), "--positions", "20", "--threads", "1")
        js = json.loads(r.stdout) if r.returncode == 0 else {}
        row = js.get("int8", [{}])[0]
        check(js.get("positions") == 20 and row.get("positions") == 20 and
              0 <= row.get("top1_agreement", -1) <= 1 and row.get("mean_kl", -1) >= 0 and
              row.get("max_abs_dlogit", 0) > 0 and row.get("int8") == "default",
              f"compare-spine --json: {r.stdout!r} {r.stderr!r}")

        # refusals: a model shard touched since; no overlay
        shard = os.path.join(model, "model-00001-of-00002.safetensors")
        st = os.stat(shard)
        os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns - 10**9))
        rc, err = start_fails("--model", model, "--spine", "int8")
        check(rc != 0 and "stale" in err and f"convert-spine-int8 --model {model}" in err,
              f"a stale overlay is refused with what to run: {err!r}")
        shutil.rmtree(ov)
        rc, err = start_fails("--model", model, "--spine", "int8")
        check(rc != 0 and "no int8 spine overlay" in err and "convert-spine-int8" in err,
              f"a missing overlay is refused with what to run: {err!r}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print("test_spine_int8:", "FAIL" if failures else "ok", checks[0], "checks,", len(failures),
          "failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

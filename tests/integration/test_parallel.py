#!/usr/bin/env python3
"""Several sequences in one pass (issue 21) through the real k3d: with
--parallel 4, 1-4 concurrent generations of different prompt lengths,
started at different times, each give exactly the ids and the routes
(--router-trace: expert ids and weight bits of every position and MoE
layer) of their solo run under --parallel 1, and DONE says they shared
passes; with drafting (n-gram) on and off; a cancelled one and a
disconnected one leave the others' outputs unchanged; the per-uid seat
share; BUSY only when seats and queue are full; STATUS's and DONE's
new fields; --parallel 1 still refuses a second generation with --queue 0.

usage: test_parallel.py K3D K3CTL
"""
import collections
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
from k3proto import T, Daemon, connect, field, frame, ids_field, read_frame, u32, unpack_ids  # noqa
from k3test import check, report  # noqa

K3D, K3CTL = sys.argv[1], sys.argv[2]
NAMES = {v: k for k, v in T.items()}
NGRAM, OFF = 3, 1


def d_u32(f, tag):
    return struct.unpack("<I", f[tag][0])[0] if tag in f else None


def d_u64(f, tag):
    return struct.unpack("<Q", f[tag][0])[0] if tag in f else None


def d_f64(f, tag):
    return struct.unpack("<d", f[tag][0])[0] if tag in f else None


def start(sock, ids, max_new, draft=None, rid=7):
    """Sends one raw GENERATE; returns the connection."""
    p = field(1, 0) + ids_field(3, ids) + field(8, max_new)
    if draft is not None:
        p += field(13, draft)
    c = connect(sock)
    c.sendall(frame(T["GENERATE"], rid, p))
    return c


def finish(c, cancel_after=None, close_after=None, rid=7):
    """Reads one generation to its DONE: (ids, done fields, job id), or
    ('error', status, message). cancel_after: send CANCEL after that many
    ids; close_after: disconnect after that many (returns the ids so far)."""
    out, job, sent = [], None, False
    while True:
        r = read_frame(c, 120)
        if r is None:
            return "closed", out
        t, _, f = r
        name = NAMES.get(t)
        if name == "ACCEPTED":
            job = d_u64(f, 1)
        elif name == "TOKEN":
            out += unpack_ids(f[1][0])
            if close_after is not None and len(out) >= close_after:
                c.close()
                return "closed", out
            if cancel_after is not None and len(out) >= cancel_after and not sent:
                c.sendall(frame(T["CANCEL"], rid, b""))
                sent = True
        elif name == "DONE":
            c.close()
            return out, f, job
        elif name == "ERROR":
            c.close()
            return "error", u32(f, 1), f[2][0].decode()


def positions(c, first_only=False):
    """Reads a generation to its end (first_only: to its first ACCEPTED):
    the queue_position of each ACCEPTED."""
    out = []
    while True:
        r = read_frame(c, 120)
        if r is None:
            return out
        t, _, f = r
        if NAMES.get(t) == "ACCEPTED":
            out.append(d_u32(f, 2))
            if first_only:
                return out
        elif NAMES.get(t) in ("DONE", "ERROR"):
            c.close()
            return out


def routes_by_job(path):
    """--router-trace records grouped by request (job) id, in order:
    {job: [(position, layer, ids, weights)]}."""
    by = collections.defaultdict(list)
    if not os.path.exists(path):
        return by
    with open(path) as fh:
        for line in fh:
            r = json.loads(line)
            by[r["request"]].append((r["position"], r["layer"], tuple(r["ids"]), tuple(r["weights"])))
    return by


def status(sock):
    c = connect(sock)
    c.sendall(frame(T["STATUS"], 3, b""))
    t, _, f = read_frame(c, 10)
    c.close()
    return f


# Prompts of different lengths: one past the 64-position prefill chunk
# (several chunks), one that repeats itself (the n-gram draft proposes).
PROMPTS = [
    [(i * 7 + 3) % 251 for i in range(5)],
    [(i % 5) * 41 + 7 for i in range(40)],
    [(i * 13 + 1) % 241 for i in range(150)],
    [(i * 3 + 11) % 199 for i in range(17)],
]
MAX_NEW = [48, 40, 36, 44]


def run_set(sock, which, delays, draft=None, cancel=None, close=None):
    """Runs PROMPTS[which] concurrently, the k-th started delays[k] s after
    the first. Returns {index: result of finish()}."""
    res, th = {}, []

    def one(k, i):
        time.sleep(delays[k])
        c = start(sock, PROMPTS[i], MAX_NEW[i], draft=draft)
        res[i] = finish(c, cancel_after=cancel.get(i) if cancel else None,
                        close_after=close.get(i) if close else None)

    for k, i in enumerate(which):
        th.append(threading.Thread(target=one, args=(k, i)))
    for t in th:
        t.start()
    for t in th:
        t.join(300)
    return res


def main():
    tmp = tempfile.mkdtemp(prefix="k3-parallel-test-")
    model = os.path.join(tmp, "nano")
    subprocess.run([K3CTL, "demo-model", "--out", model, "--preset", "nano"], check=True,
                   capture_output=True)
    solo, solo_routes = {}, {}
    try:
        # ---- references: --parallel 1, one at a time --------------------------
        trace = os.path.join(tmp, "solo.jsonl")
        d = Daemon(K3D, "--parallel", "1", "--draft", "off", "--router-trace", trace, model=model)
        try:
            st = status(d.sock)
            check(d_u32(st, 78) == 1, f"--parallel 1: STATUS parallel {d_u32(st, 78)}")
            out = subprocess.run([K3CTL, "--socket", d.sock, "status"], capture_output=True, text=True)
            check("passes:      1 seat (--parallel);" in out.stdout,
                  f"--parallel 1: k3ctl status says 1 seat: {out.stdout!r}")
            js = json.loads(subprocess.run([K3CTL, "--socket", d.sock, "--json", "status"],
                                           capture_output=True, text=True).stdout)
            check(js.get("parallel") == 1, f"--parallel 1: k3ctl status --json parallel {js.get('parallel')}")
            for i, p in enumerate(PROMPTS):
                r = finish(start(d.sock, p, MAX_NEW[i]))
                check(r[0] != "error" and len(r[0]) == MAX_NEW[i], f"solo {i}: {r[:2]}")
                solo[i] = r[0]
                check(d_u64(r[1], 78) == 0, f"solo {i}: shared_passes {d_u64(r[1], 78)} == 0")
                check(d_f64(r[1], 79) == 1.0, f"solo {i}: pass_width_mean {d_f64(r[1], 79)}")
                ttft = d_f64(r[1], 77)
                check(ttft is not None and 0 < ttft < 60, f"solo {i}: ttft_s {ttft}")
                solo_routes[i] = routes_by_job(trace)[r[2]]
                check(len(solo_routes[i]) > 0, f"solo {i}: routes traced")
            # --parallel 1 is one slot: a second generation with --queue 0 is BUSY
            c1 = start(d.sock, PROMPTS[2], 200)
            time.sleep(0.05)
            r2 = finish(start(d.sock, PROMPTS[0], 4, rid=8), rid=8)
            check(r2[0] == "error" and r2[1] == 5, f"--parallel 1 --queue 0: second is BUSY: {r2}")
            finish(c1)
        finally:
            d.stop()

        # ---- --parallel 4: 1-4 together, different starts, draft off and on ----------------
        for draft in (OFF, NGRAM):
            trace = os.path.join(tmp, f"par-{draft}.jsonl")
            if os.path.exists(trace):
                os.unlink(trace)
            d = Daemon(K3D, "--parallel", "4", "--router-trace", trace, model=model)
            try:
                st = status(d.sock)
                check(d_u32(st, 78) == 4, f"STATUS parallel {d_u32(st, 78)} == 4")
                shared = 0
                for which, delays in (([1], [0]), ([0, 2], [0, 0.01]), ([2, 1, 3], [0, 0.005, 0.02]),
                                      ([3, 0, 2, 1], [0, 0, 0.01, 0.03])):
                    res = run_set(d.sock, which, delays, draft=draft)
                    routes = routes_by_job(trace)
                    for i in which:
                        r = res.get(i)
                        what = f"parallel 4, draft {draft}, set {which}, prompt {i}"
                        check(r is not None and r[0] != "error", f"{what}: {r}")
                        if r is None or r[0] == "error":
                            continue
                        check(r[0] == solo[i], f"{what}: ids equal the solo run's")
                        check(routes[r[2]] == solo_routes[i], f"{what}: routes equal the solo run's")
                        shared += d_u64(r[1], 78) or 0
                        if len(which) > 1 and i == which[0]:
                            pass
                check(shared > 0 or which == [1], f"draft {draft}: some passes were shared ({shared})")
                st = status(d.sock)
                check(d_u64(st, 81) > 0 and d_f64(st, 80) > 1.0,
                      f"draft {draft}: STATUS passes {d_u64(st, 81)}, mean width {d_f64(st, 80)} > 1")
                # several of them did share: the mean width of some DONE is > 1
                # ---- cancel one mid-run; disconnect another ---------------------------
                res = run_set(d.sock, [2, 0, 1, 3], [0, 0, 0, 0], draft=draft, cancel={0: 5},
                              close={3: 6})
                r = res.get(0)
                check(r is not None and r[0] != "error" and d_u32(r[1], 1) == 2,
                      f"draft {draft}: cancelled one ends cancelled: {r and r[:2]}")
                if r and r[0] != "error":
                    check(r[0] == solo[0][:len(r[0])], f"draft {draft}: cancelled one's ids are a prefix")
                r = res.get(3)
                check(r is not None and r[0] == "closed" and r[1] == solo[3][:len(r[1])],
                      f"draft {draft}: the disconnected one's ids so far are a prefix")
                for i in (2, 1):
                    r = res.get(i)
                    check(r is not None and r[0] == solo[i],
                          f"draft {draft}: prompt {i} unchanged beside a cancel and a disconnect")
                # k3d goes on serving
                r = finish(start(d.sock, PROMPTS[1], MAX_NEW[1], draft=draft))
                check(r[0] == solo[1], f"draft {draft}: a generation after them")
                st = status(d.sock)
                check(d_u32(st, 8) == 0, f"draft {draft}: nothing running at the end ({d_u32(st, 8)})")
            finally:
                d.stop()

        # ---- DSpark: a tapped draft switches off when another seat joins ----------------
        model2, draft2 = os.path.join(tmp, "nano2"), os.path.join(tmp, "nano2-draft")
        subprocess.run([K3CTL, "demo-model", "--out", model2, "--preset", "nano", "--draft", draft2],
                       check=True, capture_output=True)
        ref2 = {}
        d = Daemon(K3D, "--parallel", "1", "--draft", "off", model=model2)
        try:
            for i in (0, 1, 3):
                ref2[i] = finish(start(d.sock, PROMPTS[i], MAX_NEW[i]))[0]
        finally:
            d.stop()
        d = Daemon(K3D, "--parallel", "3", "--draft-model", draft2, model=model2)
        try:
            r = finish(start(d.sock, PROMPTS[1], MAX_NEW[1], draft=4))
            check(r[0] == ref2[1] and d_u32(r[1], 26) == 4, f"dspark alone: ids and policy {r[:2]}")
            shared = 0
            for _ in range(2):
                res = run_set(d.sock, [1, 0, 3], [0, 0.005, 0.01], draft=4)
                for i in (1, 0, 3):
                    r = res.get(i)
                    check(r is not None and r[0] == ref2[i], f"dspark with seats: prompt {i} ids")
                    if r is not None and r[0] != "error":
                        shared += d_u64(r[1], 78) or 0
            check(shared > 0, f"dspark with seats: passes were shared ({shared})")
        finally:
            d.stop()

        # ---- prompts take turns: a short prompt beside a long one decodes while
        # the long one prefills (one chunk each per pass, not one prompt after
        # the other), with its solo ids; a cancel of a waiting prompt ends it
        # at the next pass, not after the long prompt ---------------------------------------
        d = Daemon(K3D, "--parallel", "3", "--draft", "off", "--prefill-chunk", "8", model=model)
        try:
            order, res = [], {}
            long_ids = [(i * 11 + 5) % 233 for i in range(4000)]

            def go(name, ids, max_new, delay, cancel_at=None):
                time.sleep(delay)
                c = start(d.sock, ids, max_new, rid=40 + len(name))
                if cancel_at is not None:
                    time.sleep(cancel_at)
                    c.sendall(frame(T["CANCEL"], 40 + len(name), b""))
                res[name] = finish(c, rid=40 + len(name))
                order.append(name)

            th = [threading.Thread(target=go, args=("long", long_ids, 2, 0)),
                  threading.Thread(target=go, args=("short", PROMPTS[0], MAX_NEW[0], 0.3)),
                  threading.Thread(target=go, args=("waiting", long_ids[:2000], 2, 0.3, 0.3))]
            t0 = time.time()
            for t in th:
                t.start()
            for t in th:
                t.join(300)
            print(f"turns: order {order}, {time.time() - t0:.1f} s")
            check(sorted(order) == ["long", "short", "waiting"] and order[-1] == "long",
                  f"turns: the short and the cancelled prompt end before the long one: {order}")
            check(res.get("short", ("error",))[0] == solo[0], f"turns: short ids equal solo: {res.get('short')}")
            w = res.get("waiting", ("error",))
            check(w[0] != "error" and d_u32(w[1], 1) == 2, f"turns: waiting prompt cancelled: {w[:2]}")
            # k3ctl shows each request's time to first token (DONE ttft_s)
            out = subprocess.run([K3CTL, "--socket", d.sock, "--json", "run", "--max-new", "2", "hello"],
                                 capture_output=True, text=True)
            tm = json.loads(out.stdout).get("timings", {}) if out.returncode == 0 else {}
            check(0 < tm.get("ttft_s", 0) <= tm.get("prefill_s", 0) + tm.get("decode_s", 0) + 1,
                  f"k3ctl run --json timings.ttft_s: {out.stdout[-300:]} {out.stderr[-200:]}")
        finally:
            d.stop()

        # ---- BUSY only when seats and queue are full ---------------------------------------
        d = Daemon(K3D, "--parallel", "2", "--queue", "1", model=model)
        try:
            cs = [start(d.sock, [1, 2, 3], 1500, rid=20 + k) for k in range(3)]
            time.sleep(0.2)
            st = status(d.sock)
            check(d_u32(st, 8) == 2 and d_u32(st, 9) == 1,
                  f"2 seats + 1 queued: running {d_u32(st, 8)}, queued {d_u32(st, 9)}")
            out = subprocess.run([K3CTL, "--socket", d.sock, "status"], capture_output=True, text=True)
            check("2 running, 1/1 queued" in out.stdout and "2 seats (--parallel)" in out.stdout,
                  f"k3ctl status: {out.stdout}")
            js = json.loads(subprocess.run([K3CTL, "--socket", d.sock, "--json", "status"],
                                           capture_output=True, text=True).stdout)
            check(js.get("parallel") == 2 and js.get("passes_total", 0) > 0 and js.get("pass_width") == 2,
                  f"k3ctl --json status: parallel {js.get('parallel')}, passes {js.get('passes_total')}, "
                  f"width {js.get('pass_width')}")
            r = finish(start(d.sock, PROMPTS[0], 4, rid=30), rid=30)
            check(r[0] == "error" and r[1] == 5 and "2/2 generations running" in r[2],
                  f"fourth is BUSY: {r}")
            for k, c in enumerate(cs):
                r = finish(c, rid=20 + k)
                check(r[0] != "error" and len(r[0]) > 0 and d_u32(r[1], 1) in (0, 1),
                      f"seat job {k}: {r[:2]}")
        finally:
            d.stop()

        # ---- queue positions: a job a free seat takes is never told it is queued ----------------
        # (it was: with one seat busy, the third and fourth of four got "[queued at position 1]"
        # and 2 while free seats took them); a job behind four busy seats is told 1.
        d = Daemon(K3D, "--parallel", "4", "--queue", "4", "--threads", "1", model=model)
        try:
            busy = start(d.sock, [1, 2, 3], 1500, draft=OFF, rid=40)
            first = positions(busy, first_only=True)
            cs = [start(d.sock, PROMPTS[0], 8, draft=OFF, rid=41 + k) for k in range(3)]
            pos = [first] + [positions(c) for c in cs]
            busy.close()
            check(all(p == [0] for p in pos), f"4 seats, 4 jobs: every ACCEPTED says position 0: {pos}")
            time.sleep(0.3)
            cs = [start(d.sock, [1, 2, 3], 1500, draft=OFF, rid=50 + k) for k in range(4)]
            pos = [positions(c, first_only=True) for c in cs]
            time.sleep(0.3)
            fifth = start(d.sock, PROMPTS[0], 4, draft=OFF, rid=54)
            pos.append(positions(fifth, first_only=True))
            for c in cs + [fifth]:
                c.close()
            check(pos == [[0], [0], [0], [0], [1]],
                  f"4 busy seats: the fifth is told position 1, the four 0: {pos}")
        finally:
            d.stop()

        # ---- per-uid share: one uid holds at most N - 1 seats while another waits --------------
        if os.geteuid() == 0:
            uid_share(model)
        else:
            print("SKIP: per-uid share needs root (two peer uids)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report()


def as_uid(uid, sock, ids, max_new, out, key):
    """A generation from a child process running as uid; out[key] = (first
    TOKEN time, DONE time)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            os.setgid(uid)
            os.setuid(uid)
            c = start(sock, ids, max_new)
            first = None
            while True:
                t, _, f = read_frame(c, 120)
                if NAMES.get(t) == "TOKEN" and first is None:
                    first = time.monotonic()
                if NAMES.get(t) in ("DONE", "ERROR"):
                    break
            os.write(w, json.dumps([first, time.monotonic(), NAMES.get(t)]).encode())
        finally:
            os._exit(0)
    os.close(w)

    def wait():
        data = b""
        while True:
            b = os.read(r, 4096)
            if not b:
                break
            data += b
        os.waitpid(pid, 0)
        out[key] = json.loads(data) if data else None
    th = threading.Thread(target=wait)
    th.start()
    return th


def uid_share(model):
    a, b = 65534, 65533
    d = Daemon(K3D, "--parallel", "2", "--queue", "4", "--allow-uid", str(a), "--allow-uid", str(b),
               sockdir_mode=0o755, model=model)
    try:
        os.chmod(d.sock, 0o777)
        out = {}
        th = [as_uid(a, d.sock, [1, 2, 3], 500, out, "a1"), as_uid(a, d.sock, [1, 2, 3], 3000, out, "a2")]
        time.sleep(0.05)
        th.append(as_uid(a, d.sock, PROMPTS[0], 20, out, "a3"))
        time.sleep(0.05)
        th.append(as_uid(b, d.sock, PROMPTS[0], 20, out, "b1"))
        for t in th:
            t.join(300)
        ok = all(out.get(k) and out[k][2] == "DONE" for k in ("a1", "a2", "a3", "b1"))
        check(ok, f"per-uid share: every generation done: {out}")
        if ok:
            # a3 queued first, but uid a held its share (1 of 2 seats) while b
            # waited: b1 took the seat a1 freed
            check(out["b1"][0] < out["a3"][0],
                  f"per-uid share: b1 started before a3 ({out['b1'][0]:.3f} < {out['a3'][0]:.3f})")
    finally:
        d.stop()


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Integration tests: the real k3d in a temporary directory, driven by the
real k3ctl and by raw sockets that send hostile bytes.

usage: test_daemon.py K3D K3CTL
"""
import json
import os
import random
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
from k3proto import (T, STATUS, Daemon, connect, field, frame, hello,  # noqa: E402
                     make_model, read_frame, u32)
from k3test import check, report  # noqa

K3D, K3CTL = sys.argv[1], sys.argv[2]


def k3ctl(sock, *args, user=None):
    cmd = [K3CTL, "--socket", sock, *args]
    if user is not None:
        cmd = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=30)


def expect_error(sock, status, what, closes=True):
    r = read_frame(sock)
    check(r is not None and r[0] == T["ERROR"], f"{what}: ERROR frame (got {r and r[0]})")
    if r and r[0] == T["ERROR"]:
        got = u32(r[2], 1)
        check(got == STATUS[status], f"{what}: status {status} (got {got})")
        check(len(r[2][2][0]) > 0, f"{what}: message present")
    if closes:
        check(read_frame(sock) is None, f"{what}: connection closed after the error")


def test_k3ctl_basics(d):
    r = k3ctl(d.sock, "status")
    check(r.returncode == 0 and "state:" in r.stdout and "ready" in r.stdout,
          f"status prints state: {r.stdout!r} {r.stderr!r}")
    check("ready - ready" not in r.stdout, f"status text that repeats the state is not printed: {r.stdout!r}")
    r = k3ctl(d.sock, "status", "--json")
    j = json.loads(r.stdout)
    check(j["state"] == "ready" and j["pid"] == d.proc.pid and j["model"] == "nano",
          f"status --json: {j}")
    check(j["connections"] == 1, "status counts its own connection")
    r = k3ctl(d.sock, "--json", "ping")
    check(r.returncode == 0 and json.loads(r.stdout)["ok"] is True, "ping --json")
    r = k3ctl(d.sock, "nonsense")
    check(r.returncode == 2, f"unknown command exits 2 (got {r.returncode})")
    r = k3ctl(d.sock, "status", "extra")
    check(r.returncode == 2, "extra argument exits 2")
    r = k3ctl(os.path.join(d.dir, "nope.sock"), "status")
    check(r.returncode == 3 and "cannot reach k3d" in r.stderr, "no daemon exits 3 with a hint")
    r = subprocess.run([K3CTL, "status"], capture_output=True, text=True,
                       env={**os.environ, "K3D_SOCKET": d.sock})
    check(r.returncode == 0, "K3D_SOCKET is honoured")
    # An explicit empty --socket is a usage error (it used to be "cannot
    # reach k3d at ''", exit 3); an empty K3D_SOCKET counts as unset, so the
    # default ($XDG_RUNTIME_DIR/k3d.sock here) is used.
    for args in (["--socket", ""], ["--socket="]):
        r = subprocess.run([K3CTL, *args, "status"], capture_output=True, text=True, timeout=30)
        check(r.returncode == 2 and r.stderr.startswith("k3ctl: --socket needs a path, got an empty one")
              and "$XDG_RUNTIME_DIR/k3d.sock" in r.stderr,
              f"empty {args} exits 2 naming the default ({r.returncode}: {r.stderr!r})")
    r = subprocess.run([K3CTL, "status"], capture_output=True, text=True, timeout=30,
                       env={**os.environ, "K3D_SOCKET": "", "XDG_RUNTIME_DIR": os.path.dirname(d.sock)})
    check(r.returncode == 0 and "ready" in r.stdout,
          f"empty K3D_SOCKET falls back to the default ({r.returncode}: {r.stderr!r})")
    # sun_path holds 107 bytes and a NUL: a longer path cannot reach any k3d
    # (exit 3, naming the limit); a 107-byte one is tried like any other.
    long = "/" + "d" * 106
    r = subprocess.run([K3CTL, "status"], capture_output=True, text=True,
                       env={**os.environ, "K3D_SOCKET": long + "x"})
    check(r.returncode == 3 and f"'{long}x' is 108 bytes" in r.stderr and "at most 107" in r.stderr,
          f"108-byte K3D_SOCKET exits 3 naming the limit ({r.returncode}: {r.stderr!r})")
    r = k3ctl(long, "status")
    check(r.returncode == 3 and "cannot reach k3d" in r.stderr,
          f"107-byte socket path is tried ({r.returncode}: {r.stderr!r})")


def test_k3ctl_peer_hangs_up():
    """A socket whose server accepts and closes without answering (not a
    k3d, or a k3d dying): k3ctl says the peer closed the connection before
    answering HELLO and exits 3, also when the close comes with k3ctl's
    HELLO unread, which the kernel reports as ECONNRESET."""
    d = tempfile.mkdtemp(prefix="k3-hangup-")
    path = os.path.join(d, "s.sock")
    ls = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    ls.bind(path)
    ls.listen(4)

    def serve(wait_for_hello):
        c, _ = ls.accept()
        if wait_for_hello:
            c.recv(1, socket.MSG_PEEK)   # HELLO is in; closing now resets
        c.close()

    try:
        for wait_for_hello in (True, False):
            th = threading.Thread(target=serve, args=(wait_for_hello,))
            th.start()
            r = k3ctl(path, "status")
            th.join(10)
            want = f"k3d at '{path}' closed the connection before answering HELLO (is it a k3d socket?"
            check(r.returncode == 3 and want in r.stderr and "reset" not in r.stderr,
                  f"peer that hangs up (after HELLO: {wait_for_hello}) -> 3, says so: "
                  f"{r.returncode} {r.stderr!r}")
    finally:
        ls.close()
        shutil.rmtree(d, ignore_errors=True)


def test_k3ctl_peer_refuses():
    """A peer that sends its reason and hangs up at once (k3d refusing a
    uid not in its allow list) may close before k3ctl's HELLO is written:
    k3ctl still reads the queued ERROR, says why and exits 3, every time. A
    peer that answers with bytes that are not k3d frames is not a k3d:
    exit 3 too."""
    d = tempfile.mkdtemp(prefix="k3-refuse-")
    path = os.path.join(d, "s.sock")
    ls = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    ls.bind(path)
    ls.listen(4)
    refusal = frame(T["ERROR"], 0, field(1, STATUS["unauthorized"]) +
                    field(2, "peer uid is not allowed by this k3d"))

    def serve(reply, n):
        for _ in range(n):
            c, _ = ls.accept()
            c.sendall(reply)
            c.close()

    try:
        th = threading.Thread(target=serve, args=(refusal, 20))
        th.start()
        got = [k3ctl(path, "status") for _ in range(20)]
        th.join(10)
        bad = [(r.returncode, r.stderr) for r in got
               if r.returncode != 3 or "peer uid is not allowed by this k3d" not in r.stderr]
        check(not bad, f"refused: exit 3 with k3d's reason in 20 of 20 tries ({len(bad)} not: {bad[:2]})")
        th = threading.Thread(target=serve, args=(b"HTTP/1.1 400 Bad Request\r\n\r\n", 1))
        th.start()
        r = k3ctl(path, "status")
        th.join(10)
        check(r.returncode == 3 and "not k3d's protocol" in r.stderr,
              f"an HTTP server at the path -> 3, not a k3d: {r.returncode} {r.stderr!r}")
    finally:
        ls.close()
        shutil.rmtree(d, ignore_errors=True)


def test_bad_frames(d):
    s = connect(d.sock, do_hello=False)
    s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    expect_error(s, "bad_request", "HTTP request on the socket")

    s = connect(d.sock, do_hello=False)
    s.sendall(frame(T["STATUS"]))
    expect_error(s, "bad_request", "first frame not HELLO")

    s = connect(d.sock, do_hello=False)
    s.sendall(hello(version=7))
    expect_error(s, "unsupported_version", "HELLO with version 7")

    s = connect(d.sock, do_hello=False)
    s.sendall(frame(T["PING"], version=2))
    expect_error(s, "unsupported_version", "frame version 2")

    s = connect(d.sock)
    s.sendall(frame(999))
    expect_error(s, "unknown_type", "unknown type")

    # 4 GiB length: refused from the header alone, nothing else sent.
    s = connect(d.sock)
    s.sendall(frame(T["GENERATE"], length=0xFFFFFFFF))
    expect_error(s, "too_large", "length overflow")

    s = connect(d.sock)
    s.sendall(frame(T["TOKENIZE"], 2, field(1, b"\xc3\x28")))
    expect_error(s, "bad_request", "bad UTF-8")

    s = connect(d.sock)
    s.sendall(frame(T["PONG"], 2, field(1, 1) + b"\x00\x00"))
    expect_error(s, "bad_request", "trailing bytes / reply sent as request")

    s = connect(d.sock)
    s.sendall(frame(T["STATUS"], 3, field(9, 1)))
    expect_error(s, "bad_request", "unknown field")

    s = connect(d.sock)
    s.sendall(frame(T["GENERATE"], 4, field(1, 0)))
    expect_error(s, "bad_request", "raw GENERATE without a prompt", closes=False)
    s.sendall(frame(T["PING"], 5))
    r = read_frame(s)
    check(r and r[0] == T["PONG"] and r[1] == 5, "connection still usable after a refused request")


def test_no_stall(d):
    """A client stuck halfway through a frame does not delay anyone."""
    slow = connect(d.sock)
    slow.sendall(frame(T["TOKENIZE"], 9, length=1000)[:30])
    t0 = time.time()
    r = k3ctl(d.sock, "ping")
    check(r.returncode == 0 and time.time() - t0 < 5, "ping while another client stalls")
    # Byte-at-a-time frames still work.
    s = connect(d.sock)
    for b in frame(T["PING"], 77):
        s.send(bytes([b]))
    r = read_frame(s)
    check(r and r[0] == T["PONG"] and r[1] == 77, "frame split across 20 writes")
    slow.close()


def test_large_frame_budget(d):
    """Large frames in flight are bounded in total, not only one by one:
    headers announcing 100 MiB each take the budget (2 x 132 MiB) without
    a payload byte sent, the next is refused BUSY, a released share is
    reusable, and small requests never wait on it."""
    big = 100 << 20
    held = []
    for i in range(2):
        s = connect(d.sock)
        s.sendall(frame(T["TOKENIZE"], 10 + i, length=big))
        held.append(s)
    s = connect(d.sock)
    s.sendall(frame(T["TOKENIZE"], 12, length=big))
    expect_error(s, "busy", "third 100 MiB frame in flight")
    r = k3ctl(d.sock, "ping")
    check(r.returncode == 0, "small requests pass while the large-frame budget is taken")
    held.pop().close()
    time.sleep(0.2)
    s = connect(d.sock)
    s.sendall(frame(T["TOKENIZE"], 13, length=big))
    s.settimeout(0.5)
    try:
        got = s.recv(64)
    except socket.timeout:
        got = None
    check(got is None, f"a closed connection's share is released ({got!r})")
    held.append(s)
    for s in held:
        s.close()


def test_frame_timeout(k3d):
    """Half a large frame cannot hold the large-frame budget forever."""
    d = Daemon(k3d, "--frame-timeout", "1")
    try:
        s = connect(d.sock)
        s.sendall(frame(T["TOKENIZE"], 10, length=10 << 20) + field(1, "x" * 1000)[:500])
        s.settimeout(10)
        t0 = time.time()
        try:
            closed = s.recv(64) == b""
        except OSError:
            closed = True
        check(closed and time.time() - t0 < 8, "stalled large frame closed after --frame-timeout")
        check("--frame-timeout" in d.log_text(), "the close is logged with its reason")
        r = k3ctl(d.sock, "ping")
        check(r.returncode == 0, "daemon serves after the timeout")
    finally:
        d.stop()


def test_garbage_storm(d):
    """Random bytes on many connections: no crash, no fd or memory growth."""
    rng = random.Random(1234)
    base_fds = d.fds()
    for i in range(300):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(d.sock)
        if i % 3 == 0:
            s.sendall(hello())
        junk = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200)))
        if i % 5 == 0:   # valid header prefix, garbage after
            junk = frame(rng.randrange(1, 30), length=rng.randrange(0, 100)) + junk
        try:
            s.sendall(junk)
        except OSError:
            pass
        s.close()
    time.sleep(0.5)
    check(d.proc.poll() is None, "k3d survived 300 garbage connections")
    r = k3ctl(d.sock, "ping")
    check(r.returncode == 0, "k3d still answers after the storm")
    time.sleep(0.2)
    check(d.fds() <= base_fds + 1, f"no fd leak ({base_fds} -> {d.fds()})")


def test_many_requests(d):
    """Pipelined requests on one connection, answered in order with ids."""
    s = connect(d.sock)
    s.sendall(b"".join(frame(T["PING"], 100 + i) for i in range(500)))
    ids = []
    for _ in range(500):
        r = read_frame(s)
        ids.append(r[1])
    check(ids == list(range(100, 600)), "500 pipelined PINGs answered in order")


class HelloTrickle(threading.Thread):
    """A peer that sends its HELLO one byte every 2 s: each byte resets a
    read timeout, so only a deadline counted from the accept closes it
    (protocol.md: no HELLO within 10 s -> close). Runs beside the other
    tests to keep the suite fast."""

    def __init__(self, path):
        super().__init__(daemon=True)
        self.s = connect(path, do_hello=False)
        self.t0 = time.time()
        self.closed_after = None

    def run(self):
        data = hello()
        self.s.settimeout(2)
        for i in range(9):   # 9 bytes over 18 s: never a whole HELLO
            try:
                self.s.send(data[i:i + 1])
                if self.s.recv(4096) == b"":
                    self.closed_after = time.time() - self.t0
                    return
            except socket.timeout:
                continue
            except OSError:
                self.closed_after = time.time() - self.t0
                return


def test_peer_credentials(k3d):
    """Peers outside the allow list are refused with a logged reason."""
    if os.getuid() != 0 or not shutil.which("setpriv"):
        print("skip: peer credential tests need root and setpriv")
        return
    d = Daemon(k3d, sockdir_mode=0o755)
    try:
        os.chmod(d.sock, 0o666)   # let the file mode pass so SO_PEERCRED decides
        r = k3ctl(d.sock, "ping", user=65534)
        check(r.returncode != 0, "uid 65534 refused")
        for _ in range(10):
            r = k3ctl(d.sock, "status", user=65534)
            if r.returncode != 3 or "not allowed" not in r.stderr:
                break
        check(r.returncode == 3 and "not allowed" in r.stderr,
              f"uid 65534: exit 3 and k3d's reason, every time: {r.returncode} {r.stderr!r}")
        time.sleep(0.1)
        check("refusing connection from uid 65534" in d.log_text(), "refusal logged with uid")
    finally:
        d.stop()
    d = Daemon(k3d, "--allow-gid", "65534", sockdir_mode=0o755)
    try:
        os.chmod(d.sock, 0o666)
        r = k3ctl(d.sock, "ping", user=65534)
        check(r.returncode == 0, f"--allow-gid admits the group: {r.stderr}")
        r = k3ctl(d.sock, "shutdown", user=65534)
        check(r.returncode == 1 and "may not shut" in r.stderr, "group member may not shut down")
        check(d.proc.poll() is None, "daemon still running after refused shutdown")
    finally:
        d.stop()


def test_lifecycle(k3d):
    d = Daemon(k3d)
    # A second daemon on the same live socket refuses to start.
    p = subprocess.run([k3d, "--socket", d.sock, "--model", os.environ["K3_TEST_MODEL"]],
                       capture_output=True, text=True, timeout=10)
    check(p.returncode == 1 and "already serving" in p.stderr, f"second k3d refused: {p.stderr}")
    # Stale socket after a crash is replaced.
    d.proc.send_signal(signal.SIGKILL)
    d.proc.wait()
    check(os.path.exists(d.sock), "stale socket left by SIGKILL")
    p = subprocess.Popen([k3d, "--socket", d.sock, "--model", os.environ["K3_TEST_MODEL"]],
                         stderr=subprocess.PIPE)
    for _ in range(200):
        if k3ctl(d.sock, "ping").returncode == 0:
            break
        time.sleep(0.05)
    check(k3ctl(d.sock, "ping").returncode == 0, "restart over a stale socket")
    p.send_signal(signal.SIGTERM)
    rc = p.wait(10)
    err = p.stderr.read().decode()
    check(rc == 0 and "draining" in err, f"SIGTERM drains and exits 0: {rc}")
    check(not os.path.exists(d.sock), "socket removed on exit")
    d.stop()
    # k3ctl shutdown: OK, then exit 0.
    d2 = Daemon(k3d)
    r = k3ctl(d2.sock, "shutdown")
    check(r.returncode == 0, "k3ctl shutdown")
    check(d2.proc.wait(10) == 0, "daemon exits 0 after SHUTDOWN")
    # Unsafe socket directory is refused.
    bad = tempfile.mkdtemp()
    os.chmod(bad, 0o777)
    p = subprocess.run([k3d, "--socket", os.path.join(bad, "k.sock"), "--model",
                        os.environ["K3_TEST_MODEL"]], capture_output=True, text=True, timeout=10)
    check(p.returncode == 1 and "writable by others" in p.stderr, "world-writable dir refused")
    p = subprocess.run([k3d, "--queue", "x"], capture_output=True, text=True, timeout=10)
    check(p.returncode == 2 and "--queue" in p.stderr, "bad option exits 2 naming it")
    p = subprocess.run([k3d, "--model"], capture_output=True, text=True, timeout=10)
    check(p.returncode == 2 and "'--model' needs a value" in p.stderr,
          f"an option without its value says so: {p.stderr}")
    for bad_opt in (["--direct", "maybe"], ["--prefetch", "-1"], ["--prefetch", "0"], ["--io-threads", "0"],
                    ["--expert-cache-gb", "nan"], ["--provider", "gpu"], ["--vram-cache-gb", "lots"],
                    ["--vram-cache-gb", "0"]):
        p = subprocess.run([k3d, *bad_opt], capture_output=True, text=True, timeout=10)
        check(p.returncode == 2 and bad_opt[0] in p.stderr, f"{bad_opt} exits 2: {p.stderr}")
    p = subprocess.run([k3d, "--socket", os.path.join(bad, "k.sock")], capture_output=True,
                       text=True, timeout=10, env={**os.environ, "STATE_DIRECTORY": bad})
    check(p.returncode == 1 and "k3ctl demo-model" in p.stderr and "k3ctl setup" in p.stderr,
          f"no model: refuses naming demo-model and setup: {p.stderr}")
    good = tempfile.mkdtemp()
    p = subprocess.run([k3d, "--socket", os.path.join(good, "k.sock"), "--model", bad],
                       capture_output=True, text=True, timeout=10)
    shutil.rmtree(good, ignore_errors=True)
    check(p.returncode == 1 and "cannot load model" in p.stderr, f"bad model dir: {p.stderr}")
    shutil.rmtree(bad, ignore_errors=True)


def test_notify(k3d):
    """sd_notify protocol: READY=1 after listening, WATCHDOG=1 at half of
    WATCHDOG_USEC, STOPPING=1 on SIGTERM (what k3d.service relies on)."""
    tmp = tempfile.mkdtemp()
    os.chmod(tmp, 0o700)
    ns = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    ns.bind(os.path.join(tmp, "notify"))
    ns.settimeout(5)
    env = {**os.environ, "NOTIFY_SOCKET": os.path.join(tmp, "notify"), "WATCHDOG_USEC": "200000"}
    p = subprocess.Popen([k3d, "--socket", os.path.join(tmp, "k3d.sock"), "--model",
                          os.environ["K3_TEST_MODEL"]], env=env,
                         stderr=subprocess.DEVNULL)
    msgs = []
    try:
        deadline = time.time() + 5
        # two pings, and the load done (a loaded machine loads slower)
        while time.time() < deadline and (sum("WATCHDOG=1" in m for m in msgs) < 2 or
                                          not any("READY=1" in m for m in msgs)):
            msgs.append(ns.recv(4096).decode())
        check(any("READY=1" in m for m in msgs), f"READY=1 sent: {msgs}")
        check(any("STATUS=Loading model" in m for m in msgs) and
              any("STATUS=Serving model" in m for m in msgs), f"STATUS= lines sent: {msgs}")
        check(sum("WATCHDOG=1" in m for m in msgs) >= 2, "WATCHDOG=1 pings")
        p.send_signal(signal.SIGTERM)
        deadline = time.time() + 5
        while time.time() < deadline and not any("STOPPING=1" in m for m in msgs):
            msgs.append(ns.recv(4096).decode())
        check(any("STOPPING=1" in m for m in msgs), "STOPPING=1 on SIGTERM")
        check(p.wait(10) == 0, "exit 0 after SIGTERM")
    finally:
        if p.poll() is None:
            p.kill()
        ns.close()
        shutil.rmtree(tmp, ignore_errors=True)


def test_setup():
    root = tempfile.mkdtemp()
    r = subprocess.run([K3CTL, "setup", "--model-root", root], capture_output=True, text=True)
    check(r.returncode == 1 and "hf download moonshotai/Kimi-K3" in r.stdout, "setup explains the download")
    os.symlink(os.environ["K3_TEST_MODEL"], os.path.join(root, "kimi-k3"))
    r = subprocess.run([K3CTL, "setup", "--model-root", root], capture_output=True, text=True)
    check(r.returncode == 0 and "valid" in r.stdout, f"setup validates a checkpoint: {r.stdout}")
    shutil.rmtree(root, ignore_errors=True)


def test_sigbus(k3d):
    # A model file truncated under a running k3d: the next touch of the
    # mapped weights is SIGBUS. k3d still dies of it, but says why first.
    tmp = tempfile.mkdtemp()
    model = os.path.join(tmp, "m")
    shutil.copytree(os.environ["K3_TEST_MODEL"], model)
    sock = os.path.join(tmp, "k.sock")
    p = subprocess.Popen([k3d, "--socket", sock, "--model", model], stderr=subprocess.PIPE, text=True)
    try:
        # Ready, not just answering PING (k3d answers PING while it loads):
        # truncating before the headers are read fails the load instead.
        for _ in range(300):
            r = k3ctl(sock, "status", "--json")
            if r.returncode == 0 and json.loads(r.stdout).get("state") == "ready":
                break
            time.sleep(0.1)
        for f in os.listdir(model):
            if f.endswith(".safetensors"):
                os.truncate(os.path.join(model, f), 4096)
        k3ctl(sock, "run", "--max-new", "2", "hello")
        err = p.communicate(timeout=30)[1]
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    check(p.returncode == -signal.SIGBUS or "AddressSanitizer" in err,
          f"k3d dies of SIGBUS (rc {p.returncode})")
    check("SIGBUS: a mapped model file shrank" in err or "AddressSanitizer" in err,
          f"the SIGBUS is explained: {err[-300:]}")
    shutil.rmtree(tmp, ignore_errors=True)


def main():
    os.environ["K3_TEST_MODEL"] = make_model(K3CTL)
    d = Daemon(K3D)
    try:
        test_k3ctl_basics(d)
        trickle = HelloTrickle(d.sock)
        trickle.start()
        for t in (test_bad_frames, test_no_stall, test_many_requests, test_large_frame_budget,
                  test_garbage_storm):
            print("--", t.__name__)
            t(d)
        trickle.join()
        check(trickle.closed_after is not None and 9 < trickle.closed_after < 14,
              f"a HELLO trickled byte by byte is cut off 10 s after connecting ({trickle.closed_after})")
        check(d.proc.poll() is None, "daemon alive at the end")
        check("<3>" not in d.log_text(), "no error-level log lines")
    finally:
        rc = d.stop()
    check(rc == 0, f"clean exit on SIGTERM (rc {rc})")
    check(not d.sanitizer_reports(), f"no sanitizer reports: {d.sanitizer_reports()[:3]}")
    print("-- test_k3ctl_peer_hangs_up")
    test_k3ctl_peer_hangs_up()
    test_k3ctl_peer_refuses()
    print("-- test_peer_credentials")
    test_peer_credentials(K3D)
    print("-- test_lifecycle")
    test_lifecycle(K3D)
    print("-- test_frame_timeout")
    test_frame_timeout(K3D)
    print("-- test_setup")
    test_setup()
    print("-- test_notify")
    test_notify(K3D)
    print("-- test_sigbus")
    test_sigbus(K3D)
    shutil.rmtree(os.path.dirname(os.environ["K3_TEST_MODEL"]), ignore_errors=True)
    return report()


if __name__ == "__main__":
    sys.exit(main())

"""Minimal k3 protocol codec for tests (docs/protocol.md). Stdlib only.

Deliberately independent of libk3proto: the integration tests check the
daemon against the normative byte layout, not against our own encoder.
"""
import json
import mmap
import os
import shutil
import socket
import struct
import subprocess
import tempfile
import time

MAGIC = 0x5033334B
HEADER = struct.Struct("<IHHHHII")
T = dict(HELLO=1, HELLO_OK=2, ERROR=3, OK=4, PING=5, PONG=6, STATUS=7,
         STATUS_REPLY=8, MODEL_INFO=9, MODEL_INFO_REPLY=10, TOKENIZE=11,
         TOKENIZE_REPLY=12, DETOKENIZE=13, DETOKENIZE_REPLY=14, GENERATE=15,
         ACCEPTED=16, PROGRESS=17, TOKEN=18, TOOL_CALL=19, DONE=20, CANCEL=21,
         SHUTDOWN=22, WARM_EXPERTS=23, WARM_EXPERTS_REPLY=24)
STATUS = dict(ok=0, bad_request=1, unsupported_version=2, unknown_type=3,
              too_large=4, busy=5, not_found=6, cancelled=7, unauthorized=8,
              shutting_down=9, not_ready=10)


def field(tag, value):
    if isinstance(value, int):
        value = struct.pack("<I", value)
    elif isinstance(value, str):
        value = value.encode()
    return struct.pack("<HI", tag, len(value)) + value


def ids_field(tag, ids):
    """An IDS field: u32 little-endian ids."""
    return field(tag, b"".join(struct.pack("<I", i) for i in ids))


def unpack_ids(b):
    return [struct.unpack_from("<I", b, i)[0] for i in range(0, len(b), 4)]


def frame(mtype, rid=1, payload=b"", version=1, flags=0, reserved=0, length=None):
    if length is None:
        length = len(payload)
    return HEADER.pack(MAGIC, version, mtype, flags, reserved, rid, length) + payload


def hello(rid=1, version=1):
    return frame(T["HELLO"], rid, field(1, "test/1") + field(2, version))


def parse_fields(payload):
    out, pos = {}, 0
    while pos < len(payload):
        tag, n = struct.unpack_from("<HI", payload, pos)
        pos += 6
        out.setdefault(tag, []).append(payload[pos:pos + n])
        pos += n
    return out


def read_frame(sock, timeout=5.0):
    """Returns (type, request_id, fields) or None when the peer closed."""
    sock.settimeout(timeout)
    buf = b""
    while len(buf) < HEADER.size:
        chunk = sock.recv(HEADER.size - len(buf))
        if not chunk:
            return None
        buf += chunk
    magic, ver, mtype, flags, res, rid, length = HEADER.unpack(buf)
    assert magic == MAGIC, hex(magic)
    body = b""
    while len(body) < length:
        chunk = sock.recv(length - len(body))
        if not chunk:
            return None
        body += chunk
    return mtype, rid, parse_fields(body)


def u32(fields, tag):
    return struct.unpack("<I", fields[tag][0])[0]


def u64(fields, tag):
    """A U64 field's value, None when absent."""
    return struct.unpack("<Q", fields[tag][0])[0] if tag in fields else None


def f64(fields, tag):
    """An F64 field's value, None when absent."""
    return struct.unpack("<d", fields[tag][0])[0] if tag in fields else None


def trace_routes(path):
    """--router-trace records in order, without the request id (it differs
    per run): (position, layer, ids, weight bits)."""
    recs = []
    with open(path) as fh:
        for line in fh:
            r = json.loads(line)
            recs.append((r["position"], r["layer"], tuple(r["ids"]), tuple(r["weights"])))
    return recs


def direct_ok(path):
    """True when the file system holding path serves an aligned O_DIRECT read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError:
        return False
    try:
        buf = mmap.mmap(-1, 4096)
        os.preadv(fd, [buf], 0)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def connect(path, do_hello=True):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    if do_hello:
        s.sendall(hello())
        t, rid, f = read_frame(s)
        assert t == T["HELLO_OK"], t
    return s


def generate_payload(prompt=None, ids=None, messages=None, max_new=None, stop=(), stop_ids=None,
                     draft=None):
    """A GENERATE payload: kind (1) chat when messages (a list, sent as
    JSON in 4) is given, else raw with a prompt string (2) and/or ids (3);
    then max_new (8), each stop string (9), stop ids (10), the draft
    policy (13). Absent arguments leave their fields out."""
    p = field(1, 1 if messages is not None else 0)
    if prompt is not None:
        p += field(2, prompt)
    if messages is not None:
        p += field(4, json.dumps(messages))
    if ids is not None:
        p += ids_field(3, ids)
    if max_new is not None:
        p += field(8, max_new)
    for s in stop:
        p += field(9, s)
    if stop_ids:
        p += ids_field(10, stop_ids)
    if draft is not None:
        p += field(13, draft)
    return p


def generate_ids(sock_path, ids, max_new):
    """Returns (generated ids, DONE fields) of one raw-ids GENERATE."""
    names = {v: k for k, v in T.items()}
    s = connect(sock_path)
    s.sendall(frame(T["GENERATE"], 9, generate_payload(ids=ids, max_new=max_new)))
    out, done = [], None
    while done is None:
        r = read_frame(s, 120)
        if r is None:
            raise EOFError("connection closed")
        t, rid, f = r
        name = names.get(t)
        if name == "TOKEN":
            out += unpack_ids(f[1][0])
        elif name == "DONE":
            done = f
        elif name == "ERROR":
            raise RuntimeError("k3d error: " + f[2][0].decode())
    s.close()
    return out, done


def terminate(proc, timeout=10):
    """SIGTERM, then SIGKILL after timeout seconds; waits for the exit."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


class Daemon:
    """Starts the real k3d in a private temporary directory."""

    def __init__(self, k3d, *args, sockdir_mode=0o700, model=None):
        self.dir = tempfile.mkdtemp(prefix="k3d-test-")
        os.chmod(self.dir, sockdir_mode)
        self.sock = os.path.join(self.dir, "k3d.sock")
        self.log = os.path.join(self.dir, "k3d.log")
        # One compute thread: these tests check behaviour, and a 2-core CI
        # machine running several suites at once starves a spinning pool.
        model_args = ["--model", model or os.environ["K3_TEST_MODEL"], "--threads", "1"]
        # The suites test the one-seat scheduler (BUSY with --queue 0, queue
        # positions) unless they ask for seats (test_parallel.py does).
        if "--parallel" not in args:
            model_args += ["--parallel", "1"]
        self.proc = subprocess.Popen([k3d, "--socket", self.sock, "--log-level", "debug",
                                      *model_args, *args],
                                     stderr=open(self.log, "w"), stdin=subprocess.DEVNULL)
        deadline = time.time() + 30
        while "ready:" not in self.log_text():
            if self.proc.poll() is not None or time.time() > deadline:
                raise RuntimeError("k3d did not start: " + self.log_text())
            time.sleep(0.02)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        """`with Daemon(...) as d:` stops it however the block ends."""
        self.stop()

    def log_text(self):
        with open(self.log) as f:
            return f.read()

    def fds(self):
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def rss_kb(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def stop(self):
        terminate(self.proc)
        if os.path.exists(self.log):
            self.final_log = self.log_text()
        shutil.rmtree(self.dir, ignore_errors=True)
        return self.proc.returncode

    def sanitizer_reports(self):
        """ASan/UBSan/LSan lines in the log of a stopped daemon (the ASan
        build's tests fail on them; UBSan alone would only print)."""
        return [line for line in getattr(self, "final_log", "").splitlines()
                if "runtime error:" in line or "Sanitizer" in line]


def make_model(k3ctl, preset="nano"):
    """Writes a demo model into a fresh temporary directory (k3ctl demo-model)."""
    d = tempfile.mkdtemp(prefix="k3-model-")
    path = os.path.join(d, preset)
    subprocess.run([k3ctl, "demo-model", "--out", path, "--preset", preset], check=True,
                   capture_output=True)
    return path

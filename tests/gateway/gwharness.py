"""gwharness.py - starts fake_k3d.py and k3-gateway for the conformance
tests, and small raw-HTTP helpers (the SDKs hide the bytes)."""
import http.client
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
GW_BIN = os.environ.get("K3_GATEWAY_BIN", "")


class Fake:
    """One fake k3d on a Unix socket."""

    def __init__(self, sock, log, *args):
        self.sock, self.log_path, self.args = sock, log, args
        self.p = None

    def start(self):
        if os.path.exists(self.sock):
            os.unlink(self.sock)
        self.p = subprocess.Popen([sys.executable, os.path.join(HERE, "fake_k3d.py"), "--socket", self.sock,
                                   "--log", self.log_path, *self.args],
                                  stderr=subprocess.PIPE, text=True)
        line = self.p.stderr.readline()
        assert "ready" in line, line
        return self

    def stop(self):
        if self.p:
            self.p.send_signal(signal.SIGINT)
            try:
                self.p.wait(5)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
            self.p = None

    def events(self, ev=None):
        out = []
        with open(self.log_path, encoding="utf-8") as f:
            for line in f:
                if not line.endswith("\n"):
                    break          # the fake is still writing it (a long GENERATE)
                e = json.loads(line)
                if ev is None or e["ev"] == ev:
                    out.append(e)
        return out

    def clear(self):
        open(self.log_path, "w").close()


class Stack:
    """fake k3d + k3-gateway; use as a context manager."""

    def __init__(self, fake_args=(), gw_args=(), start_fake=True, sock=None, quiet=True):
        self.dir = tempfile.mkdtemp(prefix="k3gw-")
        self.sock = sock or os.path.join(self.dir, "k3d.sock")
        self.fake = Fake(self.sock, os.path.join(self.dir, "fake.jsonl"), *fake_args)
        self.gw_args = list(gw_args)
        self.start_fake = start_fake
        self.quiet = quiet
        self.gw = None

    def __enter__(self):
        if self.start_fake:
            self.fake.start()
        else:
            open(self.fake.log_path, "w").close()
        assert GW_BIN, "K3_GATEWAY_BIN is not set"
        self.gw = subprocess.Popen([GW_BIN, "--listen", "127.0.0.1:0", "--socket", self.sock,
                                    *(["--quiet"] if self.quiet else []), *self.gw_args],
                                   stderr=subprocess.PIPE, text=True)
        line = self.gw.stderr.readline()
        assert "listening on http://" in line, line
        self.port = int(line.split("listening on http://")[1].split(",")[0].rsplit(":", 1)[1])
        self.base = "http://127.0.0.1:%d" % self.port
        return self

    def __exit__(self, *exc):
        self.gw.send_signal(signal.SIGTERM)
        try:
            rc = self.gw.wait(10)
        except subprocess.TimeoutExpired:
            self.gw.kill()
            rc = "hung"
        err = self.gw.stderr.read()
        self.fake.stop()
        # Sanitizer reports (ASan build) make the exit status non-zero.
        if exc[0] is None:
            assert rc == 0, "k3-gateway exited %r: %s" % (rc, err[-4000:])

    def log_line(self, pred, timeout=10):
        """The next line of the gateway's stderr (its access log, with
        quiet=False) for which pred(line) is true. Reads the pipe's fd
        directly: a text-mode readline could hold lines select cannot see."""
        fd = self.gw.stderr.fileno()
        if not hasattr(self, "_errbuf"):
            self._errbuf = b""
        end = time.time() + timeout
        while True:
            while b"\n" in self._errbuf:
                line, self._errbuf = self._errbuf.split(b"\n", 1)
                if pred(line.decode()):
                    return line.decode()
            left = end - time.time()
            assert left > 0, "no such log line within %s s" % timeout
            r, _, _ = select.select([fd], [], [], min(left, 0.2))
            if r:
                chunk = os.read(fd, 65536)
                assert chunk, "k3-gateway closed its stderr"
                self._errbuf += chunk

    def client(self, **kw):
        import openai
        if not kw:
            # one pooled client per stack: building one costs more than a request
            if not hasattr(self, "_client"):
                self._client = self.client(max_retries=0)
            return self._client
        kw.setdefault("max_retries", 0)
        kw.setdefault("timeout", 20)
        return openai.OpenAI(base_url=self.base + "/v1", api_key=kw.pop("api_key", "sk-dummy"), **kw)

    def raw(self, method, path, body=None, headers=None, timeout=20):
        """One request on a fresh connection: (status, headers dict, body bytes)."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        h = {k: v for k, v in h.items() if v is not None}
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        data = r.read()
        hd = {k.lower(): v for k, v in r.getheaders()}
        c.close()
        return r.status, hd, data


def fake_msg(script):
    """A user message that scripts the fake daemon."""
    return [{"role": "user", "content": "#fake " + json.dumps(script)}]


def sse_events(body):
    """Splits an SSE body into events; asserts the framing is exact."""
    text = body.decode("utf-8")
    assert text.endswith("\n\n"), repr(text[-50:])
    events = text[:-2].split("\n\n")
    for e in events:
        assert "\n" not in e, "multi-line event %r" % e
        assert e.startswith("data: ") or e.startswith(": "), "bad line %r" % e
    return events


def raw_stream_socket(port, body):
    """Sends a streaming POST on a plain socket and returns it (for reading
    slowly or closing abruptly)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    data = json.dumps(body).encode()
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(data) + data)
    return s


def read_until(s, marker, timeout=10):
    buf = b""
    end = time.time() + timeout
    while marker not in buf and time.time() < end:
        r, _, _ = select.select([s], [], [], 0.2)
        if r:
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
    return buf

#!/usr/bin/env python3
"""k3serve.py - a small HTTPS file server with fault injection, test tooling
for tests/setup (never part of the product). Listens on 127.0.0.1 only.

  k3serve.py --root DIR --cert PEM --key PEM --log FILE [--faults FILE]
             [--rate BYTES_PER_S] [--token T] [--page N]

Serves DIR's files at /repo/NAME and /cdn/NAME (the same bytes: /cdn is the
"CDN" a redirect may lead to), byte ranges included, and a Hugging Face
style tree listing at /api/tree (paginated by --page with Link rel="next").
With --token, /repo and /api need "Authorization: Bearer T" (/cdn never).
Prints "PORT n" on stdout once listening. Every request is appended to
--log as one JSON line: path, range, status, bytes (body bytes sent), auth
(whether an Authorization header came), fault.

--faults names a JSON file re-read on every request:
  {"NAME": [fault, fault, ...], ...}
the i-th request for NAME gets the i-th fault (none after the list ends;
a fault with "repeat": true stays). Faults:
  {"type": "cut", "after": N}        close the connection after N body bytes
  {"type": "stall", "after": N, "seconds": S}  send N bytes, then go silent
  {"type": "flip", "at": OFFSET}     flip the byte at absolute OFFSET
  {"type": "flip_each", "skip": N}   flip the byte N bytes into every response body
  {"type": "status", "code": 503, "retry_after": S}
  {"type": "redirect", "location": URL}
  {"type": "length", "value": N}     announce and send N bytes as the whole file
  {"type": "ignore_range"}           answer a range request with the whole file
"""
import argparse
import hashlib
import http.server
import json
import os
import socket
import socketserver
import ssl
import sys
import threading
import time
import urllib.parse

LOCK = threading.Lock()
COUNTS = {}
SHA = {}


def sha256(path):
    with LOCK:
        if path in SHA:
            return SHA[path]
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    with LOCK:
        SHA[path] = h.hexdigest()
    return SHA[path]


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "k3serve"

    def log_message(self, fmt, *args):
        pass

    def record(self, status, sent, fault=None):
        entry = {"path": self.path, "range": self.headers.get("Range"), "status": status,
                 "bytes": sent, "auth": self.headers.get("Authorization") is not None,
                 "fault": fault}
        with LOCK:
            with open(self.server.opts.log, "a") as f:
                f.write(json.dumps(entry) + "\n")

    def fault_for(self, name):
        opts = self.server.opts
        if not opts.faults or not os.path.exists(opts.faults):
            return None
        with open(opts.faults) as f:
            faults = json.load(f)
        lst = faults.get(name) or []
        with LOCK:
            i = COUNTS.get(name, 0)
            COUNTS[name] = i + 1
        if i < len(lst):
            return lst[i]
        if lst and lst[-1].get("repeat"):
            return lst[-1]
        return None

    def reply(self, code, body=b"", headers=()):
        self.send_response(code)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.record(code, len(body))

    def authorized(self):
        tok = self.server.opts.token
        return not tok or self.headers.get("Authorization") == "Bearer " + tok

    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        parts = url.path.split("/")
        if url.path.startswith("/api/tree"):
            return self.listing(url)
        if len(parts) != 3 or parts[1] not in ("repo", "cdn"):
            return self.reply(404, b"not found\n")
        if parts[1] == "repo" and not self.authorized():
            return self.reply(401, b"token required\n")
        name = parts[2]
        path = os.path.join(self.server.opts.root, name)
        if "/" in name or name.startswith(".") or not os.path.isfile(path):
            return self.reply(404, b"not found\n")
        fault = self.fault_for(name) if parts[1] == "repo" else None
        kind = fault["type"] if fault else None
        if kind == "status":
            hdrs = [("Retry-After", str(fault.get("retry_after", 0)))]
            body = b"try later\n"
            self.send_response(fault["code"])
            for k, v in hdrs:
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return self.record(fault["code"], len(body), kind)
        if kind == "redirect":
            self.send_response(302)
            self.send_header("Location", fault["location"])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return self.record(302, 0, kind)
        size = os.path.getsize(path)
        start, end = 0, size - 1
        rng = self.headers.get("Range")
        partial = False
        if rng and kind != "ignore_range":
            spec = rng.split("=", 1)[1]
            a, b = spec.split("-", 1)
            start = int(a)
            end = int(b) if b else size - 1
            if start >= size or end < start:
                self.send_response(416)
                self.send_header("Content-Range", "bytes */%d" % size)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return self.record(416, 0, kind)
            end = min(end, size - 1)
            partial = True
        total = size
        if kind == "length":
            total = fault["value"]
            start, end, partial = 0, total - 1, False
        self.send_response(206 if partial else 200)
        if partial:
            self.send_header("Content-Range", "bytes %d-%d/%d" % (start, end, size))
        self.send_header("Content-Length", str(end - start + 1))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        sent = 0
        limit = end - start + 1
        if kind in ("cut", "stall"):
            limit = min(limit, fault["after"])
        rate = self.server.opts.rate
        piece = 65536 if rate else 1 << 20
        try:
            with open(path, "rb") as f:
                f.seek(start)
                while sent < limit:
                    buf = bytearray(f.read(min(piece, limit - sent)))
                    if not buf:
                        break
                    if kind == "flip" and start + sent <= fault["at"] < start + sent + len(buf):
                        buf[fault["at"] - start - sent] ^= 0x01
                    skip = fault.get("skip", 0) if kind == "flip_each" else -1
                    if sent <= skip < sent + len(buf):
                        buf[skip - sent] ^= 0x01
                    self.wfile.write(buf)
                    sent += len(buf)
                    if rate:
                        time.sleep(len(buf) / rate)
            self.wfile.flush()
            if kind == "stall":
                # logged now: the client gives up long before the sleep ends
                self.record(206 if partial else 200, sent, kind)
                time.sleep(fault.get("seconds", 30))
            if kind in ("cut", "stall"):
                self.close_connection = True
                try:
                    self.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError, OSError):
            pass
        if kind != "stall":
            self.record(206 if partial else 200, sent, kind)

    def listing(self, url):
        if not self.authorized():
            return self.reply(401, b"token required\n")
        root = self.server.opts.root
        names = sorted(n for n in os.listdir(root) if os.path.isfile(os.path.join(root, n))
                       and not n.startswith("."))
        q = urllib.parse.parse_qs(url.query)
        first = int(q.get("cursor", ["0"])[0])
        page = self.server.opts.page or len(names) or 1
        entries = []
        for n in names[first:first + page]:
            p = os.path.join(root, n)
            e = {"type": "file", "oid": "0" * 40, "size": os.path.getsize(p), "path": n}
            if not n.endswith(".json"):
                e["lfs"] = {"oid": sha256(p), "size": os.path.getsize(p), "pointerSize": 134}
            entries.append(e)
        body = json.dumps(entries).encode()
        hdrs = [("Content-Type", "application/json")]
        if first + page < len(names):
            nxt = "https://127.0.0.1:%d/api/tree?cursor=%d" % (self.server.server_address[1],
                                                               first + page)
            hdrs.append(("Link", '<%s>; rel="next"' % nxt))
        self.reply(200, body, hdrs)


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("--cert", required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--faults")
    ap.add_argument("--rate", type=float, default=0)
    ap.add_argument("--token")
    ap.add_argument("--page", type=int, default=0)
    ap.add_argument("--port", type=int, default=0)
    opts = ap.parse_args()
    srv = Server(("127.0.0.1", opts.port), Handler)
    srv.opts = opts
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(opts.cert, opts.key)
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    print("PORT %d" % srv.server_address[1], flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    sys.exit(main())

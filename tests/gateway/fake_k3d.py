#!/usr/bin/env python3
"""fake_k3d.py - a scripted stand-in for k3d that speaks the real k3
protocol (frame layout and message schema parsed from proto/k3_proto.h, so
the two cannot drift) on a Unix socket. It exists so the gateway's
conformance tests are deterministic and need no model.

It follows the conversation rules of docs/protocol.md the way k3d does:
HELLO first, ACCEPTED or ERROR{BUSY} for a GENERATE, PROGRESS, TOKEN events
whose text is complete UTF-8 with stop strings never partially emitted
(stop strings apply to the answer channel only), TOOL_CALL events, exactly
one DONE, CANCEL -> DONE{CANCELLED} + OK, a closed connection cancels its
jobs. One engine slot (--slots) and a FIFO queue (--queue).

What a generation produces is scripted by the request itself: when the
last user message (chat) or the prompt (raw) starts with "#fake ", the rest
is a JSON object:
  tokens   list; each item is one token:
             "text"              answer-channel token (its UTF-8 bytes)
             {"r": "text"}       reasoning-channel token
             {"hex": "f09f"}     answer token of raw bytes (may split UTF-8;
                                 invalid bytes become U+FFFD, as in k3d)
             {"rhex": "..."}     reasoning token of raw bytes
             {"unchecked_hex": "80"}  a TOKEN whose text is these bytes as
                                 they are, valid UTF-8 or not (a broken k3d)
             {"tool": {"index":0,"id":"call_1","name":"f","arguments":"{"}}
             {"sleep": 2.5}      silence (no token)
             {"error": "msg"}    ERROR{INTERNAL} mid-stream (terminal)
             {"error": "msg", "status": "SHUTTING_DOWN"}
                                 the same with that status; first in the
                                 list it is a job dropped after ACCEPTED, as
                                 a draining k3d drops its queued jobs
             {"crash": true}     close the connection abruptly
             {"cancelled": 3}    DONE{CANCELLED} with that cancel_reason
                                 (2 'k3ctl cancel', 3 k3d stopping; terminal)
  delay    seconds between tokens (default 0)
  prefill  seconds of "prefill" after ACCEPTED, with PROGRESS frames
  finish   "stop" (default) | "tool_calls"
  reject   {"status": "CONTEXT_EXCEEDED", "message": "...", "param": "..."}
  prompt_tokens, cached_tokens   numbers for DONE (defaults derived)
Anything else gets the default script: "Hello" " from" " fake" " k3d" "."

--status-hang: STATUS is read and never answered (a stuck daemon that still
accepts connections and answers HELLO).
--status-text TEXT: STATUS_REPLY carries it as status_text (as k3d says
"ready; streaming experts: ..." during a streaming install).
--refuse-hello: HELLO gets ERROR{UNAUTHORIZED} and the connection closes
(k3d refusing a uid outside its allow list).
--hello-hang: HELLO is read and never answered (a daemon stuck before the
handshake that still accepts connections).

Every GENERATE, CANCEL, DONE and closed connection is appended to --log
as one JSON line, so tests can check what the gateway sent and whether it
cancelled.
"""
import argparse
import asyncio
import codecs
import json
import os
import re
import struct
import sys
import time

MAGIC = 0x5033334B
VERSION = 1
HDR = struct.Struct("<IHHHHII")

STATUS = {
    "OK": 0, "BAD_REQUEST": 1, "UNSUPPORTED_VERSION": 2, "UNKNOWN_TYPE": 3, "TOO_LARGE": 4,
    "BUSY": 5, "NOT_FOUND": 6, "CANCELLED": 7, "UNAUTHORIZED": 8, "SHUTTING_DOWN": 9,
    "NOT_READY": 10, "CONTEXT_EXCEEDED": 11, "INVALID_ARGUMENT": 12, "UNSUPPORTED": 13,
    "INTERNAL": 14,
}
FINISH = {"stop": 0, "length": 1, "cancelled": 2, "error": 3, "tool_calls": 4}
STATE = {"loading": 0, "ready": 1, "draining": 2, "no_model": 3}


def load_schema(header_path):
    """Parses K3_PROTO_FIELDS_* and K3_PROTO_MESSAGES out of k3_proto.h."""
    src = open(header_path, encoding="utf-8").read().replace("\\\n", " ")
    bodies = {m.group(1): m.group(2) for m in
              re.finditer(r"#define K3_PROTO_FIELDS_(\w+)\(F, m\)([^\n]*)", src)}

    def rows_of(name):
        # a list may include another's rows (K3_PROTO_FIELDS_DRIVES_(F, m))
        body = re.sub(r"K3_PROTO_FIELDS_(\w+)\(F, m\)", lambda r: rows_of(r.group(1)), bodies[name])
        return body

    fields = {}
    for name in bodies:
        rows = re.findall(r"F\(m, (\d+), (\w+), (\w+), [^,]+, ([01])\)", rows_of(name))
        fields[name] = {field: (int(tag), kind) for tag, kind, field, _ in rows}
    msgs = {}
    mm = re.search(r"#define K3_PROTO_MESSAGES\(M\)([^\n]*)", src)
    for tid, name in re.findall(r"M\((\d+), (\w+), \w+, \w+\)", mm.group(1)):
        msgs[name] = int(tid)
    return fields, msgs


class Proto:
    def __init__(self, header_path):
        self.fields, self.types = load_schema(header_path)
        self.names = {v: k for k, v in self.types.items()}

    def encode(self, msg, rid, **vals):
        out = bytearray()
        for key, val in vals.items():
            if val is None:
                continue
            tag, kind = self.fields[msg][key]
            vs = val if kind == "STRV" else [val]
            for v in vs:
                if kind == "U32":
                    b = struct.pack("<I", v)
                elif kind == "U64":
                    b = struct.pack("<Q", v)
                elif kind == "F64":
                    b = struct.pack("<d", v)
                elif kind == "BOOL":
                    b = bytes([1 if v else 0])
                elif kind in ("STR", "BYTES", "STRV"):
                    b = v.encode() if isinstance(v, str) else bytes(v)
                elif kind == "IDS":
                    b = b"".join(struct.pack("<I", x) for x in v)
                elif kind == "U64S":
                    b = b"".join(struct.pack("<Q", x) for x in v)
                out += struct.pack("<HI", tag, len(b)) + b
        return HDR.pack(MAGIC, VERSION, self.types[msg], 0, 0, rid, len(out)) + bytes(out)

    def decode(self, type_id, payload):
        name = self.names.get(type_id)
        if name is None:
            raise ValueError("unknown type %d" % type_id)
        bytag = {tag: (key, kind) for key, (tag, kind) in self.fields[name].items()}
        body, off = {}, 0
        while off < len(payload):
            tag, ln = struct.unpack_from("<HI", payload, off)
            off += 6
            v = payload[off:off + ln]
            off += ln
            key, kind = bytag[tag]
            if kind == "U32":
                body[key] = struct.unpack("<I", v)[0]
            elif kind == "U64":
                body[key] = struct.unpack("<Q", v)[0]
            elif kind == "F64":
                body[key] = struct.unpack("<d", v)[0]
            elif kind == "BOOL":
                body[key] = bool(v[0])
            elif kind == "STR":
                body[key] = v.decode()
            elif kind == "STRV":
                body.setdefault(key, []).append(v.decode())
            elif kind == "IDS":
                body[key] = list(struct.unpack("<%dI" % (len(v) // 4), v))
            else:
                body[key] = bytes(v)
        return name, body


class Utf8Joiner:
    """Bytes in, complete UTF-8 text out, as k3d's detokenizer does
    (daemon/text/text_detok.c): a character split across tokens waits for
    its last byte; bytes that can never form one (a lone continuation byte)
    become U+FFFD, one per maximal invalid subpart."""

    def __init__(self):
        self.dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, b):
        return self.dec.decode(b)


class StopFilter:
    """Holds back any tail that could still become a stop string."""

    def __init__(self, stops):
        self.stops = [s for s in stops if s]
        self.pending = ""

    def feed(self, text):
        """Returns (text to emit now, matched stop or None)."""
        self.pending += text
        best = None
        for s in self.stops:
            i = self.pending.find(s)
            if i >= 0 and (best is None or i < best[0]):
                best = (i, s)
        if best:
            out, self.pending = self.pending[:best[0]], ""
            return out, best[1]
        hold = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(self.pending)), 0, -1):
                if self.pending.endswith(s[:k]):
                    hold = max(hold, k)
                    break
        out = self.pending[:len(self.pending) - hold]
        self.pending = self.pending[len(self.pending) - hold:]
        return out, None

    def flush(self):
        out, self.pending = self.pending, ""
        return out


DEFAULT_SCRIPT = {"tokens": ["Hello", " from", " fake", " k3d", "."]}


def script_of(gen):
    text = None
    if gen.get("mode", 0) == 1:
        try:
            msgs = json.loads(gen.get("messages", "[]"))
        except ValueError:
            msgs = []
        for m in msgs:
            if m.get("role") == "user":
                c = m.get("content")
                if isinstance(c, list):
                    c = "".join(p.get("text", "") for p in c)
                text = c
    else:
        text = gen.get("prompt", "")
    if isinstance(text, str) and text.startswith("#fake "):
        return json.loads(text[6:])
    return DEFAULT_SCRIPT


class Job:
    def __init__(self, conn, rid, gen):
        self.conn, self.rid, self.gen = conn, rid, gen
        self.go = asyncio.Event()
        self.cancelled = False
        self.task = None
        self.job_id = 0


class Daemon:
    def __init__(self, args):
        self.args = args
        self.proto = Proto(args.header)
        self.running = []
        self.queue = []
        self.next_job = 1
        self.next_conn = 1
        self.conns = 0
        self.started = time.time()
        self.log_f = open(args.log, "a", encoding="utf-8") if args.log else None
        self.totals = {"requests": 0, "prompt": 0, "completion": 0}

    def log(self, **ev):
        if self.log_f:
            ev["t"] = time.time()
            self.log_f.write(json.dumps(ev) + "\n")
            self.log_f.flush()

    def send(self, conn, msg, rid, **vals):
        if conn["closed"]:
            return
        conn["w"].write(self.proto.encode(msg, rid, **vals))

    # ---- scheduling ----
    def release(self, job):
        if job in self.running:
            self.running.remove(job)
        if job in self.queue:
            self.queue.remove(job)
            self.update_queue()
        while len(self.running) < self.args.slots and self.queue:
            nxt = self.queue.pop(0)
            self.running.append(nxt)
            nxt.go.set()
            self.update_queue()

    def update_queue(self):
        for i, j in enumerate(self.queue):
            self.send(j.conn, "ACCEPTED", j.rid, job_id=j.job_id, queue_position=i + 1)

    async def run_job(self, job):
        conn, rid, gen = job.conn, job.rid, job.gen
        try:
            await self._run_job(job)
        except asyncio.CancelledError:
            pass
        except Exception:  # a bug in a script or here: say so, end the job
            import traceback
            traceback.print_exc()
            self.send(conn, "ERROR", rid, status=STATUS["INTERNAL"], message="fake_k3d crashed")
        finally:
            self.release(job)
            conn["jobs"].pop(rid, None)
            if job.cancelled and not conn["closed"]:
                self.log(ev="done", conn=conn["id"], job=job.job_id, finish="cancelled",
                         completion=job.completion)
                self.send(conn, "DONE", rid, finish=FINISH["cancelled"],
                          prompt_tokens=job.prompt_tokens, completion_tokens=job.completion)
            try:
                await conn["w"].drain()
            except (ConnectionError, OSError):
                pass

    async def _run_job(self, job):
        conn, rid, gen = job.conn, job.rid, job.gen
        sc = job.script
        await job.go.wait()
        if job.cancelled:
            return
        if sc.get("prefill"):
            total = job.prompt_tokens
            steps = max(1, int(sc["prefill"] / 0.5))
            for i in range(steps):
                self.send(conn, "PROGRESS", rid, done=total * i // steps, total=total)
                await asyncio.sleep(sc["prefill"] / steps)
        thinking = gen.get("thinking", True)
        max_new = gen.get("max_new")
        stopf = StopFilter(gen.get("stop", []))
        joiners = {0: Utf8Joiner(), 1: Utf8Joiner()}
        reasoning = 0
        finish = sc.get("finish", "stop")
        matched = None
        delay = sc.get("delay", 0)
        for item in sc.get("tokens", []):
            if isinstance(item, dict) and "sleep" in item:
                await asyncio.sleep(item["sleep"])
                continue
            if isinstance(item, dict) and "error" in item:
                self.send(conn, "ERROR", rid, status=STATUS[item.get("status", "INTERNAL")],
                          message=item["error"])
                self.log(ev="error", conn=conn["id"], message=item["error"])
                return
            if isinstance(item, dict) and "cancelled" in item:
                self.log(ev="done", conn=conn["id"], job=job.job_id, finish="cancelled",
                         completion=job.completion)
                self.send(conn, "DONE", rid, finish=FINISH["cancelled"], prompt_tokens=job.prompt_tokens,
                          completion_tokens=job.completion, cancel_reason=item["cancelled"])
                return
            if isinstance(item, dict) and item.get("crash"):
                self.log(ev="crash", conn=conn["id"])
                conn["w"].transport.abort()
                return
            if max_new is not None and job.completion >= max_new:
                finish = "length"
                break
            if delay:
                await asyncio.sleep(delay)
            if job.cancelled:
                return
            if isinstance(item, dict) and "unchecked_hex" in item:
                self.send(conn, "TOKEN", rid, ids=[1000 + job.completion], channel=0,
                          text=bytes.fromhex(item["unchecked_hex"]))
                job.completion += 1
                continue
            if isinstance(item, dict) and "tool" in item:
                t = item["tool"]
                self.send(conn, "TOOL_CALL", rid, index=t.get("index", 0), id=t.get("id"),
                          name=t.get("name"), arguments=t.get("arguments"))
                job.completion += 1
                continue
            if isinstance(item, str):
                ch, raw = 0, item.encode()
            elif "hex" in item:
                ch, raw = 0, bytes.fromhex(item["hex"])
            elif "r" in item:
                ch, raw = 1, item["r"].encode()
            else:
                ch, raw = 1, bytes.fromhex(item["rhex"])
            if ch == 1 and not thinking:
                continue
            job.completion += 1
            if ch == 1:
                reasoning += 1
            text = joiners[ch].feed(raw)
            if ch == 0:
                text, matched = stopf.feed(text)
            if text:
                self.send(conn, "TOKEN", rid, ids=[1000 + job.completion], text=text, channel=ch)
            else:
                self.send(conn, "TOKEN", rid, ids=[1000 + job.completion], channel=ch)
            await conn["w"].drain()
            if matched:
                finish = "stop"
                break
        if not matched:
            rest = stopf.flush()
            if rest:
                self.send(conn, "TOKEN", rid, ids=[], text=rest, channel=0)
        pt = job.prompt_tokens
        # Log first: a test may read the log as soon as its client sees DONE.
        self.totals["completion"] += job.completion
        self.log(ev="done", conn=conn["id"], job=job.job_id, finish=finish, completion=job.completion)
        self.send(conn, "DONE", rid, finish=FINISH[finish], prompt_tokens=pt,
                  completion_tokens=job.completion, reasoning_tokens=reasoning,
                  cached_tokens=sc.get("cached_tokens", 0), prefill_s=0.01, decode_s=0.02,
                  stop_matched=matched, expert_bytes_read=1000, spine_bytes_read=5000)

    def generate(self, conn, rid, gen):
        self.log(ev="generate", conn=conn["id"], rid=rid, fields={
            k: (json.loads(v) if k in ("messages", "tools", "tool_choice", "response_format") else v)
            for k, v in gen.items()})
        if self.args.state == "draining":   # what k3d answers (daemon/server/sched.c)
            self.send(conn, "ERROR", rid, status=STATUS["SHUTTING_DOWN"], message="k3d is shutting down")
            return
        if self.args.state != "ready":
            self.send(conn, "ERROR", rid, status=STATUS["NOT_READY"], message="model is loading")
            return
        try:
            sc = script_of(gen)
        except ValueError as e:
            self.send(conn, "ERROR", rid, status=STATUS["BAD_REQUEST"], message="bad #fake script: %s" % e)
            return
        if sc.get("reject"):
            rj = sc["reject"]
            self.send(conn, "ERROR", rid, status=STATUS[rj.get("status", "INVALID_ARGUMENT")],
                      message=rj.get("message", "rejected"), param=rj.get("param"))
            return
        if len(self.running) >= self.args.slots and len(self.queue) >= self.args.queue:
            self.send(conn, "ERROR", rid, status=STATUS["BUSY"], message="slot and queue are full")
            self.log(ev="busy", conn=conn["id"])
            return
        job = Job(conn, rid, gen)
        job.script = sc
        job.completion = 0
        job.prompt_tokens = sc.get("prompt_tokens", 1 + len(gen.get("messages", gen.get("prompt", ""))) // 4)
        job.job_id = self.next_job
        self.next_job += 1
        if len(self.running) < self.args.slots:
            self.running.append(job)
            job.go.set()
            pos = 0
        else:
            self.queue.append(job)
            pos = len(self.queue)
        self.send(conn, "ACCEPTED", rid, job_id=job.job_id, queue_position=pos,
                  prompt_tokens=job.prompt_tokens)
        conn["jobs"][rid] = job
        self.totals["requests"] += 1
        job.task = asyncio.ensure_future(self.run_job(job))

    def cancel(self, conn, rid):
        job = conn["jobs"].get(rid)
        self.log(ev="cancel", conn=conn["id"], rid=rid, matched=bool(job))
        if not job:
            self.send(conn, "ERROR", rid, status=STATUS["NOT_FOUND"], message="no such job")
            return
        job.cancelled = True
        self.release(job)
        job.go.set()
        job.task.cancel()
        self.send(conn, "OK", rid)

    async def serve_conn(self, reader, writer):
        conn = {"id": self.next_conn, "w": writer, "jobs": {}, "closed": False}
        self.next_conn += 1
        self.conns += 1
        hello = False
        try:
            while True:
                hdr = await reader.readexactly(HDR.size)
                magic, ver, typ, flags, res, rid, ln = HDR.unpack(hdr)
                payload = await reader.readexactly(ln)
                if magic != MAGIC or ver != VERSION:
                    self.send(conn, "ERROR", rid, status=STATUS["BAD_REQUEST"], message="bad header")
                    break
                name, body = self.proto.decode(typ, payload)
                if not hello and self.args.hello_hang:
                    self.log(ev="hello_ignored", conn=conn["id"])
                    continue
                if not hello:
                    if name != "HELLO":
                        self.send(conn, "ERROR", rid, status=STATUS["BAD_REQUEST"], message="HELLO first")
                        break
                    if self.args.refuse_hello:
                        # what k3d does for a uid outside its allow list
                        self.send(conn, "ERROR", rid, status=STATUS["UNAUTHORIZED"],
                                  message="peer uid is not allowed by this k3d")
                        break
                    hello = True
                    self.send(conn, "HELLO_OK", rid, server="fake-k3d", version=VERSION, caps=7,
                              model=self.args.model if self.args.state != "no_model" else None,
                              state=STATE[self.args.state])
                elif name == "PING":
                    self.send(conn, "PONG", rid, state=STATE[self.args.state])
                elif name == "STATUS" and self.args.status_hang:
                    self.log(ev="status_ignored", conn=conn["id"])
                elif name == "STATUS":
                    self.send(conn, "STATUS_REPLY", rid, version="fake", state=STATE[self.args.state],
                              pid=os.getpid(), uptime_s=time.time() - self.started,
                              connections=self.conns, running=len(self.running), queued=len(self.queue),
                              queue_max=self.args.queue, expert_bytes_read=123456, expert_hits=3,
                              expert_misses=1, prefill_s_total=0.5, decode_s_total=1.5,
                              prefetch_issued=4, prefetch_issued_bytes=40960, prefetch_used=3,
                              prefetch_wasted_bytes=10240, expert_cache_bytes=1048576,
                              io_wait_s_total=0.25, compute_s_total=1.75, positions_total=64,
                              spine_bytes_read=640000, spine_loads=40, spine_memory_bytes=2097152,
                              expert_demand_bytes=100000, prefetch_used_bytes=13216, hedges=5,
                              hedges_won=2, drive_expert_bytes_read=[100000, 23456],
                              drive_hedges=[5, 0], drive_p95_ns=[2500000, 0],
                              parallel=self.args.slots, pass_width=len(self.running),
                              pass_width_mean=1.5, passes_total=42,
                              **({"status_text": self.args.status_text} if self.args.status_text else {}))
                elif name == "GENERATE":
                    self.generate(conn, rid, body)
                elif name == "CANCEL":
                    self.cancel(conn, rid)
                else:
                    self.send(conn, "ERROR", rid, status=STATUS["UNKNOWN_TYPE"], message=name)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        finally:
            conn["closed"] = True
            self.conns -= 1
            for job in list(conn["jobs"].values()):
                job.cancelled = True
                self.release(job)
                job.go.set()
                if job.task:
                    job.task.cancel()
            self.log(ev="closed", conn=conn["id"], jobs=len(conn["jobs"]))
            writer.close()


async def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--socket", required=True)
    ap.add_argument("--log")
    ap.add_argument("--slots", type=int, default=1)
    ap.add_argument("--queue", type=int, default=0)
    ap.add_argument("--state", default="ready", choices=list(STATE))
    ap.add_argument("--model", default="kimi-k3-fake")
    ap.add_argument("--status-hang", action="store_true")
    ap.add_argument("--status-text")
    ap.add_argument("--hello-hang", action="store_true")
    ap.add_argument("--refuse-hello", action="store_true")
    ap.add_argument("--header", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                     "..", "..", "proto", "k3_proto.h"))
    args = ap.parse_args()
    d = Daemon(args)
    if os.path.exists(args.socket):
        os.unlink(args.socket)
    server = await asyncio.start_unix_server(d.serve_conn, path=args.socket)
    print("fake-k3d: ready on %s" % args.socket, file=sys.stderr, flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass

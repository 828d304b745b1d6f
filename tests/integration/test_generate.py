#!/usr/bin/env python3
"""End-to-end generation through the real k3d (issue: GENERATE path,
scheduling, transactional state): golden greedy ids, cancel during prefill
and decode, disconnects that must not publish state, BUSY and queueing,
conversation reuse equal to a fresh run, edge cases, and no fd/memory
growth over 50 requests with random disconnects.

usage: test_generate.py K3D K3CTL SHARED_DIR
"""
import json
import os
import random
import re
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
from k3proto import (T, STATUS, Daemon, connect, field, frame, generate_payload,  # noqa
                     ids_field, make_model, read_frame, u32, unpack_ids)
from k3test import check, report  # noqa
import k3proto  # noqa


def Daemon(k3d, *args, **kw):
    """These tests cancel and queue behind prompts longer than one pass:
    k3d with passes of 64 positions (later arguments still win)."""
    return k3proto.Daemon(k3d, "--prefill-chunk", "64", *args, **kw)


K3D, K3CTL, SHARED = sys.argv[1], sys.argv[2], sys.argv[3]
PUBLISH_DEADLINE_S = 5   # daemon/server/sched.c
NAMES = {v: k for k, v in T.items()}


def raw(prompt=None, ids=None, max_new=None, stop=(), stop_ids=None):
    return generate_payload(prompt=prompt, ids=ids, max_new=max_new, stop=stop, stop_ids=stop_ids)


def chat(messages, max_new=None):
    return generate_payload(messages=messages, max_new=max_new)


class Stream:
    """Collects the events of one GENERATE."""

    def __init__(self, sock, rid, payload):
        self.sock, self.rid = sock, rid
        sock.sendall(frame(T["GENERATE"], rid, payload))
        self.events, self.ids, self.text = [], [], b""
        self.done = self.error = self.accepted = None

    def step(self, timeout=60):
        r = read_frame(self.sock, timeout)
        if r is None:
            raise EOFError("connection closed")
        t, rid, f = r
        name = NAMES.get(t)
        if rid != self.rid and name not in ("OK",):
            return name
        self.events.append(name)
        if name == "ACCEPTED":
            self.accepted = f
        elif name == "TOKEN":
            self.ids += unpack_ids(f[1][0])
            self.text += f.get(2, [b""])[0]
        elif name == "DONE":
            self.done = {k: f[k][0] for k in f}
        elif name == "ERROR":
            self.error = (u32(f, 1), f[2][0].decode())
        return name

    def finish(self, timeout=120):
        while self.done is None and self.error is None:
            self.step(timeout)
        return self

    def finish_reason(self):
        return struct.unpack("<I", self.done[1])[0] if self.done else None

    def done_u32(self, tag):
        return struct.unpack("<I", self.done[tag])[0]


def start_long(sock, rid):
    """A generation that runs until cancelled, once it yields tokens."""
    st = Stream(sock, rid, raw(prompt="long", max_new=100000))
    while st.step() != "TOKEN":
        pass
    return st


def start_long_prefill(sock, rid, n_ids):
    """A generation whose n_ids-position prefill keeps it running on any
    machine, once its prefill has begun."""
    st = Stream(sock, rid, raw(ids=[1 + i % 2000 for i in range(n_ids)], max_new=100000))
    while st.step() != "PROGRESS":
        pass
    return st


def generate(sock_path, payload, rid=1):
    s = connect(sock_path)
    st = Stream(s, rid, payload).finish()
    s.close()
    return st


def test_golden(k3d):
    """Greedy ids from k3d equal the independent reference's continuations."""
    for case in ("k3tiny_a", "k3tiny_b"):
        model = os.path.join(SHARED, "golden", "forward", case, "model")
        if not os.path.isdir(model):
            print("skip golden: no", model)
            continue
        with Daemon(k3d, model=model) as d:
            for p in ("p1", "p8", "p40"):
                g = json.load(open(os.path.join(SHARED, "golden", "forward", case, "golden", p + ".json")))
                want = g["greedy"]["tokens"]
                st = generate(d.sock, raw(ids=g["prompt"], max_new=len(want)))
                check(st.ids == want, f"{case}/{p}: k3d greedy ids {st.ids} == golden {want}")
                check(st.finish_reason() == 1, f"{case}/{p}: finish length")
            # Text requests are refused by name on an ids-only checkpoint.
            st = generate(d.sock, raw(prompt="hello", max_new=1))
            check(st.error and st.error[0] == STATUS["unsupported"] if "unsupported" in STATUS else
                  st.error and st.error[0] == 13, f"text prompt on ids-only model refused: {st.error}")


def test_forward_matches(k3d):
    """k3d's greedy ids equal `k3ctl forward` on the same checkpoint."""
    model = os.path.join(SHARED, "golden", "forward", "k3tiny_b", "model")
    r = subprocess.run([K3CTL, "forward", "--model", model, "--ids", "5,6,7,8", "--steps", "6",
                        "--json"], capture_output=True, text=True)
    if r.returncode == 2 and "unknown command" in r.stderr:
        print("skip: k3ctl forward not built")
        return
    check(r.returncode == 0, f"k3ctl forward ran: {r.stderr[:200]}")
    if r.returncode:
        return
    want = json.loads(r.stdout)["greedy"]["tokens"]
    with Daemon(k3d, model=model) as d:
        st = generate(d.sock, raw(ids=[5, 6, 7, 8], max_new=6))
        check(st.ids == want, f"k3d {st.ids} == k3ctl forward {want}")


def test_edges(d):
    st = generate(d.sock, raw(prompt="The capital of France is", max_new=0))
    check(st.finish_reason() == 1 and st.ids == [] and st.done_u32(3) == 0, "max_new 0: DONE length, no tokens")
    st = generate(d.sock, raw(prompt="", max_new=4))
    check(st.error and st.error[0] == 12 and "empty" in st.error[1], f"empty prompt: {st.error}")
    st = generate(d.sock, raw(prompt="hi", max_new=1 << 20))
    check(st.error and st.error[0] == 11, f"over-long request: context_length_exceeded {st.error}")
    st = generate(d.sock, raw(ids=[1, 2, 10 ** 9], max_new=1))
    check(st.error and st.error[0] == 12, f"id outside the vocabulary: {st.error}")
    st = generate(d.sock, chat([{"role": "user", "content": [{"type": "image_url",
                                                              "image_url": {"url": "x"}}]}], 4))
    check(st.error and st.error[0] == 13, f"image part: unsupported {st.error}")
    st = generate(d.sock, chat("not a list", 4))
    check(st.error is not None, "messages not an array refused")
    # A tool with an empty parameters object renders (was UB: qsort(NULL)).
    st = generate(d.sock, chat([{"role": "user", "content": "hi"}], 1) +
                  field(5, json.dumps([{"type": "function",
                                        "function": {"name": "get", "parameters": {}}}])))
    check(st.finish_reason() is not None, f"tool with empty parameters: {st.error}")
    # Greedy is deterministic: the same request twice gives the same ids.
    a = generate(d.sock, raw(prompt="Once upon a time", max_new=12))
    b = generate(d.sock, raw(prompt="Once upon a time", max_new=12))
    check(a.ids == b.ids and len(a.ids) == 12, "same request, same ids")
    # A stop id ends generation at that id.
    if len(a.ids) > 3:
        c = generate(d.sock, raw(prompt="Once upon a time", max_new=12, stop_ids=[a.ids[3]]))
        # The stop id ends the turn like EOS: counted, not streamed.
        check(c.ids == a.ids[:3] and c.finish_reason() == 0 and c.done_u32(3) == 4,
              f"stop id: {c.ids} vs {a.ids[:3]}")
    # A stop string ends generation, and is not part of the text.
    text = a.text.decode("utf-8", "replace")
    if len(text) > 6:
        stop = text[3:6]
        c = generate(d.sock, raw(prompt="Once upon a time", max_new=12, stop=[stop]))
        check(c.finish_reason() == 0 and stop.encode() not in c.text and
              a.text.startswith(c.text), f"stop string {stop!r}: {c.text!r}")


def test_cancel(d):
    # During prefill: a long prompt, cancel at the first PROGRESS.
    s = connect(d.sock)
    st = Stream(s, 5, raw(ids=list(range(1, 1200)), max_new=4))
    while st.step() != "PROGRESS":
        pass
    job = struct.unpack("<Q", st.accepted[1][0])[0]
    s.sendall(frame(T["CANCEL"], 6, field(1, struct.pack("<Q", job))))
    st.finish()
    check(st.finish_reason() == 2 and st.ids == [], f"cancel during prefill: {st.done}")
    if st.done:
        pre, dec = (struct.unpack("<d", st.done[k])[0] for k in (7, 8))
        check(pre > 0 and dec == 0, f"cancel during prefill: the time is prefill time ({pre}, {dec})")
    check(st.done is not None and st.done_u32(21) == 1,
          "cancelled by its own connection (by job id): DONE cancel_reason 1")
    # During decode: cancel by request id after a few tokens.
    st = Stream(s, 7, raw(prompt="Tell me a story", max_new=100000))
    while len(st.ids) < 3:
        st.step()
    s.sendall(frame(T["CANCEL"], 7))
    st.finish()
    check(st.finish_reason() == 2 and 3 <= len(st.ids) < 100000 and st.done_u32(21) == 1,
          f"cancel during decode: {len(st.ids)} ids, cancel_reason 1")
    # The slot is free again at once.
    st = Stream(s, 8, raw(prompt="next", max_new=2)).finish()
    check(st.finish_reason() == 1, "next request served after cancel")
    s.sendall(frame(T["CANCEL"], 9, field(1, struct.pack("<Q", 999999))))
    r = read_frame(s)
    check(r[0] == T["ERROR"] and u32(r[2], 1) == STATUS["not_found"], "cancel of unknown job: not_found")
    s.close()


def test_busy_and_queue(k3d):
    with Daemon(k3d) as d:   # --queue 0
        a = connect(d.sock)
        sa = start_long(a, 1)
        st = generate(d.sock, raw(prompt="second", max_new=2))
        check(st.error and st.error[0] == STATUS["busy"], f"busy with queue 0: {st.error}")
        # Control requests are answered while the engine is busy decoding.
        c = connect(d.sock)
        c.sendall(frame(T["STATUS"], 3) + frame(T["TOKENIZE"], 4, field(1, "hello world")) +
                  frame(T["MODEL_INFO"], 5))
        got = {}
        for _ in range(3):
            r = read_frame(c, 10)
            got[r[1]] = NAMES[r[0]]
        check(got == {3: "STATUS_REPLY", 4: "TOKENIZE_REPLY", 5: "MODEL_INFO_REPLY"},
              f"control requests answered during decode: {got}")
        c.close()
        # Cancel and ask again at once: queued behind the stopping job,
        # never BUSY for the moment it takes to stop.
        a.sendall(frame(T["CANCEL"], 1) + frame(T["GENERATE"], 2, raw(prompt="again", max_new=2)))
        again = Stream.__new__(Stream)
        again.sock, again.rid, again.events, again.ids, again.text = a, 2, [], [], b""
        again.done = again.error = again.accepted = None
        sa.finish()
        again.finish()
        check(again.error is None and again.finish_reason() == 1,
              f"GENERATE right after CANCEL is served, not BUSY: {again.error}")
        a.close()   # disconnect frees the slot
        for _ in range(100):
            st = generate(d.sock, raw(prompt="third", max_new=2))
            if st.error is None:
                break
            time.sleep(0.05)
        check(st.error is None and st.finish_reason() == 1, "slot freed by the disconnect")
    with Daemon(k3d, "--queue", "1") as d:
        a = connect(d.sock)
        sa = start_long(a, 1)
        b = connect(d.sock)
        sb = Stream(b, 2, raw(prompt="waits", max_new=3))
        sb.step()
        check(sb.accepted and u32(sb.accepted, 2) == 1, "queued request learns position 1")
        st = generate(d.sock, raw(prompt="third", max_new=2))
        check(st.error and st.error[0] == STATUS["busy"], "third request: busy (queue full)")
        a.sendall(frame(T["CANCEL"], 1))
        sa.finish()
        sb.finish()
        check(sb.finish_reason() == 1 and len(sb.ids) == 3, "queued request runs after the first")
        # A request id still in use on the connection is refused, not merged.
        sa = start_long(a, 5)
        a.sendall(frame(T["GENERATE"], 5, raw(prompt="dup", max_new=2)))
        while True:
            r = read_frame(a)
            if r[0] == T["ERROR"] or r[0] == T["ACCEPTED"]:
                break
        check(r[0] == T["ERROR"] and u32(r[2], 1) == STATUS["bad_request"] and r[1] == 5,
              f"duplicate request id refused ({NAMES.get(r[0])})")
        a.sendall(frame(T["CANCEL"], 5))
        sa.finish()
        check(sa.finish_reason() == 2, "the first request with that id is unaffected and cancellable")
        check(any(e == "ACCEPTED" for e in sb.events), "ACCEPTED sent")
        a.close()
        b.close()


def warm(layers, experts):
    return ids_field(1, layers) + ids_field(2, experts)


def until(sock, rid, names):
    """Reads frames until one for rid whose type is in names; returns it."""
    while True:
        r = read_frame(sock, 60)
        if r is None:
            return None
        if r[1] == rid and NAMES.get(r[0]) in names:
            return r


def test_admission_kinds(k3d):
    """One admission rule for every kind of job (issue 15): WARM_EXPERTS
    is admitted like GENERATE: it queues behind a job told to stop instead
    of BUSY, may not reuse the request id of a live job on its connection,
    and a full queue's BUSY names what is running."""
    with Daemon(k3d) as d:   # --queue 0
        a = connect(d.sock)
        sa = start_long(a, 1)
        b = connect(d.sock)
        b.sendall(frame(T["WARM_EXPERTS"], 3, warm([1], [0])))
        r = until(b, 3, ("ERROR", "WARM_EXPERTS_REPLY"))
        check(r and r[0] == T["ERROR"] and u32(r[2], 1) == STATUS["busy"] and
              b"1 generation running and 0/0 queued" in r[2][2][0],
              f"WARM_EXPERTS while a generation runs, queue 0: busy naming it ({r and r[2].get(2)})")
        b.close()
        a.sendall(frame(T["CANCEL"], 1) + frame(T["WARM_EXPERTS"], 2, warm([1], [0])))
        got = {}
        while len(got) < 2:
            r = read_frame(a, 60)
            if r is None:
                break
            if (r[1], NAMES.get(r[0])) in ((1, "DONE"), (2, "ERROR"), (2, "WARM_EXPERTS_REPLY")):
                got[r[1]] = r
        r = got.get(2)
        check(r and r[0] == T["WARM_EXPERTS_REPLY"] and u32(r[2], 2) == 1,
              f"WARM_EXPERTS right after CANCEL queues behind the stopping job, not BUSY "
              f"({r and NAMES.get(r[0])} {r and r[2].get(2)})")
        check(1 in got and u32(got[1][2], 1) == 2, "the cancelled generation ends with DONE{cancelled}")
        a.close()
    with Daemon(k3d, "--queue", "1") as d:
        a = connect(d.sock)
        sa = start_long(a, 5)
        a.sendall(frame(T["WARM_EXPERTS"], 5, warm([1], [0])))
        r = until(a, 5, ("ERROR", "WARM_EXPERTS_REPLY", "DONE"))
        check(r and r[0] == T["ERROR"] and u32(r[2], 1) == STATUS["bad_request"],
              f"WARM_EXPERTS reusing a running GENERATE's request id: bad_request "
              f"({r and NAMES.get(r[0])})")
        a.sendall(frame(T["CANCEL"], 5))
        sa.finish()
        check(sa.finish_reason() == 2, "the GENERATE with that id is unaffected and cancellable")
        a.close()


def hello_caps(caps):
    return frame(T["HELLO"], 1, field(1, "test/1") + field(2, 1) + field(3, struct.pack("<Q", caps)))


def test_status_jobs(k3d):
    """Issue 16: `k3ctl status` lists running and queued jobs with id,
    client uid/pid, kind and age, so `k3ctl cancel` needs no guess; only
    peers that announce the jobs capability get the list on the wire."""
    with Daemon(k3d, "--queue", "2") as d:
        a = connect(d.sock)
        sa = start_long_prefill(a, 1, 3000)
        b, w = connect(d.sock), connect(d.sock)
        sb = Stream(b, 2, raw(prompt="waits", max_new=2))
        sb.step()
        w.sendall(frame(T["WARM_EXPERTS"], 3, warm([1], [0])))
        ids = [struct.unpack("<Q", st.accepted[1][0])[0] for st in (sa, sb)]
        r = subprocess.run([K3CTL, "--socket", d.sock, "status", "--json"], capture_output=True,
                           text=True, timeout=30)
        j = json.loads(r.stdout) if r.returncode == 0 else {}
        jobs = j.get("jobs") or []
        got = [(x["id"], x["state"], x["kind"], x["uid"], x["pid"]) for x in jobs]
        want = [(ids[0], "running", "generate", os.getuid(), os.getpid()),
                (ids[1], "queued", "generate", os.getuid(), os.getpid()),
                (ids[1] + 1, "queued", "warm-experts", os.getuid(), os.getpid())]
        check(got == want, f"status --json lists the jobs in order: {got} (want {want})")
        check(len(jobs) == 3 and jobs[0]["age_s"] > 0 and
              jobs[0]["age_s"] >= jobs[1]["age_s"] >= jobs[2]["age_s"] >= 0,
              f"ages: oldest first ({[x.get('age_s') for x in jobs]})")
        check(j.get("running") == 1 and j.get("queued") == 2, f"counters still there: {j.get('queued')}")
        r = subprocess.run([K3CTL, "--socket", d.sock, "status"], capture_output=True, text=True,
                           timeout=30)
        line = re.search(rf"^\s+{ids[0]}\s+running\s+generate\s+{os.getuid()}\s+{os.getpid()}\s+[0-9.]+ s$",
                         r.stdout, re.M)
        check(line is not None and re.search(rf"^\s+{ids[1] + 1}\s+queued\s+warm-experts\s", r.stdout, re.M),
              f"status text lists the jobs: {r.stdout!r}")
        # On the wire: the list only for a peer that asked (bit 4), and an
        # empty one means no jobs, not an old daemon.
        for caps, want_list in ((0x7, False), (0x7 | 1 << 4, True)):
            c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            c.connect(d.sock)
            c.sendall(hello_caps(caps))
            hr = read_frame(c)
            c.sendall(frame(T["STATUS"], 2))
            sr = read_frame(c)
            c.close()
            has = sr and 29 in sr[2]
            check(has == want_list and all((t in sr[2]) == want_list for t in range(29, 35)),
                  f"HELLO caps {caps:#x}: job list fields {'present' if want_list else 'absent'}")
            if want_list and has:
                check(len(sr[2][29][0]) == 8 * 3 and len(sr[2][32][0]) == 4 * 3,
                      "three jobs: u64 ids, u32 uids")
                check(struct.unpack("<Q", hr[2][3][0])[0] & (1 << 4), "HELLO_OK says k3d lists jobs")
        # The listed id is what k3ctl cancel takes.
        r = subprocess.run([K3CTL, "--socket", d.sock, "cancel", str(got[0][0] if got else 0)],
                           capture_output=True, text=True, timeout=30)
        check(r.returncode == 0, f"k3ctl cancel of the listed running job: {r.stderr}")
        sa.finish()
        sb.finish()
        check(sa.finish_reason() == 2 and sb.finish_reason() == 1, "listed job cancelled, next one ran")
        r = until(w, 3, ("WARM_EXPERTS_REPLY", "ERROR"))
        check(r and r[0] == T["WARM_EXPERTS_REPLY"], "the listed preload ran")
        r = subprocess.run([K3CTL, "--socket", d.sock, "status", "--json"], capture_output=True,
                           text=True, timeout=30)
        j = json.loads(r.stdout) if r.returncode == 0 else {}
        check(j.get("jobs") == [], f"idle: an empty job list ({j.get('jobs')})")
        a.close(); b.close(); w.close()


def test_reuse_and_transactions(k3d):
    turn1 = [{"role": "user", "content": "Hello there"}]
    with Daemon(k3d) as d:
        first = generate(d.sock, chat(turn1, 6))
        reasoning = first.text.decode("utf-8", "replace")
        hist = turn1 + [{"role": "assistant", "content": "", "reasoning_content": reasoning},
                        {"role": "user", "content": "And then?"}]
        # A disconnect mid-stream must not publish that request's state.
        s = connect(d.sock)
        longer = hist + [{"role": "assistant", "content": "x"}, {"role": "user", "content": "more"}]
        st = Stream(s, 1, chat(longer, 100000))
        while st.step() != "TOKEN":
            pass
        s.close()
        time.sleep(0.2)
        # Nor does a cancelled one, in decode or in prefill.
        for when in ("TOKEN", "PROGRESS"):
            s = connect(d.sock)
            st = Stream(s, 2, chat(longer, 100000))
            while st.step() != when:
                pass
            s.sendall(frame(T["CANCEL"], 2))
            st.finish()
            check(st.finish_reason() == 2, f"cancelled at {when}")
            s.close()
        second = generate(d.sock, chat(hist, 6))
        cached = second.done_u32(5)
    # A finished job whose DONE its client leaves unread holds two branch
    # states; after a deadline they are dropped (never published), so a
    # client that stops reading cannot pin state memory forever.
    with Daemon(k3d) as d:
        generate(d.sock, chat(turn1, 6))
        s = connect(d.sock)
        # ~1000 unread STATUS replies fill the socket buffer, so DONE waits.
        s.sendall(b"".join(frame(T["STATUS"], 100 + i) for i in range(1000)))
        time.sleep(0.3)
        s.sendall(frame(T["GENERATE"], 1, chat(hist, 6)))
        time.sleep(PUBLISH_DEADLINE_S + 2)
        st = Stream.__new__(Stream)
        st.sock, st.rid, st.events, st.ids, st.text = s, 1, [], [], b""
        st.done = st.error = st.accepted = None
        st.finish()
        s.close()
        later = generate(d.sock, chat(hist + [{"role": "assistant", "content": "x"},
                                              {"role": "user", "content": "more"}], 2))
        check(st.finish_reason() == 1 and later.done_u32(5) < st.done_u32(2),
              f"state of a DONE read after the deadline is not published (cached {later.done_u32(5)})")
    with Daemon(k3d) as d2:
        fresh = generate(d2.sock, chat(hist, 6))
    check(second.ids == fresh.ids and len(fresh.ids) == 6, "reuse gives the ids of a fresh run")
    check(fresh.done_u32(5) == 0, "fresh run used no cache")
    print(f"  turn 2 reused {cached} cached tokens of {second.done_u32(2)}")
    check(cached > 0, "turn 2 reused the published conversation (after a discarded request)")


def test_big_requests(d):
    """Big prompts are rendered and tokenized off the event loop: other
    clients are answered meanwhile, and the results are the same."""
    text = ("The quick brown fox jumps over the lazy dog. " * 80000)[:3 << 20]
    a = connect(d.sock)
    b = connect(d.sock)
    a.sendall(frame(T["TOKENIZE"], 11, field(1, text)))
    b.sendall(frame(T["PING"], 12))
    r = read_frame(b, 30)
    check(r and r[0] == T["PONG"], "PING answered while a 3 MiB TOKENIZE runs")
    a.setblocking(False)
    try:
        early = a.recv(1)
    except BlockingIOError:
        early = b""
    a.setblocking(True)
    check(early == b"", "the PONG came before the big TOKENIZE finished")
    r = read_frame(a, 120)
    check(r and r[0] == T["TOKENIZE_REPLY"] and len(r[2][1][0]) > 4 * 100000,
          "big TOKENIZE answered with its ids")
    # A big request body takes the prep thread and gives the same ids as
    # the inline path: the same messages, padded past the threshold with
    # JSON whitespace (so the prompt, and its prefill, stay small).
    msgs = [{"role": "user", "content": "hi there"}]
    small = generate(d.sock, chat(msgs, 4))
    s = connect(d.sock)
    st = Stream(s, 31, field(1, 1) + field(4, json.dumps(msgs) + " " * (100 << 10)) + field(8, 4))
    st.finish()
    s.close()
    check(st.ids == small.ids and len(st.ids) == 4, f"prep-thread path: same ids ({st.error})")
    # Errors found while preparing come back as ERROR.
    st = generate(d.sock, raw(prompt="word " * 20000, max_new=(1 << 20) - 10))
    check(st.error and st.error[0] == 11, f"context exceeded found on the prep thread: {st.error}")
    # Cancel while the request is still being prepared.
    s = connect(d.sock)
    big = [{"role": "user", "content": "y " * (1 << 19)}]
    s.sendall(frame(T["GENERATE"], 21, chat(big, 4)))
    s.sendall(frame(T["CANCEL"], 21))
    names = []
    while "DONE" not in names and "ERROR" not in names:
        r = read_frame(s, 120)
        names.append(NAMES[r[0]])
        if NAMES[r[0]] == "DONE":
            check(struct.unpack("<I", r[2][1][0])[0] == 2, "cancelled during prep: DONE cancelled")
    check("ACCEPTED" not in names, f"cancelled during prep never starts: {names}")
    a.close(); b.close(); s.close()


def test_churn(d):
    """50 requests with random disconnects: no fd or memory growth."""
    rng = random.Random(7)
    generate(d.sock, raw(prompt="warm up", max_new=4))
    time.sleep(0.2)
    fds0, rss0 = d.fds(), d.rss_kb()
    for i in range(50):
        s = connect(d.sock)
        st = Stream(s, i + 1, raw(prompt=f"request {i}", max_new=rng.choice([2, 8, 50])))
        cut = rng.random() < 0.5
        try:
            while st.done is None and st.error is None:
                if cut and rng.random() < 0.3:
                    break
                st.step()
        except EOFError:
            pass
        s.close()
    for _ in range(100):   # the last job may still be winding down
        if d.fds() <= fds0 + 1:
            break
        time.sleep(0.05)
    for _ in range(100):   # a cancelled job frees the slot at its next step
        st = generate(d.sock, raw(prompt="still alive", max_new=2))
        if not (st.error and st.error[0] == STATUS["busy"]):
            break
        time.sleep(0.05)
    check(st.finish_reason() == 1, f"daemon serves after churn: {st.error}")
    fds1, rss1 = d.fds(), d.rss_kb()
    print(f"  fds {fds0} -> {fds1}, rss {rss0} -> {rss1} kB")
    check(fds1 <= fds0 + 1, f"no fd growth ({fds0} -> {fds1})")
    check(rss1 - rss0 < 32 * 1024, f"no memory growth ({rss0} -> {rss1} kB)")


def test_k3ctl(d):
    r = subprocess.run([K3CTL, "--socket", d.sock, "run", "--max-new", "5", "--json"],
                       capture_output=True, text=True, timeout=60)
    j = json.loads(r.stdout)
    check(r.returncode == 0 and len(j["ids"]) == 5 and j["finish"] == "length",
          f"k3ctl run --json: {r.stdout[:200]}")
    st = generate(d.sock, raw(prompt="The capital of France is", max_new=5))
    check(j["ids"] == st.ids, "k3ctl run's default prompt is 'The capital of France is'")
    r = subprocess.run([K3CTL, "--socket", d.sock, "run", "--chat", "hi", "--max-new", "4", "--ids"],
                       capture_output=True, text=True, timeout=60)
    check(r.returncode == 0 and "ids:" in r.stdout, f"k3ctl run --chat --ids: {r.stderr}")
    r = subprocess.run([K3CTL, "--socket", d.sock, "chat", "--max-new", "4", "--json"],
                       input="hello\nagain\n", capture_output=True, text=True, timeout=60)
    lines = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    check(r.returncode == 0 and len(lines) == 2, f"k3ctl chat: two turns ({r.stdout[:200]})")
    if len(lines) == 2:
        check(lines[1]["usage"]["cached_tokens"] > 0, "k3ctl chat reuses the conversation")
    # `k3ctl cancel` with the id that `run --stats` shows stops that run.
    # (a long prefill keeps it running on any machine)
    long_ids = ",".join(str(1 + i % 2000) for i in range(3000))
    p = subprocess.Popen([K3CTL, "--socket", d.sock, "run", "--stats", "--max-new", "100000",
                          "--prompt-ids", long_ids], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True)
    first = p.stderr.readline()
    m = re.match(r"\[job (\d+)\]", first)
    check(m is not None, f"run --stats names its job id first: {first!r}")
    if m:
        r = subprocess.run([K3CTL, "--socket", d.sock, "cancel", m.group(1)], capture_output=True, text=True)
        check(r.returncode == 0, f"k3ctl cancel {m.group(1)}: {r.stderr}")
    try:
        rc = p.wait(30)
    except subprocess.TimeoutExpired:
        p.kill()
        rc = p.wait()
    rest = p.stderr.read()
    p.stderr.close()
    # 130 is for the user's own Ctrl-C; a cancel from elsewhere is an error
    # that names itself.
    check(rc == 1 and "k3d cancelled the generation: 'k3ctl cancel' from another client" in rest,
          f"the run cancelled by 'k3ctl cancel' exits 1 and says so ({rc} {rest[-200:]!r})")
    # Ctrl-C: k3ctl cancels its own job and exits 130.
    p = subprocess.Popen([K3CTL, "--socket", d.sock, "run", "--stats", "--max-new", "100000",
                          "--prompt-ids", long_ids], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True)
    first = p.stderr.readline()
    p.send_signal(signal.SIGINT)
    try:
        rc = p.wait(30)
    except subprocess.TimeoutExpired:
        p.kill()
        rc = p.wait()
    p.stderr.close()
    check(first.startswith("[job ") and rc == 130, f"the run cancelled with Ctrl-C exits 130 ({rc})")
    r = subprocess.run([K3CTL, "--socket", d.sock, "cancel", "424242"], capture_output=True, text=True)
    check(r.returncode == 1, "k3ctl cancel of an unknown job fails")
    r = subprocess.run([K3CTL, "--socket", d.sock, "run", "--reasoning-effort", "medium"],
                       capture_output=True, text=True)
    check(r.returncode == 2, "bad --reasoning-effort is a usage error")
    # Bad input to k3ctl is a usage error (2), never "daemon unavailable" (3)
    # and never silently sent as something else.
    r = subprocess.run([K3CTL, "--socket", d.sock, "run", "--max-new"], capture_output=True, text=True)
    check(r.returncode == 2 and "--max-new needs" in r.stderr, f"--max-new without a value: {r.stderr}")
    for args in ([b"run", b"caf\xe9"], [b"run", b"--chat", b"caf\xe9"], [b"run", b"--stop", b"\xff", b"x"]):
        r = subprocess.run([K3CTL.encode(), b"--socket", d.sock.encode(), *args], capture_output=True)
        check(r.returncode == 2 and b"UTF-8" in r.stderr, f"k3ctl {args}: not UTF-8 -> usage ({r.returncode} {r.stderr[:120]})")
    r = subprocess.run([K3CTL, "--socket", d.sock, "--json", "chat", "--max-new", "2"],
                       input=b"caf\xe9\nhello\n", capture_output=True, timeout=60)
    turns = [json.loads(x) for x in r.stdout.splitlines() if x.startswith(b"{")]
    one = subprocess.run([K3CTL, "--socket", d.sock, "--json", "run", "--chat", "--max-new", "2", "hello"],
                         capture_output=True, timeout=60)
    want = json.loads(one.stdout)["usage"]["prompt_tokens"] if one.returncode == 0 else None
    check(r.returncode == 0 and len(turns) == 1 and b"UTF-8" in r.stderr and
          turns[0]["usage"]["prompt_tokens"] == want,
          f"k3ctl chat skips a non-UTF-8 line instead of sending an empty conversation ({r.stdout[:200]} {r.stderr[:200]})")


def sigterm_during_long_prefill(d):
    """Starts a generation whose prefill outlives any drain timeout on any
    machine and sends SIGTERM once it runs; returns (connection, stream)."""
    a = connect(d.sock)
    sa = start_long_prefill(a, 1, 20000)
    d.proc.send_signal(signal.SIGTERM)
    return a, sa


def expect_done_cancelled(sa, why):
    """The running job sa, cancelled by the daemon (`why`), ends with DONE
    cancelled, not a bare close."""
    try:
        sa.finish(30)
    except EOFError:
        pass
    check(sa.done is not None and sa.finish_reason() == 2 and 21 in sa.done and sa.done_u32(21) == 3,
          f"{why}: the running job ends with DONE cancelled, reason 3 (k3d stopping), not a bare "
          f"close ({sa.events[-3:]})")


def test_drain(k3d):
    """SIGTERM mid-generation: the running job's client always gets its
    terminal frame, also when the drain timeout cuts the job short."""
    with Daemon(k3d, "--queue", "1", "--drain-timeout", "30") as d:
        a, b = connect(d.sock), connect(d.sock)
        sa = Stream(a, 1, raw(prompt="Once upon a time", max_new=40))
        while sa.step() != "TOKEN":
            pass
        sb = Stream(b, 2, raw(prompt="queued", max_new=2))
        sb.step()
        d.proc.send_signal(signal.SIGTERM)
        sa.finish()
        sb.finish()
        check(sa.finish_reason() == 1 and len(sa.ids) == 40, f"SIGTERM lets the running job finish: {sa.done}")
        check(sb.error and sb.error[0] == STATUS["shutting_down"], f"queued job: shutting_down {sb.error}")
        check(d.proc.wait(20) == 0, "exit 0 after the drain")
    with Daemon(k3d, "--drain-timeout", "0.5") as d:
        a, sa = sigterm_during_long_prefill(d)
        expect_done_cancelled(sa, "drain timeout")
        check(d.proc.wait(20) == 0, "exit 0 after the drain timeout")
    # While running work finishes, the socket stays and a new client learns
    # the state (what k3-gateway's /health reports) instead of finding no
    # socket; it may not start work.
    with Daemon(k3d, "--drain-timeout", "60") as d:
        a, sa = sigterm_during_long_prefill(d)
        state, deadline = None, time.time() + 10
        while state != 2 and time.time() < deadline:
            try:
                c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                c.connect(d.sock)
            except OSError as e:
                check(False, f"draining k3d still accepts while its job runs: {e}")
                break
            c.sendall(frame(T["HELLO"], 1, field(1, "test/1") + field(2, 1)))
            r = read_frame(c)
            state = u32(r[2], 5) if r and r[0] == T["HELLO_OK"] else None
            if state != 2:
                c.close()
                time.sleep(0.05)
        check(state == 2, f"HELLO_OK during the drain says draining (state {state})")
        if state == 2:
            c.sendall(frame(T["STATUS"], 2))
            r = read_frame(c)
            check(r and r[0] == T["STATUS_REPLY"] and u32(r[2], 2) == 2 and u32(r[2], 8) == 1 and
                  r[2][3][0].startswith(b"finishing running work"),
                  f"STATUS during the drain: draining (also its text), 1 running ({r and r[2].get(3)})")
            sb = Stream(c, 3, raw(prompt="late", max_new=2))
            sb.finish(10)
            check(sb.error and sb.error[0] == STATUS["shutting_down"], f"GENERATE while draining: {sb.error}")
            c.close()
            # k3ctl run against the draining k3d: unavailable (3), as the
            # gateway's 503, so a script that retries on 3 retries a restart
            r = subprocess.run([K3CTL, "--socket", d.sock, "run", "--max-new", "2", "late"],
                               capture_output=True, text=True, timeout=30)
            check(r.returncode == 3 and "shutting_down" in r.stderr,
                  f"k3ctl run while draining: exit 3 ({r.returncode} {r.stderr!r})")
        # A second SIGTERM does not wait out the 60 s: the running job is
        # cancelled now, its client still gets DONE.
        t0 = time.time()
        d.proc.send_signal(signal.SIGTERM)
        expect_done_cancelled(sa, "second SIGTERM")
        check(d.proc.wait(20) == 0 and time.time() - t0 < 20,
              f"exit 0 soon after the second SIGTERM ({time.time() - t0:.1f} s)")
        check(not os.path.exists(d.sock), "socket removed when the drain ends")
        a.close()


def test_shutdown_twice(k3d):
    """Issue 16: a second `k3ctl shutdown` during the drain cancels the
    running work at once, and says so; the first one does not."""
    with Daemon(k3d, "--drain-timeout", "60") as d:
        a = connect(d.sock)
        sa = start_long_prefill(a, 1, 20000)
        r1 = subprocess.run([K3CTL, "--socket", d.sock, "shutdown"], capture_output=True, text=True,
                            timeout=30)
        check(r1.returncode == 0 and r1.stdout == "k3d is draining and will exit\n",
              f"first k3ctl shutdown: draining ({r1.returncode} {r1.stdout!r} {r1.stderr!r})")
        t0 = time.time()
        r2 = subprocess.run([K3CTL, "--socket", d.sock, "--json", "shutdown"], capture_output=True,
                            text=True, timeout=30)
        j = json.loads(r2.stdout) if r2.returncode == 0 else {}
        check(j.get("ok") is True and "the running work was cancelled" in j.get("message", ""),
              f"second k3ctl shutdown says the running work was cancelled ({r2.stdout!r} {r2.stderr!r})")
        expect_done_cancelled(sa, "second k3ctl shutdown")
        check(d.proc.wait(20) == 0 and time.time() - t0 < 20,
              f"exit 0 soon after the second shutdown ({time.time() - t0:.1f} s)")
        a.close()
    # The text form, when the running work is cancelled by the second one.
    with Daemon(k3d, "--drain-timeout", "60") as d:
        a, sa = sigterm_during_long_prefill(d)
        r = subprocess.run([K3CTL, "--socket", d.sock, "shutdown"], capture_output=True, text=True,
                           timeout=30)
        check(r.returncode == 0 and "the running work was cancelled" in r.stdout,
              f"k3ctl shutdown after SIGTERM says the running work was cancelled ({r.stdout!r})")
        expect_done_cancelled(sa, "k3ctl shutdown after SIGTERM")
        a.close()


def test_cancel_permissions(k3d):
    """A CANCEL by job id from another user's connection: admins (the
    daemon's uid, root, --allow-uid) may cancel any job, --allow-gid
    members only jobs of their own uid."""
    if os.getuid() != 0 or not shutil.which("setpriv"):
        print("skip: cancel permission test needs root and setpriv")
        return
    with Daemon(k3d, "--allow-gid", "65534") as d:
        os.chmod(d.dir, 0o755)
        os.chmod(d.sock, 0o666)
        a = connect(d.sock)
        sa = Stream(a, 1, raw(ids=[1 + i % 2000 for i in range(3000)], max_new=4))
        sa.step()
        job = struct.unpack("<Q", sa.accepted[1][0])[0]
        r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                            K3CTL, "--socket", d.sock, "cancel", str(job)],
                           capture_output=True, text=True, timeout=30)
        check(r.returncode == 1, f"a group member may not cancel root's job {job}: {r.returncode} {r.stderr}")
        # STATUS lists to each peer the jobs it may cancel.
        r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                            K3CTL, "--socket", d.sock, "status", "--json"],
                           capture_output=True, text=True, timeout=30)
        j = json.loads(r.stdout) if r.returncode == 0 else {}
        check(j.get("jobs") == [] and j.get("running") == 1,
              f"a group member's status does not list root's job: {r.stdout[:300]} {r.stderr}")
        r = subprocess.run([K3CTL, "--socket", d.sock, "status", "--json"], capture_output=True, text=True)
        j = json.loads(r.stdout) if r.returncode == 0 else {}
        check([x["id"] for x in j.get("jobs") or []] == [job], f"root's status lists it: {j.get('jobs')}")
        r = subprocess.run([K3CTL, "--socket", d.sock, "cancel", str(job)], capture_output=True, text=True)
        check(r.returncode == 0, f"root may cancel it: {r.stderr}")
        sa.finish()
        check(sa.finish_reason() == 2, "cancelled by root")
        a.close()


def fake_k3d_once(path, done_extra):
    """Serves one k3ctl connection at path like k3d would: HELLO_OK, then
    ACCEPTED, one TOKEN and DONE (plus done_extra fields) for its GENERATE."""
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)

    def serve():
        c, _ = srv.accept()
        t, rid, _f = read_frame(c, 10)
        c.sendall(frame(T["HELLO_OK"], rid, field(1, "fake") + field(2, 1) + field(5, 1)))
        t, rid, _f = read_frame(c, 10)
        c.sendall(frame(T["ACCEPTED"], rid, field(1, struct.pack("<Q", 9)) + field(2, 0)) +
                  frame(T["TOKEN"], rid, ids_field(1, [42]) + field(2, "x")) +
                  frame(T["DONE"], rid, field(1, 1) + field(2, 3) + field(3, 1) + done_extra))
        read_frame(c, 10)
        c.close()
        srv.close()
    th = threading.Thread(target=serve, daemon=True)
    th.start()
    return th


def test_k3ctl_expert_counters():
    """k3ctl shows expert-store counters only when DONE carries them: a
    k3d that does not report them must not read as '0 bytes read'."""
    tmp = tempfile.mkdtemp()
    try:
        for i, extra in enumerate((b"", field(11, struct.pack("<Q", 12345)) + field(12, struct.pack("<Q", 7)))):
            path = os.path.join(tmp, f"fake{i}.sock")
            th = fake_k3d_once(path, extra)
            r = subprocess.run([K3CTL, "--socket", path, "--json", "run", "--stats", "hi"],
                               capture_output=True, text=True, timeout=30)
            th.join(10)
            j = json.loads(r.stdout) if r.returncode == 0 else {}
            if extra:
                check("12345 bytes read" in r.stderr and j.get("experts", {}).get("bytes_read") == 12345,
                      f"reported expert counters are shown: {r.stderr!r} {r.stdout[:200]}")
            else:
                check("experts: not reported" in r.stderr and "experts" in j and j["experts"] is None,
                      f"missing expert counters are not shown as zeros: {r.stderr!r} {r.stdout[:200]}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    os.environ["K3_TEST_MODEL"] = make_model(K3CTL)
    print("-- k3ctl expert counters"); test_k3ctl_expert_counters()
    print("-- golden"); test_golden(K3D)
    print("-- forward"); test_forward_matches(K3D)
    d = Daemon(K3D)
    try:
        print("-- edges"); test_edges(d)
        print("-- cancel"); test_cancel(d)
        print("-- k3ctl"); test_k3ctl(d)
        print("-- big requests"); test_big_requests(d)
        print("-- churn"); test_churn(d)
        check(d.proc.poll() is None, "daemon alive")
    finally:
        check(d.stop() == 0, "clean exit")
        check(not d.sanitizer_reports(), f"no sanitizer reports: {d.sanitizer_reports()[:3]}")
    print("-- busy/queue"); test_busy_and_queue(K3D)
    print("-- admission of every kind"); test_admission_kinds(K3D)
    print("-- status jobs"); test_status_jobs(K3D)
    print("-- reuse"); test_reuse_and_transactions(K3D)
    print("-- drain"); test_drain(K3D)
    print("-- shutdown twice"); test_shutdown_twice(K3D)
    print("-- cancel permissions"); test_cancel_permissions(K3D)
    shutil.rmtree(os.path.dirname(os.environ["K3_TEST_MODEL"]), ignore_errors=True)
    return report()


if __name__ == "__main__":
    sys.exit(main())

"""The conformance cases that need real tokens, against the real k3d serving
the synthetic nano checkpoint (k3ctl demo-model). The nano model has random
weights, so its text is noise; what is checked is what must hold for any
model: greedy determinism, stream equals non-stream, stop strings, lengths,
the reasoning split, context errors, 429 and disconnects. SKIPs when the
build has no k3d or k3ctl (K3_BUILD_ROOT)."""
import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time

import openai
import pytest

from gwharness import Stack, raw_stream_socket, read_until, sse_events

BUILD = os.environ.get("K3_BUILD_ROOT", "")
K3D = os.path.join(BUILD, "daemon", "k3d")
K3CTL = os.path.join(BUILD, "client", "k3ctl", "k3ctl")
if not (BUILD and os.access(K3D, os.X_OK) and os.access(K3CTL, os.X_OK)):
    pytest.skip("no k3d/k3ctl in K3_BUILD_ROOT", allow_module_level=True)


def _sanitized_build():
    try:
        opts = json.load(open(os.path.join(BUILD, "meson-info", "intro-buildoptions.json")))
    except (OSError, ValueError):
        return False
    return any(o["name"] == "b_sanitize" and o["value"] not in ("none", "", []) for o in opts)


# An unoptimized ASan k3d runs the nano model too slowly for this suite's
# time budget; the gateway itself is exercised under ASan by the fake-k3d
# cases, and the plain build runs these against the real daemon.
if _sanitized_build():
    pytest.skip("sanitizer build: real-k3d cases run in the plain build", allow_module_level=True)

HI = [{"role": "user", "content": "Hello! Who are you?"}]


@contextlib.contextmanager
def real_k3d(prefix, k3d_args, gw_args=(), quiet=True):
    """A real k3d on a fresh nano demo model and a gateway in front of it,
    once /health says ready; yields (stack, k3d process, socket path) and
    removes the model and the socket directory afterwards."""
    d = tempfile.mkdtemp(prefix=prefix)
    model = os.path.join(d, "nano")
    subprocess.run([K3CTL, "demo-model", "--out", model, "--preset", "nano"], check=True,
                   capture_output=True, timeout=60)
    sock = os.path.join(d, "k3d.sock")
    log = open(os.path.join(d, "k3d.log"), "w")
    # one seat (BUSY and queue depths as the tests expect) unless asked
    one = [] if "--parallel" in k3d_args else ["--parallel", "1"]
    k = subprocess.Popen([K3D, "--socket", sock, "--model", model, *one, *k3d_args], stderr=log)
    try:
        with Stack(start_fake=False, sock=sock, gw_args=list(gw_args), quiet=quiet) as s:
            end = time.time() + 60
            while s.raw("GET", "/health")[0] != 200:
                assert k.poll() is None and time.time() < end, open(log.name).read()
                time.sleep(0.1)
            yield s, k, sock
    finally:
        if k.poll() is None:
            k.terminate()
        k.wait(30)
        log.close()
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def real():
    with real_k3d("k3gw-real-", ["--queue", "0"], ["--keepalive", "1"]) as (s, _, _):
        yield s


def chat(s, **kw):
    kw.setdefault("model", "whatever")
    kw.setdefault("messages", HI)
    return s.client().chat.completions.create(**kw)


def joined(chunks, field):
    return "".join(getattr(c.choices[0].delta, field, None) or
                   (c.choices[0].delta.model_extra or {}).get(field) or "" for c in chunks if c.choices)


def test_real_models_and_shape(real):                            # T01 T38 T54 T56
    assert [m.id for m in real.client().models.list().data] == ["nano"]
    c = chat(real, max_tokens=8)
    assert c.model == "nano" and c.object == "chat.completion" and c.id.startswith("chatcmpl-")
    ch = c.choices[0]
    assert ch.finish_reason == "length" and ch.logprobs is None and ch.message.role == "assistant"
    u = c.usage
    assert u.completion_tokens == 8 and u.total_tokens == u.prompt_tokens + 8
    # thinking is on by default: the 8 tokens are reasoning, the answer is empty
    assert 0 < u.completion_tokens_details.reasoning_tokens <= u.completion_tokens
    assert ch.message.model_extra["reasoning_content"] and "<|" not in ch.message.content


def test_real_greedy_and_stream_equal(real):                     # T29 T32 T43-T46 T55
    base = chat(real, max_tokens=12, reasoning_effort="none")
    text = base.choices[0].message.content
    assert base.usage.completion_tokens_details.reasoning_tokens == 0
    for kw in ({"temperature": 0}, {"top_p": 1}, {"seed": 7}):
        assert chat(real, max_tokens=12, reasoning_effort="none", **kw).choices[0].message.content == text
    chunks = list(chat(real, max_tokens=12, reasoning_effort="none", stream=True,
                       stream_options={"include_usage": True}))
    assert joined(chunks, "content") == text
    assert chunks[-1].usage.model_dump() == base.usage.model_dump()
    # with thinking on: reasoning deltas match the non-stream reasoning
    nr = chat(real, max_tokens=10)
    sr = list(chat(real, max_tokens=10, stream=True))
    assert joined(sr, "reasoning_content") == nr.choices[0].message.model_extra["reasoning_content"]
    status, hd, body = real.raw("POST", "/v1/chat/completions",
                                {"model": "m", "messages": HI, "max_tokens": 4, "stream": True})
    events = sse_events(body)
    assert hd["content-type"] == "text/event-stream; charset=utf-8" and events[-1] == "data: [DONE]"


def test_real_stop_strings(real):                                # T40 T49
    text = chat(real, max_tokens=24, reasoning_effort="none").choices[0].message.content
    cand = [text[i:i + 4] for i in range(2, len(text) - 4)
            if text[i:i + 4].isprintable() and "\ufffd" not in text[i:i + 4] and text[i:i + 4].strip()]
    if not cand:
        pytest.skip("nano output has no printable 4-char window")
    stop = cand[len(cand) // 2]
    cut = text[:text.find(stop)]
    c = chat(real, max_tokens=24, reasoning_effort="none", stop=[stop])
    assert c.choices[0].message.content == cut and c.choices[0].finish_reason == "stop"
    chunks = list(chat(real, max_tokens=24, reasoning_effort="none", stop=[stop], stream=True))
    assert joined(chunks, "content") == cut and chunks[-1].choices[0].finish_reason == "stop"


def test_real_lengths_and_context(real):                         # T39 T41 T50
    c = chat(real, max_tokens=1, reasoning_effort="none")
    assert c.choices[0].finish_reason == "length" and c.usage.completion_tokens == 1
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as ei:
            chat(real, max_tokens=1 << 20, stream=stream)
        assert ei.value.code == "context_length_exceeded" and ei.value.param == "max_tokens"
        assert "maximum context length" in ei.value.message


def test_real_busy_and_disconnect_20_times(real):                # T60 T63
    # Legacy completions: a two-token prompt keeps each round short.
    cl = real.client()
    for i in range(20):
        s = cl.completions.create(model="m", prompt="Hi", max_tokens=4000, stream=True)
        it = iter(s)
        for _ in range(3):
            next(it)
        if i % 5 == 0:
            with pytest.raises(openai.RateLimitError) as ei:
                cl.completions.create(model="m", prompt="Hi", max_tokens=1)
            assert ei.value.response.headers["retry-after"]
        s.close()
        end = time.time() + 5
        while True:
            try:
                c = cl.completions.create(model="m", prompt="Hi", max_tokens=1)
                break
            except openai.RateLimitError:
                assert time.time() < end, "slot still held after a disconnect (iteration %d)" % i
                time.sleep(0.02)
        assert c.choices[0].finish_reason == "length"


def test_real_requests_the_renderer_accepts(real):               # T21 T42 T57 T59
    msgs = [{"role": "developer", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "weather?"}]},
            {"role": "assistant", "content": "", "reasoning_content": "call the tool",
             "tool_calls": [{"id": "c1", "type": "function",
                             "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "12C"}]
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]
    c = chat(real, messages=msgs, max_tokens=2, tools=tools, tool_choice="required",
             response_format={"type": "json_object"}, reasoning_effort="high")
    assert c.choices[0].finish_reason in ("length", "stop", "tool_calls")
    c = real.client().completions.create(model="m", prompt="The capital of France is", max_tokens=4)
    assert c.object == "text_completion" and c.usage.completion_tokens == 4
    from langchain_openai import ChatOpenAI
    lc = ChatOpenAI(model="m", api_key="sk-dummy", base_url=real.base + "/v1", max_retries=0,
                    max_tokens=3, reasoning_effort="none")
    assert isinstance(lc.invoke("hi").content, str)


def test_real_readme_snippet(real):
    """The README's Python example against the real daemon: a streamed answer."""
    import contextlib
    import io
    import re
    doc = open(os.path.join(os.path.dirname(__file__), "..", "..", "README.md")).read()
    doc = doc[doc.index("## Use it from an OpenAI client"):]
    code = re.search(r"```python\n(.*?)```", doc, re.S).group(1)
    code = code.replace("http://127.0.0.1:8000/v1", real.base + "/v1")
    # noise from a random model: keep it short
    code = re.sub(r"max_tokens=\d+", "max_tokens=8", code)
    if "max_tokens" not in code:
        code = code.replace("stream=True,", "stream=True, max_tokens=8,")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README", "exec"), {})
    assert len(out.getvalue().strip()) > 0


def test_real_metrics_expert_counters(real):
    """/metrics carries the real k3d's expert-store counters from STATUS,
    consistent with each other after a generation."""
    chat(real, max_tokens=4)
    status, hd, body = real.raw("GET", "/metrics")
    assert status == 200
    vals = {}
    for ln in body.decode().splitlines():
        if ln.startswith("k3_expert_"):
            name, v = ln.split()
            vals[name] = float(v)
    for name in ("k3_expert_bytes_read_total", "k3_expert_positions_total", "k3_expert_bytes_read_per_token",
                 "k3_expert_demand_hits_total", "k3_expert_demand_misses_total",
                 "k3_expert_prefetch_issued_total", "k3_expert_prefetch_used_total",
                 "k3_expert_prefetch_wasted_bytes_total", "k3_expert_io_wait_seconds_total",
                 "k3_expert_compute_seconds_total", "k3_expert_cache_bytes"):
        assert name in vals, name
    assert vals["k3_expert_bytes_read_total"] > 0 and vals["k3_expert_positions_total"] > 0
    assert abs(vals["k3_expert_bytes_read_per_token"] - vals["k3_expert_bytes_read_total"] /
               vals["k3_expert_positions_total"]) < 1
    assert vals["k3_expert_demand_hits_total"] + vals["k3_expert_demand_misses_total"] > 0
    assert vals["k3_expert_compute_seconds_total"] > 0 and vals["k3_expert_io_wait_seconds_total"] >= 0


def test_real_draft_field(real):
    """The 'draft' request field (a k3d extension) reaches k3d: every policy
    answers exactly as 'off' (drafting never changes the output), a bad
    value is a 400 naming it, and /metrics carries the draft counters."""
    base = real.client().completions.create(model="m", prompt="Once upon a time", max_tokens=24,
                                            extra_body={"draft": "off"})
    for pol in ("ngram", "auto"):
        r = real.client().completions.create(model="m", prompt="Once upon a time", max_tokens=24,
                                             extra_body={"draft": pol})
        assert r.choices[0].text == base.choices[0].text, pol
    c1 = chat(real, max_tokens=16, extra_body={"draft": "off"})
    c2 = chat(real, max_tokens=16, extra_body={"draft": "ngram"})
    assert c1.choices[0].message.content == c2.choices[0].message.content
    with pytest.raises(openai.BadRequestError) as e:
        chat(real, max_tokens=4, extra_body={"draft": "eagle"})
    assert e.value.body["param"] == "draft"
    with pytest.raises(openai.BadRequestError) as e:   # no --draft-model on this k3d
        chat(real, max_tokens=4, extra_body={"draft": "dspark"})
    assert e.value.body["param"] == "draft_policy"
    status, _, body = real.raw("GET", "/metrics")
    vals = dict(ln.split() for ln in body.decode().splitlines()
                if ln.startswith(("k3_daemon_draft", "k3_daemon_decode_passes", "k3_daemon_tokens_per",
                                  "k3_daemon_verify")))
    for name in ("k3_daemon_draft_proposed_total", "k3_daemon_draft_accepted_total",
                 "k3_daemon_decode_passes_total", "k3_daemon_draft_seconds_total",
                 "k3_daemon_verify_seconds_total", "k3_daemon_tokens_per_pass"):
        assert name in vals, name
    assert float(vals["k3_daemon_decode_passes_total"]) > 0
    assert float(vals["k3_daemon_tokens_per_pass"]) > 0


def test_real_cancel_by_the_logged_job_id():
    """The job id the gateway logs is the one k3d knows (issue 16): 'k3ctl
    cancel N' with it stops the running stream, which ends with the
    'cancelled' error event, and the next request is served."""
    import re
    with real_k3d("k3gw-cancel-", ["--queue", "0"], quiet=False) as (s, _, sock):
        st = raw_stream_socket(s.port, {"model": "m", "messages": HI, "max_tokens": 100000, "stream": True})
        head = read_until(st, b'"role":"assistant"')
        rid = re.search(rb"x-request-id: (req_[0-9a-f]+)", head).group(1).decode()
        line = s.log_line(lambda ln: rid in ln, timeout=30)
        job = re.fullmatch(r"k3-gateway: %s POST /v1/chat/completions job (\d+)" % rid, line).group(1)
        p = subprocess.run([K3CTL, "--socket", sock, "cancel", job], capture_output=True, text=True, timeout=30)
        assert (p.returncode, p.stdout) == (0, "job %s cancelled\n" % job), (p.returncode, p.stdout, p.stderr)
        rest = read_until(st, b"\r\n0\r\n\r\n", timeout=30)
        st.close()
        events = [ln for ln in (head + rest).decode().split("\n") if ln.startswith("data: ")]
        err = json.loads(events[-1][6:])["error"]
        assert err["code"] == "cancelled" and "k3ctl cancel" in err["message"], events[-3:]
        assert "data: [DONE]" not in events
        assert chat(s, max_tokens=1).choices[0].finish_reason == "length"


def test_real_health_carries_status_text(real):
    """/health from a real k3d carries its STATUS text as "k3d", the same
    sentence 'k3ctl status' prints."""
    status, _, body = real.raw("GET", "/health")
    st = json.loads(subprocess.run([K3CTL, "--socket", real.sock, "status", "--json"], check=True,
                                   capture_output=True, text=True, timeout=30).stdout)
    got = json.loads(body)
    assert status == 200 and got["status"] == "ok" and got["k3d"] == st["status"], (got, st)
    assert got["k3d"].startswith("ready"), got


def test_real_health_while_draining():
    """SIGTERM while a generation runs: until the drain ends, /health says
    "draining" (k3d keeps answering HELLO), not "unavailable" (socket gone).
    The two requests queued behind it, one streaming and one not, and a new
    one sent during the drain all get the draining error once (code
    shutting_down), and /metrics counts all three as 503."""
    import signal
    import socket
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
    from k3proto import T, connect, field, frame, read_frame
    draining = {"message": "k3d is draining (shutting down or restarting) and takes no new requests; this "
                           "request did not run.", "type": "server_error", "param": None, "code": "shutting_down"}
    with real_k3d("k3gw-drain-", ["--threads", "1", "--drain-timeout", "60", "--queue", "2"]) as (s, k, sock):
        a = connect(sock)
        ids = b"".join((1 + i % 2000).to_bytes(4, "little") for i in range(20000))
        a.sendall(frame(T["GENERATE"], 1, field(1, 0) + field(3, ids) + field(8, 100000)))
        while read_frame(a, 60)[0] != T["PROGRESS"]:
            pass
        q_stream = raw_stream_socket(s.port, {"model": "m", "messages": HI, "max_tokens": 4, "stream": True})
        head = read_until(q_stream, b'"role":"assistant"')   # ACCEPTED: queued, headers out
        assert head.startswith(b"HTTP/1.1 200"), head
        body = json.dumps({"model": "m", "messages": HI, "max_tokens": 4}).encode()
        q_plain = socket.create_connection(("127.0.0.1", s.port), timeout=30)
        q_plain.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        end = time.time() + 10
        while "k3_daemon_queue_depth 2" not in s.raw("GET", "/metrics")[2].decode().splitlines():
            assert time.time() < end, "both requests queued"
            time.sleep(0.05)
        k.send_signal(signal.SIGTERM)
        end = time.time() + 10
        while True:
            status, hd, body = s.raw("GET", "/health")
            if status != 200 or time.time() > end:
                break
            time.sleep(0.05)
        assert (status, json.loads(body)) == (503, {
            "status": "draining",
            "error": "k3d is draining (shutting down or restarting) and takes no new requests"}), body
        assert hd["retry-after"] == "1"
        status, hd, body = s.raw("POST", "/v1/chat/completions", {"model": "m", "messages": HI})
        assert (status, json.loads(body)["error"], hd["retry-after"]) == (503, draining, "1"), body
        rest = read_until(q_stream, b"\r\n0\r\n\r\n")    # the chunked stream's end
        events = [ln for ln in rest.decode().split("\n") if ln.startswith("data: ")]
        assert json.loads(events[-1][6:]) == {"error": draining} and "data: [DONE]" not in events, rest
        plain = read_until(q_plain, b"\x00")                # to EOF (Connection: close)
        assert plain.startswith(b"HTTP/1.1 503"), plain
        assert json.loads(plain.split(b"\r\n\r\n", 1)[1]) == {"error": draining}, plain
        lines = s.raw("GET", "/metrics")[2].decode().splitlines()
        assert 'k3_gateway_requests_total{endpoint="chat_completions",status="503"} 3' in lines, \
            [ln for ln in lines if ln.startswith("k3_gateway_requests_total")]
        assert not [ln for ln in lines if ln.startswith('k3_gateway_requests_total{endpoint="chat_completions"')
                    and 'status="503"' not in ln], lines
        a.close()    # cancels the job: the drain ends and k3d exits
        assert k.wait(20) == 0
        assert s.raw("GET", "/health")[0] == 503


def test_real_concurrent_streams_parallel():
    """Issue 21 through the gateway: k3d --parallel 4; 2-4 concurrent
    streams from the official OpenAI client (different prompts, started
    at different times) each equal their solo answer; the passes were
    shared (/metrics k3_daemon_pass_width_mean > 1); a fifth and sixth
    request with seats and queue full get 429 with Retry-After."""
    import threading
    prompts = ["Hello! Who are you?", "Count to ten, please.", "What is the capital of France?",
               "Write one word."]
    with real_k3d("k3gw-par-", ["--threads", "1", "--parallel", "4", "--queue", "0"]) as (s, _, _):
        solo = {}
        for p in prompts:
            r = chat(s, messages=[{"role": "user", "content": p}], max_tokens=40, reasoning_effort="none")
            solo[p] = r.choices[0].message.content
        for n in (2, 3, 4):
            got, errs = {}, []

            def one(k, p):
                try:
                    time.sleep(0.01 * k)
                    chunks = list(chat(s, messages=[{"role": "user", "content": p}], max_tokens=40,
                                       reasoning_effort="none", stream=True))
                    got[p] = joined(chunks, "content")
                except Exception as e:    # reported below
                    errs.append(repr(e))
            th = [threading.Thread(target=one, args=(k, p)) for k, p in enumerate(prompts[:n])]
            for t in th:
                t.start()
            for t in th:
                t.join(120)
            assert not errs, errs
            for p in prompts[:n]:
                assert got[p] == solo[p], (n, p, got[p], solo[p])
        text = s.raw("GET", "/metrics")[2].decode()
        vals = dict(ln.split(" ", 1) for ln in text.splitlines() if ln.startswith("k3_daemon_pass"))
        assert float(vals["k3_daemon_pass_width_mean"]) > 1.0, vals
        assert "k3_daemon_parallel 4" in text.splitlines()
        # four long streams hold every seat: the next request is 429
        cl = s.client()
        streams = [cl.completions.create(model="m", prompt="Hi", max_tokens=4000, stream=True)
                   for _ in range(4)]
        its = [iter(x) for x in streams]
        for it in its:
            next(it)
        with pytest.raises(openai.RateLimitError) as ei:
            cl.completions.create(model="m", prompt="Hi", max_tokens=1)
        assert ei.value.response.headers["retry-after"]
        for x in streams:
            x.close()

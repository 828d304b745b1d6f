"""Conformance of k3-gateway with real OpenAI clients (the official `openai`
SDK and `langchain-openai`) and raw bytes, against the scripted fake k3d.
Case numbers refer to docs/k3-gateway.md, "Conformance cases"."""
import json
import select
import socket
import threading
import time

import openai
import pytest

from gwharness import Stack, fake_msg, raw_stream_socket, read_until, sse_events

CORS_ORIGIN = "http://127.0.0.1:9"
MAX_BODY = 1 << 20
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def st():
    with Stack(gw_args=["--keepalive", "1", "--max-body", str(MAX_BODY), "--cors", CORS_ORIGIN,
                        "--retry-after", "2"]) as s:
        yield s


def chat(st, **kw):
    kw.setdefault("model", "anything")
    kw.setdefault("messages", HI)
    return st.client().chat.completions.create(**kw)


def last_generate(st):
    return st.fake.events("generate")[-1]["fields"]


def assert_error_shape(status, hd, body, want_status):
    assert status == want_status, body
    assert hd["content-type"] == "application/json"
    assert hd["x-request-id"].startswith("req_")
    e = json.loads(body)["error"]
    assert set(e) == {"message", "type", "param", "code"}
    return e


# ---- A. HTTP surface ------------------------------------------------------

def test_models_list_and_retrieve(st):                           # T01 T02
    page = st.client().models.list()
    assert [m.id for m in page.data] == ["kimi-k3-fake"]
    m = page.data[0]
    assert m.object == "model" and isinstance(m.created, int) and m.owned_by == "k3d"
    assert st.client().models.retrieve("kimi-k3-fake").id == "kimi-k3-fake"
    with pytest.raises(openai.NotFoundError) as ei:
        st.client().models.retrieve("gpt-4o")
    assert ei.value.code == "model_not_found"


def test_double_slash_and_trailing_slash(st):
    for path in ("/v1//models", "//v1/models/", "/v1/models/"):
        status, hd, body = st.raw("GET", path)
        assert status == 200, path
        assert json.loads(body)["data"][0]["id"] == "kimi-k3-fake"


def test_unknown_path_and_wrong_method(st):                      # T04 T05
    e = assert_error_shape(*st.raw("POST", "/v1/chat/completion", {}), 404)
    assert e["message"] == "Invalid URL (POST /v1/chat/completion)"
    assert_error_shape(*st.raw("GET", "/v1/nope"), 404)
    status, hd, body = st.raw("GET", "/v1/chat/completions")
    assert_error_shape(status, hd, body, 405)
    assert hd["allow"] == "POST, OPTIONS"
    status, hd, body = st.raw("DELETE", "/v1/models")
    assert_error_shape(status, hd, body, 405)
    with pytest.raises(openai.NotFoundError):
        st.client().post("/chat/completion", body={}, cast_to=object)


def test_request_ids_unique(st):                                 # T08
    ids = set()
    for path in ("/v1/models", "/nope", "/health"):
        ids.add(st.raw("GET", path)[1]["x-request-id"])
    c = chat(st)
    ids.add(c._request_id)
    assert len(ids) == 4


def test_cors(st):                                               # T06 T07
    want = ("authorization,content-type,x-stainless-arch,x-stainless-lang,x-stainless-os,"
            "x-stainless-package-version,x-stainless-retry-count,x-stainless-runtime,"
            "x-stainless-runtime-version")
    status, hd, _ = st.raw("OPTIONS", "/v1/chat/completions", headers={
        "Origin": CORS_ORIGIN, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": want, "Content-Type": None})
    assert status == 204
    assert hd["access-control-allow-origin"] == CORS_ORIGIN
    assert hd["access-control-allow-headers"] == want
    assert "POST" in hd["access-control-allow-methods"]
    status, hd, _ = st.raw("POST", "/v1/chat/completions", {"model": "m", "messages": HI},
                           headers={"Origin": CORS_ORIGIN})
    assert status == 200 and hd["access-control-allow-origin"] == CORS_ORIGIN
    assert "x-request-id" in hd["access-control-expose-headers"]
    status, hd, _ = st.raw("GET", "/v1/models", headers={"Origin": "http://evil.example"})
    assert status == 200 and "access-control-allow-origin" not in hd


# ---- B. parsing and validation --------------------------------------------

def test_malformed_json(st):                                     # T11 T12
    for body in ('{"model":', "", "[]", '"x"'):
        e = assert_error_shape(*st.raw("POST", "/v1/chat/completions", body), 400)
        assert e["type"] == "invalid_request_error"
    e = assert_error_shape(*st.raw("POST", "/v1/chat/completions", '{"model":'), 400)
    assert e["param"] is None


def test_invalid_utf8_refused(st):                               # T15
    body = b'{"model":"m","messages":[{"role":"user","content":"\xff\xfe"}]}'
    assert_error_shape(*st.raw("POST", "/v1/chat/completions", body), 400)


def test_content_type(st):                                       # T13 T72
    ok = json.dumps({"model": "m", "messages": HI})
    for ct in ("text/plain", "application/x-www-form-urlencoded", None):
        e = assert_error_shape(*st.raw("POST", "/v1/chat/completions", ok, {"Content-Type": ct}), 415)
        assert e["code"] == "unsupported_media_type"
    for ct in ("application/json; charset=utf-8", "Application/JSON"):
        assert st.raw("POST", "/v1/chat/completions", ok, {"Content-Type": ct})[0] == 200


def test_oversized_body(st):                                     # T14
    pad = "x" * (3 * MAX_BODY)
    for extra in (1, MAX_BODY):
        body = json.dumps({"model": "m", "messages": HI, "user": ""})
        body = body[:-2] + pad[:MAX_BODY + extra - len(body)] + '"}'
        assert len(body) == MAX_BODY + extra
        e = assert_error_shape(*st.raw("POST", "/v1/chat/completions", body), 413)
        assert "--max-body" in e["message"]
    # Past twice the limit (+1 MiB) libevent refuses on its own, before
    # reading the body: still a 413, but its body is not JSON (documented).
    status, hd, body = st.raw("POST", "/v1/chat/completions", pad + pad)
    assert status == 413
    assert chat(st).choices[0].message.content == "Hello from fake k3d."


CHUNKED_POST = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Transfer-Encoding: chunked\r\n")
CHAT_BODY = json.dumps({"model": "m", "messages": HI}).encode()


def chunk_encode(data, pieces=3, ext=b"", eol=b"\r\n", trailers=b""):
    """data as a chunked body in `pieces` chunks, each size line followed
    by ext (e.g. b";a=1"), lines ended by eol, then the trailer lines."""
    step = -(-len(data) // pieces)
    out = b""
    for i in range(0, len(data), step):
        part = data[i:i + step]
        out += b"%x" % len(part) + ext + eol + part + eol
    return out + b"0" + ext + eol + trailers + eol


def http_replies(buf):
    """The HTTP/1.1 responses in buf (each with Content-Length), in order:
    (status, lower-case headers, body)."""
    out = []
    while buf:
        head, _, rest = buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        hd = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
        n = int(hd["content-length"])
        out.append((int(lines[0].split()[1]), hd, rest[:n]))
        buf = rest[n:]
    return out


def send_and_read(st, data, bytewise=False):
    """Sends data on one connection (at once, or a byte at a time so the
    gateway reads it in as many pieces) and reads every reply to EOF."""
    s = socket.create_connection(("127.0.0.1", st.port), timeout=10)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = b""
    try:
        if bytewise:
            for i in range(len(data)):
                while select.select([s], [], [], 0)[0]:
                    got = s.recv(65536)
                    buf += got
                    if not got:
                        break
                if b"HTTP/1.1 400 " in buf:
                    break   # it closes after a 400: the rest is never read
                s.sendall(data[i:i + 1])
                time.sleep(0.001)
        else:
            s.sendall(data)
        buf += read_until(s, b"\x00", timeout=15)
    except (BrokenPipeError, ConnectionResetError):
        pass   # only after the 400 (the assertions see what had arrived)
    s.close()
    return http_replies(buf)


def assert_chunked_400(reply):
    status, hd, body = reply
    e = assert_error_shape(status, hd, body, 400)
    assert e["type"] == "invalid_request_error" and e["param"] is None
    assert "chunked framing is malformed" in e["message"]
    assert hd["connection"] == "close"
    return e


MALFORMED_CHUNKED = [                                            # T73
    (b"zz\r\nabc\r\n0\r\n\r\n", "not a hexadecimal number"),
    (b"1G\r\n{\r\n0\r\n\r\n", "not a hexadecimal number"),
    (b"-1\r\n{\r\n0\r\n\r\n", "not a hexadecimal number"),
    (b"0x1\r\n{\r\n0\r\n\r\n", "not a hexadecimal number"),
    (b"1 x\r\n{\r\n0\r\n\r\n", "not a ';' extension"),
    (b"3\r\nabcXY0\r\n\r\n", "longer than its chunk size"),
    (b"3\r\nabc\rX0\r\n\r\n", "CR without LF"),
    (b"8000000000000000\r\n", "63 bits"),
    (b"1;" + b"a" * 4096 + b"\r\n{\r\n0\r\n\r\n", "longer than 4096 bytes"),
    (b"0\r\nBad Name: v\r\n\r\n", "without ':'"),
    (b"0\r\nA: b\r\n c\r\n\r\n", "folded trailer"),
]


@pytest.mark.parametrize("body,why", MALFORMED_CHUNKED, ids=lambda x: repr(x)[:24])
def test_malformed_chunked_body_is_400(st, body, why):           # T73
    """A malformed chunked body is a 400 with the gateway's JSON error (not
    libevent's HTML 413), then the connection closes; k3d never hears of it."""
    n = len(st.fake.events("generate"))
    replies = send_and_read(st, CHUNKED_POST + b"\r\n" + body)
    assert len(replies) == 1
    assert why in assert_chunked_400(replies[0])["message"]
    assert len(st.fake.events("generate")) == n
    assert chat(st).choices[0].finish_reason == "stop"


@pytest.mark.parametrize("kw", [{}, {"pieces": 1}, {"ext": b";a=1;b=\"x;y\""}, {"ext": b" "},
                                {"eol": b"\n"}, {"trailers": b"X-Trailer: 1\r\nEmpty:\r\n"}],
                         ids=["chunks", "one", "extensions", "blank", "lf", "trailers"])
def test_chunked_body_accepted(st, kw):                          # T73
    """Well-formed chunked bodies reach k3d whole, chunk extensions too
    (libevent refuses those on its own: the gateway cuts them first)."""
    data = CHUNKED_POST + b"Connection: close\r\n\r\n" + chunk_encode(CHAT_BODY, **kw)
    replies = send_and_read(st, data)
    assert [r[0] for r in replies] == [200]
    assert json.loads(replies[0][2])["choices"][0]["message"]["content"] == "Hello from fake k3d."
    assert last_generate(st)["messages"] == HI


@pytest.mark.parametrize("bytewise", [False, True], ids=["one-read", "byte-by-byte"])
def test_chunked_keep_alive_pipelined(st, bytewise):             # T73
    """Pipelined on one keep-alive connection: two good chunked requests
    (one with extensions) are answered in order, then the malformed third
    gets its 400 and the connection closes; whether the gateway reads it
    all at once or a byte at a time."""
    good = CHUNKED_POST + b"\r\n" + chunk_encode(CHAT_BODY)
    ext = CHUNKED_POST + b"\r\n" + chunk_encode(CHAT_BODY, ext=b";x=1")
    bad = CHUNKED_POST + b"\r\n" + chunk_encode(CHAT_BODY)[:20] + b"zz\r\n"
    after = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
    replies = send_and_read(st, good + ext + bad + after, bytewise=bytewise)
    assert [r[0] for r in replies] == [200, 200, 400]
    assert_chunked_400(replies[2])
    for status, hd, body in replies[:2]:
        assert json.loads(body)["choices"][0]["message"]["content"] == "Hello from fake k3d."


def test_unknown_parameter(st):                                  # T22
    for key in ("foo", "top_k"):
        with pytest.raises(openai.BadRequestError) as ei:
            chat(st, extra_body={key: 1})
        assert ei.value.param == key and ei.value.code == "unknown_parameter"


def test_messages_validation(st):                                # T16-T19
    cases = [
        ({"messages": HI}, "model"),
        ({"model": "m"}, "messages"),
        ({"model": "m", "messages": []}, "messages"),
        ({"model": "m", "messages": [{"role": "bot", "content": "x"}]}, "messages.[0].role"),
        ({"model": "m", "messages": [{"role": "user"}]}, "messages.[0].content"),
        ({"model": "m", "messages": [{"role": "user", "content": 42}]}, "messages.[0].content"),
    ]
    for body, param in cases:
        e = assert_error_shape(*st.raw("POST", "/v1/chat/completions", body), 400)
        assert e["param"] == param, (body, e)


def test_accepted_message_forms(st):                             # T21 T59
    msgs = [
        {"role": "developer", "content": "be brief"},
        {"role": "system", "content": [{"type": "text", "text": "sys"}]},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
         "name": "u"},
        {"role": "assistant", "content": "", "reasoning_content": "thought"},
        {"role": "assistant", "content": None, "reasoning": "r2"},
        {"role": "user", "content": "go on"},
    ]
    c = chat(st, messages=msgs)
    assert c.choices[0].message.content == "Hello from fake k3d."
    sent = last_generate(st)["messages"]
    assert sent[0] == {"role": "system", "content": "be brief"}
    assert sent[2]["content"] == [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert sent[3]["reasoning_content"] == "thought"
    assert sent[4] == {"role": "assistant", "content": None, "reasoning_content": "r2"}


def test_null_means_absent(st):                                  # T28
    c = chat(st, extra_body={"temperature": None, "n": None, "stop": None, "max_tokens": None},
             user="u")
    assert c.choices[0].finish_reason == "stop"


def test_wrong_types(st):                                        # T23 T24
    for key, val in (("max_tokens", "10"), ("stream", "true"), ("stop", 5), ("temperature", "0")):
        with pytest.raises(openai.BadRequestError) as ei:
            chat(st, extra_body={key: val})
        assert ei.value.param == key and ei.value.code == "invalid_type", key
    for key, val in (("max_tokens", -1), ("max_tokens", 0), ("max_completion_tokens", 0)):
        with pytest.raises(openai.BadRequestError) as ei:
            chat(st, extra_body={key: val})
        assert ei.value.code == "integer_below_min_value"


def test_max_tokens_policy(st):                                  # T25 T39
    with pytest.raises(openai.BadRequestError) as ei:
        chat(st, max_tokens=5, max_completion_tokens=7)
    assert ei.value.param == "max_tokens"
    c = chat(st, max_tokens=2)
    assert last_generate(st)["max_new"] == 2
    assert c.choices[0].finish_reason == "length" and c.usage.completion_tokens == 2
    assert c.choices[0].message.content == "Hello from"
    chat(st, max_completion_tokens=3)
    assert last_generate(st)["max_new"] == 3
    chat(st, max_tokens=4, max_completion_tokens=4)
    assert last_generate(st)["max_new"] == 4
    chat(st)
    assert "max_new" not in last_generate(st)


def test_stream_options_without_stream(st):                      # T27
    with pytest.raises(openai.BadRequestError) as ei:
        chat(st, stream_options={"include_usage": True})
    assert ei.value.param == "stream_options"


# ---- C. greedy-only and feature refusals ----------------------------------

def test_greedy_accepted_values_change_nothing(st):              # T29 T32 T34
    texts = set()
    for kw in ({}, {"temperature": 0}, {"temperature": 0.0}, {"top_p": 1}, {"n": 1}, {"seed": 42},
               {"presence_penalty": 0}, {"frequency_penalty": 0}, {"logit_bias": {}}):
        texts.add(chat(st, **kw).choices[0].message.content)
    assert texts == {"Hello from fake k3d."}


@pytest.mark.parametrize("kw,param,code", [
    ({"temperature": 0.7}, "temperature", "unsupported_value"),
    ({"temperature": 3}, "temperature", "decimal_above_max_value"),
    ({"temperature": -1}, "temperature", "decimal_below_min_value"),
    ({"n": 2}, "n", "unsupported_value"),
    ({"n": 0}, "n", "integer_below_min_value"),
    ({"top_p": 1.5}, "top_p", "decimal_above_max_value"),
    ({"presence_penalty": 0.5}, "presence_penalty", "unsupported_value"),
    ({"frequency_penalty": -0.5}, "frequency_penalty", "unsupported_value"),
    ({"logit_bias": {"1": 5}}, "logit_bias", "unsupported_parameter"),
    ({"logprobs": True}, "logprobs", "unsupported_value"),
    ({"top_logprobs": 2}, "top_logprobs", "unsupported_parameter"),
    ({"seed": "x"}, "seed", "invalid_type"),
    ({"store": True}, "store", "unsupported_value"),
    ({"modalities": ["text", "audio"]}, "modalities", "unsupported_value"),
    ({"reasoning_effort": "medium"}, "reasoning_effort", "unsupported_value"),
    ({"reasoning_effort": "ultra"}, "reasoning_effort", "unsupported_value"),
    ({"tool_choice": "none"}, "tool_choice", "invalid_value"),
    ({"functions": [{"name": "f"}]}, "functions", "unsupported_parameter"),
    ({"response_format": {"type": "xml"}}, "response_format.type", "invalid_value"),
])
def test_refusals(st, kw, param, code):                          # T30 T31 T33 T35-T37 T57
    with pytest.raises(openai.BadRequestError) as ei:
        chat(st, extra_body=kw)
    e = ei.value
    assert e.status_code == 400 and e.param == param and e.code == code and e.type == "invalid_request_error"


def test_images_refused(st):                                     # T20
    for part in ({"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}},
                 {"type": "input_audio", "input_audio": {"data": "AA==", "format": "wav"}},
                 {"type": "file", "file": {"file_id": "f"}}):
        msgs = [{"role": "user", "content": [{"type": "text", "text": "hi"}, part]}]
        with pytest.raises(openai.BadRequestError) as ei:
            chat(st, messages=msgs)
        assert ei.value.param == "messages.[0].content.[1].type"
        assert ei.value.body["message"] == \
            "Invalid content type. %s is only supported by certain models." % part["type"]


def test_response_format_forwarded(st):                          # T36
    chat(st, response_format={"type": "text"})
    assert "response_format" not in last_generate(st)
    chat(st, response_format={"type": "json_object"})
    assert last_generate(st)["response_format"] == {"type": "json_object"}
    rf = {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object"}}}
    chat(st, response_format=rf)
    assert last_generate(st)["response_format"] == rf


# ---- D. non-streaming -------------------------------------------------------

def test_non_stream_shape(st):                                   # T38
    c = chat(st)
    assert c.id.startswith("chatcmpl-") and c.object == "chat.completion"
    assert abs(c.created - time.time()) < 5 and c.model == "kimi-k3-fake"
    ch = c.choices[0]
    assert len(c.choices) == 1 and ch.index == 0 and ch.logprobs is None
    assert ch.message.role == "assistant" and ch.message.refusal is None
    u = c.usage
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens and u.completion_tokens == 5
    assert u.completion_tokens_details.reasoning_tokens == 0
    assert u.prompt_tokens_details.cached_tokens == 0


def test_context_overflow(st):                                   # T41 T50
    script = {"reject": {"status": "CONTEXT_EXCEEDED", "param": "messages",
                         "message": "This model's maximum context length is 4096 tokens. However, your "
                                    "messages resulted in 5000 tokens."}}
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as ei:
            chat(st, messages=fake_msg(script), stream=stream)
        assert ei.value.code == "context_length_exceeded"
        assert "maximum context length" in ei.value.message
    status, hd, body = st.raw("POST", "/v1/chat/completions",
                              {"model": "m", "messages": fake_msg(script), "stream": True})
    assert status == 400 and hd["content-type"] == "application/json" and not body.startswith(b"data:")
    from langchain_core.exceptions import ContextOverflowError
    from langchain_openai import ChatOpenAI
    lc = ChatOpenAI(model="m", api_key="sk-dummy", base_url=st.base + "/v1", max_retries=0)
    with pytest.raises(ContextOverflowError):
        lc.invoke("#fake " + json.dumps(script))


def test_stream_validation_error_is_plain_400(st):               # T50
    status, hd, body = st.raw("POST", "/v1/chat/completions",
                              {"model": "m", "messages": HI, "stream": True, "temperature": 0.9})
    assert status == 400 and hd["content-type"] == "application/json"
    assert json.loads(body)["error"]["param"] == "temperature"


# ---- E. streaming -----------------------------------------------------------

def test_sse_bytes_exact(st):                                    # T43
    status, hd, body = st.raw("POST", "/v1/chat/completions", {"model": "m", "messages": HI, "stream": True})
    assert status == 200
    assert hd["content-type"] == "text/event-stream; charset=utf-8"
    assert hd["cache-control"] == "no-cache" and hd["x-request-id"].startswith("req_")
    events = sse_events(body)
    assert events[-1] == "data: [DONE]"
    assert body.endswith(b"\n\ndata: [DONE]\n\n")
    datas = [json.loads(e[6:]) for e in events[:-1] if e.startswith("data: ")]
    assert datas[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    ids = {d["id"] for d in datas}
    assert len(ids) == 1 and ids.pop().startswith("chatcmpl-")
    for d in datas:
        assert list(d) == ["id", "object", "created", "model", "choices"]   # no usage key unasked
        assert d["object"] == "chat.completion.chunk"
        assert list(d["choices"][0]) == ["index", "delta", "logprobs", "finish_reason"]
    assert [d["choices"][0]["finish_reason"] for d in datas] == [None] * (len(datas) - 1) + ["stop"]
    assert datas[-1]["choices"][0]["delta"] == {}
    assert "".join(d["choices"][0]["delta"].get("content", "") for d in datas) == "Hello from fake k3d."


def test_stream_with_sdk_and_usage(st):                          # T44 T45
    chunks = list(chat(st, stream=True, stream_options={"include_usage": True}))
    body = [c for c in chunks if c.choices]
    assert body[0].choices[0].delta.role == "assistant"
    assert len({c.id for c in chunks}) == 1 and len({c.created for c in chunks}) == 1
    finals = [c for c in body if c.choices[0].finish_reason is not None]
    assert len(finals) == 1 and finals[0] is body[-1]
    assert all(c.usage is None for c in body)
    last = chunks[-1]
    assert last.choices == [] and last.usage.total_tokens == last.usage.prompt_tokens + 5
    # without include_usage: no usage chunk, no usage key
    chunks = list(chat(st, stream=True))
    assert all(c.choices for c in chunks)
    assert all("usage" not in c.model_dump(exclude_unset=True) for c in chunks)


def test_stream_equals_non_stream(st):                           # T46 T47
    msgs = fake_msg({"tokens": [{"r": "think "}, {"r": "hard"}, "The", " answer", " is", " 42."]})
    c = chat(st, messages=msgs)
    chunks = list(chat(st, messages=msgs, stream=True, stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == c.choices[0].message.content == "The answer is 42."
    assert chunks[-1].usage.model_dump() == c.usage.model_dump()
    with st.client().chat.completions.stream(model="m", messages=msgs) as s:
        final = s.get_final_completion()
    assert final.choices[0].message.role == "assistant"
    assert final.choices[0].message.content == "The answer is 42."


def test_utf8_split_across_tokens(st):                           # T48
    emoji = "\U0001F600".encode()
    toks = [{"hex": emoji[i:i + 1].hex()} for i in range(4)] + ["\u9f9c"] + \
           [{"hex": "e9"}, {"hex": "be9c"}] + [{"hex": "f0"}, {"hex": "9f"}, {"hex": "ab"}, {"hex": "a0"}]
    msgs = fake_msg({"tokens": toks})
    status, hd, body = st.raw("POST", "/v1/chat/completions", {"model": "m", "messages": msgs, "stream": True})
    events = sse_events(body)
    pieces = []
    for e in events[:-1]:
        d = json.loads(e[6:])                      # every event parses on its own
        pieces.append(d["choices"][0]["delta"].get("content", ""))
    joined = "".join(pieces)
    assert joined == "\U0001F600\u9f9c\u9f9c\U0001FAE0"
    assert "\ufffd" not in joined
    assert chat(st, messages=msgs).choices[0].message.content == joined


def test_model_output_is_bytes_nul_included(st):                 # T48, issue 16
    """Model output reaches the client byte for byte: a U+0000 (as "\\u0000"),
    a lone continuation byte (k3d's detokenizer sends U+FFFD for it) and a
    4-byte character split across tokens, in chat and legacy completions,
    streamed and not, in reasoning and in tool-call arguments. Every SSE
    event parses on its own."""
    emoji = "\U0001F600".encode()
    toks = ["a\u0000b", {"hex": "80"}] + [{"hex": emoji[i:i + 1].hex()} for i in range(4)] + ["c\u0000"]
    want = "a\u0000b\ufffd\U0001F600c\u0000"

    def stream_pieces(path, body, field):
        status, hd, raw = st.raw("POST", path, dict(body, stream=True))
        assert status == 200 and b"\\u0000" in raw, raw
        events = sse_events(raw)
        assert events[-1] == "data: [DONE]", events
        out = {}
        for e in events[:-1]:
            ch = json.loads(e[6:])["choices"][0]              # every event parses on its own
            for k in field:
                out[k] = out.get(k, "") + (ch.get("delta", ch).get(k) or "")
        return out

    msgs = fake_msg({"tokens": [{"r": "r\u0000"}, {"r": "s"}] + toks})
    m = chat(st, messages=msgs).choices[0].message
    assert (m.content, m.model_extra["reasoning_content"]) == (want, "r\u0000s")
    got = stream_pieces("/v1/chat/completions", {"model": "m", "messages": msgs},
                        ("content", "reasoning_content"))
    assert got == {"content": want, "reasoning_content": "r\u0000s"}, got
    prompt = "#fake " + json.dumps({"tokens": toks})
    assert st.client().completions.create(model="m", prompt=prompt).choices[0].text == want
    assert stream_pieces("/v1/completions", {"model": "m", "prompt": prompt}, ("text",)) == {"text": want}
    # tool-call arguments, the NUL inside the first of two deltas
    args = '{"q": "x\u0000y"}'
    calls = fake_msg({"finish": "tool_calls", "tokens": [
        {"tool": {"index": 0, "id": "call_n", "name": "get_weather", "arguments": args[:10]}},
        {"tool": {"index": 0, "arguments": args[10:]}}]})
    c = chat(st, messages=calls, tools=TOOLS)
    assert c.choices[0].message.tool_calls[0].function.arguments == args
    with st.client().chat.completions.stream(model="m", messages=calls, tools=TOOLS) as s:
        assert s.get_final_completion().choices[0].message.tool_calls[0].function.arguments == args


def test_history_with_nul_reaches_k3d(st):                      # T48, issue 16
    """The second turn resends the first turn's reply, U+0000 and all: its
    content, reasoning and tool-call arguments, the tool's answer and a new
    user message reach k3d byte for byte, and so do a stop string and a
    legacy prompt holding one (the body is parsed with "\\u0000" allowed,
    and no field is cut at it)."""
    args = '{"city": "x\u0000y"}'
    first = fake_msg({"finish": "tool_calls", "tokens": [
        {"r": "r\u0000"}, "c\u0000", {"tool": {"index": 0, "id": "call_n", "name": "get_weather",
                                             "arguments": args}}]})
    m = chat(st, messages=first, tools=TOOLS).choices[0].message
    assert (m.content, m.model_extra["reasoning_content"]) == ("c\u0000", "r\u0000")
    assert m.tool_calls[0].function.arguments == args
    turn1 = {"role": "assistant", "content": m.content, "reasoning_content": m.model_extra["reasoning_content"],
             "tool_calls": [{"id": m.tool_calls[0].id, "type": "function",
                             "function": {"name": "get_weather", "arguments": m.tool_calls[0].function.arguments}}]}
    history = first + [turn1, {"role": "tool", "tool_call_id": "call_n", "content": "sunny\u0000"},
                       {"role": "user", "content": "and\u0000 then?"}]
    c = chat(st, messages=history, tools=TOOLS, stop=["\u0000end"])
    assert c.choices[0].message.content == "Hello from fake k3d."
    sent = last_generate(st)
    assert sent["messages"][1:] == [
        {"role": "assistant", "content": "c\u0000", "reasoning_content": "r\u0000",
         "tool_calls": [{"id": "call_n", "type": "function", "function": {"name": "get_weather", "arguments": args}}]},
        {"role": "tool", "content": "sunny\u0000", "tool_call_id": "call_n"},
        {"role": "user", "content": "and\u0000 then?"}], sent["messages"]
    assert sent["stop"] == ["\u0000end"]
    # the arguments also as an object (sent as its JSON text), and a raw prompt
    history[1]["tool_calls"][0]["function"]["arguments"] = {"city": "x\u0000y"}
    chat(st, messages=history, tools=TOOLS)
    assert last_generate(st)["messages"][1]["tool_calls"][0]["function"]["arguments"] == \
        '{"city":"x\\u0000y"}'
    st.client().completions.create(model="m", prompt="p\u0000q")
    assert last_generate(st)["prompt"] == "p\u0000q"
    # a role is a word: "user\u0000x" is none of them
    e = assert_error_shape(*st.raw("POST", "/v1/chat/completions",
                                   {"model": "m", "messages": [{"role": "user\u0000x", "content": "a"}]}), 400)
    assert e["param"] == "messages.[0].role"


def test_invalid_utf8_from_k3d_is_an_error(st):
    """A TOKEN whose text is not UTF-8 (a broken k3d; the protocol's STR
    fields refuse it) never reaches the client as bytes: the stream ends
    with a parseable error event, a plain request gets a 500 JSON error,
    and the next request is served."""
    msgs = fake_msg({"tokens": ["ok", {"unchecked_hex": "6180"}, "never"]})
    status, hd, raw = st.raw("POST", "/v1/chat/completions", {"model": "m", "messages": msgs, "stream": True})
    events = sse_events(raw)
    assert "data: [DONE]" not in events and "never" not in raw.decode(), events
    err = json.loads(events[-1][6:])["error"]
    assert err["type"] == "server_error" and "bad frame from k3d" in err["message"], err
    assert "".join(json.loads(e[6:])["choices"][0]["delta"].get("content", "") for e in events[:-1]) == "ok"
    e = assert_error_shape(*st.raw("POST", "/v1/chat/completions", {"model": "m", "messages": msgs}), 500)
    assert "bad frame from k3d" in e["message"], e
    assert chat(st).choices[0].message.content == "Hello from fake k3d."


def test_long_error_texts_stay_json(st):
    """An error text cut to its buffer (k3d's message, a client's key or
    role) never ends in half a UTF-8 character: the client gets the 400
    with a valid message, not a 500 "out of memory" (the cut used to make
    jansson refuse the whole body)."""
    for n in range(1000, 1012):     # the cut falls on every byte of a 2-byte character
        script = {"reject": {"status": "INVALID_ARGUMENT", "param": "stop", "message": "x" * n + "\u00e9" * 40}}
        e = assert_error_shape(*st.raw("POST", "/v1/chat/completions", {"model": "m", "messages": fake_msg(script)}),
                               400)
        assert e["message"].startswith("x" * n) and e["param"] == "stop", (n, e)
    for role in ("\u00e9" * 300, "x" + "\u00e9" * 300):
        e = assert_error_shape(*st.raw("POST", "/v1/chat/completions",
                                       {"model": "m", "messages": [{"role": role, "content": "x"}]}), 400)
        assert e["param"] == "messages.[0].role" and e["code"] == "invalid_value", e
    for key in ("\u00e9" * 100, "x" + "\u00e9" * 100):
        e = assert_error_shape(*st.raw("POST", "/v1/chat/completions", {"model": "m", "messages": HI, key: 1}), 400)
        assert e["code"] == "unknown_parameter" and key.startswith(e["param"]) and len(e["param"]) < len(key), e


def test_stop_string_straddling_tokens(st):                      # T49 T40
    toks = ["one", ",", " two", ", th", "ree", ", four", "."]
    full = "".join(toks)
    msgs = fake_msg({"tokens": toks})
    for stop, cut in ((", three", "one, two"), (["zzz", "e, f"], "one, two, thre"), (".", "one, two, three, four")):
        c = chat(st, messages=msgs, stop=stop)
        assert last_generate(st)["stop"] == (stop if isinstance(stop, list) else [stop])
        assert c.choices[0].message.content == cut and c.choices[0].finish_reason == "stop"
        chunks = list(chat(st, messages=msgs, stop=stop, stream=True))
        deltas = [ch.choices[0].delta.content or "" for ch in chunks]
        assert "".join(deltas) == cut
        assert chunks[-1].choices[0].finish_reason == "stop"
    assert chat(st, messages=msgs).choices[0].message.content == full
    with pytest.raises(openai.BadRequestError) as ei:
        chat(st, stop=["a", "b", "c", "d", "e"])
    assert ei.value.param == "stop"


def test_keepalive_during_silence(st):                           # T52
    msgs = fake_msg({"prefill": 1.3, "tokens": [{"sleep": 1.3}, "late"]})
    t0 = time.time()
    status, hd, body = st.raw("POST", "/v1/chat/completions", {"model": "m", "messages": msgs, "stream": True})
    events = sse_events(body)
    comments = [e for e in events if e.startswith(":")]
    assert len(comments) >= 2 and set(comments) == {": keep-alive"}
    assert time.time() - t0 >= 2.5
    msgs = fake_msg({"tokens": [{"sleep": 1.2}, "late"]})
    chunks = list(chat(st, messages=msgs, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "late"


def test_midstream_engine_error(st):                             # T51
    for bad in ({"error": "GPU fell off"}, {"crash": True}):
        msgs = fake_msg({"tokens": ["a", "b", bad, "c"]})
        got = []
        with pytest.raises(openai.APIError) as ei:
            for c in chat(st, messages=msgs, stream=True):
                got.append(c)
        assert not isinstance(ei.value, openai.APIStatusError)
        assert "".join(c.choices[0].delta.content or "" for c in got) == "ab"
        status, hd, body = st.raw("POST", "/v1/chat/completions", {"model": "m", "messages": msgs, "stream": True})
        events = sse_events(body)
        assert json.loads(events[-1][6:])["error"]["type"] == "server_error"
        assert "data: [DONE]" not in events
        assert chat(st).choices[0].finish_reason == "stop"           # next request served
    with pytest.raises(openai.InternalServerError):
        chat(st, messages=fake_msg({"tokens": ["a", {"error": "boom"}]}))


def test_legacy_completions(st):                                 # T42 T53
    c = st.client().completions.create(model="m", prompt="Hi")
    assert c.object == "text_completion" and c.id.startswith("cmpl-")
    assert c.choices[0].text == "Hello from fake k3d." and c.choices[0].logprobs is None
    g = last_generate(st)
    assert g["mode"] == 0 and g["prompt"] == "Hi" and g["max_new"] == 16
    c = st.client().completions.create(model="m", prompt=["Hi"], max_tokens=3)
    assert c.choices[0].finish_reason == "length" and last_generate(st)["max_new"] == 3
    for kw, param in (({"prompt": ["a", "b"]}, "prompt"), ({"prompt": "a", "echo": True}, "echo"),
                      ({"prompt": "a", "best_of": 2}, "best_of"), ({"prompt": "a", "suffix": "z"}, "suffix"),
                      ({"prompt": [1, 2]}, "prompt")):
        with pytest.raises(openai.BadRequestError) as ei:
            st.client().completions.create(model="m", **kw)
        assert ei.value.param == param
    chunks = list(st.client().completions.create(model="m", prompt="Hi", stream=True,
                                                 stream_options={"include_usage": True}))
    assert all(c.object == "text_completion" for c in chunks)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == "Hello from fake k3d."
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 5


# ---- F. reasoning --------------------------------------------------------------

def test_reasoning_split(st):                                    # T54 T55 T57 T58
    toks = [{"r": "Let me"}, {"r": " think."}, "Answer", ": yes"]
    msgs = fake_msg({"tokens": toks})
    c = chat(st, messages=msgs)
    m = c.choices[0].message
    assert m.content == "Answer: yes" and m.model_extra["reasoning_content"] == "Let me think."
    assert c.usage.completion_tokens_details.reasoning_tokens == 2 and c.usage.completion_tokens == 4
    chunks = [ch for ch in chat(st, messages=msgs, stream=True)]
    kinds = []
    for ch in chunks:
        d = ch.choices[0].delta.model_dump(exclude_none=True)
        if d.get("reasoning_content"):
            kinds.append("r")
        if d.get("content"):
            kinds.append("c")
    assert kinds == ["r", "r", "c", "c"]
    rs = "".join(ch.choices[0].delta.model_extra.get("reasoning_content") or "" for ch in chunks)
    assert rs == "Let me think."
    # a stop string that only appears in the reasoning does not cut it
    c = chat(st, messages=msgs, stop=["think"])
    assert c.choices[0].message.content == "Answer: yes"
    # reasoning_effort none -> thinking off
    c = chat(st, messages=msgs, reasoning_effort="none")
    assert last_generate(st)["thinking"] is False and last_generate(st)["reasoning_effort"] == 1
    assert "reasoning_content" not in (c.choices[0].message.model_extra or {})
    assert c.usage.completion_tokens_details.reasoning_tokens == 0
    chat(st, messages=msgs, reasoning_effort="high")
    assert last_generate(st)["reasoning_effort"] == 3 and "thinking" not in last_generate(st)
    # langchain reads reasoning_content from the raw message
    from langchain_openai import ChatOpenAI
    lc = ChatOpenAI(model="m", api_key="sk-dummy", base_url=st.base + "/v1", max_retries=0)
    out = lc.invoke(msgs[0]["content"])
    assert out.content == "Answer: yes"
    assert "".join(ch.content for ch in lc.stream(msgs[0]["content"])) == "Answer: yes"


def test_length_during_thinking(st):                             # T56
    c = chat(st, messages=fake_msg({"tokens": [{"r": "a"}, {"r": "b"}, {"r": "c"}, "x"]}), max_tokens=2)
    assert c.choices[0].finish_reason == "length" and c.choices[0].message.content == ""
    assert c.choices[0].message.model_extra["reasoning_content"] == "ab"


# ---- tools ---------------------------------------------------------------------

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "weather",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string"}}}}}]


def test_tools_round_trip(st):
    script = {"finish": "tool_calls", "tokens": [
        {"r": "need weather"},
        {"tool": {"index": 0, "id": "call_abc", "name": "get_weather", "arguments": "{\"ci"}},
        {"tool": {"index": 0, "arguments": "ty\": \"Oslo\"}"}},
        {"tool": {"index": 1, "id": "call_def", "name": "get_weather", "arguments": "{\"city\": \"Rome\"}"}},
    ]}
    msgs = fake_msg(script)
    c = chat(st, messages=msgs, tools=TOOLS, tool_choice="auto")
    g = last_generate(st)
    assert g["tools"] == TOOLS and g["tool_choice"] == "auto"
    ch = c.choices[0]
    assert ch.finish_reason == "tool_calls" and ch.message.content is None
    calls = ch.message.tool_calls
    assert [(t.id, t.type, t.function.name, json.loads(t.function.arguments)) for t in calls] == [
        ("call_abc", "function", "get_weather", {"city": "Oslo"}),
        ("call_def", "function", "get_weather", {"city": "Rome"})]
    # streamed: id/type/name once per call, arguments as deltas; the SDK helper assembles them
    with st.client().chat.completions.stream(model="m", messages=msgs, tools=TOOLS) as s:
        final = s.get_final_completion()
    fc = final.choices[0].message.tool_calls
    assert [(t.id, t.function.name, t.function.arguments) for t in fc] == [
        ("call_abc", "get_weather", "{\"city\": \"Oslo\"}"), ("call_def", "get_weather", "{\"city\": \"Rome\"}")]
    raw = list(chat(st, messages=msgs, tools=TOOLS, stream=True))
    deltas = [tc for r in raw for tc in (r.choices[0].delta.tool_calls or [])]
    assert [(d.index, d.id, d.type) for d in deltas] == [(0, "call_abc", "function"), (0, None, None),
                                                         (1, "call_def", "function")]
    # second turn: assistant tool_calls + tool results go to k3d in canonical form
    turn2 = [{"role": "user", "content": "weather in Oslo and Rome?"}] + [
        {"role": "assistant", "content": None, "tool_calls": [t.model_dump() for t in calls]},
        {"role": "tool", "tool_call_id": "call_abc", "content": "12C"},
        {"role": "tool", "tool_call_id": "call_def", "content": "20C"},
    ]
    c2 = chat(st, messages=turn2, tools=TOOLS)
    assert c2.choices[0].finish_reason == "stop"
    sent = last_generate(st)["messages"]
    assert sent[1]["tool_calls"][0] == {"id": "call_abc", "type": "function",
                                        "function": {"name": "get_weather",
                                                     "arguments": "{\"city\": \"Oslo\"}"}}
    assert sent[2] == {"role": "tool", "content": "12C", "tool_call_id": "call_abc"}
    # tools: [] is absent
    chat(st, tools=[])
    assert "tools" not in last_generate(st)
    with pytest.raises(openai.BadRequestError) as ei:
        chat(st, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert ei.value.param == "tool_choice"


# ---- G. concurrency, disconnects --------------------------------------------------

SLOW = fake_msg({"tokens": ["t%d " % i for i in range(200)], "delay": 0.02})


def create_retrying_429(st, **kw):
    """The close of an aborted request may reach the gateway a moment after
    the next request: allow a short grace (long enough for a loaded CI
    machine) before calling the slot leaked."""
    end = time.time() + 3.0
    while True:
        try:
            return chat(st, **kw)
        except openai.RateLimitError:
            if time.time() > end:
                raise
            time.sleep(0.02)


def test_busy_gives_429_before_body(st):                         # T60
    s = chat(st, messages=SLOW, stream=True)
    next(iter(s))
    with pytest.raises(openai.RateLimitError) as ei:
        chat(st, max_tokens=4)
    assert ei.value.response.headers["retry-after"] == "2"
    assert ei.value.code == "rate_limit_exceeded"
    assert ei.value.response.reason_phrase == "Too Many Requests"   # libevent alone: "Client Error"
    status, hd, body = st.raw("POST", "/v1/chat/completions", {"model": "m", "messages": HI, "stream": True})
    assert status == 429 and hd["content-type"] == "application/json" and hd["retry-after"] == "2"
    s.close()
    assert create_retrying_429(st).choices[0].finish_reason == "stop"


def test_disconnect_frees_slot_20_times(st):                     # T63
    st.fake.clear()
    for i in range(20):
        s = chat(st, messages=SLOW, stream=True)
        n = 0
        for _ in s:
            n += 1
            if n == 3:
                break
        s.close()
        c = create_retrying_429(st, max_tokens=2)
        assert c.choices[0].finish_reason == "length", i
    cancels = st.fake.events("cancel")
    assert len(cancels) == 20 and all(c["matched"] for c in cancels)


def test_disconnect_non_stream_and_killed_socket(st):            # T63 T64
    for stream in (False, True):
        st.fake.clear()
        s = raw_stream_socket(st.port, {"model": "m", "messages": SLOW, "stream": stream})
        if stream:
            assert b"data: " in read_until(s, b"t1 ")
        else:
            time.sleep(0.2)
        s.close()
        c = create_retrying_429(st, max_tokens=1)
        assert c.choices[0].finish_reason == "length"
        assert [e["matched"] for e in st.fake.events("cancel")] == [True]
    status, hd, body = st.raw("GET", "/metrics")
    assert b'k3_gateway_requests_total{endpoint="chat_completions",status="499"}' in body


def test_metrics(st):
    status, hd, body = st.raw("GET", "/metrics")
    text = body.decode()
    assert status == 200 and hd["content-type"].startswith("text/plain; version=0.0.4")
    for name in ("k3_gateway_tokens_total{kind=\"prompt\"}", "k3_gateway_tokens_total{kind=\"reasoning\"}",
                 "k3_gateway_prefill_seconds_total", "k3_gateway_decode_seconds_total",
                 "k3_daemon_queue_depth 0", "k3_daemon_expert_bytes_read_total 123456",
                 "k3_daemon_expert_cache_hit_ratio 0.750000", "k3_gateway_daemon_up 1",
                 # several sequences in one pass (STATUS 78-81; fake: --slots 1, 42 passes)
                 "k3_daemon_parallel 1", "k3_daemon_pass_width 0", "k3_daemon_pass_width_mean 1.500",
                 "k3_daemon_passes_total 42"):
        assert name in text, name
    # The expert store's counters from STATUS (fake: 123456 bytes over 64
    # positions, 3 hits, 1 miss, ...), each with HELP and TYPE lines.
    want = {
        "k3_expert_bytes_read_total": ("counter", "123456"),
        "k3_expert_positions_total": ("counter", "64"),
        "k3_expert_bytes_read_per_token": ("gauge", "1929.0"),
        "k3_expert_demand_hits_total": ("counter", "3"),
        "k3_expert_demand_misses_total": ("counter", "1"),
        "k3_expert_prefetch_issued_total": ("counter", "4"),
        "k3_expert_prefetch_issued_bytes_total": ("counter", "40960"),
        "k3_expert_prefetch_used_total": ("counter", "3"),
        "k3_expert_prefetch_wasted_bytes_total": ("counter", "10240"),
        "k3_expert_io_wait_seconds_total": ("counter", "0.250000"),
        "k3_expert_compute_seconds_total": ("counter", "1.750000"),
        "k3_expert_cache_bytes": ("gauge", "1048576"),
        # the streamed spine (issue 17): STATUS totals, per token = 640000 / 64
        "k3_spine_bytes_read_total": ("counter", "640000"),
        "k3_spine_bytes_read_per_token": ("gauge", "10000.0"),
        "k3_spine_loads_total": ("counter", "40"),
        "k3_spine_memory_bytes": ("gauge", "2097152"),
        # several drives (issue 19): totals and one series per drive
        "k3_expert_demand_bytes_total": ("counter", "100000"),
        "k3_expert_prefetch_used_bytes_total": ("counter", "13216"),
        "k3_expert_hedges_total": ("counter", "5"),
        "k3_expert_hedges_won_total": ("counter", "2"),
    }
    for name, kind, series in (
            ("k3_drive_expert_bytes_read_total", "counter", ['{drive="0"} 100000', '{drive="1"} 23456']),
            ("k3_drive_hedges_total", "counter", ['{drive="0"} 5', '{drive="1"} 0']),
            ("k3_drive_read_p95_seconds", "gauge", ['{drive="0"} 0.002500', '{drive="1"} 0.000000'])):
        assert "# TYPE %s %s" % (name, kind) in text.splitlines(), name
        for sv in series:
            assert name + sv in text.splitlines(), (name, sv)
    lines = text.splitlines()
    # spine and expert bytes of this gateway's generations, from their DONEs
    # (fake: 1000 expert and 5000 spine bytes per DONE)
    exp = [ln for ln in lines if ln.startswith("k3_gateway_expert_bytes_read_total ")]
    spn = [ln for ln in lines if ln.startswith("k3_gateway_spine_bytes_read_total ")]
    assert len(exp) == 1 and len(spn) == 1, (exp, spn)
    assert int(spn[0].split()[1]) == 5 * int(exp[0].split()[1]), (exp, spn)
    for name, (kind, value) in want.items():
        assert "# TYPE %s %s" % (name, kind) in lines, name
        assert any(ln.startswith("# HELP %s " % name) for ln in lines), name
        assert "%s %s" % (name, value) in lines, (name, [ln for ln in lines if ln.startswith(name)])
    # Exposition format: every sample's metric has a TYPE line before it.
    typed = set()
    for ln in lines:
        if ln.startswith("# TYPE "):
            typed.add(ln.split()[2])
        elif ln and not ln.startswith("#"):
            assert ln.split("{")[0].split()[0] in typed, ln


def test_metrics_tokens_of_delivered_replies_only():
    """k3_gateway_tokens_total counts the tokens of replies that reached their
    client (what their usage objects add up to); a stream whose client went
    away counts under k3_gateway_undelivered_tokens_total instead."""
    def metric(text, name):
        return [float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith(name + " ")]

    with Stack() as s:
        c = s.client().chat.completions.create(
            model="m", messages=fake_msg({"tokens": ["a", "b", "c"], "prompt_tokens": 7}))
        assert c.usage.prompt_tokens == 7 and c.usage.completion_tokens == 3, c.usage
        sock = raw_stream_socket(s.port, {"model": "m", "stream": True, "messages": fake_msg(
            {"tokens": ["t%d " % i for i in range(200)], "delay": 0.02, "prompt_tokens": 1000})})
        assert b"data: " in read_until(sock, b"t1 ")
        sock.close()
        end = time.time() + 10
        while time.time() < end:
            text = s.raw("GET", "/metrics")[2].decode()
            if metric(text, 'k3_gateway_undelivered_tokens_total{kind="prompt"}') == [1000]:
                break
            time.sleep(0.05)
        cancelled = [e for e in s.fake.events("done") if e["finish"] == "cancelled"]
        assert len(cancelled) == 1 and cancelled[0]["completion"] >= 2, cancelled
        lines = text.splitlines()
        assert 'k3_gateway_tokens_total{kind="prompt"} 7' in lines, text
        assert 'k3_gateway_tokens_total{kind="completion"} 3' in lines, text
        assert 'k3_gateway_undelivered_tokens_total{kind="prompt"} 1000' in lines, text
        assert 'k3_gateway_undelivered_tokens_total{kind="completion"} %d' % cancelled[0]["completion"] \
            in lines, text
        assert "# TYPE k3_gateway_undelivered_tokens_total counter" in lines
        # the HELP line says what is counted, each kind included (issue 16)
        assert ("# HELP k3_gateway_tokens_total Tokens in the usage of replies that reached their client "
                "(generations that ended stop, length or tool_calls), by kind: prompt, completion, reasoning "
                "(part of completion), cached_prompt (prompt tokens whose KV cache k3d reused instead of "
                "prefilling; part of prompt).") in lines, [ln for ln in lines if "HELP k3_gateway_tokens" in ln]


def test_metrics_status_timeout():
    """k3d accepts and answers HELLO but never STATUS: /metrics answers after
    --daemon-timeout instead of hanging, like a k3d that is down: 200 with the
    gateway's own metrics and k3_gateway_daemon_up 0."""
    with Stack(fake_args=["--status-hang"], gw_args=["--daemon-timeout", "1"]) as s:
        t0 = time.time()
        status, hd, body = s.raw("GET", "/metrics")
        took = time.time() - t0
        assert status == 200, (status, body)
        assert 0.9 <= took < 5, took
        assert hd["content-type"].startswith("text/plain")
        text = body.decode() if isinstance(body, bytes) else body
        assert "\nk3_gateway_daemon_up 0\n" in "\n" + text
        assert "\nk3_gateway_in_flight 0\n" in "\n" + text   # the scrape's own connection is not counted
        assert "k3_expert_bytes_read_total" not in text   # no STATUS, no k3d figures
        assert [e["ev"] for e in s.fake.events("status_ignored")] == ["status_ignored"]
        # the gateway closed its k3d connection
        deadline = time.time() + 5
        while time.time() < deadline and not s.fake.events("closed"):
            time.sleep(0.05)
        assert s.fake.events("closed")
        # the next scrape behaves the same (nothing leaked)
        status, _, body = s.raw("GET", "/metrics")
        assert status == 200
        status, _, body = s.raw("GET", "/health")
        assert status == 200


def test_health_states_and_idle_in_flight():
    """/health names each state k3d reports in HELLO_OK (a load balancer or
    an operator can tell loading from draining from no model), and an idle
    gateway's /metrics reads k3_gateway_in_flight 0: the probes' own k3d
    connections are not counted."""
    want = {
        "ready": (200, {"status": "ok", "model": "kimi-k3-fake"}),
        "draining": (503, {"status": "draining",
                           "error": "k3d is draining (shutting down or restarting) and takes no new requests"}),
        "no_model": (503, {"status": "no_model", "error": "k3d has no model loaded; start it with --model DIR"}),
    }
    for state, (code, body_want) in want.items():
        with Stack(fake_args=["--state", state], gw_args=["--retry-after", "7"]) as s:
            status, hd, body = s.raw("GET", "/health")
            assert (status, json.loads(body)) == (code, body_want), state
            assert ("retry-after" in hd) == (code == 503) and hd.get("retry-after", "7") == "7", (state, hd)
            if state != "ready":
                continue
            for _ in range(2):   # a scrape after a scrape and after /health
                status, _, body = s.raw("GET", "/metrics")
                lines = body.decode().splitlines()
                assert status == 200 and "k3_gateway_daemon_up 1" in lines
                assert "k3_gateway_in_flight 0" in lines, [ln for ln in lines if "in_flight" in ln]
            # a request in flight is counted, and released when it ends
            it = iter(s.client().chat.completions.create(
                model="m", messages=fake_msg({"tokens": ["a", {"sleep": 1}, "b"]}), stream=True))
            next(it)
            lines = s.raw("GET", "/metrics")[2].decode().splitlines()
            assert "k3_gateway_in_flight 1" in lines, [ln for ln in lines if "in_flight" in ln]
            assert "".join(ch.choices[0].delta.content or "" for ch in it) == "ab"
            lines = s.raw("GET", "/metrics")[2].decode().splitlines()
            assert "k3_gateway_in_flight 0" in lines, [ln for ln in lines if "in_flight" in ln]


def test_health_carries_k3d_status_text():
    """/health adds k3d's STATUS text as "k3d" (a streaming install's expert
    progress) for a ready and a loading k3d; the code still follows
    HELLO_OK, and a k3d without text, or one whose STATUS never comes, gets
    the plain answer (after --daemon-timeout), not an error."""
    text = "ready; streaming experts: 212 fetched (1.48 GB), 2 in flight, 0 shards verified, 0 failed"
    with Stack(fake_args=["--status-text", text]) as s:
        status, hd, body = s.raw("GET", "/health")
        assert (status, json.loads(body)) == (200, {"status": "ok", "model": "kimi-k3-fake", "k3d": text})
        assert "retry-after" not in hd
    with Stack(fake_args=["--state", "loading", "--status-text", "loading"],
               gw_args=["--retry-after", "7"]) as s:
        status, hd, body = s.raw("GET", "/health")
        assert (status, json.loads(body)) == (503, {
            "status": "loading", "error": "k3d is loading the model; retry after Retry-After seconds",
            "k3d": "loading"}), body
        assert hd["retry-after"] == "7"
    with Stack(fake_args=["--status-hang"], gw_args=["--daemon-timeout", "1"]) as s:
        status, hd, body = s.raw("GET", "/health", timeout=15)
        assert (status, json.loads(body)) == (200, {"status": "ok", "model": "kimi-k3-fake"}), body
        assert s.fake.events("status_ignored")
        deadline = time.time() + 5
        while time.time() < deadline and not s.fake.events("closed"):
            time.sleep(0.05)
        assert s.fake.events("closed"), "the probe's k3d connection is closed"


def test_health_handshake_hang():
    """k3d accepts the connection but never answers HELLO: /health answers
    503 unavailable once --daemon-timeout runs out (instead of hanging or
    claiming "loading"), and /metrics still answers 200 with
    k3_gateway_daemon_up 0 and k3_gateway_in_flight 0."""
    with Stack(fake_args=["--hello-hang"], gw_args=["--daemon-timeout", "1"]) as s:
        status, hd, body = s.raw("GET", "/health", timeout=15)
        assert status == 503 and hd["retry-after"] == "1", (status, body)
        assert json.loads(body) == {
            "status": "unavailable",
            "error": "k3d at '%s' accepted the connection but did not answer HELLO within 1 s; is k3d "
                     "running? (systemctl status k3d)" % s.sock}
        assert s.fake.events("hello_ignored")
        status, _, body = s.raw("GET", "/metrics", timeout=15)
        lines = body.decode().splitlines()
        assert status == 200 and "k3_gateway_daemon_up 0" in lines and "k3_gateway_in_flight 0" in lines


def test_health_user_not_allowed():
    """k3d refuses the gateway's uid (its allow list): /health and API
    requests name k3d's reason and the fix (--allow-uid/--allow-gid), not
    "is k3d running?"."""
    with Stack(fake_args=["--refuse-hello"]) as s:
        status, hd, body = s.raw("GET", "/health")
        assert status == 503, body
        assert json.loads(body) == {
            "status": "unavailable",
            "error": "k3d refused the connection: peer uid is not allowed by this k3d; k3d is running "
                     "but does not allow the gateway's user: add it with k3d --allow-uid or --allow-gid"}
        # an API request: the same sentence, and a code that says retrying will not help
        status, hd, raw = s.raw("POST", "/v1/chat/completions", {"model": "m", "messages": HI})
        err = assert_error_shape(status, hd, raw, 503)
        assert err["code"] == "unauthorized" and "--allow-uid" in err["message"], raw


def test_health_peer_hangs_up():
    """Something on k3d's socket accepts and closes without answering: /health
    says the peer closed the connection before answering HELLO, also when the
    close comes with the gateway's HELLO unread (the kernel reports that as
    ECONNRESET, which used to read "Connection reset by peer"), and an API
    request gets 503."""
    with Stack(start_fake=False) as s:
        ls = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        ls.bind(s.sock)
        ls.listen(8)

        def serve(n, wait_for_hello):
            for _ in range(n):
                c, _ = ls.accept()
                if wait_for_hello:
                    c.recv(1, socket.MSG_PEEK)   # HELLO is in; closing now resets
                c.close()

        want = {"status": "unavailable",
                "error": "k3d at '%s' closed the connection before answering HELLO (is it a k3d socket?); "
                         "is k3d running? (systemctl status k3d)" % s.sock}
        try:
            for wait_for_hello in (True, False):
                th = threading.Thread(target=serve, args=(2, wait_for_hello))
                th.start()
                status, hd, body = s.raw("GET", "/health")
                assert (status, json.loads(body)) == (503, want), (wait_for_hello, body)
                status, hd, body = s.raw("POST", "/v1/chat/completions", {"model": "m", "messages": HI})
                assert status == 503 and "closed the connection before answering HELLO" in \
                    json.loads(body)["error"]["message"], body
                th.join(10)
        finally:
            ls.close()


# ---- separate stacks ----------------------------------------------------------------

def test_queue_fifo_then_429():                                  # T62
    with Stack(fake_args=["--queue", "1"]) as s:
        # 2 s of tokens: the slot must still be busy when the third request
        # comes, also on a loaded machine (0.3 s was not always enough)
        slow = fake_msg({"tokens": ["x"] * 10, "delay": 0.2})
        c = s.client()
        it_a = iter(c.chat.completions.create(model="m", messages=slow, stream=True))
        next(it_a)                                       # admitted, running
        it_b = iter(c.chat.completions.create(model="m", messages=slow, stream=True))
        first = next(it_b)                               # queued: headers + role chunk while it waits
        assert first.choices[0].delta.role == "assistant"
        t0 = time.time()
        with pytest.raises(openai.RateLimitError) as ei:  # slot and queue full: refused at once
            c.chat.completions.create(model="m", messages=HI)
        assert ei.value.response.headers["retry-after"] == "1" and time.time() - t0 < 5
        text_b = "".join(ch.choices[0].delta.content or "" for ch in it_b)
        text_a = "".join(ch.choices[0].delta.content or "" for ch in it_a)
        assert text_a == text_b == "x" * 10
        done = [e["conn"] for e in s.fake.events("done")]
        assert done == sorted(done) and len(done) == 2   # FIFO
        # leaving the queue and the slot both cancel
        st1 = c.chat.completions.create(model="m", messages=slow, stream=True)
        next(iter(st1))
        st2 = c.chat.completions.create(model="m", messages=slow, stream=True)
        next(iter(st2))
        st2.close()
        st1.close()
        end = time.time() + 5
        while sum(1 for e in s.fake.events("cancel") if e["matched"]) < 2 and time.time() < end:
            time.sleep(0.05)
        assert sum(1 for e in s.fake.events("cancel") if e["matched"]) == 2


def test_access_log_names_the_job():
    """The gateway logs k3d's job id for each generation (issue 16): one
    line when k3d admits it (so 'k3ctl cancel N' needs no guess while it
    runs; with the queue position when queued), and the access line at its
    end carries it too. Requests without a job (/health) have none."""
    import re
    with Stack(fake_args=["--queue", "1"], quiet=False) as s:
        slow = fake_msg({"tokens": ["x"] * 5, "delay": 0.2})
        sa = raw_stream_socket(s.port, {"model": "m", "messages": slow, "stream": True})
        head_a = read_until(sa, b'"role":"assistant"')
        rid_a = re.search(rb"x-request-id: (req_[0-9a-f]+)", head_a).group(1).decode()
        line = s.log_line(lambda ln: rid_a in ln)
        job_a = int(re.fullmatch(r"k3-gateway: %s POST /v1/chat/completions job (\d+)" % rid_a, line).group(1))
        sb = raw_stream_socket(s.port, {"model": "m", "messages": slow, "stream": True})
        head_b = read_until(sb, b'"role":"assistant"')
        rid_b = re.search(rb"x-request-id: (req_[0-9a-f]+)", head_b).group(1).decode()
        line = s.log_line(lambda ln: rid_b in ln)
        job_b = int(re.fullmatch(r"k3-gateway: %s POST /v1/chat/completions job (\d+), queued at position 1"
                                 % rid_b, line).group(1))
        for sock in (sa, sb):
            assert b"data: [DONE]\n\n" in read_until(sock, b"data: [DONE]\n\n", timeout=15)
            sock.close()
        done = {e["job"] for e in s.fake.events("done")}
        assert done == {job_a, job_b} and job_a != job_b, (done, job_a, job_b)
        for rid, job in ((rid_a, job_a), (rid_b, job_b)):
            line = s.log_line(lambda ln, rid=rid: rid in ln)
            assert re.fullmatch(r"k3-gateway: %s POST /v1/chat/completions 200 \d+\.\d{3}s job %d" % (rid, job),
                                line), line
        rid = s.raw("GET", "/health")[1]["x-request-id"]
        line = s.log_line(lambda ln: rid in ln)
        assert re.fullmatch(r"k3-gateway: %s GET /health 200 \d+\.\d{3}s" % rid, line), line


def test_sigterm_ends_streams_as_streams():
    """SIGTERM to k3-gateway (issue 16): an open stream ends with an error
    event (503 shutting_down) and "data: [DONE]" and a proper end of the
    chunked body, not a cut connection (it was logged as 499); a
    non-streaming request in flight gets a 503 JSON error; both jobs are
    cancelled in k3d (their connections close); the gateway exits 0."""
    import re
    import signal
    stopping = {"message": "k3-gateway is shutting down; it stopped this request before it finished.",
                "type": "server_error", "param": None, "code": "shutting_down"}
    with Stack(fake_args=["--slots", "2"], quiet=False) as s:
        slow = fake_msg({"tokens": ["t%d " % i for i in range(200)], "delay": 0.05})
        st = raw_stream_socket(s.port, {"model": "m", "messages": slow, "stream": True})
        head = read_until(st, b"t1 ")
        rid = re.search(rb"x-request-id: (req_[0-9a-f]+)", head).group(1).decode()
        body = json.dumps({"model": "m", "messages": slow}).encode()
        plain = socket.create_connection(("127.0.0.1", s.port), timeout=10)
        plain.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n" % len(body) + body)
        s.log_line(lambda ln: " job " in ln and rid not in ln)     # the second one runs too
        s.gw.send_signal(signal.SIGTERM)
        rest = read_until(st, b"\r\n0\r\n\r\n")
        st.close()
        assert rest.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n"), rest[-300:]
        events = [ln for ln in (head + rest).decode().split("\n") if ln.startswith("data: ")]
        assert events[-1] == "data: [DONE]" and json.loads(events[-2][6:]) == {"error": stopping}, events[-3:]
        reply = read_until(plain, b"\x00")
        plain.close()
        status, _, rbody = reply.partition(b"\r\n\r\n")
        assert status.startswith(b"HTTP/1.1 503") and b"Retry-After: 1" in status, reply
        assert json.loads(rbody) == {"error": stopping}, reply
        assert s.gw.wait(10) == 0
        line = s.log_line(lambda ln: rid in ln and "s job" in ln)
        assert re.fullmatch(r"k3-gateway: %s POST /v1/chat/completions 503 \d+\.\d{3}s job \d+" % rid, line), line
        end = time.time() + 5
        while len(s.fake.events("closed")) < 2 and time.time() < end:
            time.sleep(0.05)
        assert [e["jobs"] for e in s.fake.events("closed")] == [1, 1]   # each closed with its job running


def test_sigterm_waits_for_a_client_that_does_not_read():
    """After SIGTERM the gateway waits for the ended replies to be written,
    at most GW_STOP_FLUSH_S (5 s) for a client that reads nothing; a request
    that comes meanwhile gets 503 shutting_down with Connection: close."""
    import signal
    with Stack(fake_args=["--slots", "2"]) as s:
        big = fake_msg({"tokens": ["x" * 65536] * 200})          # 13 MB of deltas
        stalled = socket.socket()
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.connect(("127.0.0.1", s.port))
        data = json.dumps({"model": "m", "messages": big, "stream": True}).encode()
        stalled.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                        b"Content-Length: %d\r\n\r\n" % len(data) + data)
        end = time.time() + 20
        while not s.fake.events("done") and time.time() < end:   # all of it sent to the gateway
            time.sleep(0.1)
        assert s.fake.events("done")
        t0 = time.time()
        s.gw.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        status, hd, body = s.raw("GET", "/v1/models")
        assert status == 503 and hd["connection"] == "close", (status, hd)
        assert json.loads(body)["error"]["code"] == "shutting_down"
        assert s.gw.wait(20) == 0
        assert time.time() - t0 >= 4, "it did not wait for the client"
        stalled.close()


def test_daemon_down_then_up():                                  # T66
    with Stack(start_fake=False, gw_args=["--retry-after", "3"]) as s:
        status, hd, body = s.raw("GET", "/health")
        assert status == 503 and hd["retry-after"] == "3", (status, body)
        j = json.loads(body)
        assert j["status"] == "unavailable" and set(j) == {"status", "error"}, j
        # names the socket, the errno text and what to check
        assert j["error"] == ("cannot connect to k3d at '%s': No such file or directory; is k3d running? "
                              "(systemctl status k3d)" % s.sock), j
        with pytest.raises(openai.InternalServerError) as ei:
            s.client().chat.completions.create(model="m", messages=HI)
        assert ei.value.status_code == 503 and ei.value.response.headers["retry-after"] == "3"
        status, hd, body = s.raw("GET", "/metrics")
        assert status == 200 and b"k3_gateway_daemon_up 0" in body
        s.fake.start()
        assert s.raw("GET", "/health")[0] == 200
        assert s.client().chat.completions.create(model="m", messages=HI).choices[0].finish_reason == "stop"


def test_loading_state():
    with Stack(fake_args=["--state", "loading"]) as s:
        status, hd, body = s.raw("GET", "/health")
        assert status == 503 and hd["retry-after"] == "1"
        assert json.loads(body) == {"status": "loading",
                                    "error": "k3d is loading the model; retry after Retry-After seconds"}
        with pytest.raises(openai.InternalServerError) as ei:
            s.client().chat.completions.create(model="m", messages=HI)
        assert ei.value.status_code == 503
        assert ei.value.body == {"message": "k3d is still loading the model; retry after the Retry-After delay.",
                                 "type": "server_error", "param": None, "code": "model_not_ready"}


DRAINING = {"message": "k3d is draining (shutting down or restarting) and takes no new requests; this request "
                       "did not run.", "type": "server_error", "param": None, "code": "shutting_down"}


def test_draining_refuses_new_requests():
    """A request that finds k3d draining (HELLO_OK state DRAINING) gets 503
    + Retry-After with /health's sentence and code shutting_down, not the
    loading message; no GENERATE is sent."""
    with Stack(fake_args=["--state", "draining"], gw_args=["--retry-after", "7"]) as s:
        for path, body in (("/v1/chat/completions", {"model": "m", "messages": HI}),
                           ("/v1/chat/completions", {"model": "m", "messages": HI, "stream": True}),
                           ("/v1/completions", {"model": "m", "prompt": "Hi"})):
            status, hd, raw = s.raw("POST", path, body)
            e = assert_error_shape(status, hd, raw, 503)
            assert e == DRAINING and hd["retry-after"] == "7", (path, body, e, hd)
        assert s.fake.events("generate") == []
        lines = s.raw("GET", "/metrics")[2].decode().splitlines()
        assert 'k3_gateway_requests_total{endpoint="chat_completions",status="503"} 2' in lines, \
            [ln for ln in lines if ln.startswith("k3_gateway_requests_total")]


def test_queued_request_dropped_by_drain():
    """k3d drops a queued job while draining: ERROR{SHUTTING_DOWN} after
    ACCEPTED. Non-streaming: 503 with the draining sentence once (it read
    "k3d is shutting down: k3d is shutting down"). Streaming (headers already
    out): one error event with the same message and code, no [DONE], and
    /metrics counts it as 503 like the non-streaming one, not 500."""
    drop = fake_msg({"tokens": [{"error": "k3d is shutting down", "status": "SHUTTING_DOWN"}]})
    with Stack(gw_args=["--retry-after", "3"]) as s:
        status, hd, raw = s.raw("POST", "/v1/chat/completions", {"model": "m", "messages": drop})
        assert assert_error_shape(status, hd, raw, 503) == DRAINING and hd["retry-after"] == "3", raw
        status, hd, raw = s.raw("POST", "/v1/chat/completions", {"model": "m", "messages": drop, "stream": True})
        assert status == 200 and hd["content-type"].startswith("text/event-stream"), (status, hd)
        events = sse_events(raw)
        assert "data: [DONE]" not in events
        assert json.loads(events[-1][6:]) == {"error": DRAINING}, events
        # the SDK raises the event's message for a stream
        with pytest.raises(openai.APIError) as ei:
            list(s.client().chat.completions.create(model="m", messages=drop, stream=True))
        assert ei.value.message == DRAINING["message"]
        lines = s.raw("GET", "/metrics")[2].decode().splitlines()
        counts = {ln.split("status=")[1].split("}")[0]: ln.split()[-1] for ln in lines
                  if ln.startswith('k3_gateway_requests_total{endpoint="chat_completions"')}
        assert counts == {'"503"': "3"}, counts


def test_generation_cut_off_by_k3d():
    """A running generation k3d cancels: when k3d is stopping (DONE
    cancel_reason 3) the client gets the retryable 503 shutting_down, with
    and without streaming; an operator's 'k3ctl cancel' (reason 2) is a 500
    that says so; an older daemon's bare DONE{cancelled} keeps the generic
    500."""
    cut = {"message": "k3d is draining (shutting down or restarting) and takes no new requests; "
                      "it stopped this generation before it finished.",
           "type": "server_error", "param": None, "code": "shutting_down"}
    stopping = fake_msg({"tokens": ["Hel", "lo", {"cancelled": 3}]})
    by_op = fake_msg({"tokens": ["Hel", {"cancelled": 2}]})
    with Stack() as s:
        status, hd, raw = s.raw("POST", "/v1/chat/completions", {"model": "m", "messages": stopping})
        assert assert_error_shape(status, hd, raw, 503) == cut, raw
        status, hd, raw = s.raw("POST", "/v1/chat/completions",
                                {"model": "m", "messages": stopping, "stream": True})
        events = sse_events(raw)
        assert status == 200 and "data: [DONE]" not in events, events
        assert json.loads(events[-1][6:]) == {"error": cut}, events
        status, hd, raw = s.raw("POST", "/v1/chat/completions", {"model": "m", "messages": by_op})
        err = assert_error_shape(status, hd, raw, 500)
        assert err["code"] == "cancelled" and "k3ctl cancel" in err["message"], raw
        lines = s.raw("GET", "/metrics")[2].decode().splitlines()
        counts = {ln.split("status=")[1].split("}")[0]: ln.split()[-1] for ln in lines
                  if ln.startswith('k3_gateway_requests_total{endpoint="chat_completions"')}
        assert counts == {'"503"': "2", '"500"': "1"}, counts


def test_api_key(tmp_path):
    key = tmp_path / "key"
    key.write_text("sk-secret-123\n")
    with Stack(gw_args=["--api-key-file", str(key)]) as s:
        assert s.raw("GET", "/health")[0] == 200
        with pytest.raises(openai.AuthenticationError) as ei:
            s.client().models.list()
        assert ei.value.code == "invalid_api_key"
        with pytest.raises(openai.AuthenticationError):
            s.client(api_key="sk-secret-12").models.list()
        assert s.client(api_key="sk-secret-123").models.list().data[0].id == "kimi-k3-fake"
        status, hd, _ = s.raw("OPTIONS", "/v1/chat/completions", headers={"Content-Type": None})
        assert status == 204


def test_refuses_non_loopback_without_flag():
    import subprocess
    from gwharness import GW_BIN
    p = subprocess.run([GW_BIN, "--listen", "0.0.0.0:0"], capture_output=True, text=True, timeout=10)
    assert p.returncode == 2 and "--allow-remote" in p.stderr
    p = subprocess.run([GW_BIN, "--max-body", "12x"], capture_output=True, text=True, timeout=10)
    assert p.returncode == 2 and "--max-body" in p.stderr


def test_slow_client_read_timeout():                             # T65
    with Stack(gw_args=["--read-timeout", "1"]) as s:
        sock = socket.create_connection(("127.0.0.1", s.port))
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{\"model\":")
        t0 = time.time()
        sock.settimeout(5)
        assert sock.recv(100) == b""               # closed by the gateway
        assert time.time() - t0 < 4
        assert s.client().chat.completions.create(model="m", messages=HI).choices[0].finish_reason == "stop"


def test_readme_snippet(st):
    """The README's Python example, run as written with the port swapped in."""
    import contextlib
    import io
    import os
    import re
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    for doc in ("README.md",):
        text = open(os.path.join(root, doc)).read()
        if "## Use it from an OpenAI client" not in text:
            continue
        text = text[text.index("## Use it from an OpenAI client"):]
        code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
        assert "http://127.0.0.1:8000/v1" in code, doc
        code = code.replace("http://127.0.0.1:8000/v1", st.base + "/v1")
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code, doc, "exec"), {})
        assert out.getvalue() == "Hello from fake k3d.\n", doc


def test_http_details(st):                                       # T03 T09 T10
    status, hd, body = st.raw("HEAD", "/v1/models")
    assert status == 200 and body == b"" and hd["content-type"] == "application/json"
    # two requests on one keep-alive connection, with the Keep-Alive hint
    import http.client
    c = http.client.HTTPConnection("127.0.0.1", st.port, timeout=10)
    for path in ("/health", "/v1/models"):
        c.request("GET", path)
        r = c.getresponse()
        assert r.status == 200 and r.getheader("Keep-Alive") == "timeout=59"
        r.read()
    c.close()
    # HTTP/1.0 stream: no chunking, ends by close
    s = socket.create_connection(("127.0.0.1", st.port), timeout=10)
    body = json.dumps({"model": "m", "messages": HI, "stream": True}).encode()
    s.sendall(b"POST /v1/chat/completions HTTP/1.0\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body) + body)
    data = read_until(s, b"data: [DONE]\n\n")
    s.close()
    head, _, rest = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200") and b"chunked" not in head.lower()
    assert rest.startswith(b"data: {") and rest.endswith(b"data: [DONE]\n\n")
    # Expect: 100-continue on a large body
    big = json.dumps({"model": "m", "messages": [{"role": "user", "content": "a" * 500000}], "max_tokens": 1})
    status, hd, body = st.raw("POST", "/v1/chat/completions", big, {"Expect": "100-continue"})
    assert status == 200 and json.loads(body)["choices"][0]["finish_reason"] == "length"


def test_systemd_socket_activation(st):
    """LISTEN_FDS sockets are served instead of --listen (systemd-socket-activate
    plays systemd's part)."""
    import shutil
    import subprocess
    from gwharness import GW_BIN
    ssa = shutil.which("systemd-socket-activate")
    if not ssa:
        pytest.skip("systemd-socket-activate not installed")
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    p = subprocess.Popen([ssa, "-l", "127.0.0.1:%d" % port, GW_BIN, "--socket", st.sock, "--quiet"],
                         stderr=subprocess.PIPE, text=True)
    try:
        end = time.time() + 10
        while True:
            try:
                c = socket.create_connection(("127.0.0.1", port), timeout=1)
                c.close()
                break
            except OSError:
                assert time.time() < end and p.poll() is None
                time.sleep(0.05)
        import http.client
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/health")
        r = conn.getresponse()
        assert r.status == 200 and json.loads(r.read())["status"] == "ok"
        conn.close()
    finally:
        p.terminate()
        p.wait(10)
    assert "serving 1 systemd socket(s)" in p.stderr.read()

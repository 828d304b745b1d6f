#!/usr/bin/env python3
"""make_gateway_reply_seeds.py - writes the seed corpus of the
fuzz_gateway_reply target (tests/fuzz/corpus/gateway_reply/): byte 0 picks
the request (bit 0 legacy completions, bit 1 include_usage, bit 2 a
max_tokens above the wire bound), then k3 frames as k3d sends them for a
generation. The frames are encoded by tests/gateway/fake_k3d.py's codec,
which reads the schema from proto/k3_proto.h. Run it from anywhere; it
rewrites the named seeds (NN-what) and leaves the files libFuzzer merged
in (sha1 names) alone."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "gateway"))
from fake_k3d import FINISH, STATE, STATUS, Proto  # noqa: E402

P = Proto(os.path.join(HERE, "..", "..", "proto", "k3_proto.h"))
CHAT, LEGACY, USAGE, BIGMAX = 0, 1, 2, 4


def tok(text, ch=0):
    return P.encode("TOKEN", 1, ids=[7], text=text.encode() if isinstance(text, str) else text, channel=ch)


def tool(index, id=None, name=None, arguments=None):
    return P.encode("TOOL_CALL", 1, index=index, id=id, name=name, arguments=arguments)


def done(finish, reason=None, **kw):
    kw.setdefault("prompt_tokens", 9)
    kw.setdefault("completion_tokens", 5)
    return P.encode("DONE", 1, finish=FINISH[finish], cancel_reason=reason, **kw)


def error(status, message, param=None):
    return P.encode("ERROR", 1, status=STATUS[status], message=message, param=param)


emoji = "\U0001F600".encode()
SEEDS = {
    "01-chat-stop": (CHAT, [tok("Hello"), tok(" w\u00f6rld"), done("stop")]),
    "02-chat-reasoning-usage": (CHAT | USAGE, [tok("think ", 1), tok("hard", 1), tok("The answer"),
                                               done("length", reasoning_tokens=2, cached_tokens=3)]),
    "03-chat-nul-utf8": (CHAT, [tok("a\u0000b"), tok("\ufffd"), tok(emoji), tok("c\u0000", 1), done("stop")]),
    "04-chat-tools": (CHAT | USAGE, [tok("need", 1),
                                     tool(0, "call_abc", "get_weather", '{"ci'), tool(0, arguments='ty": "Os\u0000lo"}'),
                                     tool(1, None, "f", "{}"), tool(1, name="g"), done("tool_calls")]),
    "05-legacy-stream-usage": (LEGACY | USAGE, [tok("one"), tok(", two\u0000"), tool(0, "x", "f", "{}"),
                                                done("tool_calls")]),
    "06-legacy-reasoning": (LEGACY, [tok("r", 1), tok("answer"), done("stop")]),
    "07-cancelled-by-k3d": (CHAT, [tok("Hel"), done("cancelled", 3)]),
    "08-cancelled-by-id": (CHAT, [tok("Hel"), done("cancelled", 2)]),
    "09-engine-error": (LEGACY, [done("error")]),
    "10-context-exceeded": (CHAT | BIGMAX, [error("CONTEXT_EXCEEDED", "too long for the context", "max_new")]),
    "11-context-prompt": (CHAT, [error("CONTEXT_EXCEEDED", "This model's maximum context length is 10", "prompt")]),
    "12-busy": (CHAT, [error("BUSY", "slot and queue are full")]),
    "13-draining": (LEGACY, [P.encode("HELLO_OK", 0, server="k3d", version=1, caps=7, model="m",
                                      state=STATE["draining"]),
                             error("SHUTTING_DOWN", "k3d is shutting down")]),
    "14-internal": (CHAT, [tok("a"), error("INTERNAL", "GPU fell off \u00e9" * 200)]),
    "15-hello-ready": (CHAT, [P.encode("HELLO_OK", 0, server="k3d", version=1, caps=7, model="m",
                                       state=STATE["ready"]), tok(""), tok("x"), done("stop")]),
}

out = os.path.join(HERE, "corpus", "gateway_reply")
os.makedirs(out, exist_ok=True)
for name, (flags, frames) in SEEDS.items():
    with open(os.path.join(out, name), "wb") as f:
        f.write(bytes([flags]) + b"".join(frames))
print("%d seeds in %s" % (len(SEEDS), out))

#!/usr/bin/env python3
"""k3ctl carries the model's text as bytes, NUL included (issue 16 item 3),
and names who cancelled a chat reply.

Against the scripted fake k3d (tests/gateway/fake_k3d.py), which sends
exactly the TOKEN and TOOL_CALL texts a script asks for:
  - `k3ctl run --json` keeps U+0000, U+FFFD (what k3d sends for a lone
    continuation byte) and a 4-byte character whose bytes came in two
    tokens, in text and reasoning, byte-equal to plain `k3ctl run`;
  - tool-call arguments streamed in two TOOL_CALL frames around a NUL
    join whole;
  - `k3ctl chat` resends the whole history (the GENERATE the fake logs
    for the second turn holds every byte of the first reply);
  - `k3ctl chat` says a reply was cancelled by 'k3ctl cancel' or by a
    stopping k3d (DONE's cancel_reason), as `k3ctl run` does.
Against the real k3d on the `small` demo model, whose greedy reasoning for
'Count to ten' holds a U+0000 and U+FFFD (on every ISA: avx512, avx2 and
ref give the same ids):
  - `k3ctl chat --json` carries all of it, equal to what plain
    `k3ctl run --chat` prints for the same turn;
  - it resends it and k3d accepts it: the second turn's prompt is exactly
    the offline render of the full history (k3ctl render-chat).

usage: test_k3ctl_text.py K3D K3CTL
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "gateway"))
from k3proto import Daemon, make_model  # noqa: E402
from k3test import check, report  # noqa
from gwharness import Fake  # noqa: E402  (the fake k3d's launcher)

K3D, K3CTL = sys.argv[1], sys.argv[2]


def k3ctl(sock, *args, stdin=None, timeout=60):
    return subprocess.run([K3CTL, "--socket", sock, *args], input=stdin, capture_output=True,
                          timeout=timeout)


def fake_prompt(script):
    return "#fake " + json.dumps(script)   # ASCII: NUL travels as \u0000 inside the JSON


# U+0000, U+FFFD, and 😀 (f0 9f 98 80) arriving as two tokens, in both channels
SCRIPT = {"tokens": [{"r": "think\u0000ing "}, {"rhex": "f09f"}, {"rhex": "9880"},
                     "a\u0000b", "\ufffd", {"hex": "f09f"}, {"hex": "9880"}, "!"]}
TEXT = "a\u0000b\ufffd\U0001F600!"
REASONING = "think\u0000ing \U0001F600"


def test_fake(tmp):
    f = Fake(os.path.join(tmp, "fake.sock"), os.path.join(tmp, "fake.log")).start()
    try:
        r = k3ctl(f.sock, "--json", "run", fake_prompt(SCRIPT))
        check(r.returncode == 0, f"run --json: {r.returncode} {r.stderr!r}")
        j = json.loads(r.stdout) if r.returncode == 0 else {}
        check(j.get("text") == TEXT, f"run --json text keeps every byte: {j.get('text')!r}")
        check(j.get("reasoning") == REASONING, f"run --json reasoning keeps every byte: {j.get('reasoning')!r}")

        r = k3ctl(f.sock, "run", fake_prompt(SCRIPT))
        check(r.returncode == 0 and r.stdout == (TEXT + "\n").encode(),
              f"plain run writes the same bytes: {r.stdout!r}")
        check(REASONING.encode() in r.stderr, f"plain run's reasoning on stderr: {r.stderr!r}")

        tools = {"finish": "tool_calls", "tokens": [
            {"tool": {"index": 0, "id": "call_1", "name": "f", "arguments": "{\"s\": \"x\u0000"}},
            {"tool": {"index": 0, "arguments": "y\"}"}}]}
        r = k3ctl(f.sock, "--json", "run", fake_prompt(tools))
        j = json.loads(r.stdout) if r.returncode == 0 else {}
        args = (j.get("tool_calls") or [{}])[0].get("function", {}).get("arguments")
        check(args == "{\"s\": \"x\u0000y\"}", f"tool-call arguments join whole: {args!r}")

        # chat: the second turn resends the first reply, every byte of it
        r = k3ctl(f.sock, "--json", "chat", stdin=(fake_prompt(SCRIPT) + "\nnext\n").encode())
        check(r.returncode == 0, f"chat: {r.returncode} {r.stderr!r}")
        turns = [json.loads(x) for x in r.stdout.splitlines() if x.strip()]
        check(len(turns) == 2 and turns[0].get("text") == TEXT, f"chat --json turn 1: {turns[:1]!r}")
        gens = [e["fields"] for e in f.events("generate")]
        msgs = gens[-1].get("messages", []) if len(gens) >= 2 else []
        check(len(msgs) == 3 and msgs[1].get("role") == "assistant", f"history of turn 2: {msgs!r}")
        if len(msgs) == 3:
            check(msgs[1].get("content") == TEXT, f"resent content: {msgs[1].get('content')!r}")
            check(msgs[1].get("reasoning_content") == REASONING,
                  f"resent reasoning: {msgs[1].get('reasoning_content')!r}")

        # chat marks a turn with no answer on stderr, with why it ended
        # (stdout keeps only answers); a turn with an answer has no mark
        think = {"tokens": [{"r": "thinking "}, {"r": "more"}, "late"]}
        r = k3ctl(f.sock, "chat", "--max-new", "2",
                  stdin=(fake_prompt(think) + "\n" + fake_prompt({"tokens": []}) + "\n" +
                         fake_prompt({"tokens": ["Hi"]}) + "\n").encode())
        err = r.stderr.decode(errors="replace")
        check(r.returncode == 0 and "(empty answer: finish=length, 2 reasoning tokens; --max-new "
              "ended the turn before the answer)\n" in err,
              f"chat marks a thinking-only turn: {err!r}")
        check("(empty answer: finish=stop)\n" in err, f"chat marks an empty stopped turn: {err!r}")
        check(err.count("(empty answer") == 2 and b"(empty answer" not in r.stdout,
              f"only the empty turns are marked, on stderr: {err!r} {r.stdout!r}")
        check(r.stdout == b"Hi\n", f"chat's stdout holds the one answer: {r.stdout!r}")

        # chat names who cancelled a reply (DONE's cancel_reason) and goes on
        for reason, words in ((2, "'k3ctl cancel' from another client"), (3, "k3d is shutting down")):
            script = {"tokens": ["x", {"cancelled": reason}]}
            r = k3ctl(f.sock, "chat", stdin=(fake_prompt(script) + "\n").encode())
            err = r.stderr.decode(errors="replace")
            check(r.returncode == 0 and "k3d cancelled the reply: " + words in err,
                  f"chat names cancel_reason {reason}: {err!r}")
            check("[cancelled]" not in err, f"not the Ctrl-C line for cancel_reason {reason}: {err!r}")
    finally:
        f.stop()


def test_real(tmp):
    model = make_model(K3CTL, "small")
    d = Daemon(K3D, model=model)
    try:
        # 120 tokens: the U+0000 is the 116th (ASan builds are slow)
        q = k3ctl(d.sock, "run", "--chat", "--max-new", "120", "Count to ten", timeout=300)
        check(q.returncode == 0, f"plain run: {q.returncode} {q.stderr[-300:]!r}")
        # plain: reasoning on stderr (then a newline), content on stdout
        plain_reasoning = q.stderr.decode("utf-8", errors="strict").rstrip("\n")
        plain_text = q.stdout.decode("utf-8", errors="strict")

        # chat --json: turn 1 is the same one-message chat as that run;
        # turn 2's prompt must be the render of the complete history
        r = k3ctl(d.sock, "--json", "chat", "--max-new", "120", stdin=b"Count to ten\nAgain\n",
                  timeout=300)
        turns = [json.loads(x) for x in r.stdout.splitlines() if x.strip()]
        check(r.returncode == 0 and len(turns) == 2, f"two chat turns: {r.returncode} {r.stderr[-300:]!r}")
        if len(turns) != 2:
            return
        reasoning, text = turns[0]["reasoning"], turns[0]["text"]
        # the premise: this output holds a NUL and a replacement character
        check("\u0000" in reasoning and "\ufffd" in reasoning,
              f"the small model's reasoning for 'Count to ten' holds U+0000 and U+FFFD "
              f"(if the model changed, pick another prompt): {reasoning[:80]!r}")
        check(plain_reasoning == reasoning, f"--json reasoning ({len(reasoning)} chars) equals the "
              f"plain one ({len(plain_reasoning)})")
        check(plain_text == text + ("\n" if text and not text.endswith("\n") else ""),
              "--json text equals the plain one")
        hist = {"thinking_effort": "max", "messages": [
            {"role": "user", "content": "Count to ten"},
            {"role": "assistant", "content": text, "reasoning_content": reasoning},
            {"role": "user", "content": "Again"}]}
        path = os.path.join(tmp, "history.json")
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(hist, fh)
        ids = subprocess.run([K3CTL, "render-chat", "--ids", "--model", model, path],
                             capture_output=True, text=True, timeout=60).stdout.split()
        check(turns[1]["usage"]["prompt_tokens"] == len(ids),
              f"turn 2 prompt is the full history: {turns[1]['usage']['prompt_tokens']} tokens, "
              f"render of the full history {len(ids)}")
        check(d.proc.poll() is None, "k3d alive")
    finally:
        check(d.stop() == 0, "clean exit")
        check(not d.sanitizer_reports(), f"no sanitizer reports: {d.sanitizer_reports()[:3]}")
        shutil.rmtree(os.path.dirname(model), ignore_errors=True)


def main():
    tmp = tempfile.mkdtemp(prefix="k3ctl-text-")
    try:
        print("-- fake k3d"); test_fake(tmp)
        print("-- real k3d"); test_real(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report()


if __name__ == "__main__":
    sys.exit(main())

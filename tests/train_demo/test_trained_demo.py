#!/usr/bin/env python3
"""The trained demo model through the real k3d (issue 23).

  * `k3ctl demo-model --preset trained` writes exactly the shipped files
    (tools/train_demo/model, SHA-256 of each against SHA256SUMS);
  * the raw completion of "The capital of France is" has the recorded
    greedy ids and starts with " Paris";
  * `k3ctl run --chat "Hello! Who are you?"` (the demo's chat turn) has the
    recorded ids: a thinking channel (reasoning) and the answer in the
    response channel, finish stop on <|end_of_msg|>;
  * a capital question gets both channels and an answer of the trained
    form "The capital of X is Y." (which X: the model is too small to copy
    the country reliably, see tools/train_demo/README.md);
  * with tools declared, a weather question ends in a tool call
    get_weather with one string argument "city" (DONE finish
    tool_calls), parsed by k3d's output parser from the model's own XTML
    tools channel.

usage: test_trained_demo.py K3D K3CTL SOURCE_ROOT
"""
import hashlib
import json
import os
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
from k3proto import T, Daemon, connect, field, frame, read_frame, u32  # noqa: E402

K3D, K3CTL, SRC = sys.argv[1], sys.argv[2], sys.argv[3]
SHIPPED = os.path.join(SRC, "tools", "train_demo", "model")

# Recorded from the shipped checkpoint (README "Quick start" shows the same).
RAW_PROMPT = "The capital of France is"
RAW_IDS = [857, 13, 297, 278, 280, 774, 264, 870]
CHAT_PROMPT = "Hello! Who are you?"
CHAT_IDS = [273, 431, 968, 554, 13, 366, 970, 650, 969, 383, 964, 965, 926, 366, 653, 13, 1796, 290, 1797,
            1795, 329, 1797, 914, 0, 366, 653, 373, 938, 953, 488, 18, 946, 948, 13, 366, 652, 955, 945, 950,
            952, 937, 11, 943, 383, 954, 13, 1796, 329, 1797, 1796, 275, 1797]

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)
    else:
        print("ok:", what)


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def install(d):
    path = os.path.join(d, "trained")
    subprocess.run([K3CTL, "demo-model", "--preset", "trained", "--out", path], check=True,
                   capture_output=True)
    with open(os.path.join(SHIPPED, "SHA256SUMS")) as f:
        sums = [line.split("  ", 1) for line in f.read().splitlines() if line]
    for digest, name in sums:
        got = sha256(os.path.join(path, name))
        check(got == digest and got == sha256(os.path.join(SHIPPED, name)),
              f"installed {name} has the recorded SHA-256")
    p = subprocess.run([K3CTL, "demo-model", "--preset", "trained", "--layers", "4", "--out",
                        os.path.join(d, "x")], capture_output=True, text=True)
    check(p.returncode == 2 and "fixed checkpoint" in p.stderr and not os.path.exists(os.path.join(d, "x")),
          "--preset trained with a dimension option is a usage error that writes nothing")
    return path


def generate(sock, payload):
    """(ids, text, tool_calls, finish) of one GENERATE."""
    s = connect(sock)
    s.sendall(frame(T["GENERATE"], 7, payload))
    ids, text, calls, finish = [], b"", {}, None
    while finish is None:
        t, rid, f = read_frame(s, 120)
        if t == T["TOKEN"]:
            b = f[1][0]
            ids += [struct.unpack_from("<I", b, i)[0] for i in range(0, len(b), 4)]
            text += f.get(2, [b""])[0]
        elif t == T["TOOL_CALL"]:
            c = calls.setdefault(u32(f, 1), {"name": "", "arguments": ""})
            if 3 in f:
                c["name"] += f[3][0].decode()
            if 4 in f:
                c["arguments"] += f[4][0].decode()
        elif t == T["DONE"]:
            finish = u32(f, 1)
        elif t == T["ERROR"]:
            raise RuntimeError(f[2][0].decode())
    s.close()
    return ids, text.decode(), calls, finish


def k3ctl_run(sock, *args):
    p = subprocess.run([K3CTL, "--json", "run", *args], capture_output=True, text=True,
                       env=dict(os.environ, K3D_SOCKET=sock), timeout=120)
    if p.returncode != 0:
        raise RuntimeError(p.stderr)
    return json.loads(p.stdout)


def main():
    work = tempfile.mkdtemp(prefix="k3-trained-")
    model = install(work)
    d = Daemon(K3D, model=model)
    try:
        ids, text, _, _ = generate(d.sock, field(1, 0) + field(2, RAW_PROMPT) + field(8, 8))
        print("raw:", ids, repr(text))
        check(text.startswith(" Paris"), f"'{RAW_PROMPT}' continues with ' Paris' ({text!r})")
        check(ids == RAW_IDS, f"raw completion ids {ids} == {RAW_IDS}")

        r = k3ctl_run(d.sock, "--chat", "--max-new", "96", CHAT_PROMPT)
        print("chat:", json.dumps(r))
        check("demo model" in r.get("text", ""), f"chat answer: {r.get('text')!r}")
        check(r.get("reasoning", "").startswith("The user greets me"), f"chat thinking: {r.get('reasoning')!r}")
        check(r.get("finish") == "stop", f"chat stops on <|end_of_msg|>: {r.get('finish')}")
        check(r.get("ids") == CHAT_IDS, f"chat ids {r.get('ids')} == {CHAT_IDS}")

        r = k3ctl_run(d.sock, "--chat", "--max-new", "96", "What is the capital of France?")
        t = r.get("text", "")
        check(t.startswith("The capital of ") and " is " in t and t.endswith(".") and r.get("reasoning")
              and r.get("finish") == "stop", f"capital question: both channels, the trained answer form ({r})")

        with open(os.path.join(SRC, "tools", "train_demo", "data.py")) as f:
            src = f.read()
        ns = {}
        exec(compile(src, "data.py", "exec"), ns)
        msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
        ids, text, calls, finish = generate(
            d.sock, field(1, 1) + field(4, json.dumps(msgs)) + field(5, json.dumps(ns["TOOLS"])) + field(8, 96))
        print("tool turn:", calls, finish, repr(text))
        c = calls.get(0) or calls.get(1) or {}
        check(c.get("name") == "get_weather", f"tool call name: {c}")
        try:
            args = json.loads(c.get("arguments") or "null")
        except ValueError:
            args = None
        check(isinstance(args, dict) and list(args) == ["city"] and isinstance(args["city"], str)
              and args["city"], f"tool call arguments: one string 'city': {c.get('arguments')!r}")
        check(finish == 4, f"DONE finish tool_calls (4): {finish}")
    finally:
        rc = d.stop()
        check(rc == 0, f"k3d exits 0 ({rc})")
        check(not d.sanitizer_reports(), "no sanitizer reports")
    if failures:
        print("%d failure(s)" % len(failures))
        return 1
    print("all trained-demo checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())

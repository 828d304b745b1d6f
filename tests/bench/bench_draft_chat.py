#!/usr/bin/env python3
"""bench_draft_chat.py - n-gram drafting through the real k3d on the trained
demo model (issue 18): chats whose answer quotes their context (a tool
result the answer repeats, the city the user named), plain questions and
a raw completion that repeats itself. For each request: the ids must be
those of drafting off; printed are tokens per pass, proposals accepted and
decode tokens/s, for the width policy and for a fixed width. Prints, never
asserts.

Always the trained model (`k3ctl demo-model --preset trained`): an n-gram
draft is accepted only where the model's own greedy text repeats its
context, which a random-weight model never does; its experts are tiny, so
the tokens/s say nothing about K3's bandwidth (bench_draft.py does that).

    bench_draft_chat.py K3D K3CTL [--width N] [--threads N]
"""
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
sys.path.insert(0, os.path.dirname(__file__))
from bench_draft import K3d, bench_args, generate  # noqa
from k3proto import f64, u32, u64  # noqa
TOOLS = [{"type": "function", "function": {
    "name": n, "description": d,
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city"}},
                   "required": ["city"]}}}
    for n, d in (("get_weather", "Get the current weather in a city."),
                 ("get_time", "Get the local time in a city."))]


def tool_chat(city, tool, result):
    what = "weather" if tool == "get_weather" else "time"
    return {"messages": [
        {"role": "user", "content": "What is the %s in %s?" % (what, city)},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": tool, "arguments": {"city": city}}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": result}], "tools": TOOLS}


CASES = (
    [("tool result: weather %s" % c, tool_chat(c, "get_weather", r))
     for c, r in (("Paris", "sunny, 21 C"), ("Tokyo", "rainy, 14 C"), ("Lima", "cloudy, 18 C"),
                  ("Oslo", "snowy, -3 C"))] +
    [("tool result: time %s" % c, tool_chat(c, "get_time", r))
     for c, r in (("Rome", "14:35"), ("Cairo", "09:05"), ("Madrid", "22:50"))] +
    [("question %s" % c, {"messages": [{"role": "user", "content": "What is the capital of %s?" % c}]})
     for c in ("France", "Japan", "Peru")])
RAW = [("raw: capitals", "The capital of France is Paris. The capital of Japan is Tokyo. The capital of")]


def main():
    a = bench_args(width=3, threads=1).parse_args()
    tmp = tempfile.mkdtemp(prefix="k3-bench-draft-chat-")
    model = os.path.join(tmp, "trained")
    subprocess.run([a.k3ctl, "demo-model", "--out", model, "--preset", "trained"], check=True,
                   capture_output=True)
    common = ["--threads", str(a.threads)]
    procs = {}
    configs = [("off", ["--draft", "off"]), ("ngram policy", ["--draft", "ngram"]),
               ("ngram width %d" % (a.width + 1), ["--draft", "ngram", "--draft-width", str(a.width)])]
    for name, args in configs:
        procs[name] = K3d(a.k3d, tmp, name.replace(" ", "_"), model, common + args)
    load0 = os.getloadavg()[0]
    rows = []
    try:
        for label, case in CASES + RAW:
            res = {}
            for name, _ in configs:
                if isinstance(case, str):
                    res[name] = generate(procs[name].sock, prompt=case)
                else:
                    res[name] = generate(procs[name].sock, chat=case)
            base = res["off"][0]
            for name, _ in configs[1:]:
                ids, f = res[name]
                if ids != base:
                    print(f"!! {label} {name}: ids differ from drafting off")
                rows.append((label, name, u32(f, 3), u64(f, 29) or 0, f64(f, 30) or 0,
                             u64(f, 27) or 0, u64(f, 28) or 0, f64(f, 10) or 0,
                             f64(res["off"][1], 10) or 0))
    finally:
        for d in procs.values():
            d.stop()
    print(f"# bench_draft_chat: the trained demo model, {a.threads} thread(s), load {load0:.1f} -> "
          f"{os.getloadavg()[0]:.1f}; ids equal drafting off unless marked !!")
    print(f"{'request':26} {'config':14} {'ids':>4} {'passes':>6} {'ids/pass':>8} {'accepted':>9} "
          f"{'tok/s':>8} {'off tok/s':>9}")
    for r in rows:
        print(f"{r[0]:26} {r[1]:14} {r[2]:4} {r[3]:6} {r[4]:8.2f} {r[6]:4}/{r[5]:<4} {r[7]:8.1f} {r[8]:9.1f}")
    for name, _ in configs[1:]:
        sel = [r for r in rows if r[1] == name]
        ids, passes = sum(r[2] for r in sel), sum(r[3] for r in sel)
        quoting = [r for r in sel if r[0].startswith("tool result")]
        qi, qp = sum(r[2] for r in quoting), sum(r[3] for r in quoting)
        print(f"# {name}: {ids / passes:.2f} ids/pass over all ({ids} ids, {passes} passes); "
              f"{qi / qp:.2f} on the chats quoting a tool result")
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

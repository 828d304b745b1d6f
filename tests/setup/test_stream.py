#!/usr/bin/env python3
"""test_stream.py K3CTL K3D NAME - streaming installs (k3ctl setup --stream)
against the local HTTPS server: k3d --fetch-experts serves a demo model
whose routed experts arrive on demand, with ids identical to the full
install's; per-expert verification; the whole-shard check; packs record
verified SHA-256s."""
import http.client
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from setup_harness import check, run_named, sha256_file  # noqa: E402

K3D = None
PROMPTS = ["The capital of France is", "Once upon a time, in a land far away"]
SHARD1 = "model-00001-of-00002.safetensors"


class Daemon:
    def __init__(self, env, model, *extra):
        self.env = env
        self.sock = os.path.join(env.tmp, "k3d-%d.sock" % time.monotonic_ns())
        self.log = open(os.path.join(env.tmp, "k3d-%d.log" % time.monotonic_ns()), "w+")
        self.p = subprocess.Popen([K3D, "--socket", self.sock, "--model", model, "--io-threads", "2",
                                   "--threads", "1"] + list(extra),
                                  stdout=self.log, stderr=subprocess.STDOUT,
                                  env={**os.environ, "HOME": env.tmp})
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and self.p.poll() is None:
            r = self.k3ctl("status", "--json")
            if r.returncode == 0 and json.loads(r.stdout).get("state") == "ready":
                return
            time.sleep(0.1)

    def k3ctl(self, *args):
        return subprocess.run([self.env.k3ctl, "--socket", self.sock] + list(args),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)

    def ids(self, prompt, chat=False):
        r = self.k3ctl("run", "--max-new", "12", "--json", *(["--chat"] if chat else []), prompt)
        check(r.returncode == 0, "generation succeeds: %s %s" % (r.stderr, self.logtext()))
        return [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")][-1]["ids"]

    def logtext(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def stop(self):
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(20)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        log = self.logtext()
        check("Sanitizer" not in log and "runtime error:" not in log,
              "k3d: a sanitizer report: %s" % log[-3000:])


def world(env, table=False):
    # 256 experts per layer: two short prompts use some, not all, so some
    # stay remote (and the whole-shard check has not happened yet)
    src = env.demo_model(extra=("--experts", "256"))
    if table:
        r = subprocess.run([env.k3ctl, "pack", "--model", src], stdout=subprocess.PIPE, text=True)
        check(r.returncode == 0 and os.path.exists(os.path.join(src, "k3-expert-sha256.txt")),
              "k3ctl pack writes the per-expert table")
        shutil.rmtree(os.path.join(src, "k3-packs"))
    srv = env.server(src)
    inv, doc = env.inventory(src, srv.base)
    check((doc["expert_table"] == "k3-expert-sha256.txt") == table, "the inventory names the table")
    return src, srv, inv


def full_ids(env, src, chat=False):
    d = Daemon(env, src)
    try:
        return [d.ids(p) for p in PROMPTS] + ([d.ids(PROMPTS[0], chat=True)] if chat else [])
    finally:
        d.stop()


def expert_requests(srv, shard_layout):
    return [q for q in srv.requests() if q["path"].endswith(".safetensors") and q["range"]
            and int(q["range"].split("=")[1].split("-")[0]) >= shard_layout]


def st_header(path):
    """A safetensors file's header and the absolute offset of its data."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n)), 8 + n


def expert_extents(src):
    """{(layer, expert): (shard, first byte, end)}: each routed expert's six
    arrays, adjacent in the file, as one absolute byte range."""
    out = {}
    for shard in sorted(n for n in os.listdir(src) if n.endswith(".safetensors")):
        hdr, base = st_header(os.path.join(src, shard))
        for name, t in hdr.items():
            m = re.search(r"\.layers\.(\d+)\..*\.experts\.(\d+)\.", name)
            if not m:
                continue
            key = (int(m.group(1)), int(m.group(2)))
            a, b = base + t["data_offsets"][0], base + t["data_offsets"][1]
            _, a0, b0 = out.get(key, (shard, a, b))
            out[key] = (shard, min(a, a0), max(b, b0))
    return out


def expert_map(dest):
    """{(layer, expert): state} from .k3-setup/experts.map (docs/formats.md);
    layers without routed experts left out."""
    raw = open(os.path.join(dest, ".k3-setup", "experts.map"), "rb").read()
    check(raw[:8] == b"K3XMAP1\n", "an experts map")
    layers, experts = struct.unpack("<II", raw[8:16])
    return {(l, e): raw[64 + l * experts + e] for l in range(layers) for e in range(experts)
            if raw[64 + l * experts + e] != 255}


def range_of(q):
    a, b = q["range"].split("=")[1].split("-")
    return int(a), int(b) + 1


# ---- tests ----

def stream_ids_match_full(env):
    src, srv, inv = world(env)
    want = full_ids(env, src)
    r = env.setup(inv, "--stream")
    check(r.returncode == 0, "setup --stream: %s" % r.stderr)
    dest = os.path.join(env.root, "demo")
    n_setup = len(srv.requests())
    d = Daemon(env, dest, "--fetch-experts")
    try:
        got = [d.ids(p) for p in PROMPTS]
        st = json.loads(d.k3ctl("status", "--json").stdout)
        text = st.get("status", "")
    finally:
        d.stop()
    check(got == want, "the streaming install generates the full install's ids: %s vs %s" % (got, want))
    ranged = [q for q in srv.requests()[n_setup:] if q["range"]]
    check(ranged and all(q["path"].endswith(".safetensors") for q in ranged),
          "k3d fetched experts by range requests (%d)" % len(ranged))
    check("streaming experts:" in text and "fetched" in text, "STATUS says so: %s" % text)
    r = env.setup(inv, "--check")
    check(r.returncode == 0 and "verified only by TLS so far: layer" in r.stdout,
          "--check lists the experts verified only by TLS: %s" % r.stdout)


def stream_refuses_without_fetch_experts(env):
    src, srv, inv = world(env)
    check(env.setup(inv, "--stream").returncode == 0, "setup --stream")
    dest = os.path.join(env.root, "demo")
    p = subprocess.run([K3D, "--socket", os.path.join(env.tmp, "x.sock"), "--model", dest],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    check(p.returncode != 0 and "--fetch-experts" in p.stdout and "streaming install" in p.stdout,
          "k3d names --fetch-experts: %s" % p.stdout[-800:])
    r = subprocess.run([env.k3ctl, "pack", "--model", dest], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
    check(r.returncode == 1 and "fetch-weights" in r.stderr, "k3ctl pack refuses holes: %s" % r.stderr)


def stream_expert_table_verifies_before_use(env):
    src, srv, inv = world(env, table=True)
    want = full_ids(env, src, chat=True)
    check(env.setup(inv, "--stream").returncode == 0, "setup --stream")
    dest = os.path.join(env.root, "demo")
    d = Daemon(env, dest, "--fetch-experts")
    try:
        got = [d.ids(p) for p in PROMPTS] + [d.ids(PROMPTS[0], chat=True)]
    finally:
        d.stop()
    check(got == want, "same ids (raw and chat) with per-expert verification")
    r = env.setup(inv, "--check", pre=["--json"])
    rep = json.loads(r.stdout)
    check(rep["experts"]["verified_expert"] > 0 and rep["experts"]["tls_only"] == 0,
          "every fetched expert was checked against the table: %s" % rep["experts"])


def stream_flipped_expert_never_used(env):
    src, srv, inv = world(env, table=True)
    check(env.setup(inv, "--stream").returncode == 0, "setup --stream")
    dest = os.path.join(env.root, "demo")
    # flip one byte inside every expert read of shard 1 (past its spine)
    spine = json.load(open(inv))["files"]
    spine = {f["path"]: f for f in spine}[SHARD1]["spine_bytes"]
    size = os.path.getsize(os.path.join(src, SHARD1))
    srv.set_faults({SHARD1: [{"type": "flip", "at": spine + 100, "repeat": True}]})
    r = subprocess.run([env.k3ctl, "fetch-weights", "--model", dest, "--cacert", env.ca,
                        "--experts-only", "--layers", "1"], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, env={**os.environ, "HOME": env.tmp})
    check(r.returncode == 1 and "SHA-256" in r.stderr and "not used" in r.stderr,
          "a flipped expert fails its table check: %s" % r.stderr)
    c = json.loads(env.setup(inv, "--check", pre=["--json"]).stdout)
    check(c["experts"]["verified_expert"] == 255 and c["experts"]["tls_only"] == 0,
          "the other 255 are verified, the flipped one is not on disk: %s" % c["experts"])
    check(size > spine, "shard has experts")
    # k3d: every expert it fetches from now on arrives damaged
    srv.set_faults({SHARD1: [{"type": "flip_each", "skip": 10, "repeat": True}],
                    "model-00002-of-00002.safetensors": [{"type": "flip_each", "skip": 10,
                                                          "repeat": True}]})
    d = Daemon(env, dest, "--fetch-experts")
    try:
        r = d.k3ctl("run", "--max-new", "4", PROMPTS[0])
        log = d.logtext()
    finally:
        d.stop()
    check(r.returncode == 1, "the generation fails rather than use a damaged expert: %s" % r.stderr)
    check("fails its SHA-256 check against the per-expert table: not used" in log,
          "k3d says why: %s" % log[-1500:])
    c2 = json.loads(env.setup(inv, "--check", pre=["--json"]).stdout)
    check(c2["experts"]["verified_expert"] == 255 and c2["experts"]["tls_only"] == 0,
          "no damaged expert was marked present: %s" % c2["experts"])


def stream_whole_shard_check(env):
    src, srv, inv = world(env)
    check(env.setup(inv, "--stream").returncode == 0, "setup --stream")
    dest = os.path.join(env.root, "demo")
    spine = {f["path"]: f for f in json.load(open(inv))["files"]}[SHARD1]["spine_bytes"]
    srv.set_faults({SHARD1: [{"type": "flip", "at": spine + 100, "repeat": True}]})
    fetch = [env.k3ctl, "fetch-weights", "--model", dest, "--cacert", env.ca, "--experts-only"]
    henv = {**os.environ, "HOME": env.tmp}
    r = subprocess.run(fetch, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=henv)
    check(r.returncode == 1 and "whole shard's SHA-256" in r.stderr,
          "without a table, the flip is caught when the shard's last expert arrives: %s" % r.stderr)
    check("1 shards verified whole, 1 failed" in r.stdout, "the other shard verifies: %s" % r.stdout)
    c = env.setup(inv, "--check")
    check(c.returncode == 1 and "MISMATCH" in c.stdout and SHARD1 in c.stdout,
          "--check reports the shard: %s" % c.stdout)
    srv.set_faults({})
    r = env.setup(inv, "--stream")
    check(r.returncode == 0, "setup --stream fetches the failed shard's spine again: %s" % r.stderr)
    r = subprocess.run(fetch, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=henv)
    check(r.returncode == 0 and "1 shards verified whole, 0 failed" in r.stdout,
          "then its experts, and it verifies: %s %s" % (r.stdout, r.stderr))
    for n in (SHARD1, "model-00002-of-00002.safetensors"):
        check(sha256_file(os.path.join(dest, n)) == sha256_file(os.path.join(src, n)),
              "%s is the release's file" % n)
    c = env.setup(inv, "--check", "--rehash")
    check(c.returncode == 0 and "6 verified" in c.stdout, "a full install now: %s" % c.stdout)


def packs_record_verified_sha256(env):
    src, srv, inv = world(env)
    check(env.setup(inv, "--full").returncode == 0, "setup --full")
    dest = os.path.join(env.root, "demo")
    r = subprocess.run([env.k3ctl, "pack", "--model", dest], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
    check(r.returncode == 0, "k3ctl pack: %s" % r.stderr)
    pack = os.path.join(dest, "k3-packs", "experts-L001.k3pack")
    raw = open(pack, "rb").read()
    for n in (SHARD1, "model-00002-of-00002.safetensors"):
        digest = bytes.fromhex(sha256_file(os.path.join(dest, n)))
        check(digest in raw, "the pack records the verified SHA-256 of %s" % n)
    # a pack made before the verification gets it recorded on the next run
    os.unlink(pack)
    shutil.copy(os.path.join(dest, ".k3-setup", "state.json"), os.path.join(env.tmp, "state"))
    os.unlink(os.path.join(dest, ".k3-setup", "state.json"))
    check(subprocess.run([env.k3ctl, "pack", "--model", dest], stdout=subprocess.DEVNULL).returncode
          == 0, "pack without the state")
    check(bytes.fromhex(sha256_file(os.path.join(dest, SHARD1))) not in open(pack, "rb").read(),
          "no verified SHA-256 to record")
    shutil.copy(os.path.join(env.tmp, "state"), os.path.join(dest, ".k3-setup", "state.json"))
    r = subprocess.run([env.k3ctl, "pack", "--model", dest], stdout=subprocess.PIPE, text=True)
    check(r.returncode == 0 and "re-verified" in r.stdout, "compared, then recorded: %s" % r.stdout)
    check(bytes.fromhex(sha256_file(os.path.join(dest, SHARD1))) in open(pack, "rb").read(),
          "now recorded")


def fetch_cmd(env, *args):
    return subprocess.run([env.k3ctl] + list(args) + ["--model", os.path.join(env.root, "demo"),
                                                      "--cacert", env.ca],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env={**os.environ, "HOME": env.tmp}, timeout=120)


def warm_expert_cache_fetch_most_used_missing(env):
    src, srv, inv = world(env)
    check(env.setup(inv, "--stream").returncode == 0, "setup --stream")
    dest = os.path.join(env.root, "demo")
    ext = expert_extents(src)
    # a router trace: (1,5) routed 5 times, (6,7) 4, (2,9) 3, (1,200) 2, (8,3) once
    uses = [((1, 5), 5), ((6, 7), 4), ((2, 9), 3), ((1, 200), 2), ((8, 3), 1)]
    trace = os.path.join(env.tmp, "trace.jsonl")
    with open(trace, "w") as f:
        pos = 0
        for (layer, expert), n in reversed(uses):
            for _ in range(n):
                f.write(json.dumps({"request": 1, "position": pos, "layer": layer,
                                    "ids": [expert], "weights": ["3f800000"]}) + "\n")
                pos += 1
    have = set()
    for n, want in ((2, [(1, 5), (6, 7)]), (2, [(2, 9), (1, 200)]), (5, [(8, 3)])):
        seen = len(srv.requests())
        r = fetch_cmd(env, "warm-expert-cache", "--trace", trace, "--fetch", str(n))
        check(r.returncode == 0, "warm-expert-cache --fetch %d: %s" % (n, r.stderr))
        nbytes = sum(ext[k][2] - ext[k][1] for k in want)
        check("fetched %d routed experts (%.1f kB)" % (len(want), nbytes / 1e3) in r.stdout,
              "it says what it fetched: %s" % r.stdout)
        # the n most-used experts not on disk yet, each by one range request
        # for exactly its bytes, and nothing else
        got = sorted((q["path"].rsplit("/", 1)[1],) + range_of(q) for q in srv.requests()[seen:])
        check(got == sorted(ext[k] for k in want), "fetched exactly %s: %s" % (want, got))
        have |= set(want)
        emap = expert_map(dest)
        check({k for k, v in emap.items() if v} == have and all(emap[k] == 1 for k in have),
              "on disk now (verified by TLS only, no table): exactly %s" % sorted(have))
        for k in want:
            shard, a, b = ext[k]
            with open(os.path.join(src, shard), "rb") as f1, open(os.path.join(dest, shard), "rb") as f2:
                f1.seek(a)
                f2.seek(a)
                check(f1.read(b - a) == f2.read(b - a), "expert %s holds the release's bytes" % (k,))
    r = fetch_cmd(env, "warm-expert-cache", "--trace", trace, "--fetch", "3")
    check(r.returncode == 0 and "fetched 0 routed experts" in r.stdout, "nothing left: %s" % r.stdout)
    c = json.loads(env.setup(inv, "--check", pre=["--json"]).stdout)["experts"]
    check(c["tls_only"] == 5 and c["absent"] == 8 * 256 - 5, "the install's counts: %s" % c)


def fetch_weights_spine_only(env):
    src, srv, inv = world(env)
    shard2 = "model-00002-of-00002.safetensors"
    spine2 = {f["path"]: f for f in json.load(open(inv))["files"]}[shard2]["spine_bytes"]
    # setup --stream stops without shard 2 (its host answers 404)
    srv.set_faults({shard2: [{"type": "status", "code": 404, "repeat": True}]})
    r = env.setup(inv, "--stream")
    check(r.returncode == 1, "setup --stream fails on the 404: %s" % r.stderr)
    dest = os.path.join(env.root, "demo")
    check(not os.path.exists(os.path.join(dest, shard2)), "shard 2 is not there")
    srv.set_faults({})
    seen = len(srv.requests())
    r = fetch_cmd(env, "fetch-weights", "--spine-only")
    check(r.returncode == 0, "fetch-weights --spine-only: %s %s" % (r.stdout, r.stderr))
    new = srv.requests()[seen:]
    check(new and all(q["path"].endswith("/" + shard2) and q["range"] for q in new),
          "only shard 2, by range requests: %s" % new)
    check(all(range_of(q)[1] <= spine2 for q in new) and
          sum(q["bytes"] for q in new) <= spine2,
          "only its header and spine (%d bytes), no expert: %s" % (spine2, new))
    # the sparse shard: the release's bytes outside the experts, holes inside
    want = bytearray(open(os.path.join(src, shard2), "rb").read())
    for shard, a, b in expert_extents(src).values():
        if shard == shard2:
            want[a:b] = bytes(b - a)
    check(open(os.path.join(dest, shard2), "rb").read() == want,
          "shard 2 holds its header and spine at their offsets, its experts are holes")
    c = json.loads(env.setup(inv, "--check", pre=["--json"]).stdout)
    st = {f["path"]: f["status"] for f in c["files"]}
    check(st[shard2] == "sparse" and c["experts"]["absent"] == 8 * 256 and c["experts"]["tls_only"] == 0,
          "recorded sparse, no expert fetched: %s" % c)
    seen = len(srv.requests())
    r = fetch_cmd(env, "fetch-weights", "--spine-only")
    check(r.returncode == 0 and len(srv.requests()) == seen, "a rerun fetches nothing: %s" % r.stderr)


def stream_gateway_health_shows_expert_progress(env):
    gw_bin = os.path.join(os.environ.get("K3_BUILD_ROOT", os.path.dirname(os.path.dirname(K3D))),
                          "client", "gateway", "k3-gateway")
    src, srv, inv = world(env)
    check(env.setup(inv, "--stream").returncode == 0, "setup --stream")
    dest = os.path.join(env.root, "demo")
    d = Daemon(env, dest, "--fetch-experts")
    gw = None
    try:
        d.ids(PROMPTS[0])
        gw = subprocess.Popen([gw_bin, "--listen", "127.0.0.1:0", "--socket", d.sock, "--quiet"],
                              stderr=subprocess.PIPE, text=True)
        line = gw.stderr.readline()
        check("listening on http://" in line, "k3-gateway starts: %s" % line)
        port = int(line.split("listening on http://")[1].split(",")[0].rsplit(":", 1)[1])
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        c.request("GET", "/health")
        resp = c.getresponse()
        health = json.loads(resp.read())
        c.close()
        status = json.loads(d.k3ctl("status", "--json").stdout)["status"]
    finally:
        if gw:
            gw.terminate()
            gw.wait(10)
        d.stop()
    on_disk = sum(1 for v in expert_map(dest).values() if v)
    check(resp.status == 200 and health["status"] == "ok", "/health is ok: %s" % health)
    check(health.get("k3d") == status, "/health carries k3d's STATUS text: %s vs %s" % (health, status))
    check(on_disk > 0 and "streaming experts: %d fetched (" % on_disk in status,
          "the text counts the %d experts k3d fetched: %s" % (on_disk, status))


TESTS = {f.__name__: f for f in [
    stream_ids_match_full, stream_refuses_without_fetch_experts,
    stream_expert_table_verifies_before_use, stream_flipped_expert_never_used,
    stream_whole_shard_check, packs_record_verified_sha256,
    warm_expert_cache_fetch_most_used_missing, fetch_weights_spine_only,
    stream_gateway_health_shows_expert_progress]}

if __name__ == "__main__":
    if shutil.which("openssl") is None:
        print("SKIP: the openssl tool is needed for the throwaway CA")
        sys.exit(77)
    K3D = sys.argv.pop(2)
    run_named(TESTS, sys.argv)

#!/usr/bin/env python3
"""test_stream.py K3CTL K3D NAME - streaming installs (k3ctl setup --stream)
against the local HTTPS server: k3d --fetch-experts serves a demo model
whose routed experts arrive on demand, with ids identical to the full
install's; per-expert verification; the whole-shard check; packs record
verified SHA-256s."""
import json
import os
import shutil
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


TESTS = {f.__name__: f for f in [
    stream_ids_match_full, stream_refuses_without_fetch_experts,
    stream_expert_table_verifies_before_use, stream_flipped_expert_never_used,
    stream_whole_shard_check, packs_record_verified_sha256]}

if __name__ == "__main__":
    if shutil.which("openssl") is None:
        print("SKIP: the openssl tool is needed for the throwaway CA")
        sys.exit(77)
    K3D = sys.argv.pop(2)
    run_named(TESTS, sys.argv)

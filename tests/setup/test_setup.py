#!/usr/bin/env python3
"""test_setup.py K3CTL NAME - one named fault test of k3ctl setup against a
local HTTPS server (k3serve.py, a throwaway CA made at test time, 127.0.0.1
only) serving a demo model and its inventory. Each test states what must
happen; docs/setup.md ("Faults tried") lists them with what happens."""
import json
import os
import re
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from setup_harness import SkipTest, check, kill, run_named, sha256_file  # noqa: E402

SHARD1 = "model-00001-of-00002.safetensors"
MB = 1 << 20


def model_files(src):
    return sorted(n for n in os.listdir(src) if not n.startswith("."))


def assert_installed(env, src, names=None):
    dest = os.path.join(env.root, "demo")
    for n in names or model_files(src):
        p = os.path.join(dest, n)
        check(os.path.isfile(p) and not os.path.islink(p), "%s is installed" % n)
        check(sha256_file(p) == sha256_file(os.path.join(src, n)), "%s has the source's bytes" % n)


def world(env, **kw):
    src = env.demo_model()
    srv = env.server(src, **{k: v for k, v in kw.items() if k in ("rate", "token", "page")})
    inv, doc = env.inventory(src, srv.base, edit=kw.get("edit"))
    return src, srv, inv, doc


def file_requests(srv, name):
    return [r for r in srv.requests(name) if r["path"].startswith("/repo/")]


def requests_under(srv, prefix):
    """Every request the server saw for a path under prefix."""
    return [q for q in srv.requests() if q["path"].startswith(prefix)]


def setup_redirected(env, name, location, world_kw=None, setup_env=None):
    """Runs setup --full (with setup_env's variables) in a fresh world
    whose server redirects every request for name to location (a format
    of the server's port); returns (src, srv, the setup's result)."""
    src, srv, inv, _ = world(env, **(world_kw or {}))
    srv.set_faults({name: [{"type": "redirect", "location": location % srv.port, "repeat": True}]})
    return src, srv, env.setup(inv, "--full", env=setup_env)


# ---- tests ----

def full_install_and_rerun(env):
    src, srv, inv, _ = world(env)
    r = env.setup(inv, "--full")
    check(r.returncode == 0, "setup --full succeeds: %s" % r.stderr)
    assert_installed(env, src)
    n = len(srv.requests())
    check(n == len(model_files(src)), "one request per file (%d)" % n)
    r = env.setup(inv, "--full")
    check(r.returncode == 0 and len(srv.requests()) == n, "a rerun fetches nothing")
    r = env.setup(inv, "--check")
    check(r.returncode == 0 and "6 verified" in r.stdout, "--check passes: %s" % r.stdout)
    # the installed directory's inventory is the source's
    out = subprocess.run([env.k3ctl, "inventory", os.path.join(env.root, "demo")],
                         check=True, stdout=subprocess.PIPE, text=True).stdout
    got = {f["path"]: (f["size"], f["sha256"]) for f in json.loads(out)["files"]}
    want = {f: (os.path.getsize(os.path.join(src, f)), sha256_file(os.path.join(src, f)))
            for f in model_files(src)}
    check(got == want, "k3ctl inventory of the install equals the source")


def connection_killed_rerun_resumes(env):
    src, srv, inv, _ = world(env)
    size = os.path.getsize(os.path.join(src, SHARD1))
    cut = 1500000
    srv.set_faults({SHARD1: [{"type": "cut", "after": cut, "repeat": True}]})
    r = env.setup(inv, "--full", "--retries", "0", "--chunk-mib", "1")
    check(r.returncode == 1 and "gave up" in r.stderr, "the cut fails the run: %s" % r.stderr)
    part = os.path.join(env.root, "demo", SHARD1 + ".partial")
    check(os.path.getsize(part) == cut, "the partial holds what arrived")
    check(not os.path.exists(os.path.join(env.root, "demo", SHARD1)), "not published")
    srv.set_faults({})
    before = len(file_requests(srv, SHARD1))
    r = env.setup(inv, "--full", "--chunk-mib", "1")
    check(r.returncode == 0, "the rerun succeeds: %s" % r.stderr)
    again = file_requests(srv, SHARD1)[before:]
    check(len(again) == 1 and again[0]["range"] == "bytes=%d-%d" % (cut, size - 1),
          "the rerun asks only for the rest: %s" % again)
    check(again[0]["bytes"] == size - cut, "and gets only the rest")
    assert_installed(env, src)


def flipped_byte_refetched(env):
    src, srv, inv, _ = world(env)
    srv.set_faults({SHARD1: [{"type": "flip", "at": 1234567}]})
    r = env.setup(inv, "--full")
    check(r.returncode == 0, "setup succeeds: %s" % r.stderr)
    reqs = file_requests(srv, SHARD1)
    check(len(reqs) == 2 and all(q["range"] is None for q in reqs),
          "the flipped download is fetched again in full: %s" % reqs)
    check("SHA-256" in r.stderr, "the mismatch is reported")
    assert_installed(env, src)


def flipped_byte_never_published(env):
    src, srv, inv, _ = world(env)
    srv.set_faults({SHARD1: [{"type": "flip", "at": 1234567, "repeat": True}]})
    r = env.setup(inv, "--full")
    check(r.returncode == 1 and "SHA-256" in r.stderr and "not published" in r.stderr,
          "a persistent flip fails with a SHA-256 message: %s" % r.stderr)
    dest = os.path.join(env.root, "demo")
    check(not os.path.exists(os.path.join(dest, SHARD1)), "the bad shard is never published")
    check(not os.path.exists(os.path.join(dest, SHARD1 + ".partial")), "nor kept as a partial")
    assert_installed(env, src, [n for n in model_files(src) if n != SHARD1])
    r = env.setup(inv, "--check")
    check(r.returncode == 1 and "missing" in r.stdout, "--check reports it missing")


def truncated_body_resumed(env):
    src, srv, inv, _ = world(env)
    size = os.path.getsize(os.path.join(src, SHARD1))
    srv.set_faults({SHARD1: [{"type": "cut", "after": 1000000}]})
    r = env.setup(inv, "--full", "--retry-delay", "50")
    check(r.returncode == 0, "setup succeeds: %s" % r.stderr)
    reqs = file_requests(srv, SHARD1)
    check(len(reqs) == 2 and reqs[0]["bytes"] == 1000000 and
          reqs[1]["range"] == "bytes=1000000-%d" % (size - 1),
          "the retry resumes where the body stopped: %s" % reqs)
    check(sum(q["bytes"] for q in reqs) == size, "no byte fetched twice")
    assert_installed(env, src)


def content_length_mismatch_refused(env):
    src, srv, inv, _ = world(env)
    size = os.path.getsize(os.path.join(src, SHARD1))
    srv.set_faults({SHARD1: [{"type": "length", "value": size - 100, "repeat": True}]})
    r = env.setup(inv, "--full", "--retry-delay", "50")
    check(r.returncode == 1 and "manifest mismatch" in r.stderr and str(size - 100) in r.stderr,
          "a different Content-Length is a manifest mismatch: %s" % r.stderr)
    check(len(file_requests(srv, SHARD1)) == 1, "and is not retried")
    check(not os.path.exists(os.path.join(env.root, "demo", SHARD1)), "nothing published")


def retry_503_then_success(env):
    src, srv, inv, _ = world(env)
    srv.set_faults({SHARD1: [{"type": "status", "code": 503, "retry_after": 0}] * 2})
    r = env.setup(inv, "--full", "--retry-delay", "50", pre=["--json"])
    check(r.returncode == 0, "setup succeeds: %s" % r.stderr)
    reqs = file_requests(srv, SHARD1)
    check([q["status"] for q in reqs] == [503, 503, 200], "503, 503, then the file: %s" % reqs)
    events = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    retries = [e for e in events if e["event"] == "retry" and e["file"] == SHARD1]
    check(len(retries) == 2 and all(e["reason"] == "HTTP 503" for e in retries),
          "two retry events: %s" % retries)
    check(any(e["event"] == "verified" and e["file"] == SHARD1 for e in events), "then verified")
    check(events[-1]["event"] == "done" and events[-1]["ok"], "done event last")
    assert_installed(env, src)


def stall_retried_after_idle_timeout(env):
    src, srv, inv, _ = world(env)
    size = os.path.getsize(os.path.join(src, SHARD1))
    srv.set_faults({SHARD1: [{"type": "stall", "after": 800000, "seconds": 30}]})
    t0 = time.monotonic()
    r = env.setup(inv, "--full", "--idle-timeout", "2", "--retry-delay", "50")
    dt = time.monotonic() - t0
    check(r.returncode == 0, "setup succeeds: %s" % r.stderr)
    check(2 <= dt < 20, "the stall costs about the idle timeout, not the stall (%.1f s)" % dt)
    reqs = file_requests(srv, SHARD1)
    check(len(reqs) == 2 and reqs[1]["range"] == "bytes=800000-%d" % (size - 1),
          "retried from where it stalled: %s" % reqs)
    check("stalled" in r.stderr, "the retry says why")
    assert_installed(env, src)


def redirect_off_allow_list_refused(env):
    src, srv, r = setup_redirected(env, "config.json", "https://localhost:%d/cdn/config.json")
    check(r.returncode == 1 and "'localhost'" in r.stderr and "allow list" in r.stderr,
          "a redirect off the allow list is refused: %s" % r.stderr)
    check(not requests_under(srv, "/cdn/"),
          "the refused host is never contacted")
    check(not os.path.exists(os.path.join(env.root, "demo", "config.json")), "nothing published")


def redirect_allowed_token_scoped(env):
    token = "hf_scopeTEST0123"
    src, srv, r = setup_redirected(
        env, SHARD1, "https://localhost:%d/cdn/" + SHARD1, setup_env={"HF_TOKEN": token},
        world_kw=dict(token=token, edit=lambda d: d.update(allow_hosts=["localhost"])))
    check(r.returncode == 0, "an allowed redirect is followed: %s" % r.stderr)
    repo = requests_under(srv, "/repo/")
    cdn = requests_under(srv, "/cdn/")
    check(repo and all(q["auth"] for q in repo), "the token goes to the repository host")
    check(len(cdn) == 1 and not cdn[0]["auth"], "never to the redirect target: %s" % cdn)
    check(token not in r.stdout + r.stderr, "the token is never printed")
    assert_installed(env, src)


def redirect_to_http_refused(env):
    src, srv, r = setup_redirected(env, "config.json", "http://127.0.0.1:%d/cdn/config.json")
    check(r.returncode == 1 and "not https://" in r.stderr, "plain HTTP is refused: %s" % r.stderr)
    check(not requests_under(srv, "/cdn/"), "never contacted")


def symlink_at_destination_refused(env):
    src, srv, inv, _ = world(env)
    dest = os.path.join(env.root, "demo")
    os.makedirs(dest)
    victim = os.path.join(env.tmp, "victim")
    with open(victim, "w") as f:
        f.write("precious")
    os.symlink(victim, os.path.join(dest, "config.json"))
    r = env.setup(inv, "--plan")
    check(r.returncode == 1 and "symbolic link" in r.stdout, "--plan names the link: %s" % r.stdout)
    r = env.setup(inv, "--full")
    check(r.returncode == 1 and "symbolic link" in r.stderr, "setup refuses: %s" % r.stderr)
    check(len(srv.requests()) == 0, "before any transfer")
    check(open(victim).read() == "precious", "the link's target is untouched")
    check(os.path.islink(os.path.join(dest, "config.json")), "the link is left alone")
    # a link planted at a partial's name instead
    os.unlink(os.path.join(dest, "config.json"))
    os.symlink(victim, os.path.join(dest, SHARD1 + ".partial"))
    r = env.setup(inv, "--full")
    check(r.returncode == 1 and "symbolic link" in r.stderr, "a linked .partial is refused: %s"
          % r.stderr)
    check(open(victim).read() == "precious", "its target is untouched")
    check(not os.path.exists(os.path.join(dest, SHARD1)), "that shard is not installed")


def disk_too_small_refused_by_plan(env):
    src, srv, inv, _ = world(env)
    # a real small file system when user namespaces allow one, else a
    # reserve larger than any disk: both are the same refusal
    small = os.path.join(env.tmp, "small")
    os.makedirs(small)
    probe = subprocess.run(["unshare", "-rm", "sh", "-c",
                            "mount -t tmpfs -o size=1m tmpfs %s" % small],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    variants = [("reserve", ["--reserve", "1000000000"], None)]
    if probe.returncode == 0:
        variants.append(("tmpfs", [], small))
    for label, extra, root in variants:
        for mode in (["--plan"], ["--full"]):
            args = [env.k3ctl, "setup", "--inventory", inv, "--cacert", env.ca,
                    "--model-root", root or env.root] + mode + extra
            if root:
                script = "mount -t tmpfs -o size=1m tmpfs %s && exec \"$@\"" % root
                args = ["unshare", "-rm", "sh", "-c", script, "sh"] + args
            r = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "HOME": env.tmp})
            if mode == ["--plan"]:
                check(r.returncode == 1 and "does NOT fit" in r.stdout,
                      "%s: --plan refuses: %s" % (label, r.stdout))
            else:
                check(r.returncode == 1 and "not enough space" in r.stderr,
                      "%s: setup refuses: %s" % (label, r.stderr))
    check(len(srv.requests()) == 0, "no request was ever made")
    check(not os.path.exists(os.path.join(env.root, "demo")), "nothing was written")


def kill9_resumes_verified(env):
    src, srv, inv, _ = world(env, rate=1000000)
    size = os.path.getsize(os.path.join(src, SHARD1))
    part = os.path.join(env.root, "demo", SHARD1 + ".partial")
    proc = subprocess.Popen([env.k3ctl, "setup", "--inventory", inv, "--model-root", env.root,
                             "--cacert", env.ca, "--full", "--workers", "1", "--chunk-mib", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "HOME": env.tmp})
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if os.path.exists(part) and os.path.getsize(part) >= 1600000:
            break
        time.sleep(0.02)
    kill(proc)
    arrived = os.path.getsize(part)
    check(1600000 <= arrived < size, "killed mid-file (%d bytes arrived)" % arrived)
    srv.stop()
    fast = env.server(src)
    r = env.setup(inv, "--full", "--from", fast.base, "--chunk-mib", "1")
    check(r.returncode == 0, "the rerun succeeds: %s" % r.stderr)
    reqs = file_requests(fast, SHARD1)
    check(len(reqs) == 1 and reqs[0]["range"], "the shard is resumed by range: %s" % reqs)
    start = int(reqs[0]["range"].split("=")[1].split("-")[0])
    check(arrived - MB <= start <= arrived,
          "resumed from a verified checkpoint at most one chunk back (%d of %d)" % (start, arrived))
    assert_installed(env, src)
    r = env.setup(inv, "--check", "--rehash")
    check(r.returncode == 0, "every hash verified: %s" % r.stdout)


def token_never_logged(env):
    token = "hf_SECRETtoken9876"
    src, srv, inv, _ = world(env, token=token)
    r = env.setup(inv, "--full")
    check(r.returncode == 1 and "HF_TOKEN" in r.stderr, "401 names HF_TOKEN: %s" % r.stderr)
    r2 = env.setup(inv, "--full", env={"HF_TOKEN": token}, pre=["--json"])
    check(r2.returncode == 0, "with HF_TOKEN it succeeds: %s" % r2.stderr)
    tf = os.path.join(env.tmp, "token")
    with open(tf, "w") as f:
        f.write(token + "\n")
    shutil.rmtree(os.path.join(env.root, "demo"))
    r3 = env.setup(inv, "--full", "--token-file", tf)
    check(r3.returncode == 0, "with --token-file it succeeds: %s" % r3.stderr)
    for x in (r, r2, r3):
        check(token not in x.stdout and token not in x.stderr, "the token is never printed")
    for n in os.listdir(os.path.join(env.root, "demo", ".k3-setup")):
        p = os.path.join(env.root, "demo", ".k3-setup", n)
        check(token not in open(p, errors="replace").read(), "nor written to %s" % n)
    assert_installed(env, src)


def listing_edit(also):
    """An inventory edit: the files come with a tree listing (listing_url)
    and SHARD1's size is left to it; also(f) edits each other file."""
    def edit(d):
        d["listing_url"] = d["base_url"].replace("/repo/", "/api/tree")
        for f in d["files"]:
            if f["path"] == SHARD1:
                f["size"] = None
            else:
                also(f)
    return edit


def listing_completes_unknowns(env):
    def unknown_sha(f):
        if f["path"] == "tiktoken.model":
            f["sha256"] = None
    src, srv, inv, _ = world(env, edit=listing_edit(unknown_sha), page=2)
    r = env.setup(inv, "--full")
    check(r.returncode == 0, "setup succeeds: %s" % r.stderr)
    pages = requests_under(srv, "/api/tree")
    check(len(pages) == 3, "every listing page is read (%d)" % len(pages))
    pinned = json.load(open(os.path.join(env.root, "demo", ".k3-setup", "inventory.json")))
    got = {f["path"]: f for f in pinned["files"]}
    check(got[SHARD1]["size"] == os.path.getsize(os.path.join(src, SHARD1)),
          "the size comes from the listing and is pinned")
    check(got["tiktoken.model"]["sha256"] == sha256_file(os.path.join(src, "tiktoken.model")),
          "the SHA-256 comes from the listing's LFS oid and is pinned")
    assert_installed(env, src)


def listing_mismatch_fatal(env):
    def wrong_size(f):
        if f["path"] == "model-00002-of-00002.safetensors":
            f["size"] += 1
    src, srv, inv, _ = world(env, edit=listing_edit(wrong_size))
    r = env.setup(inv, "--full")
    check(r.returncode == 1 and "manifest mismatch" in r.stderr and "remote listing" in r.stderr,
          "a pinned value the listing contradicts is fatal: %s" % r.stderr)
    check(not requests_under(srv, "/repo/"),
          "no file is fetched")


def check_finds_damage_setup_never_replaces(env):
    src, srv, inv, _ = world(env)
    check(env.setup(inv, "--full").returncode == 0, "installed")
    r = env.setup(inv, "--plan")
    check(r.returncode == 0 and "0 B to fetch" in r.stdout, "--plan: nothing to fetch: %s" % r.stdout)
    p = os.path.join(env.root, "demo", SHARD1)
    with open(p, "r+b") as f:
        f.seek(2000000)
        b = f.read(1)
        f.seek(2000000)
        f.write(bytes([b[0] ^ 0x10]))
    r = env.setup(inv, "--check")
    check(r.returncode == 1 and "MISMATCH" in r.stdout and SHARD1 in r.stdout,
          "--check finds the damaged shard: %s" % r.stdout)
    n = len(srv.requests())
    r = env.setup(inv, "--full")
    check(r.returncode == 1 and "never replaces" in r.stderr, "setup will not replace it: %s"
          % r.stderr)
    check(len(srv.requests()) == n, "and fetches nothing")


def server_ignores_range(env):
    src, srv, inv, _ = world(env)
    srv.set_faults({SHARD1: [{"type": "cut", "after": 1500000}, {"type": "ignore_range"}]})
    r = env.setup(inv, "--full", "--retry-delay", "50")
    check(r.returncode == 0, "setup succeeds: %s" % r.stderr)
    reqs = file_requests(srv, SHARD1)
    check(len(reqs) == 2 and reqs[1]["range"] and reqs[1]["status"] == 200,
          "a 200 to a range request: %s" % reqs)
    assert_installed(env, src)


def plain_progress_lines(env):
    # stderr is a pipe, not a TTY: plain lines, one every 10 s while a
    # transfer runs (here a shard that stalls for 11 s) and one per file
    src, srv, inv, _ = world(env)
    size = os.path.getsize(os.path.join(src, SHARD1))
    srv.set_faults({SHARD1: [{"type": "stall", "after": 300000, "seconds": 11}]})
    r = env.setup(inv, "--full", "--idle-timeout", "30")
    check(r.returncode == 0, "setup succeeds: %s" % r.stderr)
    check("\033[" not in r.stderr, "no terminal control sequences on a pipe")
    num = r"[0-9]+(?:\.[0-9]{1,2})? (?:B|kB|MB|GB|TB)"
    period = [ln for ln in r.stderr.splitlines()
              if re.fullmatch(r"[0-9]+\.[0-9]%% \(%s of %s\), %s/s, ETA \S+; [0-9]+ files? in flight"
                              % (num, num, num), ln)]
    check(period, "a periodic line with the percentage, bytes, rate, ETA: %s" % r.stderr)
    pct = float(period[0].split("%")[0])
    check(0 < pct < 100, "taken while the shard was in flight: %s" % period[0])
    check("1 file in flight" in period[0], "the stalled shard is in flight: %s" % period[0])
    for n in model_files(src):
        check(re.search(r"^verified %s \(%s\)$" % (re.escape(n), num), r.stderr, re.M),
              "a line for %s with its size: %s" % (n, r.stderr))
    check(re.search(r"^verified %s \(%.1f MB\)$" % (re.escape(SHARD1), size / 1e6), r.stderr, re.M),
          "the shard's line says its bytes")
    check(re.search(r"^done: %d files verified, [0-9.]+ [kMG]?B fetched in [0-9.]+ s$"
                    % len(model_files(src)), r.stderr, re.M), "a closing line: %s" % r.stderr)


TESTS = {f.__name__: f for f in [
    full_install_and_rerun, connection_killed_rerun_resumes, flipped_byte_refetched,
    flipped_byte_never_published, truncated_body_resumed, content_length_mismatch_refused,
    retry_503_then_success, stall_retried_after_idle_timeout, redirect_off_allow_list_refused,
    redirect_allowed_token_scoped, redirect_to_http_refused, symlink_at_destination_refused,
    disk_too_small_refused_by_plan, kill9_resumes_verified, token_never_logged,
    listing_completes_unknowns, listing_mismatch_fatal, check_finds_damage_setup_never_replaces,
    server_ignores_range, plain_progress_lines]}

if __name__ == "__main__":
    if shutil.which("openssl") is None:
        print("SKIP: the openssl tool is needed for the throwaway CA")
        sys.exit(77)
    if len(sys.argv) == 2 or sys.argv[2] == "--list":
        print("\n".join(TESTS))
        sys.exit(0)
    run_named(TESTS, sys.argv)

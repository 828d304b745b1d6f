"""setup_harness.py - what the tests/setup scripts share: a throwaway CA and
server certificate made with openssl at test time, the fault-injecting
HTTPS server (k3serve.py) on 127.0.0.1, a demo model and its inventory, and
k3ctl runs. Stdlib only; everything lives in one temporary directory."""
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def make_ca(d):
    """CA + a server certificate for 127.0.0.1 and localhost (EC keys: fast)."""
    def run(*args):
        subprocess.run(["openssl"] + list(args), check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    ca_key, ca = os.path.join(d, "ca.key"), os.path.join(d, "ca.pem")
    key, csr, crt = (os.path.join(d, n) for n in ("srv.key", "srv.csr", "srv.pem"))
    ext = os.path.join(d, "ext.cnf")
    run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", ca_key, "-out", ca, "-days", "2", "-subj", "/CN=k3 test CA",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign")
    run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", key, "-out", csr, "-subj", "/CN=127.0.0.1")
    with open(ext, "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
    run("x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-out", crt,
        "-days", "2", "-extfile", ext)
    return ca, crt, key


class Server:
    def __init__(self, env, root, rate=0, token=None, page=0, port=0):
        self.env, self.root = env, root
        self.log = os.path.join(env.tmp, "server-%d.log" % time.monotonic_ns())
        self.faults = os.path.join(env.tmp, "faults.json")
        args = [sys.executable, os.path.join(HERE, "k3serve.py"), "--root", root,
                "--cert", env.crt, "--key", env.key, "--log", self.log, "--faults", self.faults,
                "--port", str(port)]
        if rate:
            args += ["--rate", str(rate)]
        if token:
            args += ["--token", token]
        if page:
            args += ["--page", str(page)]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("PORT "):
            raise RuntimeError("k3serve did not start")
        self.port = int(line.split()[1])
        self.base = "https://127.0.0.1:%d/repo/" % self.port

    def set_faults(self, faults):
        with open(self.faults, "w") as f:
            json.dump(faults, f)

    def requests(self, name=None):
        if not os.path.exists(self.log):
            return []
        out = []
        with open(self.log) as f:
            for line in f:
                r = json.loads(line)
                if name is None or r["path"].endswith("/" + name):
                    out.append(r)
        return out

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


class Env:
    """One test's world: a temp dir, CA, demo model, server(s)."""

    def __init__(self, k3ctl):
        self.k3ctl = k3ctl
        self.tmp = tempfile.mkdtemp(prefix="k3setup-")
        self.ca, self.crt, self.key = make_ca(self.tmp)
        self.servers = []
        self.root = os.path.join(self.tmp, "root")        # the --model-root of installs

    def demo_model(self, name="demo", preset="nano", extra=()):
        os.makedirs(os.path.join(self.tmp, "src"), exist_ok=True)
        out = os.path.join(self.tmp, "src", name)
        subprocess.run([self.k3ctl, "demo-model", "--out", out, "--preset", preset] + list(extra),
                       check=True, stdout=subprocess.DEVNULL)
        return out

    def inventory(self, src, base, edit=None, name="inv.json"):
        """k3ctl inventory of src pointing at base; edit(dict) may change it."""
        r = subprocess.run([self.k3ctl, "inventory", src, "--repository", "test/demo",
                            "--revision", "r1", "--base-url", base],
                           check=True, stdout=subprocess.PIPE, text=True)
        inv = json.loads(r.stdout)
        if edit:
            edit(inv)
        path = os.path.join(self.tmp, name)
        with open(path, "w") as f:
            json.dump(inv, f)
        return path, inv

    def server(self, root, **kw):
        s = Server(self, root, **kw)
        self.servers.append(s)
        return s

    def setup(self, inv, *args, env=None, timeout=120, **kw):
        """k3ctl setup --inventory inv --model-root root --cacert ca ARGS."""
        cmd = [self.k3ctl] + list(kw.pop("pre", [])) + ["setup", "--inventory", inv,
                                                        "--model-root", self.root,
                                                        "--cacert", self.ca] + list(args)
        e = dict(os.environ)
        e.pop("HF_TOKEN", None)
        e["HOME"] = self.tmp     # no token file of the user's
        if env:
            e.update(env)
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=e, timeout=timeout)
        # under ASan/UBSan a report on any path (error paths included) fails the test
        check("Sanitizer" not in r.stderr and "runtime error:" not in r.stderr,
              "a sanitizer report: %s" % r.stderr[-3000:])
        return r

    def close(self):
        for s in self.servers:
            s.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)


def check(cond, msg):
    if not cond:
        raise AssertionError(msg)


def run_named(tests, argv):
    """argv: [k3ctl, name]: runs tests[name](Env) and exits 0/1 (77: skip)."""
    k3ctl, name = argv[1], argv[2]
    fn = tests[name]
    env = Env(k3ctl)
    try:
        fn(env)
    except SkipTest as e:
        print("SKIP %s: %s" % (name, e))
        env.close()
        sys.exit(77)
    except AssertionError as e:
        print("FAIL %s: %s" % (name, e))
        env.close()
        sys.exit(1)
    env.close()
    print("ok %s" % name)
    sys.exit(0)


class SkipTest(Exception):
    pass


def kill(proc):
    try:
        proc.send_signal(signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()

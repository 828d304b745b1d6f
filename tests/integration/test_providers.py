#!/usr/bin/env python3
"""--provider through the real k3d and k3ctl: every provider built (cpu,
auto, and torch when meson found LibTorch) serves the same text for the
same greedy request, the start-up log names the provider, and no
sanitizer report appears.

usage: test_providers.py K3D K3CTL
"""
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
from k3proto import Daemon, make_model  # noqa: E402
from k3test import check, report  # noqa

K3D, K3CTL = sys.argv[1], sys.argv[2]


def k3ctl(sock, *args):
    return subprocess.run([K3CTL, "--socket", sock, *args], capture_output=True, text=True,
                          timeout=60)


def test_providers(k3d):
    """auto resolves to cpu without a CUDA device; torch must give the
    cpu provider's tokens (greedy, identical ids on the demo model)."""
    outs = {}
    built = subprocess.run([K3CTL, "forward", "--model", os.environ["K3_TEST_MODEL"], "--ids", "1",
                            "--provider", "torch"], capture_output=True, text=True, timeout=60)
    names = ["cpu", "auto"] + (["torch"] if built.returncode == 0 else [])
    for name in names:
        d = Daemon(k3d, "--provider", name)
        try:
            r = k3ctl(d.sock, "run", "--max-new", "6", "hello there")
            check(r.returncode == 0, f"--provider {name}: run ({r.stderr!r})")
            outs[name] = r.stdout
            check(f"config: provider={name}" in d.log_text(), f"--provider {name} is logged")
        finally:
            d.stop()
        check(not d.sanitizer_reports(), f"--provider {name}: no sanitizer reports")
    check(len(set(outs.values())) == 1, f"every provider gives the same text: {outs}")
    print("providers tried:", ", ".join(names))



def main():
    os.environ["K3_TEST_MODEL"] = make_model(K3CTL)
    test_providers(K3D)
    shutil.rmtree(os.path.dirname(os.environ["K3_TEST_MODEL"]), ignore_errors=True)
    return report()


if __name__ == "__main__":
    sys.exit(main())

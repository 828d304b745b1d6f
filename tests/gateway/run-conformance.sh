#!/usr/bin/env bash
# tests/gateway/run-conformance.sh GATEWAY_BIN - the gateway conformance
# suite (meson suite 'gateway'). Runs pytest from the virtualenv made by
# tests/gateway/setup-venv.sh; without it the suite SKIPs (exit 77).
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
venv=${K3_GATEWAY_VENV:-$root/build/venv}
# A file check, not an import: importing these costs seconds.
have() { compgen -G "$venv/lib/python3*/site-packages/$1/__init__.py" >/dev/null; }
if [ ! -x "$venv/bin/python" ] || ! have openai || ! have langchain_openai || ! have pytest; then
	echo "SKIP: no Python venv with openai, langchain-openai and pytest at $venv;" \
		"run tests/gateway/setup-venv.sh (scripts/test does)"
	exit 77
fi
export K3_GATEWAY_BIN=$1
cd "$here" && exec "$venv/bin/python" -m pytest -q -p no:cacheprovider -o addopts= --durations=6 test_conformance.py test_real_k3d.py test_browser.py

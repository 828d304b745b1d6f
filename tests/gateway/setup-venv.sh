#!/usr/bin/env bash
# tests/gateway/setup-venv.sh [VENV] - create the Python virtualenv the
# gateway conformance suite runs in (default build/venv): the official
# `openai` SDK, `langchain-openai` and `pytest` from PyPI, plus `playwright`
# where Debian's chromium is installed (for the browser CORS test; it never
# downloads a browser). Idempotent: a venv that already has them is left
# alone. Exit 0 when ready, non-zero otherwise.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
venv=${1:-$root/build/venv}
pkgs=(openai langchain_openai pytest)
reqs=('openai>=1.40,<3' 'langchain-openai>=0.2' 'pytest>=7')
if command -v chromium >/dev/null 2>&1; then
	pkgs+=(playwright)
	reqs+=('playwright>=1.40')
fi
# A file check, not an import: importing these costs seconds.
have() { compgen -G "$venv/lib/python3*/site-packages/$1/__init__.py" >/dev/null; }
missing=0
for p in "${pkgs[@]}"; do have "$p" || missing=1; done
[ -x "$venv/bin/python" ] && [ $missing -eq 0 ] && exit 0
mkdir -p "$(dirname "$venv")"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check "${reqs[@]}"
for p in "${pkgs[@]}"; do have "$p" || { echo "setup-venv: $p missing after install" >&2; exit 1; }; done
echo "gateway venv ready: $venv (${pkgs[*]})"

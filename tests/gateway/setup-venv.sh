#!/usr/bin/env bash
# tests/gateway/setup-venv.sh [VENV] - create the Python virtualenv the
# gateway conformance suite runs in (default build/venv): the official
# `openai` SDK and `langchain-openai` from PyPI. Idempotent: a venv that
# already imports both is left alone. Exit 0 when ready, 1 otherwise.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
venv=${1:-$root/build/venv}
py="$venv/bin/python"
if [ -x "$py" ] && "$py" -c 'import openai, langchain_openai, pytest' 2>/dev/null; then
	exit 0
fi
mkdir -p "$(dirname "$venv")"
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check \
	'openai>=1.40,<3' 'langchain-openai>=0.2' 'pytest>=7'
"$py" -c 'import openai, langchain_openai, pytest; print("gateway venv: openai", openai.__version__)'

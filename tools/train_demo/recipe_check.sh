#!/usr/bin/env bash
# tools/train_demo/recipe_check.sh [K3CTL] - retrains the trained demo
# model from its recipe (model/RECIPE.json: seed, dims, training settings) into a temporary
# directory and compares every file's SHA-256 with model/SHA256SUMS.
# By hand only (never in CI: it trains, ~25 min of one core); byte
# equality needs the recipe's environment (Debian 12 python3-torch
# 1.13.1, OpenBLAS, one thread), see README.md. Exit 0 when every file
# matches.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
k3ctl=${1:-$root/build/plain/client/k3ctl/k3ctl}
py=/usr/bin/python3
"$py" -c 'import torch' 2>/dev/null || { echo "needs Debian's python3-torch (apt-get install python3-torch)"; exit 77; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
nice -n 10 "$py" "$here/train.py" --k3ctl "$k3ctl" --out "$out" --recipe "$here/model/RECIPE.json"
cd "$out"
if sha256sum -c "$here/model/SHA256SUMS"; then
	echo "recipe check: the retrained checkpoint is byte-identical to the shipped one"
else
	echo "recipe check: FAILED (see the lines above; RECIPE.json records the environment it was made in)"
	exit 1
fi

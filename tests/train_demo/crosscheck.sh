#!/usr/bin/env bash
# tests/train_demo/crosscheck.sh K3CTL SOURCE_ROOT SHARED_DIR [golden|trained]
# The float64 cross-check of the third implementation (tools/train_demo/
# k3torch.py) under the first python that imports torch: `golden` against
# the forward goldens and k3d on them; `trained` against k3d on the shipped
# trained demo checkpoint. Exit 77 (SKIP) when no python has torch
# (apt-get install python3-torch).
set -uo pipefail
k3ctl=$(realpath "$1") src=$2 shared=$3 what=${4:-golden}
py=
for p in "$src/build/venv/bin/python" /usr/bin/python3 python3; do
	if command -v "$p" >/dev/null 2>&1 && "$p" -c 'import torch' >/dev/null 2>&1; then
		py=$p
		break
	fi
done
[ -n "$py" ] || { echo "SKIP: no python3 with torch (apt-get install python3-torch)"; exit 77; }
cd "$src"
if [ "$what" = golden ]; then
	exec "$py" tools/train_demo/crosscheck.py --golden "$shared/golden/forward" --k3ctl "$k3ctl"
fi
rc=0
for text in "The capital of France is" "Let us count from 1 to 9: 1, 2, 3,"; do
	"$py" tools/train_demo/crosscheck.py --model tools/train_demo/model --k3ctl "$k3ctl" --text "$text" || rc=1
done
exit $rc

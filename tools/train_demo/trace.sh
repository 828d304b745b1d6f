#!/usr/bin/env bash
# tools/train_demo/trace.sh OUT.jsonl [N] - a recorded router trace of the
# trained demo model: installs it (k3ctl demo-model --preset trained),
# starts k3d with --router-trace OUT.jsonl and runs N (default 40)
# held-out requests through it (raw paragraphs and chat turns from
# data.py's seed-2 corpus), 32 new tokens each. The trace is what the
# cache and prefetch benchmarks replay where routing realism matters:
#   build/plain/tests/bench/bench_store_policy           (runs this script
#       itself into a temporary trace: the default; --requests N)
#   build/plain/tests/bench/bench_store_policy OUT.jsonl
#   k3ctl warm-expert-cache --trace OUT.jsonl
# K3_BUILD: the build directory whose k3d and k3ctl run (default build/plain).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=$(realpath -m "$1")
n=${2:-40}
bin=${K3_BUILD:-$root/build/plain}
k3ctl=$bin/client/k3ctl/k3ctl
work=$(mktemp -d)
chmod 700 "$work"
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$work"' EXIT
"$k3ctl" demo-model --preset trained --out "$work/trained" >/dev/null
export K3D_SOCKET=$work/k3d.sock
"$bin/daemon/k3d" --socket "$K3D_SOCKET" --model "$work/trained" --router-trace "$out" 2>"$work/k3d.log" &
pid=$!
for _ in $(seq 200); do
	"$k3ctl" status 2>/dev/null | grep -q "state: *ready" && break
	sleep 0.05
done
python3 - "$here" "$n" >"$work/prompts" <<'PY'
import json, sys
sys.path.insert(0, sys.argv[1])
import data
n = int(sys.argv[2])
texts, chats = data.corpus(2, n // 2, n - n // 2)
for t in texts:
    print(json.dumps(["raw", " ".join(t.split(" ")[:8])]))
for c in chats:
    print(json.dumps(["chat", c["messages"][0]["content"]]))
PY
while IFS= read -r line; do
	kind=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])[0])' "$line")
	text=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])[1])' "$line")
	if [ "$kind" = chat ]; then
		"$k3ctl" run --chat --max-new 32 --hide-reasoning "$text" >/dev/null
	else
		"$k3ctl" run --max-new 32 "$text" >/dev/null
	fi
done <"$work/prompts"
"$k3ctl" shutdown >/dev/null
wait "$pid"
pid=
echo "wrote $out: $(wc -l <"$out") routes ($n requests)"

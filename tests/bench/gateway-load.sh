#!/usr/bin/env bash
# tests/bench/gateway-load.sh [GATEWAY_BIN] - bounded wrk run against
# k3-gateway: GET /health and a short non-stream chat completion. Prints
# requests/s and p99 latency per endpoint; it never passes or fails on
# numbers (exit status is non-zero only when it cannot run).
#
# Against the scripted fake k3d by default (what it measures is then the
# gateway plus one Python process, not the model); set K3D_SOCKET to a
# running k3d to load the real daemon instead. Knobs: K3_LOAD_SECONDS
# (default 5 per endpoint), K3_LOAD_CONNECTIONS (default 8).
# Needs wrk (Debian package 'wrk').
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
gw=${1:-$root/build/plain/client/gateway/k3-gateway}
secs=${K3_LOAD_SECONDS:-5}
conns=${K3_LOAD_CONNECTIONS:-8}
command -v wrk >/dev/null || { echo "gateway-load: wrk is not installed (apt-get install wrk)"; exit 2; }
[ -x "$gw" ] || { echo "gateway-load: no gateway binary at $gw"; exit 2; }

tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT

sock=${K3D_SOCKET:-}
if [ -z "$sock" ]; then
	sock=$tmp/k3d.sock
	python3 "$root/tests/gateway/fake_k3d.py" --socket "$sock" --slots 64 --queue 1024 2>"$tmp/fake.err" &
	pids+=($!)
	for _ in $(seq 50); do [ -S "$sock" ] && break; sleep 0.1; done
fi
"$gw" --listen 127.0.0.1:0 --socket "$sock" --quiet 2>"$tmp/gw.err" &
pids+=($!)
for _ in $(seq 50); do grep -q 'listening on' "$tmp/gw.err" && break; sleep 0.1; done
port=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\),.*/\1/p' "$tmp/gw.err")
[ -n "$port" ] || { echo "gateway-load: gateway did not start"; cat "$tmp/gw.err"; exit 2; }

cat >"$tmp/chat.lua" <<'LUA'
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":4}'
LUA

report() {   # report NAME WRK_OUTPUT_FILE
	local rps p99 bad
	rps=$(awk '/^Requests\/sec:/ {print $2}' "$2")
	p99=$(awk '$1 == "99%" {print $2}' "$2")
	bad=$(awk '/Non-2xx or 3xx responses:/ {print $5}' "$2")
	printf '%-28s %10s req/s   p99 %8s   non-2xx %s\n' "$1" "${rps:-?}" "${p99:-?}" "${bad:-0}"
}
echo "gateway-load: $conns connections, ${secs}s per endpoint, k3d at $sock"
wrk -t 2 -c "$conns" -d "${secs}s" --latency "http://127.0.0.1:$port/health" >"$tmp/health.txt"
report "GET /health" "$tmp/health.txt"
wrk -t 2 -c "$conns" -d "${secs}s" --latency -s "$tmp/chat.lua" "http://127.0.0.1:$port/v1/chat/completions" >"$tmp/chat.txt"
report "POST /v1/chat/completions" "$tmp/chat.txt"

#!/usr/bin/env bash
# Socket activation: systemd-socket-activate holds the listening socket and
# starts k3d on the first connection, passing it as LISTEN_FDS. A client
# that connects before k3d exists must still be served.
# usage: test_socket_activation.sh K3D K3CTL
set -u
k3d=$1 k3ctl=$2
if ! command -v systemd-socket-activate >/dev/null; then
	echo "SKIP: systemd-socket-activate not installed"; exit 77
fi
dir=$(mktemp -d)
chmod 700 "$dir"
sock="$dir/k3d.sock"
"$k3ctl" demo-model --out "$dir/nano" --preset nano >/dev/null || { echo "FAIL: demo-model"; exit 1; }
systemd-socket-activate -l "$sock" "$k3d" --model "$dir/nano" --log-level debug 2>"$dir/log" &
act=$!
trap 'kill $act 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done
fail=0
# k3d has not been started yet: only the activator is running.
# (children of this activator only: other test runs may have a k3d up)
if [ -n "$(pgrep -P "$act")" ]; then echo "FAIL: k3d started before any client"; fail=1; fi
# The first client starts k3d and is answered at once (state "loading"
# until the model is in); it then sees "ready".
out=$("$k3ctl" --socket "$sock" --json status) || { echo "FAIL: status via activation"; fail=1; }
echo "$out"
echo "$out" | grep -q -E '"state":"(loading|ready)"' || { echo "FAIL: unexpected status"; fail=1; }
for _ in $(seq 200); do
	out=$("$k3ctl" --socket "$sock" --json status)
	echo "$out" | grep -q '"state":"ready"' && break
	sleep 0.05
done
echo "$out" | grep -q '"state":"ready"' || { echo "FAIL: never ready: $out"; fail=1; }
grep -q "passed by systemd" "$dir/log" || { echo "FAIL: k3d did not use the passed socket"; fail=1; }
"$k3ctl" --socket "$sock" ping >/dev/null || { echo "FAIL: second client"; fail=1; }
"$k3ctl" --socket "$sock" shutdown >/dev/null || { echo "FAIL: shutdown"; fail=1; }
wait $act 2>/dev/null
cat "$dir/log"
[ $fail -eq 0 ] && echo "1 passed, 0 failed"
exit $fail

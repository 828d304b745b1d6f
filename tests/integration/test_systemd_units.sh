#!/usr/bin/env bash
# systemd-analyze verify on every unit, with ExecStart pointed at stand-in
# executables (the real install paths need not exist on a build machine).
# usage: test_systemd_units.sh BUILD_SYSTEMD_DIR
set -u
src=$1
if ! command -v systemd-analyze >/dev/null; then
	echo "SKIP: systemd-analyze not installed"; exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/bin"
for b in k3d k3-gateway; do printf '#!/bin/sh\nexit 0\n' >"$work/bin/$b"; chmod +x "$work/bin/$b"; done
for u in k3d.service k3-gateway.service k3d.socket k3-gateway.socket; do
	sed -E "s#^ExecStart=[^ ]*/(k3d|k3-gateway)#ExecStart=$work/bin/\1#" "$src/$u" >"$work/$u"
done
fail=0
for u in k3d.socket k3d.service k3-gateway.socket k3-gateway.service; do
	out=$(cd "$work" && SYSTEMD_LOG_LEVEL=warning systemd-analyze verify --man=no "$work/$u" 2>&1)
	# Only complaints about our own units count (the host's units are not ours).
	ours=$(printf '%s\n' "$out" | grep -E "(k3d|k3-gateway)\.(service|socket)" || true)
	if [ -n "$ours" ]; then
		echo "FAIL: $u"; printf '%s\n' "$ours"; fail=1
	else
		echo "ok: $u"
	fi
done
# The settings the design asks for are present.
for want in "Type=notify" "WatchdogSec=" "ProtectSystem=strict" "NoNewPrivileges=yes" \
	"RestrictAddressFamilies=AF_UNIX" "StateDirectory=k3d" "RuntimeDirectory=k3d" \
	"Restart=on-failure" "LimitNOFILE="; do
	grep -q "^$want" "$src/k3d.service" || { echo "FAIL: k3d.service lacks $want"; fail=1; }
done
grep -q "^ListenStream=/run/k3d/k3d.sock" "$src/k3d.socket" || { echo "FAIL: socket path"; fail=1; }
grep -q "^SocketMode=0660" "$src/k3d.socket" || { echo "FAIL: socket mode"; fail=1; }
grep -q "^ListenStream=127.0.0.1:8000" "$src/k3-gateway.socket" || { echo "FAIL: gateway socket"; fail=1; }
exit $fail

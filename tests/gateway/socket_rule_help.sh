#!/bin/sh
# socket_rule_help.sh K3CTL K3_GATEWAY: both --help texts state the one
# socket rule of k3_client_default_socket (client/common/k3_client_socket.h),
# including "when it exists" (a set XDG_RUNTIME_DIR without k3d.sock falls
# through to /run/k3d/k3d.sock). Whitespace and line breaks are ignored.
want='$K3D_SOCKET, else $XDG_RUNTIME_DIR/k3d.sock when it exists, else /run/k3d/k3d.sock'
fail=0
for exe in "$1" "$2"; do
	got=$("$exe" --help 2>&1 | tr -s ' \n' '  ')
	case "$got" in
	*"$want"*) ;;
	*) echo "FAIL: $exe --help does not say: $want"; echo "$got"; fail=1 ;;
	esac
done
[ $fail = 0 ] && echo "ok: k3ctl and k3-gateway --help name the same socket rule"
exit $fail

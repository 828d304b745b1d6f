#!/bin/sh
# default_socket.sh K3_GATEWAY: without --socket the gateway looks for k3d
# where k3ctl does: $K3D_SOCKET (unless empty), else $XDG_RUNTIME_DIR/k3d.sock
# when it exists (where k3d listens when started by hand without --socket),
# else /run/k3d/k3d.sock. Checked on the startup line, which names the path.
gw=$1
d=$(mktemp -d) || exit 1
trap 'rm -rf "$d"' EXIT
mkdir "$d/with" "$d/without"
python3 -c 'import socket, sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])' \
	"$d/with/k3d.sock" || exit 1
fail=0
# check WANT ENV...: start the gateway on a free port, read its
# "listening on ..., k3d at PATH" line, stop it.
check() {
	want=$1
	shift
	# a fresh file: the background job may open it after the loop below
	# starts, and must not be read as the previous case's line
	rm -f "$d/err"
	env -u K3D_SOCKET -u XDG_RUNTIME_DIR "$@" "$gw" --listen 127.0.0.1:0 --quiet \
		2>"$d/err" &
	pid=$!
	i=0
	while [ $i -lt 100 ] && ! { grep -q "k3d at" "$d/err" 2>/dev/null &&
		[ -z "$(tail -c 1 "$d/err")" ]; }; do
		sleep 0.05
		i=$((i + 1))
	done
	kill "$pid" 2>/dev/null
	wait "$pid" 2>/dev/null
	got=$(sed -n 's/.*, k3d at //p' "$d/err" | head -1)
	if [ "$got" != "$want" ]; then
		echo "FAIL: $* -> k3d at '$got', want '$want'"
		cat "$d/err"
		fail=1
	fi
}
check "$d/with/k3d.sock" XDG_RUNTIME_DIR="$d/with"
check "$d/with/k3d.sock" XDG_RUNTIME_DIR="$d/with" K3D_SOCKET=
check /elsewhere/k.sock XDG_RUNTIME_DIR="$d/with" K3D_SOCKET=/elsewhere/k.sock
check /run/k3d/k3d.sock XDG_RUNTIME_DIR="$d/without"
check /run/k3d/k3d.sock
# A path longer than sun_path can hold (107 bytes and its NUL) is a k3d the
# gateway cannot reach: exit 3 at start-up (k3ctl's exit for it), naming
# the path and the limit, not a 503 on every request. From --socket and
# from K3D_SOCKET alike (issue 16: K3D_SOCKET exited 2).
long=/$(printf '%0106d' 0)
want="k3-gateway: k3d socket path '${long}x' is 108 bytes; a Unix socket path may have at most 107"
timeout 10 "$gw" --listen 127.0.0.1:0 --quiet --socket "${long}x" 2>"$d/err"
rc=$?
if [ $rc != 3 ] || ! grep -qF "$want" "$d/err"; then
	echo "FAIL: 108-byte --socket -> exit $rc (want 3 and the path and limit named)"
	cat "$d/err"
	fail=1
fi
timeout 10 env K3D_SOCKET="${long}x" "$gw" --listen 127.0.0.1:0 --quiet 2>"$d/err"
rc=$?
if [ $rc != 3 ] || ! grep -qF "$want" "$d/err"; then
	echo "FAIL: 108-byte K3D_SOCKET -> exit $rc (want 3 and the path and limit named)"
	cat "$d/err"
	fail=1
fi
check "$long" K3D_SOCKET="$long"
# An explicit empty --socket (a typo, an unset shell variable) is a usage
# error naming the default, not a gateway answering "cannot reach k3d at
# ''" on every request; an empty K3D_SOCKET counts as unset (checked above).
empty_socket() {
	timeout 10 "$gw" --listen 127.0.0.1:0 --quiet "$@" 2>"$d/err"
	rc=$?
	if [ $rc != 2 ] || ! grep -qF "k3-gateway: --socket needs a path, got an empty one (leave --socket out for the default" "$d/err"; then
		echo "FAIL: $* -> exit $rc (want 2 and the default named)"
		cat "$d/err"
		fail=1
	fi
}
empty_socket --socket ""
empty_socket --socket=
[ $fail = 0 ] && echo "ok: 10 default-socket cases"
exit $fail

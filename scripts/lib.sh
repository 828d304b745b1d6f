# scripts/lib.sh - shared by scripts/demo and scripts/test: install what is
# missing (Debian packages), then configure and build. Sourced, not run.

k3_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# Build and runtime packages, all from Debian 12. Installed only when
# missing, so a machine that has them prints nothing here. chromium is
# test tooling only: the gateway's CORS test drives it headless; so are the
# aarch64 cross compiler and qemu-user, which run the NEON kernels tests.
k3_packages="build-essential meson ninja-build pkg-config \
libevent-dev libjansson-dev libpcre2-dev libsystemd-dev libssl-dev \
python3 python3-venv clang systemd curl chromium \
gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user"

k3_install_deps() {
	local missing="" p
	for p in $k3_packages; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" ||
			missing="$missing $p"
	done
	[ -z "$missing" ] && return 0
	local sudo=""
	[ "$(id -u)" -ne 0 ] && sudo="sudo"
	echo "k3d: installing missing packages:$missing" >&2
	$sudo apt-get update -qq >/dev/null
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
		$missing >/dev/null
}

# k3_build DIR [meson options...]: configure (once) and build quietly; the
# build's output is shown only when it fails.
k3_build() {
	local dir=$1; shift
	if [ ! -f "$dir/build.ninja" ]; then
		meson setup "$dir" "$k3_root" "$@" >"$dir.setup.log" 2>&1 || {
			cat "$dir.setup.log" >&2; return 1; }
	fi
	ninja -C "$dir" >"$dir.build.log" 2>&1 || { cat "$dir.build.log" >&2; return 1; }
}

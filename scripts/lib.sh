# scripts/lib.sh - shared by scripts/demo and scripts/test: install what is
# missing (Debian packages), then configure and build. Sourced, not run.

k3_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# Build and runtime packages, all from Debian 12. Installed only when
# missing, so a machine that has them prints nothing here. chromium is
# test tooling only: the gateway's CORS test drives it headless; so are the
# aarch64 cross compiler and qemu-user, which run the NEON kernels tests,
# and the openssl tool, which makes tests/setup's throwaway CA. libcurl
# (OpenSSL flavour) is what k3ctl setup downloads with.
# libtorch-dev (LibTorch 1.13, CPU) is optional for the product: with it
# meson's -Dtorch=auto builds the torch provider (docs/providers.md), and
# CI tests it; about 175 extra packages, 162 MB to download, 0.7 GB unpacked.
k3_packages="build-essential meson ninja-build pkg-config \
libevent-dev libjansson-dev libpcre2-dev libsystemd-dev libssl-dev \
libcurl4-openssl-dev openssl \
python3 python3-venv clang systemd curl chromium \
gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user libtorch-dev"

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

# The aarch64 stage (scripts/test-aarch64) needs arm64 builds of the
# libraries. Installing them adds the arm64 architecture to dpkg, so it is
# done only when asked: K3_TEST_AARCH64=1 (set by .ci/run). Never
# libevent-dev:arm64: it is not multi-arch and would remove the native one
# (the cross build does without libevent: no k3d, no gateway).
k3_arm64_packages="libjansson-dev:arm64 libpcre2-dev:arm64 \
libsystemd-dev:arm64 libssl-dev:arm64 libcurl4-openssl-dev:arm64"

k3_have_aarch64() {
	command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 &&
		command -v qemu-aarch64 >/dev/null 2>&1 &&
		[ -f /usr/lib/aarch64-linux-gnu/pkgconfig/jansson.pc ] &&
		[ -f /usr/lib/aarch64-linux-gnu/pkgconfig/libpcre2-8.pc ] &&
		[ -f /usr/lib/aarch64-linux-gnu/pkgconfig/libsystemd.pc ] &&
		[ -f /usr/lib/aarch64-linux-gnu/pkgconfig/libcrypto.pc ] &&
		[ -f /usr/lib/aarch64-linux-gnu/pkgconfig/libcurl.pc ]
}

k3_install_arm64_deps() {
	k3_have_aarch64 && return 0
	local sudo=""
	[ "$(id -u)" -ne 0 ] && sudo="sudo"
	echo "k3d: adding the arm64 architecture to dpkg and installing:" \
		"$k3_arm64_packages" >&2
	$sudo dpkg --add-architecture arm64 &&
		$sudo apt-get update -qq >/dev/null &&
		DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-remove \
			--no-install-recommends $k3_arm64_packages >/dev/null
}

# k3_cuda_toolkit DIR: a CUDA toolkit for building (not running) the CUDA
# kernels on a machine without one: nvcc, its headers and the static
# runtime from NVIDIA's PyPI wheels, in a virtualenv at DIR. Sets
# k3_cuda_bin to the folder holding nvcc. A machine with a GPU uses its own
# toolkit (tests/device/run.sh).
k3_cuda_toolkit() {
	local dir=$1
	k3_cuda_bin="$dir/lib/python3.11/site-packages/nvidia/cu13/bin"
	[ -x "$k3_cuda_bin/nvcc" ] && return 0
	python3 -m venv "$dir" &&
		"$dir/bin/pip" install -q nvidia-cuda-nvcc==13.5.37 nvidia-cuda-runtime==13.5.37 \
			nvidia-cuda-crt==13.5.37 nvidia-nvvm==13.5.37 &&
		k3_cuda_bin=$(dirname "$(find "$dir" -path '*/nvidia/*/bin/nvcc' | head -1)") &&
		[ -x "$k3_cuda_bin/nvcc" ]
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

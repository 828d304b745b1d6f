#!/bin/sh
# neon-qemu.sh SRCDIR OUTDIR - build the kernels tests for aarch64 (static,
# with arm_neon.c) and run them under qemu-user, so the NEON kernels are
# executed and checked against the scalar reference and for batch
# invariance on an x86 machine. Exit 77 (skip) when the cross compiler or
# qemu-aarch64 is missing; scripts/lib.sh installs both.
set -eu
src=$1
out=$2
cc=aarch64-linux-gnu-gcc
qemu=qemu-aarch64
if ! command -v "$cc" >/dev/null 2>&1 || ! command -v "$qemu" >/dev/null 2>&1; then
	echo "SKIP: needs $cc and $qemu (Debian: gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user)"
	exit 77
fi
mkdir -p "$out"
lib="kernels/kern_dispatch.c kernels/kern_elem.c kernels/kern_pool.c
kernels/ref_kernels.c kernels/arm_neon.c kernels/ref_i8.c kernels/arm_neon_i8.c
base/err.c"
status=0
for t in spec simd invariance pool i8; do
	files=""
	for f in $lib tests/kernels/test_kern_$t.c; do
		files="$files $src/$f"
	done
	# -Werror with the project's warning set: the same code must stay clean
	# for aarch64 hosts, where meson builds it natively.
	# shellcheck disable=SC2086
	"$cc" -O2 -static -std=c11 -D_GNU_SOURCE -pthread -DK3_KERN_HAVE_NEON \
		-Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wvla \
		-I"$src/kernels" -I"$src" -I"$src/tests/harness" \
		$files -lm -o "$out/test_kern_$t"
	echo "== test_kern_$t (aarch64, qemu-user)"
	# the first line names the ISA under test; it must be neon
	if ! "$qemu" "$out/test_kern_$t" >"$out/$t.log" 2>&1; then
		status=1
	fi
	cat "$out/$t.log"
done
grep -q "neon" "$out/simd.log" || { echo "FAIL: simd test did not run the neon ISA"; status=1; }
grep -q "^isa neon" "$out/invariance.log" || { echo "FAIL: invariance test did not run the neon ISA"; status=1; }
grep -q "^i8 neon vs ref" "$out/i8.log" || { echo "FAIL: i8 test did not run the neon int8 table"; status=1; }
exit $status

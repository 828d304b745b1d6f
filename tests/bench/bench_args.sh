#!/bin/sh
# bench_args.sh BENCH_GEMV: every malformed option must exit 2 with exactly
# one line on stderr and nothing on stdout, before any benchmark work.
b=$1
fail=0
d=$(mktemp -d) || exit 1
trap 'rm -rf "$d"' EXIT
. "$(dirname "$0")/args_check.sh"
check --shape 0x32
check --shape 12x13
check --shape 1x65568
check --shape 9999999999x32
check --shape 99999999999999999999x32
check --shape -1x32
check --shape 32x-18446744073709551584
check --shape +32x32
check --shape ' 32x32'
check --shape '32x32 '
check --shape 32X32
check --shape 32x32x
check --shape x32
check --shape 32x
check --shape 12345678901234567890123x32
check --shape
check --dtype
check --dtype foo
check --dtype I8
s="--shape 1x32"
check $s $s $s $s $s $s $s $s $s
check --runs 0
check --bogus
check --isa
check --isa sse2
check --batch 0
check --batch 17
[ $fail = 0 ] && echo "ok: 25 malformed invocations rejected"
exit $fail

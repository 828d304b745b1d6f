#!/bin/sh
# bench_policy_args.sh BENCH_STORE_POLICY: argument handling of
# bench_store_policy (never its figures): every malformed invocation exits 2
# with one line on stderr and nothing on stdout, before any trace is
# recorded; a missing trace file exits 1; --synthetic and a given trace
# file replay (dry-run counters, no timing) and print their rows. The
# default (the trained model's trace, recorded through k3d) is not run
# here: it is a benchmark, minutes on a loaded machine.
b=$1
fail=0
d=$(mktemp -d) || exit 1
trap 'rm -rf "$d"' EXIT
. "$(dirname "$0")/args_check.sh"
check --bogus
check --requests
check --requests 0
check --requests 10001
check --requests x
check --synthetic --requests 3
check --requests 3 --synthetic
check --synthetic "$d/t.jsonl"
check "$d/t.jsonl" --requests 3
check "$d/a" "$d/b"
if timeout 10 "$b" "$d/missing.jsonl" >/dev/null 2>&1; then
	echo "FAIL: a missing trace file was accepted"
	fail=1
fi
timeout 170 "$b" --synthetic >"$d/out" 2>"$d/err" || { echo "FAIL: --synthetic"; cat "$d/err"; fail=1; }
n=$(grep -cE '^(uniform|zipf|topic|sticky) ' "$d/out")
[ "$n" = 12 ] || { echo "FAIL: --synthetic printed $n rows, not 12"; cat "$d/out"; fail=1; }
# two tokens x two MoE layers (1, 2), top-2 of 4 experts
for p in 0 1; do
	for l in 1 2; do
		echo "{\"request\":1,\"position\":$p,\"layer\":$l,\"ids\":[$p,3],\"weights\":[\"3f000000\",\"3f000000\"]}"
	done
done >"$d/t.jsonl"
timeout 10 "$b" "$d/t.jsonl" >"$d/out" 2>"$d/err" || { echo "FAIL: trace file"; cat "$d/err"; fail=1; }
n=$(grep -c '^file ' "$d/out")
[ "$n" = 3 ] || { echo "FAIL: the trace file printed $n rows, not 3"; cat "$d/out" "$d/err"; fail=1; }
[ $fail = 0 ] && echo "ok: 10 malformed invocations rejected, --synthetic and a trace file replayed"
exit $fail

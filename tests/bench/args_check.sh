# args_check.sh - sourced by the benchmarks' argument tests (bench_args.sh,
# bench_policy_args.sh): check ARGS... runs "$b" ARGS and records a failure
# unless it exits 2 with exactly one line on stderr and nothing on stdout
# (a usage error, reported before any benchmark work). Needs b (the
# program), d (a scratch directory) and fail (0) set by the caller.
check() {
	timeout 10 "$b" "$@" >"$d/out" 2>"$d/err"
	rc=$?
	n=$(wc -l <"$d/err")
	o=$(wc -c <"$d/out")
	if [ "$rc" != 2 ] || [ "$n" != 1 ] || [ "$o" != 0 ]; then
		echo "FAIL: $(basename "$b") $* -> rc=$rc, $n stderr lines, $o stdout bytes"
		cat "$d/err"
		fail=1
	fi
}

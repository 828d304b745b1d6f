#!/bin/sh
# k3ctl pack and warm-expert-cache end to end on a golden checkpoint.
# Usage: k3ctl_store.sh K3CTL SHARED_DIR
set -eu
k3ctl=$1
model=$2/golden/forward/k3tiny_b/model
[ -r "$model/config.json" ] || { echo "SKIP: no golden model"; exit 77; }
t=$(mktemp -d "${TMPDIR:-/tmp}/k3ctl-store.XXXXXX")
trap 'rm -rf "$t"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

out=$("$k3ctl" pack --model "$model" --out "$t/packs")
# 12 expert packs (one per MoE layer) and the spine pack
echo "$out" | grep -q "13 packs written, 0 kept" || fail "first run: $out"
echo "$out" | grep -q "spine    : wrote 15 spans" || fail "spine pack: $out"
out=$("$k3ctl" pack --model "$model" --out "$t/packs")
echo "$out" | grep -q "0 packs written, 13 kept" || fail "re-run: $out"
out=$("$k3ctl" --json pack --model "$model" --out "$t/packs" --verify)
echo "$out" | grep -q '"written":0,"kept":13' || fail "verify: $out"
echo "$out" | grep -q '"verified_bytes":0' && fail "verify rehashed nothing: $out"
[ "$(ls "$t/packs" | wc -l)" = 13 ] || fail "temp files left: $(ls "$t/packs")"
# One damaged byte in the spine pack's first span (layer 0, at the data
# offset the header records at bytes 40..48): --verify fails and names it.
cp "$t/packs/spine.k3pack" "$t/spine.good"
data=$(od -An -t u8 -j 40 -N 8 "$t/packs/spine.k3pack" | tr -d ' ')
printf '\377' | dd of="$t/packs/spine.k3pack" bs=1 seek=$((data + 100)) conv=notrunc 2>/dev/null
if out=$("$k3ctl" pack --model "$model" --out "$t/packs" --verify 2>&1); then
	fail "spine damage not detected: $out"
fi
echo "$out" | grep -q "spine: .*spine.k3pack': layer 0 at byte $data fails its SHA-256 check" ||
	fail "spine damage message: $out"
cp "$t/spine.good" "$t/packs/spine.k3pack"
# One damaged byte in a span: --verify fails and names the expert.
printf '\377' | dd of="$t/packs/experts-L005.k3pack" bs=1 seek=20000 conv=notrunc 2>/dev/null
if out=$("$k3ctl" pack --model "$model" --out "$t/packs" --verify 2>&1); then
	fail "damage not detected: $out"
fi
echo "$out" | grep -q "layer 5: .*fails its SHA-256 check" || fail "damage message: $out"
# Read-only model directories are not written into without --out.
if "$k3ctl" pack --model "$model" 2>"$t/err"; then fail "wrote into the model dir"; fi
grep -q "read-only" "$t/err" || fail "read-only message: $(cat "$t/err")"

# A copy for another drive: only the named layers' packs, no spine pack;
# layers without routed experts, out of range, or no --out are refused.
out=$("$k3ctl" pack --model "$model" --out "$t/copy" --layers 1-2,5)
echo "$out" | grep -q "3 packs written, 0 kept" || fail "--layers: $out"
[ "$(ls "$t/copy" | tr '\n' ' ')" = "experts-L001.k3pack experts-L002.k3pack experts-L005.k3pack " ] ||
	fail "--layers files: $(ls "$t/copy")"
"$k3ctl" pack --model "$model" --out "$t/copy" --layers 0 2>"$t/err" && fail "--layers 0 accepted"
grep -q "layer 0 has no routed experts" "$t/err" || fail "--layers 0 message: $(cat "$t/err")"
"$k3ctl" pack --model "$model" --out "$t/copy" --layers 3-99 2>/dev/null && fail "--layers 3-99 accepted"
"$k3ctl" pack --model "$model" --layers 3 2>/dev/null && fail "--layers without --out accepted"

# warm-expert-cache ranks a trace.
for pos in 0 1 2; do
	echo "{\"request\":1,\"position\":$pos,\"layer\":2,\"ids\":[7,3],\"weights\":[\"3f000000\",\"3f000000\"]}"
	echo "{\"request\":1,\"position\":$pos,\"layer\":3,\"ids\":[7,$pos],\"weights\":[\"3f000000\",\"3f000000\"]}"
done >"$t/trace.jsonl"
out=$("$k3ctl" warm-expert-cache --trace "$t/trace.jsonl" --show 3)
echo "$out" | grep -q "6 routing records, 6 distinct experts" || fail "rank: $out"
echo "$out" | sed -n 3p | grep -Eq "^ +1 +2 +3 +3 " || fail "rank order: $out"
out=$("$k3ctl" --json warm-expert-cache --trace "$t/trace.jsonl" --show 1)
[ "$out" = '{"records":6,"experts":6,"top":[{"layer":2,"expert":3,"uses":3,"weight_sum":1.5}]}' ] ||
	fail "json: $out"
"$k3ctl" warm-expert-cache --trace "$t/nope.jsonl" 2>/dev/null && fail "missing trace accepted"
# --hot-experts N --trace FILE: packs of the N experts the trace used most
out=$("$k3ctl" pack --model "$model" --out "$t/hot" --hot-experts 3 --trace "$t/trace.jsonl")
echo "$out" | grep -q "hot experts: 3 of 6 used in 6 trace records" || fail "--hot-experts: $out"
echo "$out" | grep -q "layer   2: wrote 2 experts" || fail "--hot-experts layer 2: $out"
echo "$out" | grep -q "layer   3: wrote 1 experts" || fail "--hot-experts layer 3: $out"
"$k3ctl" pack --model "$model" --out "$t/hot" --hot-experts 3 2>/dev/null && fail "--hot-experts without --trace"

# bench: offline generation through the store; the greedy ids do not depend
# on the cache budget (floor = 6 x 16384 bytes here) or on prefetch, and
# both runs report real reads.
json_field() { echo "$1" | grep -o "\"$2\":[^,}]*" | head -1 | cut -d: -f2; }
a=$("$k3ctl" --json bench --model "$model" --max-new 6 --prompt-len 5 --prefetch off --disk-mib 1)
b=$("$k3ctl" --json bench --model "$model" --max-new 6 --prompt-len 5 --prefetch 3 \
	--expert-cache-gb 0.0001 --disk-mib 1)
ga=$(echo "$a" | grep -o '"greedy":\[[0-9,]*\]')
gb=$(echo "$b" | grep -o '"greedy":\[[0-9,]*\]')
[ -n "$ga" ] && [ "$ga" = "$gb" ] || fail "bench greedy differs: $ga vs $gb"
echo "$ga" | grep -Eq '^"greedy":\[[0-9]+(,[0-9]+){5}\]$' || fail "bench greedy: $ga"
echo "$b" | grep -q '"cache_bytes":98304,' || fail "bench floor cache: $b"
[ "$(json_field "$a" bytes_read)" -gt 0 ] || fail "bench read nothing: $a"
echo "$a" | grep -Eq '"disk_gbps":\{"median":0(\.0*)?,' && fail "no disk bandwidth: $a"
echo "$a" | grep -Eq '"disk_gbps_samples":\[[0-9.e+-]+(,[0-9.e+-]+){4}\]' || fail "5 disk samples: $a"
echo "$a" | grep -Eq '"cold_read_ratio":\{"median":[0-9]' || fail "cold-read ratio: $a"
echo "$a" | grep -q '"lookahead_by_rank":\[' || fail "lookahead table: $a"
# --prefetch auto (the default) with a gate, --direct off, 3 samples: same ids
c=$("$k3ctl" --json bench --model "$model" --max-new 6 --prompt-len 5 --prefetch-gate 0.05 \
	--direct off --disk-mib 1 --disk-samples 3 2>/dev/null)
gc=$(echo "$c" | grep -o '"greedy":\[[0-9,]*\]')
[ "$ga" = "$gc" ] || fail "bench greedy with auto prefetch, --direct off differs: $ga vs $gc"
echo "$c" | grep -q '"direct":"off"' || fail "bench --direct off: $c"
echo "$c" | grep -Eq '"disk_gbps_samples":\[[0-9.e+-]+(,[0-9.e+-]+){2}\]' || fail "3 disk samples: $c"
# --spine-resident none: the spine streams, the ids stay, spine bytes are apart
d=$("$k3ctl" --json bench --model "$model" --max-new 6 --prompt-len 5 --prefetch off --disk-mib 1 \
	--spine-resident none 2>/dev/null)
gd=$(echo "$d" | grep -o '"greedy":\[[0-9,]*\]')
[ "$ga" = "$gd" ] || fail "bench greedy with a streamed spine differs: $ga vs $gd"
[ "$(json_field "$d" spine_bytes_read)" -gt 0 ] || fail "bench streamed no spine: $d"
[ "$(json_field "$a" spine_bytes_read)" = 0 ] || fail "bench read spine bytes when mapped: $a"
# several drives: the copy on drive 1 (written above, layers 1-2 and 5),
# emulated at 1 and 2 GB/s with drive 0 stalling, hedged: the same ids,
# and the bytes add up per drive and in all
e=$("$k3ctl" --json bench --model "$model" --max-new 6 --prompt-len 5 --prefetch off --disk-mib 1 \
	--expert-dir "$t/copy" --io-rate 1,2 --io-stall 5:0.3,0 --hedge 1.5 --prefill-chunk 2 2>/dev/null)
ge=$(echo "$e" | grep -o '"greedy":\[[0-9,]*\]')
[ "$ga" = "$ge" ] || fail "bench greedy over two drives differs: $ga vs $ge"
echo "$e" | python3 -c '
import json, sys
o = json.load(sys.stdin)
d = o["drives"]
assert len(d) == 2 and d[1]["experts"] == 96 and d[0]["experts"] == 384, d
for x in d:
    assert x["bytes_read"] == x["demand_bytes"] + x["prefetch_used_bytes"] + x["prefetch_wasted_bytes"], x
total = o["prefill"]["bytes_read"] + o["decode"]["bytes_read"]
assert sum(x["bytes_read"] for x in d) == total, (d, total)
assert d[1]["bytes_read"] > 0 and d[0]["emulated_gbps"] == 1.0 and d[1]["emulated_gbps"] == 2.0, d
assert o["prefill_distinct_experts"] > 0 and o["prefill_bytes_per_distinct_span"] > 0, o
' || fail "bench drives: $e"
# a cache of exactly one group of experts (6 slots + 2 hedge buffers) while
# drive 0 stalls: a slot whose read lost to its hedge and still runs is
# waited for, never taken for a full cache (it once failed with -ENOSPC)
"$k3ctl" pack --model "$model" --out "$t/full" --layers all >/dev/null || fail "pack --layers all"
h=$("$k3ctl" --json bench --model "$model" --max-new 12 --prompt-len 24 --prefetch off --disk-mib 1 \
	--expert-cache-gb 0.000132 --expert-dir "$t/full" --io-rate 0.02,0.02 --io-stall 20:0.3,0 \
	--hedge 1.5 --prefill-chunk 24 2>"$t/err") || fail "bench, a full cache and hedges: $(tail -1 "$t/err")"
echo "$h" | python3 -c '
import json, sys
o = json.load(sys.stdin)
assert o["hedge_buffers"] == 2 and sum(x["hedges_won"] for x in o["drives"]) > 0, o["drives"]
' || fail "bench, a full cache and hedges: no hedge won: $h"
"$k3ctl" bench --model "$model" --expert-dir "$t" 2>/dev/null && fail "bench --expert-dir without packs"
"$k3ctl" bench --model "$model" --io-rate 1,2 2>/dev/null && fail "two rates for one drive"
"$k3ctl" bench --model "$model" --spine-resident 99 2>/dev/null && fail "more resident layers than the model"
"$k3ctl" bench --model "$model" --prefetch 3 --prefetch-gate 0.5 2>/dev/null && fail "gate without auto"
"$k3ctl" bench --model "$model" --direct maybe 2>/dev/null && fail "bad --direct"
[ "$(echo "$a" | head -c 1)" = "{" ] || fail "bench --json prints only JSON: $a"
if "$k3ctl" bench --model "$model" --expert-cache-gb 0.00001 2>"$t/err"; then fail "bench below floor"; fi
grep -q "below the floor" "$t/err" || fail "bench floor message: $(cat "$t/err")"

# bench --preset trained: the trained demo model in a private temporary
# directory (removed after), prompt = its training text, so the greedy
# decode after "The capital of France is" is the demo's " Paris."
usage_rc() { rc=0; "$k3ctl" bench "$@" >/dev/null 2>&1 || rc=$?; [ "$rc" = 2 ] || fail "bench $* -> $rc, not 2"; }
usage_rc
usage_rc --preset trained --model "$model"
usage_rc --preset bench
usage_rc --preset
mkdir "$t/tmp"
p=$(TMPDIR=$t/tmp "$k3ctl" --json bench --preset trained --max-new 2 --prompt-len 5 --prefetch off \
	--disk-mib 1 --expert-cache-gb 0.001 --seed 3 2>"$t/err")
[ -z "$(ls -A "$t/tmp")" ] || fail "bench --preset trained left $(ls -A "$t/tmp")"
echo "$p" | grep -q '"model":"trained"' || fail "bench --preset trained model: $p"
gp=$(echo "$p" | grep -o '"greedy":\[[^]]*\]' | grep -o '[0-9,]*')
"$k3ctl" demo-model --preset trained --out "$t/trained" >/dev/null
txt=$("$k3ctl" detokenize --model "$t/trained" "$gp")
[ "$txt" = " Paris." ] || fail "bench --preset trained greedy $gp = '$txt', not ' Paris.'"

# bench --parallel: N sequences through one batched pass per position; each
# sequence's ids must equal its solo run, and with a streamed spine a
# generated token's share of the spine reads falls with N (one sweep
# serves every sequence of the pass).
q=$(TMPDIR=$t/tmp "$k3ctl" bench --parallel 1,2,4 --model "$model" --max-new 4 --prompt-len 5 --reps 1 \
	--spine-resident 0 2>"$t/err") || fail "bench --parallel: $(tail -1 "$t/err")"
[ "$(echo "$q" | grep -c 'ids vs solo: OK')" = 3 ] || fail "bench --parallel ids: $q"
echo "$q" | grep -q MISMATCH && fail "bench --parallel mismatch: $q"
s1=$(echo "$q" | sed -n 's/^N=1:.*spine \([0-9.]*\)).*/\1/p')
s4=$(echo "$q" | sed -n 's/^N=4:.*spine \([0-9.]*\)).*/\1/p')
awk -v a="$s1" -v b="$s4" 'BEGIN { exit !(b > 0 && b * 3 < a) }' ||
	fail "bench --parallel: spine MB per token N=1 $s1, N=4 $s4 (want under a third)"
r=$(TMPDIR=$t/tmp "$k3ctl" bench --parallel 1,2 --preset trained --max-new 3 --prompt-len 6 --reps 1 \
	2>"$t/err") || fail "bench --parallel --preset trained: $(tail -1 "$t/err")"
[ "$(echo "$r" | grep -c 'ids vs solo: OK')" = 2 ] || fail "bench --parallel --preset trained: $r"
[ -z "$(ls -A "$t/tmp")" ] || fail "bench --parallel --preset trained left $(ls -A "$t/tmp")"
echo "ok"

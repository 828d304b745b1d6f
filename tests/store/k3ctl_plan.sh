#!/bin/sh
# k3ctl plan on a directory that holds only K3's real config.json (the
# release's values, tests/store/k3-config): the split and the cold-token
# bytes for 64 GiB and 256 GiB (the numbers of docs/plan.md's table), the
# floor refused with its numbers, --spine-resident, and usage errors.
# Usage: k3ctl_plan.sh K3CTL SOURCE_ROOT
set -eu
k3ctl=$1
cfg=$2/tests/store/k3-config
fail() { echo "FAIL: $*"; exit 1; }
[ "$(ls "$cfg")" = config.json ] || fail "the test directory holds more than config.json"

# 64 GiB, one sequence: the head and layers 0..44 resident, two arenas of
# layer 1's 1,267,744,256 bytes, a cold token reads 55.3 GB of spine + 25.8
# GB of experts.
out=$("$k3ctl" --json plan --model "$cfg" --ram 64G --parallel 1)
field() { echo "$out" | grep -o "\"$1\":[^,}]*" | head -1 | cut -d: -f2; }
[ "$(field limit_bytes)" = 68719476736 ] || fail "limit: $out"
[ "$(field limited_by)" = '"RAM"' ] || fail "limited_by: $out"
[ "$(field resident_layers)" = 45 ] || fail "resident layers: $out"
[ "$(field head_resident)" = true ] || fail "head: $out"
[ "$(field embed_resident)" = false ] || fail "embedding: $out"
[ "$(field arena_bytes)" = 1267744768 ] || fail "arena: $out"
[ "$(field spine_total_bytes)" = 113509540864 ] || fail "spine total: $out"
[ "$(field cold_expert_bytes_per_token)" = 25829572608 ] || fail "expert bytes: $out"
[ "$(field cold_spine_bytes_per_token)" = 55347432448 ] || fail "spine bytes: $out"
[ "$(field expert_slots)" = 59 ] || fail "slots: $out"
txt=$("$k3ctl" plan --model "$cfg" --ram 64G --parallel 1)
echo "$txt" | grep -q "resident: layers 0..44 (45 of 93), the head (lm_head + final norms), the embedding gathered row by row" ||
	fail "text: $txt"
echo "$txt" | grep -q "a cold token (nothing cached) reads 81.177 GB" || fail "cold token: $txt"
# the slot names the expert it holds: K3's 17,547,264 bytes, already whole 4 KiB pages
echo "$txt" | grep -q "59 slots of 17547264 bytes (an expert's 17547264 bytes of MXFP4 values and scales, in whole 4 KiB pages)" ||
	fail "slot label: $txt"

# 64 GiB, --parallel auto (k3d's default): four seats, each with its own
# sequence state for the whole context (4 x 2.28 GB), paid for with six
# resident layers: a cold token of one sequence reads 62.1 GB of spine.
out=$("$k3ctl" --json plan --model "$cfg" --ram 64G)
[ "$(field sequences)" = 4 ] && [ "$(field state_bytes)" = 9131458560 ] &&
	[ "$(field resident_layers)" = 39 ] && [ "$(field cold_spine_bytes_per_token)" = 62107080704 ] ||
	fail "64G auto: $out"

# 256 GiB: everything resident, no ring, the rest to experts.
out=$("$k3ctl" --json plan --model "$cfg" --ram 256G)
[ "$(field resident_layers)" = 93 ] && [ "$(field embed_resident)" = true ] &&
	[ "$(field spine_ring_bytes)" = 0 ] && [ "$(field cold_spine_bytes_per_token)" = 0 ] ||
	fail "256G: $out"

# --spine-resident none and a fixed prefix.
out=$("$k3ctl" --json plan --model "$cfg" --ram 64G --spine-resident none)
[ "$(field resident_layers)" = 0 ] && [ "$(field head_resident)" = false ] || fail "none: $out"
out=$("$k3ctl" --json plan --model "$cfg" --ram 64G --spine-resident 10 --context 4096)
[ "$(field resident_layers)" = 10 ] && [ "$(field context_tokens)" = 4096 ] || fail "10: $out"

# Below the floor: exit 1, every number.
if err=$("$k3ctl" plan --model "$cfg" --ram 8G 2>&1); then fail "8G accepted: $err"; fi
echo "$err" | grep -q "below the floor: the memory limit is 8589934592 bytes" || fail "floor: $err"
echo "$err" | grep -q "the floor, the smallest limit one pass fits in, is 9577341696 bytes" ||
	fail "floor value: $err"

# Usage: exit 2; a directory without config.json: exit 1.
set +e
"$k3ctl" plan --ram 64G >/dev/null 2>&1; [ $? = 2 ] || fail "no --model"
"$k3ctl" plan --model "$cfg" --ram lots >/dev/null 2>&1; [ $? = 2 ] || fail "--ram lots"
"$k3ctl" plan --model "$cfg" --spine-resident 999 >/dev/null 2>&1; [ $? = 2 ] || fail "999"
"$k3ctl" plan --model "$cfg" --bogus 1 >/dev/null 2>&1; [ $? = 2 ] || fail "--bogus"
"$k3ctl" plan --model "$cfg/nope" >/dev/null 2>&1; [ $? = 1 ] || fail "no config.json"
set -e
echo "k3ctl plan: ok"

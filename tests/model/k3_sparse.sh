#!/bin/sh
# tests/model/k3_sparse.sh K3CTL SOURCE_ROOT - the full-size rehearsal's
# checkpoint (k3ctl demo-model --preset k3-sparse): the release's layout
# as public sources establish it (docs/plan.md, "Sources"): 96 shards named
# model-000NN-of-000096, 497,220 tensors totalling 1,560,860,324,864
# bytes, shard 2 (layer 1) exactly 16,990,911,504 bytes with an 818,696-byte
# header, an index of exactly 59,764,096 bytes, the embedding and head in
# shard 94, the vision projector and tower in 95 and 96; every header loads
# and validates (k3ctl inspect), the config plans as K3's real config.json
# does, the data reads as zeros, and the disk holds only the headers.
set -eu
K3CTL=$1
cfg=$2/tests/store/k3-config
dir=$(mktemp -d "${TMPDIR:-/tmp}/k3-sparse-XXXXXX")
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
m=$dir/k3s

out=$("$K3CTL" --json demo-model --out "$m" --preset k3-sparse) || fail "demo-model: $out"
echo "$out" | grep -q '"tensors":497220,"bytes":1560860324864,"shards":96,"layers":93' ||
	fail "summary (text tensors): $out"
echo "$out" | grep -q '"apparent_bytes":1560936091448' || fail "apparent bytes (payloads + headers): $out"
disk=$(echo "$out" | grep -o '"disk_bytes":[0-9]*' | cut -d: -f2)
[ "$disk" -lt 200000000 ] || fail "the disk holds more than headers: $disk bytes"
grep -q 'its output is meaningless' "$m/config.json" || fail "config.json is not labelled"
[ ! -e "$m/tiktoken.model" ] || fail "a synthetic rank file of the release's size (the tokenizer loader refuses it)"

[ "$(ls "$m" | grep -c '^model-000[0-9][0-9]-of-000096\.safetensors$')" = 96 ] || fail "shard names: $(ls "$m")"
[ "$(stat -c %s "$m/model-00002-of-000096.safetensors")" = 16990911504 ] || fail "shard 2 size"
hdr=$(od -An -tu8 -N8 "$m/model-00002-of-000096.safetensors" | tr -d ' ')
[ "$hdr" = 818696 ] || fail "shard 2 header length $hdr"
[ "$(stat -c %s "$m/model.safetensors.index.json")" = 59764096 ] || fail "index size"
grep -q '"total_size": 1560860324864' "$m/model.safetensors.index.json" || fail "total_size"
grep -q '"language_model.model.embed_tokens.weight": "model-00094-of-000096.safetensors"' \
	"$m/model.safetensors.index.json" || fail "embedding shard"
grep -q '"language_model.lm_head.weight": "model-00094-of-000096.safetensors"' \
	"$m/model.safetensors.index.json" || fail "lm_head shard"
grep -q '"language_model.model.layers.92.block_sparse_moe.experts.895.w2.weight_scale": "model-00093-of-000096.safetensors"' \
	"$m/model.safetensors.index.json" || fail "layer 92 shard"
grep -q '"vision_tower.patch_embed.proj.weight": "model-00096-of-000096.safetensors"' \
	"$m/model.safetensors.index.json" || fail "vision shard"

# Every header validates; the bytes by role are K3's.
"$K3CTL" --json inspect "$m" >"$dir/inspect" || fail "inspect"
grep -q '"spine": 113509540864' "$dir/inspect" || fail "spine bytes"
grep -q '"experts": 1446456066048' "$dir/inspect" || fail "expert bytes"
grep -q '"expert_span": 17547264' "$dir/inspect" || fail "expert span"
grep -q '"other": 894717952' "$dir/inspect" || fail "vision bytes (not used by the text model)"

# The config plans exactly as the release's config.json.
a=$("$K3CTL" --json plan --model "$m" --ram 64G | sed 's/"model":"[^"]*",//')
b=$("$K3CTL" --json plan --model "$cfg" --ram 64G | sed 's/"model":"[^"]*",//')
[ "$a" = "$b" ] || fail "plans differ: $a / $b"

# Holes read as zeros and reading them writes nothing.
z=$(dd if="$m/model-00050-of-000096.safetensors" bs=1M skip=5000 count=4 2>/dev/null | tr -d '\000' | wc -c)
[ "$z" = 0 ] || fail "a data region is not zero"
[ "$(du -sb --apparent-size "$m" | cut -f1)" -gt 1560000000000 ] || fail "apparent size"

# No overrides: the layout is K3's.
if "$K3CTL" demo-model --out "$dir/x" --preset k3-sparse --layers 3 2>"$dir/err"; then
	fail "k3-sparse took --layers"
fi
grep -q "takes no size options" "$dir/err" || fail "override message: $(cat "$dir/err")"
echo "k3-sparse: ok ($disk bytes on disk)"

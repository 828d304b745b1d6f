#!/bin/sh
# tests/model/cli.sh K3CTL - the offline commands end to end: demo-model
# writes a bench checkpoint with K3's expert shapes, inspect (text and
# --json) reports the real per-expert span, bad options exit 2.
set -eu
K3CTL=$1
dir=$(mktemp -d /tmp/k3-model-cli-XXXXXX)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$K3CTL" demo-model --out "$dir/bench" --preset bench --layers 2 --experts 2 --hidden 64 \
	--vocab 512 --intermediate 64 --kda-heads 2 --kda-head-dim 32 --mla-heads 2 \
	--q-lora 32 --kv-lora 32 --nope 32 --rope 16 --v-head 32 --seed 9 >"$dir/out" ||
	fail "demo-model bench"
grep -q "2 experts/layer" "$dir/out" || fail "demo-model summary: $(cat "$dir/out")"
"$K3CTL" inspect "$dir/bench" --ram 1G >"$dir/inspect" || fail "inspect"
grep -q "per-expert span: 17547264 bytes" "$dir/inspect" || fail "span: $(cat "$dir/inspect")"
# what the span is made of: 3 x 3072 x 3584 MXFP4 values, a byte per two, a scale per 32
grep -q "per-expert span: 17547264 bytes (one expert's weights as stored: 16515072 bytes of MXFP4 values + 1032192 of E8M0 scales; a RAM cache slot holds it in whole 4 KiB pages)" \
	"$dir/inspect" || fail "span parts: $(cat "$dir/inspect")"
"$K3CTL" --json inspect "$dir/bench" --ram 1G >"$dir/inspect.json" || fail "inspect --json"
grep -q '"expert_span": 17547264' "$dir/inspect.json" || fail "json span"
grep -q '"expert_pool": 2' "$dir/inspect.json" || fail "json pool"

# nano twice with one seed: identical files
"$K3CTL" demo-model --out "$dir/a" >/dev/null || fail "nano a"
"$K3CTL" demo-model --out "$dir/b" --preset nano --seed 1 >/dev/null || fail "nano b"
for f in config.json model.safetensors.index.json model-00001-of-00002.safetensors \
	model-00002-of-00002.safetensors tiktoken.model tokenizer_config.json; do
	cmp -s "$dir/a/$f" "$dir/b/$f" || fail "$f differs for the same seed"
done

# usage errors exit 2, a broken checkpoint exits 1 with the reason
set +e
"$K3CTL" demo-model --out "$dir/c" --preset huge 2>/dev/null; [ $? -eq 2 ] || fail "bad preset"
"$K3CTL" demo-model --out "$dir/c" --latent 48 2>/dev/null; [ $? -eq 2 ] || fail "bad latent"
"$K3CTL" demo-model 2>/dev/null; [ $? -eq 2 ] || fail "missing --out"
rm "$dir/a/model-00002-of-00002.safetensors"
"$K3CTL" inspect "$dir/a" 2>"$dir/err"; [ $? -eq 1 ] || fail "inspect of a broken model"
grep -q "model-00002-of-00002.safetensors" "$dir/err" || fail "reason: $(cat "$dir/err")"
echo "ok"

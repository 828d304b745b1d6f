#!/bin/sh
# test_cli.sh K3CTL - the offline text commands end to end on a synthetic
# vocabulary (rank = byte value for all 256 bytes, then "he" "ll" "hello";
# the K3 special names follow the 259 ranks).
set -u
k3ctl=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail=0
checks=0

awk 'BEGIN {
	b = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
	for (i = 0; i < 256; i++)
		printf "%s%s== %d\n", substr(b, int(i / 4) + 1, 1), substr(b, (i % 4) * 16 + 1, 1), i
	print "aGU= 256"; print "bGw= 257"; print "aGVsbG8= 258"
}' > "$dir/tiktoken.model"
cat > "$dir/tokenizer_config.json" <<'J'
{"added_tokens_decoder": {"259": {"content": "[BOS]"}, "260": {"content": "[EOS]"},
 "261": {"content": "<|end_of_msg|>"}, "262": {"content": "<|open|>"},
 "263": {"content": "<|close|>"}, "264": {"content": "<|sep|>"}}}
J

expect() { # NAME WANT GOT
	checks=$((checks + 1))
	if [ "$2" != "$3" ]; then
		echo "FAIL $1: got '$3', want '$2'"
		fail=$((fail + 1))
	fi
}

# " hell": "he" (256) merges first, then "ll" (257); there is no "hell" rank
expect "tokenize" "258 32 256 257" "$("$k3ctl" tokenize --model "$dir" "hello hell")"
expect "tokenize --special" "97 262 98" "$("$k3ctl" tokenize --special --model "$dir" "a<|open|>b")"
expect "tokenize plain" "97 60 124" "$("$k3ctl" tokenize --model "$dir" "a<|")"
expect "tokenize --json" "[258]" "$("$k3ctl" --json tokenize --vocab "$dir/tiktoken.model" hello)"
expect "tokenize stdin" "258" "$(printf hello | "$k3ctl" tokenize --model "$dir" -)"
expect "pieces" '"get" "User" "Name" " " "42"' "$("$k3ctl" tokenize --pieces --model "$dir" "getUserName 42" | tr '\n' ' ' | sed 's/ $//')"
expect "detokenize" "hello<|open|>hi" "$("$k3ctl" detokenize --model "$dir" 258 262 104,105)"
expect "detokenize json" '{"text":"he"}' "$("$k3ctl" --json detokenize --model "$dir" "[256]")"
printf '[{"role":"user","content":"hello"}]' > "$dir/chat.json"
expect "render-chat" '<|open|>message role="user"<|sep|>hello<|close|>message<|sep|><|end_of_msg|><|open|>message role="assistant"<|sep|><|open|>think<|sep|>' \
	"$("$k3ctl" render-chat "$dir/chat.json")"
expect "render-chat --ids" "262 109 101 115 115 97 103 101 32 114 111 108 101 61 34 117 115 101 114 34 264 258 263 109 101 115 115 97 103 101 264 261 262 109 101 115 115 97 103 101 32 114 111 108 101 61 34 97 115 115 105 115 116 97 110 116 34 264 262 116 104 105 110 107 264" \
	"$("$k3ctl" render-chat --ids --model "$dir" "$dir/chat.json")"
printf '{"messages":[{"role":"user","content":"x"}],"thinking":false,"add_generation_prompt":false}' > "$dir/opts.json"
expect "render-chat options" '<|open|>message role="user"<|sep|>x<|close|>message<|sep|><|end_of_msg|>' "$("$k3ctl" render-chat "$dir/opts.json")"

# errors: usage 2, failures 1, messages name the problem
"$k3ctl" tokenize hello >/dev/null 2>&1; expect "no vocabulary" 2 $?
"$k3ctl" tokenize --model "$dir/nowhere" x >/dev/null 2>&1; expect "missing dir" 1 $?
"$k3ctl" detokenize --model "$dir" 99999 >/dev/null 2>&1; expect "id out of range" 1 $?
"$k3ctl" detokenize --model "$dir" 12x >/dev/null 2>&1; expect "bad id" 2 $?
printf '[{"role":"user","content":[{"type":"image_url","image_url":{"url":"u"}}]}]' > "$dir/img.json"
msg=$("$k3ctl" render-chat "$dir/img.json" 2>&1); expect "image refused" 1 $?
case $msg in *text-only*) ;; *) echo "FAIL image message: $msg"; fail=$((fail + 1)) ;; esac

echo "$checks checks, $fail failed"
[ "$fail" -eq 0 ]

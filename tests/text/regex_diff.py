#!/usr/bin/env python3
"""Differential check of the K3 pre-tokenizer: random strings split by
`k3ctl tokenize --pieces` versus Python `regex` (V1 syntax, which has the
`&&` class intersection) running the original pattern of
docs/text-and-draft.md §1.3. Not part of the test suite (needs python3-regex);
run by hand after touching the pattern:

    tests/text/regex_diff.py build/plain/client/k3ctl/k3ctl VOCAB_DIR [N] [SEED]

VOCAB_DIR is any rank file directory (pieces do not depend on the ranks).
Characters are drawn from code points assigned in Python's Unicode version,
weighted towards letters/marks/Han/kana/digits/exotic spaces/contractions.
"""
import json
import random
import subprocess
import sys
import unicodedata

import regex

PAT = (r"[\p{Han}]+"
       r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
       r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
       r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def main():
    k3ctl, vocab = sys.argv[1], sys.argv[2]
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 2000
    random.seed(int(sys.argv[4]) if len(sys.argv) > 4 else 1)
    rx = regex.compile(PAT, regex.V1)
    ranges = [(0x20, 0x250), (0x300, 0x370), (0x3000, 0x3100), (0x4e00, 0x4e40), (0x2e80, 0x2f00),
              (0xac00, 0xac20), (0x900, 0x980), (0x1f300, 0x1f340), (0x2000, 0x2070), (0xff00, 0xff70),
              (0x600, 0x680), (0x1680, 0x1690)]
    pool = [chr(c) for a, b in ranges for c in range(a, b)]
    pool += [chr(c) for c in (0x85, 0xa0, 0x9, 0xa, 0xb, 0xc, 0xd, 0x1c, 0x17f, 0x212a, 0x20000, 0x3400, 0x1d400)]
    pool = [c for c in pool if unicodedata.category(c) not in ("Cn", "Cs")]
    common = list("aAbZ zz  '\n\r\t1234567890.,!?") + ["'s", "'LL", "'Re", "'\u017f"]
    bad = 0
    for _ in range(n):
        s = "".join(random.choice(pool) if random.random() < 0.5 else random.choice(common)
                    for _ in range(random.randint(1, 25)))
        out = subprocess.run([k3ctl, "tokenize", "--pieces", "--model", vocab, "--", s],
                             capture_output=True, check=True).stdout.decode()
        got = [json.loads(line) for line in out.split("\n") if line]
        if got != rx.findall(s):
            bad += 1
            print("DIFF", repr(s), got, rx.findall(s))
    print(f"{n} strings, {bad} differences")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

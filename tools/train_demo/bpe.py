"""bpe - the trained demo model's tokenizer, in the release's file format.

`tiktoken.model` holds one `base64(token bytes) rank` line per rank (rank =
id, k3-text-and-draft.md §1.2); the 256 special ids follow the ranks, named
in `tokenizer_config.json` exactly where K3 names them (offsets 0 [BOS],
1 [EOS], 2 <|end_of_msg|>, 3 <|open|>, 4 <|close|>, 5 <|sep|>, ... 254
[UNK], 255 [PAD]; the same table as daemon/model/demo_tok.c), so k3d's chat
renderer and output parser find them by name.

Ranks 0..255 are the single bytes in the real file's order (space 220, LF
198); the rest are byte-pair merges learned from the training corpus, inside
pre-tokenizer pieces (as tiktoken applies them), most frequent pair first,
ties to the lowest pair of ids: deterministic for a given corpus.

Only ASCII text is ever encoded here (the corpus is generated), so the
pre-tokenizer is the K3 pattern (§1.3) restricted to ASCII, where it is
exact: letters are [A-Za-z], numbers [0-9], \\s the ASCII whitespace.
train.py checks `encode` against k3d's own tokenizer (`k3ctl tokenize`) on
the whole raw-text corpus before training.
"""
import base64
import json
import os
import re

# K3's eight alternatives (§1.3) over ASCII.
PAT = re.compile(
    r"[^\r\nA-Za-z0-9]?[A-Z]*[a-z]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
    r"|[^\r\nA-Za-z0-9]?[A-Z]+[a-z]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
    r"|[0-9]{1,3}"
    r"| ?[^\sA-Za-z0-9]+[\r\n]*"
    r"|\s*[\r\n]+"
    r"|\s+(?!\S)"
    r"|\s+"
)

SPECIALS = {
    0: ("[BOS]", True), 1: ("[EOS]", True), 2: ("<|end_of_msg|>", True),
    3: ("<|open|>", False), 4: ("<|close|>", False), 5: ("<|sep|>", False),
    6: ("[start_header_id]", True), 7: ("[end_header_id]", True), 9: ("[EOT]", True),
    18: ("<|media_begin|>", True), 19: ("<|media_content|>", True),
    20: ("<|media_end|>", True), 21: ("<|media_pad|>", True), 65: ("<osagent_mode>", True),
    254: ("[UNK]", True), 255: ("[PAD]", True),
}


def byte_order():
    """The 256 single bytes in the real file's rank order."""
    pr = [c for c in range(256) if 33 <= c <= 126 or 161 <= c <= 172 or c >= 174]
    return pr + [c for c in range(256) if c not in set(pr)]


def pieces(text):
    if not text.isascii():
        raise ValueError("the demo corpus is ASCII only")
    return PAT.findall(text)


class Tokenizer:
    def __init__(self, tokens):
        self.tokens = tokens                      # rank -> bytes
        self.rank = {t: i for i, t in enumerate(tokens)}
        self.n_ranks = len(tokens)
        self._cache = {}

    @property
    def vocab(self):
        return self.n_ranks + 256

    def special(self, name):
        for k, (n, _) in SPECIALS.items():
            if n == name:
                return self.n_ranks + k
        raise KeyError(name)

    def _bpe(self, b):
        if b in self.rank:
            return [self.rank[b]]
        parts = [bytes([c]) for c in b]
        while len(parts) > 1:
            best, bi = None, -1
            for i in range(len(parts) - 1):
                r = self.rank.get(parts[i] + parts[i + 1])
                if r is not None and (best is None or r < best):
                    best, bi = r, i
            if best is None:
                break
            parts[bi:bi + 2] = [parts[bi] + parts[bi + 1]]
        return [self.rank[p] for p in parts]

    def encode(self, text):
        """Ordinary text (special spellings are not recognized)."""
        out = []
        for p in pieces(text):
            ids = self._cache.get(p)
            if ids is None:
                ids = self._cache[p] = self._bpe(p.encode())
            out.extend(ids)
        return out

    def decode(self, ids):
        out = []
        for i in ids:
            if i < self.n_ranks:
                out.append(self.tokens[i])
            else:
                k = i - self.n_ranks
                out.append((SPECIALS[k][0] if k in SPECIALS else "<|reserved_token_%d|>" % i).encode())
        return b"".join(out).decode("utf-8", "replace")

    def write(self, d):
        """tiktoken.model + tokenizer_config.json into directory d."""
        with open(os.path.join(d, "tiktoken.model"), "w", newline="\n") as f:
            for i, t in enumerate(self.tokens):
                f.write("%s %d\n" % (base64.b64encode(t).decode(), i))
        dec = {}
        for k in range(256):
            name, special = SPECIALS.get(k, ("<|reserved_token_%d|>" % (self.n_ranks + k), True))
            dec[str(self.n_ranks + k)] = {"content": name, "lstrip": False, "normalized": False,
                                          "rstrip": False, "single_word": False, "special": special}
        conf = {
            "added_tokens_decoder": dec,
            "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
            "bos_token": "[BOS]", "clean_up_tokenization_spaces": False, "eos_token": "[EOS]",
            "extra_special_tokens": {}, "model_max_length": 1048576, "pad_token": "[PAD]",
            "tokenizer_class": "TikTokenTokenizer", "unk_token": "[UNK]",
        }
        with open(os.path.join(d, "tokenizer_config.json"), "w", newline="\n") as f:
            json.dump(conf, f, indent=2, sort_keys=True)
            f.write("\n")


def train(texts, n_ranks):
    """Learns n_ranks - 256 merges from the pieces of texts (a list of str)."""
    counts = {}
    for t in texts:
        for p in pieces(t):
            counts[p] = counts.get(p, 0) + 1
    tokens = [bytes([c]) for c in byte_order()]
    rank = {t: i for i, t in enumerate(tokens)}
    words = [([rank[bytes([c])] for c in p.encode()], n) for p, n in sorted(counts.items())]
    while len(tokens) < n_ranks:
        pc = {}
        for ids, n in words:
            for a, b in zip(ids, ids[1:]):
                pc[(a, b)] = pc.get((a, b), 0) + n
        if not pc:
            break
        best = max(pc.items(), key=lambda kv: (kv[1], -kv[0][0], -kv[0][1]))[0]
        new = tokens[best[0]] + tokens[best[1]]
        nid = rank.get(new)
        if nid is None:
            nid = len(tokens)
            tokens.append(new)
            rank[new] = nid
        a, b = best
        nw = []
        for ids, n in words:
            if len(ids) > 1:
                o = []
                i = 0
                while i < len(ids):
                    if i + 1 < len(ids) and ids[i] == a and ids[i + 1] == b:
                        o.append(nid)
                        i += 2
                    else:
                        o.append(ids[i])
                        i += 1
                ids = o
            nw.append((ids, n))
        words = nw
    # a corpus too small for n_ranks: unique filler tokens keep the size
    i = 0
    while len(tokens) < n_ranks:
        f = ("<fill_%d>" % i).encode()
        if f not in rank:
            rank[f] = len(tokens)
            tokens.append(f)
        i += 1
    return Tokenizer(tokens)


def load(d):
    tokens = []
    with open(os.path.join(d, "tiktoken.model")) as f:
        for i, line in enumerate(f):
            b, r = line.split()
            assert int(r) == i
            tokens.append(base64.b64decode(b))
    return Tokenizer(tokens)

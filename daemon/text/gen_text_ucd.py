#!/usr/bin/env python3
"""gen_text_ucd.py - writes daemon/text/text_ucd.h, the Unicode character
classes of the K3 pre-tokenizer regex, from the Unicode Character Database
version the Kimi K3 release tokenizes with.

Why: the release splits text with tiktoken, whose regex engine (Rust
regex-syntax 0.8.10 in tiktoken 0.13.0, 0.8.11 in 0.14.0) carries UCD
16.0.0 tables, while the system PCRE2 (10.42 on Debian 12) carries Unicode
14.0.0 and sees every letter and digit assigned since as unassigned
(docs/text.md, "Unicode version").

Each class comes in three spellings:
  K3_UCD_<X>            explicit code point ranges: exact with any PCRE2, but
                        PCRE2 matches a class of ~1,300 ranges range by range
                        (the tokenizer runs 3x slower with them);
  K3_UCD_<X>_PCRE2      PCRE2's own \\p{..} (as before this table): exact
                        over PCRE2 tables of K3_UCD_VERSION, and over those
                        of K3_UCD_PCRE2_BASE for any text without a code
                        point of k3_ucd_new[] (no code point assigned by
                        14.0 changed class by 16.0: checked here, and over
                        every scalar value against the system PCRE2 by
                        test_tok_ucd);
  K3_UCD_<X>_PCRE2_NEW  the same plus the ranges of k3_ucd_new[]: exact
                        over K3_UCD_PCRE2_BASE tables for any text, about
                        25% slower on non-ASCII text (alternations PCRE2
                        tries per character).
k3_ucd_new[] lists the code points assigned after K3_UCD_PCRE2_BASE that are
in some class (letters, marks, numbers, Han); text_pretok.c looks for them
before it picks a pattern.

The output is checked in: the build needs neither Python packages nor a
network, and a table change is a reviewable diff. Regenerate (or check)
with the pinned input, in a throw-away virtual environment:

    python3 -m venv /tmp/ucd && /tmp/ucd/bin/pip install unicodedataplus==16.0.0.post1
    /tmp/ucd/bin/python daemon/text/gen_text_ucd.py [--check]

Input: General_Category, Script and Age of every Unicode scalar value,
read through unicodedataplus, whose version follows the UCD version (its
sdist's SHA-256 is recorded below). The header records a SHA-256 of that
input in a canonical form ("U+XXXX gc sc age" per scalar value, one per
line), so any UCD 16.0.0 source can be checked against it.
"""
import argparse
import hashlib
import os
import sys
import unicodedata

UCD_VERSION = "16.0.0"
FAST_BASE = "14.0.0"
PACKAGE = "unicodedataplus"
PACKAGE_VERSION = "16.0.0.post1"
PACKAGE_SDIST_SHA256 = "f8cd342d91c73b512c229976a82aeb7e448517969d611433a9ea825dc62fed84"
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "text_ucd.h")


def scalar_values():
    return [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]


def ranges(members):
    out, run = [], None
    for c in sorted(members):
        if run and c == run[1] + 1:
            run[1] = c
        else:
            if run:
                out.append(tuple(run))
            run = [c, c]
    if run:
        out.append(tuple(run))
    return out


def literal(items):
    """PCRE2 pattern text as C string literals, one per line."""
    lines, cur = [], ""
    for it in items:
        if cur and len(cur) + len(it) > 88:
            lines.append(cur)
            cur = ""
        cur += it
    if cur:
        lines.append(cur)
    return " \\\n\t".join('"%s"' % l for l in lines) if lines else '""'


def body(members):
    """The inside of a PCRE2 [...] class holding exactly members."""
    return ["\\\\x{%X}" % a if a == b else "\\\\x{%X}-\\\\x{%X}" % (a, b) for a, b in ranges(members)]


def version_tuple(v):
    return tuple(int(x) for x in v.split("."))


def build(ud):
    cps = scalar_values()
    gc = {c: ud.category(chr(c)) for c in cps}
    sc = {c: ud.script(chr(c)) for c in cps}
    age = {c: ud.age(chr(c)) for c in cps}
    canon = "".join("U+%04X %s %s %s\n" % (c, gc[c], sc[c], age[c]) for c in cps).encode()
    base = version_tuple(FAST_BASE)[:2]
    new = {c for c in cps if age[c] != "Unassigned" and version_tuple(age[c]) > base}
    han = {c for c in cps if sc[c] == "Han"}
    letter = {c for c in cps if gc[c][0] == "L"}
    number = {c for c in cps if gc[c][0] == "N"}
    upper = {c for c in cps if gc[c] in ("Lu", "Lt", "Lm", "Lo") or gc[c][0] == "M"}
    lower = {c for c in cps if gc[c] in ("Ll", "Lm", "Lo") or gc[c][0] == "M"}
    # what UPPER and LOWER both hold: written once (K3_UCD_CASELESS_RANGES)
    caseless = (upper & lower) - han
    # name, what (the release's spelling), exact members, PCRE2 spelling of
    # the part assigned by FAST_BASE, members of that part assigned later
    classes = [
        ("HAN", "[\\p{Han}] (Rust regex: Script=Han, not Script_Extensions)", han,
         "\\\\p{sc:Han}", han & new),
        ("UPPER", "[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]", upper - han,
         "\\\\p{Lu}\\\\p{Lt}\\\\p{Lm}\\\\p{Lo}\\\\p{M}", (upper - han) & new),
        ("LOWER", "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]", lower - han,
         "\\\\p{Ll}\\\\p{Lm}\\\\p{Lo}\\\\p{M}", (lower - han) & new),
        ("N", "[\\p{N}]", number, "\\\\p{N}", number & new),
        ("LN", "[^...\\p{L}\\p{N}]", letter | number, "\\\\p{L}\\\\p{N}",
         (letter | number) & new),
    ]
    check_base(cps, new, gc)
    return canon, classes, caseless


def check_base(cps, new, gc):
    """With Python's own unicodedata at FAST_BASE (Python 3.11), checks that
    no code point assigned by then changed General_Category class by
    UCD_VERSION (Script=Han has no such check here: test_tok compares every
    scalar value against the system PCRE2)."""
    if unicodedata.unidata_version != FAST_BASE:
        print("note: Python's unicodedata is %s, not %s: the base check is left to test_tok"
              % (unicodedata.unidata_version, FAST_BASE), file=sys.stderr)
        return
    old = {c: unicodedata.category(chr(c)) for c in cps if c not in new}
    want = {
        "UPPER": lambda g: g in ("Lu", "Lt", "Lm", "Lo") or g[0] == "M",
        "LOWER": lambda g: g in ("Ll", "Lm", "Lo") or g[0] == "M",
        "N": lambda g: g[0] == "N",
        "LN": lambda g: g[0] in "LN",
    }
    for name, pred in want.items():
        bad = [c for c, g in old.items() if pred(g) != pred(gc[c])]
        if bad:
            sys.exit("gen_text_ucd.py: %s: %d code points assigned by %s changed class, e.g. U+%04X"
                     % (name, len(bad), FAST_BASE, bad[0]))


SMP = "\\\\x{10000}-\\\\x{10FFFF}"
# PCRE2 compares a character with a class's ranges one by one: the
# supplementary-plane additions go behind a one-range guard, so that a BMP
# character outside the class (spaces, punctuation, the other case of a
# letter: the common case) is not compared with each of them. A few
# additions are cheaper inline than an alternation.
GUARD_ABOVE = 8


def split_planes(members):
    return {c for c in members if c < 0x10000}, {c for c in members if c >= 0x10000}


def with_new(pcre2_base, added):
    if len(ranges(added)) <= GUARD_ABOVE:
        return ["["] + [pcre2_base] + body(added) + ["]"]
    bmp, smp = split_planes(added)
    return ["(?:["] + [pcre2_base] + body(bmp) + ["]|(?=[" + SMP + "])["] + body(smp) + ["])"]


def not_ln_with_new(pcre2_base, added):
    """[^EXTRA\p{L}\p{N}] over PCRE2's tables plus added, EXTRA being BMP
    characters."""
    bmp, smp = split_planes(added)
    return (['(?:[^" EXTRA "'] + [pcre2_base] + body(bmp) + [SMP + "]|(?=[" + SMP + "])[^"]
            + [pcre2_base] + body(smp) + ["])"])


def no_han(expr):
    """Han is Lo: the word classes leave it out by a lookahead (the
    intersection has no PCRE2 10.42 syntax). PCRE2's \p{sc:Han} suffices in
    both table versions the _PCRE2 spellings are used with: with 14.0 tables
    the newer ideographs are unassigned, not Lo, and the additions exclude
    them; with 16.0 tables \p{sc:Han} has them."""
    return ['(?:(?!\\\\p{sc:Han})'] + expr + [")"]


def render(canon, classes, caseless):
    out, new_all = [], set()
    for name, what, members, pcre2_base, added in classes:
        exact = body(members)
        new_all |= added
        if name == "UPPER":
            out.append("/* [\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]], what UPPER and LOWER both hold, as\n"
                       " * class text without brackets: %u code points in %u ranges */\n"
                       "#define K3_UCD_CASELESS_RANGES \\\n\t%s\n"
                       % (len(caseless), len(body(caseless)), literal(body(caseless))))
        if name == "LN":
            out.append("/* [^EXTRA\\p{L}\\p{N}], EXTRA being further BMP characters (PCRE2\n"
                       " * class text): %u letters and numbers in %u ranges, %u of them\n"
                       " * assigned after %s */\n"
                       "#define K3_UCD_NOT_LN(EXTRA) \\\n\t%s\n#define K3_UCD_NOT_LN_PCRE2(EXTRA) \\\n\t%s\n"
                       "#define K3_UCD_NOT_LN_PCRE2_NEW(EXTRA) \\\n\t%s\n"
                       % (len(members), len(exact), len(added), FAST_BASE,
                          literal(['[^" EXTRA "'] + exact + ["]"]),
                          literal(['[^" EXTRA "' + pcre2_base + "]"]),
                          literal(not_ln_with_new(pcre2_base, added))))
            continue
        plain = ["[" + pcre2_base + "]"] if name not in ("N", "HAN") else [pcre2_base]
        fast = with_new(pcre2_base, added)
        if name in ("UPPER", "LOWER"):
            plain, fast = no_han(plain), no_han(fast)
        if name in ("UPPER", "LOWER"):
            exact = body(members - caseless)
            spelled = literal(["["] + exact) + ' \\\n\tK3_UCD_CASELESS_RANGES "]"'
            ranges_said = "%u ranges plus\n * K3_UCD_CASELESS_RANGES" % len(exact)
        else:
            spelled = literal(["["] + exact + ["]"])
            ranges_said = "%u ranges" % len(exact)
        out.append("/* %s:\n * %u code points in %s, %u of them assigned after %s */\n"
                   "#define K3_UCD_%s \\\n\t%s\n#define K3_UCD_%s_PCRE2 \\\n\t%s\n"
                   "#define K3_UCD_%s_PCRE2_NEW \\\n\t%s\n"
                   % (what, len(members), ranges_said, len(added), FAST_BASE, name,
                      spelled, name, literal(plain), name, literal(fast)))
    rs = ranges(new_all)
    rows = ["\t{ 0x%05X, 0x%05X }," % r for r in rs]
    out.append("/* Code points assigned after %s that are in some class above (%u in\n"
               " * %u ranges): where none occurs, the _PCRE2 spellings are exact over\n"
               " * tables of %s too. Sorted, disjoint, inclusive. */\n"
               "static const uint32_t k3_ucd_new[][2] = {\n%s\n};\n"
               % (FAST_BASE, len(new_all), len(rs), FAST_BASE, "\n".join(rows)))
    data = "\n".join(out)
    head = """/*
 * text_ucd.h - GENERATED by daemon/text/gen_text_ucd.py; do not edit.
 *
 * The Unicode character classes of the K3 pre-tokenizer regex
 * (docs/text-and-draft.md §1.3) in PCRE2 syntax (PCRE2_UTF|PCRE2_UCP),
 * so that the split follows the release's Unicode version, not the one
 * compiled into the system PCRE2 (docs/text.md, "Unicode version").
 * K3_UCD_<X>: explicit ranges, exact with any PCRE2. K3_UCD_<X>_PCRE2:
 * PCRE2's own tables, exact over tables of K3_UCD_VERSION, and over those
 * of K3_UCD_PCRE2_BASE for text without a code point of k3_ucd_new[].
 * K3_UCD_<X>_PCRE2_NEW: PCRE2's tables plus k3_ucd_new[], exact over
 * tables of K3_UCD_PCRE2_BASE or K3_UCD_VERSION for any text. All are
 * whole class expressions; K3_UCD_NOT_LN*(EXTRA) take further (BMP)
 * characters to leave out.
 *
 * Unicode Character Database %s, read through %s %s
 * (PyPI sdist SHA-256 %s).
 * Input SHA-256 (General_Category, Script and Age of every scalar value,
 * one "U+XXXX gc sc age" line each):
 * %s
 * Table SHA-256 (everything below):
 * %s
 */
#ifndef K3_TEXT_UCD_H
#define K3_TEXT_UCD_H

#include <stdint.h>

#define K3_UCD_VERSION "%s"
#define K3_UCD_PCRE2_BASE "%s"

""" % (UCD_VERSION, PACKAGE, PACKAGE_VERSION, PACKAGE_SDIST_SHA256, hashlib.sha256(canon).hexdigest(),
       hashlib.sha256(data.encode()).hexdigest(), UCD_VERSION, FAST_BASE)
    return head + data + "\n#endif\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="compare with the checked-in header, write nothing")
    ap.add_argument("--out", default=OUT)
    args = ap.parse_args()
    try:
        import unicodedataplus as ud
    except ImportError:
        sys.exit("gen_text_ucd.py: needs %s==%s (see the docstring)" % (PACKAGE, PACKAGE_VERSION))
    if ud.unidata_version != UCD_VERSION:
        sys.exit("gen_text_ucd.py: %s has UCD %s, want %s" % (PACKAGE, ud.unidata_version, UCD_VERSION))
    text = render(*build(ud))
    if args.check:
        with open(args.out, encoding="utf-8") as f:
            same = f.read() == text
        print("%s: %s" % (args.out, "up to date" if same else "DIFFERS from the generator's output"))
        return 0 if same else 1
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(text)
    print("wrote %s" % args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

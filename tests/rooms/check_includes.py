#!/usr/bin/env python3
"""check_includes.py - fails when a C/C++/CUDA file includes across a
forbidden arrow between the rooms of the tree.

    check_includes.py SOURCE_ROOT [RULES]     check the tree (exit 0 or 1)
    check_includes.py --self-test             check the checker on planted trees

RULES (default SOURCE_ROOT/tests/rooms/rooms.txt) has one row per room:
its folder and the rooms its files may include. Every .c/.h/.cu/.cuh/.cc/
.cpp/.hpp under SOURCE_ROOT (but the build folders, hidden folders and
"unchecked" rows) must sit in a room; each of its #include lines that names
a file of the tree (quoted, or angled when it resolves in the tree) must
land in its own room or in one it may use. Every room must also be named
in README.md's "Layout" section, so the map and the rule cannot drift.
Each failure is printed as FILE:LINE and the arrow it crosses.
"""
import os
import re
import shutil
import sys
import tempfile

SOURCE_EXT = (".c", ".h", ".cu", ".cuh", ".cc", ".cpp", ".hpp")
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')


class Rules:
    def __init__(self, path):
        self.rows = {}          # folder -> set of rooms, "*" or "unchecked"
        self.recursive = set()  # folders whose row covers subfolders
        self.search = ["."]
        self.generated = set()
        for n, line in enumerate(open(path, encoding="utf-8"), 1):
            words = line.split("#", 1)[0].split()
            if not words:
                continue
            key, rest = words[0], words[1:]
            if key == "search":
                self.search = rest
            elif key == "generated":
                self.generated.update(rest)
            else:
                if not rest:
                    raise SystemExit("%s:%d: row '%s' says nothing about what it may include "
                                     "(use '-' for nothing)" % (path, n, key))
                folder = key[:-3] if key.endswith("/**") else key
                if key.endswith("/**"):
                    self.recursive.add(folder)
                if rest == ["-"]:
                    self.rows[folder] = set()
                elif rest in (["*"], ["unchecked"]):
                    self.rows[folder] = rest[0]
                else:
                    self.rows[folder] = set(rest)
        for folder, allowed in self.rows.items():
            if isinstance(allowed, set):
                for r in sorted(allowed - set(self.rows)):
                    raise SystemExit("%s: row '%s' may include '%s', which has no row of its own"
                                     % (path, folder, r))

    def room_of(self, rel_dir):
        """The room (a row's folder) holding files of rel_dir, or None."""
        if rel_dir in self.rows:
            return rel_dir
        for folder in self.recursive:
            if rel_dir.startswith(folder + "/"):
                return folder
        return None


def source_files(root, rules):
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        rel_dir = "" if rel_dir == "." else rel_dir
        keep = []
        for d in sorted(dirnames):
            sub = os.path.join(rel_dir, d) if rel_dir else d
            if d.startswith(".") or (not rel_dir and d.startswith("build")):
                continue
            if rules.rows.get(sub) == "unchecked" and sub in rules.recursive:
                continue
            keep.append(d)
        dirnames[:] = keep
        for f in sorted(filenames):
            if f.endswith(SOURCE_EXT):
                yield rel_dir, f


def resolve(root, rules, rel_dir, name, quoted):
    """The path (relative to root) of the tree file an include names, or None."""
    dirs = ([rel_dir] if quoted else []) + rules.search
    for d in dirs:
        cand = os.path.normpath(os.path.join(d, name))
        if not cand.startswith("..") and os.path.isfile(os.path.join(root, cand)):
            return cand
    return None


def readme_rooms(root):
    """The text of README.md's Layout section ('' when there is none)."""
    try:
        text = open(os.path.join(root, "README.md"), encoding="utf-8").read()
    except OSError:
        return ""
    m = re.search(r"^## Layout\s*$(.*?)(?=^## |\Z)", text, re.M | re.S)
    return m.group(1) if m else ""


def check(root, rules_path=None):
    """Returns the list of problems (strings) found in the tree at root."""
    rules = Rules(rules_path or os.path.join(root, "tests", "rooms", "rooms.txt"))
    rules_rel = os.path.relpath(rules_path, root) if rules_path else "tests/rooms/rooms.txt"
    problems = []
    for rel_dir, f in source_files(root, rules):
        path = os.path.join(rel_dir, f) if rel_dir else f
        room = rules.room_of(rel_dir)
        if room is None:
            problems.append("%s: folder '%s/' is no room of %s: add a row for it there (what it is "
                            "for in README.md's Layout, and which rooms it may include)"
                            % (path, rel_dir or ".", rules_rel))
            continue
        allowed = rules.rows[room]
        if allowed == "*":
            continue
        with open(os.path.join(root, path), encoding="utf-8", errors="replace") as fh:
            for n, line in enumerate(fh, 1):
                m = INCLUDE_RE.match(line)
                if not m:
                    continue
                quoted, name = m.group(1) == '"', m.group(2)
                if name in rules.generated:
                    continue
                target = resolve(root, rules, rel_dir, name, quoted)
                if target is None:
                    if quoted:
                        problems.append('%s:%d: #include "%s" names no file of the tree (nor a '
                                        'generated header of %s)' % (path, n, name, rules_rel))
                    continue
                troom = rules.room_of(os.path.dirname(target))
                if troom == room or (troom is not None and troom in allowed):
                    continue
                problems.append("%s:%d: #include %s%s%s crosses a forbidden arrow: %s -> %s "
                                "(%s may include: %s)"
                                % (path, n, m.group(1), name, '"' if quoted else ">", room,
                                   troom or os.path.dirname(target), room,
                                   " ".join(sorted(allowed)) or "nothing"))
    layout = readme_rooms(root)
    for folder, allowed in sorted(rules.rows.items()):
        # a line of the section starting with the room: "base/ ..." in a
        # code block, or "| `base/` | ..." in a table
        if not re.search(r"^\s*(\|\s*)?`?%s/?(\*\*)?`?[\s|]" % re.escape(folder), layout, re.M):
            problems.append("README.md: the Layout section does not name room '%s/' (one line per "
                            "room: what it is for and what it may use)" % folder)
    return problems


def self_test():
    """Plants forbidden includes and an unplanned folder in a small tree
    and checks that each is reported with file:line and the arrow."""
    here = os.path.dirname(os.path.abspath(__file__))
    rules = os.path.join(here, "rooms.txt")
    failures = 0
    tmp = tempfile.mkdtemp(prefix="k3-rooms-")

    def write(rel, text):
        p = os.path.join(tmp, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "w", encoding="utf-8") as fh:
            fh.write(text)

    def expect(what, problems, *needles):
        nonlocal failures
        joined = "\n".join(problems)
        for needle in needles:
            if needle not in joined:
                failures += 1
                print("FAIL %s: expected %r in:\n%s" % (what, needle, joined or "(no problems)"))

    try:
        rows = Rules(rules)
        write("README.md", "# x\n\n## Layout\n\n```\n" +
              "".join("%s/  room\n" % f for f in rows.rows) + "```\n")
        write("base/err.h", "#pragma once\n")
        write("daemon/model/model.h", '#include "base/err.h"\n')
        write("daemon/server/server.h", '#include "model/model.h"\n#include <stdio.h>\n'
              '#include "k3_build_config.h"\n')
        write("kernels/kern.c", '#include "base/err.h"\n')
        write("tests/x/t.c", '#include "daemon/server/server.h"\n')
        problems = check(tmp, rules)
        if problems:
            failures += 1
            print("FAIL clean tree reported:\n" + "\n".join(problems))

        write("kernels/kern.c", '#include "base/err.h"\n#include "model/model.h"\n')
        expect("planted kernels -> model", check(tmp, rules),
               "kernels/kern.c:2: #include \"model/model.h\" crosses a forbidden arrow: "
               "kernels -> daemon/model (kernels may include: base)")
        write("kernels/kern.c", '#include <daemon/model/model.h>\n')
        expect("angled include resolving in the tree", check(tmp, rules),
               "kernels/kern.c:1: #include <daemon/model/model.h> crosses a forbidden arrow")
        write("kernels/kern.c", '#include "base/err.h"\n')
        write("proto/p.h", '\n\n#include "../base/err.h"\n')
        expect("planted proto -> base (proto stays pure)", check(tmp, rules),
               "proto/p.h:3: #include \"../base/err.h\" crosses a forbidden arrow: proto -> base "
               "(proto may include: nothing)")
        os.remove(os.path.join(tmp, "proto/p.h"))
        write("daemon/newroom/x.c", "int x;\n")
        expect("unplanned folder", check(tmp, rules),
               "daemon/newroom/x.c: folder 'daemon/newroom/' is no room of", "add a row")
        os.remove(os.path.join(tmp, "daemon/newroom/x.c"))
        write("daemon/model/y.c", '#include "nonexistent.h"\n')
        expect("unresolvable include", check(tmp, rules),
               'daemon/model/y.c:1: #include "nonexistent.h" names no file of the tree')
        os.remove(os.path.join(tmp, "daemon/model/y.c"))
        write("README.md", "# x\n\n## Layout\n\nnothing here\n")
        expect("README without the rooms", check(tmp, rules),
               "README.md: the Layout section does not name room 'base/'")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("self-test: %s" % ("FAILED" if failures else "ok"))
    return 1 if failures else 0


def main(argv):
    if len(argv) == 2 and argv[1] == "--self-test":
        return self_test()
    if len(argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    problems = check(argv[1], argv[2] if len(argv) == 3 else None)
    for p in problems:
        print(p)
    if problems:
        print("%d include-direction problem(s); the arrows are in tests/rooms/rooms.txt and "
              "README.md (Layout)" % len(problems))
        return 1
    print("include directions ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

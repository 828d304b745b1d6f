#!/usr/bin/env python3
"""A pack must never outlive the bytes it was made from (issue 16, item 1),
through the real k3ctl pack and k3d.

The reproduction: a nano model; the expert bytes of layer 2 in shard 1
overwritten with other bytes of the same length (the layer's experts
rotated: header and size unchanged); k3ctl pack; the original shard bytes
written back (as a re-download or repair would). Then k3d must not serve
the packs' stale weights: it ignores the packs, with a warning naming the
shard, and its greedy ids equal the --no-packs ids; k3ctl pack --verify
rewrites the stale layer-2 pack, re-verifies the other seven and the spine
pack, and k3d then
serves every layer from packs with the same ids. A shard replaced by a
copy (another inode, the same bytes) is a changed identity too: k3d ignores
the packs until k3ctl pack (no --verify) has compared them with the shard
and updated their source records, without rewriting a pack.

usage: test_pack_sources.py K3D K3CTL
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from k3proto import Daemon, generate_ids  # noqa
from k3test import check, report  # noqa

K3D, K3CTL = sys.argv[1], sys.argv[2]
PROMPT = [11, 300, 7, 1024, 5, 77, 2000, 42]
MAX_NEW = 16
SHARD = "model-00001-of-00002.safetensors"


def serve(model, *args):
    """(greedy ids, the log's 'experts:' line) of a k3d on model."""
    d = Daemon(K3D, *args, model=model)
    try:
        ids, _ = generate_ids(d.sock, PROMPT, MAX_NEW)
        line = next((ln for ln in d.log_text().splitlines() if "experts:" in ln), "")
    finally:
        d.stop()
    check(not d.sanitizer_reports(), f"k3d {args}: sanitizer reports {d.sanitizer_reports()[:3]}")
    return ids, line


def pack(model, *args):
    r = subprocess.run([K3CTL, "pack", "--model", model, *args], capture_output=True, text=True,
                       timeout=120)
    return r.returncode, r.stdout + r.stderr


def rotate_layer_experts(path, layer):
    """Overwrites every expert array of `layer` with the bytes of the next
    expert's same array (same lengths; header and size unchanged)."""
    with open(path, "r+b") as f:
        data = bytearray(f.read())
        n = struct.unpack_from("<Q", data, 0)[0]
        hdr = json.loads(bytes(data[8:8 + n]))
        pre = "language_model.model.layers.%d.block_sparse_moe.experts." % layer
        ex = {}
        for k, v in hdr.items():
            if k.startswith(pre):
                e, arr = k[len(pre):].split(".", 1)
                ex.setdefault(int(e), {})[arr] = v["data_offsets"]
        ids = sorted(ex)
        orig = bytes(data)
        for i, e in enumerate(ids):
            nxt = ex[ids[(i + 1) % len(ids)]]
            for arr, (a, b) in ex[e].items():
                c, d = nxt[arr]
                data[8 + n + a:8 + n + b] = orig[8 + n + c:8 + n + d]
        f.seek(0)
        f.write(data)
    return len(ids)


def pack_inodes(model):
    d = os.path.join(model, "k3-packs")
    return {n: os.stat(os.path.join(d, n)).st_ino for n in sorted(os.listdir(d))}


def main():
    work = tempfile.mkdtemp(prefix="k3-pack-sources-")
    try:
        model = os.path.join(work, "nano")
        subprocess.run([K3CTL, "demo-model", "--out", model], check=True, capture_output=True)
        shard = os.path.join(model, SHARD)
        with open(shard, "rb") as f:
            original = f.read()
        good, _ = serve(model, "--no-packs")
        check(len(good) == MAX_NEW, f"--no-packs generated {len(good)} ids")

        # The stale packs: made from the rotated layer-2 bytes.
        check(rotate_layer_experts(shard, 2) == 16, "layer 2 has 16 experts")
        rc, out = pack(model)
        check(rc == 0 and "9 packs written, 0 kept" in out, f"pack of the rotated shard: {out}")
        bad, line = serve(model)
        check("all 8 MoE layers from packs" in line, f"packs of the rotated shard used: {line}")
        # the test has teeth: the rotated weights give other ids
        check(bad != good, f"rotated layer-2 experts change the greedy ids ({bad} vs {good})")

        # The shard repaired in place (same inode, same size and header).
        with open(shard, "r+b") as f:
            f.write(original)
        ids, line = serve(model)
        check(ids == good, f"k3d after the repair: ids {ids} == --no-packs ids {good}")
        check(line.startswith("<4>") and "8 from the shards (8 packs rejected" in line and
              f"its source '{SHARD}' was written or replaced" in line and "k3ctl pack" in line,
              f"k3d warns that it ignores the packs, naming the shard: {line}")
        ids, _ = serve(model, "--no-packs")
        check(ids == good, f"--no-packs after the repair: {ids} == {good}")

        rc, out = pack(model, "--verify")
        check(rc == 0, f"pack --verify after the repair exits 0: {out}")
        # seven expert packs and the spine pack re-verified (their bytes are
        # not the rotated experts')
        check("1 packs written, 8 kept" in out and "8 kept packs were re-verified" in out and
              "spine    : kept" in out,
              f"pack --verify rewrites one pack, re-verifies seven and the spine: {out}")
        check("layer   2: rewrote" in out and "expert (2, 0) differs from its bytes" in out and
              SHARD in out, f"pack --verify names the stale layer and the shard: {out}")
        ids, line = serve(model)
        check("all 8 MoE layers from packs" in line, f"packs used after --verify: {line}")
        check(ids == good, f"k3d from the rewritten packs: ids {ids} == {good}")
        rc, out = pack(model, "--verify")
        check(rc == 0 and "0 packs written, 9 kept" in out and "re-verified" not in out,
              f"a second --verify keeps every pack as it is: {out}")

        # The shard replaced by a copy: another inode, the same bytes.
        inodes = pack_inodes(model)
        copy = shard + ".copy"
        shutil.copy2(shard, copy)
        os.rename(copy, shard)
        ids, line = serve(model)
        check(ids == good and "8 packs rejected" in line and "inode" in line,
              f"a replaced shard (new inode) is a changed identity: {ids} {line}")
        rc, out = pack(model)
        check(rc == 0 and "0 packs written, 9 kept" in out and "9 kept packs were re-verified" in out,
              f"pack re-verifies against the copy without rewriting: {out}")
        check(pack_inodes(model) == inodes, "no pack was rewritten for a copy with the same bytes")
        ids, line = serve(model)
        check(ids == good and "all 8 MoE layers from packs" in line,
              f"packs used again after the re-verify: {ids} {line}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return report()


if __name__ == "__main__":
    sys.exit(main())

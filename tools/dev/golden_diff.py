#!/usr/bin/env python3
"""Normalised error between the logits of two golden fixtures of the same prompt
(for example HF in bf16 against HF in float32): how far the reference moves with its own precision.
usage: tools/dev/golden_diff.py A.golden B.golden"""
import struct
import sys

import numpy as np


def rows(path):
    b = open(path, "rb").read()
    o = 12 + 32 + 8 + 32
    n = struct.unpack_from("<I", b, o)[0]
    o += 4 + 4 * n
    nr = struct.unpack_from("<I", b, o)[0]
    o += 4
    out = []
    for _ in range(nr):
        pos, top1, margin, rms, nid = struct.unpack_from("<IiffI", b, o)
        o += 20
        ids = np.frombuffer(b, np.int32, nid, o)
        o += 4 * nid
        lg = np.frombuffer(b, np.float32, nid, o)
        o += 4 * nid
        out.append((pos, top1, dict(zip(ids.tolist(), lg.tolist()))))
    return out


a, b = rows(sys.argv[1]), rows(sys.argv[2])
for (pa, ta, da), (pb, tb, db) in zip(a, b):
    common = sorted(set(da) & set(db))
    x = np.array([da[i] for i in common]); y = np.array([db[i] for i in common])
    print(f"pos {pa}: nerr {np.linalg.norm(x - y) / np.linalg.norm(y):.3e} over {len(common)} ids, top1 {ta} vs {tb}")

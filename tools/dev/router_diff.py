#!/usr/bin/env python3
"""router_diff.py A B: compare two routing traces ("layer position gap id,id,... [more]" per line; the
CPU engine writes one with CALLA_ROUTER_TRACE=FILE, tools/gen/make_golden.py --router-trace writes HF's).

Prints the first decision (by position, then layer) whose chosen experts differ, with both sides'
gaps (k-th minus (k+1)-th probability), and the smallest gaps of A. A flipped near-tie shows as a
first difference whose gaps are tiny on both sides."""
import sys


def load(path):
    d = {}
    with open(path) as f:
        for line in f:
            layer, pos, gap, ids = line.split()[:4]   # later fields: router_stats.py
            d[(int(pos), int(layer))] = (float(gap), ids)   # the last write wins (a re-run prefix)
    return d


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    a, b = load(sys.argv[1]), load(sys.argv[2])
    common = sorted(set(a) & set(b))
    diff = [key for key in common if a[key][1] != b[key][1]]
    print(f"{len(common)} decisions in both traces, {len(diff)} differ")
    for pos, layer in diff[:5]:
        ga, gb = a[(pos, layer)][0], b[(pos, layer)][0]
        print(f"  differ at position {pos}, layer {layer}: gap {ga:.3e} in A, {gb:.3e} in B")
    print("smallest gaps in A:")
    for key in sorted(common, key=lambda k: a[k][0])[:8]:
        print(f"  position {key[0]}, layer {key[1]}: gap {a[key][0]:.3e}  {'DIFFER' if key in diff else 'same'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

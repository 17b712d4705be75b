#!/usr/bin/env python3
"""spec_plot.py: speculative decoding's speed-up against acceptance on the H200, as an SVG.

    python3 bench/lab/spec_plot.py --warm WARM.txt [--oracle BENCH.json ...] [--lab DRAFT_LAB.txt] --out F.svg

Three kinds of points, each labelled as what it is:
- curves: the oracle drafts' expected speed-up for draft lengths D, from the measured cost of a
  verification of D + 1 tokens kept whole or cut back and of a decode step (small_t's lines in
  WARM.txt): each draft token right with probability P, independently, a draft of D accepted up to
  its first wrong token; speed-up = E[tokens a verification] / E[its cost in decode steps];
- dots: `calla bench --draft oracle` records measured on the device (speculative.acceptance, .speedup);
- squares: draft_lab's real-text edit tasks (acceptance, and the speed-up its h200 cost model gives).
Python 3 standard library only. Exit 0, 2 on bad arguments.
"""
import argparse
import json
import re
import sys


def costs(path):
    kept, cut, step = {}, {}, None
    for line in open(path):
        m = re.search(r"verify (\d+): ([\d.]+) ms kept whole, ([\d.]+) ms cut", line)
        if m:
            kept[int(m[1])], cut[int(m[1])] = float(m[2]), float(m[3])
        m = re.search(r"decode at \d+, plain: ([\d.]+) ms", line)
        if m:
            step = float(m[1])
    if not kept or step is None:
        sys.exit(f"spec_plot: no verification or decode lines in {path}")
    return kept, cut, step


def expected(P, D, kept, cut, step):
    tokens = cost = 0.0
    for m in range(D + 1):  # m draft tokens accepted
        p = P**m * (1 - P) if m < D else P**D
        tokens += p * (m + 1)
        cost += p * (kept[D + 1] if m == D else cut[D + 1]) / step
    return tokens / cost


def main():
    a = argparse.ArgumentParser()
    a.add_argument("--warm", required=True)
    a.add_argument("--oracle", nargs="*", default=[])
    a.add_argument("--lab")
    a.add_argument("--out", required=True)
    o = a.parse_args()
    kept, cut, step = costs(o.warm)
    W, H, L, B, T, R = 640, 420, 60, 50, 30, 150
    x = lambda p: L + p * (W - L - R)
    y = lambda s: H - B - s / 2.5 * (H - B - T)
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">',
           f'<rect width="{W}" height="{H}" fill="white"/>']
    for s in (0, 0.5, 1, 1.5, 2, 2.5):
        svg.append(f'<line x1="{L}" x2="{W - R}" y1="{y(s):.1f}" y2="{y(s):.1f}" stroke="#ddd"/>'
                   f'<text x="{L - 6}" y="{y(s) + 4:.1f}" text-anchor="end">{s:g}x</text>')
    for p in (0, 0.25, 0.5, 0.75, 1):
        svg.append(f'<text x="{x(p):.1f}" y="{H - B + 16}" text-anchor="middle">{p:g}</text>')
    svg.append(f'<text x="{(L + W - R) / 2}" y="{H - 12}" text-anchor="middle">acceptance (draft tokens right)</text>')
    svg.append(f'<text x="14" y="{(T + H - B) / 2}" transform="rotate(-90 14 {(T + H - B) / 2})" '
               f'text-anchor="middle">speed-up over plain decode</text>')
    colours = {1: "#1b9e77", 3: "#d95f02", 7: "#7570b3"}
    for i, (D, c) in enumerate(colours.items()):
        if D + 1 not in kept:
            continue
        pts = " ".join(f"{x(k / 50):.1f},{y(expected(k / 50, D, kept, cut, step)):.1f}" for k in range(51))
        svg.append(f'<polyline points="{pts}" fill="none" stroke="{c}" stroke-width="2"/>')
        svg.append(f'<text x="{W - R + 8}" y="{T + 14 * i + 4}" fill="{c}">model, D = {D}</text>')
    svg.append(f'<line x1="{L}" x2="{W - R}" y1="{y(1):.1f}" y2="{y(1):.1f}" stroke="#333" stroke-dasharray="4 3"/>')
    for f in o.oracle:
        sp = json.load(open(f))["speculative"]
        svg.append(f'<circle cx="{x(sp["acceptance"]):.1f}" cy="{y(sp["speedup"]):.1f}" r="5" fill="black"/>')
    svg.append(f'<circle cx="{W - R + 12}" cy="{T + 56}" r="5" fill="black"/>'
               f'<text x="{W - R + 22}" y="{T + 60}">bench, measured</text>')
    if o.lab:
        for line in open(o.lab):
            m = re.match(r"\S+\s+(rename|comment|lines|other)\s+\d+\s+\d+\s+(\d+)%.*\s([\d.]+)x\s*$", line)
            if m:
                px, py = x(int(m[2]) / 100), y(float(m[3]))
                svg.append(f'<rect x="{px - 3:.1f}" y="{py - 3:.1f}" width="6" height="6" fill="#e7298a" opacity="0.7"/>')
        svg.append(f'<rect x="{W - R + 9}" y="{T + 71}" width="6" height="6" fill="#e7298a"/>'
                   f'<text x="{W - R + 22}" y="{T + 78}">real-text edits,</text>'
                   f'<text x="{W - R + 22}" y="{T + 92}">lookup drafter,</text>'
                   f'<text x="{W - R + 22}" y="{T + 106}">measured costs</text>')
    svg.append(f'<rect x="{L}" y="{T}" width="{W - L - R}" height="{H - B - T}" fill="none" stroke="#333"/></svg>')
    open(o.out, "w").write("\n".join(svg) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""score_gate.py: one sequence scored by HF fp32 (the reference), optionally HF bf16, and Calla's
backends, each compared with HF fp32 (issue 13, item 4, end-to-end part). Prints a table, writes
every score JSON and summary.md under --out, and exits 1 when a gate fails:

    cuda      top-1 agreement >= 99.5% where HF fp32's top-2 margin > 0.05
    cpu-f32   (the CPU oracle with an fp32 KV cache) normalised logit error <= 1e-4 at every position
              (over HF's stored top-k logits; see src/score.h)
    cpu, hf-bf16: reported, not gated

    python3 tools/score_gate.py --calla build/calla --model /tmp/calla-full --len 4096 \\
        --backends cuda,cpu-f32 --hf-device cuda --hf-bf16 --out bench/results/DATE-score-gate
On this machine (no GPU), the tiny geometry: --model DIR --len 64 --backends cpu,cpu-f32.
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
GATES = {"cuda": ("top1_agree_clear", ">=", 0.995), "cpu-f32": ("nle_max", "<=", 1e-4)}


def run(cmd):
    print("+ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calla", default="build/calla")
    ap.add_argument("--model", required=True)
    ap.add_argument("--len", type=int, default=4096, help="tokens, by the docs/BENCH.md rule")
    ap.add_argument("--backends", default="cuda,cpu-f32", help="any of cuda, cpu, cpu-f32")
    ap.add_argument("--hf-device", default="cpu")
    ap.add_argument("--hf-bf16", action="store_true", help="also score HF in bf16 (reported)")
    ap.add_argument("--hf-chunk", type=int, default=0, help="hf_score.py --chunk (0: one pass)")
    ap.add_argument("--top-k", type=int, default=16)
    ap.add_argument("--threads", type=int, default=0, help="CPU backend threads")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    seq, ref = os.path.join(a.out, "tokens.txt"), os.path.join(a.out, "hf-fp32.json")
    hf = [sys.executable, os.path.join(HERE, "hf_score.py"), "--model", a.model, "--device", a.hf_device,
          "--top-k", str(a.top_k), "--chunk", str(a.hf_chunk)]
    run(hf + ["--bench-len", str(a.len), "--tokens-out", seq, "--json", ref])
    rows = []
    if a.hf_bf16:
        out = os.path.join(a.out, "hf-bf16.json")
        run(hf + ["--tokens", seq, "--dtype", "bf16", "--reference", ref, "--json", out])
        rows.append(("hf-bf16", out))
    for b in a.backends.split(","):
        flags = {"cuda": ["--backend", "cuda"], "cpu": ["--backend", "cpu"],
                 "cpu-f32": ["--backend", "cpu", "--kv-f32"]}.get(b)
        if flags is None:
            sys.exit(f"score_gate: unknown backend {b} (cuda, cpu, cpu-f32)")
        out = os.path.join(a.out, f"{b}.json")
        run([a.calla, "score", "--model", a.model, "--tokens", seq, "--top-k", str(a.top_k), "--threads",
             str(a.threads), "--reference", ref, "--json", out] + flags)
        rows.append((b, out))
    lines = [f"# Scored against HF fp32: {a.model}, {a.len} bench-rule tokens", "",
             "| run | KL mean | KL p99.9 | top-1 agree | top-1 agree, margin > 0.05 | logit error mean | max | gate |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    failed = 0
    for name, path in rows:
        c = json.load(open(path))["comparison"]
        gate = "reported"
        if name in GATES:
            key, op, lim = GATES[name]
            ok = c[key] >= lim if op == ">=" else c[key] <= lim
            failed += not ok
            gate = f"{key} {op} {lim:g}: {'PASS' if ok else 'FAIL'} ({c[key]:.4g})"
        lines.append(f"| {name} | {c['kl_mean']:.3e} | {c['kl_p999']:.3e} | {c['top1_agree']:.4f} | "
                     f"{c['top1_agree_clear']:.4f} ({c['top1_same_clear']}/{c['n_clear']}) | {c['nle_mean']:.3e} | "
                     f"{c['nle_max']:.3e} | {gate} |")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(a.out, "summary.md"), "w") as f:
        f.write(text)
    print(text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

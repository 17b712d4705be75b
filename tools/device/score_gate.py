#!/usr/bin/env python3
"""score_gate.py: one sequence scored by HF fp32 (the reference), optionally HF bf16, and Calla's
backends, each compared with HF fp32; and greedy continuations made by HF fp32 teacher-forced
through Calla's decode path (issue 13, the full-shape correctness gate). Prints tables, writes every
score JSON and summary.md under --out, and exits 1 when a gate fails or a run fails.

Backends (--backends), each `calla score --reference hf-fp32.json`:
    cuda-exact  CUDA with CALLA_EXACT=1 (the verification mode): GATED, top-1 agreement >= 99.5%
                where HF fp32's top-2 margin > 0.05
    cuda        CUDA fast mode (the default; CALLA_EXACT removed from its environment): reported
    cpu-f32     the CPU oracle with an fp32 KV cache: GATED, normalised logit error (over HF's stored
                top-k logits; see src/score.h) <= 1e-4 at 99% of positions and <= 1e-2 at every one.
                Why not 1e-4 at every position, as issue 13 first asked: at the full shape two fp32
                implementations that sum in different orders still flip an occasional near-tie
                between a token's 8th and 9th expert. Measured on the H200 (2026-12-01,
                bench/results/2026-12-01-h200-v7/3-score-gate): the oracle's median error is 1.0e-6
                and its 99th percentile 8.1e-5, but 34 of 4,095 positions exceed 1e-4, in four
                clusters (506-521, 1228-1243, 1490-1496, and single ones), each a spike of ~1e-3 at
                one position decaying over the next ~15 as the changed token fades from the
                attention and DeltaNet state: the shape of one flipped routing decision. At those
                positions CUDA's exact mode, summing in yet another order, agrees with HF to ~1e-5
                (and has its own clusters elsewhere, where the oracle agrees with HF), and each
                cluster starts at one of the oracle's closest 8th-vs-9th expert decisions (506 the
                closest of the first 1,599 positions, logit gap 4.8e-7; 1490 the 3rd; 1228 the 5th:
                3-score-gate/attribution-1600.txt). A bug moves every position, or by far more than
                1e-2 (a lost key tile is ~1e-1).
    cpu         the CPU engine with its production bf16 KV cache: reported
    --hf-bf16   HF in bf16 against HF fp32: reported
Every row reports KL(HF fp32 || run) mean and p99.9 and the top-1 agreement.

Greedy arm (--greedy 300,4096 --gen 64): the same hf_score.py process that scores with HF fp32
(one model load) continues the first P tokens of the sequence greedily for --gen tokens through
HF's cache and scores each continuation teacher-forced (greedy/greedy-P.txt, .json). Then for each
P and each backend of --greedy-backends, `calla score --tokens greedy-P.txt --decode-from P
--reference greedy-P.json`: the prompt as prefill, every generated token one at a time through the
decode path. Compared here, from the two JSONs, over positions P-1 .. P+gen-2 (the predictions of
the generated tokens): the steps where HF's top-2 margin > 0.05, and of those how many have Calla's
top-1 equal to HF's generated token. GATED for cuda-exact and cpu-f32 (every clear step equal);
reported for cuda and cpu.

    python3 tools/device/score_gate.py --calla build/calla --model /tmp/calla-full --len 4096 \\
        --backends cuda-exact,cuda,cpu-f32 --hf-device cuda --hf-bf16 --greedy 300,4096 --gen 64 \\
        --out bench/results/DATE-score-gate
On a CPU (the tiny geometry): --model DIR --len 64 --backends cpu,cpu-f32 --greedy 20,40 --gen 8.
--dry-run prints every command (with its environment) and runs nothing.
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CLEAR = 0.05   # src/score.h SCORE_CLEAR_MARGIN
BACKENDS = {   # name: (calla score flags, environment changes: None removes the variable)
    "cuda-exact": (["--backend", "cuda"], {"CALLA_EXACT": "1"}),
    "cuda": (["--backend", "cuda"], {"CALLA_EXACT": None}),
    "cpu-f32": (["--backend", "cpu", "--kv-f32"], {}),
    "cpu": (["--backend", "cpu"], {}),
}
GATES = {"cuda-exact": [("top1_agree_clear", ">=", 0.995)],   # every condition must hold
         "cpu-f32": [("nle_p99", "<=", 1e-4), ("nle_max", "<=", 1e-2)]}
GREEDY_GATED = {"cuda-exact", "cpu-f32"}   # every clear greedy step equal to HF's token
HF_AUTO_CHUNK = 1024   # HF tokens per forward call for sequences longer than this (GPU memory)


class Arm:
    """One command: its name, argv, environment changes, and after running its status and time."""

    def __init__(self, name, cmd, env=None):
        self.name, self.cmd, self.env = name, cmd, env or {}
        self.rc, self.seconds = None, 0.0

    def line(self):
        env = " ".join(f"{k}={v}" if v is not None else f"-u {k}" for k, v in self.env.items())
        prefix = ("env " + env + " ") if env else ""
        return prefix + " ".join(shlex.quote(c) for c in self.cmd)

    def run(self, dry):
        print(f"+ [{self.name}] {self.line()}", flush=True)
        if dry:
            self.rc = 0
            return
        env = dict(os.environ)
        for k, v in self.env.items():
            if v is None:
                env.pop(k, None)
            else:
                env[k] = v
        t0 = time.time()
        self.rc = subprocess.run(self.cmd, env=env).returncode
        self.seconds = time.time() - t0
        print(f"  [{self.name}] exit {self.rc}, {self.seconds:.1f} s", flush=True)


def parse_list(text, what, allowed=None):
    items = [x.strip() for x in text.split(",") if x.strip()] if text else []
    for x in items:
        if allowed is not None and x not in allowed:
            sys.exit(f"score_gate: unknown {what} {x!r} (one of {', '.join(allowed)})")
    return items


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calla", default="build/calla")
    ap.add_argument("--model", required=True)
    ap.add_argument("--len", type=int, default=4096, help="tokens, by the docs/BENCH.md rule")
    ap.add_argument("--backends", default="cuda-exact,cuda,cpu-f32", help="any of " + ", ".join(BACKENDS))
    ap.add_argument("--hf-device", default="cpu")
    ap.add_argument("--hf-bf16", action="store_true", help="also score HF in bf16 (reported)")
    ap.add_argument("--hf-chunk", type=int, default=-1,
                    help=f"hf_score.py --chunk (-1: {HF_AUTO_CHUNK} when a sequence is longer, else one pass)")
    ap.add_argument("--greedy", default="", help="prompt lengths P1,P2 for the greedy arm (each <= --len)")
    ap.add_argument("--gen", type=int, default=64, help="greedy tokens per prompt (64)")
    ap.add_argument("--greedy-backends", default=None,
                    help="Calla backends of the greedy arm (default: the CUDA ones of --backends; with none, all)")
    ap.add_argument("--top-k", type=int, default=16)
    ap.add_argument("--threads", type=int, default=0, help="CPU backend threads")
    ap.add_argument("--out", required=True)
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    a = ap.parse_args()
    a.backends = parse_list(a.backends, "backend", BACKENDS)
    try:
        a.greedy = [int(p) for p in parse_list(a.greedy, "prompt length")]
    except ValueError:
        sys.exit(f"score_gate: --greedy: give prompt lengths separated by commas (300,4096)")
    for p in a.greedy:
        if not 1 <= p <= a.len:
            sys.exit(f"score_gate: --greedy {p}: a prompt is the first P tokens of the --len {a.len} sequence, "
                     f"so 1..{a.len}")
    if a.greedy and a.gen < 1:
        sys.exit(f"score_gate: --gen {a.gen}: give at least 1 token")
    if a.greedy_backends is None:
        cuda = [b for b in a.backends if b.startswith("cuda")]
        a.greedy_backends = cuda or list(a.backends)
    else:
        a.greedy_backends = parse_list(a.greedy_backends, "greedy backend", BACKENDS)
    if a.hf_chunk < 0:
        longest = max([a.len] + [p + a.gen for p in a.greedy])
        a.hf_chunk = HF_AUTO_CHUNK if longest > HF_AUTO_CHUNK else 0
    return a


def plan(a):
    """Every arm, in the order they run: HF fp32 (with the greedy continuations), HF bf16, each
    backend on the sequence, each greedy prompt through each greedy backend."""
    seq, ref = os.path.join(a.out, "tokens.txt"), os.path.join(a.out, "hf-fp32.json")
    gdir = os.path.join(a.out, "greedy")
    hf = [sys.executable, os.path.join(HERE, "hf_score.py"), "--model", a.model, "--device", a.hf_device,
          "--top-k", str(a.top_k), "--chunk", str(a.hf_chunk)]
    fp32 = hf + ["--bench-len", str(a.len), "--tokens-out", seq, "--json", ref]
    if a.greedy:
        fp32 += ["--greedy", ",".join(map(str, a.greedy)), "--gen", str(a.gen), "--greedy-dir", gdir]
    arms = [(Arm("hf-fp32" + (" + greedy" if a.greedy else ""), fp32), None)]
    if a.hf_bf16:
        out = os.path.join(a.out, "hf-bf16.json")
        arms.append((Arm("hf-bf16", hf + ["--tokens", seq, "--dtype", "bf16", "--reference", ref, "--json", out]),
                     ("score", "hf-bf16", out)))
    calla = [a.calla, "score", "--model", a.model, "--top-k", str(a.top_k), "--threads", str(a.threads)]
    for b in a.backends:
        flags, env = BACKENDS[b]
        out = os.path.join(a.out, f"{b}.json")
        arms.append((Arm(b, calla + ["--tokens", seq, "--reference", ref, "--json", out] + flags, env),
                      ("score", b, out)))
    for p in a.greedy:
        base = os.path.join(gdir, f"greedy-{p}")
        for b in a.greedy_backends:
            flags, env = BACKENDS[b]
            out = f"{base}-{b}.json"
            cmd = calla + ["--tokens", base + ".txt", "--decode-from", str(p), "--reference", base + ".json",
                           "--json", out] + flags
            arms.append((Arm(f"greedy {p} {b}", cmd, env), ("greedy", b, out, p, base + ".json")))
    return arms


def score_row(name, path):
    """A line of the scoring table and whether its gate failed."""
    c = json.load(open(path))["comparison"]
    gate, failed = "reported", False
    if name in GATES:
        parts = []
        for key, op, lim in GATES[name]:
            ok = c[key] >= lim if op == ">=" else c[key] <= lim
            failed |= not ok
            parts.append(f"{key} {op} {lim:g}: {'PASS' if ok else 'FAIL'} ({c[key]:.4g})")
        gate = "; ".join(parts)
    p99 = c.get("nle_p99")   # absent from score files written before it was added
    return (f"| {name} | {c['kl_mean']:.3e} | {c['kl_p999']:.3e} | {c['top1_agree']:.4f} | "
            f"{c['top1_agree_clear']:.4f} ({c['top1_same_clear']}/{c['n_clear']}) | {c['nle_mean']:.3e} | "
            f"{'-' if p99 is None else f'{p99:.3e}'} | {c['nle_max']:.3e} | {gate} |"), failed


def greedy_compare(hf_path, run_path, p):
    """The steps of a greedy continuation from prompt length p: positions p-1 .. N-2, each the
    prediction of a generated token. HF's token is the sequence's next token (HF generated it)."""
    hf, run = json.load(open(hf_path)), json.load(open(run_path))
    if hf["tokens"] != run["tokens"]:
        raise ValueError(f"{run_path}: another token sequence than {hf_path}")
    toks, s = hf["tokens"], {"steps": 0, "clear": 0, "equal_clear": 0, "equal": 0, "first_diff": None,
                             "hf_tf_differs": 0}
    for q in range(p - 1, len(toks) - 1):
        h, r = hf["positions"][q], run["positions"][q]
        clear = len(h["logits"]) >= 2 and h["logits"][0] - h["logits"][1] > CLEAR
        same = r["ids"][0] == toks[q + 1]
        s["steps"] += 1
        s["clear"] += clear
        s["equal_clear"] += clear and same
        s["equal"] += same
        s["hf_tf_differs"] += h["ids"][0] != toks[q + 1]   # HF teacher-forced vs HF's own decode
        if not same and s["first_diff"] is None:
            s["first_diff"] = q - (p - 1)
    return s


def greedy_row(name, p, path, hf_path):
    s = greedy_compare(hf_path, path, p)
    ok = s["equal_clear"] == s["clear"]
    gated = name in GREEDY_GATED
    gate = f"all clear steps equal: {'PASS' if ok else 'FAIL'}" if gated else "reported"
    first = "none" if s["first_diff"] is None else str(s["first_diff"])
    return (f"| {p} | {name} | {s['steps']} | {s['clear']} | {s['equal_clear']}/{s['clear']} | "
            f"{s['equal']}/{s['steps']} | {first} | {s['hf_tf_differs']} | {gate} |"), gated and not ok


def main():
    a = parse_args()
    os.makedirs(a.out, exist_ok=True)
    arms = plan(a)
    for arm, _ in arms:
        arm.run(a.dry_run)
        if arm is arms[0][0] and arm.rc:
            print(f"score_gate: the HF fp32 reference failed (exit {arm.rc}); nothing to compare")
            return 1
    if a.dry_run:
        return 0
    head = [f"# Scored against HF fp32: {a.model}, {a.len} bench-rule tokens", "",
            "| run | KL mean | KL p99.9 | top-1 agree | top-1 agree, margin > 0.05 | logit error mean | p99 | max | gate |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    greedy = ["", f"# Greedy: HF fp32's {a.gen} greedy tokens teacher-forced through Calla's decode path", "",
              "Steps: positions P-1 .. P+gen-2; clear: HF's top-2 margin > 0.05; first difference: the step "
              "(0-based) where Calla's top-1 first differs from HF's token; HF tf: steps where HF's teacher-forced "
              "top-1 differs from its own cached decode.", "",
              "| prompt | run | steps | clear | equal, clear | equal, all | first difference | HF tf | gate |",
              "|---:|---|---:|---:|---:|---:|---:|---:|---|"]
    times = ["", "# Wall time per arm", "", "| arm | exit | seconds |", "|---|---:|---:|"]
    failed = 0
    for arm, what in arms:
        times.append(f"| {arm.name} | {arm.rc} | {arm.seconds:.1f} |")
        if what is None:
            continue
        table = head if what[0] == "score" else greedy
        if arm.rc:
            failed += 1
            table.append(f"| {arm.name} | run failed (exit {arm.rc}) | FAIL |")
            continue
        row, bad = score_row(what[1], what[2]) if what[0] == "score" else greedy_row(what[1], what[3], what[2], what[4])
        table.append(row)
        failed += bad
    text = "\n".join(head + (greedy if a.greedy else []) + times) + "\n"
    text += f"\n{'FAIL' if failed else 'PASS'}: {failed} gate(s) or run(s) failed\n"
    with open(os.path.join(a.out, "summary.md"), "w") as f:
        f.write(text)
    print(text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""router_stats.py: how decisively a checkpoint routes, uniform vs trained synth profile (issue 13).

Over one prompt (tokens by the bench rule of docs/BENCH.md: token i = i * 2654435761 mod 2^32 mod vocab),
per layer: the gap between the k-th and (k+1)-th router logits (a small gap is a near-tie that any
rounding can flip) and the k-th expert's renormalised weight (what a flip moves). Writes a PNG
(matplotlib) and a Markdown table.

Traces come from the CPU engine (CALLA_ROUTER_TRACE, lines "layer position gap ids lgap w1 wk lstd",
src/backend_cpu.c) or from HF (tools/gen/make_golden.py --router-trace); only the CPU backend writes them.

Make both checkpoints and trace them (small geometry, 4,096 tokens, 2 threads: a few minutes here):
    python3 tools/dev/router_stats.py --calla build/calla --geometry small --prompt-len 4096 \\
        --out bench/results/DATE-router-stats-small
Full shape on the GPU machine (the CPU oracle traces; 16 cores), with checkpoints already written:
    python3 tools/dev/router_stats.py --calla build/calla --models /tmp/full-uniform /tmp/full-trained \\
        --prompt-len 4096 --backend cpu --threads 16 --out bench/results/DATE-router-stats-full
Plot two traces made elsewhere:
    python3 tools/dev/router_stats.py --traces A.trace B.trace --labels uniform trained --out DIR
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

GOLDEN = 2654435761
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "gen"))
from make_golden import synth_profile  # noqa: E402  (tools/gen/)


def bench_tokens(n, vocab):
    return [(i * GOLDEN % (1 << 32)) % vocab for i in range(n)]


def synth(calla, geometry, seed, profile, out):
    if not os.path.exists(os.path.join(out, "config.json")):
        subprocess.run([calla, "synth", "--geometry", geometry, "--seed", str(seed), "--profile", profile,
                        "--out", out], check=True)
    return out


def trace(calla, model, n, backend, threads, path):
    """Prefill n bench-rule tokens with the router trace on; the trace lands in path."""
    with open(os.path.join(model, "config.json")) as f:
        vocab = json.load(f)["text_config"]["vocab_size"]
    ids = ",".join(str(t) for t in bench_tokens(n, vocab))
    if len(ids) > 120_000:
        sys.exit(f"router_stats: a {n}-token prompt does not fit one command-line argument; use at most ~16,000")
    if os.path.exists(path):
        os.remove(path)   # the engine appends
    env = dict(os.environ, CALLA_ROUTER_TRACE=path)
    cmd = [calla, "run", "--model", model, "--prompt-tokens", ids, "--max-tokens", "1", "--context", str(n + 2),
           "--backend", backend, "--threads", str(threads)]
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        sys.exit(f"router_stats: the {backend} backend wrote no router trace (only the CPU backend traces)")
    return path


def load(path):
    """{layer: {field: [values by position]}}; the last line for a (layer, position) wins."""
    rows = {}
    with open(path) as f:
        for line in f:
            p = line.split()
            if len(p) < 8:
                sys.exit(f"router_stats: {path}: a line without lgap/w1/wk/lstd (an old trace?): {line.strip()}")
            rows[(int(p[0]), int(p[1]))] = tuple(float(x) for x in p[4:8])
    layers = {}
    for (layer, _pos), (lgap, w1, wk, lstd) in sorted(rows.items()):
        d = layers.setdefault(layer, {"lgap": [], "w1": [], "wk": [], "lstd": []})
        d["lgap"].append(lgap)
        d["w1"].append(w1)
        d["wk"].append(wk)
        d["lstd"].append(lstd)
    return layers


def quantile(xs, q):
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, int(math.ceil(q * len(s))) - 1))]


def frac_below(xs, t):
    return sum(1 for x in xs if x < t) / len(xs)


def summary(layers):
    allv = {k: [x for d in layers.values() for x in d[k]] for k in ("lgap", "w1", "wk", "lstd")}
    return {
        "decisions": len(allv["lgap"]),
        "lstd_median": quantile(allv["lstd"], 0.5),
        "lgap_median": quantile(allv["lgap"], 0.5),
        "lgap_p10": quantile(allv["lgap"], 0.1),
        "lgap_lt_1e-2": frac_below(allv["lgap"], 1e-2),
        "lgap_lt_1e-1": frac_below(allv["lgap"], 1e-1),
        "w1_median": quantile(allv["w1"], 0.5),
        "wk_median": quantile(allv["wk"], 0.5),
        "wk_p90": quantile(allv["wk"], 0.9),
    }


def table(runs, meta):
    out = [f"# Router decisiveness: {meta}", "",
           "Per routing decision: `lgap` = k-th minus (k+1)-th router logit (near-ties flip under rounding),",
           "`wk` / `w1` = the k-th / largest renormalised expert weight (what a flip moves), `lstd` = std of the",
           "router logits over the experts.", "",
           "| profile | decisions | lstd median | lgap median | lgap p10 | lgap < 0.01 | lgap < 0.1 | w1 median | wk median | wk p90 |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for label, layers in runs:
        s = summary(layers)
        out.append(f"| {label} | {s['decisions']} | {s['lstd_median']:.2f} | {s['lgap_median']:.3f} | "
                   f"{s['lgap_p10']:.4f} | {100 * s['lgap_lt_1e-2']:.2f}% | {100 * s['lgap_lt_1e-1']:.1f}% | "
                   f"{s['w1_median']:.3f} | {s['wk_median']:.4f} | {s['wk_p90']:.4f} |")
    out += ["", "Per layer (median lgap, median wk, share of decisions with lgap < 0.01):", "",
            "| layer | " + " | ".join(f"{lab} lgap | {lab} wk | {lab} <0.01" for lab, _ in runs) + " |",
            "|---:|" + "---:|" * (3 * len(runs))]
    for layer in sorted(runs[0][1]):
        cells = []
        for _, layers in runs:
            d = layers.get(layer)
            cells += [f"{quantile(d['lgap'], 0.5):.3f}", f"{quantile(d['wk'], 0.5):.4f}",
                      f"{100 * frac_below(d['lgap'], 1e-2):.2f}%"] if d else ["", "", ""]
        out.append(f"| {layer} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def plot(runs, meta, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd"]
    fig, ax = plt.subplots(2, 2, figsize=(13, 8.5))
    n = len(runs)
    for field, row, ylab, logy in (("lgap", 0, "k-th minus (k+1)-th router logit", True),
                                   ("wk", 1, "k-th expert's weight", False)):
        a = ax[row][0]
        for i, (label, layers) in enumerate(runs):
            ls = sorted(layers)
            data = [[max(x, 1e-6) for x in layers[l][field]] if logy else layers[l][field] for l in ls]
            pos = [l + (i - (n - 1) / 2) * 0.8 / n for l in ls]
            bp = a.boxplot(data, positions=pos, widths=0.7 / n, whis=(5, 95), showfliers=False, patch_artist=True,
                           manage_ticks=False)
            for b in bp["boxes"]:
                b.set(facecolor=colours[i % 4], alpha=0.5)
            a.plot([], [], color=colours[i % 4], lw=6, alpha=0.5, label=label)
        if logy:
            a.set_yscale("log")
        ls = sorted(runs[0][1])
        a.set_xticks(ls if len(ls) <= 16 else ls[::4])
        a.set_xlabel("layer")
        a.set_ylabel(ylab)
        a.set_title(f"{field} per layer (box 25-75%, whiskers 5-95%)")
        a.legend()
        h = ax[row][1]
        for i, (label, layers) in enumerate(runs):
            xs = [x for d in layers.values() for x in d[field]]
            if logy:
                xs = [max(x, 1e-6) for x in xs]
                lo, hi = math.log10(min(xs)), math.log10(max(xs))
                bins = [10 ** (lo + (hi - lo) * j / 60) for j in range(61)]
            else:
                bins = 60
            h.hist(xs, bins=bins, histtype="step", lw=1.8, color=colours[i % 4], label=label,
                   weights=[1 / len(xs)] * len(xs))
        if logy:
            h.set_xscale("log")
            h.axvline(1e-2, color="grey", ls=":", lw=1)
        h.set_xlabel(ylab)
        h.set_ylabel("share of decisions per bin")
        h.set_title(f"{field}, all layers")
        h.legend()
    fig.suptitle(f"Router decisiveness: {meta}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calla", default="build/calla")
    ap.add_argument("--geometry", default="small", help="synthesise both profiles at this geometry (no --models)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--models", nargs=2, metavar=("UNIFORM_DIR", "TRAINED_DIR"),
                    help="existing checkpoints (labels from their calla_synth.json)")
    ap.add_argument("--traces", nargs=2, metavar=("A", "B"), help="plot these traces; run nothing")
    ap.add_argument("--labels", nargs=2, default=None)
    ap.add_argument("--title", default=None, help="with --traces: what they are (geometry, prompt, backend)")
    ap.add_argument("--prompt-len", type=int, default=4096)
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--work", default=None, help="where checkpoints and traces go (default: a temporary folder)")
    ap.add_argument("--out", required=True, help="folder for router-stats.png and router-stats.md")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    work = a.work or tempfile.mkdtemp(prefix="router-stats-")
    if a.traces:
        paths, labels = a.traces, a.labels or ["A", "B"]
        meta = a.title or f"{labels[0]} vs {labels[1]}"
    else:
        models = a.models or [synth(a.calla, a.geometry, a.seed, p, os.path.join(work, f"{a.geometry}-{p}"))
                              for p in ("uniform", "trained")]
        labels = a.labels or [synth_profile(m) for m in models]
        paths = [trace(a.calla, m, a.prompt_len, a.backend, a.threads, os.path.join(work, f"{lab}.trace"))
                 for m, lab in zip(models, labels)]
        with open(os.path.join(models[0], "config.json")) as f:
            tc = json.load(f)["text_config"]
        meta = (f"{tc['num_hidden_layers']} layers, {tc['num_experts']} experts top-{tc['num_experts_per_tok']}, "
                f"hidden {tc['hidden_size']}, {a.prompt_len}-token bench prompt, {a.backend} backend")
    runs = [(lab, load(p)) for lab, p in zip(labels, paths)]
    md = table(runs, meta)
    with open(os.path.join(a.out, "router-stats.md"), "w") as f:
        f.write(md)
    print(md)
    try:
        plot(runs, meta, os.path.join(a.out, "router-stats.png"))
        print(f"wrote {a.out}/router-stats.png and router-stats.md")
    except ImportError:
        print("router_stats: matplotlib is missing (pip install matplotlib): wrote the table only", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""hf_score.py: the HF transformers side of `calla score`: teacher-forced scoring of a sequence on a
Calla checkpoint mapped into Qwen3_5MoeForCausalLM (the mapping of tools/gen/make_golden.py), written in
the JSON format of `calla score --json` so that either side can be the other's --reference.

    python3 tools/device/hf_score.py --model DIR --tokens FILE --dtype float32 --device cuda --json hf-fp32.json
    python3 tools/device/hf_score.py --model DIR --bench-len 4096 --tokens-out seq.txt --json hf-fp32.json
    build/calla score --model DIR --tokens seq.txt --backend cuda --reference hf-fp32.json --json cuda.json
    python3 tools/device/hf_score.py --model DIR --tokens seq.txt --dtype bf16 --reference hf-fp32.json --json hf-bf16.json
    python3 tools/device/hf_score.py --model DIR --bench-len 4096 --chunk 1024 --json hf-fp32.json \
        --greedy 300,4096 --gen 64 --greedy-dir greedy/

Per position p (0..N-2): lse of the row, the logit of token p+1 ("target"), lp = target - lse, and
the top-k logits with their ids (torch.topk; --full-logits adds the whole row, at most 256 positions).
fp32 runs with TF32 off. --chunk C > 0 feeds C tokens at a time through HF's cache (for sequences
whose [N, vocab] logits do not fit at once); 0 (default) is one forward pass without a cache, as
make_golden.py runs it.

--greedy P1,P2 (with --gen G, --greedy-dir DIR), after the main scoring and with the same loaded
model (loading the full shape in fp32 takes minutes and ~130 GiB): for each P, the first P tokens
of the scored sequence are the prompt, HF generates G tokens greedily through its cache (argmax,
lowest id on ties), and DIR/greedy-P.txt gets prompt + generated ids, DIR/greedy-P.json that
sequence scored teacher-forced (same format and --chunk, so HF's top-2 margin at each generated
token is there). `calla score --tokens greedy-P.txt --decode-from P --reference greedy-P.json`
then feeds the generated tokens through Calla's decode path (tools/device/score_gate.py --greedy).
Memory: with the fp32 full model about 8 GiB of the GPU are left, so give --chunk (1024) for long
sequences; the prompt's prefill keeps only its last row of logits where HF allows
(logits_to_keep), and each job's cache is freed before the next.

--reference OTHER.json compares this run with another, exactly as `calla score --reference` does
(src/score.h): KL(reference || run) over the reference's top-k plus a tail bucket (a lower bound;
exact when the reference holds full rows), top-1 agreement overall and where the reference's top-2
margin exceeds 0.05, and the normalised logit error over the reference's stored logits.
"""
import argparse
import gc
import inspect
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "gen"))
from make_golden import Checkpoint, build_hf, hash_prompt  # noqa: E402  (tools/gen/: the shared MLX -> HF mapping)

FORMAT, VERSION, TOP_K_MAX, FULL_MAX, MAX_CTX = "calla-score", 1, 256, 256, 262144


def read_tokens(path, vocab):
    text = open(path).read().replace(",", " ").split()
    try:
        ids = [int(t) for t in text]
    except ValueError as e:
        sys.exit(f"hf_score: {path}: not a list of token ids ({e})")
    bad = [(i, t) for i, t in enumerate(ids) if not 0 <= t < vocab]
    if bad:
        sys.exit(f"hf_score: {path}: token {bad[0][1]} at index {bad[0][0]} is outside the vocabulary (0..{vocab - 1})")
    if not 2 <= len(ids) <= MAX_CTX:
        sys.exit(f"hf_score: {path}: {len(ids)} tokens; scoring needs 2..{MAX_CTX}")
    return ids


def forward_cached(model, ids, device, cache, **kw):
    """One forward call of ids through HF's cache (None: a new one). Returns (logits [n, V], cache).
    transformers 5.2x names the cache `cache`, earlier versions `past_key_values`."""
    import torch
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    out = model(input_ids=torch.tensor([ids], device=device), use_cache=True, **{name: cache}, **kw)
    new = out.get("cache") if "cache" in out else out.past_key_values
    return out.logits[0], new


def rows_of(model, ids, device, chunk):
    """Yields the logits rows (float32, on the device) for positions 0..N-2, a block at a time."""
    import torch
    feed = ids[:-1]
    with torch.no_grad():
        if chunk <= 0:
            out = model(input_ids=torch.tensor([feed], device=device), use_cache=False)
            yield 0, out.logits[0].float()
            return
        cache = None
        for p0 in range(0, len(feed), chunk):
            logits, cache = forward_cached(model, feed[p0:p0 + chunk], device, cache)
            yield p0, logits.float()


def load_reference(path, ids, vocab):
    try:
        r = json.load(open(path))
    except (OSError, ValueError) as e:
        sys.exit(f"hf_score: {path}: not valid JSON ({e})")
    if not isinstance(r, dict) or r.get("format") != FORMAT or r.get("version") != VERSION:
        sys.exit(f"hf_score: {path}: not a score file of format {FORMAT} version {VERSION}")
    if r.get("vocab") != vocab or r.get("tokens") != ids:
        sys.exit(f"hf_score: {path}: another vocabulary or token sequence than this run's")
    pos = r.get("positions")
    if not isinstance(pos, list) or len(pos) != len(ids) - 1:
        sys.exit(f"hf_score: {path}: \"positions\" must hold {len(ids) - 1} entries")
    return pos


def quantile(xs, q):
    """The q-quantile of xs by nearest rank (src/score.c quantile)."""
    s = sorted(xs)
    return s[max(1, math.ceil(q * len(s))) - 1]


class Comparison:
    """The reference's stored values against this run's whole rows (src/score.c compare_row)."""

    def __init__(self, ref_positions, clear=0.05):
        self.ref, self.clear_margin = ref_positions, clear
        self.kl, self.same, self.clear, self.num, self.den, self.nle, self.tail = [], [], [], [], [], [], []

    def add(self, p, row, lse):
        import torch
        r = self.ref[p]
        rlse = float(r["lse"])
        if "full" in r:
            ref = torch.tensor(r["full"], dtype=torch.float64, device=row.device)
            run = row.double()
            lr, lt = ref - rlse, run - lse
            kl = float((lr.exp() * (lr - lt)).sum())
            tail = 0.0
        else:
            ids = torch.tensor(r["ids"], device=row.device)
            ref = torch.tensor(r["logits"], dtype=torch.float64, device=row.device)
            run = row[ids].double()
            lr, lt = ref - rlse, run - lse
            kl = float((lr.exp() * (lr - lt)).sum())
            tr, tt = 1 - float(lr.exp().sum()), 1 - float(lt.exp().sum())
            if tr > 1e-12:
                kl += tr * (math.log(tr) - math.log(max(tt, 1e-30)))
            tail = tr
        num, den = float(((run - ref) ** 2).sum()), float((ref ** 2).sum())
        self.kl.append(kl)
        self.same.append(int(row.argmax()) == r["ids"][0])
        self.clear.append(len(r["logits"]) >= 2 and r["logits"][0] - r["logits"][1] > self.clear_margin)
        self.num.append(num)
        self.den.append(den)
        self.nle.append(math.sqrt(num / den) if den > 0 else 0.0)
        self.tail.append(tail)

    def summary(self, ref_path):
        P = len(self.kl)
        n_clear = sum(self.clear)
        same_clear = sum(1 for c, m in zip(self.clear, self.same) if c and m)
        return {"reference": ref_path, "positions": P, "kl_mean": sum(self.kl) / P,
                "kl_p999": quantile(self.kl, 0.999), "kl_max": max(self.kl),
                "top1_agree": sum(self.same) / P, "top1_same": sum(self.same), "clear_margin": self.clear_margin,
                "n_clear": n_clear, "top1_agree_clear": same_clear / n_clear if n_clear else 1.0,
                "top1_same_clear": same_clear, "nle_mean": sum(self.nle) / P,
                "nle_p99": quantile(self.nle, 0.99), "nle_max": max(self.nle),
                "nle_all": math.sqrt(sum(self.num) / sum(self.den)) if sum(self.den) > 0 else 0.0,
                "ref_tail_max": max(self.tail)}


def fmt(x):
    return "%.9g" % x


def score(model, ids, device, chunk, top_k, full_logits, cmp):
    """Teacher-forced rows of ids: per position lse, target, top-k ids and logits (and whole rows)."""
    import torch
    r = {"lse": [], "target": [], "ids": [], "logits": [], "full": []}
    for p0, rows in rows_of(model, ids, device, chunk):
        n = rows.shape[0]
        nxt = torch.tensor(ids[p0 + 1:p0 + 1 + n], device=rows.device)
        block_lse = torch.logsumexp(rows, dim=-1).tolist()   # fp32 values, as calla stores them
        r["lse"] += block_lse
        if cmp:
            for i in range(n):
                cmp.add(p0 + i, rows[i], block_lse[i])
        r["target"] += rows.gather(1, nxt[:, None])[:, 0].tolist()
        t = torch.topk(rows, top_k, dim=-1)
        r["ids"] += t.indices.tolist()
        r["logits"] += t.values.tolist()
        if full_logits:
            r["full"] += rows.cpu().tolist()
    r["nll"] = sum(l - t for l, t in zip(r["lse"], r["target"])) / (len(ids) - 1)
    return r


def write_json(path, head, ids, r, comparison):
    """The calla-score JSON (src/score.c score_write_json). head: model, vocab, top_k, backend, ver."""
    P, nll = len(ids) - 1, r["nll"]
    with open(path, "w") as f:
        f.write('{\n  "format": "%s", "version": %d, "producer": "tools/device/hf_score.py (transformers %s)", '
                '"backend": %s,\n' % (FORMAT, VERSION, head["ver"], json.dumps(head["backend"])))
        f.write('  "model": %s, "vocab": %d, "top_k": %d, "n_tokens": %d,\n' % (
            json.dumps(head["model"]), head["vocab"], head["top_k"], len(ids)))
        if "greedy_from" in head:
            f.write('  "greedy_from": %d, "greedy_gen": %d,\n' % (head["greedy_from"], head["greedy_gen"]))
        f.write('  "totals": {"positions": %d, "nll": %s, "perplexity": %s},\n' % (P, fmt(nll), fmt(math.exp(min(nll, 700)))))
        if comparison:
            f.write('  "comparison": %s,\n' % json.dumps(comparison[0]))
        f.write('  "tokens": [%s],\n  "positions": [\n' % ",".join(str(t) for t in ids))
        for p in range(P):
            extra = ', "full": [%s]' % ",".join(fmt(x) for x in r["full"][p]) if r["full"] else ""
            if comparison:
                extra = ', "kl": %s, "nle": %s' % (fmt(comparison[1][p]), fmt(comparison[2][p])) + extra
            f.write('    {"lp": %s, "lse": %s, "target": %s, "ids": [%s], "logits": [%s]%s}%s\n' % (
                fmt(r["target"][p] - r["lse"][p]), fmt(r["lse"][p]), fmt(r["target"][p]),
                ",".join(str(i) for i in r["ids"][p]), ",".join(fmt(x) for x in r["logits"][p]), extra,
                "," if p + 1 < P else ""))
        f.write("  ]\n}\n")


def free_memory(device):
    gc.collect()
    if str(device).startswith("cuda"):
        import torch
        torch.cuda.empty_cache()


def greedy(model, prompt, gen, device, chunk):
    """gen tokens after prompt, each the argmax (lowest id on ties) of HF's row, through its cache:
    the prompt in chunks (only the last row's logits kept where the model allows), then one token a
    call, as a decoder runs."""
    import torch
    step = chunk if chunk > 0 else len(prompt)
    keep = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
    out, cache = [], None
    with torch.no_grad():
        for p0 in range(0, len(prompt), step):
            logits, cache = forward_cached(model, prompt[p0:p0 + step], device, cache, **keep)
            last = logits[-1].float()
            del logits
        while True:
            out.append(int(last.argmax()))   # torch.argmax: the first maximal index
            if len(out) == gen:
                break
            logits, cache = forward_cached(model, out[-1:], device, cache)
            last = logits[-1].float()
            del logits
    del cache, last
    free_memory(device)
    return out


def parse_greedy(a, n_ids):
    """The prompt lengths of --greedy, checked against the scored sequence. [] without --greedy."""
    if not a.greedy:
        return []
    try:
        ps = [int(x) for x in a.greedy.split(",") if x.strip()]
    except ValueError:
        sys.exit(f"hf_score: --greedy {a.greedy!r}: give prompt lengths separated by commas (300,4096)")
    if not a.greedy_dir:
        sys.exit("hf_score: --greedy needs --greedy-dir (where greedy-P.txt and greedy-P.json go)")
    if a.gen < 1:
        sys.exit(f"hf_score: --gen {a.gen}: give at least 1 token")
    for p in ps:
        if not 1 <= p <= n_ids:
            sys.exit(f"hf_score: --greedy {p}: a prompt is the first P tokens of the scored sequence, so 1..{n_ids}")
        if p + a.gen > MAX_CTX:
            sys.exit(f"hf_score: --greedy {p} with --gen {a.gen}: {p + a.gen} tokens, more than the context {MAX_CTX}")
    return ps


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a Calla (MLX layout) checkpoint directory")
    ap.add_argument("--tokens", help="token ids, decimal, separated by spaces or commas")
    ap.add_argument("--bench-len", type=int, help="instead of --tokens: N tokens by the docs/BENCH.md rule")
    ap.add_argument("--tokens-out", help="with --bench-len: write the ids here (for calla score --tokens)")
    ap.add_argument("--json", required=True)
    ap.add_argument("--top-k", type=int, default=16)
    ap.add_argument("--full-logits", action="store_true")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bf16"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--chunk", type=int, default=0)
    ap.add_argument("--reference", help="compare with a run written by calla score --json or this script")
    ap.add_argument("--greedy", help="prompt lengths P1,P2,...: greedy continuations of the sequence's first P tokens")
    ap.add_argument("--gen", type=int, default=64, help="tokens generated per --greedy prompt (64)")
    ap.add_argument("--greedy-dir", help="where greedy-P.txt and greedy-P.json are written")
    a = ap.parse_args()
    if not 1 <= a.top_k <= TOP_K_MAX:
        sys.exit(f"hf_score: --top-k must be 1..{TOP_K_MAX}")
    cfg = json.load(open(os.path.join(a.model, "config.json")))
    V = cfg["text_config"]["vocab_size"]
    if bool(a.tokens) == bool(a.bench_len):
        sys.exit("hf_score: give one of --tokens, --bench-len")
    ids = read_tokens(a.tokens, V) if a.tokens else hash_prompt(a.bench_len, 0, V)
    greedy_ps = parse_greedy(a, len(ids))
    if a.tokens_out:
        with open(a.tokens_out, "w") as f:
            f.write(" ".join(str(t) for t in ids) + "\n")
    P = len(ids) - 1
    if a.full_logits and P > FULL_MAX:
        sys.exit(f"hf_score: --full-logits keeps whole rows: at most {FULL_MAX} positions (this sequence has {P})")
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dtype = torch.float32 if a.dtype == "float32" else torch.bfloat16
    cmp = Comparison(load_reference(a.reference, ids, V)) if a.reference else None
    t0 = time.time()
    model, ver = build_hf(Checkpoint(a.model), cfg, a.device, dtype)
    print(f"hf_score: model loaded ({a.dtype}, {a.device}) in {time.time() - t0:.1f} s", flush=True)
    head = {"model": a.model, "vocab": V, "top_k": a.top_k, "backend": f"hf-{ver}-{a.dtype}", "ver": ver}
    t0 = time.time()
    r = score(model, ids, a.device, a.chunk, a.top_k, a.full_logits, cmp)
    c = cmp.summary(a.reference) if cmp else None
    write_json(a.json, head, ids, r, (c, cmp.kl, cmp.nle) if cmp else None)
    nll = r["nll"]
    print(f"{a.json}: {head['backend']}, {P} positions, nll {nll:.6f}, perplexity {math.exp(min(nll, 700)):.4f} "
          f"({time.time() - t0:.1f} s)")
    if cmp:
        print(f"vs reference: KL mean {c['kl_mean']:.3e}  p99.9 {c['kl_p999']:.3e}  max {c['kl_max']:.3e}  "
              f"(reference tail mass up to {c['ref_tail_max']:.2e})")
        print(f"  top-1 agreement {c['top1_agree']:.4f} ({c['top1_same']}/{P}); where the reference margin > "
              f"{c['clear_margin']}: {c['top1_agree_clear']:.4f} ({c['top1_same_clear']}/{c['n_clear']})")
        print(f"  normalised logit error: mean {c['nle_mean']:.3e}  max {c['nle_max']:.3e}  all {c['nle_all']:.3e}")
    del r, cmp
    free_memory(a.device)
    if greedy_ps:
        os.makedirs(a.greedy_dir, exist_ok=True)
    for p in greedy_ps:
        t0 = time.time()
        seq = ids[:p] + greedy(model, ids[:p], a.gen, a.device, a.chunk)
        t1 = time.time()
        base = os.path.join(a.greedy_dir, f"greedy-{p}")
        with open(base + ".txt", "w") as f:
            f.write(" ".join(str(t) for t in seq) + "\n")
        r = score(model, seq, a.device, a.chunk, a.top_k, False, None)
        write_json(base + ".json", dict(head, greedy_from=p, greedy_gen=a.gen), seq, r, None)
        print(f"{base}.txt, .json: {a.gen} greedy tokens after {p} ({t1 - t0:.1f} s), scored teacher-forced "
              f"({time.time() - t1:.1f} s)", flush=True)
        del r
        free_memory(a.device)
    return 0


if __name__ == "__main__":
    sys.exit(main())

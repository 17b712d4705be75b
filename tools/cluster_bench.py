#!/usr/bin/env python3
"""cluster_bench.py: Calla replicas behind HAProxy, driven by independent multi-turn conversations.

Starts tools/cluster.sh (R replicas, one per GPU on cuda, and HAProxy with deploy/haproxy.cfg) for
each configuration asked for, runs --conversations conversations in parallel through the balancer
(each a thread: --turns streamed chat turns, each turn the whole history plus a new user message,
with X-Session-Id and `user` set to the conversation's id), and reports per configuration:
  - aggregate decode tok/s: generated tokens of all conversations / wall time of the run, and the
    mean per-request decode speed (the server's decode_ms);
  - TTFT (request sent -> first streamed event, which carries the first token): mean, p50, p95, max;
  - cache hit rate: cached_tokens / prompt_tokens over all turns (turn 1 cannot hit);
  - which replica served each request (HAProxy's X-Calla-Replica header), and the conversations
    that moved between replicas.
Configurations (--configs): `1:hash` one replica; `2:hash` two, consistent hash on the session
(deploy/haproxy.cfg as shipped); `2:random` two, no affinity (HAProxy's `balance random`; not
roundrobin, whose strict alternation can keep lock-stepped conversations on one replica by
chance).  Each starts fresh, and each replica gets one warm-up request directly before the timed
run.  The JSON (--json) holds every
request's figures.  Python 3 standard library only; talks to 127.0.0.1 only.

The lead's run on a 2-GPU machine (item 5 of issue 15):
    python3 tools/cluster_bench.py --model ~/models/qwen3.6-35b-a3b-4bit --backend cuda \\
        --configs 1:hash,2:hash,2:random --json bench/results/DATE-h200x2-cluster.json
CPU smoke test (tiny geometry):
    python3 tools/cluster_bench.py --model DIR --backend cpu --threads 1 --turns 3 --words 20 \\
        --max-tokens 4 --context 2048
"""
import argparse
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HOST = "127.0.0.1"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa "
         "quebec romeo sierra tango uniform victor whiskey xray yankee zulu").split()


# ---- the cluster -----------------------------------------------------------------------------

def start_cluster(a, replicas, balance):
    d = tempfile.mkdtemp(prefix="calla_cluster_bench_")
    log = open(os.path.join(d, "cluster.log"), "w")
    serve = ["--context", str(a.context), "--cache-entries", str(a.cache_entries),
             "--cache-boundaries", str(a.cache_entries), "--quiet"]
    args = ["bash", os.path.join(ROOT, "tools/cluster.sh"), str(replicas), "--model", a.model, "--bin", a.bin,
            "--backend", a.backend, "--port", "0", "--queue", str(a.queue), "--dir", d, "--balance", balance]
    if a.threads:
        args += ["--threads", str(a.threads)]
    env = dict(os.environ, OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "passive"))
    p = subprocess.Popen(args + ["--", *serve], stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=env)
    envf = os.path.join(d, "cluster.env")
    deadline = time.time() + 900   # full checkpoints upload for a while
    while not os.path.exists(envf) and p.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    time.sleep(0.2)
    if not os.path.exists(envf):
        stop_cluster(p)
        with open(log.name, errors="replace") as f:
            sys.exit("cluster did not start:\n" + f.read())
    kv = dict(line.strip().split("=", 1) for line in open(envf) if "=" in line)
    return p, int(kv["LB_PORT"]), [int(x) for x in kv["REPLICA_PORTS"].strip('"').split()], d


def stop_cluster(p):
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)   # cluster.sh stops exactly what it started
    try:
        p.wait(120)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait(10)


# ---- one streamed turn -----------------------------------------------------------------------

def turn(port, messages, sid, a):
    """-> dict(ttft_ms, total_ms, usage, timings, content, reasoning, replica) or dict(error)."""
    body = {"messages": messages, "max_tokens": a.max_tokens, "stream": True, "user": sid,
            "stream_options": {"include_usage": True},
            "chat_template_kwargs": {"enable_thinking": not a.no_thinking}}
    c = http.client.HTTPConnection(HOST, port, timeout=a.timeout)
    t0 = time.perf_counter()
    try:
        c.request("POST", "/v1/chat/completions", body=json.dumps(body).encode(),
                  headers={"Content-Type": "application/json", "X-Session-Id": sid})
        r = c.getresponse()
        out = {"replica": r.getheader("X-Calla-Replica"), "content": "", "reasoning": "", "ttft_ms": None}
        if r.status != 200:
            return {"error": f"HTTP {r.status}: {r.read()[:300]!r}", "replica": out["replica"]}
        buf = b""
        while True:
            chunk = r.read1(65536)
            if not chunk:
                break
            buf += chunk
            while b"\n\n" in buf:
                ev, buf = buf.split(b"\n\n", 1)
                if not ev.startswith(b"data: "):   # SSE comments: prefill progress, keep-alive
                    continue
                if out["ttft_ms"] is None:
                    out["ttft_ms"] = (time.perf_counter() - t0) * 1e3
                if ev == b"data: [DONE]":
                    continue
                e = json.loads(ev[6:])
                if "error" in e:
                    return {"error": f"stream error: {e['error']}", "replica": out["replica"]}
                if e.get("usage"):
                    out["usage"] = e["usage"]
                for ch in e.get("choices", []):
                    d = ch.get("delta", {})
                    out["content"] += d.get("content", "") or ""
                    out["reasoning"] += d.get("reasoning_content", "") or ""
                    if ch.get("finish_reason"):
                        out["timings"] = e.get("timings", {})
    except (OSError, http.client.HTTPException) as e:
        return {"error": repr(e)}
    finally:
        c.close()
    if "usage" not in out:
        return {"error": "stream ended without a usage chunk", "replica": out["replica"]}
    out["total_ms"] = (time.perf_counter() - t0) * 1e3
    return out


def conversation(port, k, a, rows, lock):
    sid = f"bench-conversation-{k}"
    msgs = [{"role": "system", "content": f"You are benchmark conversation {k}."}]
    for t in range(a.turns):
        text = " ".join(WORDS[(k * 13 + t * 7 + i) % len(WORDS)] for i in range(a.words))
        msgs.append({"role": "user", "content": f"Conversation {k}, turn {t + 1}. {text}"})
        r = turn(port, msgs, sid, a)
        r.update(conversation=k, turn=t + 1)
        with lock:
            rows.append(r)
        if "error" in r:
            return
        msgs.append({"role": "assistant", "content": r["content"], "reasoning_content": r["reasoning"]})


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))] if xs else None


def run_config(a, replicas, balance):
    p, port, rports, d = start_cluster(a, replicas, balance)
    try:
        for rp in rports:   # first-touch costs out of the timed run, on every replica
            w = turn(rp, [{"role": "user", "content": "warm-up"}], "warm-up", a)
            if "error" in w:
                sys.exit(f"warm-up on port {rp}: {w['error']}")
        rows, lock = [], threading.Lock()
        th = [threading.Thread(target=conversation, args=(port, k, a, rows, lock)) for k in range(a.conversations)]
        t0 = time.perf_counter()
        for t in th:
            t.start()
        for t in th:
            t.join()
        wall = time.perf_counter() - t0
    finally:
        stop_cluster(p)
    good = [r for r in rows if "error" not in r]
    if len(good) == len(rows):
        shutil.rmtree(d, ignore_errors=True)   # the replicas' and HAProxy's logs stay only after an error
    else:
        print(f"# errors: the logs are in {d}", file=sys.stderr)
    gen = sum(r["usage"]["completion_tokens"] for r in good)
    prompt = sum(r["usage"]["prompt_tokens"] for r in good)
    cached = sum(r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in good)
    later = [r for r in good if r["turn"] > 1]
    ttft = [r["ttft_ms"] for r in good]
    dec = [(r["usage"]["completion_tokens"] - 1) / (r["timings"]["decode_ms"] / 1e3)
           for r in good if r["usage"]["completion_tokens"] > 1 and r["timings"].get("decode_ms")]
    by_replica, moved = {}, 0
    for r in good:
        by_replica[r["replica"]] = by_replica.get(r["replica"], 0) + 1
    for k in range(a.conversations):
        reps = {r["replica"] for r in good if r["conversation"] == k}
        moved += len(reps) > 1
    return {
        "config": f"{replicas}:{balance}", "replicas": replicas, "balance": balance,
        "requests": len(rows), "errors": [r["error"] for r in rows if "error" in r],
        "wall_s": wall, "generated_tokens": gen, "prompt_tokens": prompt, "cached_tokens": cached,
        "aggregate_decode_tok_s": gen / wall if wall else None,
        "requests_per_s": len(good) / wall if wall else None,
        "per_request_decode_tok_s_mean": sum(dec) / len(dec) if dec else None,
        "ttft_ms": {"mean": sum(ttft) / len(ttft) if ttft else None, "p50": pct(ttft, 50), "p95": pct(ttft, 95),
                    "max": max(ttft) if ttft else None},
        "ttft_ms_later_turns_mean": sum(r["ttft_ms"] for r in later) / len(later) if later else None,
        "cache_hit_rate": cached / prompt if prompt else None,
        "cache_hit_rate_later_turns": (sum(r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in later)
                                       / max(1, sum(r["usage"]["prompt_tokens"] for r in later))),
        "by_replica": by_replica, "conversations_moved": moved,
        "rows": [{k: r.get(k) for k in ("conversation", "turn", "replica", "ttft_ms", "total_ms", "usage", "timings",
                                        "error")} for r in rows],
    }


def source_identity():
    def git(*args):
        try:
            return subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True, timeout=10).stdout.strip()
        except OSError:
            return ""
    return {"commit": git("rev-parse", "HEAD") or "unknown",
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}


def device_identity(backend):
    out = ""
    if backend != "cpu":
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=index,name,driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=10).stdout.strip()
        except OSError:
            pass
    return {"kind": "gpu" if out else "cpu", "gpus": out.splitlines() if out else [], "cores": os.cpu_count()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(ROOT, "build/calla"))
    ap.add_argument("--model", required=True)
    ap.add_argument("--backend", default="cuda", help="cuda (replica i on GPU i) or cpu")
    ap.add_argument("--threads", type=int, default=0, help="CPU backend threads per replica (0: all cores)")
    ap.add_argument("--configs", default="1:hash,2:hash,2:random",
                    help="REPLICAS:BALANCE,... (hash: deploy/haproxy.cfg's consistent hash; or an HAProxy "
                         "balance algorithm such as random or roundrobin)")
    ap.add_argument("--conversations", type=int, default=8)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--words", type=int, default=300, help="words per user message (~1.3 tokens each)")
    ap.add_argument("--max-tokens", type=int, default=128, help="generated tokens per turn")
    ap.add_argument("--context", type=int, default=32768)
    ap.add_argument("--queue", type=int, default=8, help="per replica (= HAProxy maxconn)")
    ap.add_argument("--cache-entries", type=int, default=0,
                    help="session-cache entries per replica (0: 2 x --conversations + 1, at most 64: a turn stores "
                         "its new state while the previous one is still in the LRU)")
    ap.add_argument("--no-thinking", action="store_true")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--json")
    a = ap.parse_args()
    a.cache_entries = a.cache_entries or min(64, 2 * a.conversations + 1)
    configs = []
    for c in a.configs.split(","):
        m = re.fullmatch(r"(\d+):(\w+)", c.strip())
        if not m:
            sys.exit(f"--configs: {c!r} is not REPLICAS:BALANCE")
        configs.append((int(m.group(1)), "" if m.group(2) == "hash" else m.group(2)))
    results = []
    for replicas, balance in configs:
        print(f"# {replicas} replica(s), {balance or 'consistent hash on the session'}: {a.conversations} "
              f"conversations x {a.turns} turns", file=sys.stderr, flush=True)
        r = run_config(a, replicas, balance)
        r["config"] = f"{replicas}:{balance or 'hash'}"
        r["balance"] = balance or "hash"
        results.append(r)
    print(f"# cluster bench: {a.conversations} conversations x {a.turns} turns, {a.words} words per message, "
          f"{a.max_tokens} tokens per reply, backend {a.backend}")
    print("| config | requests | errors | wall s | decode tok/s (aggregate) | per-request tok/s | TTFT mean ms | "
          "TTFT p95 ms | cache hit rate | later turns | by replica | moved |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|")
    for r in results:
        f = lambda x, p=1: "-" if x is None else f"{x:.{p}f}"
        print(f"| {r['config']} | {r['requests']} | {len(r['errors'])} | {f(r['wall_s'])} | "
              f"{f(r['aggregate_decode_tok_s'])} | {f(r['per_request_decode_tok_s_mean'])} | {f(r['ttft_ms']['mean'])} | "
              f"{f(r['ttft_ms']['p95'])} | {f(r['cache_hit_rate'], 3)} | {f(r['cache_hit_rate_later_turns'], 3)} | "
              f"{r['by_replica']} | {r['conversations_moved']} |")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"schema": "calla.cluster_bench/1", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                       "source": source_identity(), "device": device_identity(a.backend), "args": vars(a),
                       "results": results}, fh, indent=1)
    return 1 if any(r["errors"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())

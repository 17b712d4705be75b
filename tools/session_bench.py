#!/usr/bin/env python3
"""session_bench.py: the session-cache benchmark of docs/BENCH.md (TTFT per turn, cache on and off).

A growing conversation: each turn appends a user message to the previous messages plus the
model's reply (content and reasoning_content, which the template strips from past turns). The
same conversation runs against a server with the session cache on and one with it off (started
here, one after the other, so they never share the machine). Per turn it reports the prompt
tokens, the cached tokens, the client-side TTFT (request sent -> first streamed event, which the
server sends with the first generated token) and the server's prefill ms, and checks that the
generated tokens are identical with and without the cache (exit 1 if not).

Python 3 standard library only; talks to 127.0.0.1 only; every request has a timeout.

    python3 tools/session_bench.py --bin build/calla --model DIR --backend cpu --turns 10
    python3 tools/session_bench.py --bin build/calla --model DIR --backend cuda --turns 10 \
        --words 200 --max-tokens 64 --context 65536 --json out.json
"""
import argparse
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

HOST = "127.0.0.1"
WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa "
         "quebec romeo sierra tango uniform victor whiskey xray yankee zulu").split()


def start(binary, model, args):
    log = tempfile.NamedTemporaryFile("w+", prefix="calla_bench_", suffix=".log", delete=False)
    p = subprocess.Popen([binary, "serve", "--model", model, "--host", HOST, "--port", "0", "--quiet", *args],
                         stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    deadline = time.time() + 600
    while time.time() < deadline and p.poll() is None:
        with open(log.name, errors="replace") as f:
            m = re.search(r"listening on http://[^:]+:(\d+)", f.read())
        if m:
            return p, int(m.group(1)), log.name
        time.sleep(0.1)
    with open(log.name, errors="replace") as f:
        sys.exit("server did not start:\n" + f.read())


def stop(p, log):
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(120)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait(10)
    os.unlink(log)


def turn(port, messages, a):
    """One streamed chat request -> dict(ttft_ms, total_ms, usage, timings, ids, content, reasoning)."""
    body = {"messages": messages, "max_tokens": a.max_tokens, "stream": True, "return_token_ids": True,
            "stream_options": {"include_usage": True},   # usage comes in a chunk of its own, as OpenAI's
            "chat_template_kwargs": {"enable_thinking": not a.no_thinking}}
    c = http.client.HTTPConnection(HOST, port, timeout=a.timeout)
    t0 = time.perf_counter()
    c.request("POST", "/v1/chat/completions", body=json.dumps(body).encode(),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        sys.exit(f"HTTP {r.status}: {r.read()[:500]!r}")
    ttft = None
    out = {"content": "", "reasoning": "", "ids": None}
    buf = b""
    while True:
        chunk = r.read1(65536) if hasattr(r, "read1") else r.read(65536)
        if not chunk:
            break
        if ttft is None:
            ttft = (time.perf_counter() - t0) * 1e3
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            if not ev.startswith(b"data: ") or ev == b"data: [DONE]":
                continue
            e = json.loads(ev[6:])
            if "error" in e:
                sys.exit(f"stream error: {e['error']}")
            if e.get("usage"):
                out["usage"] = e["usage"]
            for ch in e.get("choices", []):
                d = ch.get("delta", {})
                out["content"] += d.get("content", "") or ""
                out["reasoning"] += d.get("reasoning_content", "") or ""
                if ch.get("finish_reason"):
                    out["ids"] = ch.get("token_ids")
                    out["timings"] = e["timings"]
    if "usage" not in out:
        sys.exit("stream ended without a usage chunk")
    out["ttft_ms"] = ttft
    out["total_ms"] = (time.perf_counter() - t0) * 1e3
    c.close()
    return out


def conversation(port, a):
    msgs = [{"role": "system", "content": "You are a benchmark."}]
    rows = []
    for t in range(a.turns):
        text = " ".join(WORDS[(t * 7 + i) % len(WORDS)] for i in range(a.words))
        msgs.append({"role": "user", "content": f"Turn {t + 1}. {text}"})
        r = turn(port, msgs, a)
        rows.append(r)
        msgs.append({"role": "assistant", "content": r["content"], "reasoning_content": r["reasoning"]})
    return rows


def source_identity():
    def git(*args):
        try:
            return subprocess.run(["git", *args], capture_output=True, text=True, timeout=10).stdout.strip()
        except OSError:
            return ""
    return {"commit": git("rev-parse", "HEAD") or "unknown",
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}


def device_identity(backend):
    if backend == "cpu":
        return {"kind": "cpu", "cores": os.cpu_count()}
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10).stdout.strip()
    except OSError:
        out = ""
    return {"kind": "gpu" if out else "cpu", "name": out or None, "cores": os.cpu_count()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="build/calla")
    ap.add_argument("--model", required=True)
    ap.add_argument("--backend", default=None)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--words", type=int, default=40, help="words per user message")
    ap.add_argument("--max-tokens", type=int, default=16, help="generated tokens per turn")
    ap.add_argument("--no-thinking", action="store_true", help="chat_template_kwargs.enable_thinking = false")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--json", help="write the per-turn figures here")
    a = ap.parse_args()
    common = ["--context", str(a.context), "--threads", str(a.threads)]
    if a.backend:
        common += ["--backend", a.backend]
    res = {}
    for mode, extra in (("on", []), ("off", ["--cache-entries", "0", "--cache-boundaries", "0"])):
        p, port, log = start(a.bin, a.model, common + extra)
        try:
            turn(port, [{"role": "user", "content": "warm-up"}], a)   # first-touch costs out of turn 1
            res[mode] = conversation(port, a)
        finally:
            stop(p, log)
    on, off = res["on"], res["off"]
    same = all(x["ids"] == y["ids"] for x, y in zip(on, off))
    print(f"# session cache: {a.turns} turns, {a.words} words per user message, {a.max_tokens} tokens per reply, "
          f"backend {a.backend or 'default'}, context {a.context}")
    print("| turn | prompt tokens | cached (on) | hit | TTFT on ms | TTFT off ms | prefill on ms | prefill off ms | speed-up |")
    print("|---:|---:|---:|:-:|---:|---:|---:|---:|---:|")
    for i, (x, y) in enumerate(zip(on, off)):
        c = x["usage"]["prompt_tokens_details"]["cached_tokens"]
        print(f"| {i + 1} | {x['usage']['prompt_tokens']} | {c} | {'hit' if c else 'miss'} | {x['ttft_ms']:.1f} | "
              f"{y['ttft_ms']:.1f} | {x['timings']['prefill_ms']:.1f} | {y['timings']['prefill_ms']:.1f} | "
              f"{y['ttft_ms'] / x['ttft_ms']:.2f}x |")
    s_on, s_off = sum(x["ttft_ms"] for x in on), sum(y["ttft_ms"] for y in off)
    print(f"# total TTFT: on {s_on:.0f} ms, off {s_off:.0f} ms ({s_off / s_on:.2f}x); "
          f"outputs identical with and without the cache: {'yes' if same else 'NO'}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"schema": "calla.session_bench/1", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                       "source": source_identity(), "device": device_identity(a.backend),
                       "args": vars(a), "identical": same,
                       "turns": [{"turn": i + 1, "prompt_tokens": x["usage"]["prompt_tokens"],
                                  "cached_tokens": x["usage"]["prompt_tokens_details"]["cached_tokens"],
                                  "ttft_on_ms": x["ttft_ms"], "ttft_off_ms": y["ttft_ms"],
                                  "prefill_on_ms": x["timings"]["prefill_ms"], "prefill_off_ms": y["timings"]["prefill_ms"],
                                  "token_ids": x["ids"]} for i, (x, y) in enumerate(zip(on, off))]}, f, indent=1)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())

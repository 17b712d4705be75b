#!/usr/bin/env python3
"""http_modes.py: decode tok/s over HTTP (streaming chat completions) for a plain request against
requests whose tokens need the logits (logprobs + top_logprobs, json_object, json_schema, a forced
tool call), on one running `calla serve`, the modes interleaved over rounds.

    python3 bench/lab/http_modes.py --url http://127.0.0.1:8080 --tokens 256 --rounds 2 --json out.json
"""
import argparse, http.client, json, time, urllib.parse

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "items": {"type": "array", "items": {"type": "string"}}},
          "required": ["name", "items"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "write_file", "description": "write a file",
          "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                         "required": ["path", "content"]}}}]
MODES = {
    "plain": {},
    "logprobs": {"logprobs": True, "top_logprobs": 5},
    "json_object": {"response_format": {"type": "json_object"}},
    "json_schema": {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}},
    "tool_required": {"tools": TOOLS, "tool_choice": "required"},
}


def run(url, body):
    u = urllib.parse.urlparse(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    t0 = time.time()
    c.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise SystemExit(f"{r.status}: {r.read()[:300]}")
    first = last = None
    n = 0
    usage = timings = None
    buf = b""
    while True:
        chunk = r.read1(65536) if hasattr(r, "read1") else r.read(4096)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            if not ev.startswith(b"data: ") or ev == b"data: [DONE]":
                continue
            o = json.loads(ev[6:])
            if o.get("usage"):
                usage = o["usage"]
            if o.get("timings"):
                timings = o["timings"]
            for ch in o.get("choices", []):
                d = ch.get("delta", {})
                if d.get("content") or d.get("tool_calls") or d.get("reasoning_content") or ch.get("logprobs"):
                    now = time.time()
                    first = first or now
                    last = now
    c.close()
    toks = usage["completion_tokens"] if usage else n
    # The client's view where the stream carries text for most tokens; the server's decode time
    # (its final chunk's timings) always, since a random-weight model's tokens may decode to no text.
    return {"ttft_s": (first or time.time()) - t0, "tokens": toks,
            "decode_tok_s": (toks - 1) / (last - first) if first and last and last > first else None,
            "server_decode_tok_s": (toks - 1) / (timings["decode_ms"] / 1e3) if timings and timings.get("decode_ms") else None}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json")
    a = ap.parse_args()
    base = {"model": "calla", "stream": True, "stream_options": {"include_usage": True}, "max_tokens": a.tokens,
            "messages": [{"role": "user", "content": "Write a short story about a lighthouse keeper and a storm."}],
            "chat_template_kwargs": {"enable_thinking": False}, "ignore_eos": True}
    res = {m: [] for m in MODES}
    for _ in range(a.rounds):
        for m, extra in MODES.items():
            res[m].append(run(a.url, {**base, **extra}))
    def mean(rs, key):
        v = [r[key] for r in rs if r[key]]
        return sum(v) / len(v) if v else float("nan")

    pc, ps = mean(res["plain"], "decode_tok_s"), mean(res["plain"], "server_decode_tok_s")
    print(f"{'mode':14} {'tokens':>7} {'client tok/s':>13} {'vs plain':>9} {'server tok/s':>13} {'vs plain':>9}")
    for m, rs in res.items():
        c, sv = mean(rs, "decode_tok_s"), mean(rs, "server_decode_tok_s")
        print(f"{m:14} {rs[0]['tokens']:7d} {c:13.1f} {c / pc:9.3f} {sv:13.1f} {sv / ps:9.3f}")
    if a.json:
        json.dump({"url": a.url, "tokens": a.tokens, "rounds": a.rounds, "results": res}, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()

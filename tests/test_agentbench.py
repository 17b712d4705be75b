#!/usr/bin/env python3
"""test_agentbench.py: `calla agentbench` and `calla matrix --agentbench` end to end on loopback.

Python 3 standard library (jinja2 for the template check). Run by build/tests/test_agentbench
(tests/test_agentbench.c); by hand:
    python3 tests/test_agentbench.py --bin build/calla [--model DIR]

What it checks:
  - the conversation is a function of the seed alone (--dry-run twice; another seed differs), its
    sizes are where they were asked for, and the token estimate is near the real vocabulary's count
  - against `calla serve` on a tiny synthetic checkpoint (CPU): the record's structure, cached
    tokens growing turn over turn (the session cache), and a second run with the same seed sending
    the same conversation (the same prompt tokens turn by turn, the same replies)
  - against a stand-in for llama-server (this file, --mock-server): the llama-server flavor reads
    timings.cache_n and /props, a reply streamed in pieces (chunked, CRLF and LF events, tool-call
    deltas) comes back whole in the next request, the request fields (ignore_eos, max_tokens,
    stream_options, tool_choice, cache_prompt); an HTTP error, a stall past --timeout and a body cut
    off are errors that name the turn
  - `calla matrix --agentbench` with a Calla arm and the stand-in as the llama-server arm: records,
    report.md's conversation section with the ratios and the target's verdict
  - tools/device/qwen36-chat.jinja renders every request of tests/data/chat/tools.jsonl byte for
    byte as expected (the official template's renderings), with and without trim_blocks
Every request has a timeout and every server is stopped; only 127.0.0.1 is contacted.
Exit status 0 only if every check passed.
"""
import argparse
import copy
import http.server
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_server import FAILURES, HOST, RESULTS, Server, check  # noqa: E402  (one checker and tally for the suites)

# Calla's server honours ignore_eos (stop tokens do not end a turn, max_tokens does): every turn
# must generate exactly --gen tokens.
CALLA_HONOURS_IGNORE_EOS = True


def run(args, timeout=300):
    p = subprocess.run(args, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    return p.returncode, p.stdout, p.stderr


# ---- the stand-in for llama-server -----------------------------------------------------------

class Mock(http.server.BaseHTTPRequestHandler):
    """Answers as llama-server does: /health, /v1/models, /props, and streamed chat completions
    with tool-call deltas in pieces, timings {cache_n, prompt_n} and usage after the finish."""
    protocol_version = "HTTP/1.1"
    log_path = None
    served = {}            # model -> requests answered
    prev_prompt = {}
    lock = threading.Lock()

    def log_message(self, *a):
        pass

    def send_json(self, status, obj):
        b = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)

    def do_GET(self):
        if self.path == "/health":
            return self.send_json(200, {"status": "ok"})
        if self.path == "/v1/models":
            return self.send_json(200, {"object": "list", "data": [{"id": "mock-model", "object": "model",
                                                                    "owned_by": "llamacpp"}]})
        if self.path == "/props":
            return self.send_json(200, {"build_info": "b0000-mock", "model_path": "/tmp/mock.gguf", "total_slots": 1,
                                        "default_generation_settings": {"n_ctx": 65536},
                                        "chat_template": "{{ messages }}"})
        self.send_json(404, {"error": {"message": "not found"}})

    def chunk(self, data):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        model = body.get("model", "")
        with Mock.lock:
            k = Mock.served.get(model, 0)
            Mock.served[model] = k + 1
            n = len(json.dumps(body["messages"])) // 4
            cache_n = Mock.prev_prompt.get(model, 0)
            Mock.prev_prompt[model] = n
            if Mock.log_path:
                with open(Mock.log_path, "a") as f:
                    f.write(json.dumps(body) + "\n")
        if model == "fail-at-2" and k == 2:
            return self.send_json(400, {"error": {"code": 400, "message": "boom at two", "type": "invalid_request_error"}})
        if model == "stall":
            time.sleep(4)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Connection", "close")
        self.end_headers()
        nl = "\r\n" if k % 2 else "\n"
        gen = body.get("max_tokens", 4)

        def event(obj, split=False):
            data = ("data: " + json.dumps(obj) + nl + nl).encode()
            if split:   # one event across two chunks, cut inside its JSON
                self.chunk(data[:len(data) // 2])
                self.chunk(data[len(data) // 2:])
            else:
                self.chunk(data)
            self.wfile.flush()

        def delta(d, finish=None):
            return {"choices": [{"finish_reason": finish, "index": 0, "delta": d}], "object": "chat.completion.chunk"}

        self.chunk((": keep-alive" + nl + nl).encode())
        event(delta({"role": "assistant", "content": None}))
        if model == "truncate":
            self.wfile.write(b"40\r\ndata: {\"choi")
            self.wfile.flush()
            self.close_connection = True
            return
        required = body.get("tool_choice") == "required"
        if k == 0:
            event(delta({"reasoning_content": "thinking 0"}))
        if required:
            event(delta({"tool_calls": [{"index": 0, "id": f"call_mock_{k}", "type": "function",
                                         "function": {"name": "read_file", "arguments": ""}}]}), split=True)
            event(delta({"tool_calls": [{"index": 0, "function": {"arguments": "{\"path\": \"src/a"}}]}))
            event(delta({"tool_calls": [{"index": 0, "function": {"arguments": f"{k}.c\"}}"}}]}))
        else:
            for i in range(gen - 1):
                event(delta({"content": f" w{i}"}), split=i == 0)
        event(delta({}, "tool_calls" if required else "length"))
        event({"choices": [], "object": "chat.completion.chunk",
               "usage": {"completion_tokens": gen, "prompt_tokens": n, "total_tokens": n + gen,
                         "prompt_tokens_details": {"cached_tokens": max(cache_n - 1, 0)}},
               "timings": {"cache_n": cache_n, "prompt_n": n - cache_n, "prompt_ms": 1.0, "predicted_n": gen,
                           "predicted_ms": 2.0}})
        self.chunk(("data: [DONE]" + nl + nl).encode())
        self.chunk(b"")
        self.wfile.flush()


def mock_main(port, log):
    Mock.log_path = log
    srv = http.server.ThreadingHTTPServer((HOST, port), Mock)
    print(f"mock llama-server listening on {HOST}:{srv.server_address[1]}", flush=True)
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    srv.serve_forever()


class MockServer(Server):
    """This file as the stand-in for llama-server, in a process of its own (Server's log and stop)."""

    def __init__(self, log):
        self.log = tempfile.NamedTemporaryFile("w+", prefix="calla_mock_", suffix=".log", delete=False)
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--mock-server", "--port", "0", "--log", log],
                                     stdout=self.log, stderr=self.log, stdin=subprocess.DEVNULL)
        self.port = None
        deadline = time.time() + 60
        while time.time() < deadline and self.proc.poll() is None and not self.port:
            m = re.search(r"listening on [\d.]+:(\d+)", self.text())
            if m:
                self.port = int(m.group(1))
            else:
                time.sleep(0.05)
        if not self.port:
            self.close()
            raise RuntimeError("the stand-in did not start:\n" + self.text())


# ---- the checks ------------------------------------------------------------------------------

SMALL = ["--turns", "4", "--system-tokens", "600", "--min-result", "20", "--max-result", "150", "--gen", "3",
         "--required-every", "2", "--seed", "7", "--timeout", "120"]


def dry(binary, *flags):
    rc, out, err = run([binary, "agentbench", "--dry-run", *flags])
    return rc, (json.loads(out) if rc == 0 else None), err


def test_conversation(binary):
    rc, a, err = dry(binary, *SMALL)
    check("dry-run succeeds", rc == 0 and a is not None, err)
    if not a:
        return None
    _, b, _ = dry(binary, *SMALL)
    check("dry-run: the same seed gives the same conversation", a == b)
    _, c, _ = dry(binary, *[x if x != "7" else "8" for x in SMALL])
    check("dry-run: another seed gives another conversation", c and c["hash"] != a["hash"] and c["task"] != a["task"] and
          [x["result"] for x in c["turns"]] != [x["result"] for x in a["turns"]])
    t = a["turns"]
    check("dry-run: one tool result a turn", len(t) == 4 and [x["turn"] for x in t] == [1, 2, 3, 4])
    check("dry-run: results sized within [min, max], at most a line over",
          all(20 <= x["target_tokens"] <= 150 and x["target_tokens"] <= x["est_tokens"] <= x["target_tokens"] + 64
              for x in t), [(x["target_tokens"], x["est_tokens"]) for x in t])
    check("dry-run: every second turn forces a call", [x["required"] for x in t] == [False, True, False, True])
    names = [f["function"]["name"] for f in a["tools"]]
    check("dry-run: the coding agent's tools", {"read_file", "write_file", "run_shell", "search"} <= set(names), names)
    check("dry-run: tool results name a tool", all(x["tool"] in names for x in t))
    # the default shape: ~8K tokens of system turn, 20 results of 20..4,000 tokens
    rc, d, err = dry(binary)
    check("dry-run: the default opening turn is ~8K estimated tokens",
          d and 7900 <= d["system_est_tokens"] + d["tools_est_tokens"] <= 8200, d and d["system_est_tokens"])
    check("dry-run: the default has 20 results of 20..4,000", d and len(d["turns"]) == 20 and
          all(20 <= x["target_tokens"] <= 4000 for x in d["turns"]))
    search = [x["result"] for x in d["turns"] if x["tool"] == "search"] if d else []
    ok = True
    for s in search:
        try:
            json.loads(s)
        except ValueError:
            ok = False
    check("dry-run: search results are JSON", ok)
    vocab = os.path.join(os.path.dirname(binary), "tokenizer", "tokenizer.json")
    if d and os.path.exists(vocab):
        def count(text):
            with tempfile.NamedTemporaryFile("w", delete=False) as f:
                f.write(text)
            rc_, out, _ = run([binary, "tokenize", "--model", os.path.dirname(vocab), "--file", f.name])
            os.unlink(f.name)
            return len(out.replace(",", " ").split()) if rc_ == 0 else -1
        sys_real = count(d["system"])
        res_real = count("\n".join(x["result"] for x in d["turns"]))
        res_est = sum(x["est_tokens"] for x in d["turns"])
        check("estimate: the system prompt within 10% of the real vocabulary's count",
              abs(sys_real - d["system_est_tokens"]) <= 0.1 * sys_real, (sys_real, d["system_est_tokens"]))
        check("estimate: the tool results within 10% of the real vocabulary's count",
              abs(res_real - res_est) <= 0.1 * res_real, (res_real, res_est))
    else:
        print(f"skip the estimate against the real vocabulary (no {vocab})")
    return a


def agentbench(binary, port, *flags, timeout=300):
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    rc, out, err = run([binary, "agentbench", "--url", f"http://{HOST}:{port}", "--json", path, *flags], timeout)
    rec = None
    if rc == 0:
        with open(path) as f:
            rec = json.load(f)
    os.unlink(path)
    return rc, rec, out, err


def check_record(name, r, requests, gen):
    t = r["turns"]
    check(f"{name}: schema and shape", r["schema"] == "calla.agentbench/1" and r["conversation"]["requests"] == requests
          and len(t) == requests and [x["turn"] for x in t] == list(range(requests)))
    for k in ("prompt_tokens", "cached_tokens", "new_tokens", "prefilled_tokens", "completion_tokens", "ttft_ms",
              "turn_ms", "decode_tok_s", "finish_reason", "tool_choice", "reply_hash", "server_timings"):
        check(f"{name}: every turn has {k}", all(k in x for x in t))
    check(f"{name}: prompts grow", all(t[i]["prompt_tokens"] > t[i - 1]["prompt_tokens"] for i in range(1, len(t))))
    check(f"{name}: times are positive, TTFT within the turn",
          all(0 < x["ttft_ms"] <= x["turn_ms"] for x in t), [(x["ttft_ms"], x["turn_ms"]) for x in t])
    check(f"{name}: the wall time covers the turns",
          r["summary"]["wall_s"] * 1e3 >= sum(x["turn_ms"] for x in t) * 0.999)
    check(f"{name}: tokens generated within max_tokens", all(1 <= x["completion_tokens"] <= gen for x in t))
    check(f"{name}: tool_choice required on turns 2 and 4",
          [x["tool_choice"] for x in t] == ["auto", "auto", "required", "auto", "required"])


def test_calla(binary, model, conv):
    srv = Server(binary, model, "--backend", "cpu", "--threads", "1", "--context", "8192", "--quiet")
    try:
        rc, r, out, err = agentbench(binary, srv.port, *SMALL)
        if not check("calla: agentbench runs", rc == 0 and r, err + srv.text()[-2000:]):
            return
        check_record("calla", r, 5, 3)
        t = r["turns"]
        check("calla: the engine's identity", r["engine"]["name"] == "calla" and r["engine"]["models"]["owned_by"] == "calla"
              and "health" in r["engine"])
        check("calla: the conversation is the dry run's", r["conversation"]["hash"] == conv["hash"])
        check("calla: nothing cached on the opening turn", t[0]["cached_tokens"] == 0)
        check("calla: cached tokens grow turn over turn",
              all(t[i]["cached_tokens"] > t[i - 1]["cached_tokens"] for i in range(1, len(t))),
              [x["cached_tokens"] for x in t])
        check("calla: each turn reuses (about) the whole previous prompt",
              all(t[i]["cached_tokens"] >= t[i - 1]["prompt_tokens"] - 32 for i in range(1, len(t))),
              [(x["prompt_tokens"], x["cached_tokens"]) for x in t])
        check("calla: cached from usage", all(x["cached_from"] == "usage.prompt_tokens_details.cached_tokens" for x in t))
        if CALLA_HONOURS_IGNORE_EOS:
            check("calla: ignore_eos: every turn generates --gen tokens", all(x["completion_tokens"] == 3 for x in t))
        check("calla: the table has a row a turn", len([l for l in out.splitlines() if re.match(r"^\s+\d+\s", l)]) == 5,
              out)
        rc, r2, _, err = agentbench(binary, srv.port, *SMALL)
        if check("calla: a second run", rc == 0 and r2, err):
            check("calla: the same seed sends the same conversation (prompt tokens turn by turn)",
                  [x["prompt_tokens"] for x in r2["turns"]] == [x["prompt_tokens"] for x in t])
            check("calla: the same replies (greedy; the cache warm the second time)",
                  r2["summary"]["replies_hash"] == r["summary"]["replies_hash"])
    finally:
        srv.close("calla serve")


def requests_logged(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]


def test_mock(binary, conv):
    log = tempfile.NamedTemporaryFile(prefix="calla_mock_", suffix=".jsonl", delete=False).name
    srv = MockServer(log)
    try:
        rc, r, out, err = agentbench(binary, srv.port, "--flavor", "llama-server", *SMALL)
        if not check("llama-server flavor: agentbench runs against the stand-in", rc == 0 and r, err):
            return
        check_record("llama-server flavor", r, 5, 3)
        t = r["turns"]
        bodies = requests_logged(log)
        check("llama-server flavor: five requests", len(bodies) == 5)
        check("llama-server flavor: cached tokens from timings.cache_n",
              all(x["cached_from"] == "timings.cache_n" for x in t) and t[0]["cached_tokens"] == 0 and
              all(t[i]["cached_tokens"] == t[i - 1]["prompt_tokens"] for i in range(1, 5)),
              [(x["prompt_tokens"], x["cached_tokens"]) for x in t])
        check("llama-server flavor: identity from /props", r["engine"]["props"]["build_info"] == "b0000-mock" and
              r["engine"]["props"]["n_ctx"] == 65536 and r["engine"]["model"] == "mock-model")
        check("llama-server flavor: the server's timings kept", t[1]["server_timings"]["prompt_n"] > 0)
        b0 = bodies[0]
        check("request: streamed with usage", b0["stream"] is True and b0["stream_options"] == {"include_usage": True})
        check("request: max_tokens, ignore_eos, temperature 0, cache_prompt",
              b0["max_tokens"] == 3 and b0["ignore_eos"] is True and b0["temperature"] == 0 and b0["cache_prompt"] is True)
        check("request: thinking off", b0["chat_template_kwargs"] == {"enable_thinking": False})
        check("request: the tools", b0["tools"] == conv["tools"])
        check("request: the opening messages", b0["messages"] == [{"role": "system", "content": conv["system"]},
                                                                   {"role": "user", "content": conv["task"]}])
        check("request: tool_choice only on the forced turns",
              [b.get("tool_choice") for b in bodies] == [None, None, "required", None, "required"])
        ok = True
        for k in range(1, 5):
            m = bodies[k]["messages"]
            ok = ok and m[:-2] == bodies[k - 1]["messages"] and len(m) == len(bodies[k - 1]["messages"]) + 2
            ok = ok and m[-1]["role"] == "tool" and m[-1]["content"] == conv["turns"][k - 1]["result"]
        check("request: each turn appends the reply and the tool result to the previous messages", ok)
        a1 = bodies[1]["messages"][-2]
        check("request: a streamed reply comes back whole, with its reasoning",
              a1 == {"role": "assistant", "content": " w0 w1", "reasoning_content": "thinking 0"}, a1)
        a3 = bodies[3]["messages"][-2]
        check("request: a tool call streamed in pieces comes back whole",
              a3 == {"role": "assistant", "content": None,
                     "tool_calls": [{"id": "call_mock_2", "type": "function",
                                     "function": {"name": "read_file", "arguments": "{\"path\": \"src/a2.c\"}"}}]}, a3)
        check("request: the tool result answers the call's id", bodies[3]["messages"][-1]["tool_call_id"] == "call_mock_2")
        check("request: without a call, a tool result gets an id of its own",
              bodies[2]["messages"][-1]["tool_call_id"] == "call_agentbench_2")
        check("record: calls counted", t[2]["tool_calls"] == 1 and t[2]["finish_reason"] == "tool_calls")
        rc, _, _, err = agentbench(binary, srv.port, "--flavor", "llama-server", "--model", "fail-at-2", *SMALL)
        check("an HTTP error names the turn and the server's message", rc == 1 and "turn 2: HTTP 400: boom at two" in err, err)
        t0 = time.time()
        rc, _, _, err = agentbench(binary, srv.port, "--flavor", "llama-server", "--model", "stall", *SMALL[:-1], "1")
        check("a server that stalls past --timeout is an error", rc == 1 and "turn 0" in err and "timed out" in err
              and time.time() - t0 < 4, err)
        rc, _, _, err = agentbench(binary, srv.port, "--flavor", "llama-server", "--model", "truncate", *SMALL)
        check("a body cut off is an error", rc == 1 and "turn 0" in err and "closed" in err, err)
        rc, _, _, err = agentbench(binary, srv.port, "--flavor", "vllm", *SMALL)
        check("an unknown flavor is refused", rc == 2 and "flavor" in err, err)
    finally:
        srv.close()
        os.unlink(log)
    rc, _, _, err = agentbench(binary, free_port(), *SMALL)
    check("no server: a clear error", rc == 1 and "cannot connect" in err, err)
    rc, _, err = run([binary, "agentbench", "--url", "https://127.0.0.1:1", *SMALL])
    check("https is refused", rc == 1 and "plain http" in err, err)


def free_port():
    s = socket.socket()
    s.bind((HOST, 0))
    p = s.getsockname()[1]
    s.close()
    return p


def test_matrix(binary, model):
    out = tempfile.mkdtemp(prefix="calla_agentmatrix_")
    mock = f"{sys.executable} {os.path.abspath(__file__)} --mock-server --port {{port}}"
    args = [binary, "matrix", "--agentbench", " ".join(SMALL), "--engines", "cpu,llama-server", "--model", model,
            "--llama-server", mock, "--threads", "1", "--rounds", "1", "--cooldown-min-s", "0", "--force",
            "--no-reference", "--targets", os.path.join(ROOT, "bench/targets/h200.json"), "--out", out]
    env = dict(os.environ, OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "passive"))
    p = subprocess.run(args, capture_output=True, text=True, timeout=600, env=env, stdin=subprocess.DEVNULL)
    check("matrix --agentbench runs both arms", p.returncode == 0, p.stderr[-3000:])
    files = sorted(os.listdir(out))
    check("matrix --agentbench: a record per arm", "calla-cpu-agent-r1.json" in files and
          "llama-server-agent-r1.json" in files, files)
    for name in ("calla-cpu-agent-r1.json", "llama-server-agent-r1.json"):
        try:
            with open(os.path.join(out, name)) as f:
                rec = json.load(f)
            check(f"matrix --agentbench: {name} tagged", rec["matrix"]["round"] == 1 and rec["matrix"]["engine"] in
                  ("cpu", "llama-server") and len(rec["turns"]) == 5)
        except (OSError, ValueError, KeyError) as e:
            check(f"matrix --agentbench: {name} readable", False, str(e))
    try:
        with open(os.path.join(out, "report.md")) as f:
            rep = f.read()
    except OSError:
        rep = ""
    check("report: the conversation section", "## Conversation (calla agentbench)" in rep and
          "| calla-cpu |" in rep and "| llama-server |" in rep, rep[-3000:])
    check("report: per-turn TTFT ratios", "TTFT calla-cpu / llama-server" in rep and "| **wall** |" in rep)
    check("report: the wall-time target, not checked on the CPU",
          "≤ 1/4 of llama-server's" in rep and "not checked (another device kind)" in rep, rep[-2000:])
    check("report: the same conversation for both", "Every arm was sent the same conversation" in rep)
    check("report: no sweep plots for a conversation alone", not os.path.exists(os.path.join(out, "decode_ms.svg")))
    subprocess.run(["rm", "-rf", out])


def template_render(template, req, trim):
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    env = ImmutableSandboxedEnvironment(trim_blocks=trim, lstrip_blocks=trim, extensions=["jinja2.ext.loopcontrols"])

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    msgs = copy.deepcopy(req["messages"])
    for m in msgs:   # servers parse a call's arguments before rendering
        for tc in m.get("tool_calls") or []:
            a = tc["function"].get("arguments")
            if isinstance(a, str):
                tc["function"]["arguments"] = json.loads(a)
    tools = None if req.get("tool_choice") == "none" else req.get("tools")
    return env.from_string(template).render(messages=msgs, tools=tools, add_generation_prompt=True,
                                            **req.get("chat_template_kwargs", {}))


def test_template():
    try:
        import jinja2  # noqa: F401
    except ImportError:
        check("jinja2 is installed (the template check)", not os.environ.get("CI"), "pip install jinja2")
        print("skip the template check (no jinja2)")
        return
    with open(os.path.join(ROOT, "tools/device/qwen36-chat.jinja")) as f:
        template = f.read()
    with open(os.path.join(ROOT, "tests/data/chat/tools.jsonl")) as f:
        cases = [json.loads(l) for l in f if l.strip()]
    bad = []
    for c in cases:
        for trim in (True, False):
            try:
                got = template_render(template, c["request"], trim)
            except Exception as e:   # a template error is a mismatch too
                got = f"error: {e}"
            if got != c["expected"]:
                bad.append((c["name"], trim))
    check(f"template: the {len(cases)} requests of tools.jsonl render as expected", cases and not bad, bad)
    try:
        template_render(template, {"messages": [{"role": "tool", "content": "x"}]}, True)
        refused = False
    except Exception as e:
        refused = "no user query" in str(e)
    check("template: no user query is refused", refused)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/calla")
    ap.add_argument("--model", help="a tiny synthetic checkpoint (default: written here)")
    ap.add_argument("--mock-server", action="store_true", help="serve as the stand-in for llama-server")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--log", help="--mock-server: append each request body to this file")
    a = ap.parse_args()
    if a.mock_server:
        return mock_main(a.port, a.log)
    binary = os.path.abspath(a.bin)
    tmp = None
    model = a.model
    if not model:
        tmp = tempfile.mkdtemp(prefix="calla_agentbench_model_")
        rc, _, err = run([binary, "synth", "--geometry", "tiny", "--seed", "1", "--out", tmp])
        if rc:
            print(err)
            return 1
        model = tmp
    t0 = time.time()
    try:
        test_template()
        conv = test_conversation(binary)
        if conv:
            test_calla(binary, model, conv)
            test_mock(binary, conv)
        test_matrix(binary, model)
    finally:
        if tmp:
            subprocess.run(["rm", "-rf", tmp])
    print(f"{RESULTS['ok']} passed, {RESULTS['fail']} failed ({time.time() - t0:.1f} s)")
    if FAILURES:
        print("failed: " + ", ".join(FAILURES))
    return 1 if RESULTS["fail"] else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""test_connections.py: connection exhaustion, abandoned requests and cancellation.

Python 3 standard library only (the openai client and curl for one check, when present).  Run by
build/tests/test_server (tests/test_server.c) after tests/test_server.py; by hand:
    python3 tests/test_connections.py --bin build/calla --model DIR [--quick]

1. Exhaustion: N (10,000; --quick 2,000) connections from 127.0.0.2, 127.0.0.3, ... (Linux routes
   all of 127/8 to lo), PER_IP each, the server's --max-connections-per-ip, so every address is
   full.  They send a request's headers one line a second (a quarter send nothing at all).
   Meanwhile a well-behaved client on 127.0.0.1, and another on a full address, send GET /health
   and a small chat completion: each must be answered within 1 s (the one on a full address gets
   in by the close of its address's oldest idle connection, which is the first one opened there).
   Every dripping connection is closed by the server once --request-timeout is past (the idle
   timeout alone never fires: they are never idle that long); the server is alive after.
2. Pressure: past --max-connections the oldest idle connections are closed, the newest kept, and a
   connection answering a request (a stream opened before all of them) never.
3. Abandoned requests: six non-streaming requests of 3,000 tokens each whose clients close their
   sockets (FIN, not a reset) right after sending; the next client is served within a few
   seconds and all six are cancelled.  A client that only half-closes (shutdown(SHUT_WR)) gets its
   whole answer, however long it runs: streamed, and not streamed (started early, spaces before
   the document).  The openai client and curl read that form of an answer.
4. Cancellation: a streamed request with a large max_tokens whose client hangs up after the first
   chunk is cancelled (calla_cancelled_total), and the next request's first token comes within
   the bound written down in test_cancel.
Exit status 0 only if every check passed.
"""
import argparse
import http.server
import json
import os
import re
import resource
import select
import shutil
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_server import HOST, RESULTS, FAILURES, Server, check, metrics, post, read_to_end, request  # noqa: E402

PER_IP = 100         # --max-connections-per-ip given to the exhaustion server: every dripping address full
REQUEST_TIMEOUT = 10 # --request-timeout given to the server, seconds
DRIP_EVERY = 1.0     # seconds between two header lines of a dripping connection (< the idle timeout)
GOOD_BOUND = 1.0     # seconds: a well-behaved request's answer


def raise_nofile(n):
    """Room for n sockets in this process, as the server makes room for its own; False when the
    hard limit is too low."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < n + 256:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= n + 256


def closed_by_server(socks, skip):
    """The indices of the (non-blocking) sockets the server has closed, not in skip."""
    p = select.poll()
    fds = {}
    for i, s in enumerate(socks):
        if i not in skip:
            p.register(s, select.POLLIN | select.POLLHUP | select.POLLERR)
            fds[s.fileno()] = i
    out = set()
    for fd, ev in p.poll(0):
        i = fds[fd]
        try:
            if socks[i].recv(4096) == b"":   # data (an error page) would mean it answered: not closed yet
                out.add(i)
        except BlockingIOError:
            pass
        except OSError:
            out.add(i)
    return out


def open_from(addr, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind((addr, 0))
    s.connect((HOST, port))
    s.setblocking(False)
    return s


def wait_open(port, n, timeout=60, limit=None):
    """Waits until n of the test's connections are open.  The connection asking /metrics counts
    itself, so the gauge must read n + 1 (at most the server's limit, when one is given)."""
    want = n + 1 if limit is None else min(n + 1, limit)
    deadline = time.time() + timeout
    m = metrics(port)
    while m["calla_connections_open"] < want and time.time() < deadline:
        time.sleep(0.1)
        m = metrics(port)
    return m


def good_requests(port, source, until, kinds=("health", "chat")):
    """GET /health and a small chat completion, from source, until the time until; -> (count,
    worst seconds, the bad ones)."""
    worst, n, bad = 0.0, 0, []
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    while time.time() < until:
        for what in kinds:
            t0 = time.time()
            try:
                if what == "health":
                    st, _, _ = request(port, "GET", "/health", timeout=5, source=source)
                else:
                    st, _, _ = post(port, "/v1/chat/completions", chat, timeout=5, source=source)
            except OSError as e:
                st = repr(e)
            dt = time.time() - t0
            worst = max(worst, dt)
            n += 1
            if st != 200 or dt > GOOD_BOUND:
                bad.append((what, source, st, round(dt, 3)))
        time.sleep(0.2)
    return n, worst, bad


def test_exhaustion(binary, model, n):
    if not raise_nofile(n):
        check(f"exhaustion: room for {n} sockets (ulimit -Hn)", not os.environ.get("CI"), resource.getrlimit(resource.RLIMIT_NOFILE))
        return
    srv = Server(binary, model, "--context", 512, "--threads", 2, "--request-timeout", REQUEST_TIMEOUT,
                 "--timeout", 120, "--max-connections-per-ip", PER_IP, "--quiet")
    socks, closed = [], set()
    stop = threading.Event()
    try:
        t_open = time.time()
        for i in range(n):
            socks.append(open_from(f"127.0.0.{2 + i // PER_IP}", srv.port))
        t_opened = time.time() - t_open
        m = wait_open(srv.port, n)
        check(f"exhaustion: the server holds {n} slow connections from {n // PER_IP} addresses (opened in "
              f"{t_opened:.1f} s)", m["calla_connections_open"] >= n, m["calla_connections_open"])
        check("exhaustion: none closed to make room", m["calla_connections_evicted_total"] == 0,
              m["calla_connections_evicted_total"])

        def drip():   # a header line per connection every DRIP_EVERY seconds; every 4th stays silent
            k = 0
            while not stop.is_set():
                for i, s in enumerate(socks):
                    if i % 4 == 3 or i in closed:
                        continue
                    line = b"GET /health HTTP/1.1\r\n" if k == 0 else b"X-Drip-%d: x\r\n" % k
                    try:
                        s.send(line)
                    except OSError:
                        closed.add(i)
                k += 1
                stop.wait(DRIP_EVERY)

        dripper = threading.Thread(target=drip, daemon=True)
        dripper.start()

        # The well-behaved clients, while the drip goes on: one on its own address, one on a full one
        # (which asks only /health: two clients' generations would queue behind each other).
        until = t_open + REQUEST_TIMEOUT - 1.5
        res = {}
        other = threading.Thread(target=lambda: res.update(full=good_requests(srv.port, "127.0.0.2", until, ("health",))),
                                 daemon=True)
        other.start()
        n_good, worst, bad = good_requests(srv.port, "127.0.0.1", until)
        other.join(30)
        n_full, worst_full, bad_full = res.get("full", (0, 0, ["no result"]))
        check(f"exhaustion: {n_good} well-behaved requests each answered within {GOOD_BOUND} s (worst {worst:.3f} s)",
              not bad and n_good >= 4, bad[:10])
        check(f"exhaustion: {n_full} from a full address, each within {GOOD_BOUND} s (worst {worst_full:.3f} s)",
              not bad_full and n_full >= 4, bad_full[:10])
        closed |= closed_by_server(socks, closed)
        m = metrics(srv.port)
        # (each of its connections may close one: the previous one can still be open when the next comes)
        gone = sorted(i for i in closed if i < PER_IP)
        check("exhaustion: the full address's oldest idle connections were closed to let it in, no others",
              1 <= m["calla_connections_evicted_total"] <= n_full and gone == list(range(len(gone))) and gone
              and len(closed) == len(gone), (m["calla_connections_evicted_total"], gone[:10], len(closed)))

        # The request deadline: every slow connection is closed by the server.
        deadline = t_open + REQUEST_TIMEOUT + 15
        while time.time() < deadline and len(closed) < n:
            closed |= closed_by_server(socks, closed)
            time.sleep(0.2)
        t_closed = time.time() - t_open
        check(f"exhaustion: all {n} slow connections closed by --request-timeout {REQUEST_TIMEOUT} "
              f"(after {t_closed:.1f} s)", len(closed) == n, (len(closed), t_closed))
        stop.set()
        dripper.join(10)
        m = metrics(srv.port)
        check("exhaustion: calla_connections_timed_out_total and _evicted_total count them",
              m["calla_connections_timed_out_total"] + m["calla_connections_evicted_total"] >= n,
              (m["calla_connections_timed_out_total"], m["calla_connections_evicted_total"]))
        st, _, _ = request(srv.port, "GET", "/health", timeout=5)
        check("exhaustion: the server is alive after", st == 200 and srv.proc.poll() is None, st)
    finally:
        stop.set()
        for s in socks:
            s.close()
        srv.close("exhaustion server")


def test_pressure(binary, model):
    limit, batch = 300, 100
    srv = Server(binary, model, "--context", 512, "--threads", 2, "--max-connections", limit,
                 "--max-connections-per-ip", 4 * limit, "--request-timeout", 60, "--quiet")
    socks = []
    try:
        # A stream that runs through all of it: its connection is busy, never closed for room.
        s = socket.create_connection((HOST, srv.port), timeout=120, source_address=("127.0.1.1", 0))
        body = json.dumps({"prompt": [7, 8, 9], "max_tokens": 200, "stream": True}).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        got = b""
        while b"data: " not in got:
            got += s.recv(4096)
        # Four batches of idle connections, each in before the next (so each is older than the next).
        for b in range(4):
            for i in range(batch):
                socks.append(open_from(f"127.0.1.{10 + b}", srv.port))
            wait_open(srv.port, 1 + (b + 1) * batch, limit=limit)
        time.sleep(0.5)
        closed = closed_by_server(socks, set())
        m = metrics(srv.port)
        # 401 connections for 300 places, and each /metrics asked meanwhile one more: the first
        # batch and then the oldest of the second, not one of the last two.
        check(f"pressure: past --max-connections {limit}, the oldest idle connections were closed, the newest kept",
              set(range(batch)) <= closed and max(closed) < 2 * batch and m["calla_connections_open"] <= limit,
              (len(closed), max(closed, default=None), m["calla_connections_open"]))
        while b"data: [DONE]" not in got:
            d = s.recv(65536)
            if not d:
                break
            got += d
        s.close()
        check("pressure: the stream in flight was never closed for room", b"data: [DONE]" in got, got[-300:])
        n_good, worst, bad = good_requests(srv.port, "127.0.0.1", time.time() + 1.5)
        check(f"pressure: {n_good} well-behaved requests at the limit each within {GOOD_BOUND} s (worst {worst:.3f} s)",
              not bad and n_good >= 4, bad)
    finally:
        for x in socks:
            x.close()
        srv.close("pressure server")


def send_completion(port, body, close=None):
    """A raw non-streaming request; close: 'fin' (close() at once), 'half' (shutdown(SHUT_WR)) or None."""
    s = socket.create_connection((HOST, port), timeout=120)
    b = json.dumps(body).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Connection: close\r\nContent-Length: " + str(len(b)).encode() + b"\r\n\r\n" + b)
    if close == "fin":
        s.close()
        return None
    if close == "half":
        s.shutdown(socket.SHUT_WR)
    return s


def read_all(s):
    out = read_to_end(s)
    s.close()
    return out


def dechunk(body):
    out = b""
    while body:
        size, _, rest = body.partition(b"\r\n")
        k = int(size, 16)
        if k == 0:
            return out, True
        out += rest[:k]
        body = rest[k + 2:]
    return out, False


def test_abandoned(binary, model):
    srv = Server(binary, model, "--context", 4096, "--threads", 2)
    try:
        t0 = time.time()
        st, _, j = post(srv.port, "/v1/completions", {"prompt": [3, 4], "max_tokens": 2}, timeout=60)
        idle = time.time() - t0
        m0 = metrics(srv.port)
        for k in range(6):   # six abandoned requests: the client closes (FIN) right after sending
            send_completion(srv.port, {"prompt": [60 + k, 61, 62], "max_tokens": 3000}, close="fin")
        time.sleep(0.2)
        t0 = time.time()
        st, _, j = post(srv.port, "/v1/completions", {"prompt": [3, 5], "max_tokens": 2}, timeout=120)
        dt = time.time() - t0
        bound = idle + 4.0   # the close seen (a tick), the probe a second after queueing, its reset, a step
        check(f"abandoned: the next client served in {dt:.2f} s after six abandoned 3,000-token requests "
              f"(bound {bound:.2f} s)", st == 200 and dt < bound, (st, dt, j))
        deadline = time.time() + 20
        m1 = metrics(srv.port)
        while m1["calla_cancelled_total"] < m0["calla_cancelled_total"] + 6 and time.time() < deadline:
            time.sleep(0.1)
            m1 = metrics(srv.port)
        gen = m1["calla_generated_tokens_total"] - m0["calla_generated_tokens_total"]
        check("abandoned: all six cancelled, few tokens generated for them",
              m1["calla_cancelled_total"] == m0["calla_cancelled_total"] + 6 and gen < 600, (m1["calla_cancelled_total"] -
                                                                                           m0["calla_cancelled_total"], gen))
        # A half-closed client of a long answer is still there: the answer starts early (spaces
        # before the document, chunked) and comes whole.  Long: the early start waits PROBE_AFTER_S
        # (1 s) and then for the tick's next look (up to 0.25 s later), so the answer is sized from
        # this machine's decode step to take 2.5 s (80 tokens took 1.15 s on a quiet 2-core one).
        m0 = metrics(srv.port)
        post(srv.port, "/v1/completions", {"prompt": [11, 12, 13], "max_tokens": 32}, timeout=60)
        m1 = metrics(srv.port)
        step = (m1["calla_decode_seconds_total"] - m0["calla_decode_seconds_total"]) / max(
            m1["calla_generated_tokens_total"] - m0["calla_generated_tokens_total"] - 1, 1)
        n_long = min(max(80, int(2.5 / max(step, 1e-4)) + 1), 2000)
        m0 = metrics(srv.port)
        reply = read_all(send_completion(srv.port, {"prompt": [71, 72, 73], "max_tokens": n_long}, close="half"))
        head, _, body = reply.partition(b"\r\n\r\n")
        doc, whole = dechunk(body) if b"transfer-encoding: chunked" in head.lower() else (body, False)
        try:
            j = json.loads(doc)
        except ValueError:
            j = None
        m1 = metrics(srv.port)
        check("half-close, long answer: 200, chunked, spaces before the whole document, not cancelled",
              head.startswith(b"HTTP/1.1 200") and whole and doc[:1] == b" " and j is not None
              and j["usage"]["completion_tokens"] == n_long and m1["calla_cancelled_total"] == m0["calla_cancelled_total"],
              (n_long, head, doc[:200]))
        # Four at once, three times over: each is suspended, resumed and answered whole (MHD must
        # never read the end of their stream as a hang-up while they wait).
        m0 = metrics(srv.port)
        got = []
        for r in range(3):
            socks = [send_completion(srv.port, {"prompt": [80 + k, 81 + r], "max_tokens": 6}, close="half") for k in range(4)]
            got += [read_all(x) for x in socks]
        m1 = metrics(srv.port)
        check("half-close: twelve clients, four at a time, each answered whole, none cancelled",
              all(b'"completion_tokens":6' in x for x in got) and m1["calla_cancelled_total"] == m0["calla_cancelled_total"],
              [x[:80] for x in got if b'"completion_tokens":6' not in x])
        # The same, streamed: every event, then [DONE].
        s = socket.create_connection((HOST, srv.port), timeout=120)
        b = json.dumps({"prompt": [74, 75], "max_tokens": 60, "stream": True}).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Connection: close\r\nContent-Length: " + str(len(b)).encode() + b"\r\n\r\n" + b)
        s.shutdown(socket.SHUT_WR)
        reply = read_all(s)
        events = re.findall(rb"data: (\{.*?\})\n\n", reply)
        check("half-close, stream: every event and [DONE]", b"data: [DONE]" in reply and
              json.loads(events[-1])["timings"]["generated_tokens"] == 60, reply[-300:])
    finally:
        srv.close("abandoned-requests server")


class EarlyAnswer(http.server.BaseHTTPRequestHandler):
    """Answers as Calla answers a half-closed client's long request: 200, chunked, spaces, then the document."""
    protocol_version = "HTTP/1.1"
    DOC = {"id": "cmpl-x", "object": "text_completion", "created": 1, "model": "m",
           "choices": [{"index": 0, "text": "hi", "finish_reason": "length", "logprobs": None}],
           "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for piece in (b" ", b" ", json.dumps(self.DOC).encode()):
            self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.wfile.flush()
            time.sleep(0.05)
        self.wfile.write(b"0\r\n\r\n")

    def log_message(self, *a):
        pass


def test_early_answer_clients():
    """The openai client and curl take an answer that starts with spaces (JSON allows them)."""
    httpd = http.server.ThreadingHTTPServer((HOST, 0), EarlyAnswer)
    th = threading.Thread(target=httpd.serve_forever, daemon=True)
    th.start()
    try:
        port = httpd.server_address[1]
        try:
            import openai
            r = openai.OpenAI(base_url=f"http://{HOST}:{port}/v1", api_key="x", max_retries=0).completions.create(
                model="m", prompt="a", max_tokens=1)
            check("early answer: the openai client parses spaces + the document", r.choices[0].text == "hi", r)
        except ImportError:
            check("openai client installed (pip install openai)", not os.environ.get("CI"))
        if shutil.which("curl"):
            p = subprocess.run(["curl", "-sS", "-m", "10", f"http://{HOST}:{port}/v1/completions", "-H",
                                "Content-Type: application/json", "-d", "{}"], capture_output=True, timeout=20)
            try:
                ok = p.returncode == 0 and json.loads(p.stdout)["choices"][0]["text"] == "hi"
            except ValueError:
                ok = False
            check("early answer: curl reads spaces + the document", ok, p)
    finally:
        httpd.shutdown()


def stream_ttft(port, body, hang_up=False):
    """Sends a streamed completion; returns (seconds to the first data event, the socket or None)."""
    s = socket.create_connection((HOST, port), timeout=60)
    b = json.dumps(dict(body, stream=True)).encode()
    t0 = time.time()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Connection: close\r\nContent-Length: " + str(len(b)).encode() + b"\r\n\r\n" + b)
    got = b""
    while b"data: " not in got:
        d = s.recv(4096)
        if not d:
            break
        got += d
    dt = time.time() - t0
    if hang_up:
        return dt, s
    while s.recv(65536):   # read to the end
        pass
    s.close()
    return dt, None


def test_cancel(binary, model):
    srv = Server(binary, model, "--context", 4096, "--threads", 2)
    try:
        # The decode step on this geometry and machine: a 64-token generation.
        m0 = metrics(srv.port)
        post(srv.port, "/v1/completions", {"prompt": [11, 12, 13], "max_tokens": 64}, timeout=60)
        m1 = metrics(srv.port)
        gen = m1["calla_generated_tokens_total"] - m0["calla_generated_tokens_total"]
        step = (m1["calla_decode_seconds_total"] - m0["calla_decode_seconds_total"]) / max(gen - 1, 1)
        # An idle server's time to first token for the short prompt used below (the worst of 3).
        idle = max(stream_ttft(srv.port, {"prompt": [5, 6, 7 + k], "max_tokens": 1})[0] for k in range(3))
        # The bound on the next request's time to first token after a hang-up: the idle TTFT, plus
        # the steps the hang-up takes to be seen (the next token's write draws the reset: 1 step;
        # the worker sees it before its next step: 1 more; 2 more of margin), plus 0.25 s for the
        # scheduling jitter of 2 shared cores.
        bound = idle + 4 * step + 0.25
        print(f"cancel: decode step {1e3 * step:.2f} ms ({gen:.0f} tokens), idle TTFT {1e3 * idle:.1f} ms, "
              f"bound {1e3 * bound:.1f} ms", flush=True)

        m2 = metrics(srv.port)
        _, s = stream_ttft(srv.port, {"prompt": [31, 32, 33], "max_tokens": 3000}, hang_up=True)
        s.close()   # a plain close after the first chunk
        ttft, _ = stream_ttft(srv.port, {"prompt": [5, 6, 20], "max_tokens": 1})
        m3 = metrics(srv.port)
        deadline = time.time() + 10
        while m3["calla_cancelled_total"] == m2["calla_cancelled_total"] and time.time() < deadline:
            time.sleep(0.05)
            m3 = metrics(srv.port)
        gen = m3["calla_generated_tokens_total"] - m2["calla_generated_tokens_total"]
        check("cancel: a hang-up after the first chunk cancels the generation",
              m3["calla_cancelled_total"] == m2["calla_cancelled_total"] + 1 and gen < 3000, gen)
        check(f"cancel: the next request's first token in {1e3 * ttft:.1f} ms (bound {1e3 * bound:.1f} ms)",
              ttft < bound, (ttft, bound))
        check("cancel: the log says cancelled", "cancelled" in srv.text(), srv.text()[-2000:])
    finally:
        srv.close("cancel server")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--quick", action="store_true", help="2,000 connections instead of 10,000 (sanitizer builds)")
    ap.add_argument("--connections", type=int, help="dripping connections (a multiple of 100; default 10,000)")
    a = ap.parse_args()
    t0 = time.time()
    test_exhaustion(a.bin, a.model, a.connections or (2000 if a.quick else 10000))
    test_pressure(a.bin, a.model)
    test_abandoned(a.bin, a.model)
    test_early_answer_clients()
    test_cancel(a.bin, a.model)
    print(f"test_connections.py: {RESULTS['ok']} checks ok, {RESULTS['fail']} failed in {time.time() - t0:.0f} s"
          + (" (" + ", ".join(FAILURES) + ")" if FAILURES else ""), flush=True)
    return 1 if RESULTS["fail"] else 0


if __name__ == "__main__":
    sys.exit(main())

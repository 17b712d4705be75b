#!/usr/bin/env python3
"""test_connections.py: connection exhaustion and cancellation (issue 14, items 7 and 5).

Python 3 standard library only.  Run by build/tests/test_server (tests/test_server.c) after
tests/test_server.py; by hand:
    python3 tests/test_connections.py --bin build/calla --model DIR [--quick]

1. Connection exhaustion: N (1,000; --quick 200) connections that send a request's headers one
   line a second (a quarter of them send nothing at all), from 127.0.0.2, 127.0.0.3, ... (Linux
   routes all of 127/8 to lo), 32 per address (the default --max-connections-per-ip).  Meanwhile a
   well-behaved client on 127.0.0.1 sends GET /health and a small chat completion: each must be
   answered within 1 s.  A 33rd connection from one of the dripping addresses is refused (the
   per-address limit); every dripping connection is closed by the server once --request-timeout
   is past (the idle timeout alone never fires: they are never idle that long); the server is
   alive after.
2. Cancellation: a streamed request with a large max_tokens whose client hangs up after the first
   chunk is cancelled (calla_cancelled_total), and the next request's first token comes within
   the bound written down in test_cancel.
Exit status 0 only if every check passed.
"""
import argparse
import json
import os
import resource
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_server import HOST, RESULTS, FAILURES, Server, check, metrics, post, request  # noqa: E402

PER_IP = 32          # the server's default --max-connections-per-ip
REQUEST_TIMEOUT = 6  # --request-timeout given to the server, seconds
DRIP_EVERY = 1.0     # seconds between two header lines of a dripping connection (< the idle timeout)
GOOD_BOUND = 1.0     # seconds: a well-behaved request's answer


def raise_nofile(n):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < n + 256:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def server_closed(s):
    """True when the server has closed this (non-blocking) socket."""
    try:
        return s.recv(4096) == b""   # data (an error page) would also mean it answered; treat as open
    except BlockingIOError:
        return False
    except OSError:
        return True


def test_exhaustion(binary, model, n):
    raise_nofile(n)
    srv = Server(binary, model, "--context", 512, "--threads", 2, "--request-timeout", REQUEST_TIMEOUT,
                 "--timeout", 120, "--max-connections", 2 * n + 64, "--quiet")
    socks, closed = [], set()
    stop = threading.Event()
    try:
        t_open = time.time()
        for i in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((f"127.0.0.{2 + i // PER_IP}", 0))
            s.connect((HOST, srv.port))
            s.setblocking(False)
            socks.append(s)
        # Every one is held by the server (the ceiling is in the thousands).
        deadline = time.time() + 30
        m = metrics(srv.port)
        while m["calla_connections_open"] < n and time.time() < deadline:
            time.sleep(0.1)
            m = metrics(srv.port)
        check(f"exhaustion: the server holds {n} slow connections", m["calla_connections_open"] >= n,
              m["calla_connections_open"])

        # The per-address limit: one more from a full address is closed at once.
        extra = socket.create_connection((HOST, srv.port), timeout=3, source_address=("127.0.0.2", 0))
        try:
            refused = extra.recv(4096) == b""
        except (socket.timeout, OSError) as e:
            refused = not isinstance(e, socket.timeout)
        extra.close()
        check(f"exhaustion: connection {PER_IP + 1} from one address is refused", refused)

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

        # The well-behaved client, while the drip goes on (until the deadline has passed).
        worst, n_good, bad = 0.0, 0, []
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        while time.time() - t_open < REQUEST_TIMEOUT - 1:
            for what in ("health", "chat"):
                t0 = time.time()
                try:
                    if what == "health":
                        st, _, _ = request(srv.port, "GET", "/health", timeout=5)
                    else:
                        st, _, _ = post(srv.port, "/v1/chat/completions", chat, timeout=5)
                except OSError as e:
                    st = repr(e)
                dt = time.time() - t0
                worst = max(worst, dt)
                n_good += 1
                if st != 200 or dt > GOOD_BOUND:
                    bad.append((what, st, round(dt, 3)))
            time.sleep(0.2)
        check(f"exhaustion: {n_good} well-behaved requests each answered within {GOOD_BOUND} s (worst {worst:.3f} s)",
              not bad and n_good >= 4, bad[:10])

        # The request deadline: every slow connection is closed by the server.
        deadline = t_open + REQUEST_TIMEOUT + 10
        while time.time() < deadline:
            for i, s in enumerate(socks):
                if i not in closed and server_closed(s):
                    closed.add(i)
            if len(closed) == n:
                break
            time.sleep(0.2)
        t_closed = time.time() - t_open
        check(f"exhaustion: all {n} slow connections closed by --request-timeout {REQUEST_TIMEOUT} "
              f"(after {t_closed:.1f} s)", len(closed) == n, (len(closed), t_closed))
        stop.set()
        dripper.join(10)
        m = metrics(srv.port)
        check("exhaustion: calla_connections_timed_out_total counts them",
              m["calla_connections_timed_out_total"] >= n, m["calla_connections_timed_out_total"])
        st, _, _ = request(srv.port, "GET", "/health", timeout=5)
        check("exhaustion: the server is alive after", st == 200 and srv.proc.poll() is None, st)
    finally:
        stop.set()
        for s in socks:
            s.close()
        srv.close("exhaustion server")


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
    ap.add_argument("--quick", action="store_true", help="200 connections instead of 1,000 (sanitizer builds)")
    a = ap.parse_args()
    t0 = time.time()
    test_exhaustion(a.bin, a.model, 200 if a.quick else 1000)
    test_cancel(a.bin, a.model)
    print(f"test_connections.py: {RESULTS['ok']} checks ok, {RESULTS['fail']} failed in {time.time() - t0:.0f} s"
          + (" (" + ", ".join(FAILURES) + ")" if FAILURES else ""), flush=True)
    return 1 if RESULTS["fail"] else 0


if __name__ == "__main__":
    sys.exit(main())

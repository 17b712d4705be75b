#!/usr/bin/env python3
"""test_cluster.py: Calla replicas behind a real HAProxy (tools/cluster.sh, deploy/haproxy.cfg).

Python 3 standard library only.  Run by build/tests/test_cluster (tests/test_cluster.c), which
makes a tiny synthetic checkpoint; by hand:
    python3 tests/test_cluster.py --bin build/calla --model DIR

Checks, through the balancer, on the CPU backend:
  - affinity: a conversation's second turn (X-Session-Id, or `user` only) lands on the replica of
    its first and reports cached prompt tokens; different sessions spread over the replicas;
  - 16 concurrent clients x 10 requests, all answered with the tokens a lone request gets, and no
    503 inside a replica (the excess waits in HAProxy: maxconn = --queue);
  - a full replica's 503 (Retry-After) is retried by HAProxy on another replica;
  - SIGKILL of one replica under load: every request gets an answer or a clean 5xx (clients
    retry), nothing hangs, and new conversations go to the survivor;
  - stopping tools/cluster.sh stops every process it started.
Without haproxy the test is skipped, except under CI=true, where it fails.
"""
import argparse
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HOST = "127.0.0.1"
TIMEOUT = 60            # seconds, per request: nothing may hang
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_server import RESULTS, FAILURES, check  # noqa: E402  (one checker and tally for the suites)


def request(port, method, path, body=None, headers=None, timeout=TIMEOUT):
    """-> (status, headers dict (lower-case names), parsed JSON or None)."""
    c = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        h = {"Content-Type": "application/json"} if body is not None else {}
        h.update(headers or {})
        c.request(method, path, body=json.dumps(body).encode() if body is not None else None, headers=h)
        r = c.getresponse()
        b = r.read()
        try:
            j = json.loads(b)
        except ValueError:
            j = None
        return r.status, {k.lower(): v for k, v in r.getheaders()}, j
    finally:
        c.close()


def with_retries(fn, tries=8):
    """A client that retries on a 5xx or a broken connection, as clients of a balancer must.
    -> (status, headers, json, attempts); status 0 when the connection failed every time."""
    for k in range(1, tries + 1):
        try:
            st, h, j = fn()
        except (OSError, http.client.HTTPException):
            st, h, j = 0, {}, None
        if 200 <= st < 500:
            return st, h, j, k
        time.sleep(min(float(h.get("retry-after", 0.2)), 1.0))
    return st, h, j, tries


def metrics(port):
    c = http.client.HTTPConnection(HOST, port, timeout=10)
    try:
        c.request("GET", "/metrics")
        text = c.getresponse().read().decode()
    finally:
        c.close()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:   # a zombie of ours is not alive
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


class Cluster:
    """tools/cluster.sh N on the CPU backend, ephemeral ports, its own directory."""

    def __init__(self, binary, model, n, *flags, serve=()):
        self.dir = tempfile.mkdtemp(prefix="calla_cluster_test_")
        self.log = open(os.path.join(self.dir, "cluster.log"), "w+")
        env = dict(os.environ, OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "passive"))
        args = ["bash", os.path.join(ROOT, "tools/cluster.sh"), str(n), "--model", model, "--bin", binary,
                "--backend", "cpu", "--threads", "1", "--port", "0", "--dir", self.dir, *map(str, flags),
                "--", "--context", "1024", "--default-max-tokens", "8", *map(str, serve)]
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=self.log, stdin=subprocess.DEVNULL, env=env)
        envf = os.path.join(self.dir, "cluster.env")
        deadline = time.time() + 90
        while not os.path.exists(envf) and self.proc.poll() is None and time.time() < deadline:
            time.sleep(0.1)
        if not os.path.exists(envf):
            self.stop()
            raise RuntimeError("cluster did not start:\n" + self.text())
        time.sleep(0.1)   # the file is written in one go; let it land
        kv = {}
        for line in open(envf):
            k, v = line.strip().split("=", 1)
            kv[k] = v.strip('"')
        self.port = int(kv["LB_PORT"])
        self.replica_ports = [int(p) for p in kv["REPLICA_PORTS"].split()]
        self.replica_pids = [int(p) for p in kv["REPLICA_PIDS"].split()]
        self.haproxy_pid = int(kv["HAPROXY_PID"])
        self.pids = self.replica_pids + [self.haproxy_pid]

    def text(self):
        self.log.flush()
        with open(self.log.name, errors="replace") as f:
            return f.read()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def cleanup(self):
        self.stop()
        for p in getattr(self, "pids", []):   # a failed test must not leave processes behind
            if alive(p):
                os.kill(p, signal.SIGKILL)
        shutil.rmtree(self.dir, ignore_errors=True)


def chat(port, messages, session=None, user=None, max_tokens=4):
    body = {"messages": messages, "max_tokens": max_tokens}
    if user:
        body["user"] = user
    return request(port, "POST", "/v1/chat/completions", body, headers={"X-Session-Id": session} if session else {})


def turn2(messages, reply):
    m = reply["choices"][0]["message"]
    return messages + [{"role": "assistant", "content": m.get("content") or ""},
                       {"role": "user", "content": "and a second question about the same thing"}]


# ---- tests -----------------------------------------------------------------------------------

def test_affinity(cl):
    hit = 0
    for key in ("header", "user"):
        for k in range(4):
            sid = f"{key}-conversation-{k}"
            m1 = [{"role": "user", "content": f"a first question, number {k}, with a few words to cache"}]
            kw = {"session": sid} if key == "header" else {"user": sid}
            st1, h1, j1 = chat(cl.port, m1, **kw)
            st2, h2, j2 = chat(cl.port, turn2(m1, j1), **kw) if st1 == 200 else (0, {}, None)
            ok = st1 == 200 and st2 == 200 and h1.get("x-calla-replica") == h2.get("x-calla-replica")
            cached = j2["usage"]["prompt_tokens_details"]["cached_tokens"] if ok else -1
            ok = ok and cached > 0 and h2.get("x-session-id") == sid
            hit += ok
            check(f"affinity ({key}) {k}: turn 2 on turn 1's replica {h1.get('x-calla-replica')}, "
                  f"cached_tokens {cached}", ok, (st1, h1, st2, h2, j2))
    seen = set()
    for k in range(16):
        st, h, _ = request(cl.port, "POST", "/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 1},
                           headers={"X-Session-Id": f"spread-{k}"})
        seen.add(h.get("x-calla-replica"))
    check("sessions spread over both replicas", seen == {"r0", "r1"}, seen)


def test_concurrent(cl, clients=16, per_client=10):
    prompts = [[1, 2, 3, 10 + k] for k in range(8)]
    want = {}
    for p in prompts:   # a lone request's answer (greedy: the same wherever and whenever it runs)
        st, _, j = request(cl.replica_ports[0], "POST", "/v1/completions",
                           {"prompt": p, "max_tokens": 4, "return_token_ids": True})
        want[tuple(p)] = j["choices"][0]["token_ids"] if st == 200 else None
    bad, errors = [], []
    served = {}

    def client(i):
        for r in range(per_client):
            p = prompts[(i + r) % len(prompts)]
            try:
                st, h, j = request(cl.port, "POST", "/v1/completions",
                                   {"prompt": p, "max_tokens": 4, "return_token_ids": True},
                                   headers={"X-Session-Id": f"client-{i}"})
            except (OSError, http.client.HTTPException) as e:
                errors.append(repr(e))
                continue
            if st != 200 or j["choices"][0]["token_ids"] != want[tuple(p)]:
                bad.append((i, r, st, j))
            served[h.get("x-calla-replica")] = served.get(h.get("x-calla-replica"), 0) + 1

    t0 = time.time()
    th = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in th:
        t.start()
    for t in th:
        t.join(TIMEOUT * per_client)
    n = clients * per_client
    check(f"{clients} clients x {per_client} requests through HAProxy: all answered correctly "
          f"({time.time() - t0:.1f} s, by replica {served})",
          not bad and not errors and not any(t.is_alive() for t in th) and sum(served.values()) == n,
          (bad[:3], errors[:3]))
    r503 = sum(v for p in cl.replica_ports for k, v in metrics(p).items() if 'status="503"' in k)
    check("no replica answered 503: the excess waited in HAProxy (maxconn = --queue)", r503 == 0, r503)


def test_full_replica(binary, model):
    """--queue 1 behind maxconn 6: the replica a session hashes to is full and answers 503
    (Retry-After); HAProxy retries another replica; clients see an answer or a clean 503."""
    cl = Cluster(binary, model, 2, "--queue", "1", "--maxconn", "6")
    try:
        res = []

        def client(i):
            res.append(with_retries(lambda: request(cl.port, "POST", "/v1/completions",
                                                    {"prompt": [5, 6, 7, i], "max_tokens": 8},
                                                    headers={"X-Session-Id": "one-hot-session"})))

        th = [threading.Thread(target=client, args=(i,)) for i in range(12)]
        for t in th:
            t.start()
        for t in th:
            t.join(TIMEOUT * 8)
        by = {}
        for st, h, _, _ in res:
            by[h.get("x-calla-replica")] = by.get(h.get("x-calla-replica"), 0) + 1
        r503 = sum(v for p in cl.replica_ports for k, v in metrics(p).items() if 'status="503"' in k)
        check(f"full replica: all 12 answered (by replica {by}), replicas' 503s {r503:.0f} retried",
              len(res) == 12 and all(r[0] == 200 for r in res) and r503 > 0 and len(by) == 2, res[:3])
    finally:
        cl.cleanup()


def test_failover(cl):
    """SIGKILL one replica while 16 clients hold conversations through the balancer."""
    stop = threading.Event()
    outcomes, hung = [], []
    lock = threading.Lock()

    def client(i):
        msgs = [{"role": "user", "content": f"client {i} opens a conversation"}]
        for turn in range(100):
            if stop.is_set():
                break
            t0 = time.time()
            st, h, j, tries = with_retries(lambda: chat(cl.port, msgs, session=f"failover-{i}", max_tokens=2))
            with lock:
                outcomes.append((st, tries, h.get("x-calla-replica"), time.time() - t0))
            if st == 200:
                msgs = turn2(msgs, j)[-3:]   # keep it short: a few turns of context
            else:
                hung.append((i, turn, st))

    th = [threading.Thread(target=client, args=(i,)) for i in range(16)]
    for t in th:
        t.start()
    time.sleep(3)
    victim = cl.replica_pids[1]
    os.kill(victim, signal.SIGKILL)
    t_kill = time.time()
    time.sleep(6)
    stop.set()
    for t in th:
        t.join(TIMEOUT * 8)
    n_ok = sum(o[0] == 200 for o in outcomes)
    retried = sum(o[1] > 1 for o in outcomes)
    slowest = max((o[3] for o in outcomes), default=0)
    check(f"failover: {len(outcomes)} requests, {n_ok} answered, {retried} needed a client retry, "
          f"slowest {slowest:.1f} s", outcomes and n_ok == len(outcomes) and not hung
          and not any(t.is_alive() for t in th), (hung[:5], outcomes[-5:]))
    check("failover: the killed replica is gone", not alive(victim))
    time.sleep(max(0, 3 - (time.time() - t_kill)))   # HAProxy's health check has marked it down
    where = set()
    for k in range(12):
        st, h, _ = chat(cl.port, [{"role": "user", "content": f"a new conversation {k}"}], session=f"new-{k}")
        where.add((st, h.get("x-calla-replica")))
    check("failover: new conversations go to the survivor", where == {(200, "r0")}, where)
    # A conversation of the dead replica continues on the survivor, cached from its next turn on.
    m1 = [{"role": "user", "content": "moved conversation, first turn there"}]
    sids = [f"moved-{k}" for k in range(8)]
    st1, h1, j1 = chat(cl.port, m1, session=sids[0])
    st2, h2, j2 = chat(cl.port, turn2(m1, j1), session=sids[0])
    check("failover: a conversation continues on the survivor with its cache",
          st2 == 200 and h2.get("x-calla-replica") == "r0" and j2["usage"]["prompt_tokens_details"]["cached_tokens"] > 0,
          (st1, st2, h2, j2))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", required=True)
    a = ap.parse_args()
    if not shutil.which("haproxy"):
        if os.environ.get("CI"):
            check("haproxy installed (apt-get install haproxy)", False, "CI needs it")
            return 1
        print("test_cluster.py: SKIP: haproxy is not installed (apt-get install haproxy)", flush=True)
        return 0
    t0 = time.time()
    cl = Cluster(a.bin, a.model, 2)
    try:
        check("cluster.sh: 2 replicas and HAProxy up", all(alive(p) for p in cl.pids), cl.pids)
        st, _, j = request(cl.port, "GET", "/health")
        check("GET /health through HAProxy", st == 200 and j["status"] == "ok", j)
        st, _, j = request(cl.port, "POST", "/v1/completions", {"prompt": [1, 2], "max_tokens": 1},
                           headers={"Host": "api.example.com"})
        check("a client's own Host name passes the balancer (replicas on loopback get localhost)", st == 200, j)
        test_affinity(cl)
        test_concurrent(cl)
        test_failover(cl)
        rc = cl.stop()
        time.sleep(0.2)
        left = [p for p in cl.pids if alive(p)]
        check(f"cluster.sh stopped (exit {rc}) and every process it started is gone", not left, left)
    finally:
        if RESULTS["fail"]:
            print("---- cluster log ----\n" + cl.text()[-3000:], flush=True)
            for f in sorted(os.listdir(cl.dir)):
                if f.endswith(".log") and f != "cluster.log":
                    with open(os.path.join(cl.dir, f), errors="replace") as fh:
                        print(f"---- {f} (tail) ----\n" + fh.read()[-1500:], flush=True)
        cl.cleanup()
    test_full_replica(a.bin, a.model)
    print(f"test_cluster.py: {RESULTS['ok']} checks ok, {RESULTS['fail']} failed in {time.time() - t0:.0f} s"
          + (" (" + ", ".join(FAILURES) + ")" if FAILURES else ""), flush=True)
    return 1 if RESULTS["fail"] else 0


if __name__ == "__main__":
    sys.exit(main())

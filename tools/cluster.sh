#!/usr/bin/env bash
# tools/cluster.sh N: N Calla replicas and one HAProxy in front of them, on this machine, until
# SIGINT/SIGTERM (or HAProxy ends); then it stops exactly what it started (trap on EXIT).
#
#   tools/cluster.sh 2 --model DIR --backend cuda          # one replica per GPU: --device 0, 1
#   tools/cluster.sh 2 --model DIR --backend cpu --threads 1   # CI: the CPU backend
#
# Flags: --model DIR (required)  --backend cpu|cuda (default cuda)  --port P (HAProxy's; default
# 8080, 0: a free one)  --queue Q (per replica; default 8)  --maxconn M (HAProxy's per replica;
# default Q: the excess waits in HAProxy; larger only to test a full replica's 503)  --threads T (CPU)
# --balance ALGO (default: deploy/haproxy.cfg's consistent hash; `random`: no affinity, to compare)
# --dir DIR (logs, config, cluster.env; default a new /tmp/calla_cluster_XXXXXX)  --bin PATH
# (default build/calla); anything after `--` goes to every `calla serve`.
#
# Replicas listen on 127.0.0.1 at free ports (--port 0, read back from their log). The HAProxy
# config is deploy/haproxy.cfg with its `bind` and `server` lines (and `balance` when asked)
# replaced. Once all are up it writes DIR/cluster.env (LB_PORT, REPLICA_PORTS, REPLICA_PIDS,
# HAPROXY_PID) and prints "cluster: ready http://127.0.0.1:PORT".
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

usage() { sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
[ $# -ge 1 ] || usage
case $1 in ''|*[!0-9]*) usage ;; esac
n=$1; shift
[ "$n" -ge 1 ] && [ "$n" -le 64 ] || { echo "cluster: N must be 1 to 64" >&2; exit 2; }
model="" backend=cuda port=8080 queue=8 maxconn="" threads=0 balance="" dir="" bin="$root/build/calla" extra=()
while [ $# -gt 0 ]; do
    case $1 in
    --model) model=$2; shift 2 ;;
    --backend) backend=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --queue) queue=$2; shift 2 ;;
    --maxconn) maxconn=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --balance) balance=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "cluster: unknown flag $1" >&2; usage ;;
    esac
done
[ -n "$maxconn" ] || maxconn=$queue
[ -n "$model" ] || { echo "cluster: --model DIR is required" >&2; exit 2; }
[ -x "$bin" ] || { echo "cluster: $bin not found (run make)" >&2; exit 2; }
command -v haproxy >/dev/null || { echo "cluster: haproxy not found (apt-get install haproxy)" >&2; exit 2; }
[ -n "$dir" ] || dir=$(mktemp -d /tmp/calla_cluster_XXXXXX)
mkdir -p "$dir"

pids=()   # everything this script started, and only that
stop() {
    trap - EXIT INT TERM
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    # Replicas drain (finish or abort their requests) on SIGTERM; give them a moment, then KILL.
    for _ in $(seq 50); do
        alive=0
        for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
        [ $alive = 0 ] && break
        sleep 0.1
    done
    for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap stop EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The replicas: one per GPU (--device i) on cuda; on the CPU, N copies.
ports=()
for ((i = 0; i < n; i++)); do
    dev=(); [ "$backend" = cuda ] && dev=(--device "$i")
    "$bin" serve --model "$model" --backend "$backend" --threads "$threads" --port 0 --queue "$queue" \
        "${dev[@]}" "${extra[@]}" >"$dir/replica$i.log" 2>&1 &
    pids+=($!)
done
for ((i = 0; i < n; i++)); do
    p=""
    for _ in $(seq 600); do   # up to 60 s: a full checkpoint takes a while to upload
        p=$(sed -n 's/.*listening on http:\/\/[^ ]*:\([0-9][0-9]*\) .*/\1/p' "$dir/replica$i.log" | head -1)
        [ -n "$p" ] && break
        kill -0 "${pids[$i]}" 2>/dev/null || break
        sleep 0.1
    done
    if [ -z "$p" ]; then
        echo "cluster: replica $i did not start; its log ($dir/replica$i.log):" >&2
        tail -5 "$dir/replica$i.log" >&2
        exit 1
    fi
    ports+=("$p")
done

# HAProxy: deploy/haproxy.cfg with this machine's bind, servers and (maybe) balance.
if [ "$port" = 0 ]; then
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
fi
cfg="$dir/haproxy.cfg"
{
    sed -e "s/^\(    bind \).*/\1127.0.0.1:$port/" -e '/^    server /d' \
        ${balance:+-e "s/^\(    balance \).*/\1$balance/"} "$root/deploy/haproxy.cfg"
    for ((i = 0; i < n; i++)); do echo "    server r$i 127.0.0.1:${ports[$i]} maxconn $maxconn"; done
} >"$cfg"
haproxy -db -f "$cfg" >"$dir/haproxy.log" 2>&1 &
hap=$!
pids+=("$hap")
for _ in $(seq 100); do   # up to 10 s: HAProxy answers and sees every replica up
    kill -0 "$hap" 2>/dev/null || { echo "cluster: haproxy failed:" >&2; tail -5 "$dir/haproxy.log" >&2; exit 1; }
    python3 - "$port" <<'PY' 2>/dev/null && break
import sys, urllib.request
urllib.request.urlopen("http://127.0.0.1:%s/health" % sys.argv[1], timeout=1).read()
PY
    sleep 0.1
done
cat >"$dir/cluster.env" <<ENV
LB_PORT=$port
REPLICA_PORTS="${ports[*]}"
REPLICA_PIDS="${pids[*]:0:$n}"
HAPROXY_PID=$hap
ENV
echo "cluster: ready http://127.0.0.1:$port ($n replicas on ${ports[*]}, backend $backend, dir $dir)"
wait "$hap" || true
echo "cluster: haproxy ended" >&2

#!/usr/bin/env bash
# On the H200 machine, from the repo root: the conversation benchmark (docs/BENCH.md "The conversation
# benchmark"), Calla against llama.cpp's llama-server on the same GPU, one after the other, through
# `calla matrix --agentbench` (a fresh server per arm and round, the same conversation for both).
#
#   [LLAMA_SERVER=PATH] [LLAMA_TREE=.peers/llama.cpp] tools/device/agentbench.sh BUILD [ROUNDS] [AGENTBENCH FLAGS...]
#
# BUILD        a carried CUDA build of Calla (tools/device/devlibs.sh BUILD first: BUILD/devlibs holds its libraries)
# ROUNDS       rounds of both arms (default 1)
# FLAGS        passed to `calla agentbench` (default: its own: an ~8K-token system turn, 20
#              tool results of 20..4,000 tokens, 16 tokens a turn with ignore_eos, every 4th turn forced)
# LLAMA_SERVER a llama-server binary to use as it is (with the libraries it needs on LD_LIBRARY_PATH); without
#              it, llama-server is built here for sm_90a from the prepared tree (WITH_SERVER=1
#              ../shared/peers/llamacpp/prepare.sh .peers/llama.cpp, carried; the web UI off; ~6 min on 16 cores)
# LLAMA_TREE   the prepared tree (default .peers/llama.cpp): its GGUF writer and vocabulary make the random
#              Q4_K GGUF of the 35B-A3B shape (/tmp/qwen35moe-q4k.gguf, ~1 min), even with LLAMA_SERVER given
#
# Calla's full-shape synthetic checkpoint is written to /tmp/calla-full when it is not there. llama-server runs
# with flash attention, all layers on the GPU, one slot of 65,536 tokens, its context checkpoints (the prompt
# cache of a hybrid model: --ctx-checkpoints, 32 a slot, its default, said explicitly), and the Jinja template
# tools/device/qwen36-chat.jinja, which renders what src/chat.c renders. Output under $OUT: report.md (per-turn
# TTFT of both, the ratios, the wall-time target), matrix.json, and agentbench.tgz (every record and log).
# llama.cpp and its build are never committed.
set -euo pipefail
b=${1:-build}
rounds=${2:-1}
shift $(($# < 2 ? $# : 2))
flags="$*"
here=$(cd "$(dirname "$0")" && pwd)
tree=${LLAMA_TREE:-.peers/llama.cpp}
gguf=/tmp/qwen35moe-q4k.gguf
out=${OUT:-/tmp/out}
res=/tmp/agentbench-results
logs=/tmp/agentbench-logs
mkdir -p "$out" "$logs"
export LD_LIBRARY_PATH=$PWD/$b/devlibs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,power.draw --format=csv,noheader || true
[ -x "$b/calla" ] || { echo "agentbench.sh: no $b/calla (carry a CUDA build)" >&2; exit 2; }
[ -n "${LLAMA_SERVER:-}" ] || [ -f "$tree/CMakeLists.txt" ] || { echo "agentbench.sh: no llama.cpp tree at $tree and no LLAMA_SERVER" >&2; exit 2; }
[ -f "$tree/gguf_random_qwen35moe.py" ] || [ -f "$gguf" ] || { echo "agentbench.sh: no GGUF writer in $tree" >&2; exit 2; }

# the two checkpoints in the background while llama-server builds
pids=()
if [ ! -f "$gguf" ]; then
    (cd "$tree" && FULL=1 QTYPE=Q4_K VOCAB_FROM=ggml-vocab-qwen35.gguf python3 gguf_random_qwen35moe.py "$gguf") \
        >"$logs/gguf.log" 2>&1 &
    pids+=($!)
fi
if [ ! -f /tmp/calla-full/config.json ]; then
    "$b/calla" synth --geometry full --seed 1 --out /tmp/calla-full >"$logs/synth.log" 2>&1 &
    pids+=($!)
fi
server=${LLAMA_SERVER:-}
if [ -z "$server" ]; then
    build=/tmp/llama-server-build
    if [ ! -x "$build/bin/llama-server" ]; then
        echo "agentbench.sh: building llama-server (logs in $logs)"
        cmake -S "$tree" -B "$build" -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_BUILD_TYPE=Release \
            -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
            -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF >"$logs/llama-cmake.log" 2>&1
        cmake --build "$build" --target llama-server -j"$(nproc)" >"$logs/llama-build.log" 2>&1 ||
            { tail -30 "$logs/llama-build.log"; exit 1; }
    fi
    server=$build/bin/llama-server
fi
for p in ${pids[@]+"${pids[@]}"}; do wait "$p" || { tail -20 "$logs"/*.log; exit 1; }; done
"$server" --version 2>&1 | head -3 || true

rm -rf "$res"
rc=0
"$b/calla" matrix --agentbench "$flags" --engines cuda,llama-server --model /tmp/calla-full --rounds "$rounds" \
    --out "$res" --no-reference --title "Calla and llama-server: a coding agent's conversation" \
    --llama-server "$server -m $gguf -ngl 99 -fa on -c 65536 -np 1 --jinja --chat-template-file $here/qwen36-chat.jinja --ctx-checkpoints 32 --no-webui --host 127.0.0.1 --port {port}" ||
    rc=$?
cp "$res/report.md" "$res/matrix.json" "$out/" 2>/dev/null || true
cp "$logs"/*.log "$res/raw/" 2>/dev/null || true
tar czf "$out/agentbench.tgz" -C /tmp "$(basename "$res")"
sed -n '/^## Conversation/,$p' "$res/report.md" 2>/dev/null || true
exit $rc

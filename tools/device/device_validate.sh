#!/usr/bin/env bash
# On the H200 machine, with a carried build: every stage of `make gpu-check` (log under
# $OUT/gpu-check), the CUDA backend against a fresh HF fp32 fixture at the full shape (64-token
# prompt, 32 greedy steps; the fixture is built there, 35 s, and returned under $OUT) and, given
# contexts, a matrix sweep into bench/results/$SWEEP (tarred into $OUT).
# usage: tools/device/device_validate.sh BUILD [CONTEXTS [SWEEP_NAME]]
#   SKIP_VALIDATE=1 skips the checks, GOLDEN=0 the HF fixture; GPU_CHECK_STAGES as gpu_check.sh;
#   ROUNDS, FIRST_ROUND and COMPARE (a results folder for ratio tables) go to calla matrix.
set -u
b=${1:-build}
ctx=${2:-}
sweep=${3:-$(date -u +%Y-%m-%d)-h200-sweep}
export LD_LIBRARY_PATH=$PWD/$b/devlibs PYTHONUNBUFFERED=1
out=${OUT:-/tmp/out}
m=/tmp/calla-full
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
[ -f $m/config.json ] || "$b/calla" synth --geometry full --seed 1 --out $m >/dev/null
if [ -z "${SKIP_VALIDATE:-}" ]; then
    GPU_CHECK_OUT="$out/gpu-check" GPU_CHECK_BENCH_CTX=${GPU_CHECK_BENCH_CTX:-4096} bash tools/device/gpu_check.sh "$b" |
        grep -E "^(CHECK|timing|calla-cuda|flash|qmatmul|gdn|test_cuda|[a-zA-Z].* (PASS|FAIL) )|FAIL" | cut -c1-230
    if [ "${GOLDEN:-1}" = 1 ]; then
        timeout 400 python3 tools/gen/make_golden.py --calla "$b/calla" --geometries full --device cuda --dtype float32 \
            --model-dir $m --prompts 64 --gen 32 --out "$out/golden-full" >"$out/golden-full-make.log" 2>&1
        echo "make_golden full 64+32: rc $?"
        CALLA_GOLDEN_FILES=$(ls "$out"/golden-full/*.golden | tr '\n' ':') CALLA_GOLDEN_MODEL=$m CALLA_BACKEND=cuda \
            "$b/tests/test_golden" >"$out/golden-full-cuda.log" 2>&1
        echo "golden full 64+32 cuda: rc $?"
        grep -E "nerr|continuation|ERROR" "$out/golden-full-cuda.log" | cut -c1-200
    fi
fi
if [ -n "$ctx" ]; then
    sleep 5   # preflight refuses a GPU that is still busy
    "$b/calla" matrix --model $m --engines cuda --contexts "$ctx" --decode 64 --rounds ${ROUNDS:-2} \
        --first-round ${FIRST_ROUND:-1} --cooldown-min-s 5 --cooldown-max-s 30 --run-timeout-s 500 \
        --out "bench/results/$sweep" ${COMPARE:+--compare "$COMPARE"} --title "Calla on one H200 (synthetic full-shape checkpoint)" 2>&1 | tail -12
    tar czf "$out/sweep.tgz" -C bench/results "$sweep"
fi

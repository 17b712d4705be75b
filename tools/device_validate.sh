#!/usr/bin/env bash
# On the H200 machine, with a carried build: the full-shape validation of both backends
# (CUDA vs CPU end to end with the measured noise floors; CPU and CUDA vs the HF fp32 fixture)
# and, given contexts, a matrix sweep into bench/results/$SWEEP (tarred into $OUT).
# usage: tools/device_validate.sh BUILD "4096,16384" [SWEEP_NAME]
set -u
b=${1:-build}
ctx=${2:-}
sweep=${3:-2026-11-29-h200-sweep}
export LD_LIBRARY_PATH=$PWD/$b/devlibs
out=${OUT:-/tmp/out}
m=/tmp/calla-full
[ -f $m/config.json ] || "$b/calla" synth --geometry full --seed 1 --out $m
if [ -z "${SKIP_VALIDATE:-}" ]; then
    "$b/gpu/test_cuda_e2e" $m 64 32 >"$out/e2e-full.log" 2>&1
    grep -E "^(CHECK|INFO|#)" "$out/e2e-full.log" | cut -c1-220
    for be in cpu cuda; do
        CALLA_GOLDEN_FILES=tests/golden-full/full-p16-float32.golden CALLA_GOLDEN_MODEL=$m CALLA_BACKEND=$be \
            "$b/tests/test_golden" >"$out/golden-full-$be.log" 2>&1
        echo "golden full $be: rc $?"; grep -E "nerr|continuation|ERROR" "$out/golden-full-$be.log"
    done
fi
if [ -n "$ctx" ]; then
    "$b/calla" matrix --model $m --engines cuda --contexts "$ctx" --decode 64 --rounds 2 --cooldown-min-s 5 \
        --cooldown-max-s 30 --run-timeout-s 400 --out "bench/results/$sweep" \
        --title "Calla on one H200 (synthetic full-shape checkpoint)" 2>&1 | tail -15
    tar czf "$out/sweep.tgz" -C bench/results "$sweep"
fi

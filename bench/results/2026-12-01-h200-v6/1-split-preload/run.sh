#!/usr/bin/env bash
# session 13 call 1: decode preload + one-wave split + one-trip RMS staging; checks, A/B, profiles
set -u
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
tar xJf .carry/b.txz
export LD_LIBRARY_PATH=$PWD/build-carry/devlibs
B=build-carry
rm -rf /tmp/calla-full
( $B/calla synth --geometry full --seed 1 --out /tmp/calla-full >/tmp/synth.log 2>&1; echo synth rc $? >>/tmp/synth.log ) &
SP=$!
GPU_CHECK_OUT=$OUT GPU_CHECK_STAGES="kernels decode" tools/gpu_check.sh $B > $OUT/checks.txt 2>&1
el checks; grep -E "FAIL" $OUT/checks.txt | head -20; tail -8 $OUT/checks.txt
if grep -qE "^decode.* FAIL" $OUT/checks.txt; then echo "decode checks failed: stop"; grep -B5 -A5 FAIL $OUT/checks.txt | head -60; exit 4; fi
wait $SP; el "$(tail -1 /tmp/synth.log)"
timeout 120 $B/gpu/test_cuda_decode e2e /tmp/calla-full 4096 32 > $OUT/paths-full-4096.txt 2>&1; echo "paths rc $?"; tail -9 $OUT/paths-full-4096.txt
el paths
b() { # label env... ctx
  local lab=$1 ctx=$2; shift 2
  env "$@" timeout 150 $B/calla bench --model /tmp/calla-full --context $ctx --decode 64 --backend cuda --json $OUT/bench-$ctx-$lab.json 2>&1 | tail -1 | sed "s/^/[$lab] /; s/, rss.*//"
}
b new 4096 X=1; b pre0 4096 CALLA_DV_PRE=0; b split1 4096 CALLA_TC_SPLIT=1; b split0pre0 4096 CALLA_TC_SPLIT=0 CALLA_DV_PRE=0
b new 65536 X=1; b pre0 65536 CALLA_DV_PRE=0
el bench
ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv \
    $B/gpu/test_cuda_decode profile /tmp/calla-full 4096 >$OUT/ncu-step.csv 2>$OUT/ncu-step.err
python3 .carry/ncusum.py $OUT/ncu-step.csv | head -20
el ncu-decode
ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv -c 1600 \
    $B/calla bench --model /tmp/calla-full --context 4096 --decode 1 --backend cuda >$OUT/ncu-prefill.csv 2>$OUT/ncu-prefill.err
python3 .carry/ncusum.py $OUT/ncu-prefill.csv | head -40
el ncu-prefill

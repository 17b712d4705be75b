#!/usr/bin/env bash
# session 13 call 4: prefill products with bf16 weights: kernel checks, speeds, bench, layers N=512
set -u
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
rm -rf build-carry; tar xJf .carry/b.txz
export LD_LIBRARY_PATH=$PWD/build-carry/devlibs
B=build-carry
[ -f /tmp/calla-full/config.json ] || $B/calla synth --geometry full --seed 1 --out /tmp/calla-full >/tmp/synth.log 2>&1
el synth
timeout 200 $B/gpu/bench_cuda_kernels 4096 > $OUT/kspeed.txt 2>&1; grep -E "qmatmul" $OUT/kspeed.txt
el kspeed
for c in 4096 65536; do timeout 150 $B/calla bench --model /tmp/calla-full --context $c --decode 64 --backend cuda --json $OUT/bench-$c.json 2>&1 | tail -1 | sed 's/, rss.*//'; done
el bench
GPU_CHECK_OUT=$OUT GPU_CHECK_STAGES="kernels" tools/gpu_check.sh $B > $OUT/checks.txt 2>&1
el checks; grep -E "bf16|FAIL" $OUT/checks.txt | head -30; tail -4 $OUT/checks.txt
timeout 300 $B/gpu/test_cuda_layers /tmp/calla-full 512 > $OUT/layers-n512.txt 2>&1; echo "layers rc $?"; tail -30 $OUT/layers-n512.txt
el layers

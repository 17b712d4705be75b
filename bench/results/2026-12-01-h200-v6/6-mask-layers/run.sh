#!/usr/bin/env bash
# session 13 call 6: constrained decoding overhead on the H200 (maskbench); the layer-local check at N = 4,096
set -u
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
rm -rf build-carry; tar xJf .carry/b.txz
export LD_LIBRARY_PATH=$PWD/build-carry/devlibs
B=build-carry
[ -f /tmp/calla-full/config.json ] || $B/calla synth --geometry full --seed 1 --out /tmp/calla-full >/tmp/synth.log 2>&1
el synth
timeout 90 $B/calla maskbench --model /tmp/calla-full --context 4096 --tokens 128 --rounds 3 --json $OUT/maskbench-h200.json > $OUT/maskbench.txt 2>&1; echo "maskbench rc $?"; tail -25 $OUT/maskbench.txt
el maskbench
timeout 200 $B/gpu/test_cuda_layers /tmp/calla-full 4096 > $OUT/layers-n4096.txt 2>&1; echo "layers rc $?"; tail -9 $OUT/layers-n4096.txt
el layers

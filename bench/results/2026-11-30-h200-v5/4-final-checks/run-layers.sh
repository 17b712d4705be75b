#!/usr/bin/env bash
# session 12 last call: the layer-local check (exact gate over positions routed as the oracle), N = 512
set -u
tar xJf .carry/L.txz
export LD_LIBRARY_PATH=$PWD/build-carry/devlibs
B=build-carry
[ -f /tmp/calla-full/config.json ] || $B/calla synth --geometry full --seed 1 --out /tmp/calla-full >/dev/null 2>&1
timeout 250 $B/gpu/test_cuda_layers /tmp/calla-full 512 > $OUT/layers-n512.txt 2>&1; echo "layers rc $?"; tail -12 $OUT/layers-n512.txt

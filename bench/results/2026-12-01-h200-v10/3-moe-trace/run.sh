#!/usr/bin/env bash
# session 17 call 3: the phases of the one-launch MoE inside a captured step (global timer per block)
set -u
rm -rf build-carry; tar xJf .carry/b.txz
export LD_LIBRARY_PATH=$PWD/build-carry/devlibs
B=build-carry
[ -f /tmp/calla-full/config.json ] || $B/calla synth --geometry full --seed 1 --out /tmp/calla-full >/tmp/synth.log 2>&1
mkdir -p /tmp/chk
for c in 4096 65536; do
  CALLA_PREFILL_FAST=1 timeout 120 $B/gpu/test_cuda_decode moetrace /tmp/calla-full $c > /tmp/chk/moetrace-$c.txt 2>&1; echo "moetrace $c rc $?"; cat /tmp/chk/moetrace-$c.txt
done
CALLA_PDL=0 CALLA_PREFILL_FAST=1 timeout 120 $B/gpu/test_cuda_decode moetrace /tmp/calla-full 4096 > /tmp/chk/moetrace-4096-nopdl.txt 2>&1; echo "moetrace 4096 no PDL rc $?"; cat /tmp/chk/moetrace-4096-nopdl.txt
tar cf $OUT/checks.tar -C /tmp chk

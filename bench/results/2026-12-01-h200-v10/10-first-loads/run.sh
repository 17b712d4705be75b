#!/usr/bin/env bash
# session 17 call 10: the latency of dependent loads right after a decode kernel's wait (the one-launch MoE's trace,
# bench/next/moe-one-launch.patch with five timed loads by thread 0 of each block)
set -u
rm -rf build-carry; tar xJf .carry/diag.txz
export LD_LIBRARY_PATH=$PWD/build-carry/devlibs
B=build-carry
$B/calla synth --geometry full --seed 1 --out /tmp/calla-full >/tmp/synth.log 2>&1
mkdir -p /tmp/chk
for c in 4096; do
  CALLA_PREFILL_FAST=1 timeout 120 $B/gpu/test_cuda_decode moetrace /tmp/calla-full $c > /tmp/chk/moetrace-loads-$c.txt 2>&1; echo "moetrace $c rc $?"; cat /tmp/chk/moetrace-loads-$c.txt
done
CALLA_PDL=0 CALLA_PREFILL_FAST=1 timeout 120 $B/gpu/test_cuda_decode moetrace /tmp/calla-full 4096 > /tmp/chk/moetrace-loads-4096-nopdl.txt 2>&1; echo "no PDL rc $?"; cat /tmp/chk/moetrace-loads-4096-nopdl.txt
tar cf $OUT/checks.tar -C /tmp chk

#!/usr/bin/env bash
# session 15 call 1: decode weights requested a kernel ahead (CALLA_PF_AHEAD 0/1/2, A/B at 4K and 64K),
# the decode paths with it on, and the flash kernels' checks after the fa_* refactor (owed)
set -u
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
rm -rf build-carry; tar xJf .carry/b.txz
export LD_LIBRARY_PATH=$PWD/build-carry/devlibs
B=build-carry
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
( $B/calla synth --geometry full --seed 1 --out /tmp/calla-full >/tmp/synth.log 2>&1; echo done > /tmp/synth-done ) &
timeout 120 $B/gpu/test_cuda_kernels 1 attention > $OUT/kernels-attention.txt 2>&1
echo "attention checks rc $?: $(grep -c PASS $OUT/kernels-attention.txt) PASS, $(grep -c FAIL $OUT/kernels-attention.txt) FAIL"; tail -1 $OUT/kernels-attention.txt
el attention
for i in $(seq 1 100); do [ -f /tmp/synth-done ] && break; sleep 2; done
el synth
for c in 4096 65536; do
  for m in 0 2 1; do
    CALLA_PF_AHEAD=$m timeout 100 $B/calla bench --model /tmp/calla-full --context $c --decode 64 --backend cuda --json $OUT/bench-$c-pf$m.json 2>&1 | tail -1 | sed "s/, rss.*//;s/^/pf$m /"
  done
done
el "A/B"
CALLA_PF_AHEAD=0 CALLA_DV_PREFETCH=0 timeout 100 $B/calla bench --model /tmp/calla-full --context 4096 --decode 64 --backend cuda --json $OUT/bench-4096-noprefetch.json 2>&1 | tail -1 | sed "s/, rss.*//;s/^/no prefetch /"
for m in 2 1; do
  CALLA_PF_AHEAD=$m timeout 100 $B/calla bench --model /tmp/calla-full --context 4096 --decode 64 --backend cuda --json $OUT/bench-4096-pf$m-r2.json 2>&1 | tail -1 | sed "s/, rss.*//;s/^/pf$m round 2 /"
done
el "A/B 2"
CALLA_PF_AHEAD=2 timeout 200 $B/gpu/test_cuda_decode e2e /tmp/calla-full 4096 48 > $OUT/decode-full-pf2.txt 2>&1; echo "decode paths full (pf 2) rc $?"; tail -4 $OUT/decode-full-pf2.txt
el "decode full"
$B/calla synth --geometry small --seed 1 --out /tmp/calla-small >/dev/null 2>&1; $B/calla synth --geometry tiny --seed 1 --out /tmp/calla-tiny >/dev/null 2>&1
CALLA_PF_AHEAD=2 timeout 100 $B/gpu/test_cuda_decode e2e /tmp/calla-small 300 16 > $OUT/decode-small-pf2.txt 2>&1; echo "decode paths small (pf 2) rc $?"; tail -2 $OUT/decode-small-pf2.txt
CALLA_PF_AHEAD=1 timeout 100 $B/gpu/test_cuda_decode e2e /tmp/calla-tiny 64 32 > $OUT/decode-tiny-pf1.txt 2>&1; echo "decode paths tiny (pf 1) rc $?"; tail -2 $OUT/decode-tiny-pf1.txt
el done

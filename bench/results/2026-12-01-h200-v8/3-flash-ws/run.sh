#!/usr/bin/env bash
# session 15 call 3: prefill attention warp-specialized (producer warpgroup + mbarriers) and with
# ping-pong: checks (bit-identical to the lockstep kernel), lab timing, 64K prefill A/B; decode grid cap A/B
set -u
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
rm -rf build-carry; tar xJf .carry/b.txz
export LD_LIBRARY_PATH=$PWD/build-carry/devlibs
B=build-carry
( [ -f /tmp/calla-full/config.json ] || $B/calla synth --geometry full --seed 1 --out /tmp/calla-full >/tmp/synth.log 2>&1; echo done > /tmp/synth-done ) &
timeout 120 $B/gpu/test_cuda_kernels 1 attention > $OUT/kernels-attention.txt 2>&1
echo "attention checks rc $?: $(grep -c PASS $OUT/kernels-attention.txt) PASS, $(grep -c FAIL $OUT/kernels-attention.txt) FAIL"; grep -E "FAIL|flash ws|flash warp" $OUT/kernels-attention.txt | head -12; tail -1 $OUT/kernels-attention.txt
el attention
timeout 150 $B/gpu/bench_cuda_kernels 4096 > $OUT/kspeed.txt 2>&1; grep flash $OUT/kspeed.txt
el kspeed
for i in $(seq 1 100); do [ -f /tmp/synth-done ] && break; sleep 2; done
for f in wg ws pp; do
  CALLA_FLASH=$f timeout 100 $B/calla bench --model /tmp/calla-full --context 65536 --decode 16 --backend cuda --json $OUT/bench-65536-$f.json 2>&1 | tail -1 | sed "s/, rss.*//;s/^/$f /"
done
el "64K A/B"
for occ in 0 6 4; do
  CALLA_DV_OCC=$occ timeout 100 $B/calla bench --model /tmp/calla-full --context 4096 --decode 64 --backend cuda --json /tmp/bench-4096-occ$occ.json 2>&1 | tail -1 | sed "s/, rss.*//;s/^/occ $occ /"
done
tar cf $OUT/occ.tar -C /tmp bench-4096-occ0.json bench-4096-occ6.json bench-4096-occ4.json
el done

#!/usr/bin/env bash
# session 14 call 4: wgmma products + glue fusions: kernel checks (both product forms), speeds, prefill A/B,
# then the owed gpu-check stages (decode gdn small sanitizer full)
set -u
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
rm -rf build-carry; tar xJf .carry/b.txz
export LD_LIBRARY_PATH=$PWD/build-carry/devlibs
B=build-carry
( [ -f /tmp/calla-full/config.json ] || $B/calla synth --geometry full --seed 1 --out /tmp/calla-full >/tmp/synth.log 2>&1; echo done > /tmp/synth-done ) &
timeout 300 $B/gpu/test_cuda_kernels 5 > $OUT/kernels.txt 2>&1
echo "kernels rc $?"; grep -E "FAIL|^# fast" $OUT/kernels.txt | head -20; tail -1 $OUT/kernels.txt
el kernels
timeout 120 $B/gpu/bench_cuda_kernels 4096 > $OUT/kspeed.txt 2>&1; grep -E "qmatmul|flash.*262144" $OUT/kspeed.txt
el kspeed
for i in $(seq 1 100); do [ -f /tmp/synth-done ] && break; sleep 2; done
b() { # label ctx env...
  local lab=$1 ctx=$2; shift 2
  env "$@" timeout 200 $B/calla bench --model /tmp/calla-full --context $ctx --decode 8 --backend cuda --json $OUT/bench-$ctx-$lab.json 2>&1 | tail -1 | sed "s/^/[$lab] /; s/, rss.*//"
}
if tail -1 $OUT/kernels.txt | grep -q PASS; then
  b wg 4096 X=1; b mma 4096 CALLA_QB=mma; b wg 65536 X=1; b mma 65536 CALLA_QB=mma
  python3 - $OUT/bench-4096-wg.json $OUT/bench-4096-mma.json $OUT/bench-65536-wg.json $OUT/bench-65536-mma.json <<'PY'
import json, sys
r = [json.load(open(f)) for f in sys.argv[1:5]]
print("4K greedy ids wg == mma:", r[0]["tokens"]["ids"] == r[1]["tokens"]["ids"], " 64K:", r[2]["tokens"]["ids"] == r[3]["tokens"]["ids"])
PY
fi
el bench
GPU_CHECK_OUT=$OUT/gc GPU_CHECK_STAGES="decode gdn small sanitizer full" timeout $((590 - ($(date +%s) - t0))) tools/gpu_check.sh $B > $OUT/gpu-check.txt 2>&1
echo "gpu-check rc $?"; tail -16 $OUT/gpu-check.txt
el gpu-check
tar cf $OUT/gc.tar -C $OUT gc 2>/dev/null; rm -rf $OUT/gc

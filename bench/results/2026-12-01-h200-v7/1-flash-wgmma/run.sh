#!/usr/bin/env bash
# session 14 call 1: the wgmma FlashAttention kernel: attention checks (both fast kernels vs CPU twins),
# kernel speeds, then prefill 4K / 64K with CALLA_FLASH=mma vs default (wgmma)
set -u
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
rm -rf build-carry; tar xJf .carry/b.txz
export LD_LIBRARY_PATH=$PWD/build-carry/devlibs
B=build-carry
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
( $B/calla synth --geometry full --seed 1 --out /tmp/calla-full >/tmp/synth.log 2>&1; echo done > /tmp/synth-done ) &
timeout 240 $B/gpu/test_cuda_kernels 1 attention > $OUT/attn-checks.txt 2>&1
echo "attn checks rc $?"; grep -E "flash|FAIL" $OUT/attn-checks.txt | head -40; tail -1 $OUT/attn-checks.txt
el checks
timeout 120 $B/gpu/bench_cuda_kernels 4096 > $OUT/kspeed.txt 2>&1; grep -E "flash" $OUT/kspeed.txt
el kspeed
grep -q "PASS" $OUT/attn-checks.txt || exit 0
for i in $(seq 1 100); do [ -f /tmp/synth-done ] && break; sleep 2; done
el synth
b() { # label ctx env...
  local lab=$1 ctx=$2; shift 2
  env "$@" timeout 200 $B/calla bench --model /tmp/calla-full --context $ctx --decode 8 --backend cuda --json $OUT/bench-$ctx-$lab.json 2>&1 | tail -1 | sed "s/^/[$lab] /; s/, rss.*//"
}
b wg 4096 X=1; b mma 4096 CALLA_FLASH=mma
b wg 65536 X=1; b mma 65536 CALLA_FLASH=mma
el bench
python3 - $OUT/bench-4096-wg.json $OUT/bench-4096-mma.json $OUT/bench-65536-wg.json $OUT/bench-65536-mma.json <<'PY'
import json, sys
r = [json.load(open(f)) for f in sys.argv[1:5]]
print("4K greedy ids wg == mma:", r[0]["tokens"]["ids"] == r[1]["tokens"]["ids"])
print("64K greedy ids wg == mma:", r[2]["tokens"]["ids"] == r[3]["tokens"]["ids"])
PY

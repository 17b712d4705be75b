#!/usr/bin/env bash
# session 14 call 2: the wgmma kernel with S(j + 1) under tile j's softmax: checks, speeds, prefill 4K/64K/262K
set -u
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
rm -rf build-carry; tar xJf .carry/b.txz
export LD_LIBRARY_PATH=$PWD/build-carry/devlibs
B=build-carry
[ -f /tmp/calla-full/config.json ] || ( $B/calla synth --geometry full --seed 1 --out /tmp/calla-full >/tmp/synth.log 2>&1; echo done > /tmp/synth-done ) &
timeout 240 $B/gpu/test_cuda_kernels 2 attention > $OUT/attn-checks.txt 2>&1
echo "attn checks rc $?"; grep -E "wgmma|FAIL" $OUT/attn-checks.txt | head -40; tail -1 $OUT/attn-checks.txt
el checks
timeout 120 $B/gpu/bench_cuda_kernels 4096 > $OUT/kspeed.txt 2>&1; grep -E "flash" $OUT/kspeed.txt
el kspeed
grep -q "PASS" $OUT/attn-checks.txt || exit 0
for i in $(seq 1 100); do [ -f /tmp/calla-full/config.json ] && [ ! -f /tmp/synth.log -o -f /tmp/synth-done ] && break; sleep 2; done
el synth
b() { # label ctx env...
  local lab=$1 ctx=$2; shift 2
  env "$@" timeout 200 $B/calla bench --model /tmp/calla-full --context $ctx --decode 8 --backend cuda --json $OUT/bench-$ctx-$lab.json 2>&1 | tail -1 | sed "s/^/[$lab] /; s/, rss.*//"
}
b wg 4096 X=1; b wg 65536 X=1; b wg 262079 X=1
el bench
timeout 200 compute-sanitizer --tool memcheck --error-exitcode 3 $B/gpu/test_cuda_kernels 3 attention > $OUT/memcheck-attn.txt 2>&1
echo "memcheck rc $?"; tail -3 $OUT/memcheck-attn.txt
el memcheck

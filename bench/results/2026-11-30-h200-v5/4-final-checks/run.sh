#!/usr/bin/env bash
# session 12 call A: merged main (seam + flash fast + layer probe); llama.cpp builds in the background
set -u
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
tar xJf .carry/b.txz; tar xJf .carry/llama.txz
export LD_LIBRARY_PATH=$PWD/build-carry/devlibs
B=build-carry
setsid bash -c 'mkdir -p /tmp/llama-out; OUT=/tmp/llama-out bash .peers/llama.cpp/device.sh -p 512 -n 8 -r 1 >/tmp/llama-setup.log 2>&1; echo rc $? >/tmp/llama-done' >/dev/null 2>&1 &
rm -rf /tmp/calla-full
( $B/calla synth --geometry full --seed 1 --out /tmp/calla-full >/tmp/synth.log 2>&1; echo synth rc $? >>/tmp/synth.log ) &
SP=$!
GPU_CHECK_OUT=$OUT GPU_CHECK_STAGES="kernels decode gdn small sanitizer" tools/gpu_check.sh $B > $OUT/checks.txt 2>&1
el checks; grep -E "^FAIL|flash" $OUT/checks.txt | head -20; tail -14 $OUT/checks.txt
if grep -qE "^decode paths.* FAIL|^decode kernel lab .* FAIL" $OUT/checks.txt; then pkill -f device.sh; pkill -f cmake; pkill -f make; echo "decode checks failed: stop"; exit 4; fi
wait $SP; el "$(tail -2 /tmp/synth.log | tr '\n' ' ')"
/usr/bin/time -v $B/calla info --model /tmp/calla-full > $OUT/info.txt 2>&1; grep -E "unaligned|copied|Maximum resident|Elapsed|owned" $OUT/info.txt | head -8
timeout 120 $B/gpu/test_cuda_decode e2e /tmp/calla-full 4096 32 > $OUT/paths-full-4096.txt 2>&1; tail -9 $OUT/paths-full-4096.txt
el paths
timeout 200 $B/gpu/bench_cuda_kernels 4096 > $OUT/kspeed.txt 2>&1; tail -22 $OUT/kspeed.txt
el kspeed
for c in 4096 65536; do timeout 150 $B/calla bench --model /tmp/calla-full --context $c --decode 64 --backend cuda --json $OUT/bench-$c.json 2>&1 | tail -1; done
for c in 4096 65536; do CALLA_DV_PREFETCH=2 timeout 150 $B/calla bench --model /tmp/calla-full --context $c --decode 64 --backend cuda --json $OUT/bench-$c-pf2.json 2>&1 | tail -1 | sed 's/^/[pf2] /; s/, rss.*//'; done
for c in 4096 65536; do CALLA_TC_SPLIT=0 timeout 150 $B/calla bench --model /tmp/calla-full --context $c --decode 64 --backend cuda --json $OUT/bench-$c-nosplit.json 2>&1 | tail -1 | sed 's/^/[nosplit] /; s/, rss.*//'; done
timeout 200 $B/calla bench --model /tmp/calla-full --context 262079 --decode 64 --backend cuda --json $OUT/bench-262079.json 2>&1 | tail -1
el "262K done"
for i in $(seq 1 60); do [ -f /tmp/llama-done ] && break; sleep 5; done
el "llama: $(cat /tmp/llama-done 2>/dev/null)"; tail -2 /tmp/llama-setup.log

#!/usr/bin/env bash
# session 12 call 4: tail forms (no spill: phases as calls), prep fold A/B
set -u
tar xJf .carry/b.txz
export LD_LIBRARY_PATH=$PWD/build-carry/devlibs
B=build-carry
( $B/calla synth --geometry full --seed 1 --out /tmp/calla-full >/tmp/synth.log 2>&1; echo synth rc $? >>/tmp/synth.log ) &
SP=$!
GPU_CHECK_OUT=$OUT GPU_CHECK_STAGES="decode small" tools/gpu_check.sh $B > $OUT/gpucheck.txt 2>&1
grep -E "^FAIL|no tail  |notail" $OUT/gpucheck.txt | head -20; tail -9 $OUT/gpucheck.txt
CALLA_DEC_PREP=fold $B/gpu/test_cuda_decode e2e /tmp/calla-small 300 16 > $OUT/paths-small-fold.txt 2>&1; tail -4 $OUT/paths-small-fold.txt
wait $SP; tail -1 /tmp/synth.log
bench() { timeout 150 env "$@" $B/calla bench --model /tmp/calla-full --context $CTX --decode 64 --backend cuda --json $OUT/b-$CTX-$(echo "$@" | tr ' =' '_-').json 2>&1 | tail -1 | sed "s/^/[$*] /" | sed 's/prefill.*decode/decode/; s/, rss.*//'; }
CTX=4096
for v in "X=1" "CALLA_DEC_TAIL=0" "CALLA_DEC_TAIL=2" "CALLA_DEC_TAIL=3" "CALLA_DEC_PREP=fold" "CALLA_DEC_TAIL=0 CALLA_DEC_PREP=fold"; do bench $v; done
timeout 120 $B/gpu/test_cuda_decode e2e /tmp/calla-full 4096 48 > $OUT/paths-full-4096.txt 2>&1; tail -11 $OUT/paths-full-4096.txt
CTX=65536
for v in "X=1" "CALLA_DEC_TAIL=0"; do bench $v; done

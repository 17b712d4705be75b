#!/usr/bin/env bash
# session 15 call 5: the score gate (issue 13) on this stop's tree (all but the segment merge): CUDA
# exact and fast against HF fp32 over 4,096 tokens, greedy continuations; test_gdn_chunked (bf16 copy)
set -u
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
rm -rf build-carry; tar xJf .carry/b.txz
export LD_LIBRARY_PATH=$PWD/build-carry/devlibs
B=build-carry
$B/calla synth --geometry full --seed 1 --out /tmp/calla-full >/tmp/synth.log 2>&1 &
stdbuf -oL timeout 100 $B/gpu/test_gdn_chunked > $OUT/gdn-chunked.txt 2>&1; echo "test_gdn_chunked rc $?"; grep -E "FAIL|bf16 copy" $OUT/gdn-chunked.txt | head -9; tail -1 $OUT/gdn-chunked.txt
stdbuf -oL timeout 100 $B/gpu/test_cuda_kernels 5 moe > $OUT/kernels-moe.txt 2>&1; echo "kernels moe rc $?"; grep -E "FAIL|compact|combine" $OUT/kernels-moe.txt | head -6; tail -1 $OUT/kernels-moe.txt
wait
el "checks + synth"
timeout 420 python3 tools/score_gate.py --calla $B/calla --model /tmp/calla-full --len 4096 --backends cuda-exact,cuda --hf-device cuda --greedy 300,4096 --gen 64 --out /tmp/sg > $OUT/score-gate.log 2>&1
echo "score gate rc $?"; tail -25 $OUT/score-gate.log
cp /tmp/sg/summary.md $OUT/ 2>/dev/null
el done

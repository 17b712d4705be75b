#!/usr/bin/env bash
# session 14 call 3: the wgmma flash kernel with the rescale skip (checks, speed); issue 13's score gate at the full shape
set -u
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
rm -rf build-carry; tar xJf .carry/b.txz
export LD_LIBRARY_PATH=$PWD/build-carry/devlibs
B=build-carry
( [ -f /tmp/calla-full/config.json ] || $B/calla synth --geometry full --seed 1 --out /tmp/calla-full >/tmp/synth.log 2>&1; echo done > /tmp/synth-done ) &
timeout 240 $B/gpu/test_cuda_kernels 4 attention > $OUT/attn-checks.txt 2>&1
echo "attn checks rc $?"; grep -E "FAIL" $OUT/attn-checks.txt | head; tail -1 $OUT/attn-checks.txt
timeout 120 $B/gpu/bench_cuda_kernels 4096 > $OUT/kspeed.txt 2>&1; grep -E "flash" $OUT/kspeed.txt
el kspeed
for i in $(seq 1 100); do [ -f /tmp/synth-done ] && break; sleep 2; done
el synth
python3 -c "import transformers, torch; print('transformers', transformers.__version__, 'torch', torch.__version__)"
timeout 470 python3 tools/score_gate.py --calla $B/calla --model /tmp/calla-full --len 4096 --backends cuda-exact,cuda,cpu-f32 \
  --hf-device cuda --hf-bf16 --greedy 300,4096 --gen 64 --out /tmp/score > $OUT/score-gate.log 2>&1
echo "score gate rc $?"; grep -v "^+" $OUT/score-gate.log | tail -30
el score
tar cf $OUT/score.tar -C /tmp score

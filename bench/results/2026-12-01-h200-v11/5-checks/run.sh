#!/usr/bin/env bash
# session 18 call 5 (tree 14ab086): the checks of the final tree: the kernel lab, the moe kernel checks, memcheck and
# racecheck of the new kernels (lab cases 2 and 100), decode paths full / small / tiny, prefill e2e and chunking
# (small), the score gate against HF fp32 at 4,096 (+ greedy after 300 and 4,096), decode at 262,079.
set -u
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
rm -rf build-carry; tar xJf .carry/b.txz
export LD_LIBRARY_PATH=$PWD/build-carry/devlibs
B=build-carry
( [ -f /tmp/calla-full/config.json ] || $B/calla synth --geometry full --seed 1 --out /tmp/calla-full >/tmp/synth.log 2>&1; $B/calla synth --geometry small --seed 1 --out /tmp/calla-small >/dev/null 2>&1; $B/calla synth --geometry tiny --seed 1 --out /tmp/calla-tiny >/dev/null 2>&1; echo done > /tmp/synth-done ) &
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,memory.total --format=csv,noheader
mkdir -p /tmp/chk
timeout 150 $B/gpu/test_cuda_decode lab > /tmp/chk/decode-lab.txt 2>&1; echo "decode lab rc $?"; tail -1 /tmp/chk/decode-lab.txt
timeout 150 $B/gpu/test_cuda_kernels 5 moe > /tmp/chk/kernels-moe.txt 2>&1; echo "kernels moe rc $?"; tail -1 /tmp/chk/kernels-moe.txt
for c in 2 100; do
  for t in memcheck racecheck; do
    timeout 150 compute-sanitizer --tool $t $B/gpu/test_cuda_decode lab $c > /tmp/chk/$t-lab$c.txt 2>&1; echo "$t lab $c rc $?"; tail -1 /tmp/chk/$t-lab$c.txt
  done
done
for i in $(seq 1 100); do [ -f /tmp/synth-done ] && break; sleep 2; done
el "lab, kernels, sanitizers"
timeout 200 $B/gpu/test_cuda_decode e2e /tmp/calla-full 4096 48 > /tmp/chk/decode-full.txt 2>&1; echo "decode paths full rc $?"; tail -2 /tmp/chk/decode-full.txt
timeout 100 $B/gpu/test_cuda_decode e2e /tmp/calla-small 300 16 > /tmp/chk/decode-small.txt 2>&1; echo "decode paths small rc $?"; tail -1 /tmp/chk/decode-small.txt
timeout 100 $B/gpu/test_cuda_decode e2e /tmp/calla-tiny 64 32 > /tmp/chk/decode-tiny.txt 2>&1; echo "decode paths tiny rc $?"; tail -1 /tmp/chk/decode-tiny.txt
timeout 120 $B/gpu/test_cuda_e2e /tmp/calla-small 300 8 > /tmp/chk/e2e-small.txt 2>&1; echo "e2e small 300+8 rc $?"; tail -1 /tmp/chk/e2e-small.txt
timeout 120 $B/gpu/test_cuda_chunking /tmp/calla-small 2600 > /tmp/chk/chunking-small.txt 2>&1; echo "chunking small 2600 rc $?"; tail -1 /tmp/chk/chunking-small.txt
el paths
timeout 300 python3 tools/score_gate.py --calla $B/calla --model /tmp/calla-full --len 4096 --backends cuda-exact,cuda --hf-device cuda --greedy 300,4096 --gen 64 --out /tmp/sg > /tmp/chk/score-gate.log 2>&1
echo "score gate rc $?"; grep -E "^\| (cuda|300|4096)|PASS|FAIL" /tmp/chk/score-gate.log | cut -c1-220 | tail -9
cp /tmp/sg/summary.md /tmp/chk/ 2>/dev/null
el "score gate"
timeout 150 $B/calla bench --model /tmp/calla-full --context 262079 --decode 64 --backend cuda --json /tmp/chk/bench-262079.json 2>&1 | tail -1 | sed "s/, rss.*//"
el done
tar cf $OUT/checks.tar -C /tmp chk

#!/usr/bin/env bash
# session 14 call 5: final tree: fast-prefill kernel checks (norm bf16 copy, products both forms), the layer
# check at 4,096 (fast mode vs the CPU oracle), 262,079, and the 2-round matrix with the llama.cpp arm
set -u
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
rm -rf build-carry; tar xJf .carry/b.txz; tar xJf .carry/llama.txz
export LD_LIBRARY_PATH=$PWD/build-carry/devlibs
B=build-carry
( [ -f /tmp/calla-full/config.json ] || $B/calla synth --geometry full --seed 1 --out /tmp/calla-full >/tmp/synth.log 2>&1; echo done > /tmp/synth-done ) &
timeout 150 $B/gpu/test_cuda_kernels 6 fast > $OUT/kernels-fast.txt 2>&1
echo "kernels fast rc $?"; grep -E "FAIL|rmsnorm|^# fast" $OUT/kernels-fast.txt | head; tail -1 $OUT/kernels-fast.txt
el kernels
for i in $(seq 1 100); do [ -f /tmp/synth-done ] && break; sleep 2; done
el synth
timeout 200 $B/gpu/test_cuda_layers /tmp/calla-full 4096 > $OUT/layers-n4096.txt 2>&1; echo "layers rc $?"; tail -9 $OUT/layers-n4096.txt
el layers
setsid nice -n 19 bash -c 'mkdir -p /tmp/llama-out; OUT=/tmp/llama-out bash .peers/llama.cpp/device.sh -p 512 -n 8 -r 1 >/tmp/llama-setup.log 2>&1; echo rc $? >/tmp/llama-done' >/dev/null 2>&1 &
timeout 200 $B/calla bench --model /tmp/calla-full --context 262079 --decode 64 --backend cuda --json $OUT/bench-262079.json 2>&1 | tail -1 | sed "s/, rss.*//"
el 262K
for i in $(seq 1 120); do [ -f /tmp/llama-done ] && break; sleep 3; done
el "llama: $(cat /tmp/llama-done 2>/dev/null)"; tail -2 /tmp/llama-setup.log
L='/tmp/llama-build/bin/llama-bench -m /tmp/qwen35moe-q4k.gguf -ngl 99 -fa 1 -o json -r 1 -ub 4096 -b 4096'
$B/calla matrix --model /tmp/calla-full --engines cuda,llama-bench --llama-bench "$L -p {prompt} -n 0 && $L -p 0 -n {decode} -d {prompt}" \
  --contexts 4096,65536 --decode 64 --rounds 2 --cooldown-min-s 1 --cooldown-max-s 3 --run-timeout-s 200 \
  --out /tmp/matrix --title 'Calla v7 and llama.cpp on one H200 (synthetic full-shape checkpoint)' > /tmp/matrix.log 2>&1
echo "matrix rc $?"; tail -22 /tmp/matrix.log
el matrix
cp /tmp/matrix.log /tmp/matrix/; tar cf $OUT/matrix.tar -C /tmp matrix

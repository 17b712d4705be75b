#!/usr/bin/env bash
# session 16 call 5 (final tree): decode / prefill path checks, 4K/64K against v8 (ceefcc6), 262,079,
# and the 2-round matrix with the llama.cpp arm (built in the background)
set -u
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
rm -rf build-carry; tar xJf .carry/b.txz; tar xJf .carry/llama.txz
mkdir -p build-old; xz -dc .carry/old.xz > build-old/calla; chmod +x build-old/calla
export LD_LIBRARY_PATH=$PWD/build-carry/devlibs
B=build-carry
setsid nice -n 19 bash -c 'mkdir -p /tmp/llama-out; OUT=/tmp/llama-out bash .peers/llama.cpp/device.sh -p 512 -n 8 -r 1 >/tmp/llama-setup.log 2>&1; echo rc $? >/tmp/llama-done' >/dev/null 2>&1 &
( [ -f /tmp/calla-full/config.json ] || $B/calla synth --geometry full --seed 1 --out /tmp/calla-full >/tmp/synth.log 2>&1; $B/calla synth --geometry small --seed 1 --out /tmp/calla-small >/dev/null 2>&1; $B/calla synth --geometry tiny --seed 1 --out /tmp/calla-tiny >/dev/null 2>&1; echo done > /tmp/synth-done ) &
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,memory.total --format=csv,noheader
mkdir -p /tmp/chk
stdbuf -oL timeout 150 $B/gpu/test_cuda_kernels 5 add > /tmp/chk/kernels-add.txt 2>&1; echo "kernels add rc $?"; tail -1 /tmp/chk/kernels-add.txt
timeout 100 $B/gpu/test_cuda_decode lab > /tmp/chk/decode-lab.txt 2>&1; echo "decode lab rc $?"; tail -1 /tmp/chk/decode-lab.txt
for i in $(seq 1 100); do [ -f /tmp/synth-done ] && break; sleep 2; done
el "checks + synth"
timeout 100 $B/gpu/test_cuda_decode e2e /tmp/calla-small 300 16 > /tmp/chk/decode-small.txt 2>&1; echo "decode paths small rc $?"; tail -1 /tmp/chk/decode-small.txt
timeout 100 $B/gpu/test_cuda_decode e2e /tmp/calla-tiny 64 32 > /tmp/chk/decode-tiny.txt 2>&1; echo "decode paths tiny rc $?"; tail -1 /tmp/chk/decode-tiny.txt
timeout 120 $B/gpu/test_cuda_e2e /tmp/calla-small 300 8 > /tmp/chk/e2e-small.txt 2>&1; echo "e2e small 300+8 rc $?"; tail -1 /tmp/chk/e2e-small.txt
timeout 120 $B/gpu/test_cuda_chunking /tmp/calla-small 2600 > /tmp/chk/chunking-small.txt 2>&1; echo "chunking small 2600 rc $?"; tail -1 /tmp/chk/chunking-small.txt
timeout 200 $B/gpu/test_cuda_decode e2e /tmp/calla-full 4096 48 > /tmp/chk/decode-full.txt 2>&1; echo "decode paths full rc $?"; tail -2 /tmp/chk/decode-full.txt
el "paths"
for c in 4096 65536; do
  for v in old new; do
    bin=$B/calla; [ $v = old ] && bin=build-old/calla
    timeout 100 $bin bench --model /tmp/calla-full --context $c --decode 64 --backend cuda --json /tmp/chk/bench-$c-$v.json 2>&1 | tail -1 | sed "s/, rss.*//;s/^/$v /"
  done
done
el "A/B"
timeout 150 $B/calla bench --model /tmp/calla-full --context 262079 --decode 64 --backend cuda --json $OUT/bench-262079.json 2>&1 | tail -1 | sed "s/, rss.*//"
el 262K
tar cf $OUT/checks.tar -C /tmp chk
for i in $(seq 1 150); do [ -f /tmp/llama-done ] && break; sleep 3; done
el "llama: $(cat /tmp/llama-done 2>/dev/null)"; tail -2 /tmp/llama-setup.log
L='/tmp/llama-build/bin/llama-bench -m /tmp/qwen35moe-q4k.gguf -ngl 99 -fa 1 -o json -r 1 -ub 4096 -b 4096'
$B/calla matrix --model /tmp/calla-full --engines cuda,llama-bench --llama-bench "$L -p {prompt} -n 0 && $L -p 0 -n {decode} -d {prompt}" \
  --contexts 4096,65536 --decode 64 --rounds 2 --cooldown-min-s 1 --cooldown-max-s 3 --run-timeout-s 150 \
  --out /tmp/matrix --title 'Calla v9 and llama.cpp on one H200 (synthetic full-shape checkpoint)' > /tmp/matrix.log 2>&1
echo "matrix rc $?"; tail -22 /tmp/matrix.log
el matrix
cp /tmp/matrix.log /tmp/llama-setup.log /tmp/matrix/ 2>/dev/null; tar cf $OUT/matrix.tar -C /tmp matrix

#!/usr/bin/env bash
# session 18 call 6 (tree 14ab086): the 2-round matrix with the llama.cpp arm (built here from its PyPI source
# package: ../shared/peers/llamacpp/, carried as .carry/llama.txz, never committed).
set -u
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
rm -rf build-carry; tar xJf .carry/b.txz; tar xJf .carry/llama.txz
export LD_LIBRARY_PATH=$PWD/build-carry/devlibs
B=build-carry
setsid nice -n 19 bash -c 'mkdir -p /tmp/llama-out; OUT=/tmp/llama-out bash .peers/llama.cpp/device.sh -p 16 -n 1 -r 1 >/tmp/llama-setup.log 2>&1; echo rc $? >/tmp/llama-done' >/dev/null 2>&1 &
[ -f /tmp/calla-full/config.json ] || $B/calla synth --geometry full --seed 1 --out /tmp/calla-full >/tmp/synth.log 2>&1
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,memory.total --format=csv,noheader
for i in $(seq 1 160); do [ -f /tmp/llama-done ] && break; sleep 3; done
el "llama: $(cat /tmp/llama-done 2>/dev/null)"; tail -2 /tmp/llama-setup.log
L='/tmp/llama-build/bin/llama-bench -m /tmp/qwen35moe-q4k.gguf -ngl 99 -fa 1 -o json -r 1 -ub 4096 -b 4096'
$B/calla matrix --model /tmp/calla-full --engines cuda,llama-bench --llama-bench "$L -p {prompt} -n 0 && $L -p 0 -n {decode} -d {prompt}" \
  --contexts 4096,65536 --decode 64 --rounds 2 --cooldown-min-s 1 --cooldown-max-s 3 --run-timeout-s 150 \
  --out /tmp/matrix --title 'Calla v11 and llama.cpp on one H200 (synthetic full-shape checkpoint)' > /tmp/matrix.log 2>&1
echo "matrix rc $?"; tail -22 /tmp/matrix.log
el matrix
cp /tmp/matrix.log /tmp/llama-setup.log /tmp/matrix/ 2>/dev/null; tar cf $OUT/matrix.tar -C /tmp matrix

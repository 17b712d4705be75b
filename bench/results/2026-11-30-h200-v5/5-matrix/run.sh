#!/usr/bin/env bash
# session 12 call B (same warm machine): the layer-local check, then the matrix with the llama.cpp arm
set -u
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
export LD_LIBRARY_PATH=$PWD/build-carry/devlibs
[ -d build-carry ] || tar xJf .carry/b.txz
B=build-carry
[ -f /tmp/calla-full/config.json ] || $B/calla synth --geometry full --seed 1 --out /tmp/calla-full >/dev/null 2>&1
ls -la /tmp/llama-build/bin/llama-bench /tmp/qwen35moe-q4k.gguf
timeout ${LAYERS_TIMEOUT:-300} $B/gpu/test_cuda_layers /tmp/calla-full ${LAYERS_N:-512} > $OUT/layers.txt 2>&1; echo "layers rc $?"; tail -50 $OUT/layers.txt
el layers
[ -f /tmp/llama-build/bin/llama-bench ] || exit 3
L='/tmp/llama-build/bin/llama-bench -m /tmp/qwen35moe-q4k.gguf -ngl 99 -fa 1 -o json -r 1 -ub 4096 -b 4096'
$B/calla matrix --model /tmp/calla-full --engines cuda,llama-bench --llama-bench "$L -p {prompt} -n 0 && $L -p 0 -n {decode} -d {prompt}" \
  --contexts 4096,65536 --decode 64 --rounds 2 --cooldown-min-s 2 --cooldown-max-s 6 --run-timeout-s 200 \
  --out /tmp/matrix --title 'Calla v5 and llama.cpp on one H200 (synthetic full-shape checkpoint)' > /tmp/matrix.log 2>&1
echo "matrix rc $?"; tail -30 /tmp/matrix.log
el matrix
cp /tmp/matrix.log /tmp/matrix/; tar cf $OUT/matrix.tar -C /tmp matrix

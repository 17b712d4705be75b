#!/usr/bin/env bash
# session 13 call 5: final tree: kernel checks (2-block qmatmul), speeds, A/B, 262K; the matrix with llama.cpp
set -u
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
rm -rf build-carry; tar xJf .carry/b.txz; tar xJf .carry/llama.txz
export LD_LIBRARY_PATH=$PWD/build-carry/devlibs
B=build-carry
setsid nice -n 19 bash -c 'mkdir -p /tmp/llama-out; OUT=/tmp/llama-out bash .peers/llama.cpp/device.sh -p 512 -n 8 -r 1 >/tmp/llama-setup.log 2>&1; echo rc $? >/tmp/llama-done' >/dev/null 2>&1 &
[ -f /tmp/calla-full/config.json ] || $B/calla synth --geometry full --seed 1 --out /tmp/calla-full >/tmp/synth.log 2>&1
el synth
GPU_CHECK_OUT=$OUT GPU_CHECK_STAGES="kernels" tools/gpu_check.sh $B > $OUT/checks.txt 2>&1
el checks; grep -E "FAIL" $OUT/checks.txt | head; grep -E "grouped.*bf16|in_qkv bf16" $OUT/checks.txt; tail -3 $OUT/checks.txt
timeout 100 $B/gpu/bench_cuda_kernels 4096 > $OUT/kspeed.txt 2>&1; grep -E "qmatmul" $OUT/kspeed.txt
el kspeed
b() { # label ctx env...
  local lab=$1 ctx=$2; shift 2
  env "$@" timeout 200 $B/calla bench --model /tmp/calla-full --context $ctx --decode 64 --backend cuda --json $OUT/bench-$ctx-$lab.json 2>&1 | tail -1 | sed "s/^/[$lab] /; s/, rss.*//"
}
b qb2 4096 X=1; b qb1 4096 CALLA_QB_BLOCKS=1
python3 - $OUT/bench-4096-qb2.json $OUT/bench-4096-qb1.json <<'PY'
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
print("qb2 vs qb1 greedy ids identical:", a["tokens"]["ids"] == b["tokens"]["ids"])
PY
b final 262079 X=1
el bench
for i in $(seq 1 100); do [ -f /tmp/llama-done ] && break; sleep 3; done
el "llama: $(cat /tmp/llama-done 2>/dev/null)"; tail -2 /tmp/llama-setup.log
L='/tmp/llama-build/bin/llama-bench -m /tmp/qwen35moe-q4k.gguf -ngl 99 -fa 1 -o json -r 1 -ub 4096 -b 4096'
$B/calla matrix --model /tmp/calla-full --engines cuda,llama-bench --llama-bench "$L -p {prompt} -n 0 && $L -p 0 -n {decode} -d {prompt}" \
  --contexts 4096,65536 --decode 64 --rounds 2 --cooldown-min-s 1 --cooldown-max-s 3 --run-timeout-s 200 \
  --out /tmp/matrix --title 'Calla v6 and llama.cpp on one H200 (synthetic full-shape checkpoint)' > /tmp/matrix.log 2>&1
echo "matrix rc $?"; tail -22 /tmp/matrix.log
el matrix
cp /tmp/matrix.log /tmp/matrix/; tar cf $OUT/matrix.tar -C /tmp matrix

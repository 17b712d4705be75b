#!/usr/bin/env bash
# session 15 call 5 (final tree): kernel checks of this stop's changes, 4K/64K tokens against the
# previous binary (f245ee8), 262,079, and the 2-round matrix with the llama.cpp arm
set -u
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
rm -rf build-carry; tar xJf .carry/b.txz; tar xJf .carry/llama.txz
mkdir -p build-old; xz -dc .carry/old.xz > build-old/calla; chmod +x build-old/calla
export LD_LIBRARY_PATH=$PWD/build-carry/devlibs
B=build-carry
setsid nice -n 19 bash -c 'mkdir -p /tmp/llama-out; OUT=/tmp/llama-out bash .peers/llama.cpp/device.sh -p 512 -n 8 -r 1 >/tmp/llama-setup.log 2>&1; echo rc $? >/tmp/llama-done' >/dev/null 2>&1 &
( [ -f /tmp/calla-full/config.json ] || $B/calla synth --geometry full --seed 1 --out /tmp/calla-full >/tmp/synth.log 2>&1; echo done > /tmp/synth-done ) &
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,memory.total --format=csv,noheader
mkdir -p /tmp/chk
for s in segments moe gdn; do
  stdbuf -oL timeout 150 $B/gpu/test_cuda_kernels 5 $s > /tmp/chk/kernels-$s.txt 2>&1
  echo "kernels $s rc $?: $(grep -c PASS /tmp/chk/kernels-$s.txt) PASS, $(grep -c FAIL /tmp/chk/kernels-$s.txt) FAIL"; grep -E "FAIL|compact|segment" /tmp/chk/kernels-$s.txt | head -8; tail -1 /tmp/chk/kernels-$s.txt
done
stdbuf -oL timeout 150 $B/gpu/test_gdn_chunked > /tmp/chk/gdn-chunked.txt 2>&1; echo "test_gdn_chunked rc $?"; grep -E "FAIL|bf16 copy" /tmp/chk/gdn-chunked.txt | head -4; tail -1 /tmp/chk/gdn-chunked.txt
timeout 100 $B/gpu/bench_cuda_kernels 4096 > /tmp/chk/kspeed.txt 2>&1; grep -E "group|compact|gdn conv|p0  61440" /tmp/chk/kspeed.txt
el checks
for i in $(seq 1 100); do [ -f /tmp/synth-done ] && break; sleep 2; done
for c in 4096 65536; do
  for v in old new; do
    bin=$B/calla; [ $v = old ] && bin=build-old/calla
    timeout 100 $bin bench --model /tmp/calla-full --context $c --decode 32 --backend cuda --json /tmp/chk/bench-$c-$v.json 2>&1 | tail -1 | sed "s/, rss.*//;s/^/$v /"
  done
done
python3 - <<'PY'
import json
for c in (4096, 65536):
    a = json.load(open(f"/tmp/chk/bench-{c}-old.json")); b = json.load(open(f"/tmp/chk/bench-{c}-new.json"))
    print(c, "greedy ids identical to f245ee8's" if a["tokens"]["ids"] == b["tokens"]["ids"] else "TOKENS DIFFER")
PY
CALLA_PREFILL_SEGS=0 timeout 100 $B/calla bench --model /tmp/calla-full --context 65536 --decode 32 --backend cuda --json /tmp/chk/bench-65536-segs0.json 2>&1 | tail -1 | sed "s/, rss.*//;s/^/segs 0 /"
el "A/B"
timeout 150 $B/calla bench --model /tmp/calla-full --context 262079 --decode 64 --backend cuda --json $OUT/bench-262079.json 2>&1 | tail -1 | sed "s/, rss.*//"
el 262K
tar cf $OUT/checks.tar -C /tmp chk
for i in $(seq 1 120); do [ -f /tmp/llama-done ] && break; sleep 3; done
el "llama: $(cat /tmp/llama-done 2>/dev/null)"; tail -2 /tmp/llama-setup.log
L='/tmp/llama-build/bin/llama-bench -m /tmp/qwen35moe-q4k.gguf -ngl 99 -fa 1 -o json -r 1 -ub 4096 -b 4096'
$B/calla matrix --model /tmp/calla-full --engines cuda,llama-bench --llama-bench "$L -p {prompt} -n 0 && $L -p 0 -n {decode} -d {prompt}" \
  --contexts 4096,65536 --decode 64 --rounds 2 --cooldown-min-s 1 --cooldown-max-s 3 --run-timeout-s 150 \
  --out /tmp/matrix --title 'Calla v8 and llama.cpp on one H200 (synthetic full-shape checkpoint)' > /tmp/matrix.log 2>&1
echo "matrix rc $?"; tail -22 /tmp/matrix.log
el matrix
cp /tmp/matrix.log /tmp/llama-setup.log /tmp/matrix/ 2>/dev/null; tar cf $OUT/matrix.tar -C /tmp matrix

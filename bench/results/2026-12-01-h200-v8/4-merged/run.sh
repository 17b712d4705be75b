#!/usr/bin/env bash
# session 15 call 4: the merged tree (ping-pong attention, fused DeltaNet conv, compact grouped grid):
# kernel checks, lab rows, 4K/64K against the previous binary (f245ee8), prefill paths, layer check
set -u
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
rm -rf build-carry; tar xJf .carry/b.txz; mkdir -p build-old; xz -dc .carry/old.xz > build-old/calla; chmod +x build-old/calla
export LD_LIBRARY_PATH=$PWD/build-carry/devlibs
B=build-carry
( [ -f /tmp/calla-full/config.json ] || $B/calla synth --geometry full --seed 1 --out /tmp/calla-full >/tmp/synth.log 2>&1; echo done > /tmp/synth-done ) &
for s in fast gdn; do
  timeout 150 $B/gpu/test_cuda_kernels 3 $s > $OUT/kernels-$s.txt 2>&1
  echo "kernels $s rc $?: $(grep -c PASS $OUT/kernels-$s.txt) PASS, $(grep -c FAIL $OUT/kernels-$s.txt) FAIL"; grep -E "FAIL|compact|fused vs old" $OUT/kernels-$s.txt | head -14; tail -1 $OUT/kernels-$s.txt
done
el kernels
timeout 150 $B/gpu/bench_cuda_kernels 4096 > $OUT/kspeed.txt 2>&1; grep -E "experts|gdn conv|flash attention T 4096 p0  61440" $OUT/kspeed.txt
el kspeed
for i in $(seq 1 100); do [ -f /tmp/synth-done ] && break; sleep 2; done
for c in 4096 65536; do
  for v in old new; do
    bin=$B/calla; [ $v = old ] && bin=build-old/calla
    timeout 100 $bin bench --model /tmp/calla-full --context $c --decode 32 --backend cuda --json $OUT/bench-$c-$v.json 2>&1 | tail -1 | sed "s/, rss.*//;s/^/$v /"
  done
done
python3 - <<'PY'
import json, os
o = os.environ["OUT"]
for c in (4096, 65536):
    a = json.load(open(f"{o}/bench-{c}-old.json")); b = json.load(open(f"{o}/bench-{c}-new.json"))
    print(c, "tokens identical" if a["tokens"]["ids"] == b["tokens"]["ids"] else "TOKENS DIFFER")
PY
el "A/B"
$B/calla synth --geometry small --seed 1 --out /tmp/calla-small >/dev/null 2>&1
timeout 120 $B/gpu/test_cuda_e2e /tmp/calla-small 300 8 > $OUT/e2e-small.txt 2>&1; echo "e2e small 300+8 rc $?"; tail -1 $OUT/e2e-small.txt
timeout 120 $B/gpu/test_cuda_chunking /tmp/calla-small 2600 > $OUT/chunking-small.txt 2>&1; echo "chunking small 2600 rc $?"; tail -1 $OUT/chunking-small.txt
el e2e
timeout 240 $B/gpu/test_cuda_layers /tmp/calla-full 4096 > $OUT/layers-n4096.txt 2>&1; echo "layers rc $?"; tail -8 $OUT/layers-n4096.txt
el done

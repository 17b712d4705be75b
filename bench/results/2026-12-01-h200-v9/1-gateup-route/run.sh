#!/usr/bin/env bash
# session 16 call 1: decode gate/up with warp 0 routing (two redux.sync a round) while warps 1-3 stage u, A/B against v8 (ceefcc6)
set -u
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
rm -rf build-carry; tar xJf .carry/b.txz; mkdir -p build-old; xz -dc .carry/old.xz > build-old/calla; chmod +x build-old/calla
export LD_LIBRARY_PATH=$PWD/build-carry/devlibs
B=build-carry
[ -f /tmp/calla-full/config.json ] || $B/calla synth --geometry full --seed 1 --out /tmp/calla-full >/tmp/synth.log 2>&1
el synth
stdbuf -oL timeout 150 $B/gpu/test_cuda_kernels 5 moe > $OUT/kernels-moe.txt 2>&1; echo "kernels moe rc $?: $(grep -c PASS $OUT/kernels-moe.txt) PASS, $(grep -c FAIL $OUT/kernels-moe.txt) FAIL"; grep -E "route|FAIL" $OUT/kernels-moe.txt | head -8
for r in 1 2; do
  for c in 4096 65536; do
    for v in old new; do
      bin=$B/calla; [ $v = old ] && bin=build-old/calla
      timeout 100 $bin bench --model /tmp/calla-full --context $c --decode 64 --backend cuda --json /tmp/bench-$c-$v-r$r.json 2>&1 | tail -1 | sed "s/, rss.*//;s/^/$v r$r /"
    done
  done
done
el "A/B"
python3 - <<'PY'
import json
for c in (4096, 65536):
    for r in (1, 2):
        a = json.load(open(f"/tmp/bench-{c}-old-r{r}.json")); b = json.load(open(f"/tmp/bench-{c}-new-r{r}.json"))
        print(c, r, "tokens identical" if a["tokens"]["ids"] == b["tokens"]["ids"] else "TOKENS DIFFER")
PY
tar cf $OUT/bench.tar -C /tmp $(cd /tmp && ls bench-*-r*.json)
timeout 200 $B/gpu/test_cuda_decode e2e /tmp/calla-full 4096 48 > $OUT/decode-full.txt 2>&1; echo "decode paths full rc $?"; tail -3 $OUT/decode-full.txt
el "decode full"
$B/calla synth --geometry small --seed 1 --out /tmp/calla-small >/dev/null 2>&1; $B/calla synth --geometry tiny --seed 1 --out /tmp/calla-tiny >/dev/null 2>&1
timeout 100 $B/gpu/test_cuda_decode lab > $OUT/decode-lab.txt 2>&1; echo "decode lab rc $?"; tail -2 $OUT/decode-lab.txt
timeout 100 $B/gpu/test_cuda_decode e2e /tmp/calla-small 300 16 > $OUT/decode-small.txt 2>&1; echo "decode paths small rc $?"; tail -1 $OUT/decode-small.txt
timeout 100 $B/gpu/test_cuda_decode e2e /tmp/calla-tiny 64 32 > $OUT/decode-tiny.txt 2>&1; echo "decode paths tiny rc $?"; tail -1 $OUT/decode-tiny.txt
timeout 120 $B/gpu/test_cuda_e2e /tmp/calla-small 300 8 > $OUT/e2e-small.txt 2>&1; echo "e2e small 300+8 rc $?"; tail -1 $OUT/e2e-small.txt
el done

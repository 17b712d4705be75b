#!/usr/bin/env bash
# session 16 call 2: decode epilogue inputs read with the input (gdn: q k v b a z in one round trip;
# down: the residual row; o/out_proj ADD and in_qkv CONV epilogues by cp.async into shared memory;
# attention combine: the output gate), A/B against v8 (ceefcc6) and call 1's tree (75dff30)
set -u
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
rm -rf build-carry; tar xJf .carry/b.txz; mkdir -p build-old; xz -dc .carry/old.xz > build-old/calla; xz -dc .carry/mid.xz > build-old/mid; chmod +x build-old/*
export LD_LIBRARY_PATH=$PWD/build-carry/devlibs
B=build-carry
[ -f /tmp/calla-full/config.json ] || $B/calla synth --geometry full --seed 1 --out /tmp/calla-full >/tmp/synth.log 2>&1
el synth
for r in 1 2; do
  for c in 4096 65536; do
    for v in old mid new; do
      bin=$B/calla; [ $v = old ] && bin=build-old/calla; [ $v = mid ] && bin=build-old/mid
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
        print(c, r, "tokens identical to v8" if a["tokens"]["ids"] == b["tokens"]["ids"] else "TOKENS DIFFER")
PY
tar cf $OUT/bench.tar -C /tmp $(cd /tmp && ls bench-*-r*.json)
timeout 200 $B/gpu/test_cuda_decode e2e /tmp/calla-full 4096 48 > $OUT/decode-full.txt 2>&1; echo "decode paths full rc $?"; tail -3 $OUT/decode-full.txt
el "decode full"
$B/calla synth --geometry small --seed 1 --out /tmp/calla-small >/dev/null 2>&1; $B/calla synth --geometry tiny --seed 1 --out /tmp/calla-tiny >/dev/null 2>&1
timeout 100 $B/gpu/test_cuda_decode lab > $OUT/decode-lab.txt 2>&1; echo "decode lab rc $?"; grep -E "FAIL" $OUT/decode-lab.txt; tail -1 $OUT/decode-lab.txt
timeout 100 $B/gpu/test_cuda_decode e2e /tmp/calla-small 300 16 > $OUT/decode-small.txt 2>&1; echo "decode paths small rc $?"; tail -1 $OUT/decode-small.txt
timeout 100 $B/gpu/test_cuda_decode e2e /tmp/calla-tiny 64 32 > $OUT/decode-tiny.txt 2>&1; echo "decode paths tiny rc $?"; tail -1 $OUT/decode-tiny.txt
timeout 120 $B/gpu/test_cuda_e2e /tmp/calla-small 300 8 > $OUT/e2e-small.txt 2>&1; echo "e2e small 300+8 rc $?"; tail -1 $OUT/e2e-small.txt
el done

#!/usr/bin/env bash
# session 16 call 5: decode: the in-proj and lm_head RMS input staged in one pass (tc_stage_rms), gdn q/k sums with one pair of barriers, gate/up prefetching the down matrices after its tiles; A/B against call 4's tree (f273051)
set -u
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
rm -rf build-carry; tar xJf .carry/b.txz; mkdir -p build-old; xz -dc .carry/mid.xz > build-old/mid; chmod +x build-old/*
export LD_LIBRARY_PATH=$PWD/build-carry/devlibs
B=build-carry
[ -f /tmp/calla-full/config.json ] || $B/calla synth --geometry full --seed 1 --out /tmp/calla-full >/tmp/synth.log 2>&1
el synth
mkdir -p /tmp/chk
for r in 1 2; do
  for c in 4096 65536; do
    for v in mid new; do
      bin=$B/calla; [ $v = mid ] && bin=build-old/mid
      timeout 100 $bin bench --model /tmp/calla-full --context $c --decode 64 --backend cuda --json /tmp/chk/bench-$c-$v-r$r.json 2>&1 | tail -1 | sed "s/, rss.*//;s/prefill.*decode/decode/;s/^/$v r$r /"
    done
  done
done
python3 - <<'PY'
import json
for c in (4096, 65536):
    for r in (1, 2):
        a = json.load(open(f"/tmp/chk/bench-{c}-mid-r{r}.json")); b = json.load(open(f"/tmp/chk/bench-{c}-new-r{r}.json"))
        print(c, r, "tokens identical to f273051's" if a["tokens"]["ids"] == b["tokens"]["ids"] else "TOKENS DIFFER")
PY
el "A/B"
timeout 200 $B/gpu/test_cuda_decode e2e /tmp/calla-full 4096 48 > /tmp/chk/decode-full.txt 2>&1; echo "decode paths full rc $?"; tail -2 /tmp/chk/decode-full.txt
$B/calla synth --geometry small --seed 1 --out /tmp/calla-small >/dev/null 2>&1; $B/calla synth --geometry tiny --seed 1 --out /tmp/calla-tiny >/dev/null 2>&1
timeout 100 $B/gpu/test_cuda_decode lab > /tmp/chk/decode-lab.txt 2>&1; echo "decode lab rc $?"; grep -E "FAIL|in:|lm_head" /tmp/chk/decode-lab.txt; tail -1 /tmp/chk/decode-lab.txt
timeout 100 $B/gpu/test_cuda_decode e2e /tmp/calla-small 300 16 > /tmp/chk/decode-small.txt 2>&1; echo "decode paths small rc $?"; tail -1 /tmp/chk/decode-small.txt
timeout 100 $B/gpu/test_cuda_decode e2e /tmp/calla-tiny 64 32 > /tmp/chk/decode-tiny.txt 2>&1; echo "decode paths tiny rc $?"; tail -1 /tmp/chk/decode-tiny.txt
el done
tar cf $OUT/checks.tar -C /tmp chk

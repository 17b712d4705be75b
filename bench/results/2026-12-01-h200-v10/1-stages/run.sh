#!/usr/bin/env bash
# session 17 call 1: the stage probe (what each decode stage costs inside the captured step: skipped / doubled),
# and bench/next/decode-staging.patch (sums of 16 made while staging; gdn's gated norm by part 0) A/B against version 9
set -u
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
rm -rf build-carry; tar xJf .carry/b.txz; mkdir -p build-old; xz -dc .carry/v9.xz > build-old/v9; chmod +x build-old/*
export LD_LIBRARY_PATH=$PWD/build-carry/devlibs
B=build-carry
[ -f /tmp/calla-full/config.json ] || $B/calla synth --geometry full --seed 1 --out /tmp/calla-full >/tmp/synth.log 2>&1
el synth
mkdir -p /tmp/chk
for c in 4096 65536; do
  CALLA_PREFILL_FAST=1 timeout 120 $B/gpu/test_cuda_decode stages /tmp/calla-full $c 64 > /tmp/chk/stages-$c.txt 2>&1; echo "stages $c rc $?"; cat /tmp/chk/stages-$c.txt
done
el stages
for r in 1 2; do
  for c in 4096 65536; do
    for v in v9 new; do
      bin=$B/calla; [ $v = v9 ] && bin=build-old/v9
      timeout 100 $bin bench --model /tmp/calla-full --context $c --decode 64 --backend cuda --json /tmp/chk/bench-$c-$v-r$r.json 2>&1 | tail -1 | sed "s/, rss.*//;s/prefill.*decode/decode/;s/^/$v r$r /"
    done
  done
done
python3 - <<'PY'
import json
for c in (4096, 65536):
    for r in (1, 2):
        a = json.load(open(f"/tmp/chk/bench-{c}-v9-r{r}.json")); b = json.load(open(f"/tmp/chk/bench-{c}-new-r{r}.json"))
        print(c, r, "tokens identical to version 9's" if a["tokens"]["ids"] == b["tokens"]["ids"] else "TOKENS DIFFER")
PY
el "A/B"
timeout 200 $B/gpu/test_cuda_decode e2e /tmp/calla-full 4096 48 > /tmp/chk/decode-full.txt 2>&1; echo "decode paths full rc $?"; tail -2 /tmp/chk/decode-full.txt
$B/calla synth --geometry small --seed 1 --out /tmp/calla-small >/dev/null 2>&1; $B/calla synth --geometry tiny --seed 1 --out /tmp/calla-tiny >/dev/null 2>&1
timeout 100 $B/gpu/test_cuda_decode lab > /tmp/chk/decode-lab.txt 2>&1; echo "decode lab rc $?"; grep -E "FAIL|in:|lm_head|gdn" /tmp/chk/decode-lab.txt | head; tail -1 /tmp/chk/decode-lab.txt
timeout 100 $B/gpu/test_cuda_decode e2e /tmp/calla-small 300 16 > /tmp/chk/decode-small.txt 2>&1; echo "decode paths small rc $?"; tail -1 /tmp/chk/decode-small.txt
timeout 100 $B/gpu/test_cuda_decode e2e /tmp/calla-tiny 64 32 > /tmp/chk/decode-tiny.txt 2>&1; echo "decode paths tiny rc $?"; tail -1 /tmp/chk/decode-tiny.txt
el done
tar cf $OUT/checks.tar -C /tmp chk

#!/usr/bin/env bash
# session 17 call 11: route_warp with each lane's keys sorted once (no re-scan, no branch a round) and the model's
# 256 experts as straight-line code; route_warp's test against the CPU twin (ties); decode against version 9; decode paths
set -u
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
rm -rf build-carry; tar xJf .carry/b.txz; mkdir -p build-old; xz -dc .carry/v9.xz > build-old/v9; chmod +x build-old/*
export LD_LIBRARY_PATH=$PWD/build-carry/devlibs
B=build-carry
[ -f /tmp/calla-full/config.json ] || $B/calla synth --geometry full --seed 1 --out /tmp/calla-full >/tmp/synth.log 2>&1
mkdir -p /tmp/chk
timeout 100 $B/gpu/test_cuda_kernels 5 moe > /tmp/chk/kernels-moe.txt 2>&1; echo "kernels moe rc $?"; grep -iE "route|FAIL" /tmp/chk/kernels-moe.txt | head -5; tail -1 /tmp/chk/kernels-moe.txt
el kernels
for r in 1 2; do
  for c in 4096 65536; do
    [ $c = 65536 ] && [ $r = 2 ] && continue
    for v in v9 new; do
      bin=$B/calla; [ $v = v9 ] && bin=build-old/v9
      timeout 100 $bin bench --model /tmp/calla-full --context $c --decode 64 --backend cuda --json /tmp/chk/bench-$c-$v-r$r.json 2>&1 | tail -1 | sed "s/, rss.*//;s/prefill.*decode/decode/;s/^/$v r$r /"
    done
  done
done
python3 - <<'PY'
import json, os
for c in (4096, 65536):
    for r in (1, 2):
        if not os.path.exists(f"/tmp/chk/bench-{c}-v9-r{r}.json"): continue
        a = json.load(open(f"/tmp/chk/bench-{c}-v9-r{r}.json")); b = json.load(open(f"/tmp/chk/bench-{c}-new-r{r}.json"))
        print(c, r, "tokens identical to version 9's" if a["tokens"]["ids"] == b["tokens"]["ids"] else "TOKENS DIFFER")
PY
el "A/B"
timeout 200 $B/gpu/test_cuda_decode e2e /tmp/calla-full 4096 48 > /tmp/chk/decode-full.txt 2>&1; echo "decode paths full rc $?"; tail -2 /tmp/chk/decode-full.txt
$B/calla synth --geometry small --seed 1 --out /tmp/calla-small >/dev/null 2>&1
timeout 100 $B/gpu/test_cuda_decode e2e /tmp/calla-small 300 16 > /tmp/chk/decode-small.txt 2>&1; echo "decode paths small rc $?"; tail -1 /tmp/chk/decode-small.txt
el done
tar cf $OUT/checks.tar -C /tmp chk

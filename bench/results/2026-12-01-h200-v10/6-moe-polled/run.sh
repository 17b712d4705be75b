#!/usr/bin/env bash
# session 17 call 6: the one-launch MoE without a grid barrier: act handed over through its values (empty-tagged,
# alternating buffers; the down rows poll them); A/B against its two launches (CALLA_MOE_FUSED=0) and version 9;
# the lab's bit-identity check; its phases (moetrace); the stage probe; decode paths
set -u
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
rm -rf build-carry; tar xJf .carry/b.txz; mkdir -p build-old; xz -dc .carry/v9.xz > build-old/v9; chmod +x build-old/*
export LD_LIBRARY_PATH=$PWD/build-carry/devlibs
B=build-carry
[ -f /tmp/calla-full/config.json ] || $B/calla synth --geometry full --seed 1 --out /tmp/calla-full >/tmp/synth.log 2>&1
el synth
mkdir -p /tmp/chk
timeout 100 $B/gpu/test_cuda_decode lab > /tmp/chk/decode-lab.txt 2>&1; echo "decode lab rc $?"; grep -E "FAIL|moe" /tmp/chk/decode-lab.txt; tail -1 /tmp/chk/decode-lab.txt
CALLA_PREFILL_FAST=1 timeout 120 $B/gpu/test_cuda_decode moetrace /tmp/calla-full 4096 > /tmp/chk/moetrace-4096.txt 2>&1; echo "moetrace rc $?"; cat /tmp/chk/moetrace-4096.txt
CALLA_PREFILL_FAST=1 timeout 120 $B/gpu/test_cuda_decode stages /tmp/calla-full 4096 64 > /tmp/chk/stages-4096.txt 2>&1; echo "stages rc $?"; cat /tmp/chk/stages-4096.txt
el "lab, trace, stages"
for r in 1 2; do
  for c in 4096 65536; do
    for v in v9 f0 f1; do
      bin=$B/calla; [ $v = v9 ] && bin=build-old/v9
      CALLA_MOE_FUSED=${v#f} timeout 100 $bin bench --model /tmp/calla-full --context $c --decode 64 --backend cuda --json /tmp/chk/bench-$c-$v-r$r.json 2>&1 | tail -1 | sed "s/, rss.*//;s/prefill.*decode/decode/;s/^/$v r$r /"
    done
  done
done
python3 - <<'PY'
import json
for c in (4096, 65536):
    for r in (1, 2):
        a = json.load(open(f"/tmp/chk/bench-{c}-v9-r{r}.json"))
        print(c, r, " ".join(f"{v}:" + ("same" if a["tokens"]["ids"] == json.load(open(f"/tmp/chk/bench-{c}-{v}-r{r}.json"))["tokens"]["ids"] else "DIFFER") for v in ("f0", "f1")), "(ids against version 9's)")
PY
el "A/B"
timeout 200 $B/gpu/test_cuda_decode e2e /tmp/calla-full 4096 48 > /tmp/chk/decode-full.txt 2>&1; echo "decode paths full rc $?"; tail -3 /tmp/chk/decode-full.txt
$B/calla synth --geometry small --seed 1 --out /tmp/calla-small >/dev/null 2>&1; $B/calla synth --geometry tiny --seed 1 --out /tmp/calla-tiny >/dev/null 2>&1
timeout 100 $B/gpu/test_cuda_decode e2e /tmp/calla-small 300 16 > /tmp/chk/decode-small.txt 2>&1; echo "decode paths small rc $?"; tail -1 /tmp/chk/decode-small.txt
timeout 100 $B/gpu/test_cuda_decode e2e /tmp/calla-tiny 64 32 > /tmp/chk/decode-tiny.txt 2>&1; echo "decode paths tiny rc $?"; tail -1 /tmp/chk/decode-tiny.txt
el done
tar cf $OUT/checks.tar -C /tmp chk

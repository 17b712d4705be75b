#!/usr/bin/env bash
# session 17 call 8: are the broadcast reads of a kernel's input (every block reads the same x and norm weights
# from L2) a hot spot? The in-projections read one of R copies of x and its norm (CALLA_XREP=R, the down rows
# writing the copies); MoE as three launches (CALLA_MOE_FUSED=0) in every arm
set -u
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
rm -rf build-carry; tar xJf .carry/b.txz; mkdir -p build-old; xz -dc .carry/v9.xz > build-old/v9; chmod +x build-old/*
export LD_LIBRARY_PATH=$PWD/build-carry/devlibs CALLA_MOE_FUSED=0
B=build-carry
[ -f /tmp/calla-full/config.json ] || $B/calla synth --geometry full --seed 1 --out /tmp/calla-full >/tmp/synth.log 2>&1
el synth
mkdir -p /tmp/chk
CALLA_XREP=8 CALLA_PREFILL_FAST=1 timeout 120 $B/gpu/test_cuda_decode stages /tmp/calla-full 4096 64 > /tmp/chk/stages-4096-x8.txt 2>&1; echo "stages rc $?"; head -5 /tmp/chk/stages-4096-x8.txt
for r in 1 2; do
  for v in v9 x0 x8 x32; do
    bin=$B/calla; [ $v = v9 ] && bin=build-old/v9
    CALLA_XREP=${v#x} timeout 100 $bin bench --model /tmp/calla-full --context 4096 --decode 64 --backend cuda --json /tmp/chk/bench-4096-$v-r$r.json 2>&1 | tail -1 | sed "s/, rss.*//;s/prefill.*decode/decode/;s/^/$v r$r /"
  done
done
python3 - <<'PY'
import json
for r in (1, 2):
    a = json.load(open(f"/tmp/chk/bench-4096-v9-r{r}.json"))
    print(4096, r, " ".join(f"{v}:" + ("same" if a["tokens"]["ids"] == json.load(open(f"/tmp/chk/bench-4096-{v}-r{r}.json"))["tokens"]["ids"] else "DIFFER") for v in ("x0", "x8", "x32")), "(ids against version 9's)")
PY
el "A/B"
tar cf $OUT/checks.tar -C /tmp chk

#!/usr/bin/env bash
# session 17 call 5: what the first loads after a kernel's wait cost (moetrace's load1..3 in the one-launch MoE),
# with the decode activations in separate allocations or carved from one (CALLA_DEC_ONEBUF=1: fewer pages);
# the same A/B on the default three-launch MoE against version 9
set -u
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
rm -rf build-carry; tar xJf .carry/b.txz; mkdir -p build-old; xz -dc .carry/v9.xz > build-old/v9; chmod +x build-old/*
export LD_LIBRARY_PATH=$PWD/build-carry/devlibs
B=build-carry
[ -f /tmp/calla-full/config.json ] || $B/calla synth --geometry full --seed 1 --out /tmp/calla-full >/tmp/synth.log 2>&1
el synth
mkdir -p /tmp/chk
for o in 0 1; do
  CALLA_DEC_ONEBUF=$o CALLA_MOE_FUSED=1 CALLA_PREFILL_FAST=1 timeout 120 $B/gpu/test_cuda_decode moetrace /tmp/calla-full 4096 > /tmp/chk/moetrace-4096-onebuf$o.txt 2>&1; echo "moetrace onebuf $o rc $?"; cat /tmp/chk/moetrace-4096-onebuf$o.txt
done
el trace
for r in 1 2; do
  for c in 4096 65536; do
    for v in v9 b0 b1; do
      bin=$B/calla; [ $v = v9 ] && bin=build-old/v9
      CALLA_DEC_ONEBUF=${v#b} timeout 100 $bin bench --model /tmp/calla-full --context $c --decode 64 --backend cuda --json /tmp/chk/bench-$c-$v-r$r.json 2>&1 | tail -1 | sed "s/, rss.*//;s/prefill.*decode/decode/;s/^/$v r$r /"
    done
  done
done
python3 - <<'PY'
import json
for c in (4096, 65536):
    for r in (1, 2):
        a = json.load(open(f"/tmp/chk/bench-{c}-v9-r{r}.json"))
        print(c, r, " ".join(f"{v}:" + ("same" if a["tokens"]["ids"] == json.load(open(f"/tmp/chk/bench-{c}-{v}-r{r}.json"))["tokens"]["ids"] else "DIFFER") for v in ("b0", "b1")), "(ids against version 9's)")
PY
el "A/B"
tar cf $OUT/checks.tar -C /tmp chk

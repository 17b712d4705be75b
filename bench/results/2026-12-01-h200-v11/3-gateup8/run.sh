#!/usr/bin/env bash
# session 18 call 3: the gate/up tile on 8 warps (each matrix's K in quarters: two super-steps a warp, loaded at once), the
# routing inline. Lab check (8 vs 4 warps vs a double reference) + memcheck; A/B against version 10's binary and
# CALLA_GATEUP_WARPS=4; decode paths; the stage probe at 4K.
set -u
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
rm -rf build-carry; tar xJf .carry/b.txz; mkdir -p build-old; xz -dc .carry/v10.xz > build-old/v10; chmod +x build-old/*
export LD_LIBRARY_PATH=$PWD/build-carry/devlibs
B=build-carry
mkdir -p /tmp/chk
[ -f /tmp/calla-full/config.json ] || $B/calla synth --geometry full --seed 1 --out /tmp/calla-full >/tmp/synth.log 2>&1 &
timeout 100 $B/gpu/test_cuda_decode lab 100 > /tmp/chk/lab-gdnout.txt 2>&1; echo "lab 100 rc $?"; cat /tmp/chk/lab-gdnout.txt
timeout 150 compute-sanitizer --tool memcheck $B/gpu/test_cuda_decode lab 100 > /tmp/chk/memcheck.txt 2>&1; echo "memcheck rc $?"; tail -2 /tmp/chk/memcheck.txt
wait
el lab
for r in 1 2; do
  for c in 4096 65536; do
    [ $c = 65536 ] && [ $r = 2 ] && continue
    for v in v10 new off; do
      bin=$B/calla; [ $v = v10 ] && bin=build-old/v10
      g=8; [ $v = off ] && g=4
      CALLA_GATEUP_WARPS=$g timeout 100 $bin bench --model /tmp/calla-full --context $c --decode 64 --backend cuda --json /tmp/chk/bench-$c-$v-r$r.json 2>&1 | tail -1 | sed "s/, rss.*//;s/prefill.*decode/decode/;s/^/$v r$r /"
    done
  done
done
python3 - <<'PY'
import json, os
for c in (4096, 65536):
    for r in (1, 2):
        for v in ("new", "off"):
            if not os.path.exists(f"/tmp/chk/bench-{c}-{v}-r{r}.json"): continue
            a = json.load(open(f"/tmp/chk/bench-{c}-v10-r{r}.json")); b = json.load(open(f"/tmp/chk/bench-{c}-{v}-r{r}.json"))
            ia, ib = a["tokens"]["ids"], b["tokens"]["ids"]
            first = next((i for i, (x, y) in enumerate(zip(ia, ib)) if x != y), None)
            print(c, r, v, f"ids equal to v10's: {sum(x == y for x, y in zip(ia, ib))}/{len(ia)}, first difference at {first}")
PY
el "A/B"
timeout 200 $B/gpu/test_cuda_decode e2e /tmp/calla-full 4096 48 > /tmp/chk/decode-full.txt 2>&1; echo "decode paths full rc $?"; tail -3 /tmp/chk/decode-full.txt
$B/calla synth --geometry small --seed 1 --out /tmp/calla-small >/dev/null 2>&1
timeout 100 $B/gpu/test_cuda_decode e2e /tmp/calla-small 300 16 > /tmp/chk/decode-small.txt 2>&1; echo "decode paths small rc $?"; tail -2 /tmp/chk/decode-small.txt
el decode-paths
timeout 120 $B/gpu/test_cuda_decode stages /tmp/calla-full 4096 64 > /tmp/chk/stages-4096.txt 2>&1; echo "stages rc $?"; cat /tmp/chk/stages-4096.txt | tail -16
el stages
el done
tar cf $OUT/checks.tar -C /tmp chk

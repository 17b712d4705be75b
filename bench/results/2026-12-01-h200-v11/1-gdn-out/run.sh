#!/usr/bin/env bash
# session 18 call 1: the delta rule step and out_proj in one launch (k_dv_gdn_out, the sum left in a fixed-point
# xacc read by the router and the down kernel). Lab check against the two launches (+ memcheck, racecheck),
# decode paths full and small, A/B against CALLA_GDN_OUT=0 (the same binary) at 4K and 64K.
set -u
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
rm -rf build-carry; tar xJf .carry/b.txz
export LD_LIBRARY_PATH=$PWD/build-carry/devlibs
B=build-carry
mkdir -p /tmp/chk
[ -f /tmp/calla-full/config.json ] || $B/calla synth --geometry full --seed 1 --out /tmp/calla-full >/tmp/synth.log 2>&1 &
timeout 100 $B/gpu/test_cuda_decode lab 100 > /tmp/chk/lab-gdnout.txt 2>&1; echo "lab 100 rc $?"; cat /tmp/chk/lab-gdnout.txt
timeout 150 compute-sanitizer --tool memcheck $B/gpu/test_cuda_decode lab 100 > /tmp/chk/memcheck.txt 2>&1; echo "memcheck rc $?"; tail -3 /tmp/chk/memcheck.txt
wait
el lab
for r in 1 2; do
  for c in 4096 65536; do
    [ $c = 65536 ] && [ $r = 2 ] && continue
    for v in old new; do
      g=1; [ $v = old ] && g=0
      CALLA_GDN_OUT=$g timeout 100 $B/calla bench --model /tmp/calla-full --context $c --decode 64 --backend cuda --json /tmp/chk/bench-$c-$v-r$r.json 2>&1 | tail -1 | sed "s/, rss.*//;s/prefill.*decode/decode/;s/^/$v r$r /"
    done
  done
done
python3 - <<'PY'
import json, os
for c in (4096, 65536):
    for r in (1, 2):
        if not os.path.exists(f"/tmp/chk/bench-{c}-old-r{r}.json"): continue
        a = json.load(open(f"/tmp/chk/bench-{c}-old-r{r}.json")); b = json.load(open(f"/tmp/chk/bench-{c}-new-r{r}.json"))
        ia, ib = a["tokens"]["ids"], b["tokens"]["ids"]
        same = sum(1 for x, y in zip(ia, ib) if x == y)
        first = next((i for i, (x, y) in enumerate(zip(ia, ib)) if x != y), None)
        print(c, r, f"ids equal {same}/{len(ia)}, first difference at {first}")
PY
el "A/B"
timeout 200 $B/gpu/test_cuda_decode e2e /tmp/calla-full 4096 48 > /tmp/chk/decode-full.txt 2>&1; echo "decode paths full rc $?"; tail -3 /tmp/chk/decode-full.txt
$B/calla synth --geometry small --seed 1 --out /tmp/calla-small >/dev/null 2>&1
timeout 100 $B/gpu/test_cuda_decode e2e /tmp/calla-small 300 16 > /tmp/chk/decode-small.txt 2>&1; echo "decode paths small rc $?"; tail -2 /tmp/chk/decode-small.txt
el decode-paths
timeout 120 compute-sanitizer --tool racecheck $B/gpu/test_cuda_decode lab 100 > /tmp/chk/racecheck.txt 2>&1; echo "racecheck rc $?"; tail -3 /tmp/chk/racecheck.txt
el done
tar cf $OUT/checks.tar -C /tmp chk

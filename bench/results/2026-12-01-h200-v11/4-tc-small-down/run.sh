#!/usr/bin/env bash
# session 18 call 4: o_proj / out_proj on the tensor cores (8 warps a 16-row task, CALLA_TC_SMALL) and the MoE down
# products on the tensor cores (a warp an expert, CALLA_DOWN_TC), over call 3's 8-warp gate/up. The kernel lab (every
# case; the MoE forms against double references) + memcheck; A/B against version 10's binary and each knob off;
# decode paths full / small; the stage probe at 4K.
set -u
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
rm -rf build-carry; tar xJf .carry/b.txz; mkdir -p build-old; xz -dc .carry/v10.xz > build-old/v10; chmod +x build-old/*
export LD_LIBRARY_PATH=$PWD/build-carry/devlibs
B=build-carry
mkdir -p /tmp/chk
[ -f /tmp/calla-full/config.json ] || $B/calla synth --geometry full --seed 1 --out /tmp/calla-full >/tmp/synth.log 2>&1 &
timeout 150 $B/gpu/test_cuda_decode lab > /tmp/chk/lab.txt 2>&1; echo "lab rc $?"; grep -E "o_proj|gate/up|down|passed" /tmp/chk/lab.txt
timeout 150 compute-sanitizer --tool memcheck $B/gpu/test_cuda_decode lab 100 > /tmp/chk/memcheck.txt 2>&1; echo "memcheck rc $?"; tail -1 /tmp/chk/memcheck.txt
wait
el lab
for r in 1 2; do
  for c in 4096 65536; do
    [ $c = 65536 ] && [ $r = 2 ] && continue
    for v in v10 new nosmall nodown; do
      bin=$B/calla; [ $v = v10 ] && bin=build-old/v10
      s=1; d=1; [ $v = nosmall ] && s=0; [ $v = nodown ] && d=0
      CALLA_TC_SMALL=$s CALLA_DOWN_TC=$d timeout 100 $bin bench --model /tmp/calla-full --context $c --decode 64 --backend cuda --json /tmp/chk/bench-$c-$v-r$r.json 2>&1 | tail -1 | sed "s/, rss.*//;s/prefill.*decode/decode/;s/^/$v r$r /"
    done
  done
done
python3 - <<'PY'
import json, os
for c in (4096, 65536):
    for r in (1, 2):
        for v in ("new", "nosmall", "nodown"):
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
timeout 120 $B/gpu/test_cuda_decode stages /tmp/calla-full 4096 64 > /tmp/chk/stages-4096.txt 2>&1; echo "stages rc $?"; tail -14 /tmp/chk/stages-4096.txt
el done
tar cf $OUT/checks.tar -C /tmp chk

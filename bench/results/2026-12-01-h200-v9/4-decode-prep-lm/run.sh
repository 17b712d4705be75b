#!/usr/bin/env bash
# session 16 call 4: decode: RoPE cos/sin before the wait and v read with the input in the attention
# prep; lm_head prefetch A/B (CALLA_LM_PREFETCH=0); the host's share of a step (replay); the score
# gate (issue 13) on this tree's prefill (the shared gate in the norm)
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
    for v in mid new lm0; do
      bin=$B/calla; [ $v = mid ] && bin=build-old/mid
      env $([ $v = lm0 ] && echo CALLA_LM_PREFETCH=0) timeout 100 $bin bench --model /tmp/calla-full --context $c --decode 64 --backend cuda --json /tmp/chk/bench-$c-$v-r$r.json 2>&1 | tail -1 | sed "s/, rss.*//;s/prefill.*decode/decode/;s/^/$v r$r /"
    done
  done
done
python3 - <<'PY'
import json
for c in (4096, 65536):
    for r in (1, 2):
        a = json.load(open(f"/tmp/chk/bench-{c}-mid-r{r}.json")); b = json.load(open(f"/tmp/chk/bench-{c}-new-r{r}.json"))
        print(c, r, "tokens identical to call 3's" if a["tokens"]["ids"] == b["tokens"]["ids"] else "TOKENS DIFFER")
PY
el "A/B"
for c in 4096 65536; do timeout 100 $B/gpu/test_cuda_decode replay /tmp/calla-full $c 64 > /tmp/chk/replay-$c.txt 2>&1; tail -2 /tmp/chk/replay-$c.txt; done
timeout 200 $B/gpu/test_cuda_decode e2e /tmp/calla-full 4096 48 > /tmp/chk/decode-full.txt 2>&1; echo "decode paths full rc $?"; tail -2 /tmp/chk/decode-full.txt
el decode
timeout 300 python3 tools/score_gate.py --calla $B/calla --model /tmp/calla-full --len 4096 --backends cuda-exact,cuda --hf-device cuda --greedy 300,4096 --gen 64 --out /tmp/sg > /tmp/chk/score-gate.log 2>&1
echo "score gate rc $?"; tail -22 /tmp/chk/score-gate.log
cp /tmp/sg/summary.md /tmp/chk/ 2>/dev/null
el done
tar cf $OUT/checks.tar -C /tmp chk

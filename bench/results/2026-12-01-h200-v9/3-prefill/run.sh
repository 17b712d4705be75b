#!/usr/bin/env bash
# session 16 call 3: prefill (issue 12): o/out_proj add into the residual in their epilogue, the
# shared-expert gate in the post-attention norm (router alone in the exact product), flash writing
# o's bf16 copy; kernel checks, lab, A/B against v8 (ceefcc6), e2e / chunking, the layer check
set -u
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
rm -rf build-carry; tar xJf .carry/b.txz; mkdir -p build-old; xz -dc .carry/old.xz > build-old/calla; chmod +x build-old/*
export LD_LIBRARY_PATH=$PWD/build-carry/devlibs
B=build-carry
( [ -f /tmp/calla-full/config.json ] || $B/calla synth --geometry full --seed 1 --out /tmp/calla-full >/tmp/synth.log 2>&1; $B/calla synth --geometry small --seed 1 --out /tmp/calla-small >/dev/null 2>&1; echo done > /tmp/synth-done ) &
mkdir -p /tmp/chk
for s in add gate attention moe; do
  stdbuf -oL timeout 150 $B/gpu/test_cuda_kernels 5 $s > /tmp/chk/kernels-$s.txt 2>&1
  echo "kernels $s rc $?: $(grep -c PASS /tmp/chk/kernels-$s.txt) PASS, $(grep -c FAIL /tmp/chk/kernels-$s.txt) FAIL"; grep -E "FAIL" /tmp/chk/kernels-$s.txt | head -5; tail -1 /tmp/chk/kernels-$s.txt
done
grep -E "bf16 o" /tmp/chk/kernels-attention.txt | head -8
timeout 150 $B/gpu/bench_cuda_kernels 4096 > /tmp/chk/kspeed.txt 2>&1; echo "kspeed rc $?"; grep -iE "add|gate|bf16 store|k_to_bf16|router" /tmp/chk/kspeed.txt | head -20
el checks
for i in $(seq 1 100); do [ -f /tmp/synth-done ] && break; sleep 2; done
for c in 4096 65536; do
  for r in 1 2; do
    for v in old new; do
      bin=$B/calla; [ $v = old ] && bin=build-old/calla
      timeout 100 $bin bench --model /tmp/calla-full --context $c --decode 32 --backend cuda --json /tmp/chk/bench-$c-$v-r$r.json 2>&1 | tail -1 | sed "s/, rss.*//;s/^/$v r$r /"
    done
  done
done
python3 - <<'PY'
import json
for c in (4096, 65536):
    for r in (1, 2):
        a = json.load(open(f"/tmp/chk/bench-{c}-old-r{r}.json")); b = json.load(open(f"/tmp/chk/bench-{c}-new-r{r}.json"))
        ia, ib = a["tokens"]["ids"], b["tokens"]["ids"]
        same = sum(1 for x, y in zip(ia, ib) if x == y)
        first = next((i for i, (x, y) in enumerate(zip(ia, ib)) if x != y), None)
        print(c, r, "greedy ids identical to v8" if ia == ib else f"ids differ from v8 from step {first} ({same}/{len(ia)} equal)")
PY
el "A/B"
timeout 120 $B/gpu/test_cuda_e2e /tmp/calla-small 300 8 > /tmp/chk/e2e-small.txt 2>&1; echo "e2e small 300+8 rc $?"; tail -1 /tmp/chk/e2e-small.txt
timeout 120 $B/gpu/test_cuda_chunking /tmp/calla-small 2600 > /tmp/chk/chunking-small.txt 2>&1; echo "chunking small 2600 rc $?"; tail -1 /tmp/chk/chunking-small.txt
el e2e
timeout 240 $B/gpu/test_cuda_layers /tmp/calla-full 4096 > /tmp/chk/layers-n4096.txt 2>&1; echo "layers rc $?"; tail -8 /tmp/chk/layers-n4096.txt
el layers
tar cf $OUT/checks.tar -C /tmp chk

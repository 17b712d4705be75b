#!/usr/bin/env bash
# session 13 call 2: PDL x preload A/B at 4K; prefill per-kernel profile; prefill kernel speeds
set -u
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
[ -d build-carry ] || tar xJf .carry/b.txz
export LD_LIBRARY_PATH=$PWD/build-carry/devlibs
B=build-carry
[ -f /tmp/calla-full/config.json ] || $B/calla synth --geometry full --seed 1 --out /tmp/calla-full >/dev/null 2>&1
el synth
ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv -c 1600 \
    $B/calla bench --model /tmp/calla-full --context 4096 --decode 1 --backend cuda >/tmp/ncu-prefill.csv 2>/tmp/ncu-prefill.err
echo "ncu rc $?"; tail -5 /tmp/ncu-prefill.err; grep -c . /tmp/ncu-prefill.csv
python3 .carry/ncusum.py /tmp/ncu-prefill.csv > $OUT/ncu-prefill-sum.txt 2>&1; head -45 $OUT/ncu-prefill-sum.txt
xz -T4 -c /tmp/ncu-prefill.csv > $OUT/ncu-prefill.csv.xz
el ncu-prefill
b() { # label ctx env...
  local lab=$1 ctx=$2; shift 2
  env "$@" timeout 150 $B/calla bench --model /tmp/calla-full --context $ctx --decode 64 --backend cuda --json $OUT/bench-$ctx-$lab.json 2>&1 | tail -1 | sed "s/^/[$lab] /; s/, rss.*//"
}
b pre0 4096 CALLA_DV_PRE=0; b pdl-pre1 4096 CALLA_PDL=1; b pdl-pre0 4096 CALLA_PDL=1 CALLA_DV_PRE=0; b pdl-pre1-pf0 4096 CALLA_PDL=1 CALLA_DV_PREFETCH=0
el bench
timeout 200 $B/gpu/bench_cuda_kernels 4096 > $OUT/kspeed.txt 2>&1; tail -40 $OUT/kspeed.txt
el kspeed

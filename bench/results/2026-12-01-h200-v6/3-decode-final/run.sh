#!/usr/bin/env bash
# session 13 call 3: decode final (PDL default) checks + A/B; prefill per-kernel profile; qmatmul_bf16 stall profile
set -u
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
rm -rf build-carry; tar xJf .carry/b.txz
export LD_LIBRARY_PATH=$PWD/build-carry/devlibs
B=build-carry
[ -f /tmp/calla-full/config.json ] || ( $B/calla synth --geometry full --seed 1 --out /tmp/calla-full >/tmp/synth.log 2>&1 ) &
SP=$!
GPU_CHECK_OUT=$OUT GPU_CHECK_STAGES="decode" tools/gpu_check.sh $B > $OUT/checks.txt 2>&1
el checks; tail -6 $OUT/checks.txt
wait $SP
timeout 120 $B/gpu/test_cuda_decode e2e /tmp/calla-full 4096 32 > $OUT/paths-full-4096.txt 2>&1; echo "paths rc $?"; tail -9 $OUT/paths-full-4096.txt
el paths
b() { # label ctx env...
  local lab=$1 ctx=$2; shift 2
  env "$@" timeout 200 $B/calla bench --model /tmp/calla-full --context $ctx --decode 64 --backend cuda --json $OUT/bench-$ctx-$lab.json 2>&1 | tail -1 | sed "s/^/[$lab] /; s/, rss.*//"
}
b pdl 4096 X=1; b nopdl 4096 CALLA_PDL=0; b pdl 65536 X=1; b nopdl 65536 CALLA_PDL=0; b pdl 262079 X=1
el bench
ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv -c 1600 \
    $B/calla bench --model /tmp/calla-full --context 4096 --decode 1 --backend cuda --json /tmp/x.json >/tmp/ncu-prefill.csv 2>/tmp/ncu-prefill.err
echo "ncu rc $?"; grep -v "^==PROF==" /tmp/ncu-prefill.err | tail -3
python3 .carry/ncusum.py /tmp/ncu-prefill.csv > $OUT/ncu-prefill-sum.txt 2>&1; head -45 $OUT/ncu-prefill-sum.txt
xz -T4 -c /tmp/ncu-prefill.csv > $OUT/ncu-prefill.csv.xz
el ncu-prefill
ncu --clock-control none --cache-control none -k regex:qmatmul_bf16 --launch-skip 1 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis --section Occupancy --section SchedulerStats --section LaunchStats \
    $B/gpu/bench_cuda_kernels 4096 > /tmp/ncu-qmm.txt 2>&1
grep -E "Duration|Throughput|Occupancy|Stall|Issue|Warp Cycles|Eligible|Active Warps|Registers|Grid|Block Size|Pipe|One or More|No Eligible|Executed Ipc" /tmp/ncu-qmm.txt | head -50
tar cf - -C /tmp ncu-qmm.txt | xz > $OUT/ncu-qmm.txz
el ncu-qmm

#!/usr/bin/env bash
# On the H200 machine with a carried build (tools/device/devlibs.sh): the decode kernels and paths.
#   tools/device/device_decode.sh BUILD [CONTEXTS] [STAGES]
# Stages (default all): kernels (test_cuda_kernels), lab (k_dv against a double reference, GB/s),
# ncu (hardware counters of two k_dv cases, per-kernel times of one decode step at 4K), small (the
# decode paths against each other and the CPU oracle at the tiny and small geometries), full (the
# full shape's paths at each context: graph+PDL, graph, eager, ms/step). Logs under $OUT.
set -u
b=${1:-build}
ctxs=${2:-4096}
stages=${3:-kernels lab ncu small full}
export LD_LIBRARY_PATH=$PWD/$b/devlibs PYTHONUNBUFFERED=1
out=${OUT:-/tmp/out}
mkdir -p "$out"
has() { [[ " $stages " == *" $1 "* ]]; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
full() { [ -f /tmp/calla-full/config.json ] || "$b/calla" synth --geometry full --seed 1 --out /tmp/calla-full >/dev/null; }
if has kernels; then
    "$b/gpu/test_cuda_kernels" $RANDOM >"$out/kernels.txt" 2>&1; echo "test_cuda_kernels: rc $? $(tail -1 "$out/kernels.txt")"
fi
has lab && "$b/lab/decode_lab" lab 2>&1 | tee "$out/lab.txt"
if has ncu; then
    for c in 6 0; do
        ncu --clock-control none --section SpeedOfLight --section Occupancy --section WarpStateStats \
            --section LaunchStats -k regex:dv_kernel --launch-skip 3 --launch-count 1 \
            "$b/lab/decode_lab" lab $c >"$out/ncu-lab$c.txt" 2>&1
        grep -E "Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers|Stall|Issue|Warp Cycles Per Issued|Eligible|Grid Size|Block Limit" "$out/ncu-lab$c.txt" | head -40
    done
    full
    ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv \
        "$b/lab/decode_lab" profile /tmp/calla-full 4096 >"$out/ncu-step.csv" 2>"$out/ncu-step.err"
    python3 - "$out/ncu-step.csv" <<'PY'
import csv, sys, collections, re
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
h = rows[0]; ki = h.index("Kernel Name"); vi = h.index("Metric Value"); ui = h.index("Metric Unit")
tot = collections.OrderedDict()
for r in rows[1:]:
    name = re.sub(r"\(.*", "", r[ki])[:40]; v = float(r[vi].replace(",", ""))
    v = v / 1000 if r[ui] == "nsecond" else v * 1000 if r[ui] == "msecond" else v
    n, t = tot.get(name, (0, 0.0)); tot[name] = (n + 1, t + v)
s = sum(t for n, t in tot.values())
print(f"one decode step at 4K, eager: {sum(n for n, t in tot.values())} kernels, {s:.1f} us of kernel time")
for k, (n, t) in sorted(tot.items(), key=lambda x: -x[1][1]): print(f"{k:42s} {n:4d} {t:9.1f} us {t/n:7.2f} us/launch")
PY
fi
if has ncugate; then   # every section for one launch of each MoE kernel in a real decode step
    full
    for k in dv_gateup_kernel dv_down_kernel; do
        ncu --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy \
            --section WarpStateStats --section LaunchStats --section MemoryWorkloadAnalysis -k regex:$k --launch-count 1 \
            "$b/lab/decode_lab" profile /tmp/calla-full 4096 >"$out/ncu-$k.txt" 2>&1
        grep -E "Duration|DRAM Throughput|L1/TEX Cache|Achieved Occupancy|Warp Cycles Per Issued|Est. Local|stalled|Grid Size" \
            "$out/ncu-$k.txt" | head -14
    done
fi
if has small; then
    for g in tiny small; do "$b/calla" synth --geometry $g --seed 1 --out /tmp/calla-$g >/dev/null; done
    "$b/gpu/test_cuda_decode" e2e /tmp/calla-tiny 64 32 2>&1 | tee "$out/e2e-tiny.txt" | tail -9
    "$b/gpu/test_cuda_decode" e2e /tmp/calla-small 300 16 2>&1 | tee "$out/e2e-small.txt" | tail -9
fi
if has full; then
    full
    for c in $ctxs; do
        "$b/gpu/test_cuda_decode" e2e /tmp/calla-full $c 48 2>&1 | tee "$out/e2e-full-$c.txt" | tail -8
    done
fi
if has bench; then
    full
    for c in $ctxs; do
        "$b/calla" bench --model /tmp/calla-full --context $c --decode 64 --backend cuda --json "$out/bench-$c.json" 2>&1 | tail -1
    done
fi

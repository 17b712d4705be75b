#!/usr/bin/env bash
# session 12 call 1: HEAD (fe12f00) checks; nsys profile of prefill 4K + decode 4K in graph
set -u
tar xJf .carry/b.txz
export LD_LIBRARY_PATH=$PWD/build-carry/devlibs
B=build-carry
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
( $B/calla synth --geometry full --seed 1 --out /tmp/calla-full >/tmp/synth.log 2>&1; echo synth rc $? >>/tmp/synth.log ) &
SP=$!
GPU_CHECK_OUT=$OUT GPU_CHECK_STAGES="kernels decode gdn small sanitizer" tools/gpu_check.sh $B > $OUT/gpucheck-a.txt 2>&1
tail -16 $OUT/gpucheck-a.txt
wait $SP; tail -1 /tmp/synth.log
which nsys; nsys --version
nsys profile --cuda-graph-trace=node -t cuda -o /tmp/prof -f true $B/calla bench --model /tmp/calla-full --context 4096 --decode 24 --backend cuda --json $OUT/bench-nsys.json > $OUT/nsys.log 2>&1
tail -3 $OUT/nsys.log
nsys stats -q -r cuda_gpu_trace -f csv -o /tmp/trace /tmp/prof.nsys-rep > /dev/null 2>&1; ls /tmp/trace*
python3 .carry/nsyssum.py /tmp/trace_cuda_gpu_trace.csv | tee $OUT/nsys-sum.txt
xz -T4 -c /tmp/trace_cuda_gpu_trace.csv > $OUT/trace.csv.xz
for c in 4096 65536; do $B/calla bench --model /tmp/calla-full --context $c --decode 64 --backend cuda --json $OUT/bench-$c.json 2>&1 | tail -1; done
GPU_CHECK_OUT=$OUT GPU_CHECK_E2E_TIMEOUT=400 GPU_CHECK_STAGES="full" tools/gpu_check.sh $B > $OUT/gpucheck-b.txt 2>&1
tail -4 $OUT/gpucheck-b.txt

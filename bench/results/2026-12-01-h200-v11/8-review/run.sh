#!/usr/bin/env bash
# session 18 call 8 (review tree: the tensor-core launchers share dv_tc_tasks / dv_tc_smem, host code only):
# the kernel lab (o_proj's 8-warp dispatch among its cases) and a 4K decode bench.
set -u
rm -rf build-carry; tar xJf .carry/b.txz
export LD_LIBRARY_PATH=$PWD/build-carry/devlibs
timeout 100 build-carry/gpu/test_cuda_decode lab > $OUT/decode-lab.txt 2>&1; echo "decode lab rc $?"; grep -E "o_proj|passed" $OUT/decode-lab.txt
build-carry/calla synth --geometry full --seed 1 --out /tmp/calla-full >/dev/null 2>&1
timeout 100 build-carry/calla bench --model /tmp/calla-full --context 4096 --decode 64 --backend cuda --json $OUT/bench-4096.json 2>&1 | tail -1 | sed "s/, rss.*//"

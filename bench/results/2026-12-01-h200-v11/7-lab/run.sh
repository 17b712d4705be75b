#!/usr/bin/env bash
# session 18 call 7 (tree after 14ab086: the lab's MoE timing loop as a helper): the kernel lab once more.
set -u
rm -rf build-carry; tar xJf .carry/b.txz
export LD_LIBRARY_PATH=$PWD/build-carry/devlibs
timeout 150 build-carry/gpu/test_cuda_decode lab > $OUT/decode-lab.txt 2>&1; echo "decode lab rc $?"; tail -12 $OUT/decode-lab.txt

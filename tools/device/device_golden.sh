#!/usr/bin/env bash
# On the H200 machine: reference fixtures for the test geometries (HF fp32 on the CPU), the
# full-shape synthetic checkpoint (timed) with `calla info`, and the full-shape comparison of
# the CPU engine against HF in bf16 on the GPU. Writes logs and fixtures under $OUT.
# usage (from the repo root, with BUILD carried): tools/device/device_golden.sh BUILD
set -u
b=${1:-build}
export LD_LIBRARY_PATH=$PWD/$b/devlibs PYTHONUNBUFFERED=1
out=${OUT:-/tmp/out}
mkdir -p "$out"
echo "== machine"; nproc; free -g | head -2; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
echo "== goldens (tiny, small)"
python3 tools/gen/make_golden.py --calla "$b/calla" --out "$out/golden" --geometries tiny,small 2>&1 | tee "$out/golden.log"
CALLA_GOLDEN_FILES=$(ls "$out"/golden/*.golden | tr '\n' ':') "$b/tests/test_golden" 2>&1 | tee "$out/test_golden.log" | tail -30
echo "== full-shape synth"
df -h /tmp | tail -1
/usr/bin/time -f "synth wall %e s, max rss %M KB" "$b/calla" synth --geometry full --seed 1 --out /tmp/full 2>&1 | tee "$out/synth-full.log"
du -sb /tmp/full | tee -a "$out/synth-full.log"
"$b/calla" info /tmp/full 2>&1 | tee "$out/info-full.txt"
echo "== full-shape HF (bf16, GPU)"
/usr/bin/time -f "hf wall %e s" python3 tools/gen/make_golden.py --calla "$b/calla" --out "$out/golden-full" --geometries full \
    --device cuda --dtype bf16 --model-dir /tmp/full --gen 8 2>&1 | tee "$out/golden-full.log"
echo "== full-shape CPU engine vs HF"
CALLA_GOLDEN_FILES="$out/golden-full/full-p16.golden" CALLA_GOLDEN_MODEL=/tmp/full CALLA_BACKEND=cpu \
    /usr/bin/time -f "cpu engine wall %e s" "$b/tests/test_golden" 2>&1 | tee "$out/full-cpu-vs-hf.log"

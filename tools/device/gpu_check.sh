#!/usr/bin/env bash
# gpu_check.sh [--out DIR] BUILD: every GPU check on an sm_90 machine, then a summary table.
#
#   make gpu-check                           builds build/calla and build/gpu/*, runs everything
#   tools/device/gpu_check.sh build          runs with binaries already built (a carried build)
#   tools/device/gpu_check.sh --out DIR build   keeps the log, bench JSON and score gate in DIR
# The outputs go to a fresh temporary directory unless DIR (or GPU_CHECK_OUT) names one: a check
# run writes nothing into the tree, and the path is printed first and last.
# End-to-end comparisons with the CPU oracle (test_cuda_e2e, test_cuda_chunking) run in the
# verification mode (they set CALLA_EXACT=1: fp32-level products); the fast mode's tensor-core
# products are checked per kernel (kernels, decode lab, both modes) and bounded loosely against the
# exact mode by test_cuda_decode e2e, and layer by layer against the CPU oracle by the layers stage
# (test_cuda_layers: every layer fed the oracle's input). The sanitizer stage runs both modes.
# Environment:
#   GPU_CHECK_STAGES   which stages (default "kernels kspeed decode gdn small sanitizer full layers
#                      score timing bench"; also "racecheck"). "score": tools/device/score_gate.py at
#                      the full shape over GPU_CHECK_SCORE_LEN tokens (4096): HF fp32 the reference,
#                      CUDA exact (CALLA_EXACT=1, gated: top-1 >= 99.5% where HF's margin > 0.05), CUDA
#                      fast (reported), the CPU oracle with fp32 KV (gated: logit error <= 1e-4 at 99%
#                      of positions, <= 1e-2 at all; score_gate.py says why), HF bf16
#                      (reported), and the greedy arm: HF fp32's 64 greedy tokens after the first
#                      GPU_CHECK_SCORE_GREEDY prompt lengths (300,4096) teacher-forced through CUDA's
#                      decode path in both modes (exact gated: every clear step equal), under timeout
#                      GPU_CHECK_SCORE_TIMEOUT seconds (3600); each prompt length must be at most
#                      GPU_CHECK_SCORE_LEN). "layers": test_cuda_layers at the full shape, the fast
#                      mode against the CPU oracle layer by layer, each layer fed the oracle's input, over
#                      GPU_CHECK_LAYERS_LEN positions (4096: ~80 s of CPU oracle on 16 cores, about
#                      2.5 minutes in all on the H200), with the exact mode as control, under timeout
#                      GPU_CHECK_LAYERS_TIMEOUT seconds (900)
#   GPU_CHECK_OUT      where the outputs go, as --out (default: a new mktemp -d); the log is
#                      gpu-check-DATE-COMMIT.txt
#   GPU_CHECK_TMP      where synthetic checkpoints are written (default /tmp; full needs ~20 GB)
set -u
OUTDIR=${GPU_CHECK_OUT:-}
if [ "${1:-}" = --out ]; then
    [ $# -ge 2 ] || { echo "gpu_check: --out needs a directory" >&2; exit 2; }
    OUTDIR=$2
    shift 2
fi
B=${1:-build}
STAGES=${GPU_CHECK_STAGES:-kernels kspeed decode gdn small sanitizer full layers score timing bench}
[ -n "$OUTDIR" ] || OUTDIR=$(mktemp -d "${TMPDIR:-/tmp}/calla-gpu-check-XXXXXX") || exit 1
TMP=${GPU_CHECK_TMP:-/tmp}
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
date=$(date -u +%Y-%m-%d)
mkdir -p "$OUTDIR"
LOG="$OUTDIR/gpu-check-$date-$commit.txt"
: >"$LOG"
declare -a ROWS=()
say() { echo "$@" | tee -a "$LOG"; }
row() { ROWS+=("$(printf '%-34s %-6s %s' "$1" "$2" "$3")"); }
# run_step NAME COMMAND...: runs, logs, records PASS/FAIL and the wall time. PASS needs exit status
# 0 and no "ran nothing" in the output: a program that found no GPU or skipped its work (the
# tests/gpu programs exit 77 then; older ones print "ran nothing" and exit 0) is a FAIL, never a PASS.
run_step() {
    local name=$1; shift
    say "## $name: $*"
    local t0=$(date +%s%N) out
    out=$(mktemp)
    "$@" 2>&1 | tee -a "$LOG" "$out"
    local rc=${PIPESTATUS[0]} note=""
    local ms=$((($(date +%s%N) - t0) / 1000000))
    if grep -q "ran nothing" "$out" || [ "$rc" = 77 ]; then
        note=" (ran nothing)"
        [ "$rc" = 0 ] && rc=77
    fi
    rm -f "$out"
    row "$name" "$([ $rc = 0 ] && echo PASS || echo FAIL)" "$((ms / 1000)).$(((ms % 1000) / 100)) s$note"
    return $rc
}

# The full-shape checkpoint in the default (trained) synth profile; one of another profile, or
# from before profiles (no calla_synth.json), is written again.
full_ckpt() {
    grep -q '"profile": "trained"' "$TMP/calla-full/calla_synth.json" 2>/dev/null && return 0
    rm -rf "$TMP/calla-full"
    run_step "synth full shape" "$B/calla" synth --geometry full --seed 1 --out "$TMP/calla-full"
}

say "# calla gpu-check  commit $commit  date $date  outputs in $OUTDIR"
say "# $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1)"
for st in $STAGES; do
    case $st in
    kernels)
        run_step "kernels vs CPU twins" "$B/gpu/test_cuda_kernels" $RANDOM
        run_step "the choice on the device (k_pick)" "$B/gpu/test_cuda_pick" $RANDOM ;;
    kspeed) run_step "prefill kernel speed (no asserts)" "$B/lab/prefill_kernels" 4096 ;;
    decode)   # the fused decode kernels against a double reference (and their GB/s), then the
              # decode paths (graph ± PDL, eager) against each other and the CPU oracle
        "$B/calla" synth --geometry small --seed 1 --out "$TMP/calla-small" >/dev/null 2>&1
        "$B/calla" synth --geometry tiny --seed 1 --out "$TMP/calla-tiny" >/dev/null 2>&1
        run_step "decode kernel lab" "$B/lab/decode_lab" lab
        run_step "decode paths tiny 64+32" "$B/gpu/test_cuda_decode" e2e "$TMP/calla-tiny" 64 32
        run_step "decode paths small 300+16" "$B/gpu/test_cuda_decode" e2e "$TMP/calla-small" 300 16 ;;
    gdn) run_step "chunked delta rule vs recurrence" "$B/gpu/test_gdn_chunked" ;;
    small)
        "$B/calla" synth --geometry small --seed 1 --out "$TMP/calla-small" >/dev/null 2>&1
        "$B/calla" synth --geometry tiny --seed 1 --out "$TMP/calla-tiny" >/dev/null 2>&1
        run_step "e2e tiny geometry 64+32" "$B/gpu/test_cuda_e2e" "$TMP/calla-tiny" 64 32
        run_step "e2e small geometry 64+32" "$B/gpu/test_cuda_e2e" "$TMP/calla-small" 64 32
        run_step "e2e small geometry 300+8" "$B/gpu/test_cuda_e2e" "$TMP/calla-small" 300 8
        run_step "prefill chunking, small 2600" "$B/gpu/test_cuda_chunking" "$TMP/calla-small" 2600 ;;
    sanitizer)
        [ -d "$TMP/calla-small" ] || "$B/calla" synth --geometry small --seed 1 --out "$TMP/calla-small" >/dev/null 2>&1
        [ -d "$TMP/calla-tiny" ] || "$B/calla" synth --geometry tiny --seed 1 --out "$TMP/calla-tiny" >/dev/null 2>&1
        run_step "memcheck e2e small 24+4" compute-sanitizer --tool memcheck --error-exitcode 3 \
            "$B/gpu/test_cuda_e2e" "$TMP/calla-small" 24 4
        run_step "memcheck decode paths tiny 40+8" compute-sanitizer --tool memcheck --error-exitcode 3 \
            "$B/gpu/test_cuda_decode" e2e "$TMP/calla-tiny" 40 8 ;;
    racecheck)   # shared-memory races (the cp.async pipelines); about 3 minutes, so not a default stage
        [ -d "$TMP/calla-small" ] || "$B/calla" synth --geometry small --seed 1 --out "$TMP/calla-small" >/dev/null 2>&1
        run_step "racecheck e2e small 24+4" compute-sanitizer --tool racecheck --error-exitcode 3 \
            "$B/gpu/test_cuda_e2e" "$TMP/calla-small" 24 4 ;;
    synth) full_ckpt ;;
    full)
        full_ckpt
        run_step "e2e FULL shape 64+32" timeout ${GPU_CHECK_E2E_TIMEOUT:-900} "$B/gpu/test_cuda_e2e" "$TMP/calla-full" 64 32
        run_step "decode paths FULL 4096+48" timeout 300 "$B/gpu/test_cuda_decode" e2e "$TMP/calla-full" 4096 48
        run_step "short forwards and the device choice FULL 4096" timeout 300 "$B/gpu/test_cuda_short" "$TMP/calla-full" 4096 ;;
    timing)
        run_step "timing full ctx 4096 (warm)" "$B/lab/timing" "$TMP/calla-full" 4096 32 1
        run_step "timing full ctx 65536 (cold)" timeout ${GPU_CHECK_BENCH_TIMEOUT:-400} \
            "$B/lab/timing" "$TMP/calla-full" 65536 16 0 ;;
    score)
        full_ckpt
        run_step "score gate full ${GPU_CHECK_SCORE_LEN:-4096}" timeout ${GPU_CHECK_SCORE_TIMEOUT:-3600} \
            python3 tools/device/score_gate.py --calla "$B/calla" --model "$TMP/calla-full" \
            --len ${GPU_CHECK_SCORE_LEN:-4096} --backends cuda-exact,cuda,cpu-f32 --hf-device cuda --hf-bf16 \
            --greedy ${GPU_CHECK_SCORE_GREEDY:-300,4096} --gen 64 --out "$OUTDIR/score-gate-$date-$commit" ;;
    layers)
        full_ckpt
        run_step "layers FULL fast vs CPU ${GPU_CHECK_LAYERS_LEN:-4096}" timeout ${GPU_CHECK_LAYERS_TIMEOUT:-900} \
            "$B/gpu/test_cuda_layers" "$TMP/calla-full" ${GPU_CHECK_LAYERS_LEN:-4096} ;;
    bench)
        for ctx in ${GPU_CHECK_BENCH_CTX:-4096 65536}; do
            run_step "bench full ctx $ctx" timeout ${GPU_CHECK_BENCH_TIMEOUT:-400} "$B/calla" bench \
                --model "$TMP/calla-full" --context $ctx --decode 32 --backend cuda \
                --json "$OUTDIR/gpu-bench-$date-$commit-ctx$ctx.json"
        done ;;
    esac
done
say ""
say "$(printf '%-34s %-6s %s' check result time)"
for r in "${ROWS[@]}"; do say "$r"; done
say "outputs: $OUTDIR (log $LOG)"
if [ ${#ROWS[@]} -eq 0 ]; then say "no check ran: FAIL"; exit 1; fi
! printf '%s\n' "${ROWS[@]}" | grep -q ' FAIL '

#!/usr/bin/env bash
# Bounded libFuzzer runs under AddressSanitizer and UBSan of the parsers that read outside input:
# the checkpoint's (safetensors header, config.json) and the server's (the request parsers of the three APIs,
# the tool-call output parser, the JSON-schema compiler and constrained-decoding matcher).
# Seeds: a real synthetic checkpoint's config and a small shard; the unit tests' requests, model
# outputs and schemas (below).
# usage: tools/dev/fuzz.sh OUT_DIR SECONDS   (the total, split between the targets: the server's
# parsers get 2/9 each, the checkpoint's 1/6 each)
set -euo pipefail
out=${1:-build/fuzz}
secs=${2:-60}
targets="safetensors config openai toolcall constrain"
for t in $targets; do mkdir -p "$out/corpus-$t"; done
cc=${FUZZ_CC:-clang}
flags="-std=c11 -D_GNU_SOURCE -g -O1 -Isrc -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined"
$cc $flags -o "$out/fuzz_safetensors" tests/fuzz/fuzz_safetensors.c src/safetensors.c -ljansson
$cc $flags -o "$out/fuzz_config" tests/fuzz/fuzz_config.c src/checkpoint.c src/safetensors.c src/model.c src/util.c -ljansson
$cc $flags -o "$out/fuzz_toolcall" tests/fuzz/fuzz_toolcall.c src/toolcall.c src/util.c -ljansson
$cc $flags -o "$out/fuzz_constrain" tests/fuzz/fuzz_constrain.c src/constrain.c src/toolcall.c src/util.c -ljansson
# The protocol modules build a job holding a generation request: generate.c links the engine in (never run here).
$cc $flags -fopenmp -o "$out/fuzz_openai" tests/fuzz/fuzz_openai.c src/openai.c src/anthropic.c src/responses.c \
    src/response_store.c src/chatreq.c src/answer.c src/job.c src/generate.c src/draft.c src/chat.c \
    src/toolcall.c src/constrain.c src/tokmask.c src/tokenizer.c src/synth.c src/util.c src/engine.c src/pick.c src/model.c \
    src/safetensors.c src/backend_cpu.c src/checkpoint.c src/gpu.c src/nvml.c \
    -ljansson -lpcre2-8 -lutf8proc -lm -lpthread -ldl
# Seeds from a real synthetic checkpoint (the tiny geometry).
seed=$out/seed-ckpt
[ -f "$seed/config.json" ] || "$(dirname "$out")/calla" synth --geometry tiny --seed 1 --out "$seed" >/dev/null
cp "$seed/config.json" "$out/corpus-config/tiny.json"
python3 - "$seed" "$out/corpus-safetensors" <<'PY'
import json, struct, sys
src, dst = sys.argv[1], sys.argv[2]
f = open(src + "/model-00001-of-00001.safetensors", "rb")
n = struct.unpack("<Q", f.read(8))[0]
hdr = json.loads(f.read(n))
# A small valid file: three tensors of the real header, re-packed.
names = ["language_model.model.norm.weight", "language_model.model.layers.0.linear_attn.A_log",
         "language_model.model.layers.0.mlp.shared_expert_gate.weight"]
data, out = b"", {"__metadata__": {"format": "mlx"}}
for name in names:
    m = hdr[name]
    f.seek(8 + n + m["data_offsets"][0])
    b = f.read(m["data_offsets"][1] - m["data_offsets"][0])
    out[name] = {"dtype": m["dtype"], "shape": m["shape"], "data_offsets": [len(data), len(data) + len(b)]}
    data += b
h = json.dumps(out).encode()
h += b" " * (-len(h) % 8)
open(dst + "/small.safetensors", "wb").write(struct.pack("<Q", len(h)) + h + data)
PY
python3 tools/dev/fuzz_seeds.py "$out"
for t in $targets; do
    case $t in safetensors | config) s=$((secs / 6)) ;; *) s=$((secs * 2 / 9)) ;; esac
    [ "$s" -ge 1 ] || s=1
    echo "fuzz_$t: ${s}s"
    # A finding: the whole log (the reproducer is written to $out/crash-..., leak-..., timeout-...).
    if ! "$out/fuzz_$t" -max_total_time="$s" -max_len=65536 -print_final_stats=1 -artifact_prefix="$out/" \
        "$out/corpus-$t" >"$out/fuzz_$t.log" 2>&1; then
        tail -80 "$out/fuzz_$t.log"
        echo "fuzz_$t: FAILED (log $out/fuzz_$t.log)"
        exit 1
    fi
    tail -4 "$out/fuzz_$t.log"
done

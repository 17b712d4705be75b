#!/usr/bin/env bash
# Bounded libFuzzer runs of the checkpoint parsers (safetensors header, config.json) under
# AddressSanitizer and UBSan. Seeds: a real synthetic checkpoint's config and a small shard.
# usage: tools/fuzz.sh OUT_DIR SECONDS_PER_TARGET
set -euo pipefail
out=${1:-build/fuzz}
secs=${2:-30}
mkdir -p "$out/corpus-safetensors" "$out/corpus-config"
cc=${FUZZ_CC:-clang}
flags="-std=c11 -D_GNU_SOURCE -g -O1 -Isrc -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined"
$cc $flags -o "$out/fuzz_safetensors" tests/fuzz/fuzz_safetensors.c src/safetensors.c -ljansson
$cc $flags -o "$out/fuzz_config" tests/fuzz/fuzz_config.c src/checkpoint.c src/safetensors.c src/model.c src/util.c -ljansson
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
for t in safetensors config; do
    echo "fuzz_$t: ${secs}s"
    "$out/fuzz_$t" -max_total_time="$secs" -max_len=65536 -print_final_stats=1 "$out/corpus-$t" 2>&1 | tail -4
done

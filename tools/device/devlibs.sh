#!/usr/bin/env bash
# Copies the shared libraries that a build's binaries need (other than the C library itself)
# into BUILD/devlibs, so the build can be carried to the GPU machine, which has none of them.
# usage: tools/device/devlibs.sh BUILD
set -euo pipefail
b=${1:-build}
mkdir -p "$b/devlibs"
for f in "$b"/calla "$b"/tests/test_* "$b"/gpu/* "$b"/lab/*; do
    [ -x "$f" ] && [ -f "$f" ] || continue
    ldd "$f" | awk '/=> \// {print $3}' | grep -vE '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*)\.so' || true
done | sort -u | while read -r lib; do cp -L "$lib" "$b/devlibs/"; done
ls "$b/devlibs"

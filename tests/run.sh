#!/usr/bin/env bash
# Runs every test program given (from the repo root) and prints the closing summary line.
# usage: tests/run.sh BUILD test1 test2 ...
set -u
shift   # BUILD
passed=0 failed=0 names=()
for t in "$@"; do
    echo "=== ${t##*/}"
    start=$(date +%s)
    if "$t"; then passed=$((passed + 1)); else failed=$((failed + 1)); names+=("${t##*/}"); fi
    echo "=== ${t##*/}: $(( $(date +%s) - start )) s"
done
[ ${#names[@]} -eq 0 ] || echo "failed: ${names[*]}"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]

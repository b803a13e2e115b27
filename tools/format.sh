#!/bin/sh
# format.sh [--check]: clang-format (the repository's .clang-format) over every
# C/C++ source in the repository; the generated SPIR-V/PTX headers hold their data
# between clang-format off/on (tools/embed_*.py), so they pass as generated.
# --check changes nothing and fails, naming the files, when one is not formatted.
set -eu
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null || { echo "FAIL format: clang-format not installed (apt-get install clang-format)"; exit 1; }
files=$(git ls-files '*.c' '*.h' '*.cc' '*.cpp')
if [ "${1:-}" = --check ]; then
    bad=$(for f in $files; do clang-format --dry-run "$f" 2>&1 | grep -q . && echo "$f"; done || true)
    [ -z "$bad" ] || { echo "FAIL format: not clang-formatted (run make format):"; echo "$bad"; exit 1; }
    echo "PASS format: $(echo "$files" | wc -l) files match .clang-format ($(clang-format --version))"
else
    clang-format -i $files
fi

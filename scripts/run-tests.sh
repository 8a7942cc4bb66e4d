#!/usr/bin/env bash
# Runs every test of a build: ctest (C++ units, in-process clusters,
# multi-process and fault tests), then the Python tests when built.
set -euo pipefail
build=${1:-build}
shift || true
jobs=$(nproc)
# Multi-process tests oversubscribe 2 cores; twice the cores keeps the run short
# without starving the timing-sensitive fault tests.
ctest --test-dir "$build" --output-on-failure -j "$((jobs * 2))" --timeout 300 "$@"
if [ -d "$build/python/pushpull" ] && [ -d python/tests ]; then
  PYTHONPATH="$build/python" PUSHPULL_BIN_DIR="$PWD/$build/bin" /usr/bin/python3 -m pytest -q python/tests
fi

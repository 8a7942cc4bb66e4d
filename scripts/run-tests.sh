#!/usr/bin/env bash
# Runs every test of a build: ctest (C++ units, in-process clusters,
# multi-process and fault tests), then the Python tests when the package was
# built (BUILD/python/pushpull). Both run even when the first fails; the exit
# status is non-zero when either failed.
set -uo pipefail
build=${1:-build}
shift || true
jobs=$(nproc)
status=0
# The flight recorder's dumps (docs/timeline.md) of the many failures the
# tests cause on purpose: one folder of the build tree, not the tests'
# working directories (a test that sets its own folder still does).
case $build in /*) build_abs=$build ;; *) build_abs=$PWD/$build ;; esac
export PUSHPULL_FLIGHT_RECORDER_DIR=${PUSHPULL_FLIGHT_RECORDER_DIR:-$build_abs/test-flight}
mkdir -p "$PUSHPULL_FLIGHT_RECORDER_DIR"
# Multi-process tests oversubscribe 2 cores; twice the cores keeps the run short
# without starving the timing-sensitive fault tests.
ctest --test-dir "$build" --output-on-failure -j "$((jobs * 2))" --timeout 300 "$@" || status=1

if compgen -G "python/tests/test_*.py" >/dev/null; then
  if [ -d "$build/python/pushpull" ]; then
    # Exit code 5 (no tests collected) is a failure too: test files exist.
    PYTHONPATH="$PWD/$build/python" PUSHPULL_BIN_DIR="$PWD/$build/bin" \
      /usr/bin/python3 -m pytest -q python/tests || status=1
  else
    echo "run-tests: $build/python/pushpull not built (no Python3 headers or pybind11?);" \
      "skipping the Python tests" >&2
  fi
fi
exit "$status"

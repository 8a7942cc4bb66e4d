#!/usr/bin/env bash
# Every benchmark, one after the other (they print their own tables).
set -euo pipefail
build=${1:-build}
"$build/bin/kernels_bench" --benchmark_min_time=0.2
"$build/bin/pushpull" bench transport
"$build/bin/pushpull" bench allreduce
# The training step needs the Python package (-DPUSHPULL_BUILD_PYTHON=ON) and torch.
if [ -f "$build/python/pushpull/bench_step.py" ]; then
  "$build/bin/pushpull" bench step
else
  echo "bench step: skipped ($build/python has no pushpull package; configure with -DPUSHPULL_BUILD_PYTHON=ON)"
fi

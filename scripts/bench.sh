#!/usr/bin/env bash
# Every benchmark, one after the other (they print their own tables).
set -euo pipefail
build=${1:-build}
"$build/bin/kernels_bench" --benchmark_min_time=0.2
"$build/bin/pushpull" bench transport
"$build/bin/pushpull" bench allreduce
# The training step needs the Python package (-DPUSHPULL_BUILD_PYTHON=ON) and torch.
# The libtorch worker (cpp) joins when it was built (-DPUSHPULL_BUILD_TORCH=ON).
if [ -f "$build/python/pushpull/bench_step.py" ]; then
  impls=ddp,hvd,trainer
  if [ -x "$build/bin/pp_torch_step" ]; then impls=$impls,cpp; fi
  "$build/bin/pushpull" bench step --impls "$impls"
else
  echo "bench step: skipped ($build/python has no pushpull package; configure with -DPUSHPULL_BUILD_PYTHON=ON)"
fi

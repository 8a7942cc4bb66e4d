#!/usr/bin/env bash
# Every benchmark, one after the other (they print their own tables).
set -euo pipefail
build=${1:-build}
"$build/bin/kernels_bench" --benchmark_min_time=0.2
"$build/bin/pushpull" bench transport
"$build/bin/pushpull" bench allreduce

#!/bin/sh
# Runs every libFuzzer target of a `make fuzz` build (ASan + UBSan) for RUNS
# executions each, JOBS targets at a time, from seeds written by fuzz_seeds,
# and prints each target's execution count. Crashing inputs are kept in
# BUILD_DIR/fuzz-artifacts/. One allocation above 16 MiB from an input of
# a few KiB counts as a bug (-malloc_limit_mb: memory amplification).
# Exit status 1 when any target found a bug.
# MAX_SECONDS, when given, also bounds each target's time (slow targets then
# report the count they reached).
#   tests/fuzz/run.sh BUILD_DIR [RUNS] [JOBS] [MAX_SECONDS]
set -eu
build=$1
runs=${2:-10000000}
jobs=${3:-$(nproc)}
max_time=${4:-0}
bin=$build/bin
corpus=$build/fuzz-corpus
logs=$build/fuzz-logs
mkdir -p "$corpus" "$logs" "$build/fuzz-artifacts"
"$bin/fuzz_seeds" "$corpus"

targets=$(cd "$bin" && ls fuzz_* | grep -v -e '^fuzz_seeds$' -e '_libfuzzer$')
echo "fuzzing $(echo "$targets" | wc -w) targets, $runs executions each, $jobs at a time"
echo "$targets" | xargs -P "$jobs" -I{} sh -c '
  "$0/{}" -runs="$1" -max_total_time="$5" -seed=1 -malloc_limit_mb=16 -print_final_stats=1 -artifact_prefix="$2/fuzz-artifacts/{}-" \
    "$3/{}" > "$4/{}.log" 2>&1
  echo "{}: exit $? ($(grep -h "stat::number_of_executed_units" "$4/{}.log" | tr -s " "))"
' "$bin" "$runs" "$build" "$corpus" "$logs" "$max_time"

status=0
echo "---- executions per target ----"
for t in $targets; do
  n=$(sed -n 's/^stat::number_of_executed_units: *//p' "$logs/$t.log" | tail -1)
  if grep -q -e "==ERROR" -e "runtime error" -e "deadly signal" -e "malloc(" -e "out-of-memory" "$logs/$t.log"; then
    echo "$t: FOUND A BUG after ${n:-?} executions (see $logs/$t.log)"
    status=1
  else
    echo "$t: ${n:-?} executions, no finding"
  fi
done
exit $status

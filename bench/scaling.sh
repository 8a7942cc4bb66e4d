#!/usr/bin/env bash
# bench/scaling.sh [BUILD_DIR]: samples/s of the LeNet job (examples/lenet)
# with 1, 2 and 4 workers (one device each) for dist_sync, dist_sync_allreduce
# and the DistributedOptimizer (--mode horovod), all on this machine through
# `pushpull launch`, and the time each step spent waiting on communication
# (the Trainer's / DistributedOptimizer's stats().wait_seconds).
#
# Prints one markdown table row per run (and the raw summary lines to
# $OUT_DIR when set). Settings (environment):
#   WORKERS="1 2 4"  MODES="dist_sync dist_sync_allreduce horovod"
#   MAX_BATCHES=60   BATCH=64 (per worker)  MODEL=mxnet  SERVERS=1 (dist_sync)
#   DATA_DIR=/usr/share/datasets/fashion-mnist
# A default run takes a few minutes on 2 cores. Every process is started by
# the launcher, which stops them all when the job ends or fails.
set -euo pipefail

BUILD=${1:-build}
WORKERS=${WORKERS:-"1 2 4"}
MODES=${MODES:-"dist_sync dist_sync_allreduce horovod"}
MAX_BATCHES=${MAX_BATCHES:-60}
BATCH=${BATCH:-64}
MODEL=${MODEL:-mxnet}
SERVERS=${SERVERS:-1}
DATA_DIR=${DATA_DIR:-/usr/share/datasets/fashion-mnist}

PUSHPULL="$BUILD/bin/pushpull"
LENET="$BUILD/bin/lenet"
for b in "$PUSHPULL" "$LENET"; do
  if [[ ! -x $b ]]; then
    echo "scaling.sh: $b is missing; build it first (ninja -C $BUILD pushpull_cli lenet)" >&2
    exit 2
  fi
done

# A summary field: "key=value" -> value (units stripped).
field() { sed -n "s/.*[ :]$1=\([0-9.]*\).*/\1/p" <<<"$2"; }

echo "# LeNet scaling: model=$MODEL batch=$BATCH/worker max_batches=$MAX_BATCHES" \
  "cores=$(nproc) load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| sync | workers | samples/s (job) | samples/s per worker | ms/step | comm wait ms/step | wait share |"
echo "|---|---|---|---|---|---|---|"
for mode in $MODES; do
  for n in $WORKERS; do
    case $mode in
      dist_sync) launch=(-n "$n" -s "$SERVERS"); args=(--kvstore dist_sync) ;;
      dist_sync_allreduce) launch=(-n "$n" -s 0); args=(--kvstore dist_sync_allreduce) ;;
      horovod) launch=(-n "$n" -s 0); args=(--mode horovod) ;;
      *) echo "scaling.sh: unknown mode $mode" >&2; exit 2 ;;
    esac
    out=$("$PUSHPULL" launch "${launch[@]}" --timeout 120 -- "$LENET" "${args[@]}" \
      --epochs 1 --max-batches "$MAX_BATCHES" --batch-size "$BATCH" --model "$MODEL" \
      --test-limit 500 --threads 1 --log-every 1000000 --data-dir "$DATA_DIR" 2>&1) || {
      echo "scaling.sh: $mode with $n workers failed:" >&2
      echo "$out" | tail -20 >&2
      exit 1
    }
    line=$(grep "lenet summary:" <<<"$out" | tail -1)
    [[ -n ${OUT_DIR:-} ]] && echo "$line" >>"$OUT_DIR/scaling_summaries.txt"
    job=$(field samples_per_s_job "$line")
    per=$(field samples_per_s_worker "$line")
    wait=$(field comm_wait_ms_per_step "$line")
    # Step time from the worker's rate (train_time is printed to 0.1 s only).
    awk -v m="$mode" -v n="$n" -v job="$job" -v per="$per" -v b="$BATCH" \
      -v w="$wait" 'BEGIN { ms = 1000 * b / per;
        printf "| %s | %d | %.0f | %.0f | %.1f | %.1f | %.0f%% |\n", m, n, job, per, ms, w, 100 * w / ms }'
  done
done
echo
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"

#!/usr/bin/env bash
# The main job: LeNet on Fashion-MNIST, 2 workers x 2 servers, dist_sync, on
# this machine through `pushpull launch` (docs/training.md). Falls back to the
# KVStore tutorial when libtorch or the dataset is missing.
set -euo pipefail
build=${1:-build}
data=/usr/share/datasets/fashion-mnist
if [[ -x "$build/bin/lenet" && -e "$data/train-images-idx3-ubyte.gz" ]]; then
  # One libtorch thread per worker: 2 workers share the 2 cores (see docs/training.md).
  exec "$build/bin/pushpull" launch -n 2 -s 2 -- "$(realpath "$build/bin/lenet")" \
    --kvstore dist_sync --epochs 2 --batch-size 64 --lr 0.1 --threads 1 --log-every 100
fi
echo "demo: lenet or Fashion-MNIST missing (make deps installs libtorch-dev and dataset-fashion-mnist);"
echo "      running the KVStore tutorial instead"
"$build/bin/kvstore_basics"

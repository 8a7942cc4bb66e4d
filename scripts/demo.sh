#!/usr/bin/env bash
# The main job. Until the distributed LeNet job lands this is the KVStore
# tutorial on the local store.
set -euo pipefail
build=${1:-build}
"$build/bin/kvstore_basics"

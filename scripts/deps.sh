#!/usr/bin/env bash
# Installs the Debian packages pushpull's build, tests, demo and benchmarks
# need. Idempotent: quiet and quick when everything is there; runs
# `apt-get update` only when something is missing.
set -euo pipefail

PACKAGES=(
  # build
  build-essential cmake ninja-build ccache pkg-config
  libfmt-dev libcli11-dev libssl-dev zlib1g-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  # tools and tests
  clang clang-format iproute2 procps openssh-server openssh-client rsync
  # a real Slurm for tests/launch/slurm_cluster_test.py (it runs daemons of its own,
  # with its own configuration; the packages' system services are not needed)
  slurmctld slurmd slurm-client munge
  # scrapes the jobs' metrics endpoints in tests/scripts/metrics_prometheus_job_test.py
  # (19 MB; on a systemd host the package also enables its own service on :9090)
  prometheus
  # peers for the benchmarks
  openmpi-bin libopenmpi-dev libgloo-dev libhiredis-dev libibverbs-dev iperf3
  # training and Python
  libtorch-dev python3-dev pybind11-dev python3-numpy python3-pytest python3-torch
  python3-setuptools python3-venv python3-pip python3-wheel python3-yaml dataset-fashion-mnist
  # docs figures (scripts/plot.py, make plots) and the timeline writer
  python3-matplotlib nlohmann-json3-dev
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
  SUDO=sudo
else
  SUDO=
fi
echo "make deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null

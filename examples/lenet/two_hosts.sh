#!/usr/bin/env bash
# examples/lenet/two_hosts.sh [BUILD_DIR]: the seeds' multi-host setup on one
# machine. Two network namespaces play two hosts, each running its own sshd;
# `pushpull launch -H hostfile` (ssh launcher, --sync-dst-dir) starts 2
# servers and 4 workers on them — round robin, servers first, so each host
# runs 1 server and 2 workers — and trains LeNet with dist_sync. The launcher
# runs in a third namespace that holds the bridge, as a head node would.
#
#   sudo examples/lenet/two_hosts.sh build            # 2 epochs (a few minutes)
#   sudo EPOCHS=1 MAX_BATCHES=100 examples/lenet/two_hosts.sh build   # quick
#
# Needs root (ip netns), iproute2, openssh-server, openssh-client and rsync
# (Debian packages). Everything it makes — the namespaces, the veth pairs and
# bridge, a temporary directory with a throwaway key pair, host key and sshd
# configs, the sshd processes — is removed on exit (trap), also after a
# failure or Ctrl-C; it stops only the PIDs it started. Addresses: one /24
# under 10.231.0.0/16 that no interface of this machine uses.
#
# Settings (environment): EPOCHS=2 BATCH=32 (per worker; 128 global) LR=0.1
# MAX_BATCHES=0 (all) KVSTORE=dist_sync DATA_DIR=/usr/share/datasets/fashion-mnist
set -euo pipefail

BUILD=$(cd "${1:-build}" && pwd)
EPOCHS=${EPOCHS:-2}
BATCH=${BATCH:-32}
LR=${LR:-0.1}
MAX_BATCHES=${MAX_BATCHES:-0}
KVSTORE=${KVSTORE:-dist_sync}
DATA_DIR=${DATA_DIR:-/usr/share/datasets/fashion-mnist}

die() {
  echo "two_hosts.sh: $*" >&2
  exit 2
}
[[ $(id -u) -eq 0 ]] || die "must be run as root (it creates network namespaces)"
for tool in ip ssh ssh-keygen rsync /usr/sbin/sshd; do
  command -v "$tool" >/dev/null || die "$tool is missing (apt-get install iproute2 openssh-server openssh-client rsync)"
done
[[ -x $BUILD/bin/pushpull && -x $BUILD/bin/lenet ]] ||
  die "$BUILD/bin/pushpull or lenet is missing; build them (ninja -C $BUILD pushpull_cli lenet)"
[[ -e $DATA_DIR/train-images-idx3-ubyte.gz || -e $DATA_DIR/train-images-idx3-ubyte ]] ||
  die "no Fashion-MNIST in $DATA_DIR (apt-get install dataset-fashion-mnist, or set DATA_DIR)"

# A /24 nobody here uses (another run of this script or test picks another).
SUBNET=""
for i in $(seq 0 255); do
  cand="10.231.$(((i + $$) % 256))"
  if ! ip -o addr show | grep -q " $cand\."; then
    SUBNET=$cand
    break
  fi
done
[[ -n $SUBNET ]] || die "no free /24 under 10.231.0.0/16"

ID=$$
HEAD_NS="pplh-$ID"
HOST_NS=("pph1-$ID" "pph2-$ID")
TMP=$(mktemp -d /tmp/pushpull-two-hosts.XXXXXX)
SSHD_PIDS=()
LAUNCH_PID=""
TAIL_PID=""
MADE_NS=()

cleanup() {
  local rc=$?
  set +e
  if [[ -n $LAUNCH_PID ]] && kill -0 "$LAUNCH_PID" 2>/dev/null; then
    kill -TERM "$LAUNCH_PID" # the launcher stops the job's processes itself
    for _ in $(seq 50); do kill -0 "$LAUNCH_PID" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$LAUNCH_PID" 2>/dev/null
  fi
  [[ -n $TAIL_PID ]] && kill "$TAIL_PID" 2>/dev/null
  for pid in "${SSHD_PIDS[@]}"; do
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 25); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  done
  for ns in "${MADE_NS[@]}"; do ip netns del "$ns" 2>/dev/null; done
  rm -rf "$TMP"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

echo "two_hosts.sh: head $HEAD_NS ($SUBNET.1), hosts ${HOST_NS[0]} ($SUBNET.2) and ${HOST_NS[1]} ($SUBNET.3)"
ip netns add "$HEAD_NS"
MADE_NS+=("$HEAD_NS")
for ns in "${HOST_NS[@]}"; do
  ip netns add "$ns"
  MADE_NS+=("$ns")
done
ip -n "$HEAD_NS" link set lo up
ip -n "$HEAD_NS" link add br0 type bridge
ip -n "$HEAD_NS" addr add "$SUBNET.1/24" dev br0
ip -n "$HEAD_NS" link set br0 up

ssh-keygen -q -t ed25519 -N '' -f "$TMP/client_key"
ssh-keygen -q -t ed25519 -N '' -f "$TMP/host_key"
cp "$TMP/client_key.pub" "$TMP/authorized_keys"
mkdir -p /run/sshd # sshd's privilege separation directory

PORT=2222
for h in 1 2; do
  ns=${HOST_NS[$((h - 1))]}
  addr="$SUBNET.$((h + 1))"
  ip -n "$HEAD_NS" link add "vh$h" type veth peer name eth0 netns "$ns"
  ip -n "$HEAD_NS" link set "vh$h" master br0 up
  ip -n "$ns" addr add "$addr/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
  cat >"$TMP/sshd_$h.conf" <<CONF
Port $PORT
ListenAddress $addr
HostKey $TMP/host_key
AuthorizedKeysFile $TMP/authorized_keys
PidFile none
PermitRootLogin yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
LogLevel ERROR
CONF
  # `ip netns exec` execs sshd in place: $! is sshd's PID.
  ip netns exec "$ns" /usr/sbin/sshd -D -e -f "$TMP/sshd_$h.conf" &
  SSHD_PIDS+=($!)
done

SSH_OPTS=(-i "$TMP/client_key" -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null
  -o LogLevel=ERROR)
for h in 1 2; do
  addr="$SUBNET.$((h + 1))"
  for i in $(seq 100); do
    if ip netns exec "$HEAD_NS" ssh -o BatchMode=yes -o ConnectTimeout=2 -p "$PORT" \
      "${SSH_OPTS[@]}" "$addr" true 2>/dev/null; then
      break
    fi
    [[ $i -lt 100 ]] || die "sshd on $addr did not answer"
    sleep 0.1
  done
done

cat >"$TMP/hosts" <<HOSTS
# two network namespaces; no slots: round robin, servers first
$SUBNET.2:$PORT
$SUBNET.3:$PORT
HOSTS

# The job directory that --sync-dst-dir ships to every host.
mkdir -p "$TMP/job"
cp "$BUILD/bin/lenet" "$TMP/job/"

LAUNCH=("$BUILD/bin/pushpull" launch -H "$TMP/hosts" -n 4 -s 2 --host-ip "$SUBNET.1"
  --sync-dst-dir "$TMP/synced" --timeout 120)
for o in "${SSH_OPTS[@]}"; do LAUNCH+=("--ssh-option=$o"); done
LAUNCH+=(-- ./lenet --kvstore "$KVSTORE" --epochs "$EPOCHS" --batch-size "$BATCH" --lr "$LR"
  --max-batches "$MAX_BATCHES" --threads 1 --data-dir "$DATA_DIR")
echo "two_hosts.sh: ${LAUNCH[*]}"
: >"$TMP/job.log" # exists before tail opens it
# The subshell execs `ip netns exec`, which execs the launcher: $! is its PID.
(cd "$TMP/job" && exec ip netns exec "$HEAD_NS" "${LAUNCH[@]}") >"$TMP/job.log" 2>&1 &
LAUNCH_PID=$!
tail -n +1 -f --pid="$LAUNCH_PID" "$TMP/job.log" &
TAIL_PID=$!
status=0
wait "$LAUNCH_PID" || status=$?
LAUNCH_PID=""
wait "$TAIL_PID" || true
TAIL_PID=""
summary=$(grep "lenet summary:" "$TMP/job.log" | tail -1 || true)
if [[ $status -ne 0 || -z $summary ]]; then
  echo "two_hosts.sh: the job failed (launcher exit status $status)" >&2
  exit 1
fi
echo "two_hosts.sh: $summary"
acc=$(sed -n 's/.*test_accuracy=\([0-9.]*\).*/\1/p' <<<"$summary")
echo "two_hosts.sh: final test accuracy $acc (2 hosts x (2 workers + 1 server), $KVSTORE, $EPOCHS epochs)"

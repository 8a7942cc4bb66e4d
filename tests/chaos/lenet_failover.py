#!/usr/bin/python3
"""LeNet survives a parameter server killed mid-epoch (issue 13; docs/ps.md).

Runs the reference job with one server more than `make demo` uses:

    pushpull launch -n 2 -s 3 -- lenet --kvstore dist_sync --epochs 2 ...

(replication is on by default: every key range has one backup), stops
server 1 by pid partway through the first epoch (SIGSTOP), kills it
(SIGKILL) --pause seconds later, and checks that

  * the job exits 0 (the fail-over kept it alive);
  * a worker's log shows the fail-over ("worker N: fail-over: server 1
    failed; placement epoch 1: ...") and the scheduler's line too;
  * the final test accuracy is at least --min-accuracy (0.87);
  * with --pause > 0, the workers re-sent at least one request: the stop
    leaves the round's requests to server 1 pending (a batch spends about
    5% of its time in push/pull, so a plain kill nearly always lands between
    rounds and exercises no re-send). --pause 0: a plain SIGKILL.

It prints the accuracy and the recovery time: from the kill to the first
batch a worker completed after it logged the new placement (an upper bound
on "failure to the next completed round": it includes that batch's compute).

    python3 tests/chaos/lenet_failover.py --build-dir build     # ctest chaos.lenet_failover

Exit status: 0 passed, 1 failed, 77 skipped (lenet or Fashion-MNIST missing).
Only processes this script started are signalled, by pid: the victim, and on
failure every descendant of the launcher still alive.
"""

import argparse
import os
import re
import signal
import subprocess
import sys
import threading
import time

DATA = '/usr/share/datasets/fashion-mnist'
BATCH_LINE = re.compile(r'worker (\d+).*epoch (\d+) batch (\d+)/(\d+)')
FAILOVER_LINE = re.compile(r'worker (\d+): fail-over: server ([\d, ]+) failed; placement epoch (\d+)'
                           r'.* re-sending (\d+) requests')
SCHEDULER_LINE = re.compile(r'fail-over: server (\d+) .*failed')
SUMMARY_LINE = re.compile(r'lenet summary: .*test_accuracy=([0-9.]+)')


def descendants(root):
    """Pids of every live descendant of `root` (from /proc)."""
    children = {}
    for d in os.listdir('/proc'):
        if not d.isdigit():
            continue
        try:
            with open(f'/proc/{d}/stat') as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rfind(')') + 2:].split()[1])
        children.setdefault(ppid, []).append(int(d))
    out, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def role_of(pid):
    """(role, rank) from the process's environment, as the launcher set it."""
    try:
        with open(f'/proc/{pid}/environ', 'rb') as f:
            env = dict(kv.split(b'=', 1) for kv in f.read().split(b'\0') if b'=' in kv)
    except OSError:
        return None
    role, rank = env.get(b'PUSHPULL_ROLE'), env.get(b'PUSHPULL_RANK')
    if role is None or rank is None:
        return None
    return role.decode(), int(rank)


def find_server(launcher, rank):
    """The pid of server `rank` of the job, or None. The outermost process with
    that role (a shell wrapper, if any, has no PUSHPULL_ROLE in its environ
    until it execs)."""
    for pid in descendants(launcher):
        if role_of(pid) == ('server', rank):
            return pid
    return None


class Log:
    """The launcher's merged output, each line with its arrival time."""

    def __init__(self, stream, echo):
        self.lines = []  # (monotonic time, text)
        self.cv = threading.Condition()
        self.echo = echo
        self.thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self.thread.start()

    def _read(self, stream):
        for raw in stream:
            line = raw.decode(errors='replace').rstrip('\n')
            with self.cv:
                self.lines.append((time.monotonic(), line))
                self.cv.notify_all()
            if self.echo:
                print(line, flush=True)

    def wait_for(self, pattern, deadline, ended):
        """Whether a line matches `pattern` before `deadline` (False at once
        when `ended()`: the job is over)."""
        with self.cv:
            while time.monotonic() < deadline and not ended():
                for _, line in self.lines:
                    if pattern.search(line):
                        return True
                self.cv.wait(timeout=1.0)
        return False


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--build-dir', default='build')
    ap.add_argument('--epochs', type=int, default=2)
    ap.add_argument('--kill-at-batch', type=int, default=150,
                    help='kill server 1 once a worker logged this batch of epoch 0')
    ap.add_argument('--victim', type=int, default=1, help='server rank to kill')
    ap.add_argument('--pause', type=float, default=0.5,
                    help='seconds between SIGSTOP and SIGKILL (0: SIGKILL only)')
    ap.add_argument('--min-accuracy', type=float, default=0.87)
    ap.add_argument('--timeout', type=float, default=780,
                    help='seconds for the whole job (below the ctest TIMEOUT of 900)')
    ap.add_argument('--echo', action='store_true', help='print the job output as it comes')
    args = ap.parse_args()

    pushpull = os.path.join(args.build_dir, 'bin', 'pushpull')
    lenet = os.path.realpath(os.path.join(args.build_dir, 'bin', 'lenet'))
    if not (os.access(pushpull, os.X_OK) and os.access(lenet, os.X_OK) and
            os.path.exists(os.path.join(DATA, 'train-images-idx3-ubyte.gz'))):
        print('lenet_failover: SKIP: lenet (libtorch) or Fashion-MNIST missing', flush=True)
        return 77

    cmd = [pushpull, 'launch', '-n', '2', '-s', '3', '--', lenet, '--kvstore', 'dist_sync',
           '--epochs', str(args.epochs), '--batch-size', '64', '--lr', '0.1', '--threads', '1',
           '--log-every', '1']
    env = dict(os.environ)
    env.pop('PUSHPULL_PS_REPLICAS', None)  # the default: one backup per range
    print('lenet_failover: ' + ' '.join(cmd), flush=True)
    started = time.monotonic()
    deadline = started + args.timeout
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    log = Log(proc.stdout, args.echo)
    errors = []
    killed_at = None
    try:
        at = re.compile(rf'epoch 0 batch {args.kill_at_batch}/')
        if not log.wait_for(at, deadline, lambda: proc.poll() is not None):
            errors.append(f'no worker reached epoch 0 batch {args.kill_at_batch}')
        else:
            victim = find_server(proc.pid, args.victim)
            if victim is None:
                errors.append(f'server {args.victim} not found among the launcher\'s children')
            else:
                if args.pause > 0:
                    os.kill(victim, signal.SIGSTOP)
                    time.sleep(args.pause)
                os.kill(victim, signal.SIGKILL)
                killed_at = time.monotonic()
                print(f'lenet_failover: SIGKILL server {args.victim} (pid {victim}) at '
                      f'{killed_at - started:.1f} s'
                      + (f', stopped {args.pause} s before' if args.pause > 0 else ''), flush=True)
        try:
            rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            rc = None
            errors.append(f'the job did not end within {args.timeout:.0f} s')
    finally:
        if proc.poll() is None:
            for pid in descendants(proc.pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            proc.kill()
            proc.wait()
    log.thread.join(timeout=10)

    lines = [text for _, text in log.lines]
    if rc is not None and rc != 0:
        errors.append(f'the job exited {rc}')
    failovers = [(t, m) for t, text in log.lines if (m := FAILOVER_LINE.search(text))]
    if killed_at is not None:
        if not failovers:
            errors.append('no worker logged the fail-over ("worker N: fail-over: server ...")')
        elif not any(str(args.victim) in m.group(2).split(', ') for _, m in failovers):
            errors.append(f'the fail-over lines do not name server {args.victim}')
        elif args.pause > 0 and not any(int(m.group(4)) > 0 for _, m in failovers):
            errors.append('no worker re-sent a request, though server '
                          f'{args.victim} was stopped for {args.pause} s before the kill')
        if not any(SCHEDULER_LINE.search(text) for text in lines):
            errors.append('the scheduler did not log the fail-over')
    accuracy = None
    for text in lines:
        if m := SUMMARY_LINE.search(text):
            accuracy = float(m.group(1))
    if accuracy is None:
        errors.append('no "lenet summary" line')
    elif accuracy < args.min_accuracy:
        errors.append(f'test accuracy {accuracy:.4f} < {args.min_accuracy}')

    # Recovery: kill -> the first batch a worker finished after its fail-over line.
    recovery = None
    for t_fail, m in failovers:
        worker = m.group(1)
        after = [t for t, text in log.lines
                 if t >= t_fail and (b := BATCH_LINE.search(text)) and b.group(1) == worker]
        if after and killed_at is not None:
            r = after[0] - killed_at
            recovery = r if recovery is None else min(recovery, r)

    for text in lines:
        if FAILOVER_LINE.search(text) or SCHEDULER_LINE.search(text) or \
                SUMMARY_LINE.search(text) or ' done: ' in text:
            print('  | ' + text)
    print(f'lenet_failover: exit {rc}, test accuracy '
          f'{"-" if accuracy is None else f"{accuracy:.4f}"}, recovery (kill to the next '
          f'batch after the fail-over) {"-" if recovery is None else f"{recovery:.2f} s"}, '
          f'wall {time.monotonic() - started:.0f} s', flush=True)
    if errors:
        print('\n'.join(lines[-40:]))
        for e in errors:
            print('lenet_failover: FAIL: ' + e, flush=True)
        return 1
    print('lenet_failover: PASS', flush=True)
    return 0


if __name__ == '__main__':
    sys.exit(main())

"""Drives an elastic job for the tests (test_elastic.py) and by hand: starts
`pushpull launch --min-workers/--max-workers --host-discovery-script` over
examples/python/elastic_lenet.py, watches its output, SIGKILLs workers at given steps, edits
the discovery file, and reports what happened as JSON on stdout.

    python3 python/tests/elastic_job.py --kill-at 30 --add-at 60 --max-steps 150
"""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
STEP = re.compile(r'^\[worker (\d+)\] elastic step (\d+) size (\d+) rank (\d+) t=([0-9.]+)')
PID = re.compile(r'^\[worker (\d+)\] elastic worker pid (\d+) rank (\d+)')
SUMMARY = re.compile(r'elastic summary: test accuracy ([0-9.]+) steps (\d+) size (\d+)')


def run_job(build, workers=4, min_workers=2, kill_at=(), add_at=None, max_steps=100, epochs=1,
            commit_every=10, heartbeat_ms=10000, elastic_timeout=30, timeout=600, extra=(),
            log=None, victim=None, sig=signal.SIGKILL, second_after=None, program='python'):
    """kill_at: steps at which one worker gets `sig` (SIGKILL): rank `victim`, or the highest
    non-zero rank alive (victim None). second_after: seconds after the first fault at which
    the highest non-zero rank left gets SIGKILL too (a failure while the group re-forms).
    add_at: the step after which the discovery file gets one more slot."""
    tmp = tempfile.mkdtemp(prefix='pp-elastic-')
    hosts = os.path.join(tmp, 'hosts')
    with open(hosts, 'w') as f:
        f.write('127.0.0.1:%d\n' % workers)
    script = os.path.join(tmp, 'discover.sh')
    with open(script, 'w') as f:
        f.write('#!/bin/sh\ncat %s\n' % hosts)
    os.chmod(script, 0o755)
    env = dict(os.environ)
    env['PYTHONPATH'] = os.path.join(build, 'python')
    env['PUSHPULL_HEARTBEAT_TIMEOUT_MS'] = str(heartbeat_ms)
    cmd = [os.path.join(build, 'bin', 'pushpull'), 'launch', '--min-workers', str(min_workers),
           '--max-workers', str(workers + 1), '--host-discovery-script', script,
           '--discovery-interval', '1', '--elastic-timeout', str(elastic_timeout)] + list(extra)
    if program == 'lenet':  # examples/lenet --mode horovod --elastic (C++)
        cmd += [os.path.join(build, 'bin', 'lenet'), '--mode', 'horovod', '--elastic',
                '--threads', '1', '--batch-size', '32', '--log-every', '1', '--epochs',
                str(epochs), '--max-batches', str(max_steps), '--commit-every',
                str(commit_every), '--test-limit', '2000' if max_steps else '0']
    else:
        cmd += ['/usr/bin/python3', os.path.join(ROOT, 'examples', 'python', 'elastic_lenet.py'),
                '--epochs', str(epochs), '--max-steps', str(max_steps), '--commit-every',
                str(commit_every), '--test-limit', '2000' if max_steps else '0']
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    report = {'kills': [], 'added_at': None, 'sizes': [], 'lines': 0}
    pids = {}  # worker id -> (pid, rank)
    rank_of = {}
    pending = sorted(kill_at)
    last_step = 0
    timer = threading.Timer(timeout, lambda: os.killpg(proc.pid, signal.SIGKILL))
    timer.start()
    try:
        for line in proc.stdout:
            report['lines'] += 1
            if log:
                log.write(line)
            m = PID.match(line)
            if m:
                pids[m.group(1)] = int(m.group(2))
                report.setdefault('all_pids', []).append(int(m.group(2)))
            m = STEP.match(line)
            if m:
                wid, step, size, rank, t = m.group(1), int(m.group(2)), int(m.group(3)), \
                    int(m.group(4)), float(m.group(5))
                rank_of[wid] = rank
                if not report['sizes'] or report['sizes'][-1][0] != size:
                    report['sizes'].append([size, step])  # [size, first step at it]
                last_step = max(last_step, step)
                for k in report['kills']:
                    if k.get('next_step_t') is None and size < k['size_before'] and t > k['t']:
                        k['next_step_t'] = t
                        k['recovery_s'] = round(t - k['t'], 3)
                if pending and step >= pending[0] and rank == 0:
                    pending.pop(0)
                    if victim is None:
                        alive = [(r, w) for w, r in rank_of.items() if w in pids and r > 0]
                    else:
                        alive = [(r, w) for w, r in rank_of.items() if w in pids and r == victim]
                    if alive:
                        r, who = max(alive)
                        os.kill(pids[who], sig)
                        report['kills'].append({'worker': who, 'rank': r, 'at_step': step,
                                                't': time.time(), 'size_before': size,
                                                'signal': int(sig)})
                        report.setdefault('victim_pids', []).append(pids[who])
                        del pids[who]
                        del rank_of[who]
                        if second_after is not None:
                            def second(size=size):
                                rest = [(r2, w) for w, r2 in rank_of.items() if w in pids and r2 > 0]
                                if rest:
                                    r2, w2 = max(rest)
                                    os.kill(pids[w2], signal.SIGKILL)
                                    report['kills'].append({'worker': w2, 'rank': r2,
                                                            't': time.time(), 'size_before': size,
                                                            'signal': int(signal.SIGKILL)})
                            threading.Timer(second_after, second).start()
                if add_at is not None and report['added_at'] is None and step >= add_at \
                        and size < workers:
                    with open(hosts, 'w') as f:
                        f.write('127.0.0.1:%d\n' % (workers + 1))
                    report['added_at'] = step
            m = SUMMARY.search(line)
            if m:
                report['accuracy'] = float(m.group(1))
                report['final_size'] = int(m.group(3))
            if 'job failed' in line:
                report['failure'] = line.strip()
        proc.wait()
    finally:
        timer.cancel()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    report['rc'] = proc.returncode
    report['last_step'] = last_step
    return report


def main():
    p = argparse.ArgumentParser()
    p.add_argument('--build', default=os.path.join(ROOT, 'build'))
    p.add_argument('--workers', type=int, default=4)
    p.add_argument('--min-workers', type=int, default=2)
    p.add_argument('--kill-at', type=int, action='append', default=[])
    p.add_argument('--add-at', type=int, default=None)
    p.add_argument('--max-steps', type=int, default=100)
    p.add_argument('--epochs', type=int, default=1)
    p.add_argument('--commit-every', type=int, default=10)
    p.add_argument('--heartbeat-ms', type=int, default=10000)
    p.add_argument('--elastic-timeout', type=float, default=30)
    p.add_argument('--log', default=None)
    p.add_argument('--program', choices=['python', 'lenet'], default='python')
    a = p.parse_args()
    log = open(a.log, 'w') if a.log else None
    r = run_job(a.build, a.workers, a.min_workers, a.kill_at, a.add_at, a.max_steps, a.epochs,
                a.commit_every, a.heartbeat_ms, a.elastic_timeout, log=log, program=a.program)
    print(json.dumps(r, indent=1))


if __name__ == '__main__':
    main()

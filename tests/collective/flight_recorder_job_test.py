#!/usr/bin/python3
"""The flight recorder of a hung job (docs/timeline.md, "Flight recorder").

`pushpull launch -n 2 -s 0 flight_probe --hang 1`: both ranks allreduce
warmup.0 and warmup.1, then rank 1 never calls the next allreduce while rank
0 waits in "grad.stuck". With PUSHPULL_STALL_WARNING_SECONDS=1 rank 0's stall
warning dumps its ring: the dump names worker 0 and grad.stuck, not done.
SIGUSR1 to the live, hung rank 1 dumps its ring too (the warmups done, no
grad.stuck). The stall shutdown (3 s) then fails the job, and the launcher's
final line says where the dumps are. Every process is ended by its PID.

And a job that ends normally, its ranks closing half a second apart
(`--hang -1`: rank 1 idle when rank 0's goodbye arrives), writes no dump."""

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

BIN = sys.argv[1]
DEADLINE_S = 60


def wait_for(what, fn, deadline):
    while time.monotonic() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError('timed out waiting for ' + what)


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def check_normal_end_leaves_no_dump(probe):
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, PUSHPULL_FLIGHT_RECORDER_DIR=tmp)
        job = subprocess.run([os.path.join(BIN, 'pushpull'), 'launch', '-n', '2', '-s', '0',
                              '--timeout', '30', probe, '--hang', '-1'], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             timeout=DEADLINE_S)
        assert job.returncode == 0, job.stdout[-3000:]
        assert job.stdout.count('FINISHED') == 2, job.stdout[-3000:]
        dumps = [f for f in os.listdir(tmp) if f.startswith('pushpull-flight')]
        assert not dumps, f'a normal end wrote {dumps}:\n{job.stdout[-3000:]}'
        assert 'flight recorder' not in job.stdout, job.stdout[-3000:]
    print('normal end: no dump')


def main():
    probe = os.path.join(BIN, 'flight_probe')
    if not os.path.exists(probe):
        print('SKIP: flight_probe not built')
        return 77
    check_normal_end_leaves_no_dump(probe)
    deadline = time.monotonic() + DEADLINE_S
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, PUSHPULL_FLIGHT_RECORDER_DIR=tmp, PUSHPULL_STALL_WARNING_SECONDS='1',
                   PUSHPULL_STALL_SHUTDOWN_SECONDS='3')
        job = subprocess.Popen([os.path.join(BIN, 'pushpull'), 'launch', '-n', '2', '-s', '0',
                                '--timeout', '30', probe, '--hang', '1'], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        lines = []
        reader = threading.Thread(target=lambda: lines.extend(job.stdout), daemon=True)
        reader.start()
        hung_pid = None
        try:
            # Rank 0's stall warning: a dump naming worker 0 and the tensor it waits on.
            w0 = os.path.join(tmp, 'pushpull-flight.worker0.json')
            d0 = wait_for('worker 0 stall dump', lambda: (lambda d: d if d and any(
                o['name'] == 'grad.stuck' for o in d['operations']) else None)(load(w0)), deadline)
            assert d0['process'] == 'worker0', d0
            stuck = [o for o in d0['operations'] if o['name'] == 'grad.stuck'][-1]
            assert stuck['state'] in ('queued', 'started', 'failed'), stuck
            assert stuck['kind'] == 'allreduce' and stuck['bytes'] == 1024, stuck
            assert d0['reason'].startswith(('stall', 'failure', 'timeout')), d0['reason']
            print('worker 0 dump (%s): grad.stuck %s, %d operations' % (
                d0['reason'][:60], stuck['state'], len(d0['operations'])))
            # SIGUSR1 to the hung rank 1: a dump of a live process.
            m = wait_for('HANGING line', lambda: next(
                (re.search(r'HANGING pid=(\d+)', l) for l in list(lines) if 'HANGING' in l), None),
                deadline)
            hung_pid = int(m.group(1))
            os.kill(hung_pid, signal.SIGUSR1)
            w1 = os.path.join(tmp, 'pushpull-flight.worker1.json')
            d1 = wait_for('worker 1 SIGUSR1 dump', lambda: (lambda d: d if d and d['reason'] == 'SIGUSR1'
                                                            else None)(load(w1)), deadline)
            assert d1['process'] == 'worker1' and d1['pid'] == hung_pid, d1
            names = {o['name']: o['state'] for o in d1['operations']}
            assert names.get('warmup.0') == 'done' and names.get('warmup.1') == 'done', names
            assert 'grad.stuck' not in names, names
            print('worker 1 dump (SIGUSR1): %s' % names)
            # The stall shutdown fails the job; the final line points at the dumps.
            rc = job.wait(timeout=max(1, deadline - time.monotonic()))
            reader.join(timeout=5)
            out = ''.join(lines)
            assert rc != 0, out
            final = [l for l in lines if 'job failed' in l or 'flight recorder' in l]
            assert any('flight recorder dumps' in l and tmp in l for l in lines), out[-3000:]
            assert os.stat(w0).st_mode & 0o777 == 0o600, oct(os.stat(w0).st_mode)
            print('launcher: ' + ' | '.join(l.strip() for l in final[-2:]))
        finally:
            if job.poll() is None:
                job.send_signal(signal.SIGTERM)
                try:
                    job.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    job.kill()
                    job.wait()
            if hung_pid is not None:
                try:
                    os.kill(hung_pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
    print('flight_recorder_job: ok')
    return 0


if __name__ == '__main__':
    sys.exit(main())

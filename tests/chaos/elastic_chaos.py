#!/usr/bin/python3
"""Elastic chaos trials: faults against elastic jobs (docs/elastic.md), which must survive.

Each trial runs examples/python/elastic_lenet.py under `pushpull launch --min-workers 2
--max-workers 5 --host-discovery-script` with 4 workers on this host (through
python/tests/elastic_job.py), hurts a worker while it trains, gives the discovery script one
more slot, and checks:

  * the job succeeds (exit code 0) and ends with 4 workers again (3 after a double fault:
    the discovery script adds one slot, failed slots stay empty);
  * training went on with 3 (or 2, after a double fault) workers within the heartbeat
    timeout + 5 s of the fault (SIGSTOP: + --rejoin-timeout, since a stopped worker is only
    known to be hung once the others re-formed without it);
  * no process of the job is left (every worker pid seen is gone) and nothing crashed
    (no SIGSEGV / SIGABRT / "terminate called" in the output).

Victims: the highest rank, rank 0 (it holds the committed state: the next survivor takes
over), a random rank; signals KILL, TERM, STOP; and a double fault (a second worker
SIGKILLed 0.3 s after the first, while the group re-forms).

    python3 tests/chaos/elastic_chaos.py --sample          # the fixed sample (5 trials)
    python3 tests/chaos/elastic_chaos.py --trials 20 --seed 3

Under sanitizers (ASan+UBSan run everything 2-5x slower) pass --time-scale 3: every deadline
(heartbeats, rejoin, recovery limit, job timeout) is multiplied by it; tests/chaos/tests.cmake does
so in a PUSHPULL_SANITIZE build.

Exit status: 0 when every trial passed, 1 when one failed.
"""

import argparse
import os
import random
import re
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, 'python', 'tests'))
import elastic_job  # noqa: E402

HEARTBEAT_MS = 4000
REJOIN_S = 6
SCALE = 1.0  # --time-scale: every deadline times this (sanitizer builds)
CRASH = re.compile(r'SIGSEGV|SIGABRT|SIGBUS|terminate called|Segmentation fault')

SAMPLE = [('KILL', 'high', False), ('KILL', 'zero', False), ('TERM', 'random', False),
          ('STOP', 'random', False), ('KILL', 'high', True)]


def alive(pid):
    try:
        with open('/proc/%d/stat' % pid) as f:
            return f.read().split(')')[-1].split()[0] != 'Z'
    except OSError:
        return False


def trial(index, sig_name, who, double, build, rng, log_dir):
    sig = getattr(signal, 'SIG' + sig_name)
    victim = {'high': None, 'zero': 0, 'random': rng.randint(0, 3)}[who]
    kill_step = rng.randint(15, 30)
    log_path = os.path.join(log_dir, 'elastic-trial-%02d.log' % index)
    with open(log_path, 'w') as log:
        r = elastic_job.run_job(build, workers=4, min_workers=2, kill_at=[kill_step],
                                add_at=kill_step + 20, max_steps=kill_step + 90,
                                heartbeat_ms=int(HEARTBEAT_MS * SCALE),
                                elastic_timeout=int(30 * SCALE), timeout=int(400 * SCALE),
                                extra=['--rejoin-timeout', str(int(REJOIN_S * SCALE))], log=log,
                                victim=victim, sig=sig, second_after=0.3 if double else None)
    problems = []
    if r['rc'] != 0:
        problems.append('exit code %s (%s)' % (r['rc'], r.get('failure')))
    if not r['kills']:
        problems.append('no fault was injected')
    else:
        limit = (HEARTBEAT_MS / 1000 + 5 + (REJOIN_S if sig_name == 'STOP' else 0)) * SCALE
        rec = r['kills'][0].get('recovery_s')
        if rec is None or rec > limit:
            problems.append('recovery %s s (limit %s s)' % (rec, limit))
    # One slot added back: 4 again after one fault, 3 after a double fault.
    want = 5 - len(r['kills'])
    if r.get('final_size') != want:
        problems.append('final size %s, not %d' % (r.get('final_size'), want))
    time.sleep(0.5)
    left = [p for p in r.get('all_pids', []) if alive(p)]
    for p in left:
        os.kill(p, signal.SIGKILL)
    if left:
        problems.append('processes left: %s' % left)
    with open(log_path) as f:
        crashes = [l.strip() for l in f if CRASH.search(l)]
    if crashes:
        problems.append('crash: %s' % crashes[0])
    rec = r['kills'][0].get('recovery_s') if r['kills'] else None
    print('trial %2d %-4s %-6s %-6s rank %-4s recovery %-6s sizes %s: %s'
          % (index, sig_name, who, 'double' if double else '', victim, rec,
             [s for s, _ in r['sizes']], 'PASS' if not problems else 'FAIL ' + '; '.join(problems)),
          flush=True)
    return not problems


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--build-dir', default=os.path.join(REPO, 'build'))
    p.add_argument('--sample', action='store_true')
    p.add_argument('--trials', type=int, default=len(SAMPLE))
    p.add_argument('--seed', type=int, default=1)
    p.add_argument('--log-dir', default=None)
    p.add_argument('--time-scale', type=float, default=1.0,
                   help='multiply every deadline (3 under ASan+UBSan)')
    a = p.parse_args()
    global SCALE
    SCALE = max(1.0, a.time_scale)
    if not os.path.exists(os.path.join(a.build_dir, 'bin', 'pushpull')):
        print('elastic chaos: %s/bin/pushpull not built' % a.build_dir)
        return 77
    # The trials run a Python training script (examples/python/elastic_lenet.py):
    # builds without the Python package (make sanitize) cannot run them.
    if not os.path.isdir(os.path.join(a.build_dir, 'python', 'pushpull')):
        print('elastic chaos: %s/python/pushpull not built (a build without the Python '
              'package, e.g. make sanitize): skipped' % a.build_dir)
        return 77
    rng = random.Random(a.seed)
    log_dir = a.log_dir or os.path.join(a.build_dir, 'elastic-chaos')
    os.makedirs(log_dir, exist_ok=True)
    plan = list(SAMPLE) if a.sample else [
        (rng.choice(['KILL', 'TERM', 'STOP']), rng.choice(['high', 'zero', 'random']),
         rng.random() < 0.2) for _ in range(a.trials)]
    results = [trial(i, s, w, d, a.build_dir, rng, log_dir) for i, (s, w, d) in enumerate(plan)]
    print('elastic chaos: %d of %d trials passed (logs in %s)' % (sum(results), len(results),
                                                                 log_dir))
    return 0 if all(results) else 1


if __name__ == '__main__':
    sys.exit(main())

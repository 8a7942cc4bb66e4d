#!/usr/bin/python3
"""Negotiation A/B: small allreduces through the engine (negotiation
included, unlike `pushpull bench allreduce`, which times the algorithm
alone), two builds alternated in one run (docs/collectives.md,
"Negotiation").

    bench/negotiation_ab.py OLD_BUILD NEW_BUILD [--ranks 2,4,8] [--sizes 4096,1048576]
                            [--rounds 5] [--iters 200]

Each round runs, for every (ranks, size), one `pushpull launch -s 0` job per
build, old and new in turn (the order flips every round); a job's ranks run
`--iters` allreduces of one cached name per block, 5 blocks, and rank 0
prints the median block's microseconds per allreduce. Rows: the median over
the rounds per build and their ratio (new / old; below 1: faster). Started as
a worker (--worker SIZE ITERS) it is one rank of such a job.
"""

import argparse
import os
import statistics
import subprocess
import sys
import time


def worker(size, iters):
    import torch
    import pushpull.torch as hvd
    hvd.init()
    t = torch.ones(size // 4)
    for _ in range(20):
        hvd.allreduce(t, name='ab', op=hvd.Sum)
    blocks = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(iters):
            hvd.allreduce(t, name='ab', op=hvd.Sum)
        blocks.append((time.perf_counter() - t0) / iters * 1e6)
    if hvd.rank() == 0:
        print('RESULT %.3f' % statistics.median(blocks), flush=True)
    hvd.shutdown()


def job(build, n, size, iters):
    env = dict(os.environ, PYTHONPATH=os.path.join(build, 'python'), OMP_NUM_THREADS='1')
    cmd = [os.path.join(build, 'bin', 'pushpull'), 'launch', '-n', str(n), '-s', '0',
           '--timeout', '120', '--', sys.executable, os.path.abspath(__file__), '--worker',
           str(size), str(iters)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    for line in out.stdout.splitlines():
        if 'RESULT ' in line:  # "[worker 0] RESULT 12.3"
            return float(line.split('RESULT ')[1])
    raise SystemExit('job failed (%s, %d ranks, %d bytes):\n%s%s' %
                     (build, n, size, out.stdout, out.stderr))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('old', nargs='?')
    ap.add_argument('new', nargs='?')
    ap.add_argument('--ranks', default='2,4,8')
    ap.add_argument('--sizes', default='4096,1048576')
    ap.add_argument('--rounds', type=int, default=5)
    ap.add_argument('--iters', type=int, default=200)
    ap.add_argument('--worker', nargs=2, type=int)
    a = ap.parse_args()
    if a.worker:
        return worker(*a.worker)
    builds = {'old': a.old, 'new': a.new}
    ranks = [int(x) for x in a.ranks.split(',')]
    sizes = [int(x) for x in a.sizes.split(',')]
    got = {}
    for rnd in range(a.rounds):
        order = ['old', 'new'] if rnd % 2 == 0 else ['new', 'old']
        for n in ranks:
            for size in sizes:
                for which in order:
                    us = job(builds[which], n, size, a.iters if size < (1 << 20) else a.iters // 10)
                    got.setdefault((n, size, which), []).append(us)
                    print('# round %d %s %d ranks %d bytes: %.1f us' % (rnd, which, n, size, us),
                          file=sys.stderr, flush=True)
    print('| ranks | bytes | old us/op (median) | new us/op (median) | new/old | rounds |')
    print('|---|---|---|---|---|---|')
    for n in ranks:
        for size in sizes:
            o = statistics.median(got[(n, size, 'old')])
            w = statistics.median(got[(n, size, 'new')])
            print('| %d | %d | %.1f | %.1f | %.3f | %d |' % (n, size, o, w, w / o, a.rounds))


if __name__ == '__main__':
    main()

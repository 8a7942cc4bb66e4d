#!/usr/bin/python3
"""Two builds of pushpull, one benchmark, alternated in one run: the check
the transport and scaling issues ask for ("old and new binaries alternated in
one run, every cell within 3% or faster").

    bench/ab_builds.py OLD_BUILD NEW_BUILD [--rounds 5] -- allreduce -n 2,4 --sizes 4K,1M
    bench/ab_builds.py OLD_BUILD NEW_BUILD -- ps -n 1,2 -s 1,2 --sizes 1M,64M
    bench/ab_builds.py OLD_BUILD NEW_BUILD -- step -n 2 --grad-mb 64 --impls hvd,trainer

Each round runs `BUILD/bin/pushpull bench ARGS --format csv --impl pushpull
--repeats 1` once per build, the order flipping every round, so both builds
see the same machine over the same minutes. Every CSV row (impl, n, bytes
and whatever else names the cell) gets the median of its `median_us` over the
rounds per build; the table shows both and new / old (below 1: faster), and
the geometric mean of the ratios. The machine is shared: read the ratios,
not the microseconds, and rerun cells that swing.
"""

import argparse
import csv
import io
import math
import statistics
import subprocess
import sys


def run(build, args, timeout):
    # `bench step` names its implementations itself (--impls); the others
    # run pushpull alone.
    impl = [] if any(a.startswith('--impl') for a in args) or args[:1] == ['step'] else [
        '--impl', 'pushpull']
    cmd = [f'{build}/bin/pushpull', 'bench'] + args + ['--format', 'csv', '--repeats', '1'] + impl
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise SystemExit(f'{" ".join(cmd)} failed ({out.returncode}):\n{out.stderr[-2000:]}')
    rows = {}
    for row in csv.DictReader(io.StringIO(out.stdout)):
        # The time a cell is judged by: allreduce's and ps's median_us, the
        # step's step_ms (in microseconds here too).
        value = 'median_us' if 'median_us' in row else 'step_ms' if 'step_ms' in row else None
        if value is None or not row[value]:
            continue
        key = tuple((k, v) for k, v in row.items()
                    if k != value and not k.endswith(('GBps', 'MBps', '_s', 'ratio'))
                    and not k.startswith(('vs_', 'paired_')))
        rows[key] = float(row[value]) * (1000.0 if value == 'step_ms' else 1.0)
    if not rows:
        raise SystemExit(f'{" ".join(cmd)} printed no rows:\n{out.stdout[-2000:]}')
    return rows


def main():
    argv = sys.argv[1:]
    if '--' not in argv:
        raise SystemExit(__doc__)
    split = argv.index('--')
    ap = argparse.ArgumentParser()
    ap.add_argument('old')
    ap.add_argument('new')
    ap.add_argument('--rounds', type=int, default=5)
    ap.add_argument('--timeout', type=int, default=900)
    opts = ap.parse_args(argv[:split])
    bench = argv[split + 1:]
    times = {'old': {}, 'new': {}}
    for r in range(opts.rounds):
        order = ['old', 'new'] if r % 2 == 0 else ['new', 'old']
        for which in order:
            for key, us in run(getattr(opts, which), bench, opts.timeout).items():
                times[which].setdefault(key, []).append(us)
        print(f'# round {r + 1} of {opts.rounds} done', file=sys.stderr, flush=True)
    print(f'# bench {" ".join(bench)}; {opts.rounds} rounds alternated; old {opts.old}, '
          f'new {opts.new}; medians of the rounds')
    print('| cell | old us | new us | new / old |')
    print('|---|---|---|---|')
    logs = []
    for key in sorted(set(times['old']) & set(times['new'])):
        old = statistics.median(times['old'][key])
        new = statistics.median(times['new'][key])
        ratio = new / old if old > 0 else float('nan')
        logs.append(math.log(ratio))
        cell = ' '.join(f'{k}={v}' for k, v in key)
        print(f'| {cell} | {old:.1f} | {new:.1f} | {ratio:.3f} |')
    if logs:
        print(f'geometric mean of new / old: {math.exp(sum(logs) / len(logs)):.3f} '
              f'over {len(logs)} cells')


if __name__ == '__main__':
    main()

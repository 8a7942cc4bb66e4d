#!/usr/bin/python3
"""The chaos suite: randomized fault trials against real `pushpull launch` jobs.

Each trial starts a small training job on this host, waits until it trains,
hurts one process of it at a random moment and checks what docs/reliability.md
promises:

  * the launcher exits within the heartbeat timeout + 5 s of the fault;
  * with the victim's code: 128+signal for a worker or server killed by
    SIGKILL or SIGTERM, 1 for a stopped (SIGSTOP) one the job detected,
    143 for a launcher given SIGTERM;
  * its last line is "job failed: ..." and names the victim ("worker 1",
    "server 0") before any other node: the cause, not a consequence;
  * no process of the job is left (every descendant of the launcher is
    recorded from /proc while the job runs; leftovers are killed by pid and
    counted as orphans);
  * nothing crashed: no core file in the job's directory (it runs with a core
    size limit) and no process of the job ended on SIGSEGV, SIGABRT, ...
    (the launcher's -v lines report how each process ended).

Engines: ps (examples/lenet over dist_sync, 2 workers + 2 servers), collective
(examples/lenet --mode horovod, 3 workers), py-ps and py-collective
(tests/chaos/py_worker.py over pushpull.kv / pushpull.torch), ps-loop
(tests/e2e/ps_loop_worker, the lightest PS job; used instead of ps when lenet
was not built). Victims: a worker, a server, or the launcher itself (it hosts
the PS scheduler). Signals: KILL, STOP, TERM.

    python3 tests/chaos/chaos.py --trials 100            # `make chaos`
    python3 tests/chaos/chaos.py --sample                # the ctest sample
    python3 tests/chaos/chaos.py --trials 20 --engines collective --signals STOP --seed 7

Exit status: 0 when every trial passed, 1 when one failed, 2 on bad usage.
Needs Linux /proc and permission to signal the job's processes (its own).

The pieces: chaos_trials.py (engines, the sample, the Trial record),
chaos_procs.py (the job's processes), chaos_judge.py (the checks above).
"""

import argparse
import dataclasses
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from chaos_judge import check_output, inject, judge_clean, judge_exit
from chaos_procs import Output, Tracker, set_core_limit, stop_job
from chaos_trials import DEFAULT_ENGINES, ENGINES, HERE, PYTHON, SAMPLE, SIGNALS, Trial, valid

REPO = os.path.dirname(os.path.dirname(HERE))


# ----------------------------------------------------------------------------
# One trial


def run_trial(t, cfg):
    engine = ENGINES[t.engine]
    timeout_s = cfg.heartbeat_ms / 1000.0
    limit = timeout_s + 5.0
    cwd = tempfile.mkdtemp(prefix=f'trial-{t.index}-', dir=cfg.work_dir)
    env = dict(os.environ)
    env['PUSHPULL_HEARTBEAT_TIMEOUT_MS'] = str(cfg.heartbeat_ms)
    # The chaos trials check that a failure ends the job naming its cause;
    # parameter-server fail-over (replicas) would keep it running.
    env.setdefault('PUSHPULL_PS_REPLICAS', '0')
    env['PYTHONPATH'] = os.pathsep.join([os.path.join(cfg.build_dir, 'python'),
                                         env.get('PYTHONPATH', '')])
    for kv in cfg.env:
        k, _, v = kv.partition('=')
        env[k] = v
    cmd = [os.path.join(cfg.build_dir, 'bin', 'pushpull'), 'launch', '-v', '-n',
           str(engine.workers), '-s', str(engine.servers), '--'] + engine.command(cfg.build_dir)
    started = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, preexec_fn=set_core_limit,
                            start_new_session=True)
    tracker = Tracker(proc.pid)
    tracker.start()
    out = Output(proc)
    fault_at = forced_at = None
    try:
        if t.signal == 'NONE':
            judge_clean(t, engine, proc, tracker, out, started)
        else:
            fault_at = inject(t, engine, proc, tracker, out, started)
            if fault_at is not None:
                judge_exit(t, proc, tracker, out, fault_at, limit)
    finally:
        forced_at = stop_job(t, proc, tracker)
        out.join(5)
    lines = out.snapshot()
    check_output(t, lines, fault_at, forced_at, cwd, cfg.keep_dir, limit)
    t.log = '\n'.join(f'{ts - started:8.3f} {name} {text}' for ts, name, text in lines)
    shutil.rmtree(cwd, ignore_errors=True)
    if t.status == 'pending':
        t.status = 'fail' if t.reasons else 'pass'
    return t



# ----------------------------------------------------------------------------
# The plan, the run, the table


def plan_trials(args, rng):
    engines, roles, sigs = args.engines, args.roles, args.signals
    if args.sample:
        plan = [c for c in SAMPLE if c[0] in engines]
    else:
        combos = [(e, r, s, 'training') for e in engines for r in roles + ['none'] for s in sigs
                  if valid(e, r, s)]
        if not combos:
            sys.exit('chaos: no valid (engine, role, signal) combination selected')
        rng.shuffle(combos)
        plan = combos[:args.trials]  # every combination once first, then at random
        while len(plan) < args.trials:
            plan.append(rng.choice(combos))
        # Some trials hit a process that is still starting (it may not have
        # joined yet): the launcher alone can notice, within 2 s.
        for i, (e, r, s, _) in enumerate(plan):
            if valid(e, r, s, 'startup') and rng.random() < args.startup_share:
                plan[i] = (e, r, s, 'startup')
    trials = []
    for i, (e, r, s, m) in enumerate(plan, 1):
        eng = ENGINES[e]
        rank = rng.randrange(eng.workers if r == 'worker' else max(1, eng.servers))
        delay = rng.uniform(0.0, 0.3) if m == 'startup' else rng.uniform(0.5, args.max_delay)
        trials.append(Trial(i, e, r, rank if r in ('worker', 'server') else 0, s, m, delay))
    return trials


def fmt_range(values):
    if not values:
        return '-'
    return f'{min(values):.2f}/{statistics.median(values):.2f}/{max(values):.2f}'


def summary(trials):
    groups = {}
    for t in trials:
        groups.setdefault((t.engine, t.role, t.signal), []).append(t)
    head = (f'{"engine":<14} {"victim":<9} {"signal":<7} {"trials":>6} {"pass":>5} {"fail":>5} '
            f'{"skip":>5} {"detect s min/med/max":>22} {"end s min/med/max":>20} {"orphans":>8} '
            f'{"crashes":>8}')
    rows = [head, '-' * len(head)]

    def row(name, role, sig, ts):
        det = [t.detect_s for t in ts if t.detect_s is not None and t.status != 'skip']
        end = [t.exit_s for t in ts if t.exit_s is not None and t.status != 'skip']
        count = {k: sum(t.status == k for t in ts) for k in ('pass', 'fail', 'skip')}
        return (f'{name:<14} {role:<9} {sig:<7} {len(ts):>6} '
                f'{count["pass"]:>5} {count["fail"]:>5} {count["skip"]:>5} '
                f'{fmt_range(det):>22} {fmt_range(end):>20} '
                f'{sum(t.orphans for t in ts):>8} {sum(t.crashes for t in ts):>8}')

    for (e, r, s), ts in sorted(groups.items()):
        rows.append(row(e, r, s, ts))
    rows.append('-' * len(head))
    rows.append(row('all', '', '', trials))
    return '\n'.join(rows)


def available_engines(build):
    have = {}
    bin_dir = os.path.join(build, 'bin')
    lenet = os.path.exists(os.path.join(bin_dir, 'lenet'))
    pkg = os.path.isdir(os.path.join(build, 'python', 'pushpull'))

    def imports(mods):
        return subprocess.run([PYTHON, '-c', f'import {mods}'], capture_output=True).returncode == 0

    numpy_ok = pkg and imports('numpy')
    torch_ok = numpy_ok and imports('torch')
    have['ps'] = lenet or 'examples/lenet not built (libtorch off)'
    have['collective'] = lenet or 'examples/lenet not built (libtorch off)'
    have['py-ps'] = numpy_ok or f'{build}/python/pushpull not built or no numpy for {PYTHON}'
    have['py-collective'] = torch_ok or \
        f'{build}/python/pushpull not built or no torch for {PYTHON}'
    have['ps-loop'] = os.path.exists(os.path.join(bin_dir, 'ps_loop_worker')) or \
        'ps_loop_worker not built'
    return {k: v for k, v in have.items()}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--build-dir', default=os.path.join(REPO, 'build'),
                   help='build tree with bin/pushpull, bin/lenet and python/ (default: build)')
    p.add_argument('--trials', type=int, default=100)
    p.add_argument('--seed', type=int, default=None, help='default: from the clock (printed)')
    p.add_argument('--sample', action='store_true',
                   help=f'the short fixed sample of ctest ({len(SAMPLE)} trials: every engine and '
                   'signal)')
    p.add_argument('--engines', default=','.join(DEFAULT_ENGINES),
                   help=f'comma-separated, of {",".join(ENGINES)}')
    p.add_argument('--roles', default='worker,server,launcher')
    p.add_argument('--signals', default='KILL,STOP,TERM',
                   help='of KILL, STOP, TERM and NONE (a control trial: no fault, the job must '
                   'succeed and end within 2 s of its last worker)')
    p.add_argument('--startup-share', type=float, default=0.1,
                   help='share of KILL/TERM trials that hit a worker or server while it starts')
    p.add_argument('--max-delay', type=float, default=4.0,
                   help='the fault comes 0.5..this many seconds after every worker trains')
    p.add_argument('--heartbeat-ms', type=int, default=2000,
                   help='PUSHPULL_HEARTBEAT_TIMEOUT_MS of the jobs; the limit is this + 5 s')
    p.add_argument('--env', action='append', default=[], metavar='NAME=VALUE',
                   help='an extra variable for the jobs (repeatable)')
    p.add_argument('--log-dir', help='keep every trial\'s output here (default: failed ones '
                   'only, in a temporary directory)')
    p.add_argument('--json', help='write every trial\'s result to this file')
    p.add_argument('-v', '--verbose', action='store_true', help='print failed trials\' output')
    a = p.parse_args(argv)
    a.build_dir = os.path.abspath(a.build_dir)
    a.engines = [e for e in a.engines.split(',') if e]
    a.roles = [r for r in a.roles.split(',') if r]
    a.signals = [s.upper().removeprefix('SIG') for s in a.signals.split(',') if s]
    for e in a.engines:
        if e not in ENGINES:
            p.error(f'unknown engine {e}')
    for s in a.signals:
        if s not in SIGNALS and s != 'NONE':
            p.error(f'unknown signal {s}')
    for r in a.roles:
        if r not in ('worker', 'server', 'launcher'):
            p.error(f'unknown role {r}')
    if a.seed is None:
        a.seed = int(time.time()) % 100000
    return a


def main(argv):
    args = parse_args(argv)
    if not os.path.exists(os.path.join(args.build_dir, 'bin', 'pushpull')):
        print(f'chaos: {args.build_dir}/bin/pushpull not found: build first', file=sys.stderr)
        return 2
    have = available_engines(args.build_dir)
    engines = []
    for e in args.engines:
        if have[e] is True:
            engines.append(e)
            continue
        print(f'chaos: SKIPPING engine {e}: {have[e]}', flush=True)
        if e == 'ps' and have['ps-loop'] is True and 'ps-loop' not in args.engines:
            print('chaos: using ps-loop for the C++ parameter-server engine', flush=True)
            engines.append('ps-loop')
    if not engines:
        print('chaos: no engine can run with this build', file=sys.stderr)
        return 2
    args.engines = engines
    if args.sample and 'ps-loop' in engines:
        SAMPLE.extend((('ps-loop',) + c[1:]) for c in list(SAMPLE) if c[0] == 'ps')
    rng = random.Random(args.seed)
    trials = plan_trials(args, rng)
    work_dir = tempfile.mkdtemp(prefix='pushpull-chaos-')
    args.work_dir = work_dir
    log_dir = args.log_dir or os.path.join(work_dir, 'logs')
    os.makedirs(log_dir, exist_ok=True)
    args.keep_dir = log_dir
    print(f'chaos: {len(trials)} trials, seed {args.seed}, engines {",".join(engines)}, '
          f'heartbeat timeout {args.heartbeat_ms} ms '
          f'(limit {args.heartbeat_ms / 1000.0 + 5.0:.0f} s), '
          f'build {args.build_dir}', flush=True)
    t0 = time.monotonic()
    interrupted = False
    try:
        for t in trials:
            run_trial(t, args)
            line = f'{t.label():<52} {t.status.upper():<4} rc={t.exit_code}'
            if t.detect_s is not None:
                line += f' detect={t.detect_s:.2f}s'
            if t.exit_s is not None:
                line += f' end={t.exit_s:.2f}s'
            print(line, flush=True)
            if t.status != 'pass':
                for r in t.reasons:
                    print(f'    - {r}', flush=True)
                print(f'    final line: {t.final_line}', flush=True)
            if t.status != 'pass' or args.log_dir:
                name = f'trial-{t.index:03d}-{t.engine}-{t.role}-{t.signal}.log'
                path = os.path.join(log_dir, name)
                with open(path, 'w') as f:
                    f.write(t.label() + '\n' + t.log + '\n')
                if t.status != 'pass' and args.verbose:
                    print(t.log)
    except KeyboardInterrupt:
        interrupted = True
        print('chaos: interrupted', flush=True)
    done = [t for t in trials if t.status != 'pending']
    print(f'\nchaos: {len(done)} trials in {time.monotonic() - t0:.0f} s, seed {args.seed}')
    print(summary(done))
    failed = [t for t in done if t.status == 'fail']
    if failed:
        print(f'\nFAILED trials ({len(failed)}; logs in {log_dir}):')
        for t in failed:
            print(f'  {t.label()}: ' + '; '.join(t.reasons))
    if args.json:
        with open(args.json, 'w') as f:
            json.dump({'seed': args.seed, 'heartbeat_ms': args.heartbeat_ms,
                       'trials': [{k: v for k, v in dataclasses.asdict(t).items() if k != 'log'}
                                  for t in done]}, f, indent=1)
    if not failed or args.log_dir:
        # The trials' directories (empty by now), and the logs unless a trial failed.
        shutil.rmtree(work_dir, ignore_errors=True)
    return 1 if failed or interrupted else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))

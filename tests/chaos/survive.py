#!/usr/bin/python3
"""Survive mode of the chaos suite: the default configuration's recovery under random faults.

Each trial runs a parameter-server job as a user would run one that must
survive faults, with the DEFAULT replication (PUSHPULL_PS_REPLICAS unset:
one backup per key range) and worker/server restarts:

    pushpull launch -v -n 3 -s 3 --max-restarts 3 --server-command WRAPPER \\
        -- WRAPPER ps_failover_worker sync|async ROUNDS 50

(tests/e2e/ps_failover_worker: every pulled value checked in closed form at
every round, float32 and float16 keys and a big array split over the
servers; sync trials meet at an epoch-end barrier every 5 rounds). The
wrappers record "rank pid" of every worker and server process (restarted
ones too) and export PP_TEST_REPLACEMENT=1 in a restarted worker, as
tests/e2e/ps_restart_test.cpp does. Heartbeats every 200 ms, timeout 2 s;
PUSHPULL_STARTUP_TIMEOUT_MS=4000, and every job trains at least 8 s after its
last fault, so every start-up deadline after a restart passes while it runs.

At a random round one or two faults are injected:

  kill-worker / kill-server   SIGKILL
  stopcont-worker / -server   SIGSTOP, SIGCONT after 0.1-3 s (a zombie that
                              wakes up; stopped longer than the heartbeat
                              timeout it was failed over / replaced already)
  stop-worker / stop-server   SIGSTOP for good (detected, killed by the
                              launcher, restarted)
  catchup-same / -other       SIGKILL a server, and as soon as the scheduler
                              says it "registered again" (it fetches its key
                              ranges) SIGKILL the same one or another one
  rejoined-pair               SIGKILL server A+1, and once it rejoined, server A
  double                      two of the simple faults above, at two rounds

Expected outcome: with R=1 and 3 servers any two servers are neighbours, so
two distinct servers failed at the same time (the first not yet rejoined
when the second is declared failed) is NOT survivable: the job must fail
cleanly, "no replica left", within heartbeat timeout + 5 s of the fault.
Every other schedule must survive: exit 0, every worker prints
"OK worker r", no "WRONG", no crash, no process left. Recovery time: fault to
the next "ROUND k" line (worker 0) printed after it, and to the second one
(the first may be a round that was already complete when the fault came);
target: within heartbeat timeout + 2 s.

    python3 tests/chaos/survive.py --sample              # ctest chaos.survive_sample
    python3 tests/chaos/survive.py --trials 200          # make chaos-survive
    python3 tests/chaos/survive.py --replay 123456789    # one trial from its seed

Exit status: 0 when every trial passed, 1 when one failed, 2 on bad usage.

The pieces: survive_plan.py (timings, scenarios, the plan), survive_judge.py
(the checks), survive_report.py (the table); the job's processes:
chaos_procs.py.
"""

import argparse
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import chaos_procs  # noqa: E402  (the /proc tracker, the output reader, stop_job)
from survive_judge import ROUND_LINE, judge  # noqa: E402
from survive_plan import (HANG_S, HEARTBEAT_MS, INTERVAL_MS, SAMPLE, SCENARIOS,  # noqa: E402
                          SLEEP_MS, STARTUP_MS, plan)
from survive_report import summarize, table  # noqa: E402

SCHED_REGISTERED = 'server {} registered again'


# ----------------------------------------------------------------------------
# One trial


def rank_pids(path):
    """{rank: pid} from a wrapper's "rank pid" lines: the latest process of each rank."""
    pids = {}
    try:
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 2:
                    pids[int(parts[0])] = int(parts[1])
    except OSError:
        pass
    return pids


def proc_start(pid):
    try:
        with open(f'/proc/{pid}/stat') as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(')') + 2:].split()
    return None if fields[0] in ('Z', 'X') else int(fields[19])


def last_round(lines):
    for _, _, text in reversed(lines):
        m = ROUND_LINE.match(text)
        if m:
            return int(m.group(1))
    return 0


def job_command(cfg, cwd, t):
    b = os.path.join(cfg.build_dir, 'bin')
    pushpull = os.path.join(b, 'pushpull')
    server = f"sh -c 'echo $PUSHPULL_RANK $$ >> {cwd}/servers; exec {pushpull} server'"
    wrapper = (f'm={cwd}/w.$PUSHPULL_RANK; if [ -e $m ]; then export PP_TEST_REPLACEMENT=1; fi; '
               f'touch $m; echo $PUSHPULL_RANK $$ >> {cwd}/workers; '
               f'exec {b}/ps_failover_worker "$@"')
    return [pushpull, 'launch', '-v', '-n', '3', '-s', '3', '--max-restarts', '3',
            '--server-command', server, '--', 'sh', '-c', wrapper, 'worker', t.mode,
            str(t.rounds), str(SLEEP_MS)]


def job_env(cfg, t):
    env = dict(os.environ)
    env.pop('PUSHPULL_PS_REPLICAS', None)  # the default: one backup per key range
    env.update({'PUSHPULL_BIGARRAY_BOUND': '1000', 'PUSHPULL_PS_CHUNK_BYTES': '4096',
                'PUSHPULL_HEARTBEAT_INTERVAL_MS': str(INTERVAL_MS),
                'PUSHPULL_HEARTBEAT_TIMEOUT_MS': str(HEARTBEAT_MS),
                'PUSHPULL_STARTUP_TIMEOUT_MS': str(STARTUP_MS)})
    for k in ('PP_TEST_BARRIER_EVERY', 'PP_TEST_BARRIER_AT', 'PP_TEST_DIE'):
        env.pop(k, None)
    if t.mode == 'sync':
        env['PP_TEST_BARRIER_EVERY'] = '5'  # epoch-end barriers
    return env


def run_trial(t, cfg):
    cwd = tempfile.mkdtemp(prefix=f'survive-{t.index}-', dir=cfg.work_dir)
    started = time.monotonic()
    proc = subprocess.Popen(job_command(cfg, cwd, t), cwd=cwd, env=job_env(cfg, t),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, preexec_fn=chaos_procs.set_core_limit,
                            start_new_session=True)
    tracker = chaos_procs.Tracker(proc.pid)
    tracker.start()
    out = chaos_procs.Output(proc)
    timers = []
    forced_at = None
    try:
        inject_all(t, cwd, proc, tracker, out, timers)
        watch(t, proc, out)
    finally:
        for tm in timers:
            tm.cancel()
        forced_at = chaos_procs.stop_job(t, proc, tracker)
        out.join(5)
    lines = out.snapshot()
    judge(t, lines, cwd, cfg, forced_at, proc)
    t.log = '\n'.join(f'{ts - started:8.3f} {name} {text}' for ts, name, text in lines)
    shutil.rmtree(cwd, ignore_errors=True)
    t.status = 'fail' if t.reasons else 'pass'
    return t


def inject_all(t, cwd, proc, tracker, out, timers):
    prev_at = time.monotonic()
    for f in t.faults:
        deadline = time.monotonic() + 60
        if f.after_registered is not None or f.after_rejoined is not None:
            marker = (SCHED_REGISTERED.format(f.after_registered) if f.after_registered is not None
                      else f'server {f.after_rejoined} rejoined:')
            since = prev_at

            def ready(lines, marker=marker, since=since):
                return proc.poll() is not None or any(
                    ts >= since and marker in text for ts, _, text in lines)
        else:
            def ready(lines, k=f.at_round):
                return proc.poll() is not None or last_round(lines) >= k
        if not out.wait_for(ready, deadline) or proc.poll() is not None:
            t.reasons.append(f'fault "{f.describe()}" not injected: the job '
                             f'{"ended (exit " + str(proc.poll()) + ")" if proc.poll() is not None else "made no progress for 60 s"}')
            return
        pids = rank_pids(os.path.join(cwd, 'servers' if f.role == 'server' else 'workers'))
        pid = pids.get(f.rank)
        start = proc_start(pid) if pid else None
        if start is None:
            # Between a death and the restart: wait a moment for the replacement.
            until = time.monotonic() + 5
            while time.monotonic() < until and start is None and proc.poll() is None:
                time.sleep(0.02)
                pid = rank_pids(os.path.join(cwd, f.role + 's')).get(f.rank)
                start = proc_start(pid) if pid else None
        if start is None:
            t.reasons.append(f'fault "{f.describe()}" not injected: no live {f.role} {f.rank}')
            return
        sig = signal.SIGKILL if f.kind == 'kill' else signal.SIGSTOP
        chaos_procs.kill_quietly(pid, sig)
        f.at, f.pid = time.monotonic(), pid
        prev_at = f.at
        if f.kind == 'stopcont':
            def wake(pid=pid, start=start):
                if proc_start(pid) == start:  # the same process, if it is still there
                    chaos_procs.kill_quietly(pid, signal.SIGCONT)
            tm = threading.Timer(f.stop_s, wake)
            tm.daemon = True
            tm.start()
            timers.append(tm)


def watch(t, proc, out):
    """Waits for the launcher; a hang: no new ROUND line and no exit for HANG_S.
    In dist_sync every worker is in worker 0's round; in dist_async worker 0
    may be done (waiting in the final barrier) while a restarted worker still
    pushes its rounds silently: there, HANG_S counts from when worker 0's
    rounds and a whole job's worth of rounds (a replacement resumes from its
    last round) are over."""
    seen, progress = -1, time.monotonic()
    while proc.poll() is None:
        lines = out.snapshot()
        k = last_round(lines)
        now = time.monotonic()
        if k != seen:
            seen, progress = k, now
            if t.mode == 'async' and k >= t.rounds:
                progress = now + t.rounds * SLEEP_MS / 1000.0
        elif now - progress > HANG_S:
            t.hang = True
            t.reasons.append(f'hang: no round completed and no exit for {HANG_S:.0f} s '
                             f'(last ROUND {k})')
            return
        time.sleep(0.1)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--build-dir', default=os.path.join(REPO, 'build'),
                   help='build tree with bin/pushpull and bin/ps_failover_worker')
    p.add_argument('--trials', type=int, default=30)
    p.add_argument('--seed', type=int, default=None, help='default: from the clock (printed)')
    p.add_argument('--sample', action='store_true',
                   help=f'the short fixed sample of ctest ({len(SAMPLE)} trials)')
    p.add_argument('--scenarios', default=','.join(SCENARIOS),
                   help=f'comma-separated, drawn at random from these: {",".join(SCENARIOS)}')
    p.add_argument('--replay', type=int, metavar='TRIAL_SEED',
                   help='run the one trial of this seed (printed by a failing trial)')
    p.add_argument('--replay-scenario', choices=SCENARIOS,
                   help='with --replay: the scenario the failing trial printed')
    p.add_argument('--replay-mode', choices=['sync', 'async'],
                   help='with --replay: the mode the failing trial printed')
    p.add_argument('--log-dir', help="keep every trial's output here (default: failed ones "
                   'only, in a temporary directory)')
    p.add_argument('--json', help='write the summary and every trial to this file')
    p.add_argument('-v', '--verbose', action='store_true', help="print failed trials' output")
    a = p.parse_args(argv)
    a.build_dir = os.path.abspath(a.build_dir)
    if a.seed is None:
        a.seed = int(time.time()) % 100000
    return a


def main(argv):
    args = parse_args(argv)
    for b in ('pushpull', 'ps_failover_worker'):
        if not os.path.exists(os.path.join(args.build_dir, 'bin', b)):
            print(f'survive: {args.build_dir}/bin/{b} not found: build first', file=sys.stderr)
            return 2
    trials = plan(args)
    args.work_dir = tempfile.mkdtemp(prefix='pushpull-survive-')
    log_dir = args.log_dir or os.path.join(args.work_dir, 'logs')
    os.makedirs(log_dir, exist_ok=True)
    args.keep_dir = log_dir
    print(f'survive: {len(trials)} trials, seed {args.seed}, 3 workers x 3 servers, default '
          f'replicas, --max-restarts 3, heartbeat {INTERVAL_MS}/{HEARTBEAT_MS} ms, startup '
          f'timeout {STARTUP_MS} ms, build {args.build_dir}', flush=True)
    t0 = time.monotonic()
    interrupted = False
    try:
        for t in trials:
            run_trial(t, args)
            rec = [f.recovery_s for f in t.faults if f.recovery_s is not None]
            line = (f'{t.label():<40} {t.status.upper():<4} a-priori={t.apriori} '
                    f'expected={t.expected} '
                    f'outcome={t.outcome} rc={t.exit_code}')
            if rec:
                line += f' recovery={max(rec):.2f}s'
            if t.end_s is not None:
                line += f' end={t.end_s:.1f}s'
            print(line, flush=True)
            print(f'    schedule: {t.schedule()}' +
                  ''.join(f' [{"in" if f.in_catchup else "after"} catch-up]'
                          for f in t.faults if f.in_catchup is not None), flush=True)
            if t.status != 'pass':
                for r in t.reasons:
                    print(f'    - {r}', flush=True)
                print(f'    replay: python3 tests/chaos/survive.py --replay {t.seed} '
                      f'--replay-scenario {t.scenario} --replay-mode {t.mode} '
                      f'--build-dir {args.build_dir}', flush=True)
            if t.status != 'pass' or args.log_dir:
                path = os.path.join(log_dir, f'survive-{t.index:03d}-{t.seed}.log')
                with open(path, 'w') as f:
                    f.write(f'{t.label()}\n{t.schedule()}\n{t.log}\n')
                if t.status != 'pass':
                    print(f'    log: {path}', flush=True)
                    if args.verbose:
                        print(t.log)
    except KeyboardInterrupt:
        interrupted = True
        print('survive: interrupted', flush=True)
    done = [t for t in trials if t.status != 'pending']
    s = summarize(done)
    print(f'\nsurvive: {len(done)} trials in {time.monotonic() - t0:.0f} s, seed {args.seed}')
    print(table(s))
    failed = [t for t in done if t.status == 'fail']
    if failed:
        print(f'\nFAILED trials ({len(failed)}; logs in {log_dir}):')
        for t in failed:
            print(f'  {t.label()} [{t.schedule()}]: ' + '; '.join(t.reasons))
    if args.json:
        with open(args.json, 'w') as f:
            json.dump({'seed': args.seed, 'heartbeat_ms': HEARTBEAT_MS, 'summary': s,
                       'trials': [{k: v for k, v in dataclasses.asdict(t).items() if k != 'log'}
                                  for t in done]}, f, indent=1)
    if not failed or args.log_dir:
        shutil.rmtree(args.work_dir, ignore_errors=True)
    return 1 if failed or interrupted else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))

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
"""

import argparse
import dataclasses
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import chaos  # noqa: E402  (the /proc tracker, the output reader, stop_job, the crash patterns)

HEARTBEAT_MS = 2000
INTERVAL_MS = 200
STARTUP_MS = 4000
SLEEP_MS = 50
AFTER_LAST_FAULT_S = 8.0
# Rounds after the last fault: at SLEEP_MS a round, at least AFTER_LAST_FAULT_S.
TAIL_ROUNDS = int(AFTER_LAST_FAULT_S * 1000 / SLEEP_MS) + 10
FAIL_LIMIT_S = HEARTBEAT_MS / 1000.0 + 5.0  # a non-survivable trial ends within this
RECOVERY_TARGET_S = HEARTBEAT_MS / 1000.0 + 2.0
HANG_S = 30.0  # no new ROUND line and no exit for this long: a hang

SIMPLE = ['kill-worker', 'kill-server', 'stopcont-worker', 'stopcont-server', 'stop-worker',
          'stop-server']
SCENARIOS = SIMPLE + ['catchup-same', 'catchup-other', 'rejoined-pair', 'double']
# How often each scenario is drawn (the two-fault ones are the least tested).
WEIGHTS = {'kill-worker': 1, 'kill-server': 1, 'stopcont-worker': 1, 'stopcont-server': 1.5,
           'stop-worker': 1, 'stop-server': 1, 'catchup-same': 1.5, 'catchup-other': 1,
           'rejoined-pair': 1,
           'double': 3}

# The scheduler's lines (in the launcher's own output, not prefixed by a node;
# tagged "scheduler" or not, whichever thread saw the death first).
SCHED_FAILOVER = re.compile(r'^\[pushpull \w [\d:.]+( scheduler)?\] fail-over: server (\d+) ')
SCHED_REJOINED = re.compile(r'^\[pushpull \w [\d:.]+( scheduler)?\] server (\d+) rejoined:')
SCHED_REGISTERED = 'server {} registered again'
NO_REPLICA = 'no replica left'
ROUND_LINE = re.compile(r'^\[worker 0\] ROUND (\d+)$')
WORKER_ERROR = re.compile(r'^\[worker \d\] ERROR ')
OK_LINE = re.compile(r'^\[worker (\d)\] OK worker (\d)$')


@dataclasses.dataclass
class Fault:
    kind: str  # kill, stopcont, stop
    role: str  # worker, server
    rank: int
    at_round: int = None  # injected once worker 0 printed this round
    after_registered: int = None  # or once "server N registered again" follows the last fault
    after_rejoined: int = None  # or once "server N rejoined" follows the last fault
    stop_s: float = None  # stopcont: SIGCONT after this long
    # results
    at: float = None  # monotonic time of the signal
    pid: int = None
    in_catchup: bool = None  # catch-up faults: the server had not rejoined yet
    recovery_s: float = None  # fault -> next ROUND line
    recovery2_s: float = None  # fault -> the second ROUND line after it

    def describe(self):
        what = (f'SIGSTOP, SIGCONT after {self.stop_s:.2f} s' if self.kind == 'stopcont' else
                {'kill': 'SIGKILL', 'stop': 'SIGSTOP for good'}[self.kind])
        when = (f'once server {self.after_registered} registered again'
                if self.after_registered is not None else
                f'once server {self.after_rejoined} rejoined' if self.after_rejoined is not None
                else f'after ROUND {self.at_round}')
        return f'{self.role} {self.rank} {what} {when}'


@dataclasses.dataclass
class Trial:
    index: int
    seed: int
    scenario: str
    mode: str
    rounds: int
    faults: list
    # results
    status: str = 'pending'  # pass, fail
    apriori: str = None  # survive, fail, timing: from the schedule alone (apriori())
    expected: str = None  # survive, fail (resolved from the faults and the scheduler's timeline)
    outcome: str = None  # survived, failed, hang, ...
    reasons: list = dataclasses.field(default_factory=list)
    exit_code: int = None
    final_line: str = ''
    wrong: int = 0
    hang: bool = False
    crashes: int = 0
    orphans: int = 0
    end_s: float = None  # last fault -> launcher exit
    log: str = ''

    def label(self):
        return f'#{self.index} seed {self.seed} {self.mode} {self.scenario}'

    def schedule(self):
        return '; '.join(f.describe() for f in self.faults)


# ----------------------------------------------------------------------------
# The plan


def plan_trial(index, seed, scenario=None, mode=None):
    """A trial from its seed alone (--replay SEED rebuilds it)."""
    rng = random.Random(seed)
    # Drawn always (a given scenario or mode overrides the draw), so that a
    # seed gives the same faults with --replay-scenario/--replay-mode.
    drawn = rng.choices(SCENARIOS, [WEIGHTS[s] for s in SCENARIOS])[0]
    drawn_mode = 'async' if rng.random() < 0.3 else 'sync'
    scenario = scenario or drawn
    mode = mode or drawn_mode

    def simple(kind_role, at_round):
        kind, role = kind_role.split('-')
        f = Fault(kind, role, rng.randrange(3), at_round=at_round)
        if kind == 'stopcont':
            f.stop_s = round(rng.uniform(0.1, 3.0), 2)
        return f

    first = rng.randint(10, 50)
    if scenario in SIMPLE:
        faults = [simple(scenario, first)]
    elif scenario.startswith('catchup'):
        a = rng.randrange(3)
        b = a if scenario == 'catchup-same' else (a + rng.randint(1, 2)) % 3
        faults = [Fault('kill', 'server', a, at_round=first),
                  Fault('kill', 'server', b, after_registered=a)]
    elif scenario == 'rejoined-pair':
        # Server A+1 killed, restarted, rejoined (late in its chains); then its
        # neighbour A is killed: A+1 leads A's ranges; A comes back late too.
        a = rng.randrange(3)
        faults = [Fault('kill', 'server', (a + 1) % 3, at_round=first),
                  Fault('kill', 'server', a, after_rejoined=(a + 1) % 3)]
    else:  # double
        faults = [simple(rng.choice(SIMPLE), first),
                  simple(rng.choice(SIMPLE), first + rng.randint(3, 40))]
    last = max(f.at_round or 0 for f in faults)
    # async: float16 values stay exact below 1024 (steps of 0.5): 300 rounds at most
    rounds = last + TAIL_ROUNDS
    assert mode == 'sync' or rounds <= 300
    t = Trial(index, seed, scenario, mode, rounds, faults)
    t.apriori = apriori(t)
    return t


def apriori(t):
    """The expected outcome from the schedule alone: 'survive' when at most one
    server may die (a stopped one may be failed over); 'fail' for a second
    server killed while the first catches up; 'timing' for two distinct
    servers that may die: survivable only if the first rejoined before the
    second was declared failed (the scheduler's timeline decides)."""
    servers = {f.rank for f in t.faults if f.role == 'server'}
    if len(servers) < 2:
        return 'survive'
    if t.scenario == 'catchup-other':
        return 'fail'
    if t.scenario == 'rejoined-pair':
        return 'survive'  # the second kill comes after the first server rejoined
    if all(f.kind == 'stopcont' and f.stop_s < HEARTBEAT_MS / 1000.0 * 0.8
           for f in t.faults if f.role == 'server'):
        return 'survive'  # short stops: nobody is failed over
    return 'timing'


# The ctest sample: one of each kind of fault, a non-survivable one included.
SAMPLE = [('kill-server', 'sync'), ('stopcont-server', 'sync'), ('catchup-same', 'sync'),
          ('catchup-other', 'sync'), ('stop-worker', 'async'), ('double', 'sync')]


def plan(args):
    if args.replay is not None:
        return [plan_trial(1, args.replay, args.replay_scenario, args.replay_mode)]
    rng = random.Random(args.seed)
    if args.sample:
        return [plan_trial(i, rng.randrange(1 << 30), s, m) for i, (s, m) in enumerate(SAMPLE, 1)]
    trials = []
    chosen = [x for x in args.scenarios.split(',') if x]
    for x in chosen:
        if x not in SCENARIOS:
            sys.exit(f'survive: unknown scenario {x}')
    for i in range(1, args.trials + 1):
        ts = rng.randrange(1 << 30)
        # An explicit subset: the scenario from the seed too (--replay needs
        # the same one: it is printed with the schedule).
        sc = None if len(chosen) == len(SCENARIOS) else random.Random(ts).choice(chosen)
        trials.append(plan_trial(i, ts, sc))
    return trials


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
                            stderr=subprocess.PIPE, preexec_fn=chaos.set_core_limit,
                            start_new_session=True)
    tracker = chaos.Tracker(proc.pid)
    tracker.start()
    out = chaos.Output(proc)
    timers = []
    forced_at = None
    try:
        inject_all(t, cwd, proc, tracker, out, timers)
        watch(t, proc, out)
    finally:
        for tm in timers:
            tm.cancel()
        forced_at = chaos.stop_job(t, proc, tracker)
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
        chaos.kill_quietly(pid, sig)
        f.at, f.pid = time.monotonic(), pid
        prev_at = f.at
        if f.kind == 'stopcont':
            def wake(pid=pid, start=start):
                if proc_start(pid) == start:  # the same process, if it is still there
                    chaos.kill_quietly(pid, signal.SIGCONT)
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


def resolve_expected(t, lines):
    """'fail' when two distinct servers were failed at once in the scheduler's
    timeline (R=1, 3 servers: any two are neighbours); else 'survive'.
    Also checks that a 'no replica left' verdict had that reason."""
    dead = set()
    verdict = None
    for ts, _, text in lines:
        m = SCHED_FAILOVER.match(text)
        if m:
            if dead - {int(m.group(2))} and verdict is None:
                t.reasons.append(f'server {m.group(2)} failed over while server(s) {sorted(dead)} '
                                 f'were failed too (R=1, 3 servers: a range has no replica '
                                 f'left): {text.strip()}')
            dead.add(int(m.group(2)))
            continue
        m = SCHED_REJOINED.match(text)
        if m:
            dead.discard(int(m.group(2)))
            continue
        if NO_REPLICA in text and verdict is None:
            verdict = (ts, text, set(dead))
    if verdict is None:
        return 'survive', None
    _, text, was_dead = verdict
    m = re.search(r'server (\d+) \(pid', text) or re.search(r'server (\d+)', text)
    victim = int(m.group(1)) if m else None
    justified = bool(was_dead - {victim})
    if not justified:
        t.reasons.append(f'"no replica left" although no other server was failed over '
                         f'(failed then: {sorted(was_dead) or "none"}): {text.strip()}')
        return 'survive', verdict
    return 'fail', verdict


def judge(t, lines, cwd, cfg, forced_at, proc):
    errs = [text for _, name, text in lines if name == 'err' and text.strip()]
    verdict_i = max((i for i, text in enumerate(errs) if 'job failed:' in text), default=None)
    t.final_line = ' | '.join(errs[verdict_i:verdict_i + 2]) if verdict_i is not None else \
        (errs[-1] if errs else '')
    # Crashes: a core file, a crash signal in the launcher's -v lines.
    crashes = [text for _, _, text in lines if chaos.CRASH_LINE.search(text)]
    crashed = {m.group(1) for text in crashes for m in [chaos.CRASHED_PID.search(text)] if m}
    cores = sorted(f for f in os.listdir(cwd) if f.startswith('core'))
    t.crashes = max(len(crashed), len(cores), 1 if crashes else 0)
    for core in cores:
        kept = os.path.join(cfg.keep_dir, f'survive-{t.index:03d}-{core}')
        shutil.move(os.path.join(cwd, core), kept)
        t.reasons.append(f'core file: {kept}')
    for text in crashes[:3]:
        t.reasons.append('crash: ' + text.strip())
    wrong = [text for _, _, text in lines if 'WRONG' in text]
    t.wrong = len(wrong)
    for text in wrong[:3]:
        t.reasons.append('lost/doubled update: ' + text.strip())
    injected = [f for f in t.faults if f.at is not None]
    if len(injected) < len(t.faults):
        t.outcome = 'not injected'
        return
    # Catch-up faults: did the kill land before the server rejoined?
    for f in t.faults:
        if f.after_registered is not None:
            f.in_catchup = not any(
                ts < f.at and SCHED_REJOINED.match(text) and
                int(SCHED_REJOINED.match(text).group(2)) == f.after_registered and
                ts > t.faults[0].at for ts, _, text in lines)
    # What the job said by itself, not once this driver stopped it (a hung
    # job's teardown may print "no replica left" as its servers go).
    own = [ln for ln in lines if forced_at is None or ln[0] < forced_at]
    t.expected, verdict = resolve_expected(t, own)
    if t.apriori == 'survive' and t.expected == 'fail':
        t.reasons.append('a schedule with one faulty server ended with "no replica left"')
    last_fault = max(f.at for f in injected)
    end = forced_at if forced_at is not None else None
    exit_ts = None
    if forced_at is None and t.exit_code is not None:
        # the launcher's exit: the last output line is a close upper bound
        exit_ts = lines[-1][0] if lines else None
    if exit_ts is not None:
        t.end_s = exit_ts - last_fault
    oks = {int(m.group(1)) for _, _, text in lines for m in [OK_LINE.match(text)] if m}
    if t.hang:
        t.outcome = 'hang'
    elif t.expected == 'survive':
        t.outcome = 'survived' if t.exit_code == 0 else 'died'
        if t.exit_code != 0:
            t.reasons.append(f'exit code {t.exit_code}, expected 0 (survivable): {t.final_line}')
        # A worker that failed by itself (not one this driver killed): the job
        # may still end 0 through a restart, but a restart was spent on it.
        for text in [x for _, _, x in lines if WORKER_ERROR.match(x)][:2]:
            t.reasons.append('a worker failed although the job survives: ' + text.strip())
        missing = sorted(set(range(3)) - oks)
        if missing:
            t.reasons.append(f'no "OK worker r" from worker(s) {missing}')
        if t.end_s is not None and t.end_s < AFTER_LAST_FAULT_S and t.exit_code == 0:
            t.reasons.append(f'the job ended {t.end_s:.1f} s after the last fault (plan: at '
                             f'least {AFTER_LAST_FAULT_S:.0f} s): make it longer')
        # Recovery: fault -> next ROUND line (and the second one).
        rounds = [ts for ts, _, text in lines if ROUND_LINE.match(text)]
        for f in injected:
            after = [ts for ts in rounds if ts > f.at]
            if after:
                f.recovery_s = after[0] - f.at
            if len(after) > 1:
                f.recovery2_s = after[1] - f.at
            if f.recovery2_s is not None and f.recovery2_s > RECOVERY_TARGET_S and \
                    not (f.kind == 'stopcont' and f.stop_s + 0.5 >= f.recovery2_s):
                t.reasons.append(f'recovery {f.recovery2_s:.2f} s after "{f.describe()}" '
                                 f'(target {RECOVERY_TARGET_S:.0f} s)')
    else:
        t.outcome = 'failed as expected' if t.exit_code not in (0, None) else 'survived'
        if t.exit_code == 0:
            t.outcome = 'survived'  # the verdict came but the job still ended 0: odd
            t.reasons.append('a "no replica left" verdict, yet exit code 0')
        elif forced_at is not None:
            t.reasons.append('the launcher had to be stopped by this driver')
        if verdict is not None:
            took = (exit_ts or verdict[0]) - max(f.at for f in injected if f.at <= verdict[0]) \
                if any(f.at <= verdict[0] for f in injected) else None
            t.end_s = took
            if took is not None and took > FAIL_LIMIT_S:
                t.reasons.append(f'the non-survivable job took {took:.1f} s to end '
                                 f'(limit {FAIL_LIMIT_S:.0f} s)')
        if 'job failed:' not in t.final_line or NO_REPLICA not in ' '.join(errs[-3:] + [t.final_line]):
            t.reasons.append(f'the final line does not say "no replica left": {t.final_line}')


# ----------------------------------------------------------------------------
# The run, the table


def summarize(trials):
    rec1 = [f.recovery_s for t in trials for f in t.faults if f.recovery_s is not None]
    rec2 = [f.recovery2_s for t in trials for f in t.faults if f.recovery2_s is not None]
    trial_rec = [max(r) for t in trials
                 for r in [[f.recovery_s for f in t.faults if f.recovery_s is not None]] if r]

    def med(v):
        return round(statistics.median(v), 3) if v else None

    s = {
        'trials': len(trials),
        'passed': sum(t.status == 'pass' for t in trials),
        'failed_trials': sum(t.status == 'fail' for t in trials),
        'apriori': {k: sum(t.apriori == k for t in trials) for k in ('survive', 'fail', 'timing')},
        'expected_survive': sum(t.expected == 'survive' for t in trials),
        'expected_fail': sum(t.expected == 'fail' for t in trials),
        'survived': sum(t.outcome == 'survived' and t.expected == 'survive' for t in trials),
        'failed_as_expected': sum(t.outcome == 'failed as expected' and t.status == 'pass'
                                  for t in trials),
        'died_unexpectedly': sum(t.outcome == 'died' for t in trials),
        'lost_or_doubled_updates': sum(t.wrong > 0 for t in trials),
        'hangs': sum(t.hang for t in trials),
        'crashes': sum(t.crashes for t in trials),
        'orphans': sum(t.orphans for t in trials),
        'not_injected': sum(t.outcome == 'not injected' for t in trials),
        'recovery_next_round_s': {'median': med(rec1), 'max': round(max(rec1), 3) if rec1 else None,
                                  'faults': len(rec1)},
        'recovery_second_round_s': {'median': med(rec2),
                                    'max': round(max(rec2), 3) if rec2 else None},
        'recovery_target_s': RECOVERY_TARGET_S,
        'catchup_faults_in_catchup': sum(f.in_catchup is True for t in trials for f in t.faults),
        'catchup_faults_after_rejoin': sum(f.in_catchup is False for t in trials
                                           for f in t.faults),
    }
    by = {}
    for t in trials:
        by.setdefault(t.scenario, []).append(t)
    s['by_scenario'] = {k: {'trials': len(v), 'passed': sum(t.status == 'pass' for t in v),
                            'expected_fail': sum(t.expected == 'fail' for t in v)}
                        for k, v in sorted(by.items())}
    return s


def table(s):
    r1, r2 = s['recovery_next_round_s'], s['recovery_second_round_s']
    fmt = lambda v: '-' if v is None else f'{v:.2f}'  # noqa: E731
    rows = [
        ('trials', s['trials']), ('passed', s['passed']), ('failed', s['failed_trials']),
        ('a priori survive / fail / timing',
         ' / '.join(str(s['apriori'][k]) for k in ('survive', 'fail', 'timing'))),
        ('expected to survive / to fail', f"{s['expected_survive']} / {s['expected_fail']}"),
        ('survived', s['survived']), ('failed as expected (no replica left)',
                                      s['failed_as_expected']),
        ('died although survivable', s['died_unexpectedly']),
        ('lost/doubled updates (WRONG)', s['lost_or_doubled_updates']),
        ('hangs', s['hangs']), ('crashes', s['crashes']), ('orphans', s['orphans']),
        ('faults not injected', s['not_injected']),
        ('catch-up kills in / after catch-up',
         f"{s['catchup_faults_in_catchup']} / {s['catchup_faults_after_rejoin']}"),
        ('recovery to next ROUND median / max (s)', f"{fmt(r1['median'])} / {fmt(r1['max'])}"),
        ('recovery to 2nd ROUND median / max (s)', f"{fmt(r2['median'])} / {fmt(r2['max'])}"),
        ('recovery target (s)', f"{s['recovery_target_s']:.0f}"),
    ]
    w = max(len(k) for k, _ in rows)
    out = [f'{k:<{w}}  {v}' for k, v in rows]
    out.append('')
    out.append(f'{"scenario":<16} {"trials":>6} {"passed":>6} {"exp.fail":>8}')
    for k, v in s['by_scenario'].items():
        out.append(f'{k:<16} {v["trials"]:>6} {v["passed"]:>6} {v["expected_fail"]:>8}')
    return '\n'.join(out)


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

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
"""

import argparse
import dataclasses
import json
import os
import random
import re
import resource
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

SIGNALS = {'KILL': signal.SIGKILL, 'STOP': signal.SIGSTOP, 'TERM': signal.SIGTERM}
# NONE: a control trial, no fault: the job must succeed, and the launcher end
# within CLEAN_END_S of its last worker (the servers leave by themselves).
CLEAN_END_S = 2.0
CRASH_SIGNALS = 'SIGSEGV|SIGABRT|SIGBUS|SIGFPE|SIGILL|SIGSYS|SIGTRAP'
CRASH_LINE = re.compile(rf'(ended|failed) with signal ({CRASH_SIGNALS})|Segmentation fault|'
                        r'terminate called|AddressSanitizer|ThreadSanitizer|runtime error:')
CRASHED_PID = re.compile(rf'\(pid (\d+)\) (ended|failed) with signal ({CRASH_SIGNALS})')
FAILURE_LINE = re.compile(r'PeerFailure|failed')
NODE_NAME = re.compile(r'\b(worker|server) (\d+)\b')
# lenet: small and quick, ~750 steps (about 10-15 s on a loaded 2-core host).
LENET_ARGS = ['--model', 'small', '--threads', '1', '--epochs', '3', '--max-batches', '250',
              '--log-every', '50', '--test-limit', '500']
PY_STEPS = '800'
# The jobs' Python: the system one, which has numpy and torch (not whichever
# python3 runs this driver).
PYTHON = '/usr/bin/python3' if os.path.exists('/usr/bin/python3') else sys.executable
CORE_LIMIT = 64 << 20  # enough to tell that a process dumped core, small enough for the disk


@dataclasses.dataclass
class Engine:
    name: str
    workers: int
    servers: int
    marker: str  # a worker prints a line matching this when it trains

    def roles(self):
        return ['worker', 'server', 'launcher'] if self.servers else ['worker', 'launcher']

    def command(self, build):
        b = os.path.join(build, 'bin')
        if self.name == 'ps':
            return [os.path.join(b, 'lenet'), '--kvstore', 'dist_sync'] + LENET_ARGS
        if self.name == 'collective':
            return [os.path.join(b, 'lenet'), '--mode', 'horovod'] + LENET_ARGS
        if self.name == 'ps-loop':
            return [os.path.join(b, 'ps_loop_worker')]
        return [PYTHON, os.path.join(HERE, 'py_worker.py'), self.name[3:], '--steps',
                PY_STEPS]


ENGINES = {
    'ps': Engine('ps', 2, 2, r'sync=dist_sync'),
    'collective': Engine('collective', 3, 0, r'sync=horovod'),
    'py-ps': Engine('py-ps', 2, 2, r'TRAINING rank'),
    'py-collective': Engine('py-collective', 3, 0, r'TRAINING rank'),
    'ps-loop': Engine('ps-loop', 2, 2, r'READY worker'),
}
DEFAULT_ENGINES = ['ps', 'collective', 'py-ps', 'py-collective']

# The ctest sample: every default engine and every signal at least once, the
# known hard cases first (a stopped collectives rank, a killed server), and
# one control trial without a fault.
SAMPLE = [
    ('collective', 'worker', 'STOP', 'training'),
    ('ps', 'server', 'KILL', 'training'),
    ('py-ps', 'worker', 'STOP', 'training'),
    ('py-collective', 'worker', 'TERM', 'training'),
    ('ps', 'worker', 'TERM', 'training'),
    ('py-ps', 'launcher', 'KILL', 'training'),
    ('collective', 'worker', 'KILL', 'startup'),
    ('ps', 'server', 'STOP', 'training'),
    ('py-ps', 'none', 'NONE', 'training'),
]


def valid(engine, role, sig, moment='training'):
    """NONE goes with the role 'none' only. A launcher that is stopped while
    a collectives job trains is no fault the job can see (the launcher is not
    on its data path): not a trial. A process stopped before it joined is the
    startup timeout's case, not the heartbeat's: not a trial either."""
    if (sig == 'NONE') != (role == 'none'):
        return False
    if sig == 'NONE':
        return moment == 'training'
    if role not in ENGINES[engine].roles():
        return False
    if role == 'launcher' and sig == 'STOP' and not ENGINES[engine].servers:
        return False
    return not (moment == 'startup' and (sig == 'STOP' or role == 'launcher'))


# ----------------------------------------------------------------------------
# /proc: the job's process tree


def proc_table():
    """{pid: (ppid, state, starttime)} of every process now."""
    table = {}
    for d in os.listdir('/proc'):
        if not d.isdigit():
            continue
        try:
            with open(f'/proc/{d}/stat') as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(')') + 2:].split()
        table[int(d)] = (int(fields[1]), fields[0], int(fields[19]))
    return table


def proc_state(pid, start):
    """'gone', 'zombie' or 'alive' for the process (pid, starttime)."""
    try:
        with open(f'/proc/{pid}/stat') as f:
            stat = f.read()
    except OSError:
        return 'gone'
    fields = stat[stat.rfind(')') + 2:].split()
    if int(fields[19]) != start:
        return 'gone'  # the pid was reused
    return 'zombie' if fields[0] in ('Z', 'X') else 'alive'


def read_role(pid):
    """(role, rank) from the process's environment, as the launcher set it."""
    try:
        with open(f'/proc/{pid}/environ', 'rb') as f:
            env = dict(kv.split(b'=', 1) for kv in f.read().split(b'\0') if b'=' in kv)
    except OSError:
        return None
    role, rank = env.get(b'PUSHPULL_ROLE'), env.get(b'PUSHPULL_RANK')
    if role is None or rank is None:
        return None  # not exec'd yet: still the launcher's environment
    return role.decode(), int(rank)


class Tracker(threading.Thread):
    """Records every descendant of the launcher (pid, starttime, role) until
    stopped, so that none can escape the end-of-trial check."""

    def __init__(self, root):
        super().__init__(daemon=True)
        self.root = root
        self.procs = {}  # pid -> {'start', 'role', 'ppid'}
        self.lock = threading.Lock()
        self.halt = threading.Event()

    def scan(self):
        table = proc_table()
        children = {}
        for pid, (ppid, _, _) in table.items():
            children.setdefault(ppid, []).append(pid)
        todo, seen = list(children.get(self.root, [])), set()
        while todo:
            pid = todo.pop()
            if pid in seen:
                continue
            seen.add(pid)
            todo.extend(children.get(pid, []))
            with self.lock:
                p = self.procs.get(pid)
                if p is None or p['start'] != table[pid][2]:
                    p = self.procs[pid] = {'start': table[pid][2], 'role': None,
                                           'ppid': table[pid][0]}
            if p['role'] is None:
                p['role'] = read_role(pid)
        now = time.monotonic()
        with self.lock:
            for pid, p in self.procs.items():
                if 'gone' not in p and (pid not in table or table[pid][2] != p['start'] or
                                        table[pid][1] in ('Z', 'X')):
                    p['gone'] = now  # exited (a zombie has exited too)

    def run(self):
        while not self.halt.is_set():
            self.scan()
            self.halt.wait(0.05)

    def find(self, role, rank):
        with self.lock:
            for pid, p in self.procs.items():
                if p['role'] == (role, rank) and p['ppid'] == self.root and \
                        proc_state(pid, p['start']) == 'alive':
                    return pid
        return None

    def last_gone(self, role):
        """When the last process of `role` exited, or None if one has not."""
        with self.lock:
            times = [p.get('gone') for p in self.procs.values() if p['role'] and
                     p['role'][0] == role]
        return max(times) if times and None not in times else None

    def alive(self, exclude=(), nodes_only=False):
        """Recorded processes still alive; nodes_only: only those the launcher
        started as a role (not its own helpers, such as a guardian process)."""
        with self.lock:
            items = list(self.procs.items())
        return [(pid, p) for pid, p in items
                if pid not in exclude and (p['role'] or not nodes_only) and
                proc_state(pid, p['start']) == 'alive']


# ----------------------------------------------------------------------------
# One trial


class Output:
    """The launcher's stdout and stderr, line by line with arrival times."""

    def __init__(self, proc):
        self.lines = []  # (time, stream, text)
        self.cond = threading.Condition()
        self.threads = [threading.Thread(target=self._read, args=(s, n), daemon=True)
                        for s, n in ((proc.stdout, 'out'), (proc.stderr, 'err'))]
        for t in self.threads:
            t.start()

    def _read(self, stream, name):
        for raw in iter(stream.readline, b''):
            with self.cond:
                text = raw.decode(errors='replace').rstrip('\n')
                self.lines.append((time.monotonic(), name, text))
                self.cond.notify_all()
        stream.close()

    def wait_for(self, predicate, deadline):
        with self.cond:
            while not predicate(self.lines):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(min(left, 0.1))
            return True

    def join(self, timeout):
        end = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.0, end - time.monotonic()))

    def snapshot(self):
        with self.cond:
            return list(self.lines)


@dataclasses.dataclass
class Trial:
    index: int
    engine: str
    role: str
    rank: int
    signal: str
    moment: str
    delay: float  # seconds after the moment (training seen / victim started)
    # results
    status: str = 'pending'  # pass, fail, skip
    reasons: list = dataclasses.field(default_factory=list)
    exit_code: int = None
    final_line: str = ''
    detect_s: float = None  # fault -> first failure line
    exit_s: float = None  # fault -> launcher exit (launcher victims: every process gone)
    orphans: int = 0
    crashes: int = 0
    log: str = ''

    def victim(self):
        if self.role in ('launcher', 'none'):
            return self.role
        return f'{self.role} {self.rank}'

    def label(self):
        if self.signal == 'NONE':
            return f'#{self.index} {self.engine} control, no fault'
        return (f'#{self.index} {self.engine} {self.victim()} SIG{self.signal} '
                f'{self.moment}+{self.delay:.1f}s')


def expected_code(t):
    if t.signal == 'NONE':
        return 0
    if t.role == 'launcher':
        return {'KILL': -9, 'TERM': 143, 'STOP': None}[t.signal]  # STOP: any failure
    return {'KILL': 137, 'TERM': 143, 'STOP': 1}[t.signal]


def set_core_limit():
    soft, hard = resource.getrlimit(resource.RLIMIT_CORE)
    limit = CORE_LIMIT if hard == resource.RLIM_INFINITY else min(CORE_LIMIT, hard)
    try:
        resource.setrlimit(resource.RLIMIT_CORE, (limit, max(hard, limit)))
    except (ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_CORE, (limit, hard))


def kill_quietly(pid, sig):
    try:
        os.kill(pid, sig)
    except OSError:
        pass


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


def training_seen(engine, proc, out, deadline):
    """Waits until every worker printed the engine's training line."""
    marker = re.compile(engine.marker)

    def training(lines):
        ranks = {m.group(1) for _, _, text in lines if marker.search(text)
                 for m in [re.match(r'\[worker (\d+)\]', text)] if m}
        return len(ranks) == engine.workers or proc.poll() is not None

    return out.wait_for(training, deadline) and proc.poll() is None


def judge_clean(t, engine, proc, tracker, out, started):
    """The control trial: no fault; the job succeeds and ends promptly."""
    if not training_seen(engine, proc, out, started + 120):
        t.reasons.append('the job did not start training (exit code %s)' % proc.poll())
        return
    try:
        proc.wait(timeout=max(1.0, started + 240 - time.monotonic()))
    except subprocess.TimeoutExpired:
        t.reasons.append('the job did not end within 240 s')
        return
    ended = time.monotonic()
    tracker.scan()
    last = tracker.last_gone('worker')
    if proc.returncode != 0:
        t.reasons.append(f'exit code {proc.returncode}, expected 0 (no fault)')
    if last is not None:
        t.exit_s = max(0.0, ended - last)
        if t.exit_s > CLEAN_END_S + 1.0:  # 1 s for this driver's sampling under load
            t.reasons.append(f'the launcher ended {t.exit_s:.1f} s after the last worker exited '
                             f'(servers should stop within {CLEAN_END_S:.0f} s)')


def inject(t, engine, proc, tracker, out, started):
    """Waits for the moment, signals the victim; returns the fault's time, or
    None when the trial could not inject it (reasons/status set)."""
    deadline = started + 120
    if t.moment == 'training':
        if not training_seen(engine, proc, out, deadline):
            t.reasons.append('the job did not start training (exit code %s)' % proc.poll())
            return None
        moment = time.monotonic()
    else:
        while time.monotonic() < deadline and proc.poll() is None:
            if t.role == 'launcher' or tracker.find(t.role, t.rank):
                break
            time.sleep(0.01)
        moment = time.monotonic()
    while time.monotonic() < moment + t.delay:
        if proc.poll() is not None:
            t.status = 'skip'
            t.reasons.append(f'the job ended (exit code {proc.poll()}) before the fault: '
                             'make the job longer or the delay shorter')
            return None
        time.sleep(0.01)
    pid = proc.pid if t.role == 'launcher' else tracker.find(t.role, t.rank)
    if pid is None or proc.poll() is not None:
        t.reasons.append(f'{t.victim()} was not found running at the moment of the fault')
        return None
    os.kill(pid, SIGNALS[t.signal])
    return time.monotonic()


def wait_gone(tracker, until, exclude=(), nodes_only=False):
    """Waits until no recorded process but `exclude` is alive; the time then or None."""
    while time.monotonic() < until:
        tracker.scan()
        if not tracker.alive(exclude, nodes_only):
            return time.monotonic()
        time.sleep(0.05)
    return None


def judge_exit(t, proc, tracker, out, fault_at, limit):
    grace_for_lateness = 10.0  # how long past the limit a late exit is still measured
    if t.role == 'launcher' and t.signal == 'KILL':
        proc.wait()
        gone = wait_gone(tracker, fault_at + limit + grace_for_lateness)
        if gone is None:
            t.reasons.append(f'processes of the job still alive {limit + grace_for_lateness:.0f} s '
                             'after the launcher was killed')
        else:
            t.exit_s = gone - fault_at
        return
    if t.role == 'launcher' and t.signal == 'STOP':
        # The nodes must notice the silent scheduler by themselves (the
        # launcher's own helper processes are stopped with it, or wait for it).
        gone = wait_gone(tracker, fault_at + limit + grace_for_lateness, exclude=(proc.pid,),
                         nodes_only=True)
        if gone is None:
            t.reasons.append('the nodes did not stop while the launcher (scheduler) was stopped')
        else:
            t.exit_s = gone - fault_at
        kill_quietly(proc.pid, signal.SIGCONT)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            t.reasons.append('the launcher did not exit within 10 s of SIGCONT')
        return
    try:
        proc.wait(timeout=max(0.0, fault_at + limit + grace_for_lateness - time.monotonic()))
        t.exit_s = time.monotonic() - fault_at
    except subprocess.TimeoutExpired:
        t.reasons.append(f'the launcher did not exit within {limit + grace_for_lateness:.0f} s of '
                         'the fault (hang)')


def stop_job(t, proc, tracker):
    """Ends whatever is left (a hung launcher, orphans), by pid, and counts
    orphans: processes of the job alive once the launcher is gone. Returns
    when it had to stop the launcher itself, or None."""
    forced_at = None
    if proc.poll() is None:
        forced_at = time.monotonic()
        kill_quietly(proc.pid, signal.SIGCONT)
        kill_quietly(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=8)
        except subprocess.TimeoutExpired:
            kill_quietly(proc.pid, signal.SIGKILL)
            proc.wait()
    t.exit_code = proc.returncode
    # The launcher's children die with it (or are stopped by it); give their
    # exits a moment to show in /proc.
    wait_gone(tracker, time.monotonic() + 2.0)
    tracker.halt.set()
    tracker.join()
    left = tracker.alive()
    for pid, p in left:
        kill_quietly(pid, signal.SIGKILL)
        kill_quietly(pid, signal.SIGCONT)
    if left:
        t.orphans = len(left)
        t.reasons.append('orphans: ' + ', '.join(
            f'{p["role"][0]} {p["role"][1]} (pid {pid})' if p['role'] else f'pid {pid}'
            for pid, p in left))
    return forced_at


def check_output(t, lines, fault_at, forced_at, cwd, keep_dir, limit):
    errs = [text for _, name, text in lines if name == 'err' and text.strip()]
    # The launcher's verdict: its last "job failed:" line, which only
    # indented continuation lines ("  consequences: ...") may follow.
    verdict = max((i for i, text in enumerate(errs) if 'job failed:' in text), default=None)
    final_ok = verdict is not None and all(text[:1].isspace() for text in errs[verdict + 1:])
    t.final_line = ' | '.join(errs[verdict:]) if final_ok else (errs[-1] if errs else '')
    crashes = [text for _, _, text in lines if CRASH_LINE.search(text)]
    crashed_pids = {m.group(1) for text in crashes for m in [CRASHED_PID.search(text)] if m}
    cores = sorted(f for f in os.listdir(cwd) if f.startswith('core'))
    # One crash shows as a core file and a launcher line or two: count processes.
    t.crashes = max(len(crashed_pids), len(cores), 1 if crashes else 0)
    for core in cores:  # kept for a backtrace: gdb <program> <core>
        kept = os.path.join(keep_dir, f'trial-{t.index:03d}-{core}')
        shutil.move(os.path.join(cwd, core), kept)
        t.reasons.append(f'core file: {kept}')
    for text in crashes[:3]:
        t.reasons.append('crash: ' + text.strip())
    if fault_at is None:
        return
    # What the job said by itself: not what it said once this driver stopped it.
    after = [(ts, text) for ts, _, text in lines
             if ts >= fault_at and (forced_at is None or ts < forced_at)]
    failure = next((ts for ts, text in after if FAILURE_LINE.search(text)), None)
    if failure is not None:
        t.detect_s = failure - fault_at
    if t.role == 'launcher' and t.signal == 'STOP':
        # A stopped launcher relays no output: the nodes' exits are the detection.
        t.detect_s = t.exit_s
    if t.exit_s is not None and t.exit_s > limit:
        t.reasons.append(f'took {t.exit_s:.1f} s from the fault to the end, limit {limit:.0f} s')
    if t.role == 'launcher' and t.signal == 'KILL':
        return  # nothing to read: the launcher is gone; no process may be left (checked)
    want = expected_code(t)
    if want is None:
        if t.exit_code in (0, None):
            t.reasons.append(f'exit code {t.exit_code}, expected a failure')
    elif t.exit_code != want:
        t.reasons.append(f'exit code {t.exit_code}, expected {want}')
    if t.role == 'launcher' and t.signal == 'STOP' and \
            not any('scheduler' in text for _, text in after):
        t.reasons.append('no node said it lost the scheduler')
    if not final_ok:
        t.reasons.append('the last line is not "job failed: ..."')
    elif t.role == 'launcher':
        if t.signal == 'TERM' and 'SIGTERM' not in t.final_line:
            t.reasons.append('the last line does not say the launcher got SIGTERM')
    else:
        blamed = [f'{m.group(1)} {m.group(2)}' for m in
                  NODE_NAME.finditer(errs[verdict].split('job failed:', 1)[1])]
        if t.victim() not in blamed:
            t.reasons.append(f'the last line does not name {t.victim()}')
        elif blamed[0] != t.victim():
            t.reasons.append(f'the last line blames {blamed[0]} before {t.victim()}')


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

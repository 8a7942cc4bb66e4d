"""The plan of the survival trials (survive.py, docs/reliability.md): the
job's timings, the fault scenarios and how often each is drawn, the Fault
and Trial records, a trial planned from its seed, what a plan alone says
of a trial, and the ctest sample.
"""

import dataclasses
import random
import sys

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



"""What a chaos trial is (chaos.py, docs/reliability.md): the engines (which
job, how many workers and servers, the line that says it trains), the ctest
sample, which (engine, victim, signal, moment) combinations are trials, and
the Trial record with its results.
"""

import dataclasses
import os
import signal
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

SIGNALS = {'KILL': signal.SIGKILL, 'STOP': signal.SIGSTOP, 'TERM': signal.SIGTERM}
# lenet: small and quick, ~750 steps (about 10-15 s on a loaded 2-core host).
LENET_ARGS = ['--model', 'small', '--threads', '1', '--epochs', '3', '--max-batches', '250',
              '--log-every', '50', '--test-limit', '500']
PY_STEPS = '800'
# The jobs' Python: the system one, which has numpy and torch (not whichever
# python3 runs this driver).
PYTHON = '/usr/bin/python3' if os.path.exists('/usr/bin/python3') else sys.executable


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

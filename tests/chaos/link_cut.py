#!/usr/bin/python3
"""Link cut: a two-host job loses its network in the middle of training.

Two network namespaces ("hosts" A = 10.231.0.1 and B = 10.231.0.2) joined by
a veth pair. Each scenario starts a job's processes directly in them (`ip
netns exec`, with the DMLC_* / RANK / MASTER_* variables of docs/launch.md and
one PUSHPULL_JOB_SECRET), waits until every worker trains, then takes A's end
of the link down. Nothing closes: no FIN, no RST, packets just vanish; only
heartbeats can tell. Checked, per process: it exits non-zero within the
heartbeat timeout + 5 s of the cut, and its output names a peer on the other
side (side A names B's process, side B names one of A's).

  ps          A: scheduler, server 0, worker 0      B: worker 1
  collective  A: rank 0 (rendezvous host)           B: rank 1

and one cut between two hosts that both still reach the scheduler's (no
heartbeat is lost: only the nodes' own connections can tell, by the dead-link
timeout that cluster nodes set on them, docs/reliability.md):

  pair        A: scheduler, worker 0   B: server 0   C: worker 1; B and C
              lose each other (frames to a MAC nobody has), both keep A

The hosts hang off one bridge (a hub namespace), a veth each.

The namespaces, the veth pair and every process are removed in all cases (and
namespaces left by an earlier run that was killed are removed on start).
Needs root and iproute2; otherwise it prints SKIP and exits 77 (ctest's
SKIP_RETURN_CODE).

    python3 tests/chaos/link_cut.py [--build-dir build] [--scenarios ps,collective,pair]
"""

import argparse
import ctypes
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
SKIP = 77
PREFIX = 'ppcut'
ADDR = {'a': '10.231.0.1', 'b': '10.231.0.2', 'c': '10.231.0.3'}
HOSTS = 'abc'
LENET_ARGS = ['--model', 'small', '--threads', '1', '--epochs', '3', '--max-batches', '300',
              '--log-every', '50', '--test-limit', '500']


def sh(*cmd, check=True):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f'`{" ".join(cmd)}` failed: {r.stderr.strip()}')
    return r


class Hosts:
    """Three namespaces on one bridge (in a hub namespace), a veth each;
    removed by close() (and, if this process died before, by the next run's
    sweep)."""

    def __init__(self):
        me = os.getpid()
        self.ns = {h: f'{PREFIX}{me}{h}' for h in HOSTS + 'x'}  # x: the hub
        self.dev = {h: f'pc{me}{h}' for h in HOSTS}
        self.made = []
        self.cuts = []

    @staticmethod
    def sweep_stale():
        r = sh('ip', 'netns', 'list', check=False)
        for line in r.stdout.splitlines():
            m = re.match(rf'({PREFIX}(\d+)[{HOSTS}x])\b', line)
            if m and not os.path.exists(f'/proc/{m.group(2)}'):
                sh('ip', 'netns', 'del', m.group(1), check=False)

    def open(self):
        for h in self.ns:
            sh('ip', 'netns', 'add', self.ns[h])
            self.made.append(self.ns[h])
        hub = self.ns['x']
        sh('ip', '-n', hub, 'link', 'add', 'br0', 'type', 'bridge')
        sh('ip', '-n', hub, 'link', 'set', 'br0', 'up')
        for h in HOSTS:
            sh('ip', 'link', 'add', self.dev[h], 'netns', self.ns[h], 'type', 'veth',
               'peer', 'name', self.dev[h] + 'x', 'netns', hub)
            sh('ip', '-n', hub, 'link', 'set', self.dev[h] + 'x', 'master', 'br0')
            sh('ip', '-n', hub, 'link', 'set', self.dev[h] + 'x', 'up')
            sh('ip', '-n', self.ns[h], 'addr', 'add', ADDR[h] + '/24', 'dev', self.dev[h])
            sh('ip', '-n', self.ns[h], 'link', 'set', 'lo', 'up')
            sh('ip', '-n', self.ns[h], 'link', 'set', self.dev[h], 'up')
        self.wait_up()

    def wait_up(self):
        """Every host reports carrier before a job relies on the links."""
        deadline = time.monotonic() + 10
        while not all('state UP' in sh('ip', '-n', self.ns[h], '-o', 'link', 'show', 'dev',
                                       self.dev[h]).stdout for h in HOSTS):
            if time.monotonic() > deadline:
                raise RuntimeError('the veth links of the namespaces do not come up')
            time.sleep(0.05)

    def cut(self):
        """Host A loses the network."""
        sh('ip', '-n', self.ns['a'], 'link', 'set', self.dev['a'], 'down')

    def cut_pair(self, x, y):
        """x and y silently lose each other while both keep every other host:
        each sends the other's frames to a MAC address nobody has (a
        permanent neighbour entry), so they vanish on the bridge; no local
        error, no FIN, no RST (a blackhole route would fail the sender's
        socket at once with EINVAL)."""
        for h, other in ((x, y), (y, x)):
            sh('ip', '-n', self.ns[h], 'neigh', 'replace', ADDR[other], 'lladdr',
               '02:00:00:00:00:99', 'dev', self.dev[h], 'nud', 'permanent')
            self.cuts.append((h, other))

    def restore(self):
        for h, other in self.cuts:
            sh('ip', '-n', self.ns[h], 'neigh', 'del', ADDR[other], 'dev', self.dev[h],
               check=False)
        self.cuts = []
        for h in HOSTS:
            sh('ip', '-n', self.ns[h], 'link', 'set', self.dev[h], 'up')
        self.wait_up()

    def close(self):
        for ns in self.made:  # deleting a namespace deletes its veth ends (and the pairs)
            sh('ip', 'netns', 'del', ns, check=False)
        self.made = []


def die_with_parent():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: nothing outlives a killed test
    os.setpgid(0, 0)


class Proc:
    """One process of the job in a namespace; output collected with times."""

    def __init__(self, name, side, ns, argv, env):
        self.name, self.side = name, side
        self.lines = []
        self.lock = threading.Lock()
        self.p = subprocess.Popen(['ip', 'netns', 'exec', ns] + argv, env=env,
                                  stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, preexec_fn=die_with_parent)
        self.exited_at = None
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for raw in iter(self.p.stdout.readline, b''):
            with self.lock:
                self.lines.append((time.monotonic(), raw.decode(errors='replace').rstrip('\n')))
        self.p.stdout.close()

    def poll(self):
        rc = self.p.poll()
        if rc is not None and self.exited_at is None:
            self.exited_at = time.monotonic()
        return rc

    def text(self, since=0.0):
        with self.lock:
            return [line for t, line in self.lines if t >= since]

    def kill(self):
        if self.p.poll() is None:
            try:
                os.killpg(self.p.pid, signal.SIGKILL)
            except OSError:
                pass
        self.p.wait()
        self.reader.join(5)


def base_env(args, job):
    env = dict(os.environ)
    for k in list(env):
        if k.startswith(('DMLC_', 'PUSHPULL_')) or k in ('RANK', 'WORLD_SIZE', 'MASTER_ADDR',
                                                          'MASTER_PORT', 'LOCAL_RANK'):
            del env[k]
    env.update({'PUSHPULL_HEARTBEAT_TIMEOUT_MS': str(args.heartbeat_ms),
                'PUSHPULL_JOB_SECRET': os.urandom(16).hex(), 'PUSHPULL_JOB_ID': job})
    return env


def ps_job(args, hosts, job, placement):
    """A PS job: 1 server, 2 workers, `placement` = {node name: host}."""
    bin_dir = os.path.join(args.build_dir, 'bin')
    env = base_env(args, f'linkcut-{job}-{os.getpid()}')
    env.update({'DMLC_PS_ROOT_URI': ADDR[placement['scheduler']], 'DMLC_PS_ROOT_PORT': '9300',
                'DMLC_NUM_SERVER': '1', 'DMLC_NUM_WORKER': '2'})
    lenet = os.path.join(bin_dir, 'lenet')
    worker = [lenet, '--kvstore', 'dist_sync'] + LENET_ARGS if os.path.exists(lenet) else \
        [os.path.join(bin_dir, 'ps_loop_worker')]
    marker = r'sync=dist_sync' if os.path.exists(lenet) else r'READY worker'

    def node(name):
        role, _, rank = name.partition(' ')
        rank = int(rank or 0)
        side = placement[name]
        e = dict(env, DMLC_ROLE=role, PUSHPULL_RANK=str(rank), DMLC_NODE_HOST=ADDR[side])
        if role == 'worker':
            e.update(RANK=str(rank), WORLD_SIZE='2')
        argv = [os.path.join(bin_dir, 'pushpull'), role] if role != 'worker' else worker
        return Proc(name, side, hosts.ns[side], argv, e)

    return [node(n) for n in placement], marker


def ps_scenario(args, hosts):
    """A: scheduler, server 0, worker 0; B: worker 1."""
    procs, marker = ps_job(args, hosts, 'ps', {'scheduler': 'a', 'server 0': 'a', 'worker 0': 'a',
                                               'worker 1': 'b'})
    # Who must be named: A's processes lost worker 1; B's worker lost A.
    expect = {'a': [r'\bworker 1\b'], 'b': [r'\bscheduler\b', r'\bserver 0\b', r'\bworker 0\b']}
    return procs, marker, expect, hosts.cut


def pair_scenario(args, hosts):
    """A: scheduler, worker 0; B: server 0; C: worker 1. B and C lose each other."""
    procs, marker = ps_job(args, hosts, 'pair', {'scheduler': 'a', 'worker 0': 'a',
                                                 'server 0': 'b', 'worker 1': 'c'})
    # B and C each name the other; A's processes hear of whichever failed.
    expect = {'a': [r'\bserver 0\b', r'\bworker 1\b'], 'b': [r'\bworker 1\b'],
              'c': [r'\bserver 0\b']}
    return procs, marker, expect, lambda: hosts.cut_pair('b', 'c')


def collective_scenario(args, hosts):
    """A: rank 0 (the rendezvous host); B: rank 1."""
    lenet = os.path.join(args.build_dir, 'bin', 'lenet')
    if not os.path.exists(lenet):
        return None
    env = base_env(args, f'linkcut-coll-{os.getpid()}')
    env.update({'MASTER_ADDR': ADDR['a'], 'MASTER_PORT': '9400', 'WORLD_SIZE': '2'})
    procs = []
    for rank, side in ((0, 'a'), (1, 'b')):
        e = dict(env, RANK=str(rank), LOCAL_RANK='0', PUSHPULL_NODE_HOST=ADDR[side])
        procs.append(Proc(f'worker {rank}', side, hosts.ns[side],
                          [lenet, '--mode', 'horovod'] + LENET_ARGS, e))
    expect = {'a': [r'\bworker 1\b', r'\brank 1\b'], 'b': [r'\bworker 0\b', r'\brank 0\b']}
    return procs, r'sync=horovod', expect, hosts.cut


def run_scenario(name, args, hosts):
    """Returns a list of failure reasons (empty: passed)."""
    made = {'ps': ps_scenario, 'collective': collective_scenario,
            'pair': pair_scenario}[name](args, hosts)
    if made is None:
        print(f'link_cut {name}: SKIP (examples/lenet not built)', flush=True)
        return []
    procs, marker, expect, cut = made
    # A whole host's cut stops heartbeats: heartbeat timeout. A pair's cut
    # leaves them: the dead-link timeout (the heartbeat timeout) of the idle
    # side's keepalive, then the wait for the scheduler's verdict.
    hb = args.heartbeat_ms / 1000.0
    limit = hb + 5.0 if name != 'pair' else 3 * hb + 5.0
    reasons = []
    try:
        workers = [p for p in procs if p.name.startswith('worker')]
        deadline = time.monotonic() + 90
        while not all(any(re.search(marker, line) for line in p.text()) for p in workers):
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                return [f'{name}: the job did not start training'] + dump(procs)
            time.sleep(0.05)
        time.sleep(args.delay)
        if any(p.poll() is not None for p in procs):
            return [f'{name}: the job ended before the cut: make it longer'] + dump(procs)
        cut_at = time.monotonic()
        cut()
        print(f'link_cut {name}: link down {args.delay:.1f} s into training', flush=True)
        while time.monotonic() < cut_at + limit + 10 and any(p.poll() is None for p in procs):
            time.sleep(0.05)
        for p in procs:
            rc = p.poll()
            said = '\n'.join(p.text(cut_at))
            names_peer = any(re.search(rx, said) for rx in expect[p.side])
            took = None if p.exited_at is None else p.exited_at - cut_at
            status = 'ok'
            if rc is None:
                status = 'FAIL'
                reasons.append(f'{name}: {p.name} (host {p.side.upper()}) still running '
                               f'{limit + 10:.0f} s after the cut')
            elif rc == 0:
                status = 'FAIL'
                reasons.append(f'{name}: {p.name} exited 0 after losing its peers')
            elif took > limit:
                status = 'FAIL'
                reasons.append(f'{name}: {p.name} took {took:.1f} s to stop (limit {limit:.0f} s)')
            if rc is not None and not names_peer:
                status = 'FAIL'
                reasons.append(f'{name}: {p.name} (host {p.side.upper()}) does not name a peer '
                               f'of the other host ({" or ".join(expect[p.side])})')
            failure = next((line for line in p.text(cut_at)
                            if re.search(r'PeerFailure|failed|error', line)), '')
            after = '-' if took is None else f'{took:.2f} s'
            print(f'  {status:<4} {p.name:<10} host {p.side.upper()} exit {rc} after {after}: '
                  f'{failure.strip()[:160]}', flush=True)
    finally:
        for p in procs:
            p.kill()
    if reasons:
        reasons += dump(procs)
    return reasons


def dump(procs):
    out = []
    for p in procs:
        out.append(f'--- {p.name} (host {p.side.upper()}) output, last 15 lines:')
        out += ['    ' + line for line in p.text()[-15:]]
    return out


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--build-dir', default=os.path.join(REPO, 'build'))
    p.add_argument('--scenarios', default='ps,collective,pair')
    p.add_argument('--heartbeat-ms', type=int, default=2000)
    p.add_argument('--delay', type=float, default=2.0, help='seconds of training before the cut')
    args = p.parse_args(argv)
    args.build_dir = os.path.abspath(args.build_dir)
    if os.geteuid() != 0:
        print('SKIP: link_cut needs root (network namespaces)', flush=True)
        return SKIP
    if shutil.which('ip') is None:
        print('SKIP: link_cut needs iproute2 (`ip`)', flush=True)
        return SKIP
    if not os.path.exists(os.path.join(args.build_dir, 'bin', 'pushpull')):
        print(f'link_cut: {args.build_dir}/bin/pushpull not found: build first', file=sys.stderr)
        return 2
    # A SIGTERM (ctest's timeout, Ctrl-C) still runs the clean-up below.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    Hosts.sweep_stale()
    hosts = Hosts()
    reasons = []
    try:
        try:
            hosts.open()
        except RuntimeError as e:
            if not hosts.made:
                print(f'SKIP: network namespaces are not available here: {e}', flush=True)
                return SKIP
            raise
        for name in args.scenarios.split(','):
            reasons += run_scenario(name, args, hosts)
            # The next scenario needs the links back (fresh ports: new processes).
            hosts.restore()
    finally:
        hosts.close()
    if reasons:
        print('link_cut: FAILED', *reasons, sep='\n', flush=True)
        return 1
    print('link_cut: passed', flush=True)
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))

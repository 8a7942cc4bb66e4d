"""Network-namespace "hosts" for the launcher's cluster tests.

A hub namespace holds a bridge; each host is a namespace joined to it by a
veth pair (its end named as the test asks: eth0, ens5, ...) with a 10.x
address. Names resolve through a hosts file per namespace,
/etc/netns/<ns>/hosts, which `ip netns exec` binds over /etc/hosts (and
`run_in(..., keep_sys=True)` binds itself). Everything is made and removed by
the test: processes it started are killed by PID (their process groups), the
namespaces deleted, the hosts files removed, also when the test fails or is
signalled.
"""

import os
import shutil
import signal
import subprocess
import sys
import time

SKIP = 77


def need_root_and_netns(what):
    """Exits 77 (ctest's skip) saying why, unless root with `ip netns`."""
    if os.geteuid() != 0:
        print(f'skipped: {what} needs root (network namespaces)')
        sys.exit(SKIP)
    if shutil.which('ip') is None or shutil.which('nsenter') is None:
        print(f'skipped: {what} needs iproute2 and util-linux (ip, nsenter)')
        sys.exit(SKIP)
    probe = f'pppr{os.getpid() % 100000}'
    r = subprocess.run(['ip', 'netns', 'add', probe], capture_output=True, text=True)
    if r.returncode != 0:
        print(f'skipped: {what}: `ip netns add` is not permitted here: {r.stderr.strip()}')
        sys.exit(SKIP)
    subprocess.run(['ip', 'netns', 'del', probe], capture_output=True)


def need_programs(bin_dir, names, what):
    """Exits 77 unless every program is built (examples may be turned off)."""
    missing = [n for n in names if not os.access(os.path.join(bin_dir, n), os.X_OK)]
    if missing:
        print(f'skipped: {what} runs {", ".join(missing)}, not built in {bin_dir} '
              '(PUSHPULL_BUILD_EXAMPLES=ON builds kvstore_basics)')
        sys.exit(SKIP)


def sh(*args, check=True):
    r = subprocess.run(list(args), capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f'{" ".join(args)}: {r.stderr.strip()}')
    return r


class Cluster:
    """hosts: [(name, interface)], e.g. [('n1', 'eth0'), ('n2', 'ens5')].
    aliases: {alias: host name} (extra names in every hosts file, e.g. a
    headless service's DNS name). The hub gets .1 and the name `hub_name`.
    decoys: {host name: 'addr/32'}: an extra interface made first in that
    host, up but connected to nothing."""

    def __init__(self, tag, hosts, aliases=None, hub_name='hub', decoys=None):
        pid = os.getpid()
        self.prefix = f'pp{tag}{pid % 100000}'
        self.subnet = f'10.{200 + pid % 50}.{(pid // 50) % 250}'
        self.hub = self.prefix + 'h'
        self.hosts = {}   # name -> (namespace, address)
        self.procs = []   # Popen objects started in the hosts
        self.namespaces = []
        self.hub_name = hub_name
        self._up(hosts, aliases or {}, decoys or {})

    def _up(self, hosts, aliases, decoys):
        self._add_ns(self.hub)
        sh('ip', '-n', self.hub, 'link', 'add', 'br0', 'type', 'bridge')
        sh('ip', '-n', self.hub, 'addr', 'add', f'{self.subnet}.1/24', 'dev', 'br0')
        sh('ip', '-n', self.hub, 'link', 'set', 'br0', 'up')
        sh('ip', '-n', self.hub, 'link', 'set', 'lo', 'up')
        for i, (name, iface) in enumerate(hosts):
            ns = f'{self.prefix}{i}'
            self._add_ns(ns)
            if name in decoys:
                # An interface that is up, listed before the real one, and
                # leads nowhere: "the first address" would pick it.
                sh('ip', '-n', ns, 'link', 'add', 'decoy0', 'type', 'veth', 'peer', 'name',
                   'decoy1')
                sh('ip', '-n', ns, 'addr', 'add', decoys[name], 'dev', 'decoy0')
                sh('ip', '-n', ns, 'link', 'set', 'decoy0', 'up')
            addr = f'{self.subnet}.{i + 2}'
            sh('ip', '-n', self.hub, 'link', 'add', f'v{i}', 'type', 'veth', 'peer', 'name', iface,
               'netns', ns)
            sh('ip', '-n', self.hub, 'link', 'set', f'v{i}', 'master', 'br0')
            sh('ip', '-n', self.hub, 'link', 'set', f'v{i}', 'up')
            sh('ip', '-n', ns, 'addr', 'add', f'{addr}/24', 'dev', iface)
            sh('ip', '-n', ns, 'link', 'set', iface, 'up')
            sh('ip', '-n', ns, 'link', 'set', 'lo', 'up')
            self.hosts[name] = (ns, addr)
        lines = ['127.0.0.1 localhost', f'{self.subnet}.1 {self.hub_name}']
        lines += [f'{addr} {name}' for name, (_, addr) in self.hosts.items()]
        lines += [f'{self.hosts[target][1]} {alias}' for alias, target in aliases.items()]
        for ns in self.namespaces:
            os.makedirs(f'/etc/netns/{ns}', exist_ok=True)
            with open(f'/etc/netns/{ns}/hosts', 'w') as f:
                f.write('\n'.join(lines) + '\n')

    def _add_ns(self, ns):
        sh('ip', 'netns', 'add', ns)
        self.namespaces.append(ns)

    def ns(self, name):
        return self.hub if name == self.hub_name else self.hosts[name][0]

    def addr(self, name):
        return f'{self.subnet}.1' if name == self.hub_name else self.hosts[name][1]

    def wrap(self, name, hostname=None, keep_sys=False):
        """The argv prefix that runs a command in host `name`: `ip netns exec`
        (its own /sys, /etc/hosts from /etc/netns), or with keep_sys the
        network namespace only (the host's /sys, cgroups included: slurmd needs
        them) in a private mount namespace with the hosts file bound.
        `hostname`: a UTS namespace with that host name."""
        ns = self.ns(name)
        if not keep_sys:
            pre = ['ip', 'netns', 'exec', ns]
            if hostname:
                pre += ['unshare', '-u', 'sh', '-c', f'hostname {hostname} && exec "$@"', 'sh']
            return pre
        setup = f'mount --bind /etc/netns/{ns}/hosts /etc/hosts'
        if hostname:
            setup += f' && hostname {hostname}'
        return ['nsenter', f'--net=/run/netns/{ns}', 'unshare', '-m', '-u', '--propagation',
                'private', 'sh', '-c', setup + ' && exec "$@"', 'sh']

    def start(self, name, argv, log, env=None, hostname=None, keep_sys=False):
        """Starts argv in host `name` in a process group of its own; killed by
        close() (the group, by PID)."""
        out = open(log, 'ab')
        p = subprocess.Popen(self.wrap(name, hostname, keep_sys) + list(argv), stdout=out,
                             stderr=subprocess.STDOUT, env=env, start_new_session=True)
        out.close()
        self.procs.append(p)
        return p

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 5
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait(timeout=5)
        for ns in reversed(self.namespaces):
            subprocess.run(['ip', 'netns', 'del', ns], capture_output=True)
            shutil.rmtree(f'/etc/netns/{ns}', ignore_errors=True)
        self.namespaces = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def cleanup_on_signals(cleanup):
    """SIGTERM/SIGINT/SIGHUP (ctest's timeout, Ctrl-C) run `cleanup` first."""
    def handler(signum, _frame):
        cleanup()
        sys.exit(128 + signum)
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, handler)


def processes():
    """{pid: (cmdline words, environ dict)} of every process readable now."""
    out = {}
    for d in os.listdir('/proc'):
        if not d.isdigit():
            continue
        try:
            with open(f'/proc/{d}/cmdline', 'rb') as f:
                cmd = [w.decode(errors='replace') for w in f.read().split(b'\0') if w]
            with open(f'/proc/{d}/environ', 'rb') as f:
                env = dict(kv.decode(errors='replace').split('=', 1)
                           for kv in f.read().split(b'\0') if b'=' in kv)
        except OSError:
            continue
        out[int(d)] = (cmd, env)
    return out


def alive(pid):
    try:
        with open(f'/proc/{pid}/stat') as f:
            return f.read().rsplit(')', 1)[1].split()[0] != 'Z'
    except OSError:
        return False

#!/usr/bin/python3
"""pushpull jobs on a real Slurm cluster of network-namespace hosts.

    slurm_cluster_test.py BIN_DIR SOURCE_DIR

Brings up munged, slurmctld (on the hub, host name `ctl`) and two slurmd
(hosts n1 and n2, each in its own network namespace: distinct addresses and
names, so no --enable-multiple-slurmd build is needed), then submits the
sbatch scripts users copy (examples/slurm/, quoted in docs/launch.md):
  - pushpull-launch.sbatch: one `pushpull launch --launcher slurm` for the
    job, a parameter-server job and a collectives job;
  - pushpull-per-node.sbatch: `srun pushpull launch --nproc-per-node` on each
    node (Slurm's variables give the nodes, the node index, node 0), a
    collectives job and a parameter-server job;
and checks every job's result and ranks, that the nodes of a job ran on both
hosts, that no process of any job ever had the job secret on its command
line (every /proc/*/cmdline, polled while the jobs run), and that `scancel`
of a running job (both kinds) leaves none of its processes behind.

The daemons run with proctrack/pgid and task/none: no cgroups are needed,
and scancel signals only each step's process group, the harder case for a
launcher whose children run in process groups of their own (with
proctrack/cgroup, as on most clusters, Slurm kills the whole cgroup anyway).
slurmd runs in its host's network namespace only (nsenter), not under `ip
netns exec`, whose fresh /sys hides the cgroup mounts slurmd 22.05 checks.

Needs root, network namespaces and Debian's slurmctld, slurmd, slurm-client
and munge (scripts/deps.sh); skips (exit 77) saying why otherwise. Daemons
are stopped by PID, namespaces and files removed, also on failure.
"""

import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import netns_hosts  # noqa: E402

BIN, SRC = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
NEEDED = ['munged', 'slurmctld', 'slurmd', 'sbatch', 'srun', 'scancel', 'squeue', 'sinfo']


def skip_unless_ready():
    missing = [b for b in NEEDED if shutil.which(b) is None and
               not os.path.exists(f'/usr/sbin/{b}')]
    if missing:
        print(f'skipped: Slurm is not installed (missing {", ".join(missing)}; '
              'apt-get install slurmctld slurmd slurm-client munge, scripts/deps.sh)')
        sys.exit(netns_hosts.SKIP)
    netns_hosts.need_root_and_netns('the Slurm cluster test')
    netns_hosts.need_programs(BIN, ['pushpull', 'kvstore_basics'], 'the Slurm cluster test')


SLURM_CONF = """ClusterName=pptest
SlurmctldHost=ctl({ctl})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={d}/munge.sock
CredType=cred/munge
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.%n.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd.%n.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
ReturnToService=2
SlurmdParameters=config_overrides
SlurmctldTimeout=10
SlurmdTimeout=10
InactiveLimit=0
KillWait=2
MinJobAge=300
NodeName=n1 NodeAddr={n1} CPUs=8 RealMemory=1000 State=UNKNOWN
NodeName=n2 NodeAddr={n2} CPUs=8 RealMemory=1000 State=UNKNOWN
PartitionName=pp Nodes=n1,n2 Default=YES MaxTime=60 State=UP OverSubscribe=YES
"""


class Slurm:
    def __init__(self, cluster, d):
        self.c, self.d = cluster, d
        self.env = dict(os.environ, SLURM_CONF=f'{d}/slurm.conf')
        for k in list(self.env):
            if k.startswith('SLURM_') and k != 'SLURM_CONF' or k.startswith('PUSHPULL_'):
                del self.env[k]

    def up(self):
        d = self.d
        for sub in ('state', 'spool/n1', 'spool/n2', 'log', 'job'):
            os.makedirs(f'{d}/{sub}')
        with open(f'{d}/munge.key', 'wb') as f:
            f.write(os.urandom(1024))
        os.chmod(f'{d}/munge.key', 0o600)
        with open(f'{d}/slurm.conf', 'w') as f:
            f.write(SLURM_CONF.format(d=d, ctl=self.c.addr('ctl'), n1=self.c.addr('n1'),
                                      n2=self.c.addr('n2')))
        munged = shutil.which('munged') or '/usr/sbin/munged'
        self.c.procs.append(subprocess.Popen(
            [munged, '-F', '--force', f'--socket={d}/munge.sock', f'--key-file={d}/munge.key',
             f'--pid-file={d}/munged.pid', f'--log-file={d}/log/munged.log',
             f'--seed-file={d}/munge.seed'],
            stdout=open(f'{d}/log/munged.out', 'wb'), stderr=subprocess.STDOUT,
            start_new_session=True))
        self.wait_for(lambda: os.path.exists(f'{d}/munge.sock'), 10, 'munged socket')
        self.c.start('ctl', ['slurmctld', '-D', '-i', '-f', f'{d}/slurm.conf'],
                     f'{d}/log/slurmctld.out', env=self.env, hostname='ctl', keep_sys=True)
        for n in ('n1', 'n2'):
            self.c.start(n, ['slurmd', '-D', '-f', f'{d}/slurm.conf', '-N', n],
                         f'{d}/log/slurmd.{n}.out', env=self.env, hostname=n, keep_sys=True)
        self.wait_for(lambda: self.idle_nodes() == 2, 30, 'two idle Slurm nodes')

    def cmd(self, *argv, env=None, check=True):
        r = subprocess.run(self.c.wrap('ctl') + list(argv), capture_output=True, text=True,
                           env=env or self.env, timeout=30)
        if check and r.returncode != 0:
            raise AssertionError(f'{argv}: {r.stdout}{r.stderr}\n{self.logs()}')
        return r.stdout

    def idle_nodes(self):
        out = self.cmd('sinfo', '-h', '-o', '%T %D', check=False)
        return sum(int(n) for s, n in (l.split() for l in out.splitlines() if l.strip())
                   if s == 'idle')

    def sbatch(self, script, args, env_extra, name):
        env = dict(self.env, **env_extra)
        out = self.cmd('sbatch', '--parsable', f'--job-name={name}', f'--chdir={self.d}/job',
                       f'--output={self.d}/job/{name}-%j.out', script, *args, env=env)
        return out.strip().split(';')[0]

    def state(self, job):
        out = self.cmd('squeue', '-h', '-j', job, '-o', '%T', check=False).strip()
        return out or 'GONE'

    def output(self, name, job):
        path = f'{self.d}/job/{name}-{job}.out'
        return open(path).read() if os.path.exists(path) else ''

    def logs(self):
        text = ''
        for f in sorted(glob.glob(f'{self.d}/log/*')):
            lines = open(f, errors='replace').read().splitlines()[-15:]
            text += f'== {f}\n' + '\n'.join(lines) + '\n'
        return text

    @staticmethod
    def wait_for(pred, seconds, what):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if pred():
                return
            time.sleep(0.1)
        raise AssertionError(f'timed out after {seconds} s waiting for {what}')


class Watch:
    """Polls every process while jobs run: command lines, and the secrets and
    job ids in the environments of Slurm job processes."""

    def __init__(self, job_dir):
        self.job_dir = job_dir
        self.srun_files = 0  # --multi-prog files seen (checked for secrets)
        self.cmdlines = {}  # pid -> words
        self.secrets = set()
        self.job_pids = {}  # SLURM_JOB_ID -> {pid: words}

    def poll(self):
        # The launcher's --multi-prog file: the tasks' variables, never a secret.
        for f in glob.glob(f'{self.job_dir}/.pushpull-*.srun.conf'):
            try:
                text = open(f).read()
            except OSError:
                continue
            self.srun_files += 1
            assert 'PUSHPULL_JOB_SECRET=' not in text, f'{f} holds the secret:\n{text}'
            self.cmdlines.setdefault(f, text.split())
        for pid, (cmd, env) in netns_hosts.processes().items():
            self.cmdlines.setdefault(pid, cmd)
            job = env.get('SLURM_JOB_ID')
            if job:
                self.job_pids.setdefault(job, {})[pid] = cmd
                if env.get('PUSHPULL_JOB_SECRET'):
                    self.secrets.add(env['PUSHPULL_JOB_SECRET'])

    def secret_on_command_lines(self):
        return [(pid, ' '.join(cmd)) for pid, cmd in self.cmdlines.items()
                for s in self.secrets if s and any(s in w for w in cmd)]


def run_jobs(slurm, watch, jobs, seconds):
    """jobs: {name: job id}; polls until all ended; returns {name: output}."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        watch.poll()
        if all(slurm.state(j) == 'GONE' or slurm.state(j) in ('COMPLETED', 'FAILED')
               for j in jobs.values()):
            break
        time.sleep(0.05)
    else:
        queue = slurm.cmd('squeue', '-o', '%i %j %T %r %N', check=False)
        raise AssertionError(f'jobs still running after {seconds} s:\n{queue}\n{slurm.logs()}')
    return {n: slurm.output(n, j) for n, j in jobs.items()}


def check_results(outs, c):
    # One launcher: "[srun] " prefixes; per node: the workers' own labels.
    ps = outs['launch-ps']
    assert ps.count('all values as expected') == 2, ps
    assert 'rank 0 of 2 worker(s)' in ps and 'rank 1 of 2 worker(s)' in ps, ps
    assert c.addr('n1') in ps and c.addr('n2') in ps, f'nodes on one host only:\n{ps}'
    col = outs['launch-collectives']
    assert col.count('all values as expected') == 2, col
    for name in ('pernode-collectives', 'pernode-ps'):
        out = outs[name]
        assert out.count('all values as expected') == 4, f'{name}:\n{out}'
        for r in range(4):
            assert f'[worker {r}] all values as expected' in out, f'{name}: worker {r}\n{out}'
    pps = outs['pernode-ps']
    assert re.search(r'server 1 .*registered at ' + re.escape(c.addr('n2')), pps) or \
        c.addr('n2') in pps, pps
    print('results: PS and collectives, one launcher and per node: every rank as expected')


def check_scancel(slurm, watch, d, env, one):
    """A long job of each kind; scancel once every worker runs; nothing of
    either job may survive. The one-launcher job makes a fresh secret (`one`:
    no secret file), which its sleeping workers hold long enough for the
    watch to see it for sure (the short jobs' fresh ones may end between
    two polls)."""
    sleeper = ['/bin/sh', '-c', f'echo $$ > {d}/job/alive.$SLURM_JOB_ID.$RANK; exec sleep 300']
    jobs = {
        'cancel-launch': slurm.sbatch(f'{SRC}/examples/slurm/pushpull-launch.sbatch', sleeper,
                                      dict(one, WORKERS='2', SERVERS='0'), 'cancel-launch'),
        'cancel-pernode': slurm.sbatch(f'{SRC}/examples/slurm/pushpull-per-node.sbatch', sleeper,
                                       dict(env, PROCS='2', SERVERS='0'), 'cancel-pernode'),
    }
    want = {jobs['cancel-launch']: 2, jobs['cancel-pernode']: 4}

    def all_running():
        watch.poll()
        return all(len(glob.glob(f'{d}/job/alive.{j}.*')) == n for j, n in want.items())
    slurm.wait_for(all_running, 30, 'the workers of the jobs to cancel')
    for _ in range(5):
        watch.poll()
        time.sleep(0.05)
    for j in want:
        procs = watch.job_pids.get(j, {})
        kinds = {os.path.basename(cmd[0]) for cmd in procs.values() if cmd}
        assert 'pushpull' in kinds and 'sleep' in kinds, f'job {j}: saw only {kinds}'
    slurm.cmd('scancel', *want)

    def all_gone():
        return all(not netns_hosts.alive(pid) for j in want for pid in watch.job_pids[j])
    try:
        slurm.wait_for(all_gone, 20, 'every process of the cancelled jobs to end')
    except AssertionError:
        left = [(pid, ' '.join(cmd)) for j in want for pid, cmd in watch.job_pids[j].items()
                if netns_hosts.alive(pid)]
        raise AssertionError(f'left running after scancel: {left}\n{slurm.logs()}')
    print(f'scancel: {sum(len(watch.job_pids[j]) for j in want)} processes of 2 jobs, all gone')


def main():
    skip_unless_ready()
    d = tempfile.mkdtemp(prefix='pp-slurm-')
    os.chmod(d, 0o755)
    cluster = slurm = None

    def cleanup():
        if slurm is not None:
            subprocess.run(cluster.wrap('ctl') + ['scancel', '--full', '-u', 'root'],
                           capture_output=True, env=slurm.env, timeout=10)
            # Job processes (their own groups) that outlived a failed check.
            for pid, (_, env) in netns_hosts.processes().items():
                if env.get('SLURM_CONF') == f'{d}/slurm.conf' and pid != os.getpid():
                    try:
                        os.kill(pid, 9)
                    except OSError:
                        pass
        if cluster is not None:
            cluster.close()
        shutil.rmtree(d, ignore_errors=True)

    t0 = time.monotonic()
    try:
        netns_hosts.cleanup_on_signals(cleanup)
        cluster = netns_hosts.Cluster('sl', [('n1', 'eth0'), ('n2', 'eth0')], hub_name='ctl')
        slurm = Slurm(cluster, d)
        slurm.up()
        print(f'Slurm up in {time.monotonic() - t0:.1f} s: ctl {cluster.addr("ctl")}, '
              f'n1 {cluster.addr("n1")}, n2 {cluster.addr("n2")}')
        secret_file = f'{d}/job-secret'
        with open(secret_file, 'w') as f:
            f.write('slurm-test-' + os.urandom(12).hex() + '\n')
        os.chmod(secret_file, 0o600)
        env = {'PUSHPULL': f'{BIN}/pushpull', 'PUSHPULL_JOB_SECRET_FILE': secret_file,
               'PUSHPULL_LOG_LEVEL': 'info', 'PUSHPULL_TIMEOUT': '30'}
        basics = f'{BIN}/kvstore_basics'
        launch = f'{SRC}/examples/slurm/pushpull-launch.sbatch'
        per_node = f'{SRC}/examples/slurm/pushpull-per-node.sbatch'
        # The one-launcher jobs make a fresh secret each (not the file's).
        one = {k: v for k, v in env.items() if k != 'PUSHPULL_JOB_SECRET_FILE'}
        watch = Watch(f'{d}/job')
        watch.secrets.add(open(secret_file).read().strip())
        jobs = {
            'launch-ps': slurm.sbatch(launch, [basics, '--kvstore', 'dist_sync'],
                                      dict(one, WORKERS='2', SERVERS='2'), 'launch-ps'),
            'launch-collectives': slurm.sbatch(
                launch, [basics, '--kvstore', 'dist_sync_allreduce'],
                dict(one, WORKERS='2', SERVERS='0'), 'launch-collectives'),
            'pernode-collectives': slurm.sbatch(
                per_node, [basics, '--kvstore', 'dist_sync_allreduce'],
                dict(env, PROCS='2', SERVERS='0'), 'pernode-collectives'),
            'pernode-ps': slurm.sbatch(per_node, [basics, '--kvstore', 'dist_sync'],
                                       dict(env, PROCS='2', SERVERS='1'), 'pernode-ps'),
        }
        outs = run_jobs(slurm, watch, jobs, 60)
        for name, out in outs.items():
            print(f'--- {name} (job {jobs[name]}): {len(out.splitlines())} lines')
        try:
            check_results(outs, cluster)
        except AssertionError:
            for name, out in outs.items():
                print(f'===== {name}\n{out}')
            print(slurm.logs())
            raise
        check_scancel(slurm, watch, d, env, one)
        # The file's secret and cancel-launch's fresh one at least.
        assert len(watch.secrets) >= 2, f'saw too few job secrets: {len(watch.secrets)}'
        leaks = watch.secret_on_command_lines()
        assert not leaks, f'a job secret on a command line: {leaks}'
        print(f'secrets: {len(watch.secrets)} job secrets, on none of '
              f'{len(watch.cmdlines)} command lines seen '
              f'({watch.srun_files} reads of srun --multi-prog files among them)')
    finally:
        cleanup()
    assert not glob.glob(f'/etc/netns/{cluster.prefix}*'), 'hosts files left behind'
    print(f'slurm cluster test passed in {time.monotonic() - t0:.1f} s')


if __name__ == '__main__':
    main()

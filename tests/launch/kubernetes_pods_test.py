#!/usr/bin/python3
"""The Kubernetes manifests of examples/kubernetes/, their pods run as
network-namespace hosts.

    kubernetes_pods_test.py BIN_DIR SOURCE_DIR

For each manifest (TrainJob, PyTorchJob, MPIJob; a parameter-server job and a
collectives job of each) the test reads the job from the YAML (names,
replicas, processes per node, the container's command, arguments,
environment and secret mount, so the test follows the manifests) and makes
the pods the operator would: one namespace each, the pod's name as host
name, the headless-service DNS names in the namespace's hosts file, and the
variables the operator adds (Kubeflow Trainer's torch runtime: PET_*;
training-operator: MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK,
PET_NPROC_PER_NODE; mpi-operator: the launcher's /etc/mpi/hostfile and
OMPI_MCA_orte_default_hostfile, with a stand-in `mpirun` that starts the
command on each worker pod with the OMPI_COMM_WORLD_* variables and the -x
ones, as Open MPI does). The secret is a regular file of mode 0400 (what a
subPath mount of a Secret gives). Checks: every worker's result, the ranks,
no secret on any command line; a Secret mounted whole (symbolic links) is
refused with advice.

Then the network interfaces: two hosts whose interfaces are named eth0 and
ens5, each with a decoy interface listed first that leads nowhere, run a
per-node parameter-server job and a collectives job started without the
launcher (RANK, WORLD_SIZE, MASTER_ADDR only), with no --interface or
--host-ip: the address each node advertises is the route's toward the
scheduler or rank 0.

Needs root and network namespaces; skips (exit 77) saying why otherwise.
"""

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import netns_hosts  # noqa: E402

try:
    import yaml
except ImportError:
    print('skipped: the Kubernetes pods test reads the manifests with PyYAML (python3-yaml)')
    sys.exit(netns_hosts.SKIP)

BIN, SRC = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
SECRET_MOUNT = '/etc/pushpull/secret'
FAKE_MPIRUN = r'''#!/usr/bin/python3
# Stand-in for Open MPI's mpirun in the launcher pod: one process per host of
# the hostfile (--npernode 1), started in that host's namespace with the
# worker pod's environment, OMPI_COMM_WORLD_* and the -x variables.
import os, signal, subprocess, sys
args, forward, npernode = sys.argv[1:], {}, 1
while args and args[0].startswith('-'):
    a = args.pop(0)
    if a == '-x':
        kv = args.pop(0)
        name, _, value = kv.partition('=')
        forward[name] = value if '=' in kv else os.environ[name]
    elif a in ('--npernode', '--bind-to', '--map-by'):
        v = args.pop(0)
        if a == '--npernode':
            npernode = int(v)
    elif a != '--allow-run-as-root':
        sys.exit(f'fake mpirun: unknown option {a}')
assert npernode == 1, 'the manifests start one launcher per pod'
hosts = [l.split()[0] for l in open(os.environ['OMPI_MCA_orte_default_hostfile']) if l.strip()]
pods = dict(kv.split('=') for kv in os.environ['PP_FAKE_MPIRUN_PODS'].split(','))
procs = []
for rank, host in enumerate(hosts):
    ns, pod = pods[host].split(':')
    env = {'PATH': os.environ['PATH'], 'OMPI_COMM_WORLD_SIZE': str(len(hosts)),
           'OMPI_COMM_WORLD_RANK': str(rank), 'OMPI_COMM_WORLD_LOCAL_RANK': '0',
           'OMPI_COMM_WORLD_LOCAL_SIZE': '1', 'PUSHPULL_LOG_LEVEL': 'warning', **forward}
    procs.append(subprocess.Popen(['ip', 'netns', 'exec', ns, 'unshare', '-u', 'sh', '-c',
                                   f'hostname {pod} && exec "$@"', 'sh'] + args, env=env))
def stop(*_):
    for p in procs:
        p.terminate()
signal.signal(signal.SIGTERM, stop)
codes = [p.wait() for p in procs]
sys.exit(next((c for c in codes if c), 0))
'''


def env_list(container):
    return {e['name']: str(e['value']) for e in container.get('env', []) if 'value' in e}


def subpath_mounts(container):
    return [m for m in container.get('volumeMounts', []) if m.get('subPath')]


class Pod:
    def __init__(self, name, dns, env, argv):
        self.name, self.dns, self.env, self.argv = name, dns, env, argv


def trainjob_pods(doc):
    name, t = doc['metadata']['name'], doc['spec']['trainer']
    n, p = int(t['numNodes']), int(t['numProcPerNode'])
    mounts = [m for o in doc['spec'].get('podTemplateOverrides', [])
              for c in o['spec'].get('containers', []) for m in subpath_mounts(c)]
    assert [m['mountPath'] for m in mounts] == [SECRET_MOUNT], mounts
    master = f'{name}-node-0-0.{name}'
    pods = []
    for i in range(n):
        env = dict(env_list(t), PET_NNODES=str(n), PET_NPROC_PER_NODE=str(p),
                   PET_NODE_RANK=str(i), PET_MASTER_ADDR=master, PET_MASTER_PORT='29400')
        pods.append(Pod(f'{name}-node-0-{i}', [f'{name}-node-0-{i}.{name}'], env,
                        t['command'] + t.get('args', [])))
    return pods, [], n * p


def pytorchjob_pods(doc):
    name, spec = doc['metadata']['name'], doc['spec']
    reps = spec['pytorchReplicaSpecs']
    nproc = int(spec.get('nprocPerNode', 1))
    roles = [('master', reps['Master'])] + ([('worker', reps['Worker'])] if 'Worker' in reps
                                            else [])
    total = sum(int(r['replicas']) for _, r in roles)
    pods, rank = [], 0
    for role, r in roles:
        c = r['template']['spec']['containers'][0]
        assert [m['mountPath'] for m in subpath_mounts(c)] == [SECRET_MOUNT], c
        port = next(p['containerPort'] for p in c.get('ports', [])
                    if p['name'] == 'pytorchjob-port')
        for i in range(int(r['replicas'])):
            env = dict(env_list(c), MASTER_ADDR=f'{name}-master-0', MASTER_PORT=str(port),
                       WORLD_SIZE=str(total * nproc), RANK=str(rank), PYTHONUNBUFFERED='0',
                       PET_NPROC_PER_NODE=str(nproc))
            pods.append(Pod(f'{name}-{role}-{i}', [f'{name}-{role}-{i}'], env,
                            c['command'] + c.get('args', [])))
            rank += 1
    return pods, [], total * nproc


def mpijob_pods(doc, tmp):
    name, spec = doc['metadata']['name'], doc['spec']
    reps = spec['mpiReplicaSpecs']
    wc = reps['Worker']['template']['spec']['containers'][0]
    assert [m['mountPath'] for m in subpath_mounts(wc)] == [SECRET_MOUNT], wc
    n = int(reps['Worker']['replicas'])
    workers = [Pod(f'{name}-worker-{i}', [f'{name}-worker-{i}.{name}.default.svc'],
                   env_list(wc), None) for i in range(n)]
    hostfile = f'{tmp}/{name}-hostfile'
    with open(hostfile, 'w') as f:
        for w in workers:
            f.write(f'{w.dns[0]} slots={spec.get("slotsPerWorker", 1)}\n')
    lc = reps['Launcher']['template']['spec']['containers'][0]
    argv = [a.replace('/etc/mpi/hostfile', hostfile) for a in lc['command'] + lc.get('args', [])]
    env = dict(env_list(lc), OMPI_MCA_orte_default_hostfile=hostfile)
    launcher = Pod(f'{name}-launcher', [], env, argv)
    nproc = int(re.search(r'--nproc-per-node (\d+)', ' '.join(argv)).group(1))
    return workers, [launcher], n * nproc


def run_job(kind, path, secret_file, tmp, watch):
    doc = yaml.safe_load(open(path))
    assert doc['kind'] == kind, path
    if kind == 'TrainJob':
        pods, extra, world = trainjob_pods(doc)
    elif kind == 'PyTorchJob':
        pods, extra, world = pytorchjob_pods(doc)
    else:
        pods, extra, world = mpijob_pods(doc, tmp)
    hosts = [(p.name, 'eth0') for p in pods + extra]
    aliases = {dns: p.name for p in pods for dns in p.dns}
    ps = ' -s ' in ' '.join(a for p in pods + extra if p.argv for a in [' '.join(p.argv)]) or \
        '-s' in sum((p.argv or [] for p in pods + extra), [])
    with netns_hosts.Cluster('k8', hosts, aliases=aliases) as c:
        mpirun_dir = f'{tmp}/fakebin'
        os.makedirs(mpirun_dir, exist_ok=True)
        with open(f'{mpirun_dir}/mpirun', 'w') as f:
            f.write(FAKE_MPIRUN)
        os.chmod(f'{mpirun_dir}/mpirun', 0o755)
        base = {'PATH': f'{BIN}:{mpirun_dir}:/usr/sbin:/usr/bin:/sbin:/bin',
                'PUSHPULL_LOG_LEVEL': 'warning',
                'PP_FAKE_MPIRUN_PODS': ','.join(f'{d}={c.ns(p.name)}:{p.name}'
                                                for p in pods for d in p.dns)}
        log = f'{tmp}/{os.path.basename(path)}.log'
        procs = []
        for p in (extra or pods):
            env = dict(base, **{k: v.replace(SECRET_MOUNT, secret_file)
                                for k, v in p.env.items()})
            procs.append(c.start(p.name, p.argv, log, env=env, hostname=p.name))
        deadline = time.monotonic() + 60
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            watch()
            time.sleep(0.05)
        codes = [p.poll() for p in procs]
        out = open(log).read()
        assert all(code == 0 for code in codes), f'{path}: exit codes {codes}\n{out}'
        for r in range(world):
            assert f'[worker {r}] all values as expected' in out, f'{path}: worker {r}\n{out}'
        assert out.count('all values as expected') == world, out
        assert f'[worker {world}]' not in out, out
        print(f'{os.path.basename(path)}: {len(pods)} pods, {world} workers'
              f'{", servers" if ps else ""}: every rank as expected')


def check_symlinked_secret_is_refused(tmp):
    d = f'{tmp}/secret-volume'
    os.makedirs(f'{d}/..2026_01_01_00_00_00.1')
    with open(f'{d}/..2026_01_01_00_00_00.1/secret', 'w') as f:
        f.write('kubelet-layout\n')
    os.chmod(f'{d}/..2026_01_01_00_00_00.1/secret', 0o400)
    os.symlink('..2026_01_01_00_00_00.1', f'{d}/..data')
    os.symlink('..data/secret', f'{d}/secret')
    r = subprocess.run([f'{BIN}/pushpull', 'launch', '--dry-run', '--nnodes', '2', '--node-rank',
                        '0', '--nproc-per-node', '1', '--master-addr', 'x', '--master-port', '1',
                        'true'], env=dict(os.environ, PUSHPULL_JOB_SECRET_FILE=f'{d}/secret'),
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2, r
    assert 'symbolic link' in r.stderr and 'subPath' in r.stderr, r.stderr
    print('a Secret volume mounted whole: refused, advice given')


def check_interfaces(tmp):
    """eth0 and ens5, decoys first, no flags: the route decides."""
    with netns_hosts.Cluster('if', [('a', 'eth0'), ('b', 'ens5')],
                             decoys={'a': '192.0.2.71/32', 'b': '192.0.2.72/32'}) as c:
        env = {'PATH': os.environ['PATH'], 'PUSHPULL_JOB_SECRET': 'interfaces-test',
               'PUSHPULL_LOG_LEVEL': 'info', 'PUSHPULL_TIMEOUT': '20'}
        log = f'{tmp}/interfaces.log'
        procs = [c.start(h, [f'{BIN}/pushpull', 'launch', '--nnodes', '2', '--node-rank', str(i),
                             '--nproc-per-node', '1', '-s', '1', '--master-addr', 'a',
                             '--master-port', '29500', '--', f'{BIN}/kvstore_basics',
                             '--kvstore', 'dist_sync'], log, env=env, hostname=h)
                 for i, h in enumerate(('a', 'b'))]
        codes = [p.wait(timeout=60) for p in procs]
        out = open(log).read()
        assert codes == [0, 0], f'per-node PS job: {codes}\n{out}'
        assert out.count('all values as expected') == 2, out
        assert c.addr('b') in out and '192.0.2.7' not in out, out
        # No launcher: the program alone, with torchrun's variables.
        log2 = f'{tmp}/interfaces-direct.log'
        procs = [c.start(h, [f'{BIN}/kvstore_basics', '--kvstore', 'dist_sync_allreduce'], log2,
                         env=dict(env, RANK=str(i), WORLD_SIZE='2', MASTER_ADDR='a',
                                  MASTER_PORT='29501'), hostname=h)
                 for i, h in enumerate(('a', 'b'))]
        codes = [p.wait(timeout=60) for p in procs]
        out2 = open(log2).read()
        assert codes == [0, 0], f'collectives without the launcher: {codes}\n{out2}'
        assert out2.count('all values as expected') == 2, out2
    print('interfaces eth0 / ens5 with decoys, no flags: PS per node and collectives ran')


def main():
    netns_hosts.need_root_and_netns('the Kubernetes pods test')
    netns_hosts.need_programs(BIN, ['pushpull', 'kvstore_basics'], 'the Kubernetes pods test')
    tmp = tempfile.mkdtemp(prefix='pp-k8s-')
    os.chmod(tmp, 0o755)
    netns_hosts.cleanup_on_signals(lambda: shutil.rmtree(tmp, ignore_errors=True))
    t0 = time.monotonic()
    try:
        secret_file = f'{tmp}/secret'
        secret = 'k8s-test-' + os.urandom(12).hex()
        with open(secret_file, 'w') as f:
            f.write(secret + '\n')
        os.chmod(secret_file, 0o400)
        seen = {}

        def watch():
            for pid, (cmd, _) in netns_hosts.processes().items():
                seen.setdefault(pid, cmd)
        ex = f'{SRC}/examples/kubernetes'
        for kind, files in (('TrainJob', ['trainjob-collectives.yaml', 'trainjob-ps.yaml']),
                            ('PyTorchJob', ['pytorchjob-collectives.yaml', 'pytorchjob-ps.yaml']),
                            ('MPIJob', ['mpijob-collectives.yaml', 'mpijob-ps.yaml'])):
            for f in files:
                run_job(kind, f'{ex}/{f}', secret_file, tmp, watch)
        leaks = [(pid, ' '.join(cmd)) for pid, cmd in seen.items()
                 if any(secret in w for w in cmd)]
        assert not leaks, f'the secret on a command line: {leaks}'
        assert any('kvstore_basics' in ' '.join(cmd) for cmd in seen.values()), 'saw no worker'
        print(f'secret: on none of {len(seen)} command lines seen')
        check_symlinked_secret_is_refused(tmp)
        check_interfaces(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f'kubernetes pods test passed in {time.monotonic() - t0:.1f} s')


if __name__ == '__main__':
    main()

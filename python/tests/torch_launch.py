"""Runs python/tests/torch_worker.py cases under `pushpull launch -s 0` for the
pytest suites (test_torch_ops.py, test_torch_optimizer.py).

The launcher is found next to the imported extension (build/python/pushpull
-> build/bin/pushpull) or from PUSHPULL_BIN / PUSHPULL_BIN_DIR. The job runs in its own process
group; on a timeout the launcher (which we started) gets SIGTERM, which stops
its workers, then that process group gets SIGKILL.
"""

import os
import pathlib
import random
import signal
import socket
import subprocess
import sys

import pushpull._pushpull as _ext

HERE = pathlib.Path(__file__).resolve().parent


def unused_port():
    """A port free on 127.0.0.1 now, for a listener a job binds later: below
    the kernel's ephemeral range when it can, so no connect() on the machine
    takes it as its source port meanwhile (as the launcher picks its ports)."""
    try:
        with open('/proc/sys/net/ipv4/ip_local_port_range') as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    candidates = [random.randrange(10000, low) for _ in range(64)] if low > 11000 else []
    for port in candidates + [0]:
        with socket.socket() as s:
            try:
                s.bind(('127.0.0.1', port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise OSError('no free port on 127.0.0.1')


def launcher():
    if os.environ.get('PUSHPULL_BIN'):
        return os.environ['PUSHPULL_BIN']
    if os.environ.get('PUSHPULL_BIN_DIR'):  # as conftest.py and scripts/run-tests.sh
        return os.path.join(os.environ['PUSHPULL_BIN_DIR'], 'pushpull')
    return str(pathlib.Path(_ext.__file__).resolve().parents[2] / 'bin' / 'pushpull')


def run_job(argv, n, timeout=90, extra_env=None, servers=0):
    """Runs `argv` as n workers (and `servers` parameter servers); returns
    (exit code, output)."""
    env = dict(os.environ)
    pkg_root = str(pathlib.Path(_ext.__file__).resolve().parents[1])
    env['PYTHONPATH'] = os.pathsep.join(
        [pkg_root, str(HERE)] + [p for p in env.get('PYTHONPATH', '').split(os.pathsep) if p])
    env.setdefault('OMP_NUM_THREADS', '1')
    env.update(extra_env or {})
    cmd = [launcher(), 'launch', '-n', str(n), '-s', str(servers), '--timeout', '60', '--'] + argv
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True, text=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the group of the launcher we started
            out, _ = proc.communicate()
        raise AssertionError('job %s timed out after %ss:\n%s' % (argv, timeout, out))
    return proc.returncode, out


def run_case(case, n, timeout=90, servers=0, script=None, no_traceback=False):
    """Runs one case of `script` (torch_worker.py by default) on n ranks and
    checks every rank passed (and, with no_traceback, that none printed one)."""
    code, out = run_job([sys.executable, str(script or HERE / 'torch_worker.py'), case], n,
                        timeout, servers=servers)
    assert code == 0, 'case %s on %d ranks exited %d:\n%s' % (case, n, code, out)
    for r in range(n):
        assert 'PASS %s rank %d of %d' % (case, r, n) in out, out
    if no_traceback:
        assert 'Traceback' not in out, out
    return out

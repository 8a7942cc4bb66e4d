"""Shared fixtures for the pushpull Python tests.

Run from the repository root (scripts/run-tests.sh does this):
    PYTHONPATH=build/python PUSHPULL_BIN_DIR=$PWD/build/bin /usr/bin/python3 -m pytest -q python/tests
Without PYTHONPATH the package is taken from $PUSHPULL_BUILD_DIR/python, else build/python.
"""

import os
import signal
import subprocess
import sys
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

try:
    import pushpull  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.join(os.environ.get('PUSHPULL_BUILD_DIR', os.path.join(REPO, 'build')),
                                    'python'))
    import pushpull  # noqa: F401

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(pushpull.__file__)))


def pushpull_binary():
    """The `pushpull` CLI of the same build as the package."""
    bin_dir = os.environ.get('PUSHPULL_BIN_DIR')
    if bin_dir:
        return os.path.join(bin_dir, 'pushpull')
    from pushpull.launch import find_binary
    return find_binary()


class Job:
    """The outcome of one `pushpull launch` run."""

    def __init__(self, returncode, output, seconds):
        self.returncode, self.output, self.seconds = returncode, output, seconds

    def __repr__(self):
        return f'Job(rc={self.returncode}, {self.seconds:.1f}s)\n{self.output}'


def run_command(cmd, env, timeout):
    """Runs `cmd` in a new session (process group) and returns a Job. On
    timeout it gets SIGTERM (a launcher then stops its processes), and after
    a grace period its whole process group, which this call created, SIGKILL."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True, text=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        raise AssertionError(f'timed out after {timeout}s: {" ".join(cmd)}\n{out}')
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return Job(proc.returncode, out, time.monotonic() - start)


def job_env(extra_env=None):
    """The environment of a job: this package on PYTHONPATH, quiet logs."""
    env = dict(os.environ)
    env['PYTHONPATH'] = PYTHON_DIR + os.pathsep + env.get('PYTHONPATH', '')
    env.setdefault('PUSHPULL_LOG_LEVEL', 'warn')
    env.update(extra_env or {})
    return env


def launch(workers, servers, script, *args, timeout=90, extra_env=None):
    """Runs `pushpull launch -n W -s S python3 SCRIPT ARGS`; returns a Job."""
    cmd = [pushpull_binary(), 'launch', '-n', str(workers), '-s', str(servers), '--timeout', '60',
           sys.executable, script, *map(str, args)]
    return run_command(cmd, job_env(extra_env), timeout)


@pytest.fixture
def run_job():
    return launch


@pytest.fixture
def kv():
    """A fresh local store, closed after the test."""
    store = pushpull.kv.create('local')
    yield store
    store.close()

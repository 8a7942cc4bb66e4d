"""pushpull.kv dist stores from Python, each job under `pushpull launch`.

The value checks of the parameter-server issue run inside the workers
(dist_worker.py): float32/float16 x (2,3)/(1200,1200) with the test optimizer
(rescale_grad=2) in closed form, device lists, row_sparse_pull, 2-bit
compression with its residual (1-bit too, on dist_sync_allreduce and
dist_sync), bad input → the documented exceptions.
"""

import os
import sys

import pytest

from conftest import REPO, job_env, launch, pushpull_binary, run_command

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, 'dist_worker.py')


def assert_all_ok(job, workers, kvtype):
    assert job.returncode == 0, job
    for rank in range(workers):
        assert f'worker {rank}: ok ({kvtype}, {workers} workers)' in job.output, job


@pytest.mark.parametrize('workers, servers, kvtype', [
    (2, 2, 'dist_sync'),
    (3, 1, 'dist_sync'),
    (2, 1, 'dist_device_sync'),
    (3, 2, 'dist_async'),
    (2, 0, 'dist_sync_allreduce'),
])
def test_value_checks(workers, servers, kvtype):
    job = launch(workers, servers, WORKER, 'values', kvtype)
    assert_all_ok(job, workers, kvtype)


@pytest.mark.parametrize('workers, servers, kvtype', [
    (3, 0, 'dist_sync_allreduce'),  # codes allgathered, summed by every worker
    (3, 1, 'dist_sync'),            # the same closed form through a server
])
def test_one_bit_compression_carries_the_residual(workers, servers, kvtype):
    job = launch(workers, servers, WORKER, 'onebit', kvtype)
    assert_all_ok(job, workers, kvtype)


def test_value_checks_with_torch_tensors():
    pytest.importorskip('torch')
    job = launch(2, 2, WORKER, 'torch', 'dist_sync')
    assert_all_ok(job, 2, 'dist_sync')


def test_optimizer_states_survive_a_restart_of_the_job(tmp_path):
    path = str(tmp_path / 'states')
    assert_all_ok(launch(2, 2, WORKER, 'save', path), 2, 'dist_sync')
    assert os.path.exists(path) and os.path.exists(path + '.three.npy')
    # a new job: weights after round 2, loaded momentum → round 3 as before
    assert_all_ok(launch(2, 2, WORKER, 'load', path), 2, 'dist_sync')


def test_a_worker_dying_of_an_exception_fails_the_job_fast(tmp_path):
    script = tmp_path / 'fail.py'
    script.write_text(
        'import numpy as np, pushpull\n'
        "kv = pushpull.kv.create('dist_sync')\n"
        'kv.init(0, np.zeros(3, np.float32))\n'
        'if kv.rank == 1:\n'
        "    raise RuntimeError('worker 1 fails on purpose')\n"
        'kv.barrier()\n')
    job = launch(2, 1, str(script), timeout=60)
    assert job.returncode != 0, job
    assert 'worker 1 fails on purpose' in job.output
    assert job.seconds < 30, job  # not the barrier deadline


def test_tutorial_through_python_m_pushpull_launch():
    tutorial = os.path.join(REPO, 'examples', 'python', 'kvstore_tutorial.py')
    job = run_command([
        sys.executable, '-m', 'pushpull.launch', '-n', '2', '-s', '2', '--timeout', '60',
        sys.executable, tutorial, '--kvstore', 'dist_sync'
    ], job_env({'PUSHPULL_BIN': pushpull_binary()}), timeout=90)
    assert job.returncode == 0, job
    assert job.output.count('all values as expected') == 2, job
    assert 'expect all 6' in job.output, job


def test_a_killed_worker_is_restarted_and_adopts_the_servers_values(tmp_path):
    # pushpull launch --max-restarts (docs/ps.md "Worker restart"): worker 1
    # SIGKILLs itself after its push of round 8; the launcher restarts it with
    # its rank, its init adopts the servers' values, it resumes after
    # kv.restart_round, and every value pulled is exact.
    script = tmp_path / 'restart.py'
    script.write_text(
        'import os, signal, numpy as np, pushpull\n'
        "kv = pushpull.kv.create('dist_sync')\n"
        'w = np.ones(4, np.float32)\n'
        "kv.init('w', w)\n"
        "kv.set_optimizer(pushpull.optimizer.create('test', rescale_grad=0.5))\n"
        'step = 0.5 * kv.num_workers * (kv.num_workers + 1) / 2\n'
        'done = kv.restart_round\n'
        'assert (w == 1 + step * done).all(), (w, done)  # adopted, not our fresh ones\n'
        'g = np.full(4, kv.rank + 1, np.float32)\n'
        'for k in range(done + 1, 21):\n'
        '    if kv.rank == 1 and k == 8 and done == 0:\n'
        "        kv.push('w', g)\n"
        '        os.kill(os.getpid(), signal.SIGKILL)\n'
        "    kv.pushpull('w', g, out=w)\n"
        '    assert (w == 1 + step * k).all(), (k, w)\n'
        "print(f'worker {kv.rank}: ok from round {done + 1}', flush=True)\n")
    cmd = [pushpull_binary(), 'launch', '-n', '2', '-s', '2', '--max-restarts', '1',
           sys.executable, str(script)]
    job = run_command(cmd, job_env(), 90)
    assert job.returncode == 0, job
    assert 'worker 0: ok from round 1' in job.output, job
    assert 'worker 1: ok from round 8' in job.output or \
        'worker 1: ok from round 9' in job.output, job
    assert 'restarting it with the same rank' in job.output, job


def test_backup_workers_set_from_python_drop_a_straggler(tmp_path):
    # docs/ps.md "Backup workers": the setting given to kv.create reaches
    # the servers (worker 0's mode command; the servers' environment has
    # none); worker 2 is slowed, rounds close on the other two with the sum
    # scaled by 3/2, and every worker pulls the same value each round.
    script = tmp_path / 'backup.py'
    script.write_text(
        'import time, numpy as np, pushpull\n'
        "kv = pushpull.kv.create('dist_sync', env={'PUSHPULL_PS_BACKUP_WORKERS': '1'})\n"
        'kv.init(0, np.zeros(4, np.float32))\n'
        "kv.set_optimizer('test', rescale_grad=0.5)\n"
        'out = np.zeros(4, np.float32)\n'
        'for k in range(1, 9):\n'
        '    time.sleep(0.09 if kv.rank == 2 else 0.03)\n'
        '    kv.pushpull(0, np.full(4, kv.rank + 1, np.float32), out)\n'
        "    print('VALUE', kv.rank, k, repr(float(out[0])), flush=True)\n")
    job = launch(3, 1, str(script), timeout=90)
    assert job.returncode == 0, job
    seen = {}
    for line in job.output.splitlines():
        if 'VALUE ' in line:
            _, rank, k, v = line[line.index('VALUE '):].split()
            seen.setdefault(int(k), {})[int(rank)] = float(v)
    assert sorted(seen) == list(range(1, 9)), job
    steps = {0.5 * 3 * 1.5, 0.5 * 4 * 1.5, 0.5 * 5 * 1.5, 0.5 * 6}
    before, taken = 0.0, []
    for k in range(1, 9):
        assert len(seen[k]) == 3 and len(set(seen[k].values())) == 1, (k, seen[k], job)
        taken.append(seen[k][0] - before)
        assert taken[-1] in steps, (k, seen[k], job)
        before = seen[k][0]
    assert 0.5 * 3 * 1.5 in taken, ('no round closed without the straggler', taken)

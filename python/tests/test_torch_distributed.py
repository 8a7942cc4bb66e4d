"""The torch.distributed backend 'pushpull' (pushpull.torch.distributed).

Jobs run torch_pg_worker.py cases under `pushpull launch -s 0` (2 and 3
ranks) or as processes started here with torchrun's variables (RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT): every collective x dtype against local
references, DDP over pushpull against DDP over gloo in the same run (plain,
no_sync(), gradient_as_bucket_view, fp16_compress_hook), the refusals, and a
rank killed during DDP training.
"""

import os
import signal
import subprocess
import sys
import time
import types

import pytest

torch = pytest.importorskip('torch')
import importlib.util  # noqa: E402

if importlib.util.find_spec('pushpull._pushpull_torch_pg') is None:  # built without libtorch
    pytest.skip('pushpull._pushpull_torch_pg was not built (no libtorch found by CMake)',
                allow_module_level=True)
import pushpull.torch.distributed as ppd  # noqa: E402  (an ABI mismatch fails here, loudly)

from torch_launch import HERE, unused_port

WORKER = str(HERE / 'torch_pg_worker.py')


def test_import_registers_the_backend():
    import torch.distributed as dist
    assert ppd.is_registered()
    assert dist.Backend('pushpull') == 'pushpull'
    import importlib
    importlib.reload(ppd)  # a second import does not register twice
    assert ppd.is_registered()


def test_world_of_one_in_process():
    import torch.distributed as dist
    port = unused_port()
    dist.init_process_group('pushpull', init_method=f'tcp://127.0.0.1:{port}', rank=0,
                            world_size=1)
    try:
        pg = dist.distributed_c10d._get_default_group()
        assert isinstance(pg, ppd.ProcessGroupPushpull)
        assert pg.mode == 'single'
        t = torch.arange(6, dtype=torch.float32)
        dist.all_reduce(t)
        assert torch.equal(t, torch.arange(6, dtype=torch.float32))
        fut = dist.all_reduce(t, async_op=True).get_future()
        assert torch.equal(fut.wait()[0], t)
    finally:
        dist.destroy_process_group()


def test_ranks_meet_through_torchs_store_and_rank_0_judges(monkeypatch):
    """The ranks meet through torch's own store (the group's Store,
    src/collective/store.h; no port of pushpull's own): a rank that never
    comes is a Timeout naming it; another world size fails every rank with
    rank 0's reason."""
    import datetime
    import threading
    import torch.distributed as dist
    monkeypatch.setenv('PUSHPULL_STARTUP_TIMEOUT_MS', '1500')
    timeout = datetime.timedelta(seconds=30)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match='for ranks 1'):
        ppd.ProcessGroupPushpull(dist.HashStore(), 0, 2, timeout)
    assert time.monotonic() - start < 10
    store, errors = dist.HashStore(), {}

    def member(rank, size):
        try:
            ppd.ProcessGroupPushpull(store, rank, size, timeout)
        except RuntimeError as e:
            errors[rank] = str(e)

    threads = [threading.Thread(target=member, args=a) for a in ((0, 2), (1, 3))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(errors) == [0, 1], errors
    for why in errors.values():
        assert 'rank 1 says the world has 3 ranks, rank 0 says 2' in why, errors


def test_abi_mismatch_is_explained():
    good = types.SimpleNamespace(torch_version=ppd._torch_version(),
                                 cxx11_abi=torch._C._GLIBCXX_USE_CXX11_ABI,
                                 pybind11_abi=(torch._C._PYBIND11_COMPILER_TYPE,
                                               torch._C._PYBIND11_STDLIB,
                                               torch._C._PYBIND11_BUILD_ABI))
    assert ppd._abi_problem(good) is None
    assert ppd._abi_problem(ppd._ext) is None  # this build fits this torch
    old = types.SimpleNamespace(**{**vars(good), 'torch_version': (1, 12, 1)})
    assert 'built against libtorch 1.12.1' in ppd._abi_problem(old)
    abi = types.SimpleNamespace(**{**vars(good), 'cxx11_abi': not good.cxx11_abi})
    assert '_GLIBCXX_USE_CXX11_ABI' in ppd._abi_problem(abi)
    pyb = types.SimpleNamespace(**{**vars(good), 'pybind11_abi': ('_clang', 'x', 'y')})
    assert 'pybind11 ABI' in ppd._abi_problem(pyb)


@pytest.mark.parametrize('n', [2, 3])
def test_every_collective_and_dtype_against_references(n):
    # allreduce sum/avg/min/max/product, non-contiguous, broadcast from every
    # root, all_gather(+_into_tensor), reduce_scatter(+_tensor), reduce, gather,
    # all_to_all(+_single), coalesced, empty tensors, async works and futures,
    # barrier; x float32/64, float16, bfloat16, int32/64, int8, uint8.
    run_case_pg('collectives', n)


@pytest.mark.parametrize('variant', ['plain', 'no_sync', 'bucket_view', 'fp16_hook'])
@pytest.mark.parametrize('n', [2, 3])
def test_ddp_over_pushpull_equals_ddp_over_gloo(n, variant):
    out = run_case_pg('ddp', n, variant, label=f'ddp-{variant}')
    assert 'max |pushpull - gloo|' in out


def test_refusals_are_runtime_errors_and_the_group_survives_them():
    out = run_case_pg('errors', 2)
    assert 'submitted differently' in out


def test_an_operation_some_rank_never_calls_times_out():
    from torch_launch import run_job
    code, out = run_job([sys.executable, WORKER, 'timeout'], 2, 120,
                        extra_env={'PG_TEST_TIMEOUT_S': '3'})
    assert code == 0, out
    assert 'PASS timeout rank 0 of 2' in out and 'PASS timeout rank 1 of 2' in out, out


def spawn_torchrun_style(n, args, extra_env=None):
    """n processes with torchrun's variables (no launcher, no job secret:
    loopback only). Each in its own process group."""
    import pushpull
    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(pushpull.__file__)))
    port = unused_port()
    procs = []
    for r in range(n):
        env = dict(os.environ)
        env.update({'RANK': str(r), 'WORLD_SIZE': str(n), 'LOCAL_RANK': str(r),
                    'LOCAL_WORLD_SIZE': str(n), 'MASTER_ADDR': '127.0.0.1',
                    'MASTER_PORT': str(port), 'OMP_NUM_THREADS': '1',
                    'PUSHPULL_LOG_LEVEL': 'warn'})
        env.pop('PUSHPULL_JOB_SECRET', None)
        env['PYTHONPATH'] = os.pathsep.join([pkg_root, str(HERE), env.get('PYTHONPATH', '')])
        env.update(extra_env or {})
        procs.append(subprocess.Popen([sys.executable, WORKER, *map(str, args)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      start_new_session=True))
    return procs


def collect(procs, timeout):
    outs, deadline = [], time.monotonic() + timeout
    try:
        for p in procs:
            out, _ = p.communicate(timeout=max(1, deadline - time.monotonic()))
            outs.append(out)
    except subprocess.TimeoutExpired:
        for p in procs:  # processes we started, each in its own group
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
        raise AssertionError('ranks timed out:\n' +
                             '\n'.join(p.communicate()[0] or '' for p in procs))
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    return outs


def test_torchrun_variables_without_the_launcher():
    procs = spawn_torchrun_style(2, ['ddp', 'plain'])
    outs = collect(procs, 120)
    for r, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f'rank {r} exited {p.returncode}:\n{out}'
        assert f'PASS ddp-plain rank {r} of 2' in out, out


def test_a_killed_rank_fails_ddp_on_the_others_naming_it():
    # Rank 2 SIGKILLs itself at step 3 of DDP training: ranks 0 and 1 get a
    # RuntimeError naming rank 2 from backward()/step() within the failure
    # detector's deadline (heartbeat 3 s here), not a hang.
    start = time.monotonic()
    procs = spawn_torchrun_style(3, ['killed', 2], {'PUSHPULL_HEARTBEAT_TIMEOUT_MS': '3000'})
    outs = collect(procs, 120)
    elapsed = time.monotonic() - start
    assert procs[2].returncode == -signal.SIGKILL, outs[2]
    for r in (0, 1):
        assert procs[r].returncode == 0, f'rank {r} exited {procs[r].returncode}:\n{outs[r]}'
        assert f'PASS killed rank {r} of 3' in outs[r], outs[r]
        assert 'rank 2' in outs[r]
    assert elapsed < 110, f'the survivors took {elapsed:.0f} s'


def run_case_pg(case, n, *args, label=None, timeout=240):
    """Runs one torch_pg_worker.py case on n ranks under `pushpull launch -s 0`."""
    from torch_launch import run_job
    code, out = run_job([sys.executable, WORKER, case, *map(str, args)], n, timeout)
    assert code == 0, f'case {case} {args} on {n} ranks exited {code}:\n{out}'
    for r in range(n):
        assert f'PASS {label or case} rank {r} of {n}' in out, out
    return out


def test_bench_step_runs_ddp_over_both_backends():
    from torch_launch import launcher
    proc = subprocess.run([launcher(), 'bench', 'step', '-n', '2', '--grad-mb', '1', '--impls',
                           'ddp-gloo,ddp-pushpull', '--steps', '2', '--warmup', '1', '--repeats',
                           '1', '--format', 'csv', '--timeout', '120'],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line.split(',') for line in proc.stdout.splitlines()[1:]]
    assert [r[0] for r in rows] == ['ddp-gloo', 'ddp-pushpull'], proc.stdout + proc.stderr
    assert rows[0][-1] == '1.000' and float(rows[1][-1]) > 0, proc.stdout

"""What Horovod's test file of the 0.21 era (horovod/horovod test/parallel/test_torch.py
at 1f5c367, run by scripts/horovod_suite.py) checks that its later versions do
not: integer averages rounded down, and pushpull.torch.horovod_0_21's summed
allgather/broadcast gradients, alltoall returning the tensor alone and zero
gradients from DistributedOptimizer; pushpull.torch itself keeps Horovod 0.28's.
The file is both the pytest module and, run as a script under
`pushpull launch -s 0`, the worker:

    build/bin/pushpull launch -n 3 -s 0 /usr/bin/python3 python/tests/test_hvd_compat021.py v021

Each case prints "PASS <case> rank <r> of <n>"; any mismatch raises.
"""

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]

# ---- the pytest side ----------------------------------------------------------------


def run_case(case, n, timeout=120):
    import torch_launch
    torch_launch.run_case(case, n, timeout, script=__file__, no_traceback=True)


@pytest.mark.parametrize('n', [2, 3])
def test_average_rounding(n):
    # Average of negative integers is sum / n truncated toward zero (Horovod's
    # C++, its 0.28 suite), also with joined ranks' zeros, in reducescatter and
    # through the int16 path; prescale of integers truncates toward zero too;
    # float32 / float64 averages are the correctly rounded sum / n, joined too.
    run_case('rounding', n)


@pytest.mark.parametrize('n', [2, 3])
def test_horovod_0_21_module(n):
    # pushpull.torch.horovod_0_21: summed allgather / broadcast gradients,
    # alltoall (and its async form) returning the tensor, differentiable, and
    # zero gradients from DistributedOptimizer (a GAN-style step with half the
    # model frozen works); pushpull.torch in the same job keeps 0.28's.
    run_case('v021', n)


@pytest.mark.parametrize('n', [2, 3])
def test_launch_sets_horovod_names_and_init_again_works(n):
    # pushpull launch sets HOROVOD_RANK / _SIZE / _LOCAL_RANK / _LOCAL_SIZE as
    # horovodrun's Gloo mode does (scripts read them to tell that mode, where
    # init() after shutdown() works): it does here, and ops work after it.
    run_case('reinit', n)


def _runner():
    spec = importlib.util.spec_from_file_location('horovod_suite',
                                                  ROOT / 'scripts' / 'horovod_suite.py')
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_suite_runner_lists_each_test_once_and_swaps_the_module(tmp_path):
    # A class defining a test name twice has one test (Python keeps the last
    # definition); --module names what the import line becomes; a file without
    # the import line is refused.
    suite = _runner()
    src = tmp_path / 'test_x.py'
    src.write_text('import horovod.torch as hvd\n\n\nclass T:\n    def test_a(self):\n        pass\n\n'
                   '    def test_b(self):\n        pass\n\n    def test_a(self):\n        pass\n')
    work = tmp_path / 'work'
    work.mkdir()
    dest = suite.prepare(src, work, 'pushpull.torch.horovod_0_21')
    assert dest.read_text().startswith('import pushpull.torch.horovod_0_21 as hvd\n')
    assert (work / 'utils' / 'common.py').exists()
    assert suite.list_tests(dest) == ['T::test_a', 'T::test_b']
    bad = tmp_path / 'test_y.py'
    bad.write_text('import horovod.tensorflow as hvd\n')
    (tmp_path / 'w2').mkdir()
    with pytest.raises(SystemExit):
        suite.prepare(bad, tmp_path / 'w2')


# ---- the worker side ----------------------------------------------------------------


def case_rounding(n, r, hvd, _):
    from torch_worker import check
    base = torch.tensor([-75, 75, -3, 9, -1, 0, -100, 99], dtype=torch.int32)
    # r * r: the sum is not a multiple of n (2 or 3), so rounding shows.
    mine = base + r * r
    total = sum(base + k * k for k in range(n))
    for dtype in (torch.int32, torch.int64, torch.int16):  # int16: summed in an int32 copy
        got = hvd.allreduce(mine.to(dtype), name='round.%s' % dtype, op=hvd.Average)
        check(got, torch.div(total, n, rounding_mode='trunc').to(dtype), 'average %s' % dtype)
    # Prescale of integers: scaled in float64, truncated toward zero, then summed.
    got = hvd.allreduce(mine, name='round.pre', op=hvd.Sum, prescale_factor=0.5)
    check(got, sum((((base + k * k).double() * 0.5).to(torch.int32)) for k in range(n)),
          'prescaled sum')
    # Floating-point averages are the correctly rounded sum / n (the engine
    # divides by n; sum * (1/n) is an ulp off for a third of these on 3 ranks).
    xs = torch.arange(-200, 201, dtype=torch.float64)
    for dtype in (torch.float32, torch.float64):
        got = hvd.allreduce((xs * (r + 1)).to(dtype), name='round.%s' % dtype, op=hvd.Average)
        check(got, sum((xs * (k + 1)).to(dtype) for k in range(n)) / n, 'average %s' % dtype)
    # reducescatter's average: the same rounding.
    rows = torch.stack([mine] * n)
    got = hvd.reducescatter(rows, name='round.rs', op=hvd.Average)
    check(got, torch.div(total, n, rounding_mode='trunc').view(1, -1), 'reducescatter average')
    # Rank 0 joined: the others average with its zeros, divided by size().
    if r == 0:
        hvd.join()
    else:
        got = hvd.allreduce(mine, name='round.join', op=hvd.Average)
        active = sum(base + k * k for k in range(1, n))
        check(got, torch.div(active, n, rounding_mode='trunc'), 'average with rank 0 joined')
        got = hvd.allreduce(xs.to(torch.float32) * r, name='round.join.f32', op=hvd.Average)
        check(got, sum(xs.to(torch.float32) * k for k in range(1, n)) / n,
              'float average with rank 0 joined')
        hvd.join()


def _model():
    torch.manual_seed(7)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))


def case_v021(n, r, hvd, hvd021):
    from torch_worker import check
    assert hvd021.size() == n and hvd021.rank() == r and hvd021.Sum is hvd.Sum
    assert hvd021.Trainer is hvd.Trainer  # lazy names resolve to pushpull.torch's
    # allgather: every rank's output gradient 2 * gathered; summed (0.21) or
    # averaged (pushpull.torch) over the ranks, this rank's rows kept.
    for mod, factor in ((hvd021, 2.0 * n), (hvd, 2.0)):
        v = torch.arange(r + 1, dtype=torch.float64, requires_grad=True)
        gathered = mod.allgather(v, name='ag.%s' % mod.__name__)
        (gathered * gathered).sum().backward()
        check(v.grad, factor * torch.arange(r + 1, dtype=torch.float64),
              '%s allgather gradient' % mod.__name__)
    # broadcast: the root gets the summed (0.21) or averaged gradient, others zeros.
    for mod, total in ((hvd021, 3.0 * n), (hvd, 3.0)):
        b = torch.full((2,), float(r), requires_grad=True)
        (mod.broadcast(b, root_rank=0, name='bc.%s' % mod.__name__) * 3).sum().backward()
        check(b.grad, torch.full((2,), total if r == 0 else 0.0), '%s broadcast gradient'
              % mod.__name__)
    # alltoall with splits: rank r sends r + 1 rows to each rank, valued with
    # the destination; 0.21 returns the tensor alone, pushpull.torch the pair.
    x = torch.cat([torch.full((r + 1, 2), float(k)) for k in range(n)])
    splits = torch.tensor([r + 1] * n, dtype=torch.int32)
    want = torch.full((sum(k + 1 for k in range(n)), 2), float(r))
    out = hvd021.alltoall(x, splits, name='a2a.021')
    check(out, want, 'horovod_0_21.alltoall')
    check(hvd021.synchronize(hvd021.alltoall_async(x, splits, name='a2a.021.async')), want,
          'horovod_0_21.alltoall_async')
    out, received = hvd.alltoall(x, splits, name='a2a.new')
    check(out, want, 'pushpull.torch.alltoall')
    check(received, torch.arange(1, n + 1, dtype=torch.int32), 'received splits')
    xg = x.clone().requires_grad_()
    got = hvd021.alltoall(xg, splits, name='a2a.021.grad')
    got.backward(torch.ones_like(got))
    check(xg.grad, torch.ones_like(x), 'horovod_0_21.alltoall gradient')
    # DistributedOptimizer: zero gradients from the start (0.21); None with
    # pushpull.torch until a backward pass reaches the parameter.
    gen, disc = _model(), _model()
    opt = hvd021.DistributedOptimizer(torch.optim.SGD(gen.parameters(), lr=0.1),
                                      named_parameters=gen.named_parameters())
    for p in gen.parameters():
        check(p.grad, torch.zeros_like(p), 'zero gradient at wrap')
    hvd.DistributedOptimizer(torch.optim.SGD(disc.parameters(), lr=0.1),
                             named_parameters=[('d.' + k, p) for k, p in disc.named_parameters()])
    if any(p.grad is not None for p in disc.parameters()):
        raise AssertionError('pushpull.torch.DistributedOptimizer made gradients')
    # Only the first layer trains: the frozen second keeps its zero gradient
    # (its weights, the same on every rank, stay), and the first layer's
    # gradient, W2^T (r + 1) on rank r, is averaged: W2^T (n + 1) / 2.
    gen[1].requires_grad_(False)
    opt.zero_grad()
    gen(torch.full((1, 3), float(r + 1))).sum().backward()
    opt.step()
    for p in gen[1].parameters():
        check(p.grad, torch.zeros_like(p), 'frozen layer keeps a zero gradient')
    w2 = gen[1].weight.detach()
    check(gen[0].weight.grad, w2.t().mm(torch.ones(1, 3)) * (n + 1) / 2.0, 'averaged gradient',
          1e-6)
    hvd.barrier()


def case_reinit(n, r, hvd, _):
    import os
    from torch_worker import check
    names = {k: os.environ.get(k) for k in ('HOROVOD_RANK', 'HOROVOD_SIZE',
                                            'HOROVOD_LOCAL_RANK', 'HOROVOD_LOCAL_SIZE')}
    want = {'HOROVOD_RANK': str(r), 'HOROVOD_SIZE': str(n),
            'HOROVOD_LOCAL_RANK': str(hvd.local_rank()),
            'HOROVOD_LOCAL_SIZE': str(hvd.local_size())}
    if names != want:
        raise AssertionError('launcher set %r, want %r' % (names, want))
    check(hvd.allreduce(torch.ones(3), name='before', op=hvd.Sum), torch.full((3,), float(n)),
          'before shutdown')
    hvd.shutdown()
    if hvd.is_initialized():
        raise AssertionError('is_initialized() after shutdown()')
    hvd.init()
    if not hvd.is_initialized() or (hvd.rank(), hvd.size()) != (r, n):
        raise AssertionError('init() again: rank %d of %d' % (hvd.rank(), hvd.size()))
    check(hvd.allreduce(torch.full((3,), float(r)), name='after', op=hvd.Sum),
          torch.full((3,), float(n * (n - 1) // 2)), 'after init() again')


CASES = {'rounding': case_rounding, 'v021': case_v021, 'reinit': case_reinit}


def main():
    import pushpull.torch as hvd
    import pushpull.torch.horovod_0_21 as hvd021
    case = sys.argv[1]
    torch.set_num_threads(1)
    hvd.init()
    n, r = hvd.size(), hvd.rank()
    CASES[case](n, r, hvd, hvd021)
    print('PASS %s rank %d of %d' % (case, r, n), flush=True)
    hvd.shutdown()


if __name__ == '__main__':
    main()

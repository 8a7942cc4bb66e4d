"""Horovod behaviours that its own test suite checks (scripts/horovod_suite.py runs
that suite; these cases cover the same behaviours without it). The file is
both the pytest module and, run as a script under `pushpull launch -s 0`, the
worker:

    build/bin/pushpull launch -n 3 -s 0 /usr/bin/python3 python/tests/test_hvd_compat.py names

Each case prints "PASS <case> rank <r> of <n>"; any mismatch raises.
"""

import sys
import time
import warnings

import pytest
import torch

# ---- the pytest side ----------------------------------------------------------------


def run_case(case, n, timeout=120):
    import torch_launch
    torch_launch.run_case(case, n, timeout, script=__file__, no_traceback=True)


@pytest.mark.parametrize('n', [2, 3])
def test_duplicate_pending_name_raises_on_every_rank(n):
    # Every rank submits a name twice while the first is pending, the handle
    # of the first dropped: ValueError on every rank, at once (no rank blocks
    # dropping a handle); join() then settles the first ops and the group goes
    # on.
    run_case('names', n)


@pytest.mark.parametrize('n', [2, 3])
def test_optimizer_sparse_groups_process_set_and_state(n):
    # SparseAdam with sparse_as_dense (sparse gradients reach it), groups /
    # num_groups (same result as without, bad groups refused), an optimizer
    # outside its process set is local, broadcast_optimizer_state gives zero
    # gradients to an optimizer without state.
    run_case('optimizer', n)


@pytest.mark.parametrize('n', [2, 3])
def test_hvd028_reducescatter_scalar_barriers_and_names(n):
    # What Horovod 0.28's suite (Intel's copy) adds: a 0-d tensor refused by
    # reducescatter and grouped_reducescatter on every rank (the job goes on);
    # barrier(process_set) waits for the set's members only; a barrier with
    # other collectives in flight; unique optimizer names without
    # named_parameters, the same on every rank; sycl_built() is False.
    run_case('hvd028', n)


# ---- the worker side ----------------------------------------------------------------


def case_names(n, r, hvd):
    from hvd_worker import quickly
    # For each rank k in turn, k submits each name twice before the others
    # submit it (so it is surely still pending there, whatever the timing):
    # ValueError on k at once; then the others submit it and the op completes
    # (its dropped handles were parked, not waited for).
    x = torch.full((4,), float(r + 1))
    for k in range(n):
        ops = (lambda: hvd.allreduce_async(x, name='same.%d' % k, op=hvd.Sum),
               lambda: hvd.allgather_async(x, name='same.ag.%d' % k),
               lambda: hvd.broadcast_async(x, 0, name='same.bc.%d' % k))
        if r == k:
            for submit in ops:
                submit()  # the handle is dropped at once: the op stays pending
                quickly(submit, ValueError, 'same')
        hvd.barrier()
        if r != k:
            for submit in ops:
                submit()
    last = hvd.join()
    if last not in range(n):
        raise AssertionError('join returned %r' % last)
    got = hvd.allreduce(torch.ones(2), op=hvd.Sum, name='after.same')
    if not torch.equal(got, torch.full((2,), float(n))):
        raise AssertionError('after the duplicates: %s' % got)
    # Dropping the handle of an op the others have not submitted yet returns
    # at once; the op still completes (rank 1 waits for it), and its name is
    # taken until then.
    late = torch.ones(1 << 16)
    if r == 0:
        t0 = time.time()
        hvd.allreduce_async(late, name='late', op=hvd.Sum)
        if time.time() - t0 > 0.5:
            raise AssertionError('dropping a pending handle blocked')
        quickly(lambda: hvd.allreduce_async(late, name='late', op=hvd.Sum), ValueError,
                "'late' is still pending")
    else:
        time.sleep(1.0)
        got = hvd.synchronize(hvd.allreduce_async(late, name='late', op=hvd.Sum))
        if not torch.equal(got, torch.full((1 << 16,), float(n))):
            raise AssertionError('the dropped op did not complete: %s' % got[:3])
    hvd.barrier()


def _local_grads(model, r):
    model.zero_grad()
    (model(torch.full((1, 3), float(r + 1))) ** 2).sum().backward()
    return [p.grad.clone() for p in model.parameters()]


def case_optimizer(n, r, hvd):
    from torch_worker import check, expect_error

    # broadcast_optimizer_state of an optimizer without state: zero gradients
    # on the parameters that require grad, sparse ones for SparseAdam.
    lin = torch.nn.Linear(2, 2)
    frozen = torch.nn.Parameter(torch.ones(2), requires_grad=False)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(list(lin.parameters()) + [frozen], lr=0.1))
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    if frozen.grad is not None or any(not torch.equal(p.grad, torch.zeros_like(p))
                                      for p in lin.parameters()):
        raise AssertionError('zero gradients after broadcast_optimizer_state')
    emb = torch.nn.Embedding(4, 2, sparse=True)
    hvd.broadcast_optimizer_state(torch.optim.SparseAdam(list(emb.parameters())), 0)
    if not emb.weight.grad.is_sparse:
        raise AssertionError('SparseAdam needs a sparse zero gradient')

    # SparseAdam: sparse gradients reach it with and without sparse_as_dense,
    # averaged (every rank ends with the same weights).
    for dense in (False, True):
        torch.manual_seed(3)
        emb = torch.nn.Embedding(6, 2, sparse=True)
        sopt = hvd.DistributedOptimizer(torch.optim.SparseAdam(list(emb.parameters()), lr=0.1),
                                        sparse_as_dense=dense)
        (emb(torch.tensor([r, r + 1])) * (r + 1)).sum().backward()
        sopt.synchronize()
        if not emb.weight.grad.is_sparse:
            raise AssertionError('sparse_as_dense=%s: a dense gradient for SparseAdam' % dense)
        want = torch.zeros(6, 2)
        for k in range(n):
            want[k] += (k + 1) / n
            want[k + 1] += (k + 1) / n
        check(emb.weight.grad.to_dense(), want, 'averaged sparse gradient', 1e-6)
        with sopt.skip_synchronize():
            sopt.step()
        every = hvd.allgather(emb.weight.detach().reshape(1, -1).clone())
        check(every[r], every[0], 'SparseAdam weights equal on every rank')

    # groups (a count, or lists of parameters) and num_groups: the same
    # averaged gradients as without groups.
    def model():
        torch.manual_seed(5)
        return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    ref = model()
    want = [hvd.allreduce(g, name='ref.%d' % i) for i, g in enumerate(_local_grads(ref, r))]
    layouts = [dict(groups=2), dict(groups=10), dict(num_groups=3)]
    m = model()
    layouts.append(dict(groups=[[m[0].weight, m[1].weight], [m[0].bias]]))
    for k, layout in enumerate(layouts):
        net = m if 'groups' in layout and isinstance(layout['groups'], list) else model()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter('always')
            gopt = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1),
                                            named_parameters=[('g%d.%s' % (k, name), p) for
                                                              name, p in net.named_parameters()],
                                            **layout)
        if 'num_groups' in layout and not any('num_groups' in str(w.message) for w in caught):
            raise AssertionError('num_groups: no deprecation warning')
        _local_grads(net, r)
        gopt.synchronize()
        for i, p in enumerate(net.parameters()):
            check(p.grad, want[i], 'grouped %r: parameter %d' % (layout, i), 1e-6)
        with gopt.skip_synchronize():
            gopt.step()
    sgd = lambda: torch.optim.SGD(ref.parameters(), lr=0.1)
    expect_error(lambda: hvd.DistributedOptimizer(sgd(), groups=-1), ValueError, '>= 0')
    expect_error(lambda: hvd.DistributedOptimizer(sgd(), groups=[[ref[0].weight],
                                                                 [ref[0].weight]]),
                 ValueError, 'two groups')
    expect_error(lambda: hvd.DistributedOptimizer(sgd(), groups=[[torch.ones(1)]]), ValueError,
                 'not a parameter')
    expect_error(lambda: hvd.DistributedOptimizer(sgd(), groups='all'), ValueError, 'groups')

    # An optimizer of a process set: averaged over the members; on the other
    # ranks a plain local optimizer (no communication, its own gradient).
    evens = hvd.add_process_set([k for k in range(n) if k % 2 == 0])
    odds = hvd.add_process_set([k for k in range(n) if k % 2 == 1])
    net = model()
    popt = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1),
                                    named_parameters=net.named_parameters(), process_set=evens)
    mine = _local_grads(net, r)
    popt.synchronize()
    for i, p in enumerate(net.parameters()):
        if r % 2 == 0:
            total = hvd.allreduce(mine[i], name='even.%d' % i, process_set=evens)
            check(p.grad, total, 'process-set optimizer, member', 1e-6)
        else:
            check(p.grad, mine[i], 'process-set optimizer, non-member', 0.0)
    hvd.remove_process_set(odds)
    hvd.remove_process_set(evens)


def _wait_for(path, what, deadline=30.0):
    import os
    t0 = time.time()
    while not os.path.exists(path):
        if time.time() - t0 > deadline:
            raise AssertionError('%s: %s never appeared' % (what, path))
        time.sleep(0.01)


def case_hvd028(n, r, hvd):
    import os
    import tempfile
    from torch_worker import check, expect_error

    # A scalar has no first dimension to scatter: refused on every rank, and
    # the group goes on.
    for fn in (lambda: hvd.reducescatter(torch.tensor(float(r)), op=hvd.Average),
               lambda: hvd.grouped_reducescatter([torch.zeros(3, 1), torch.tensor(1.0)])):
        expect_error(fn, ValueError, 'scalar')
    check(hvd.reducescatter(torch.ones(2 * n, 2), op=hvd.Sum), torch.full((2, 2), float(n)),
          'reducescatter after the refusals')

    # barrier(process_set): rank 1 (the odd set) leaves its barrier without
    # rank 0, which only enters the even set's barrier once rank 1 has said so
    # (a barrier that needed rank 0 would never see that file); the even set's
    # others leave theirs only after rank 0 entered it.
    folder = hvd.broadcast_object(tempfile.mkdtemp(prefix='pp-hvd028-') if r == 0 else None, 0)
    evens = hvd.add_process_set([k for k in range(n) if k % 2 == 0])
    odds = hvd.add_process_set([k for k in range(n) if k % 2 == 1])
    odd_done, zero_in = os.path.join(folder, 'odd_done'), os.path.join(folder, 'zero_in')
    if r % 2 == 1:
        hvd.barrier(odds)
        if r == 1:
            open(odd_done, 'w').close()
    else:
        if r == 0:
            _wait_for(odd_done, 'the odd set left its barrier without rank 0')
            open(zero_in, 'w').close()
        hvd.barrier(evens)
        if not os.path.exists(zero_in):
            raise AssertionError('left the even set barrier before rank 0 entered it')
    hvd.barrier()
    if r == 0:
        for f in (odd_done, zero_in):
            os.remove(f)
        os.rmdir(folder)
    hvd.remove_process_set(odds)
    hvd.remove_process_set(evens)

    # A handle dropped without synchronize holds its name DROP_HOLD seconds
    # after the drop even when its op completed first (before, the rank whose
    # op completed between its submission and the drop could submit the name
    # again: Horovod's duplicate-name tests failed on it now and then); a
    # synchronized handle frees its name at once.
    from pushpull.torch import ops as hvd_ops
    x = torch.full((3,), float(r + 1))
    h = hvd.allreduce_async(x, name='held', op=hvd.Sum)
    t0 = time.time()
    while not hvd.poll(h):
        if time.time() - t0 > 30:
            raise AssertionError('the held allreduce never completed')
        time.sleep(0.001)
    del h
    expect_error(lambda: hvd.allreduce_async(x, name='held', op=hvd.Sum), ValueError,
                 "'held'", 'dropped without synchronize')
    time.sleep(hvd_ops.DROP_HOLD + 0.1)
    total = torch.full((3,), n * (n + 1) / 2)
    check(hvd.allreduce(x, name='held', op=hvd.Sum), total, 'the held name, after the hold')
    h = hvd.allreduce_async(x, name='freed', op=hvd.Sum)
    hvd.synchronize(h)
    del h
    check(hvd.allreduce(x, name='freed', op=hvd.Sum), total, 'a synchronized name, reused')

    # A barrier while other collectives are in flight; they complete.
    handles = [hvd.broadcast_async(torch.eye(3) * r, root_rank=0),
               hvd.allgather_async(torch.full((1, 2), float(r))),
               hvd.allreduce_async(torch.eye(2) * (r + 1), op=hvd.Sum)]
    hvd.barrier()
    check(hvd.synchronize(handles[2]), torch.eye(2) * (n * (n + 1) / 2), 'allreduce')
    check(hvd.synchronize(handles[1])[:, 0], torch.arange(n, dtype=torch.float32), 'allgather')
    check(hvd.synchronize(handles[0]), torch.zeros(3, 3), 'broadcast')

    # Without named_parameters, every parameter of every group gets its own
    # name, the same on every rank.
    net = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 3))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(
        [{'params': net[0].parameters()}, {'params': net[1].parameters()}], lr=0.1))
    names = opt._parameter_names
    if len(names) != 4 or len(set(names.values())) != 4:
        raise AssertionError('optimizer names: %r' % list(names.values()))
    every = hvd.allgather_object(sorted(names.values()))
    if any(got != every[0] for got in every):
        raise AssertionError('optimizer names differ across ranks: %r' % every)
    if hvd.sycl_built() is not False:
        raise AssertionError('sycl_built')


CASES = {'names': case_names, 'optimizer': case_optimizer, 'hvd028': case_hvd028}


def main():
    import pushpull.torch as hvd
    case = sys.argv[1]
    torch.set_num_threads(1)
    hvd.init()
    n, r = hvd.size(), hvd.rank()
    CASES[case](n, r, hvd)
    print('PASS %s rank %d of %d' % (case, r, n), flush=True)
    hvd.shutdown()


if __name__ == '__main__':
    main()

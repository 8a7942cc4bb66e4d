"""The Horovod-compatibility worker's cases of reducescatter, grouped ops,
alltoall, process sets and the DistributedOptimizer (hvd_worker.py runs
them by name under `pushpull launch -s 0`).
"""

import warnings

import torch

import pushpull
import pushpull.torch as hvd
from hvd_checks import quickly
from torch_worker import check, data, expect_error


# ---- reducescatter, grouped ops, alltoall ---------------------------------------------


def case_ops(n, r):
    # reducescatter: average (default), async, pre/postscale, grouped, autograd.
    xs = [data(k, (2 * n + 1, 3), torch.float64, 6) for k in range(n)]
    total = torch.stack(xs).sum(0)
    rows = [3 if k == 0 else 2 for k in range(n)]
    start = sum(rows[:r])
    part = total[start:start + rows[r]]
    check(hvd.reducescatter(xs[r]), part / n, 'reducescatter average', 1e-12)
    h = hvd.reducescatter_async(xs[r], name='o.rs.async', op=hvd.Sum, prescale_factor=2.0,
                                postscale_factor=0.25)
    check(hvd.synchronize(h), part * 0.5, 'reducescatter_async scaled', 1e-12)
    g = hvd.grouped_reducescatter([xs[r], xs[r][:n]], op=hvd.Sum)
    check(g[0], part, 'grouped_reducescatter 0', 1e-12)
    check(g[1], total[r:r + 1], 'grouped_reducescatter 1', 1e-12)
    h = hvd.grouped_reducescatter_async([xs[r]], op=hvd.Sum)
    check(hvd.synchronize(h)[0], part, 'grouped_reducescatter_async', 1e-12)
    # autograd, Horovod's convention: the gathered output gradients (rank k's
    # rows get rank k's), times size() for Sum, times 1 for Average, times the
    # scale factors.
    owner = torch.cat([torch.full((rows[k], 3), float(k + 1)) for k in range(n)]).double()
    for op, name, want in ((hvd.Average, 'avg', owner), (hvd.Sum, 'sum', owner * n)):
        w = xs[r].clone().requires_grad_()
        out = hvd.reducescatter(w, op=op, name='o.rs.grad.' + name)
        (out * (r + 1)).sum().backward()
        check(w.grad, want, 'reducescatter %s gradient' % name, 1e-12)
    w = xs[r].clone().requires_grad_()
    out = hvd.reducescatter(w, op=hvd.Sum, name='o.rs.grad.scaled', prescale_factor=0.5,
                            postscale_factor=3.0)
    (out * (r + 1)).sum().backward()
    check(w.grad, owner * n * 1.5, 'reducescatter scaled gradient', 1e-12)
    ws = [xs[r].clone().requires_grad_() for _ in range(2)]
    outs = hvd.grouped_reducescatter(ws, op=hvd.Sum, name='o.grs.grad')
    sum((o * (r + 1)).sum() for o in outs).backward()
    for k, w in enumerate(ws):
        check(w.grad, owner * n, 'grouped_reducescatter gradient %d' % k, 1e-12)

    # grouped allreduce: in place (the same tensors come back), async forms.
    ts = [torch.full((k + 2,), float(r + 1)) for k in range(3)]
    same = hvd.grouped_allreduce_(ts, op=hvd.Sum, name='o.gar_')
    if any(a is not b for a, b in zip(same, ts)):
        raise AssertionError('grouped_allreduce_ must return its tensors')
    for k, t in enumerate(ts):
        check(t, torch.full((k + 2,), float(n * (n + 1) // 2)), 'grouped_allreduce_ %d' % k)
    ts = [torch.full((2,), float(r))]
    h = hvd.grouped_allreduce_async_(ts, op=hvd.Max)
    if hvd.synchronize(h)[0] is not ts[0]:
        raise AssertionError('grouped_allreduce_async_ must return its tensors')
    check(ts[0], torch.full((2,), float(n - 1)), 'grouped_allreduce_async_')
    outs = hvd.synchronize(hvd.grouped_allreduce_async([torch.ones(3), torch.ones(1)]))
    check(outs[1], torch.ones(1), 'grouped_allreduce_async average')
    outs = hvd.grouped_allreduce([torch.ones(2) * r, torch.ones(2)], op=hvd.Sum,
                                 postscale_factor=2.0)
    check(outs[0], torch.full((2,), float(n * (n - 1))), 'grouped_allreduce postscale')

    # grouped allgather.
    parts = hvd.grouped_allgather([torch.full((r + 1,), float(r)), torch.full((1, 2), r)])
    check(parts[0], torch.cat([torch.full((k + 1,), float(k)) for k in range(n)]),
          'grouped_allgather 0')
    check(parts[1], torch.cat([torch.full((1, 2), k) for k in range(n)]), 'grouped_allgather 1')
    parts = hvd.synchronize(hvd.grouped_allgather_async([torch.ones(1) * r]))
    check(parts[0], torch.arange(n).float(), 'grouped_allgather_async')

    # alltoall: explicit splits (rank r sends k + r rows to rank k), received splits.
    sends = [[k + src for k in range(n)] for src in range(n)]
    mine = torch.cat([torch.full((sends[r][k], 2), float(10 * r + k)) for k in range(n)])
    out, received = hvd.alltoall(mine, splits=sends[r], name='o.a2a')
    check(received, torch.tensor([sends[s][r] for s in range(n)], dtype=torch.int32),
          'alltoall received splits')
    check(out, torch.cat([torch.full((sends[s][r], 2), float(10 * s + r)) for s in range(n)]),
          'alltoall explicit splits')
    out, received = hvd.synchronize(hvd.alltoall_async(mine, torch.tensor(sends[r])))
    check(received, torch.tensor([sends[s][r] for s in range(n)], dtype=torch.int32),
          'alltoall_async received splits')
    # zero rows to some ranks.
    zero = [0] * n
    zero[(r + 1) % n] = 2
    out, received = hvd.alltoall(torch.full((2, 1), float(r)), splits=zero, name='o.a2a.zero')
    check(out, torch.full((2, 1), float((r - 1) % n)), 'alltoall with empty parts')
    # autograd: the gradient goes back to the rows' sources.
    w = mine.clone().requires_grad_()
    out, _ = hvd.alltoall(w, splits=sends[r], name='o.a2a.grad')
    (out * (r + 1)).sum().backward()
    want = torch.cat([torch.full((sends[r][k], 2), float(k + 1)) for k in range(n)])
    check(w.grad, want, 'alltoall gradient')
    # equal splits, differentiable: the tensor alone (as Horovod), gradient back.
    v = torch.full((2 * n, 1), float(r)).requires_grad_()
    out = hvd.alltoall(v, name='o.a2a.eq.grad')
    if not isinstance(out, torch.Tensor):
        raise AssertionError('alltoall without splits returned %r, not a tensor' % type(out))
    check(out.detach(), torch.cat([torch.full((2, 1), float(k)) for k in range(n)]),
          'alltoall equal splits')
    (out * 3).sum().backward()
    check(v.grad, torch.full((2 * n, 1), 3.0), 'alltoall equal splits gradient')
    # bad splits: ValueError at once on this rank, before anything is sent.
    quickly(lambda: hvd.alltoall(torch.ones(n + 1), name='o.bad'), ValueError, 'divisible')
    quickly(lambda: hvd.alltoall(torch.ones(3), splits=[1] * (n + 1)), ValueError, 'one per rank')
    quickly(lambda: hvd.alltoall(torch.ones(3), splits=[4] + [0] * (n - 2) + [-1]), ValueError,
            'negative')
    quickly(lambda: hvd.alltoall(torch.ones(3), splits=[4] + [0] * (n - 1)), ValueError, 'sum')
    quickly(lambda: hvd.alltoall(torch.tensor(1.0)), ValueError, 'dimension')
    check(hvd.allreduce(torch.ones(1), op=hvd.Sum, name='o.after'), torch.full((1,), float(n)),
          'usable after the errors')


# ---- process sets ----------------------------------------------------------------------


def case_process_sets(n, r):
    # n = 3: [0, 2], [1, 2], [0]; n = 2: every rank (the global set), [1], [0].
    first_last = hvd.add_process_set([0, n - 1]) if n > 2 else hvd.global_process_set
    tail = hvd.add_process_set(hvd.ProcessSet(range(1, n)))
    single = hvd.add_process_set([0])
    ids = [first_last.process_set_id, tail.process_set_id, single.process_set_id]
    if ids != ([1, 2, 3] if n > 2 else [0, 1, 2]):
        raise AssertionError('ids %r' % ids)
    quickly(lambda: hvd.add_process_set(range(n)), ValueError, 'already registered')
    if hvd.global_process_set.size() != n or hvd.global_process_set.rank() != r:
        raise AssertionError('global_process_set')
    if tail.included() != (r >= 1) or tail.rank() != (r - 1 if r >= 1 else -1):
        raise AssertionError('tail.included / rank')
    if tail.ranks != list(range(1, n)) or tail.size() != n - 1:
        raise AssertionError('tail.ranks / size')

    # Members only; the others are not blocked (rank 0 never calls tail's ops).
    if tail.included():
        x = torch.full((3,), float(r))
        want_sum = float(sum(range(1, n)))
        check(hvd.allreduce(x, op=hvd.Sum, process_set=tail), torch.full((3,), want_sum),
              'tail sum')
        check(hvd.allreduce(x, process_set=tail), torch.full((3,), want_sum / (n - 1)),
              'tail average divides by the set size', 1e-6)
        check(hvd.allgather(torch.full((r, 1), float(r)), process_set=tail),
              torch.cat([torch.full((k, 1), float(k)) for k in range(1, n)]), 'tail allgather')
        check(hvd.broadcast(x, n - 1, process_set=tail), torch.full((3,), float(n - 1)),
              'tail broadcast')
        m = n - 1
        rs = hvd.reducescatter(torch.ones(2 * m, 2), op=hvd.Sum, process_set=tail)
        check(rs, torch.full((2, 2), float(m)), 'tail reducescatter splits among members')
        out = hvd.alltoall(torch.full((m,), float(r)), process_set=tail)
        check(out, torch.arange(1, n).float(), 'tail alltoall')
        gs = hvd.grouped_allreduce([torch.ones(2), torch.ones(1)], op=hvd.Sum, process_set=tail)
        check(gs[0], torch.full((2,), float(m)), 'tail grouped')
        hvd.barrier(process_set=tail)
        obj = hvd.broadcast_object({'from': r}, root_rank=n - 1, process_set=tail)
        if obj != {'from': n - 1}:
            raise AssertionError('broadcast_object in a set: %r' % obj)
        if hvd.allgather_object(r, process_set=tail) != list(range(1, n)):
            raise AssertionError('allgather_object in a set')
        # The same name in two sets does not collide.
        check(hvd.allreduce(torch.ones(1), op=hvd.Sum, name='shared', process_set=tail),
              torch.full((1,), float(m)), 'name scoped to the set')
    if first_last.included():
        check(hvd.allreduce(torch.ones(1), op=hvd.Sum, name='shared', process_set=first_last),
              torch.full((1,), float(len(first_last.ranks))), 'same name, other set')
        model = torch.nn.Linear(2, 1)
        torch.manual_seed(r)
        torch.nn.init.normal_(model.weight)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0, process_set=first_last)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                       process_set=first_last)
        x = torch.full((1, 2), float(r + 1))
        model(x).sum().backward()
        opt.synchronize()
        mean_x = sum(k + 1.0 for k in first_last.ranks) / len(first_last.ranks)
        check(model.weight.grad, torch.full((1, 2), mean_x), 'optimizer averages over the set')
        with opt.skip_synchronize():
            opt.step()
        hvd.broadcast_optimizer_state(opt, root_rank=n - 1, process_set=first_last)
        got = hvd.allgather(model.weight.detach().clone(), process_set=first_last)
        check(got[0], got[-1], 'replicas equal in the set')
    if single.included():
        check(hvd.allreduce(torch.ones(2), op=hvd.Sum, process_set=single), torch.ones(2),
              'one-rank set')

    # Misuse: errors at once on the misusing rank, nothing sent.
    if not tail.included():
        quickly(lambda: hvd.allreduce(torch.ones(1), process_set=tail), ValueError,
                'not in')
        quickly(lambda: hvd.allgather(torch.ones(1), process_set=tail), ValueError, 'not in')
        quickly(lambda: hvd.barrier(process_set=tail), ValueError, 'not in')
        quickly(lambda: hvd.broadcast_object(1, 1, process_set=tail), ValueError, 'not in')
    else:
        quickly(lambda: hvd.broadcast(torch.ones(1), 0, process_set=tail), ValueError,
                'root 0 is not in')
    quickly(lambda: hvd.allreduce(torch.ones(1), process_set=hvd.ProcessSet([0])), ValueError,
            'not registered')
    quickly(lambda: hvd.add_process_set([0, n]), ValueError, 'not ranks')
    quickly(lambda: hvd.add_process_set(tail.ranks), ValueError, 'already registered')
    quickly(lambda: hvd.add_process_set(tail), ValueError, 'already registered')
    quickly(lambda: hvd.ProcessSet([]), ValueError, 'at least one')
    if hvd.remove_process_set(hvd.global_process_set):
        raise AssertionError('the global set cannot be removed')
    if not hvd.remove_process_set(single):
        raise AssertionError('remove_process_set')
    if single.process_set_id is not None:
        raise AssertionError('a removed set has no id')
    if r == 0:
        quickly(lambda: hvd.allreduce(torch.ones(1), process_set=single), ValueError,
                'not registered')
    again = hvd.add_process_set([0])
    if again.process_set_id != ids[2] + 1:
        raise AssertionError('ids are not reused: %r' % again)
    # Ranks that add different sets: ValueError on every rank.
    expect_error(lambda: hvd.add_process_set([r]), ValueError, 'different process sets')
    check(hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=hvd.global_process_set),
          torch.full((1,), float(n)), 'global set, explicitly')


# ---- optimizer, sparse, state, introspection -----------------------------------------


def case_optimizer(n, r):
    # broadcast_optimizer_state: parameters without gradient (None state), and
    # ranks whose state is empty.
    torch.manual_seed(r)
    used, unused = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    frozen = torch.nn.Parameter(torch.ones(2), requires_grad=False)
    params = list(used.parameters()) + list(unused.parameters()) + [frozen]
    opt = torch.optim.Adam(params, lr=0.01 * (r + 1))
    if r == 0:
        used(torch.ones(1, 3)).sum().backward()
        opt.step()
    hvd.broadcast_parameters(list(zip(['a', 'b', 'c', 'd', 'e'], params)), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    if opt.param_groups[0]['lr'] != 0.01:
        raise AssertionError('lr not broadcast')
    st = opt.state_dict()['state']
    if sorted(st) != [0, 1] or int(st[0]['step']) != 1:
        raise AssertionError('state not broadcast: %r' % sorted(st))
    got = hvd.allgather(st[0]['exp_avg'].reshape(1, -1).clone())
    check(got[0], got[-1], 'exp_avg equal on every rank')

    # The synchronize()-then-step() warning has Horovod's text.
    model = torch.nn.Linear(2, 1)
    dopt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                    named_parameters=model.named_parameters())
    model(torch.ones(1, 2)).sum().backward()
    dopt.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        dopt.step()
    if not any('optimizer.step() called without optimizer.skip_synchronize()' in str(w.message)
               for w in caught):
        raise AssertionError('warning text: %r' % [str(w.message) for w in caught])

    # Sparse gradients (nn.Embedding(sparse=True)): the allgather path and
    # sparse_as_dense give the same averaged update as dense gradients.
    for sparse_as_dense in (False, True):
        torch.manual_seed(7)
        emb = torch.nn.Embedding(6, 2, sparse=True)
        start = emb.weight.detach().clone()
        sopt = hvd.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=1.0),
                                        named_parameters=[('emb%d' % sparse_as_dense,
                                                           emb.weight)],
                                        sparse_as_dense=sparse_as_dense)
        idx = torch.tensor([r, r + 1, 0])
        (emb(idx) * (r + 1)).sum().backward()
        sopt.step()
        dense = torch.zeros(6, 2)
        for k in range(n):
            for i in (k, k + 1, 0):
                dense[i] += (k + 1)
        check(emb.weight.detach(), start - dense / n, 'sparse update, sparse_as_dense=%s'
              % sparse_as_dense, 1e-6)

    sp = torch.sparse_coo_tensor([[r, 5]], [1.0, float(r)], (6,))
    h = hvd.sparse_allreduce_async(sp, name='sparse.sum', op=hvd.Sum)
    want = torch.zeros(6)
    for k in range(n):
        want[k] += 1
        want[5] += k
    check(h().to_dense(), want, 'sparse_allreduce_async sum (handle called)')
    h = hvd.sparse_allreduce_async(sp, name='sparse.avg', op=hvd.Average)
    check(hvd.synchronize(h).to_dense(), want / n, 'sparse average (synchronize)', 1e-6)
    expect_error(lambda: hvd.sparse_allreduce_async(torch.ones(2), name='x', op=hvd.Sum),
                 ValueError, 'sparse')
    expect_error(lambda: hvd.allreduce(sp), ValueError, 'sparse')

    # Adasum: a clear refusal everywhere a reduction is requested.
    for fn in (lambda: hvd.allreduce(torch.ones(1), op=hvd.Adasum),
               lambda: hvd.grouped_allreduce([torch.ones(1)], op=hvd.Adasum),
               lambda: hvd.reducescatter(torch.ones(n), op=hvd.Adasum),
               lambda: hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                                op=hvd.Adasum)):
        quickly(fn, ValueError, 'Adasum')

    # Introspection and Horovod's names.
    facts = (hvd.mpi_built(), hvd.mpi_enabled(), hvd.gloo_built(), hvd.gloo_enabled(),
             hvd.nccl_built(), hvd.ddl_built(), hvd.ccl_built(), hvd.cuda_built(),
             hvd.rocm_built(), hvd.mpi_threads_supported(), hvd.sycl_built())
    if any(facts):
        raise AssertionError('build facts: %r' % (facts,))
    if not issubclass(hvd.HorovodInternalError, pushpull.Error) or not issubclass(
            hvd.HorovodInternalError, RuntimeError):
        raise AssertionError('HorovodInternalError')
    expect_error(lambda: hvd.start_timeline('/tmp/x.json'), ValueError, 'PUSHPULL_TIMELINE')
    expect_error(lambda: hvd.SyncBatchNorm(4), ValueError, 'CUDA')
    expect_error(lambda: hvd.init(comm=[0, 1]), ValueError, 'comm=')
    if hvd.is_initialized() is not True or hvd.cross_size() < 1:
        raise AssertionError('is_initialized / cross_size')



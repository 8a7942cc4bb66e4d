"""One rank of the Horovod-compatibility suites (test_hvd_*.py), run under
`pushpull launch -s 0` as torch_worker.py is:

    build/bin/pushpull launch -n 3 -s 0 /usr/bin/python3 python/tests/hvd_worker.py dtypes

Each rank's input is a function of its rank, so every rank computes every
expected result locally with plain torch. A case prints "PASS <case> rank <r>
of <n>"; any mismatch raises, which fails the job.
"""

import sys
import time
import warnings

import torch
import torch.nn.functional as F

import pushpull
import pushpull.torch as hvd
from torch_worker import check, data, expect_error

# Horovod's CPU dtypes.
ALL_DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
              torch.bfloat16, torch.float32, torch.float64, torch.bool]


def tol(dtype, n):
    return {torch.float16: 0.02 * n, torch.bfloat16: 0.05 * n, torch.float32: 1e-5,
            torch.float64: 1e-12}.get(dtype, 0.0)


def inputs_of(n, shape, dtype, salt):
    if dtype == torch.bool:
        return [data(k, shape, torch.int32, salt) % 2 == 1 for k in range(n)]
    return [data(k, shape, dtype, salt) for k in range(n)]


def reduce_ref(op, xs, n):
    """Horovod's results: Average = sum / n in float, cast back; an integer
    average truncates toward zero, as Horovod's C++ and its 0.28 suite."""
    dtype = xs[0].dtype
    st = torch.stack([x.double() for x in xs])
    if op == 'sum':
        r = st.sum(0) if dtype != torch.bool else st.max(0).values
    elif op == 'average':
        r = st.sum(0) / n
        if not dtype.is_floating_point:
            r = r.trunc()
    elif op == 'min':
        r = st.min(0).values
    elif op == 'max':
        r = st.max(0).values
    else:
        r = st.prod(0) if dtype != torch.bool else st.min(0).values
    return r.to(dtype)


def quickly(fn, cls, *needles):
    """The error comes at once on the misusing rank (generous bound: a shared machine)."""
    t0 = time.time()
    msg = expect_error(fn, cls, *needles)
    if time.time() - t0 > 2.0:
        raise AssertionError('the error took %.2f s' % (time.time() - t0))
    return msg


# ---- hangs that are errors now ------------------------------------------------


def case_duplicate_names(n, r):
    x = torch.full((4,), float(r + 1))
    total = float(sum(range(1, n + 1)))
    # Rank 0 submits each name twice while the first is pending: ValueError at
    # once on rank 0; the other ranks carry on and every first op completes.
    if r == 0:
        ops = [('allreduce', lambda: hvd.allreduce_async(x, name='dup.ar', op=hvd.Sum)),
               ('allgather', lambda: hvd.allgather_async(x, name='dup.ag')),
               ('broadcast', lambda: hvd.broadcast_async(x, 0, name='dup.bc'))]
        handles = []
        for kind, submit in ops:
            handles.append(submit())
            quickly(submit, ValueError, "'dup.")
        ar, ag, bc = (hvd.synchronize(h) for h in handles)
    else:
        time.sleep(0.3)  # rank 0's duplicates happen while its ops are pending
        ar = hvd.allreduce(x, name='dup.ar', op=hvd.Sum)
        ag = hvd.allgather(x, name='dup.ag')
        bc = hvd.broadcast(x, 0, name='dup.bc')
    check(ar, torch.full((4,), total), 'allreduce after a duplicate')
    check(ag, torch.cat([torch.full((4,), float(k + 1)) for k in range(n)]), 'allgather')
    check(bc, torch.full((4,), 1.0), 'broadcast')
    # The name is free again once its op completed.
    check(hvd.allreduce(x, name='dup.ar', op=hvd.Sum), torch.full((4,), total), 'reused name')


def case_join(n, r):
    """Rank r has r + 1 batches: joined ranks contribute zeros (Average still
    divides by size()); allgather, alltoall and broadcast fail while a rank is
    joined (as Horovod); join returns the last rank."""
    batches = r + 1
    for step in range(n):
        if step >= batches:
            break
        active = [k for k in range(n) if k + 1 > step]
        x = torch.full((3,), float(r + 1))
        check(hvd.allreduce(x, name='j.avg.%d' % step), torch.full((3,), sum(
            k + 1 for k in active) / n), 'average with joined ranks at step %d' % step, 1e-6)
        check(hvd.allreduce(x.to(torch.int32) * 2, op=hvd.Sum, name='j.sum.%d' % step),
              torch.full((3,), 2 * sum(k + 1 for k in active), dtype=torch.int32), 'int sum')
        check(hvd.allreduce(x, op=hvd.Max, name='j.max.%d' % step),
              torch.full((3,), float(max(active) + 1)), 'max')
        rs = hvd.reducescatter(torch.ones(n, 2), op=hvd.Sum, name='j.rs.%d' % step)
        check(rs, torch.full((1, 2), float(len(active))), 'reducescatter')
        # As Horovod: allgather, alltoall and broadcast (even from a rank still
        # there) fail on every rank that submitted them once a rank joined.
        gather = lambda: hvd.allgather(torch.full((r + 1, 2), float(r)), name='j.ag.%d' % step)
        bcast = lambda: hvd.broadcast(torch.full((2,), float(r)), n - 1, name='j.bc.%d' % step)
        a2a = lambda: hvd.alltoall(torch.full((n, 2), float(r)), name='j.a2a.%d' % step)
        if len(active) == n:
            check(gather(), torch.cat([torch.full((k + 1, 2), float(k)) for k in active]),
                  'allgather')
            check(bcast(), torch.full((2,), float(n - 1)), 'broadcast')
            check(a2a(), torch.tensor([[float(k)] * 2 for k in range(n)]), 'alltoall')
        else:
            quickly(gather, RuntimeError, 'joined', 'allgather')
            quickly(bcast, RuntimeError, 'joined', 'broadcast')
            quickly(a2a, RuntimeError, 'joined')
    last = hvd.join()
    if last != n - 1:
        raise AssertionError('join() returned %r, but rank %d joined last' % (last, n - 1))
    check(hvd.allreduce(torch.ones(2), op=hvd.Sum, name='j.after'), torch.full((2,), float(n)),
          'after join')
    # A broadcast whose root joined fails on every rank (no data to send).
    if r == 0:
        hvd.join()
    else:
        expect_error(lambda: hvd.broadcast(torch.ones(2), 0, name='j.rootgone'), ValueError,
                     'joined')
        hvd.join()


# ---- dtypes and scaling ---------------------------------------------------------------


def case_dtypes(n, r):
    for dtype in ALL_DTYPES:
        shape = (3, 4)
        ops = [('sum', hvd.Sum), ('min', hvd.Min), ('max', hvd.Max), ('product', hvd.Product)]
        if dtype != torch.bool:
            ops.append(('average', hvd.Average))
        for opname, op in ops:
            xs = inputs_of(n, shape, dtype, 1)
            if opname == 'product' and dtype != torch.bool:
                xs = [torch.minimum(x, torch.full_like(x, 3)) for x in xs]  # no int8 overflow
            want = reduce_ref(opname, xs, n)
            what = 'allreduce %s %s' % (opname, dtype)
            mine = xs[r].clone()
            check(hvd.allreduce(mine, op=op, name='d.ar.%s.%s' % (opname, dtype)), want, what,
                  tol(dtype, n))
            check(mine, xs[r], what + ' leaves its input alone')
            hvd.allreduce_(mine, op=op, name='d.ar_.%s.%s' % (opname, dtype))
            check(mine, want, what + ' in place', tol(dtype, n))
        var = [x[:k + 1] for k, x in enumerate(inputs_of(n, (n, 2), dtype, 2))]
        check(hvd.allgather(var[r], name='d.ag.%s' % dtype), torch.cat(var),
              'allgather %s' % dtype)
        b = inputs_of(n, (5,), dtype, 3)
        check(hvd.broadcast(b[r], n - 1, name='d.bc.%s' % dtype), b[n - 1], 'broadcast %s' % dtype)
        a = inputs_of(n, (2 * n, 2), dtype, 4)
        # As Horovod: without splits alltoall returns the tensor alone; the
        # handle of alltoall_async gives (output, received_splits) either way.
        out = hvd.alltoall(a[r], name='d.a2a.%s' % dtype)
        check(out, torch.cat([a[k][2 * r:2 * r + 2] for k in range(n)]), 'alltoall %s' % dtype)
        out, received = hvd.synchronize(hvd.alltoall_async(a[r], name='d.a2a2.%s' % dtype))
        check(out, torch.cat([a[k][2 * r:2 * r + 2] for k in range(n)]), 'alltoall_async')
        check(received, torch.full((n,), 2, dtype=torch.int32), 'alltoall received splits')
        rs = inputs_of(n, (n + 1, 2), dtype, 5)
        rows = [2 if k == 0 else 1 for k in range(n)]  # the first rank gets the extra row
        start = sum(rows[:r])
        check(hvd.reducescatter(rs[r], op=hvd.Sum, name='d.rs.%s' % dtype),
              reduce_ref('sum', rs, n)[start:start + rows[r]], 'reducescatter %s' % dtype)

    # prescale / postscale: integers are scaled in float and cast back (truncating).
    for dtype in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64):
        xs = [torch.tensor([3, 5, 7], dtype=dtype) + k for k in range(n)]
        pre = [(x.double() * 0.5).to(dtype) for x in xs]
        want = (torch.stack([p.double() for p in pre]).sum(0) * 1.5).to(dtype)
        check(hvd.allreduce(xs[r], op=hvd.Sum, prescale_factor=0.5, postscale_factor=1.5,
                            name='d.scale.%s' % dtype), want, 'scaled allreduce %s' % dtype)
        mine = xs[r].clone()
        hvd.allreduce_(mine, op=hvd.Sum, prescale_factor=0.5, postscale_factor=1.5)
        check(mine, want, 'scaled allreduce_ %s' % dtype)
        avg = (torch.stack([x.double() for x in xs]).sum(0) / n * 2).to(dtype)
        check(hvd.allreduce(xs[r], postscale_factor=2.0), avg, 'scaled average %s' % dtype)
    x = torch.tensor([1.0, 2.0], dtype=torch.float16)
    check(hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=4.0),
          torch.tensor([2.0 * n, 4.0 * n], dtype=torch.float16), 'scaled float16')
    expect_error(lambda: hvd.allreduce(torch.ones(2, dtype=torch.bool), op=hvd.Sum,
                                       prescale_factor=2.0), ValueError, 'bool')
    expect_error(lambda: hvd.allreduce(torch.ones(2, dtype=torch.complex64)), ValueError,
                 'complex64')


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


def case_init_process_sets(n, r):
    """hvd.init(process_sets=[...]) registers them in order (ids 1, 2)."""
    first, rest = INIT_SETS
    if (first.process_set_id, rest.process_set_id) != (1, 2):
        raise AssertionError('ids %r' % [first, rest])
    ps = first if first.included() else rest
    check(hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=ps),
          torch.full((1,), float(ps.size())), 'a set from init()')
    # Every rank relays the other sets' ops: meet before leaving.
    hvd.barrier()


INIT_SETS = []

# ---- a sparse gradient missing on some ranks -------------------------------------


def _emb_steps(n, r, weight, opt, uses, embed, lr):
    """Steps of sum(lin(embed(rows))) where rank k uses the embedding in
    step t iff uses[t][k] (rows depend on k and t); checks both parameters
    against the model computed by hand: w -= lr * (sum over the ranks that
    used it of their gradient) / n."""
    lin = opt.param_groups[0]['params'][0]
    for t, who in enumerate(uses):
        want_w, want_lin = weight.detach().clone(), lin.detach().clone()
        grad_w, grad_lin = torch.zeros_like(want_w), torch.zeros_like(want_lin)
        for k in range(n):
            rows = torch.tensor([k + t, (2 * k + 3) % 6])
            feats = want_w[rows] if who[k] else torch.ones(2, 2)
            grad_lin += feats.sum(0, keepdim=True)
            if who[k]:
                grad_w.index_add_(0, rows, want_lin.expand(2, 2))
        opt.zero_grad(set_to_none=True)
        rows = torch.tensor([r + t, (2 * r + 3) % 6])
        feats = embed(rows) if who[r] else torch.ones(2, 2)
        (feats @ lin.t()).sum().backward()
        opt.step()
        check(weight.detach(), want_w - lr * grad_w / n, 'embedding after step %d' % t, 1e-6)
        check(lin.detach(), want_lin - lr * grad_lin / n, 'linear after step %d' % t, 1e-6)


def case_sparse_missing(n, r):
    lr = 0.5
    # An nn.Embedding(sparse=True) that one rank does not use in a step: that
    # rank contributes an empty sparse gradient (every rank knows the module),
    # so training goes on and equals the model computed by hand.
    emb = torch.nn.Embedding(6, 2, sparse=True)
    lin = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        emb.weight.copy_(torch.arange(12.0).reshape(6, 2) / 10)
        lin.weight.copy_(torch.tensor([[0.5, -1.0]]))
    opt = hvd.DistributedOptimizer(torch.optim.SGD([lin.weight, emb.weight], lr=lr),
                                   named_parameters=[('lin', lin.weight), ('emb', emb.weight)])
    everyone, not_last = [True] * n, [k != n - 1 for k in range(n)]
    _emb_steps(n, r, emb.weight, opt, [not_last, [k != 0 for k in range(n)], [False] * n,
                                       everyone], emb, lr)

    # A functional sparse embedding (no module says so): once a step has
    # reduced it as sparse, every rank knows, and a missing gradient works.
    w = torch.nn.Parameter(torch.arange(12.0).reshape(6, 2) / 10)
    lin2 = torch.nn.Parameter(torch.tensor([[0.5, -1.0]]))
    opt = hvd.DistributedOptimizer(torch.optim.SGD([lin2, w], lr=lr),
                                   named_parameters=[('lin2', lin2), ('fw', w)])
    _emb_steps(n, r, w, opt, [everyone, not_last],
               lambda rows: F.embedding(rows, w, sparse=True), lr)

    # Its first step with the last rank missing: nobody there can know it is
    # sparse; every rank fails at once, naming the parameter and the cure.
    hvd.barrier()
    w = torch.nn.Parameter(torch.ones(6, 2))
    opt = hvd.DistributedOptimizer(torch.optim.SGD([w], lr=lr), named_parameters=[('fresh', w)])
    if r != n - 1:
        F.embedding(torch.tensor([r]), w, sparse=True).sum().backward()
    quickly(opt.step, ValueError, "parameter 'fresh'", 'sparse_as_dense=True',
            'give every rank a gradient')


CASES = {
    'duplicate_names': case_duplicate_names,
    'join': case_join,
    'dtypes': case_dtypes,
    'ops': case_ops,
    'process_sets': case_process_sets,
    'optimizer': case_optimizer,
    'init_process_sets': case_init_process_sets,
    'sparse_missing': case_sparse_missing,
}


def main():
    case = sys.argv[1]
    torch.set_num_threads(1)
    if case == 'init_process_sets':
        INIT_SETS.extend([hvd.ProcessSet([0]), hvd.ProcessSet(range(1, 3))])
        hvd.init(process_sets=INIT_SETS)
    else:
        hvd.init()
    n, r = hvd.size(), hvd.rank()
    CASES[case](n, r)
    print('PASS %s rank %d of %d' % (case, r, n), flush=True)
    hvd.shutdown()


if __name__ == '__main__':
    main()

"""One rank of the Horovod-compatibility suites (test_hvd_*.py), run under
`pushpull launch -s 0` as torch_worker.py is:

    build/bin/pushpull launch -n 3 -s 0 /usr/bin/python3 python/tests/hvd_worker.py dtypes

Each rank's input is a function of its rank, so every rank computes every
expected result locally with plain torch. A case prints "PASS <case> rank <r>
of <n>"; any mismatch raises, which fails the job.
"""

import sys
import time

import torch
import torch.nn.functional as F

import pushpull.torch as hvd
# quickly: also imported from here by test_hvd_compat.py.
from hvd_checks import ALL_DTYPES, inputs_of, quickly, reduce_ref, tol  # noqa: F401
from hvd_op_cases import case_ops, case_optimizer, case_process_sets
from torch_worker import check, expect_error


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
    # (The bound needs both ranks' requests to meet: 4 s, still short of the
    # 5 s stall shutdown the test sets, which the bug ran into.)
    quickly(opt.step, ValueError, "parameter 'fresh'", 'sparse_as_dense=True',
            'give every rank a gradient', limit=4.0)


def case_sparse_meets_dense(n, r):
    # sparse_allreduce_async travels as one allgather under its own name: a
    # rank that allreduces a dense tensor under that name meets it, and both
    # fail at once (before: the sparse side waited for '<name>.indices' and
    # '.values', the dense one for '<name>', until the stall shutdown).
    hvd.barrier()
    if r == 0:
        quickly(lambda: hvd.allreduce(torch.ones(6), name='mixed', op=hvd.Sum), ValueError,
                "'mixed'", 'submitted differently', limit=4.0)
    else:
        sp = torch.sparse_coo_tensor([[r]], [1.0], (6,))
        quickly(lambda: hvd.sparse_allreduce_async(sp, name='mixed', op=hvd.Sum)(), ValueError,
                "'mixed'", 'submitted differently', limit=4.0)
    # The collectives go on, and the same name works once the ranks agree.
    sp = torch.sparse_coo_tensor([[r, 5]], [1.0, 2.0], (6,))
    got = hvd.sparse_allreduce_async(sp, name='mixed', op=hvd.Average)()
    if got.is_coalesced() or got._nnz() != 2 * n:
        raise AssertionError('expected the uncoalesced concatenation, got %r' % got)
    want = torch.zeros(6)
    for k in range(n):
        want[k] += 1.0 / n
    want[5] = 2.0
    check(got.to_dense(), want, 'sparse average after the mismatch', 1e-6)


CASES = {
    'duplicate_names': case_duplicate_names,
    'join': case_join,
    'dtypes': case_dtypes,
    'ops': case_ops,
    'process_sets': case_process_sets,
    'optimizer': case_optimizer,
    'init_process_sets': case_init_process_sets,
    'sparse_missing': case_sparse_missing,
    'sparse_meets_dense': case_sparse_meets_dense,
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

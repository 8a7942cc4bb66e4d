"""One rank of the pushpull.torch tests, run under the launcher:

    build/bin/pushpull launch -n 2 -s 0 /usr/bin/python3 python/tests/torch_worker.py ops

Every rank computes the expected results locally with plain torch (each rank's
input is a function of the rank, so any rank can build every other rank's) and
compares. A case prints "PASS <case> rank <r>" at the end; any mismatch raises,
so the process exits non-zero and the launcher reports the job failed.
"""

import sys
import time

import torch

import pushpull.torch as hvd
from pushpull._pushpull import InvalidArgument

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64,
          torch.int8, torch.uint8]


def data(rank, shape, dtype, salt=0):
    """Rank `rank`'s input: small integers (exact in every dtype, sums too)."""
    g = torch.Generator().manual_seed(1000 * salt + rank)
    return torch.randint(0, 8, shape, generator=g).to(dtype)


def check(got, want, what, atol=0.0):
    if got.dtype != want.dtype or got.shape != want.shape:
        raise AssertionError('%s: got %s%s, want %s%s' % (what, got.dtype, tuple(got.shape),
                                                           want.dtype, tuple(want.shape)))
    diff = (got.double() - want.double()).abs().max().item() if got.numel() else 0.0
    if diff > atol:
        raise AssertionError('%s: max difference %g > %g\ngot  %s\nwant %s' % (what, diff, atol,
                                                                             got, want))


def expect_error(fn, cls, *needles):
    try:
        fn()
    except cls as e:
        for n in needles:
            if n not in str(e):
                raise AssertionError('error %r does not mention %r' % (str(e), n))
        return str(e)
    raise AssertionError('expected %s' % cls.__name__)


def reference(op, inputs):
    stacked = torch.stack([t.double() for t in inputs])
    if op == 'sum':
        r = stacked.sum(0)
    elif op == 'average':
        r = stacked.sum(0) / len(inputs)
        if not inputs[0].dtype.is_floating_point:
            r = torch.trunc(r)
    elif op == 'min':
        r = stacked.min(0).values
    else:
        r = stacked.max(0).values
    return r.to(inputs[0].dtype)


OPS = {'sum': hvd.Sum, 'average': hvd.Average, 'min': hvd.Min, 'max': hvd.Max}


def case_ops(n, r):
    shape = (3, 5)
    for dtype in DTYPES:
        for opname, op in OPS.items():
            if opname == 'sum' and dtype in (torch.int8, torch.uint8):
                pass  # values < 8 and n <= 3: no overflow
            inputs = [data(k, shape, dtype, salt=1) for k in range(n)]
            want = reference(opname, inputs)
            # half floats are rounded after each step; averages of small
            # integers are not exact in bfloat16.
            tol = {torch.float16: 0.02 * n, torch.bfloat16: 0.02 * n, torch.float32: 1e-6,
                   torch.float64: 1e-12}.get(dtype, 0.0)
            what = 'allreduce %s %s' % (opname, dtype)
            mine = inputs[r].clone()
            check(hvd.allreduce(mine, op=op, name='ar.%s.%s' % (opname, dtype)), want, what, tol)
            check(mine, inputs[r], what + ' leaves its input alone')
            hvd.allreduce_(mine, op=op, name='ar_.%s.%s' % (opname, dtype))
            check(mine, want, what + ' in place', tol)
        # average= (Horovod's deprecated flag) and the default op (Average).
        x = data(r, shape, dtype, salt=2)
        inputs = [data(k, shape, dtype, salt=2) for k in range(n)]
        check(hvd.allreduce(x, average=False), reference('sum', inputs), 'average=False')
        if dtype.is_floating_point:
            check(hvd.allreduce(x), reference('average', inputs), 'default op', 0.02 * n)
        else:
            check(hvd.allreduce(x), reference('average', inputs), 'default op (truncated)')

        # allgather with equal and with different first dimensions.
        eq = [data(k, (2, 3), dtype, salt=3) for k in range(n)]
        check(hvd.allgather(eq[r], name='ag.eq.%s' % dtype), torch.cat(eq), 'allgather equal')
        var = [data(k, (k + 1, 2), dtype, salt=4) for k in range(n)]
        check(hvd.allgather(var[r]), torch.cat(var), 'allgather variable %s' % dtype)

        # broadcast from root 1, in place and out of place.
        b = [data(k, (4,), dtype, salt=5) for k in range(n)]
        mine = b[r].clone()
        out = hvd.broadcast(mine, root_rank=1, name='bc.%s' % dtype)
        check(out, b[1], 'broadcast %s' % dtype)
        check(mine, b[r], 'broadcast leaves its input alone')
        same = hvd.broadcast_(mine, 1)
        if same is not mine:
            raise AssertionError('broadcast_ must return its argument')
        check(mine, b[1], 'broadcast_ %s' % dtype)

    # async forms, poll and synchronize; several in flight at once.
    xs = [data(r, (1000,), torch.float32, salt=10 + i) for i in range(4)]
    refs = [reference('sum', [data(k, (1000,), torch.float32, salt=10 + i) for k in range(n)])
            for i in range(4)]
    handles = [hvd.allreduce_async(x, op=hvd.Sum, name='async.%d' % i) for i, x in enumerate(xs)]
    in_place = hvd.allreduce_async_(xs[0].clone(), op=hvd.Sum, name='async.inplace')
    gather = hvd.allgather_async(xs[1][:10], name='async.gather')
    bcast = hvd.broadcast_async_(xs[2][:5].clone(), 0, name='async.bcast')
    deadline = time.time() + 30
    while not all(hvd.poll(h) for h in handles + [in_place, gather, bcast]):
        if time.time() > deadline:
            raise AssertionError('poll never became true')
        time.sleep(0.001)
    for h, want in zip(handles, refs):
        check(hvd.synchronize(h), want, 'allreduce_async')
    check(hvd.synchronize(in_place), refs[0], 'allreduce_async_')
    check(hvd.synchronize(gather),
          torch.cat([data(k, (1000,), torch.float32, salt=11)[:10] for k in range(n)]),
          'allgather_async')
    check(hvd.synchronize(bcast), data(0, (1000,), torch.float32, salt=12)[:5], 'broadcast_async_')

    # scaling, grouped allreduce, reducescatter, objects, barrier.
    x = data(r, (6,), torch.float64, salt=20)
    s = reference('sum', [data(k, (6,), torch.float64, salt=20) for k in range(n)])
    check(hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0), s * 1.5,
          'pre/postscale', 1e-12)
    outs = hvd.grouped_allreduce([x, x * 2], op=hvd.Sum)
    check(outs[0], s, 'grouped 0')
    check(outs[1], s * 2, 'grouped 1')
    rs = hvd.reducescatter(torch.ones(n * 2, 3), op=hvd.Sum)
    check(rs, torch.full((2, 3), float(n)), 'reducescatter')
    obj = hvd.broadcast_object({'rank': r, 'list': [1, 2]} if r == 1 else None, root_rank=1)
    if obj != {'rank': 1, 'list': [1, 2]}:
        raise AssertionError('broadcast_object gave %r' % (obj,))
    if hvd.allgather_object(('r', r)) != [('r', k) for k in range(n)]:
        raise AssertionError('allgather_object')
    # Tensors that require grad: the ops are differentiable, as Horovod's.
    w = torch.full((3,), float(r + 1), requires_grad=True)
    total = hvd.allreduce(w, op=hvd.Sum, name='grad.sum')
    check(total.detach(), torch.full((3,), n * (n + 1) / 2.0), 'requires_grad')
    (total * float(r + 1)).sum().backward()  # d/dw_r = sum over ranks of (k + 1)
    check(w.grad, torch.full((3,), n * (n + 1) / 2.0), 'allreduce backward (sum)')
    v = torch.arange(r + 1, dtype=torch.float64, requires_grad=True)  # r + 1 rows
    gathered = hvd.allgather(v, name='grad.gather')
    check(gathered.detach(), torch.cat([torch.arange(k + 1, dtype=torch.float64)
                                        for k in range(n)]), 'differentiable allgather')
    (gathered * gathered).sum().backward()  # every rank: 2 * gathered; averaged
    check(v.grad, 2 * torch.arange(r + 1, dtype=torch.float64), 'allgather backward')
    b = torch.full((2,), float(r), requires_grad=True)
    out = hvd.broadcast(b, root_rank=0, name='grad.bcast')
    (out * 3).sum().backward()
    check(b.grad, torch.full((2,), 3.0 if r == 0 else 0.0), 'broadcast backward')
    hvd.barrier()


def case_gil_and_lifetimes(n, r):
    # A handle dropped before its op completed: the op still completes safely
    # (its tensors are parked until it ends) and the tensor may go right after.
    hvd.allreduce_async(torch.ones(1 << 20), name='dropped', op=hvd.Sum)
    import gc
    gc.collect()
    # The input may be dropped while the op runs: the handle keeps it alive.
    h = hvd.allreduce_async(torch.full((1 << 20,), float(r)), name='kept', op=hvd.Sum)
    gc.collect()
    check(hvd.synchronize(h), torch.full((1 << 20,), float(sum(range(n)))), 'kept alive')
    # Blocking calls release the GIL: a Python thread runs while rank 0 waits
    # for rank 1, which submits 1 s late.
    import threading
    ticks = [0]
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            ticks[0] += 1
            time.sleep(0.001)
    t = threading.Thread(target=spin)
    t.start()
    if r != 0:
        time.sleep(1.0)
    before = ticks[0]
    hvd.allreduce(torch.ones(4), name='late', op=hvd.Sum)
    during = ticks[0] - before
    stop.set()
    t.join()
    if r == 0:
        print('rank 0: the other thread ran %d times while allreduce waited' % during)
        if during < 100:
            raise AssertionError('the GIL was held during a blocking allreduce (%d ticks)'
                                 % during)


def case_orders(n, r):
    names = ['a', 'b', 'c']
    order = names if r % 2 == 0 else list(reversed(names))
    tensors = {nm: data(r, (257 + i,), torch.float32, salt=30 + i) for i, nm in enumerate(names)}
    handles = {nm: hvd.allreduce_async(tensors[nm], name='order.' + nm, op=hvd.Sum)
               for nm in order}
    for i, nm in enumerate(names):
        want = reference('sum', [data(k, (257 + i,), torch.float32, salt=30 + i)
                                 for k in range(n)])
        check(hvd.synchronize(handles[nm]), want, 'order %s' % nm)
    # mixed op types in different orders
    x = torch.full((4,), float(r))
    if r % 2 == 0:
        h1 = hvd.broadcast_async(x, 0, name='mixed.b')
        h2 = hvd.allgather_async(x, name='mixed.g')
    else:
        h2 = hvd.allgather_async(x, name='mixed.g')
        h1 = hvd.broadcast_async(x, 0, name='mixed.b')
    check(hvd.synchronize(h1), torch.zeros(4), 'mixed broadcast')
    check(hvd.synchronize(h2), torch.cat([torch.full((4,), float(k)) for k in range(n)]),
          'mixed allgather')


def case_errors(n, r):
    t = torch.ones(4)
    # int16 and bool are supported now (test_hvd_dtypes.py); Average of bool is not.
    expect_error(lambda: hvd.allreduce(torch.ones(4, dtype=torch.bool)), InvalidArgument, 'bool')
    expect_error(lambda: hvd.allreduce(torch.ones(4, dtype=torch.complex64)), InvalidArgument,
                 'complex64')
    expect_error(lambda: hvd.allreduce_(torch.ones(3, 4).t()), InvalidArgument, 'not contiguous')
    expect_error(lambda: hvd.allgather(torch.ones(4, 4)[:, ::2]), InvalidArgument,
                 'not contiguous')
    expect_error(lambda: hvd.allreduce([1, 2]), InvalidArgument, 'torch.Tensor')
    expect_error(lambda: hvd.allreduce(t, op=hvd.Adasum), InvalidArgument, 'Adasum')
    expect_error(lambda: hvd.allreduce(t, average=True, op=hvd.Sum), InvalidArgument)

    # The bridge itself (what numpy arrays and other libraries' tensors meet).
    class FakeCuda:
        def __dlpack_device__(self):
            return (2, 0)  # kDLCUDA

        def __dlpack__(self, stream=None):
            raise AssertionError('the device must be checked before exporting')
    expect_error(lambda: hvd._c.allreduce('fake', FakeCuda()), InvalidArgument, 'CUDA',
                 'not supported', '.cpu()')
    if torch.cuda.is_available():
        expect_error(lambda: hvd.allreduce(torch.ones(2, device='cuda')), InvalidArgument,
                     'CUDA', '.cpu()')
    else:
        print('rank %d: no CUDA here; real CUDA tensors not tried' % r)

    # The same name with different shapes on different ranks: an error on every
    # rank naming the tensor, and the group stays usable.
    bad = torch.ones(2 + r, 3)
    msg = expect_error(lambda: hvd.allreduce(bad, name='mismatch'), InvalidArgument, 'mismatch')
    if 'rank 0' not in msg or 'rank 1' not in msg:
        raise AssertionError('mismatch error should list the ranks: %s' % msg)
    expect_error(lambda: hvd.allreduce(torch.ones(3, dtype=torch.float32 if r == 0 else
                                                  torch.float64), name='dtype-mismatch'),
                 InvalidArgument, 'dtype-mismatch')
    expect_error(lambda: hvd.broadcast(torch.ones(3), root_rank=n + 5), InvalidArgument)
    check(hvd.allreduce(torch.ones(3), op=hvd.Sum, name='after'), torch.full((3,), float(n)),
          'usable after errors')


def case_join(n, r):
    # Rank r has 2 + 2r batches: the others keep going after it joined.
    batches = 2 + 2 * r
    most = 2 + 2 * (n - 1)
    for step in range(batches):
        x = torch.full((5,), float(r + 1))
        active = [k for k in range(n) if 2 + 2 * k > step]
        avg = hvd.allreduce(x, name='join.avg.%d' % step)
        # As Horovod: a joined rank contributes zeros and Average divides by size().
        check(avg, torch.full((5,), sum(k + 1 for k in active) / n),
              'average (joined ranks as zeros) at step %d' % step, 1e-6)
        s = hvd.allreduce(x, op=hvd.Sum, name='join.sum.%d' % step)
        check(s, torch.full((5,), float(sum(k + 1 for k in active))), 'sum at step %d' % step)
        gather = lambda: hvd.allgather(torch.full((1,), float(r)), name='join.g.%d' % step)
        if len(active) == n:
            check(gather(), torch.tensor([float(k) for k in active]), 'allgather at %d' % step)
        else:  # as Horovod: no allgather while a rank has joined, on every rank
            expect_error(gather, InvalidArgument, 'joined')
    t0 = time.time()
    last = hvd.join()
    if last != n - 1:
        raise AssertionError('join() returned %r; rank %d joined last' % (last, n - 1))
    print('rank %d joined after %d of %d batches (%.2fs in join)' % (r, batches, most,
                                                                   time.time() - t0))
    # Everyone is back: normal ops again.
    check(hvd.allreduce(torch.ones(2), op=hvd.Sum, name='join.after'),
          torch.full((2,), float(n)), 'after join')


CASES = {'ops': case_ops, 'orders': case_orders, 'gil': case_gil_and_lifetimes, 'errors': case_errors, 'join': case_join}


def main():
    case = sys.argv[1]
    torch.set_num_threads(1)
    if case.startswith('trainer'):
        # KVStore jobs: the store joins the job (a collective session would
        # register a second worker with the scheduler).
        import torch_trainer_cases
        n, r = torch_trainer_cases.CASES[case]()
        print('PASS %s rank %d of %d' % (case, r, n), flush=True)
        return
    hvd.init()
    n, r = hvd.size(), hvd.rank()
    if case in CASES:
        CASES[case](n, r)
    else:
        import torch_optimizer_cases
        torch_optimizer_cases.CASES[case](n, r)
    print('PASS %s rank %d of %d' % (case, r, n), flush=True)
    hvd.shutdown()


if __name__ == '__main__':
    main()

"""One rank of the torch.distributed backend tests (test_torch_distributed.py).

    python3 torch_pg_worker.py CASE [ARGS]

Run by `pushpull launch -s 0` or with RANK / WORLD_SIZE / MASTER_ADDR /
MASTER_PORT set by the test (torchrun's variables). Every rank checks its own
results against references computed locally (or against the same run over
gloo) and prints `PASS <case> rank R of N`; a failed check raises, so the
rank exits non-zero with the traceback.
"""

import os
import warnings
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

import pushpull.torch.distributed as ppd

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64,
          torch.int8, torch.uint8]
REDUCTIONS = {
    'sum': dist.ReduceOp.SUM,
    'avg': dist.ReduceOp.AVG,
    'min': dist.ReduceOp.MIN,
    'max': dist.ReduceOp.MAX,
    'product': dist.ReduceOp.PRODUCT,
}


def say(*args):
    print(*args, flush=True)


def tolerance(dtype):
    if dtype in (torch.float16, torch.bfloat16):
        return 1e-2
    if dtype == torch.float32:
        return 1e-6
    return 1e-12 if dtype == torch.float64 else 0


def check_close(what, got, want):
    assert got.dtype == want.dtype, f'{what}: dtype {got.dtype}, expected {want.dtype}'
    assert got.shape == want.shape, f'{what}: shape {tuple(got.shape)}, expected {tuple(want.shape)}'
    diff = (got.double() - want.double()).abs()
    scale = want.double().abs().clamp(min=1)
    bad = diff > tolerance(want.dtype) * scale
    assert not bad.any(), f'{what}: got {got.flatten()[:8].tolist()}, expected {want.flatten()[:8].tolist()}'


def rank_input(r, k, dtype, small=False):
    """Rank r's input: small integers (exact in every dtype)."""
    i = torch.arange(k)
    values = (i % 2) + 1 if small else (i % 5) + r + 1
    if small:
        values = values * ((r % 2) + 1)
    return values.to(dtype)


def reference(name, inputs, dtype):
    stacked = torch.stack([t.double() for t in inputs])
    n = len(inputs)
    if name == 'sum':
        out = stacked.sum(0)
    elif name == 'avg':
        out = stacked.sum(0) / n
        if not dtype.is_floating_point:
            out = torch.trunc(out)
    elif name == 'min':
        out = stacked.min(0).values
    elif name == 'max':
        out = stacked.max(0).values
    else:
        out = stacked.prod(0)
    return out.to(dtype)


def case_collectives():
    r, n = dist.get_rank(), dist.get_world_size()
    k = 37  # not a multiple of the world size: uneven ring blocks
    for dtype in DTYPES:
        for name, op in REDUCTIONS.items():
            small = name == 'product'
            t = rank_input(r, k, dtype, small).reshape(37, 1)
            dist.all_reduce(t, op=op)
            want = reference(name, [rank_input(j, k, dtype, small) for j in range(n)], dtype)
            check_close(f'all_reduce {name} {dtype}', t, want.reshape(37, 1))
        # Non-contiguous tensor (reduced in a contiguous copy, copied back).
        base = torch.zeros(6, 4, dtype=dtype)
        view = base[:, ::2]
        view.copy_(rank_input(r, 12, dtype).reshape(6, 2))
        dist.all_reduce(view)
        want = reference('sum', [rank_input(j, 12, dtype) for j in range(n)], dtype)
        check_close(f'all_reduce non-contiguous {dtype}', view, want.reshape(6, 2))
        assert (base[:, 1::2] == 0).all(), 'non-contiguous all_reduce wrote outside the view'

        # broadcast from every root.
        for root in range(n):
            t = rank_input(r, k, dtype)
            dist.broadcast(t, src=root)
            check_close(f'broadcast root {root} {dtype}', t, rank_input(root, k, dtype))

        # all_gather and _all_gather_base.
        outs = [torch.empty(2, 3, dtype=dtype) for _ in range(n)]
        dist.all_gather(outs, rank_input(r, 6, dtype).reshape(2, 3))
        for j in range(n):
            check_close(f'all_gather from {j} {dtype}', outs[j], rank_input(j, 6, dtype).reshape(2, 3))
        flat = torch.empty(n * 5, dtype=dtype)
        dist.all_gather_into_tensor(flat, rank_input(r, 5, dtype))
        check_close(f'_all_gather_base {dtype}', flat,
                    torch.cat([rank_input(j, 5, dtype) for j in range(n)]))

        # reduce_scatter (list and base forms).
        for name in ('sum', 'max'):
            op = REDUCTIONS[name]
            ins = [rank_input(r, 4, dtype) + j for j in range(n)]
            out = torch.empty(4, dtype=dtype)
            dist.reduce_scatter(out, ins, op=op)
            want = reference(name, [rank_input(j, 4, dtype) + r for j in range(n)], dtype)
            check_close(f'reduce_scatter {name} {dtype}', out, want)
        big = torch.cat([rank_input(r, 3, dtype) * (j + 1) for j in range(n)])
        out = torch.empty(3, dtype=dtype)
        dist.reduce_scatter_tensor(out, big)
        want = reference('sum', [rank_input(j, 3, dtype) * (r + 1) for j in range(n)], dtype)
        check_close(f'_reduce_scatter_base {dtype}', out, want)

        # reduce: only the root gets the result; the others keep their input.
        for root in (0, n - 1):
            t = rank_input(r, 9, dtype)
            dist.reduce(t, dst=root)
            want = (reference('sum', [rank_input(j, 9, dtype) for j in range(n)], dtype)
                    if r == root else rank_input(r, 9, dtype))
            check_close(f'reduce to {root} {dtype}', t, want)

        # gather at root 1 % n.
        root = 1 % n
        gl = [torch.empty(4, dtype=dtype) for _ in range(n)] if r == root else None
        dist.gather(rank_input(r, 4, dtype), gather_list=gl, dst=root)
        if r == root:
            for j in range(n):
                check_close(f'gather from {j} {dtype}', gl[j], rank_input(j, 4, dtype))

        # all_to_all (equal splits).
        ins = [rank_input(r, 2, dtype) * 0 + (10 * r + j) for j in range(n)]
        outs = [torch.empty(2, dtype=dtype) for _ in range(n)]
        dist.all_to_all(outs, ins)
        for j in range(n):
            check_close(f'all_to_all from {j} {dtype}', outs[j], torch.full((2,), 10 * j + r).to(dtype))
        single_in = torch.arange(n * 3).to(dtype) + r
        single_out = torch.empty(n * 3, dtype=dtype)
        dist.all_to_all_single(single_out, single_in)
        want = torch.cat([(torch.arange(n * 3) + j)[r * 3:(r + 1) * 3] for j in range(n)]).to(dtype)
        check_close(f'all_to_all_single {dtype}', single_out, want)

    # all_reduce_coalesced: several tensors, one call (fused by the engine).
    ts = [rank_input(r, 5, torch.float32), rank_input(r, 1, torch.float32), torch.empty(0)]
    dist.all_reduce_coalesced(ts)
    check_close('all_reduce_coalesced 0', ts[0],
                reference('sum', [rank_input(j, 5, torch.float32) for j in range(n)], torch.float32))
    check_close('all_reduce_coalesced 1', ts[1],
                reference('sum', [rank_input(j, 1, torch.float32) for j in range(n)], torch.float32))

    # Empty tensors complete at once.
    e = torch.empty(0, 3)
    dist.all_reduce(e)
    dist.broadcast(e, 0)

    # Async work: wait(), is_completed(), get_future() and a then() callback.
    works, tensors = [], []
    for i in range(40):  # more than the 16 name slots of one signature in flight
        t = torch.full((1000,), float(r + i))
        tensors.append(t)
        works.append(dist.all_reduce(t, async_op=True))
    fut = works[-1].get_future()
    chained = fut.then(lambda f: f.value()[0] * 2)
    for w in works:
        assert w.wait()
        assert w.is_completed()
    for i, t in enumerate(tensors):
        assert (t == sum(j + i for j in range(n))).all(), f'async all_reduce {i}: {t[:3]}'
    got = chained.wait()
    assert (got == 2 * sum(j + 39 for j in range(n))).all(), 'then() on the future'
    # A future completes without wait(): the completer thread finishes works.
    t = torch.ones(10)
    fut = dist.all_reduce(t, async_op=True).get_future()
    deadline = time.monotonic() + 30
    while not fut.done():
        assert time.monotonic() < deadline, 'future never completed without wait()'
        time.sleep(0.001)
    assert (fut.value()[0] == n).all()

    dist.barrier()
    w = dist.barrier(async_op=True)
    w.wait()

    # A subgroup with this backend: its own mesh among ranks 0 and n-1.
    members = [0, n - 1]
    sub = dist.new_group(members, backend='pushpull')
    if r in members:
        assert dist.get_backend(sub) == 'pushpull'
        t = torch.full((3,), float(r + 1))
        dist.all_reduce(t, group=sub)
        assert (t == 1 + n).all(), f'subgroup all_reduce: {t}'
        dist.broadcast(t, src=n - 1, group=sub)
    dist.barrier()
    say(f'PASS collectives rank {r} of {n}')


def make_model():
    torch.manual_seed(1234)
    return nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                         nn.Linear(64, 4))


def train(model, variant, steps, rank):
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.MSELoss()
    for step in range(steps):
        g = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(16, 20, generator=g)
        y = torch.randn(16, 4, generator=g)
        opt.zero_grad()
        if variant == 'no_sync':
            with model.no_sync():  # accumulate locally, synchronise on the second half
                loss_fn(model(x[:8]), y[:8]).backward()
            loss_fn(model(x[8:]), y[8:]).backward()
        else:
            loss_fn(model(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def case_ddp(variant):
    """The same DDP training over 'pushpull' (the default group) and over a
    gloo group of the same ranks: parameters agree within 1e-6 (1e-4 with
    the float16 compression hook)."""
    r, n = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend='gloo')
    results = {}
    for label, group in (('pushpull', None), ('gloo', gloo)):
        kwargs = dict(process_group=group, bucket_cap_mb=0.004)  # several buckets in flight
        if variant == 'bucket_view':
            kwargs['gradient_as_bucket_view'] = True
        model = DDP(make_model(), **kwargs)
        assert dist.get_backend(model.process_group) == label, dist.get_backend(model.process_group)
        if variant == 'fp16_hook':
            model.register_comm_hook(group if group is not None else dist.group.WORLD,
                                     default_hooks.fp16_compress_hook)
        results[label] = train(model, variant, steps=6, rank=r)
    # fp16_compress_hook sums float16 gradients: pushpull adds in float32 and
    # rounds once per ring step, gloo adds in float16, in another order, so
    # with 3 ranks they differ by float16 rounding (~5e-4 relative) of the
    # gradients; everything else is float32 and agrees within 1e-6.
    limit = 1e-4 if variant == 'fp16_hook' else 1e-6
    worst = max((a - b).abs().max().item() for a, b in zip(results['pushpull'], results['gloo']))
    assert worst <= limit, f'ddp {variant}: pushpull and gloo differ by {worst} > {limit}'
    # Every rank holds the same model.
    flat = torch.cat([p.flatten() for p in results['pushpull']])
    mine = flat.clone()
    dist.broadcast(flat, 0, group=gloo)
    assert torch.equal(flat, mine), f'ddp {variant}: rank {r} differs from rank 0'
    say(f'ddp {variant}: max |pushpull - gloo| = {worst:.3g}')
    say(f'PASS ddp-{variant} rank {r} of {n}')


def expect_runtime_error(what, fn, *fragments):
    try:
        fn()
    except RuntimeError as e:
        text = str(e)
        for f in fragments:
            assert f in text, f'{what}: error lacks {f!r}: {text}'
        return text
    raise AssertionError(f'{what}: no error')


def case_errors():
    r, n = dist.get_rank(), dist.get_world_size()
    pg = dist.distributed_c10d._get_default_group()
    expect_runtime_error('bool', lambda: dist.all_reduce(torch.ones(3, dtype=torch.bool)),
                         'dtype pushpull does not reduce', 'float32')
    # Complex tensors: torch.distributed reduces them as real views (float32 here).
    c = torch.full((3,), complex(r, 1), dtype=torch.complex64)
    dist.all_reduce(c)
    assert (c == complex(sum(range(n)), n)).all(), c
    expect_runtime_error('complex max', lambda: dist.all_reduce(c, op=dist.ReduceOp.MAX))
    expect_runtime_error('band', lambda: dist.all_reduce(torch.ones(3, dtype=torch.int32),
                                                         op=dist.ReduceOp.BAND),
                         'not supported', 'SUM, AVG, MIN, MAX and PRODUCT')
    expect_runtime_error('two tensors', lambda: pg.allreduce([torch.ones(2), torch.ones(2)]),
                         'exactly one tensor')
    expect_runtime_error('sparse', lambda: dist.all_reduce(torch.eye(3).to_sparse()))
    expect_runtime_error('meta device', lambda: dist.all_reduce(torch.empty(3, device='meta')))
    expect_runtime_error('send', lambda: dist.send(torch.ones(1), (r + 1) % n), 'send')
    expect_runtime_error('split sizes', lambda: dist.all_to_all_single(
        torch.empty(n), torch.ones(n), [1] * n, [1] * n), 'split sizes')
    # Sizes that differ across ranks: the engine's error on every rank, no hang.
    text = expect_runtime_error('mismatch', lambda: dist.all_reduce(torch.ones(3 + r)),
                                'submitted differently')
    say(f'rank {r} mismatch error: {text.splitlines()[0][:200]}')
    outs = [torch.empty(2) for _ in range(n)]
    expect_runtime_error('allgather mismatch',
                         lambda: dist.all_gather([torch.empty(2 + r) for _ in range(n)],
                                                 torch.ones(2 + r)), 'submitted differently')
    # The group still works.
    t = torch.ones(4)
    dist.all_reduce(t)
    assert (t == n).all()
    dist.all_gather(outs, torch.ones(2))
    say(f'PASS errors rank {r} of {n}')


def case_killed(victim):
    """DDP training; rank `victim` dies by SIGKILL at step 3. The others must
    see an exception naming it (no hang) from backward()/the collectives."""
    r, n = dist.get_rank(), dist.get_world_size()
    model = DDP(make_model(), bucket_cap_mb=0.004)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(1000):
        if step == 3 and r == victim:
            say(f'rank {r} kills itself')
            os.kill(os.getpid(), signal.SIGKILL)
        x, y = torch.randn(16, 20), torch.randn(16, 4)
        opt.zero_grad()
        try:
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        except RuntimeError as e:
            say(f'rank {r} step {step}: {type(e).__name__}: {e}')
            assert f'rank {victim}' in str(e), f'the error does not name rank {victim}: {e}'
            say(f'PASS killed rank {r} of {n}')
            return
    raise AssertionError('training went on after a rank died')


def case_timeout():
    """Rank 1 never calls the all_reduce: rank 0's fails with Timeout after the
    process group's timeout (PG_TEST_TIMEOUT_S), not a hang."""
    r, n = dist.get_rank(), dist.get_world_size()
    if r == 0:
        start = time.monotonic()
        text = expect_runtime_error('timeout', lambda: dist.all_reduce(torch.ones(3)),
                                    'did not complete within')
        took = time.monotonic() - start
        say(f'rank 0 after {took:.1f} s: {text}')
        assert took < 60, took
    else:
        time.sleep(3 * float(os.environ['PG_TEST_TIMEOUT_S']))  # alive, silent
    say(f'PASS timeout rank {r} of {n}')


def main():
    case = sys.argv[1]
    timeout_s = float(os.environ.get('PG_TEST_TIMEOUT_S', '120'))
    import datetime
    dist.init_process_group('pushpull', timeout=datetime.timedelta(seconds=timeout_s))
    assert dist.get_backend() == 'pushpull', dist.get_backend()
    if case == 'collectives':
        case_collectives()
    elif case == 'ddp':
        case_ddp(sys.argv[2])
    elif case == 'errors':
        case_errors()
    elif case == 'timeout':
        case_timeout()
    elif case == 'killed':
        case_killed(int(sys.argv[2]))
    else:
        raise SystemExit(f'unknown case {case}')
    assert ppd.is_registered()
    dist.destroy_process_group()


if __name__ == '__main__':
    torch.set_num_threads(1)
    warnings.filterwarnings('ignore', message='.*deprecated.*')
    main()

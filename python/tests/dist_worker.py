"""A worker of the Python dist-store tests (run by test_kv_dist.py under
`pushpull launch`). Every check raises on a wrong value; the last line printed
is "worker R: ok (...)" when all passed.

    dist_worker.py values KVTYPE     value checks of the parameter-server issue
    dist_worker.py torch KVTYPE      the closed-form rounds with torch tensors (and bfloat16)
    dist_worker.py onebit KVTYPE     1-bit compression: the residual over 3 pushes, bad settings
    dist_worker.py save PATH         optimizer states: 2 rounds, save, 1 more round
    dist_worker.py load PATH         new job: init from round 2, load, 1 round: same values
"""

import sys

import numpy as np

import pushpull

SMALL, BIG = (2, 3), (1200, 1200)  # BIG is above the 1,000,000-element bound


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def value_checks(kv, with_torch):
    n, rank = kv.num_workers, kv.rank
    cases = {f'{np.dtype(d).name}-{"x".join(map(str, s))}': (d, s)
             for d in (np.float32, np.float16) for s in (SMALL, BIG)}
    full = np.full
    if with_torch:  # the same checks with torch tensors (DLPack), bfloat16 included
        import torch
        cases = {f'torch-{k}': (getattr(torch, np.dtype(d).name), s) for k, (d, s) in cases.items()}
        cases['torch-bfloat16-2x3'] = (torch.bfloat16, SMALL)
        full = lambda s, v, d: torch.full(s, float(v), dtype=d)  # noqa: E731
    kv.init(list(cases), [full(s, 1, d) for d, s in cases.values()])
    kv.set_optimizer(pushpull.optimizer.create('test', rescale_grad=2))
    outs = {k: full(s, 0, d) for k, (d, s) in cases.items()}
    keys = list(cases)
    for i in range(1, 4):
        kv.push(keys, [full(s, rank + 1, d) for d, s in cases.values()])
        if kv.type.startswith('dist_async'):
            continue  # only the total is defined; checked below
        kv.pull(keys, out=[outs[k] for k in keys])
        expect = (n + 1) * n * 2 / 2 * i + 1
        for k, o in outs.items():
            check(bool((o == expect).all()), f'{k} round {i}: {o.ravel()[:4]} != {expect}')
    if kv.type.startswith('dist_async'):
        kv.barrier()  # every push answered = applied
        kv.pull(keys, out=[outs[k] for k in keys])
        expect = (n + 1) * n * 2 / 2 * 3 + 1
        for k, o in outs.items():
            check(bool((o == expect).all()), f'{k} async total: {o.ravel()[:4]} != {expect}')
        kv.barrier()  # nobody pushes again before everyone checked the total
    if kv.type.startswith('dist_async') or with_torch:
        return
    # two devices per worker and pushpull: the devices' sum counts too
    out = np.zeros(SMALL, np.float32)
    kv.pushpull('float32-2x3', [np.full(SMALL, rank + 1, np.float32)] * 2, out=out)
    expect += 2 * 2 * n * (n + 1) / 2
    check((out == expect).all(), f'pushpull of 2 devices: {out.ravel()[:3]} != {expect}')


def row_sparse_checks(kv):
    value = np.arange(300 * 8, dtype=np.float32).reshape(300, 8)
    kv.init('emb', value)
    rng = np.random.default_rng(kv.rank)
    for rows in (rng.integers(0, 300, 50), np.arange(300), np.array([], np.int64),
                 np.array([5, 5, 299, 0], np.int32)):
        outs = [np.full(value.shape, -1, np.float32) for _ in range(2)]
        kv.row_sparse_pull('emb', out=outs, row_ids=rows)
        mask = np.zeros(300, bool)
        mask[rows] = True
        for o in outs:
            check((o[mask] == value[mask]).all() and (o[~mask] == 0).all(),
                  f'row_sparse_pull rows {rows[:5]}...')


def compression_checks(kv):
    n = kv.num_workers
    kv.set_gradient_compression({'type': '2bit', 'threshold': 0.5})
    kv.init('c', np.zeros(20, np.float32))
    out = np.ones(20, np.float32)
    kv.push('c', np.full(20, 0.3, np.float32))  # below threshold: residual only
    kv.pull('c', out=out)
    check((out == 0).all(), f'2bit: below threshold changed the value: {out[:3]}')
    kv.push('c', np.full(20, 0.3, np.float32))  # residual 0.6: +0.5 from every worker
    kv.pull('c', out=out)
    check((out == 2 * 0.5 * n).all(), f'2bit: {out[:3]} != {2 * 0.5 * n} (test optimizer x2)')
    kv.set_gradient_compression({'type': 'none'})


def one_bit_checks(kv):
    # 1bit, threshold 0.5 (the default): worker 0 pushes 0.3, the others 0.7.
    # Codes, push by push (residual r += g; +1 if r > 0.5 then r -= 1, else
    # -1 then r += 1): worker 0: -1 (r 1.3), +1 (r 0.6), +1 (r -0.1);
    # the others: +1 (r -0.3), -1 (r 1.4), +1 (r 1.1). With the test
    # optimizer (w += sum) from 0: n - 2, then 0, then n.
    n = kv.num_workers
    for bad, what in (({'type': '1bit', 'threshold': 'nan'}, 'threshold'),
                      ({'type': '2bit', 'threshold': -1}, 'threshold'),
                      ({'type': '4bit'}, '4bit')):
        try:
            kv.set_gradient_compression(bad)
        except pushpull.InvalidArgument as e:
            check(what in str(e), f'{bad}: the error does not name {what}: {e}')
        else:
            raise AssertionError(f'{bad} was accepted')
    kv.set_gradient_compression({'type': '1bit'})
    kv.init('b', np.zeros(1000, np.float32))
    kv.set_optimizer(pushpull.optimizer.create('test', rescale_grad=1))
    out = np.full(1000, -7, np.float32)
    g = np.full(1000, 0.3 if kv.rank == 0 else 0.7, np.float32)
    for push, expect in enumerate((n - 2, 0, n)):
        kv.push('b', g)
        kv.pull('b', out=out)
        check((out == expect).all(), f'1bit push {push}: {out[:3]} != {expect}')


def error_checks(kv):
    def expect(exc, fn, what):
        try:
            fn()
        except exc:
            return
        except Exception as e:  # noqa: BLE001
            raise AssertionError(f'{what}: {type(e).__name__} {e}, expected {exc.__name__}')
        raise AssertionError(f'{what}: no {exc.__name__}')

    expect(pushpull.InvalidArgument, lambda: kv.push('float32-2x3', np.ones(SMALL, np.float64)),
           'wrong dtype')
    expect(pushpull.InvalidArgument, lambda: kv.push('float32-2x3', np.ones((3, 2), np.float32)),
           'wrong shape')
    expect(pushpull.InvalidArgument,
           lambda: kv.push('float32-2x3', np.ones((3, 2), np.float32).T), 'non-contiguous')
    expect(pushpull.NotFound, lambda: kv.pull('nope', out=np.zeros(3, np.float32)), 'unknown key')
    expect(pushpull.InvalidArgument, lambda: kv.set_optimizer('sgd', betaX=1), 'bad optimizer')
    # the store still works for everyone afterwards
    out = np.zeros(SMALL, np.float32)
    kv.pull('float32-2x3', out=out)
    check(out[0, 0] > 1, 'store unusable after bad input')


def states(kv, phase, path):
    kv.init('w', np.ones(2000, np.float32) if phase == 'save' else np.load(path + '.two.npy'))
    kv.set_optimizer('sgd', learning_rate=0.1, momentum=0.9)
    g = np.full(2000, kv.rank + 1, np.float32)
    out = np.zeros(2000, np.float32)
    if phase == 'save':
        kv.push('w', g)
        kv.push('w', g)
        kv.barrier()
        if kv.rank == 0:
            kv.pull('w', out=out)
            np.save(path + '.two.npy', out)
            kv.save_optimizer_states(path)
        kv.barrier()
        kv.push('w', g)
        if kv.rank == 0:
            kv.pull('w', out=out)
            np.save(path + '.three.npy', out)
    else:
        kv.load_optimizer_states(path)
        kv.push('w', g)
        kv.pull('w', out=out)
        want = np.load(path + '.three.npy')
        check(np.array_equal(out, want), f'after load: {out[:3]} != {want[:3]}')
        plain = np.load(path + '.two.npy') - 0.1 * 3 * (kv.num_workers == 2)
        check(not np.allclose(out, plain), 'momentum was not restored')


def main():
    phase, arg = sys.argv[1], sys.argv[2]
    if phase == 'values':
        kv = pushpull.kv.create(arg)
        value_checks(kv, with_torch=False)
        row_sparse_checks(kv)
        if arg in ('dist_sync', 'dist_device_sync', 'dist_sync_allreduce'):
            compression_checks(kv)
        error_checks(kv)
    elif phase == 'onebit':
        kv = pushpull.kv.create(arg)
        one_bit_checks(kv)
    elif phase == 'torch':
        kv = pushpull.kv.create(arg)
        value_checks(kv, with_torch=True)
    else:
        kv = pushpull.kv.create('dist_sync')
        states(kv, phase, arg)
    kv.barrier()
    print(f'worker {kv.rank}: ok ({kv.type}, {kv.num_workers} workers)', flush=True)
    kv.close()


if __name__ == '__main__':
    main()

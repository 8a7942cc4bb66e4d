#!/usr/bin/env python3
"""MXNet's KVStore tutorial on pushpull, in Python (numpy arrays as devices).

Local store, two "devices" (two arrays):
    PYTHONPATH=build/python python3 examples/python/kvstore_tutorial.py
Parameter server, 2 workers x 2 servers (both workers print 6s after the push):
    PYTHONPATH=build/python build/bin/pushpull launch -n 2 -s 2 \\
        python3 examples/python/kvstore_tutorial.py --kvstore dist_sync
    # or: python3 -m pushpull.launch -n 2 -s 2 python3 examples/python/kvstore_tutorial.py ...
Exits 0 when every value is as expected.
"""

import argparse
import sys

import numpy as np

import pushpull

SHAPE = (2, 3)
DEVICES = 2


def show(title, a):
    print(f'{title} {a.shape}:')
    for row in np.atleast_2d(a):
        print('  [' + ' '.join(f'{v:8.4f}' for v in row) + ' ]')


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--kvstore', default='local', help='store type (local, dist_sync, ...)')
    args = parser.parse_args()

    kv = pushpull.kv.create(args.kvstore)
    print(f'kvstore type {kv.type}: rank {kv.rank} of {kv.num_workers} worker(s), '
          f'{DEVICES} devices per worker\n')

    # 1. init: the store keeps a copy of the first value (worker 0's in a job).
    weight = np.random.default_rng(42).random(SHAPE, dtype=np.float32)
    kv.init('weight', weight)
    show('init: weight', weight)

    # 2. pull to two devices: a list of outputs, one per device.
    devices = [np.empty(SHAPE, np.float32) for _ in range(DEVICES)]
    kv.pull('weight', out=devices)
    for d, a in enumerate(devices):
        show(f'pull to device {d}', a)
    ok = all(np.array_equal(a, weight) for a in devices) or kv.rank != 0

    # 3. push ones * (d + 1) from device d: summed over devices and workers.
    grads = [np.full(SHAPE, d + 1, np.float32) for d in range(DEVICES)]
    expected = DEVICES * (DEVICES + 1) / 2 * kv.num_workers
    kv.push('weight', grads)
    kv.pull('weight', out=devices)
    show(f'push ones+d from {DEVICES} devices x {kv.num_workers} worker(s), pull '
         f'(expect all {expected:g})', devices[0])
    ok = ok and all((a == expected).all() for a in devices)

    # 4. an updater: stored += summed * 2. Servers cannot run Python, so there
    # the same rule is the `test` optimizer (weight += rescale_grad * grad).
    on_servers = kv.type.startswith('dist_') and kv.type != 'dist_sync_allreduce'
    if on_servers:
        kv.set_optimizer(pushpull.optimizer.create('test', rescale_grad=2))
    else:

        def update(key, summed, stored):
            stored += summed * 2

        kv._set_updater(update)
    kv.push('weight', grads)
    kv.pull('weight', out=devices)
    updated = expected + 2 * expected
    how = "the servers' optimizer" if on_servers else 'updater'
    show(f'with {how} stored += summed * 2, push again, pull (expect all {updated:g})',
         devices[0])
    ok = ok and all((a == updated).all() for a in devices)

    # 5. several keys at once, each with its devices (MXNet's nested lists).
    if not on_servers:
        kv.set_updater(None)  # plain sums again
    keys, kv2_shape = ['k5', 'k7'], (4,)  # str keys, like 'weight': one store never mixes kinds
    kv.init(keys, [np.zeros(kv2_shape, np.float32)] * 2)
    kv.push(keys, [[np.ones(kv2_shape, np.float32)] * DEVICES, np.ones(kv2_shape, np.float32)])
    outs = [[np.empty(kv2_shape, np.float32) for _ in range(DEVICES)],
            np.empty(kv2_shape, np.float32)]
    kv.pull(keys, out=outs)
    scale = 2 if on_servers else 1  # the test optimizer doubles what is pushed
    want = [DEVICES * kv.num_workers * scale, kv.num_workers * scale]
    show(f'push {keys} from {DEVICES} and 1 device(s), pull (expect {want[0]} and {want[1]})',
         np.stack([outs[0][0], outs[1]]))
    ok = ok and (outs[0][1] == want[0]).all() and (outs[1] == want[1]).all()

    kv.barrier()
    print('\nall values as expected' if ok else '\nUNEXPECTED VALUES', flush=True)
    kv.close()
    return 0 if ok else 1


if __name__ == '__main__':
    try:
        sys.exit(main())
    except pushpull.Error as e:
        print(f'kvstore_tutorial: {e}', file=sys.stderr)
        sys.exit(2)
